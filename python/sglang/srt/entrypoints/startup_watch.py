"""Waiting for the child processes to come up, without ever waiting on a dead one.

Each child (scheduler rank, detokenizer) gets a one-way pipe to the launcher and sends on it:
`{"status": "started"}` as the first thing its own code does, then `{"status": "ready", ...}` or
`{"status": "error", "message": traceback}`. The launcher waits on every pipe *and* every process
sentinel at once (`multiprocessing.connection.wait`), under SGLANG_STARTUP_TIMEOUT, so a child that
dies in any way (an exception, SIGKILL, an OOM kill, a failed spawn bootstrap) is seen at once.

A child that dies before it sent "started" never ran our code: with the spawn start method each
child first re-imports the main module, and a script that builds an Engine at import time starts
processes from inside that import. That case gets the fix in the message.
"""

from __future__ import annotations

import multiprocessing.connection
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

from sglang.srt.utils.process import STARTUP_ERROR, STARTUP_READY, STARTUP_STARTED, describe_exit

EXIT_JOIN_S = 5.0  # after its pipe closed, a child that is exiting gets this long to be reaped


class LaunchError(RuntimeError):
    """A child failed to start; the message says which one and why."""


@dataclass
class StartingChild:
    process: multiprocessing.Process
    pipe: multiprocessing.connection.Connection  # the launcher's (reading) end
    started: bool = False  # the child's own code ran
    info: Optional[dict] = None  # its "ready" message


def spawn_reimport_hint() -> str:
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if not script:
        return ""
    return (
        f". It died before running any sglang code: with the spawn start method every child re-imports the "
        f"main module ({script}); if that script creates sglang.Engine(...) (or launches the server) at import "
        f'time, move that code inside `if __name__ == "__main__":`'
    )


def _death_message(child: StartingChild) -> str:
    p = child.process
    message = describe_exit(p.name, p.pid, p.exitcode) + " before it was ready"
    if not child.started:
        message += spawn_reimport_hint()
    return message + " (its own error, if it printed one, is in the log above)"


def _read_messages(child: StartingChild) -> bool:
    """Read what the child sent; raise LaunchError on its error report. Returns False at end-of-file
    (the child closed its end: it exited or is exiting)."""
    while child.pipe.poll():
        try:
            msg = child.pipe.recv()
        except (EOFError, OSError):
            return False
        status = msg.get("status") if isinstance(msg, dict) else None
        if status == STARTUP_STARTED:
            child.started = True
        elif status == STARTUP_READY:
            child.info = msg
        elif status == STARTUP_ERROR:
            raise LaunchError(f"{child.process.name} failed to start:\n{msg.get('message', msg)}")
    return True


def wait_until_ready(children: List[StartingChild], timeout_s: float) -> List[dict]:
    """Every child's ready message, in order; LaunchError as soon as one fails, dies or the time is up."""
    deadline = time.monotonic() + timeout_s
    pending = list(children)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            names = ", ".join(c.process.name for c in pending)
            raise LaunchError(f"{names} did not report ready within {timeout_s:.0f} s (SGLANG_STARTUP_TIMEOUT)")
        handles = {c.pipe: c for c in pending}
        handles.update({c.process.sentinel: c for c in pending})
        for handle in multiprocessing.connection.wait(list(handles), timeout=remaining):
            child = handles[handle]
            if child not in pending:
                continue
            open_ = _read_messages(child)
            if child.info is not None:
                pending.remove(child)
                continue
            if not open_ or not child.process.is_alive():
                child.process.join(EXIT_JOIN_S)
                raise LaunchError(_death_message(child))
    return [c.info for c in children]
