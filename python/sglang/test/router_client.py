"""Upstream's router (PyPI `sglang-router`, Rust) for tests that put replicas of our server behind it.

It gets a virtualenv of its own, built on first use and reused after (about 40 s and 60 MB, from PyPI):

    python = ensure_router_venv()
    proc = launch_router(python, ["http://127.0.0.1:31001", "http://127.0.0.1:31002"], port=31000)

`POSTCAP_ROUTER_VENV` overrides the venv's location.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import requests

from sglang.test.upstream_clients import client_env

ROUTER_REQUIREMENT = "sglang-router==0.3.2"
VENV_ENV_VAR = "POSTCAP_ROUTER_VENV"
_MARKER = "postcap-router.json"  # written last: its presence means the venv is complete


def default_venv_dir() -> Path:
    if os.environ.get(VENV_ENV_VAR):
        return Path(os.environ[VENV_ENV_VAR])
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "sglang-postcap" / ROUTER_REQUIREMENT.replace("==", "-")


def _spec() -> dict:
    return {"router": ROUTER_REQUIREMENT, "base_python": os.path.realpath(sys.executable)}


def ensure_router_venv(venv: Optional[Path] = None) -> str:
    """The venv's python with the router installed, built under a file lock if missing or stale."""
    venv = Path(venv) if venv is not None else default_venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = str(venv / "bin" / "python")
    with open(str(venv) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            complete = json.loads((venv / _MARKER).read_text()) == _spec()
        except (OSError, ValueError):
            complete = False
        if not complete:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
            cmd = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", ROUTER_REQUIREMENT]
            r = subprocess.run(cmd, capture_output=True, text=True, env=client_env())
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
            (venv / _MARKER).write_text(json.dumps(_spec()))
    return python


def launch_router(
    python: str, worker_urls: Sequence[str], port: int, prometheus_port: int, log_path: str, policy: str = "cache_aware"
) -> subprocess.Popen:
    """Start `python -m sglang_router.launch_router` and wait until it lists every worker with a load."""
    cmd = [python, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls, "--port", str(port)]
    cmd += ["--prometheus-port", str(prometheus_port), "--policy", policy, "--host", "127.0.0.1"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=client_env())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the router exited with {proc.returncode}; see {log_path}")
        try:
            loads = requests.get(f"http://127.0.0.1:{port}/get_loads", timeout=5).json()["workers"]
            if len(loads) == len(worker_urls):
                return proc
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the router did not list its {len(worker_urls)} workers within 120 s; see {log_path}")
