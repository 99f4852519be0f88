"""Every SGLANG_* environment flag the engine reads, typed, in one place.

Read a flag as ``envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.get()``; tests may ``.set()`` or
``.override()`` it. Nothing else in the code base reads ``os.environ`` for an SGLANG_* name.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Generic, Iterator, Optional, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvFlag(Generic[T]):
    """One environment variable with a type and a default."""

    def __init__(self, default: T, doc: str) -> None:
        self.default = default
        self.doc = doc
        self.name = ""  # filled in by __set_name__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type) -> "EnvFlag[T]":
        return self

    def _parse(self, raw: str) -> T:
        raise NotImplementedError

    def is_set(self) -> bool:
        return self.name in os.environ

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self._parse(raw.strip())
        except ValueError as e:
            raise ValueError(f"Environment variable {self.name}={raw!r} is invalid: {e}") from None

    def set(self, value: Optional[T]) -> None:
        if value is None:
            os.environ.pop(self.name, None)
        else:
            os.environ[self.name] = str(int(value)) if isinstance(value, bool) else str(value)

    @contextmanager
    def override(self, value: Optional[T]) -> Iterator[None]:
        old = os.environ.get(self.name)
        self.set(value)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(self.name, None)
            else:
                os.environ[self.name] = old


class EnvBool(EnvFlag[bool]):
    def _parse(self, raw: str) -> bool:
        low = raw.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError("expected one of 1/0/true/false/yes/no/on/off")


class EnvInt(EnvFlag[int]):
    def _parse(self, raw: str) -> int:
        return int(raw)


class EnvFloat(EnvFlag[float]):
    def _parse(self, raw: str) -> float:
        return float(raw)


class EnvStr(EnvFlag[str]):
    def _parse(self, raw: str) -> str:
        return raw


class Envs:
    # Memory planning
    SGLANG_ENABLE_POST_CAPTURE_KV_SIZING = EnvBool(
        False, "Reserve the KV pool as CUDA virtual memory, capture graphs, then size it from measured free memory."
    )
    SGLANG_CPU_MEMORY_BUDGET_GB = EnvFloat(
        0.0, "On --device cpu: host memory (GB) the memory plan treats as device capacity; 0 = host MemTotal."
    )
    SGLANG_KT_CPU_KERNEL_CACHE = EnvStr(
        "",
        "Where the KT CPU expert kernel is compiled to (default: $XDG_CACHE_HOME or ~/.cache, then sglang/kt_cpu).",
    )
    SGLANG_KT_CPU_CXX = EnvStr("", "The C++ compiler that builds the KT CPU expert kernel (default: $CXX, else g++).")
    # Process plumbing and fault handling
    SGLANG_HEALTH_CHECK_TIMEOUT = EnvFloat(20.0, "Seconds /health_generate waits for one token.")
    SGLANG_HEALTH_STALL_S = EnvFloat(
        30.0,
        "/health answers 503 when the scheduler has sent no heartbeat for this many seconds (it sends one "
        "every 0.5 s, and after every step, so silence means it is frozen or stuck in one forward).",
    )
    SGLANG_REQUEST_TIMEOUT_S = EnvFloat(
        0.0,
        "Server-side limit (seconds) on one request, from arrival to its last output; 0 = no limit. "
        "A request past it is aborted and answered 503.",
    )
    SGLANG_MAX_REQUEST_BODY_BYTES = EnvInt(8 * 1024 * 1024, "Largest HTTP request body accepted.")
    SGLANG_STARTUP_TIMEOUT = EnvFloat(
        1800.0, "Seconds the launcher waits for every child (scheduler ranks, detokenizer) to report ready."
    )
    SGLANG_SHUTDOWN_GRACE_S = EnvFloat(
        5.0, "After SIGTERM: seconds in-flight requests get to finish before they are answered 503."
    )
    SGLANG_PROFILE_HTTP_SERVER = EnvStr(
        "",
        "Diagnostics: run the HTTP server process (tokenizer manager, API layers, SSE) under cProfile and write "
        "its 40 costliest functions (cumulative and own time) to this file when it stops.",
    )
    SGLANG_STOP_REGEX_TIMEOUT_MS = EnvFloat(
        20.0,
        "Time budget (ms) of one stop_regex check: all of a request's patterns searched once (the scheduler "
        "does so after every token). A request whose patterns take longer is ended with a 400 error.",
    )
    # Kernels
    SGLANG_DECODE_GEMM_CONFIG_DIR = EnvStr(
        "",
        "Directory of decode-GEMM tables (<GPU name>.json, written by benchmark/decode_roofline/"
        "tune_decode_gemms.py --model ...) to use instead of the shipped ones.",
    )
    # Testing
    SGLANG_TEST_CPU_ELASTIC_SLOT_TAIL_TOKENS = EnvInt(
        0,
        "Tests only: with --device cpu and a KT prefill slot, lend the slot from the pool's last N tokens "
        "through host memory (there is no VMM on the CPU), so the CPU suite runs the elastic slot's scheduling, "
        "tensor-parallel ranks included. 0: off.",
    )
    SGLANG_TEST_FAULT_INJECTION = EnvStr(
        "",
        "Tests only: faults to inject, read once at start-up, e.g. 'forward_oom=3' (the 3rd forward raises "
        "torch.OutOfMemoryError), 'scheduler_exit=2', 'detokenizer_exit=1', 'startup_exit=scheduler', "
        "'startup_hang=detokenizer'. See srt/utils/fault_injection.py.",
    )


envs = Envs()
