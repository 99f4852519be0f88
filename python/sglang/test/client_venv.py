"""A virtualenv of its own for a third-party client (upstream's router, lm-eval, ...), built on first use
and reused after. The client then runs as a subprocess of that venv's python (`client_env()`), so its
dependencies never meet the project's, and this checkout's `sglang` never meets the client's.

    python = ensure_client_venv(default_venv_dir("lm-eval-0.4.13", "POSTCAP_LM_EVAL_VENV"), [["lm-eval==0.4.13"]])

Safe to call from several processes at once: the build runs under a file lock, and a venv counts as built
only once its marker file (written last) matches what was asked for (the installs, the base python).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

_MARKER = "postcap-client-venv.json"


def default_venv_dir(name: str, env_var: str) -> Path:
    """`$env_var` when set, else ~/.cache/sglang-postcap/<name> (XDG_CACHE_HOME honoured)."""
    if os.environ.get(env_var):
        return Path(os.environ[env_var])
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "sglang-postcap" / name


def client_env(extra: Optional[dict] = None) -> dict:
    """The environment of a client process: no PYTHONPATH (this checkout's `sglang` would shadow or mix
    with a client's), no user site-packages, the Hugging Face hub offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def pip_install(python: str, *args: str) -> None:
    cmd = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=client_env())
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def _spec(installs: Sequence[Sequence[str]]) -> dict:
    return {
        "installs": [list(i) for i in installs],
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "base_python": os.path.realpath(sys.executable),
    }


def ensure_client_venv(
    venv: Path, installs: Sequence[Sequence[str]], check: Optional[Callable[[str], None]] = None
) -> str:
    """The venv's python, the venv built if missing or stale: one `pip install` per entry of `installs`
    (its arguments), then `check(python)` (raises when the result is not what the caller needs)."""
    venv = Path(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = str(venv / "bin" / "python")
    with open(str(venv) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            complete = json.loads((venv / _MARKER).read_text()) == _spec(installs)
        except (OSError, ValueError):
            complete = False
        if not complete:
            shutil.rmtree(venv, ignore_errors=True)
            # The project's own interpreter, never a venv inheriting its site-packages: with
            # --system-site-packages the project's `sglang` would sit on a client's path.
            r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{sys.executable} -m venv {venv} failed:\n{r.stderr[-3000:]}")
            for args in installs:
                pip_install(python, *args)
            if check is not None:
                check(python)
            (venv / _MARKER).write_text(json.dumps(_spec(installs)))
    return python
