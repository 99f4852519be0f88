"""Upstream's router (PyPI `sglang-router`, Rust) for tests that put replicas of our server behind it.

It gets a virtualenv of its own, built on first use and reused after (about 40 s and 60 MB, from PyPI):

    python = ensure_router_venv()
    proc = launch_router(python, ["http://127.0.0.1:31001", "http://127.0.0.1:31002"], port=31000)

`POSTCAP_ROUTER_VENV` overrides the venv's location.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

import requests

from sglang.test.client_venv import client_env, default_venv_dir, ensure_client_venv

ROUTER_REQUIREMENT = "sglang-router==0.3.2"
VENV_ENV_VAR = "POSTCAP_ROUTER_VENV"


def ensure_router_venv(venv: Optional[Path] = None) -> str:
    """The venv's python with the router installed, built if missing or stale."""
    venv = venv or default_venv_dir(ROUTER_REQUIREMENT.replace("==", "-"), VENV_ENV_VAR)
    return ensure_client_venv(venv, [[ROUTER_REQUIREMENT]])


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
