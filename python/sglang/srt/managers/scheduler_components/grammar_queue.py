"""Requests waiting for their grammar to compile, off the scheduler loop.

A request with a constraint (json_schema, regex, ebnf, structural_tag) enters the waiting queue only
once its grammar is compiled (the backend's thread pool, cached); the others are never held up by it.
A grammar that does not compile finishes its request with a 400 naming the field.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

if TYPE_CHECKING:
    from concurrent.futures import Future

    from sglang.srt.constrained.base_backend import GrammarBackend
    from sglang.srt.managers.schedule_batch import Req


@dataclass(frozen=True)
class Compiling:
    req: "Req"
    future: "Future"


class GrammarQueue:
    def __init__(
        self,
        backend: Optional["GrammarBackend"],
        why_off: str,
        wait_for_compile: bool,
        reasoning_end: Tuple[int, ...] = (),
    ) -> None:
        """`why_off`: the reason given when `backend` is None. `wait_for_compile`: wait for each compile
        when it is submitted (tensor parallelism: every rank must admit the request at the same step, and a
        compile may finish at different times on different ranks). `reasoning_end`: the token ids ending the
        model's reasoning (--reasoning-parser); a request with `require_reasoning` is constrained after them."""
        self.backend = backend
        self.reasoning_end = reasoning_end
        self.why_off = why_off
        self.wait_for_compile = wait_for_compile
        self._compiling: List[Compiling] = []

    def __bool__(self) -> bool:
        return bool(self._compiling)

    def add(self, req: "Req") -> bool:
        """Start compiling `req`'s grammar; False when it cannot have one (req is then finished, 400)."""
        key = req.sampling_params.grammar_key
        if self.backend is None:
            req.abort(f"{key.kind}: {self.why_off}", 400)
            return False
        future = self.backend.compile_async(key)
        if self.wait_for_compile:
            concurrent.futures.wait([future])
        self._compiling.append(Compiling(req, future))
        return True

    def pop_done(self) -> Tuple[List["Req"], List["Req"]]:
        """(requests whose grammar is ready, with their matcher; requests whose grammar failed, finished)."""
        ready, failed, still = [], [], []
        for item in self._compiling:
            if not item.future.done():
                still.append(item)
                continue
            req, error = item.req, item.future.exception()
            if error is not None:
                req.abort(str(error), 400)
                failed.append(req)
            else:
                end = self.reasoning_end if req.require_reasoning else ()
                req.grammar = self.backend.matcher(item.future.result(), req.sampling_params.grammar_key, end)
                ready.append(req)
        self._compiling = still
        return ready, failed

    def remove(self, rid: str) -> Optional["Req"]:
        for item in self._compiling:
            if item.req.rid == rid:
                self._compiling.remove(item)
                return item.req
        return None

    def wait(self, timeout: float) -> None:
        """Block until some compile finishes or `timeout` seconds pass (when there is nothing else to do)."""
        if self._compiling:
            concurrent.futures.wait(
                [c.future for c in self._compiling], timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED
            )
