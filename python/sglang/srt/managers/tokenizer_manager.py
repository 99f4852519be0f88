"""TokenizerManager: validates and tokenizes requests, sends them to the scheduler, gathers outputs.

Runs in the main process on an asyncio loop (the HTTP server's, or the offline Engine's). Each
request has a ReqState that the receive loop fills from the detokenizer's BatchStrOut messages.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

import zmq
import zmq.asyncio

from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOut,
    FlushCacheReq,
    FlushCacheReqOutput,
    GenerateReqInput,
    SchedulerFailed,
    SchedulerStats,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.tokenizer_metrics import TokenizerMetrics
from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.process import PortArgs

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A request the server refuses; the HTTP layer answers with `status_code` and the message."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


@dataclass
class ReqState:
    text: str = ""
    output_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    finished_reason: Optional[dict] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    created: float = field(default_factory=time.monotonic)
    first_token_time: Optional[float] = None
    error: Optional[RequestError] = None


class TokenizerManager:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs, scheduler_info: dict) -> None:
        self.server_args = server_args
        self.scheduler_info = scheduler_info
        self.context_len: int = scheduler_info["context_len"]
        self.vocab_size: int = scheduler_info["vocab_size"]
        self.tokenizer = None
        if not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_tokenizer import get_tokenizer

            self.tokenizer = get_tokenizer(server_args.tokenizer_path)
        self.port_args = port_args
        self.rid_to_state: Dict[str, ReqState] = {}
        self.stats = SchedulerStats(max_total_num_tokens=scheduler_info["max_total_num_tokens"])
        self.metrics = TokenizerMetrics(server_args.served_model_name)
        self.fatal_error: Optional[str] = None
        self.on_fatal: Callable[[str], None] = lambda msg: None
        self._flush_waiters: List[asyncio.Future] = []
        self._loop_task: Optional[asyncio.Task] = None
        self._zmq_ctx: Optional[zmq.asyncio.Context] = None
        self._stopped = False
        self._tasks: List[asyncio.Task] = []
        self.child_processes: List = []

    # ------------------------------------------------------------- sockets
    def start(self) -> None:
        """Create the sockets and the receive loop on the running event loop (idempotent)."""
        if self._loop_task is not None:
            return
        ctx = self._zmq_ctx = zmq.asyncio.Context(2)
        self.recv_socket = ctx.socket(zmq.PULL)
        self.recv_socket.bind(self.port_args.tokenizer_ipc_name)
        self.send_to_scheduler = ctx.socket(zmq.PUSH)
        self.send_to_scheduler.connect(self.port_args.scheduler_input_ipc_name)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.handle_loop()), loop.create_task(self.watch_children())]
        self._loop_task = self._tasks[0]

    async def stop(self) -> None:
        """Cancel the background tasks (before the loop closes) and close the sockets."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        self._stopped = True
        if self._zmq_ctx is not None:
            # linger=0: a message still queued for a scheduler that is gone (an abort) must not block
            # close/term forever -- nor pyzmq's destroy() when the context is garbage-collected later.
            self._zmq_ctx.destroy(linger=0)
            self._zmq_ctx = None

    async def handle_loop(self) -> None:
        while True:
            msg = await self.recv_socket.recv_pyobj()
            if isinstance(msg, BatchStrOut):
                self._on_outputs(msg)
            elif isinstance(msg, SchedulerStats):
                self.stats = msg
                self.metrics.observe_scheduler(msg)
            elif isinstance(msg, FlushCacheReqOutput):
                waiters, self._flush_waiters = self._flush_waiters, []
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(msg)
            elif isinstance(msg, SchedulerFailed):
                self._fatal(f"scheduler failed: {msg.message.strip().splitlines()[-1]}")

    async def watch_children(self) -> None:
        while self.fatal_error is None:
            await asyncio.sleep(1.0)
            for p in self.child_processes:
                if not p.is_alive():
                    self._fatal(f"child process {p.name} (pid {p.pid}) exited with code {p.exitcode}")
                    return

    def _fatal(self, message: str) -> None:
        if self.fatal_error is not None:
            return
        self.fatal_error = message
        logger.error("Fatal: %s", message)
        for state in self.rid_to_state.values():
            state.error = RequestError(f"internal server error: {message}", 500)
            state.event.set()
        self.on_fatal(message)

    def _on_outputs(self, out: BatchStrOut) -> None:
        now = time.monotonic()
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:
                continue  # aborted and forgotten
            state.text += out.output_strs[i]
            state.output_ids.extend(out.output_ids[i])
            state.logprobs.extend(out.output_token_logprobs[i])
            if state.first_token_time is None and state.output_ids:
                # The scheduler's timestamp: non-streamed tokens arrive only with the last one.
                first = out.first_token_times[i]
                state.first_token_time = first if first is not None else now
                self.metrics.observe_ttft(max(state.first_token_time - state.created, 0.0))
            state.finished_reason = out.finished_reasons[i]
            state.meta = {
                "prompt_tokens": out.prompt_tokens[i],
                "completion_tokens": out.completion_tokens[i],
                "cached_tokens": out.cached_tokens[i],
            }
            if state.finished_reason is not None:
                self.metrics.observe_finished(now - state.created, out.prompt_tokens[i], out.completion_tokens[i])
            state.event.set()

    # ----------------------------------------------------------- requests
    def tokenize_one(self, obj: GenerateReqInput) -> TokenizedGenerateReqInput:
        if (obj.text is None) == (obj.input_ids is None):
            raise RequestError("give exactly one of `text` and `input_ids`")
        if obj.text is not None:
            if not isinstance(obj.text, str):
                raise RequestError("`text` must be a string or a list of strings")
            if self.tokenizer is None:
                raise RequestError("this server runs with --skip-tokenizer-init: send `input_ids`, not `text`")
            input_ids = self.tokenizer.encode(obj.text)
        else:
            input_ids = obj.input_ids
            if not isinstance(input_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
                raise RequestError("`input_ids` must be a list of integers")
            bad = [t for t in input_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise RequestError(f"input_ids out of the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if not input_ids:
            raise RequestError("the prompt is empty")
        try:
            params = SamplingParams.from_dict(obj.sampling_params)
            params.verify(self.vocab_size)
        except SamplingParamsError as e:
            raise RequestError(str(e)) from None
        if params.stop_strs and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer; this server runs with --skip-tokenizer-init")
        if len(input_ids) >= self.context_len:
            raise RequestError(
                f"the prompt has {len(input_ids)} tokens; this model's context length is {self.context_len}"
            )
        if len(input_ids) + params.max_new_tokens > self.context_len:
            raise RequestError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the context "
                f"length {self.context_len}"
            )
        if not isinstance(obj.return_logprob, bool):
            raise RequestError("`return_logprob` must be a boolean")
        rid = obj.rid if obj.rid is not None else uuid.uuid4().hex
        if not isinstance(rid, str):
            raise RequestError("`rid` must be a string")
        if rid in self.rid_to_state:
            raise RequestError(f"request id {rid!r} is already in flight")
        return TokenizedGenerateReqInput(rid, obj.text or "", list(input_ids), params, obj.return_logprob, obj.stream)

    def _check_alive(self) -> None:
        if self._stopped:
            raise RequestError("the server is shutting down", 503)
        if self.fatal_error is not None:
            raise RequestError(f"the server is shutting down: {self.fatal_error}", 503)

    async def generate_request(self, obj: GenerateReqInput) -> AsyncIterator[Any]:
        """Yields output dicts: for a stream every update, else one final dict (a list for a batch)."""
        self.start()
        self._check_alive()
        if obj.is_batch:
            items = [obj.item(i) for i in range(obj.batch_size())]
            if not items:
                raise RequestError("the batch is empty")
            tokenized = [self.tokenize_one(it) for it in items]  # validate all before sending any
            if len({t.rid for t in tokenized}) != len(tokenized):
                raise RequestError("request ids in a batch must be unique")
            if obj.stream:
                raise RequestError("streaming is supported for single requests only")
            states = [self._send(t) for t in tokenized]
            results = await asyncio.gather(*(self._wait_final(t.rid, s) for t, s in zip(tokenized, states)))
            yield list(results)
            return
        tokenized = self.tokenize_one(obj)
        state = self._send(tokenized)
        if not obj.stream:
            yield await self._wait_final(tokenized.rid, state)
            return
        try:
            while True:
                await state.event.wait()
                state.event.clear()
                if state.error is not None:
                    raise state.error
                out = self._make_output(tokenized.rid, state)
                yield out
                if state.finished_reason is not None:
                    break
        finally:
            self._forget(tokenized.rid, state)

    def _send(self, tokenized: TokenizedGenerateReqInput) -> ReqState:
        state = ReqState()
        self.rid_to_state[tokenized.rid] = state
        self.send_to_scheduler.send_pyobj(tokenized)
        return state

    async def _wait_final(self, rid: str, state: ReqState) -> dict:
        try:
            while state.finished_reason is None:
                await state.event.wait()
                state.event.clear()
                if state.error is not None:
                    raise state.error
            return self._make_output(rid, state)
        finally:
            self._forget(rid, state)

    def _forget(self, rid: str, state: ReqState) -> None:
        """Drop the state; a request that has not finished (client gone) is aborted so its KV is freed."""
        if self.rid_to_state.get(rid) is state:
            del self.rid_to_state[rid]
            if state.finished_reason is None and self.fatal_error is None and not self._stopped:
                self.send_to_scheduler.send_pyobj(AbortReq(rid, "client disconnected"))

    def abort_request(self, rid: str) -> None:
        state = self.rid_to_state.get(rid)
        if state is not None:
            self._forget(rid, state)

    def _make_output(self, rid: str, state: ReqState) -> dict:
        fr = state.finished_reason
        if fr is not None and fr.get("type") == "abort" and fr.get("status_code", 0) == 400:
            raise RequestError(fr.get("message", "request aborted"), 400)
        meta = dict(state.meta)
        meta.update(id=rid, finish_reason=fr, e2e_latency=time.monotonic() - state.created)
        if state.logprobs:
            meta["output_token_logprobs"] = [[lp, tid, None] for lp, tid in zip(state.logprobs, state.output_ids)]
        out = {"output_ids": list(state.output_ids), "meta_info": meta}
        if self.tokenizer is not None:
            out["text"] = state.text
        return out

    async def flush_cache(self) -> FlushCacheReqOutput:
        self.start()
        fut = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(fut)
        self.send_to_scheduler.send_pyobj(FlushCacheReq())
        return await asyncio.wait_for(fut, timeout=30)
