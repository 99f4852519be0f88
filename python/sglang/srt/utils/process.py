"""Process helpers: ZeroMQ endpoints, child processes that die with their parent, clean teardown."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import logging
import os
import signal
import socket
import tempfile
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional

logger = logging.getLogger(__name__)


@dataclass
class PortArgs:
    """IPC endpoints between the processes of one server (ipc:// sockets in a private directory)."""

    scheduler_input_ipc_name: str  # tokenizer manager -> scheduler rank 0
    detokenizer_ipc_name: str  # scheduler rank 0 -> detokenizer
    tokenizer_ipc_name: str  # detokenizer and scheduler rank 0 -> tokenizer manager
    dist_init_method: str  # torch.distributed rendezvous for tensor parallelism

    @classmethod
    def init_new(cls, dist_init_addr: str | None = None) -> "PortArgs":
        d = tempfile.mkdtemp(prefix="sglang-ipc-")
        if dist_init_addr:
            dist = f"tcp://{dist_init_addr}"
        else:
            dist = f"tcp://127.0.0.1:{free_port()}"
        return cls(f"ipc://{d}/scheduler", f"ipc://{d}/detokenizer", f"ipc://{d}/tokenizer", dist)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux), so no orphan survives."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def describe_exit(name: str, pid: Optional[int], exitcode: Optional[int]) -> str:
    """`sglang-scheduler-0 (pid 123) exited with code -9 (SIGKILL)`: which child, and how it ended."""
    how = f"exited with code {exitcode}"
    if exitcode is not None and exitcode < 0:
        try:
            how += f" ({signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return f"{name} (pid {pid}) {how}"


class ShutdownRequested(BaseException):
    """SIGTERM from the launcher: a child leaves its loop, frees what it holds and exits 0. A
    BaseException, so the per-batch and per-request `except Exception` guards let it through."""


def _raise_shutdown(signum: int, frame: object) -> None:  # noqa: ARG001 - signal handler signature
    raise ShutdownRequested(signal.Signals(signum).name)


def raise_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _raise_shutdown)


# The start-up protocol of a child (scheduler rank, detokenizer) on its pipe to the launcher, which waits
# for it in entrypoints/startup_watch.py: "started" first, then "ready" (with what the child reports) or "error".
STARTUP_STARTED, STARTUP_READY, STARTUP_ERROR = "started", "ready", "error"


@contextlib.contextmanager
def reporting_startup(pipe, what: str) -> Iterator[None]:
    """Run a child's start-up: say "started" at once (the spawn bootstrap is behind us), then on failure
    log it, send the traceback to the launcher and exit 1; SIGTERM meanwhile exits 0 quietly. After a
    successful start-up, what it built is frozen out of the garbage collector (freeze_startup_objects)."""
    pipe.send({"status": STARTUP_STARTED})
    try:
        yield
    except ShutdownRequested:
        raise SystemExit(0) from None
    except BaseException:
        message = traceback.format_exc()
        logger.error("%s failed to start:\n%s", what, message)
        pipe.send({"status": STARTUP_ERROR, "message": message})
        raise SystemExit(1) from None
    freeze_startup_objects()


def freeze_startup_objects() -> None:
    """What start-up built (the modules, the model, the pools, the tokenizer) lives as long as the process:
    collect start-up's garbage, then move every survivor to the collector's permanent generation (gc.freeze, as
    upstream SGLang's freeze_gc). No collection scans those objects again: not while serving (shorter pauses),
    nor at exit, where a process with torch and transformers imported otherwise spends about a CPU-second in the
    interpreter's final collections."""
    gc.collect()
    gc.freeze()


def freeze_imports() -> None:
    """The end of a process's imports (the collector was off while they ran: ChildEntry, launch_server.main):
    the modules and what they built (some 330,000 objects, alive until the process exits) go to the permanent
    generation and the collector is turned on. The rest of start-up (the model, the KV pool, the CUDA graphs and
    the device memory readings between them) runs with it on, as always, and its collections no longer rescan the
    imports (the imports alone ran ~870 collections, 0.66 s, with the collector on; a SmolLM2 server's start and
    stop measured 12.7 CPU-s this way, 14.7 with the collector off until the end of start-up)."""
    gc.freeze()
    gc.enable()


@dataclass(frozen=True)
class ChildEntry:
    """A spawned child's target function, named by module and function. multiprocessing pickles a Process's
    target before its arguments, so in the child this is unpickled first, and unpickling it turns the garbage
    collector off for the imports that the arguments and the target bring (torch, transformers, the model code);
    calling it freezes them and turns the collector on (freeze_imports) before the target runs."""

    module: str
    function: str

    @classmethod
    def of(cls, function: Callable[..., Any]) -> "ChildEntry":
        return cls(function.__module__, function.__qualname__)

    def __reduce__(self):
        return (_child_entry_unpickled, (self.module, self.function))

    def __call__(self, *args: Any) -> Any:
        target = getattr(importlib.import_module(self.module), self.function)
        freeze_imports()
        return target(*args)


def _child_entry_unpickled(module: str, function: str) -> ChildEntry:
    gc.disable()
    return ChildEntry(module, function)


def kill_process_tree(processes: List, timeout: float = 10.0) -> None:
    """Terminate multiprocessing children, then kill whatever did not exit in time."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(timeout)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(1)


def configure_logger(log_level: str, prefix: str = "") -> None:
    fmt = f"[%(asctime)s{(' ' + prefix) if prefix else ''}] %(message)s"
    logging.basicConfig(level=getattr(logging, log_level.upper()), format=fmt, datefmt="%Y-%m-%d %H:%M:%S", force=True)
