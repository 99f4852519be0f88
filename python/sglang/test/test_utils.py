"""Helpers for tests that run a real server: launch it, wait for /health, and kill its whole tree.

    proc = popen_launch_server(["--max-total-tokens", "16384"], timeout=DEFAULT_SERVER_START_TIMEOUT)
    requests.post(proc.base_url + "/generate", json={...})
    kill_process_tree(proc.pid)

The server's stdout and stderr go to a temporary log file (`proc.log_path`); `read_log(proc)` returns
it, and a launch that fails raises with the log's tail so the reason is in the test report.
Process trees are read from /proc (Linux), so no psutil is needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from sglang.srt.utils.process import free_port

PYTHON_DIR = str(Path(__file__).resolve().parents[2])  # .../python, so the child imports this checkout
# Measured: 9-10 s on an idle 2-core machine with the built-in SmolLM2, 13-16 s in the CPU suite's fixture setups
# (2026-12-04; the first start also converts its tokenizer).
DEFAULT_SERVER_START_TIMEOUT = 120.0


def find_free_port() -> int:
    return free_port()


def _flag_value(args: Sequence[str], flag: str) -> Optional[str]:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def server_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def read_log(proc: subprocess.Popen) -> str:
    path = getattr(proc, "log_path", None)
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def wait_for_log(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """The server's log once it contains `text` (raises TimeoutError naming it otherwise). For lines written just
    after /health first answers 200, such as the start-up announcement (logged once the server's own probe of
    /health succeeded)."""
    deadline = time.monotonic() + timeout
    while text not in (log := read_log(proc)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in the server log within {timeout:.0f} s; its tail: {log[-2000:]}")
        time.sleep(0.05)
    return log


def wait_for_health(
    base_url: str, timeout: float, proc: Optional[subprocess.Popen] = None, api_key: Optional[str] = None
) -> float:
    """Poll GET /health until it answers 200; returns the seconds waited. Raises TimeoutError, or
    RuntimeError if `proc` exits first."""
    start = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /health answered")
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{base_url}/health", headers=headers), timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or 503 while warming up
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{base_url}/health did not answer 200 within {timeout:.0f} s")
        time.sleep(0.5)


def popen_launch_server(
    args: Sequence[str],
    timeout: float = DEFAULT_SERVER_START_TIMEOUT,
    env: Optional[Dict[str, str]] = None,
    api_key: Optional[str] = None,
) -> subprocess.Popen:
    """Start `python -m sglang.launch_server *args` and wait until /health answers 200.

    A `--port` is added when `args` has none. The returned Popen carries `base_url`, `log_path` and
    `startup_seconds`. If the server does not come up, it is killed and RuntimeError carries the log tail.
    """
    args = list(args)
    if _flag_value(args, "--port") is None:
        args += ["--port", str(find_free_port())]
    if api_key is None:
        api_key = _flag_value(args, "--api-key")
    host = _flag_value(args, "--host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    base_url = f"http://{host}:{_flag_value(args, '--port')}"
    fd, log_path = tempfile.mkstemp(prefix="sglang-server-", suffix=".log")
    with os.fdopen(fd, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(env),
        )
    proc.base_url = base_url  # type: ignore[attr-defined]
    proc.log_path = log_path  # type: ignore[attr-defined]
    try:
        proc.startup_seconds = wait_for_health(base_url, timeout, proc, api_key)  # type: ignore[attr-defined]
    except (TimeoutError, RuntimeError) as e:
        kill_process_tree(proc.pid)
        tail = read_log(proc)[-4000:]
        raise RuntimeError(f"{e}\n--- server log tail ---\n{tail}") from None
    return proc


# ---------------------------------------------------------------- process trees via /proc
def _stat_fields(pid: int) -> Optional[List[str]]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return data[data.rfind(")") + 2 :].split()


def is_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (an exited child nobody reaped yet)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def descendant_pids(pid: int) -> List[int]:
    """All live descendants of `pid` (children, grandchildren, ...), by scanning /proc/*/stat."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return [p for p in found if is_alive(p)]


def pids_with_env(name: str, value: str) -> List[int]:
    """Live processes whose environment has name=value: finds a test's processes even after their parent
    died and they were re-parented (give each launch a unique marker value)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0") and is_alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def wait_pids_gone(pids: Sequence[int], timeout: float) -> List[int]:
    """Wait until none of `pids` is alive; returns those still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if is_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def kill_process_tree(pid: int, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    """Send `sig` to `pid` and wait; then SIGKILL whatever of its tree is left (descendants are
    recorded first, since they are re-parented once their parent exits)."""
    tree = descendant_pids(pid)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    left = wait_pids_gone([pid, *tree], timeout)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_pids_gone(left, 5.0)
    # A Popen child stays a zombie until its Popen is waited on; that is left to the caller, so
    # that `proc.wait()` / `proc.returncode` still report the real exit status.
