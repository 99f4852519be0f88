"""Faults injected on purpose, for tests only (SGLANG_TEST_FAULT_INJECTION).

The CPU suite must show what a user sees when a child dies, a forward runs out of device memory, or
a child never comes up, without a GPU and without racing a `kill` against the code under test. The
flag is read once, when a process starts, into a frozen `FaultPlan`; the code asks the plan
(`plan.forward_oom_at == forward_ct`) at the few places where a fault would really happen.

    SGLANG_TEST_FAULT_INJECTION="forward_oom=3,scheduler_exit=7"

Keys (counts are 1-based):
    forward_oom=N        the N-th forward of the scheduler raises torch.OutOfMemoryError
    forward_error=N      the N-th forward raises RuntimeError (a bug while handling one batch)
    scheduler_exit=N     the scheduler process exits at once (os._exit) at its N-th forward
    detokenizer_exit=N   the detokenizer process exits at once on its N-th message
    startup_exit=WHO     WHO (scheduler | detokenizer) exits with code 3 before it reports ready
    startup_hang=WHO     WHO never reports ready (for the start-up timeout)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

from sglang.srt.environ import envs

_COUNT_KEYS = ("forward_oom", "forward_error", "scheduler_exit", "detokenizer_exit")
_WHO_KEYS = ("startup_exit", "startup_hang")
_CHILDREN = ("scheduler", "detokenizer")
INJECTED_EXIT_CODE = 3


@dataclass(frozen=True)
class FaultPlan:
    forward_oom_at: Optional[int] = None
    forward_error_at: Optional[int] = None
    scheduler_exit_at: Optional[int] = None
    detokenizer_exit_at: Optional[int] = None
    startup_exit: Optional[str] = None
    startup_hang: Optional[str] = None

    @classmethod
    def parse(cls, spec: str) -> "FaultPlan":
        values: dict = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"SGLANG_TEST_FAULT_INJECTION: {item!r} is not key=value")
            if key in _COUNT_KEYS:
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"SGLANG_TEST_FAULT_INJECTION: {key} needs a count >= 1, got {value!r}")
                values[f"{key}_at"] = int(value)
            elif key in _WHO_KEYS:
                if value not in _CHILDREN:
                    raise ValueError(f"SGLANG_TEST_FAULT_INJECTION: {key} must name one of {_CHILDREN}, got {value!r}")
                values[key] = value
            else:
                raise ValueError(f"SGLANG_TEST_FAULT_INJECTION: unknown key {key!r}")
        return cls(**values)

    @classmethod
    def from_env(cls) -> "FaultPlan":
        return cls.parse(envs.SGLANG_TEST_FAULT_INJECTION.get())

    def at_startup(self, who: str) -> None:
        """Called by a child just before it reports ready."""
        if self.startup_exit == who:
            os._exit(INJECTED_EXIT_CODE)
        if self.startup_hang == who:
            while True:  # a child that never comes up: the launcher's start-up timeout must notice
                time.sleep(3600)

    def before_forward(self, forward_ct: int) -> None:
        """Called by the scheduler before its `forward_ct`-th forward (1-based)."""
        if forward_ct == self.scheduler_exit_at:
            os._exit(INJECTED_EXIT_CODE)
        if forward_ct == self.forward_oom_at:
            import torch

            raise torch.OutOfMemoryError(
                f"CUDA out of memory (injected by SGLANG_TEST_FAULT_INJECTION at forward {forward_ct})"
            )
        if forward_ct == self.forward_error_at:
            raise RuntimeError(f"injected fault at forward {forward_ct} (SGLANG_TEST_FAULT_INJECTION)")

    def on_detokenizer_message(self, count: int) -> None:
        if count == self.detokenizer_exit_at:
            os._exit(INJECTED_EXIT_CODE)
