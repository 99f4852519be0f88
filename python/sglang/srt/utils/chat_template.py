"""--chat-template: what the flag may name, read once at start-up."""

from __future__ import annotations

import os
from typing import Optional


def load_chat_template(path_or_template: Optional[str]) -> Optional[str]:
    """A Jinja file (or, as a convenience, the template text itself); None when the flag is not set. Raises
    ValueError naming the flag for anything else, OSError when the file cannot be read."""
    if not path_or_template:
        return None
    if os.path.isfile(path_or_template):
        with open(path_or_template, encoding="utf-8") as f:
            return f.read()
    if "{%" in path_or_template or "{{" in path_or_template:
        return path_or_template
    raise ValueError(f"--chat-template {path_or_template!r} is neither a file nor a Jinja template")
