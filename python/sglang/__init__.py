"""An SGLang-compatible serving engine (our own implementation, not upstream SGLang)."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported lazily so that `import sglang` stays cheap (no torch import) for the CLI's --help.
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(name)


__all__ = ["Engine", "__version__"]
