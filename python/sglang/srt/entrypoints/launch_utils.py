"""Launcher plumbing around the HTTP server: binding the port early, owning the signals, and
probing /health, kept apart from the routes in http_server.py."""

from __future__ import annotations

import contextlib
import signal
import socket
import urllib.request
from typing import Any, Dict, Optional

import uvicorn

from sglang.srt.server_args import ServerArgs


class UvicornServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        # The launcher owns SIGINT/SIGTERM (see http_server._serve). uvicorn's own handlers would
        # re-raise the signal once it stopped, killing this process before its children are stopped.
        yield


def bind_http_socket(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a busy port fails in a second, not after start-up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def local_url(server_args: ServerArgs) -> str:
    """Where this process can reach itself (a wildcard bind address is not connectable)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(server_args.host, server_args.host)
    return f"http://{'[' + host + ']' if ':' in host else host}:{server_args.port}"


def probe_health(url: str, api_key: Optional[str]) -> bool:
    req = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status == 200
    except OSError:
        return False


class StartupInterrupted(Exception):
    pass


def _raise_interrupted(signum: int, frame: Any) -> None:  # noqa: ARG001 - signal handler signature
    raise StartupInterrupted(signal.Signals(signum).name)


def restore_signals(previous: Dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def interrupt_on_signals() -> Dict[int, Any]:
    """Until restore_signals(): SIGINT / SIGTERM raise StartupInterrupted, so a launcher that is still
    loading the model unwinds through its `finally` and terminates its children."""
    return {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
