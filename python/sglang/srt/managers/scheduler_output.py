"""After a forward pass: append tokens, detect finished requests, free their KV, stream outputs."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from sglang.srt.managers.device_timeline import DeviceMark
from sglang.srt.managers.io_struct import BatchTokenIDOut
from sglang.srt.managers.schedule_batch import FinishReason
from sglang.srt.model_executor.forward_batch_info import ForwardMode

if TYPE_CHECKING:
    from sglang.srt.layers.sampler import SampleOutput
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.logprobs import InputLogprobs, LogprobExtras, LogprobRequests

Pairs = List[Tuple[float, int]]


def _pairs(values: Optional[List[List[float]]], ids: Optional[List[List[int]]], row: int, n: int) -> Pairs:
    return list(zip(values[row][:n], ids[row][:n])) if values is not None and n else []


def _host_copy(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A copy on the host, enqueued on the current stream (pinned, non-blocking on CUDA)."""
    if x is None:
        return None
    return x.to("cpu", non_blocking=True) if x.device.type != "cpu" else x


@dataclass(frozen=True)
class PendingResult:
    """One forward's outputs on their way to the host: copies enqueued behind the forward on its stream and
    an event after them, so the scheduler can launch the next step before reading these."""

    sampled: "SampleOutput"  # host tensors, valid once `end` has completed
    prompt: Optional["InputLogprobs"]
    requests: Optional["LogprobRequests"]
    start: DeviceMark  # before the forward
    end: DeviceMark  # after the copies (on the CPU the copies are the tensors themselves)

    @classmethod
    def launch(
        cls,
        sampled: "SampleOutput",
        prompt: Optional["InputLogprobs"],
        requests: Optional["LogprobRequests"],
        start: DeviceMark,
    ) -> "PendingResult":
        def extras_copy(e: Optional["LogprobExtras"]) -> Optional["LogprobExtras"]:
            return None if e is None else type(e)(*(_host_copy(t) for t in (e.top_values, e.top_ids, e.chosen)))

        host_sampled = type(sampled)(
            _host_copy(sampled.next_token_ids), _host_copy(sampled.logprobs), extras_copy(sampled.extras)
        )
        host_prompt = None
        if prompt is not None:
            host_prompt = type(prompt)(_host_copy(prompt.token_logprobs), extras_copy(prompt.extras))
        end = DeviceMark.now(on_cuda=start.event is not None)  # the same clock as `start`
        return cls(host_sampled, host_prompt, requests, start, end)

    def resolve(self) -> "BatchResult":
        """Wait for the copies (the forward's end), then read them."""
        self.end.synchronize()
        return BatchResult.from_host(self.sampled, self.prompt, self.requests)


@dataclass
class BatchResult:
    """One forward's results on the host: sampled tokens and every logprob some request asked for."""

    next_ids: List[int]
    logprobs: List[float]
    top_values: Optional[List[List[float]]] = None  # per batch row, the batch's largest top-k
    top_ids: Optional[List[List[int]]] = None
    chosen: Optional[List[List[float]]] = None  # per batch row, aligned with its token_ids_logprob
    input_token: Optional[List[float]] = None  # per scored prompt row (LogprobRequests.input_rows)
    input_top_values: Optional[List[List[float]]] = None
    input_top_ids: Optional[List[List[int]]] = None
    input_chosen: Optional[List[List[float]]] = None
    requests: Optional["LogprobRequests"] = None

    @classmethod
    def from_host(
        cls, sampled: "SampleOutput", prompt: Optional["InputLogprobs"], requests: Optional["LogprobRequests"]
    ) -> "BatchResult":
        def host(x):
            return None if x is None else x.tolist()

        ids = sampled.next_token_ids.tolist()
        out = cls(ids, host(sampled.logprobs) or [0.0] * len(ids), requests=requests)
        extras: Optional["LogprobExtras"] = sampled.extras
        if extras is not None:
            out.top_values, out.top_ids, out.chosen = host(extras.top_values), host(extras.top_ids), host(extras.chosen)
        if prompt is not None:
            out.input_token = host(prompt.token_logprobs)
            e = prompt.extras
            out.input_top_values, out.input_top_ids, out.input_chosen = (
                host(e.top_values),
                host(e.top_ids),
                host(e.chosen),
            )
        return out

    def output_extras(self, row: int, req: "Req") -> Tuple[Pairs, Pairs]:
        """(top-k pairs, chosen-id pairs) at batch row `row`'s sampled position."""
        chosen = list(zip(self.chosen[row], req.token_ids_logprob)) if self.chosen and req.token_ids_logprob else []
        return _pairs(self.top_values, self.top_ids, row, req.top_logprobs_num), chosen

    def add_prompt_logprobs(self, row: int, req: "Req", prefix_len: int) -> None:
        """Append what this prefill chunk scored of batch row `row`'s prompt to the request."""
        got = req.input_logprobs
        if req.logprob_start_len == 0 and prefix_len == 0:  # nothing predicts the first prompt token
            got.token.append((None, req.origin_input_ids[0]))
            got.top.append(None)
            got.chosen.append(None)
        if self.requests is None or self.input_token is None:
            return
        for k, owner in enumerate(self.requests.input_owner):
            if owner != row:
                continue
            got.token.append((self.input_token[k], self.requests.input_targets[k]))
            got.top.append(_pairs(self.input_top_values, self.input_top_ids, k, req.top_logprobs_num))
            ids = req.token_ids_logprob
            got.chosen.append(list(zip(self.input_chosen[k], ids)) if self.input_chosen and ids else [])


@dataclass(frozen=True)
class LaunchedBatch:
    """A batch as it was launched, with its result on the way. Its result is matched against this, never
    against the live ScheduleBatch: the running batch is one object, prepared again for the next step
    (and filtered as requests finish) while this one's tokens are still in flight."""

    forward_mode: ForwardMode
    reqs: Tuple["Req", ...]
    seq_lens: Tuple[int, ...]
    prefix_lens: Tuple[int, ...]
    extend_lens: Tuple[int, ...]
    chunked_req: Optional["Req"]  # the request whose prefill continues in a later chunk (it gets no token)
    num_decode: int = 0  # a mixed prefill: its last num_decode requests are running decodes
    result: Optional[PendingResult] = None  # None until the forward is launched

    @classmethod
    def of(cls, batch: "ScheduleBatch", chunked_req: Optional["Req"]) -> "LaunchedBatch":
        extend = batch.forward_mode.is_extend()
        return cls(
            batch.forward_mode,
            tuple(batch.reqs),
            tuple(batch.seq_lens),
            tuple(batch.prefix_lens) if extend else (),
            tuple(batch.extend_lens) if extend else (),
            chunked_req if extend else None,
            batch.num_decode if extend else 0,
        )

    def batch_size(self) -> int:
        return len(self.reqs)


class SchedulerOutputMixin:
    def process_batch_result(self: "Scheduler", batch: LaunchedBatch, result: BatchResult) -> None:
        extend = batch.forward_mode.is_extend()
        num_prefill = batch.batch_size() - batch.num_decode  # a mixed prefill's running decodes come last
        prefilled, decoded = [], []  # the batch's requests this result is for
        for row, (req, seq_len) in enumerate(zip(batch.reqs, batch.seq_lens)):
            req.tokens_in_flight -= 1
            if req.req_pool_idx is None:
                # Finished and released while this step was in flight (the overlap scheduler launched it before
                # the previous step's tokens showed the request done): its token is not the request's.
                continue
            (prefilled if extend and row < num_prefill else decoded).append(req)
            req.kv_committed_len = seq_len
            if extend and req.wants_input_logprobs:
                result.add_prompt_logprobs(row, req, batch.prefix_lens[row])
                req.input_logprobs_done = req is not batch.chunked_req
            if extend and req is batch.chunked_req:  # more chunks to come: no token yet
                self.tree_cache.cache_unfinished_req(req)
                continue
            if not req.finished():
                if req.sampling_params.max_new_tokens == 0:  # a prefill-only request: no token is sampled
                    req.finished_reason = FinishReason("length", length=0)
                else:
                    self.append_token(req, result.next_ids[row], result.logprobs[row])
                    if req.return_logprob:
                        top, chosen = result.output_extras(row, req)
                        req.output_top_logprobs.append(top)
                        req.output_token_ids_logprobs.append(chosen)
        if decoded:
            running = self.running_batch
            if running is not None:
                self.release_finished(running)
                if running.is_empty():
                    self.running_batch = None
        done_with_prefill = []
        if extend:
            self.stats.prompt_tokens_total += sum(batch.extend_lens[:num_prefill])
            done_with_prefill = [r for r in prefilled if r is not batch.chunked_req]
            for req in done_with_prefill:
                if not req.finished():
                    # Make the prompt shareable at once, not only when the request finishes.
                    self.tree_cache.cache_unfinished_req(req)
            new = self.new_batch(done_with_prefill)
            self.release_finished(new)
            if not new.is_empty():
                if self.running_batch is None:
                    self.running_batch = new
                else:
                    self.running_batch.merge(new)
        self.stream_output(done_with_prefill + decoded)
        self.update_stats()

    def append_token(self: "Scheduler", req: "Req", token: int, logprob: float) -> None:
        req.output_ids.append(token)
        if req.return_logprob:
            req.output_token_logprobs.append(logprob)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        self.stats.generation_tokens_total += 1
        tail = None
        params = req.sampling_params
        if params.stop_strs and self.tokenizer is not None:
            tail_ids = req.output_ids[-(params.stop_str_max_len + 1) :]
            tail = self.tokenizer.decode(tail_ids, skip_special_tokens=params.skip_special_tokens)
        req.check_finished(tail)

    def release_finished(self: "Scheduler", batch: "ScheduleBatch") -> None:
        """Return finished requests' KV to the radix tree / pool and drop them from the batch."""
        keep = []
        for req in batch.reqs:
            if req.finished():
                if req.req_pool_idx is not None:
                    self.tree_cache.cache_finished_req(req)
                self._finished_reqs.append(req)
            else:
                keep.append(req)
        batch.filter(keep)

    def stream_output(self: "Scheduler", reqs: List["Req"]) -> None:
        chosen = []
        for req in reqs:
            new_tokens = len(req.output_ids) - req.sent_offset
            interval = req.sampling_params.stream_interval or self.server_args.stream_interval
            if req.finished() or (req.stream and new_tokens >= interval):
                chosen.append(req)
        # Requests finished while not part of this batch (aborts, failed admissions) are sent too.
        chosen += [r for r in self._finished_reqs if r not in chosen and r.finished()]
        self._finished_reqs = []
        if not chosen:
            return
        out = BatchTokenIDOut(
            rids=[],
            output_ids=[],
            finished_reasons=[],
            prompt_tokens=[],
            completion_tokens=[],
            cached_tokens=[],
            output_token_logprobs=[],
            skip_special_tokens=[],
            spaces_between_special_tokens=[],
            no_stop_trim=[],
            stop_str_max_len=[],
            first_token_times=[],
            queue_times=[],
            logprob_extras=[],
        )
        for req in chosen:
            start = req.sent_offset
            req.sent_offset = len(req.output_ids)
            out.rids.append(req.rid)
            out.output_ids.append(req.output_ids[start:])
            out.finished_reasons.append(req.finished_reason.to_json() if req.finished() else None)
            out.prompt_tokens.append(len(req.origin_input_ids))
            out.completion_tokens.append(len(req.output_ids))
            out.cached_tokens.append(req.cached_tokens)
            out.output_token_logprobs.append(req.output_token_logprobs[start:] if req.return_logprob else [])
            out.logprob_extras.append(self._logprob_extras(req, start))
            out.skip_special_tokens.append(req.sampling_params.skip_special_tokens)
            out.spaces_between_special_tokens.append(req.sampling_params.spaces_between_special_tokens)
            out.no_stop_trim.append(req.sampling_params.no_stop_trim)
            out.stop_str_max_len.append(req.sampling_params.stop_str_max_len)
            out.first_token_times.append(req.first_token_time)
            out.queue_times.append(req.queue_time)
        self.output_sink(out)

    @staticmethod
    def _logprob_extras(req: "Req", start: int) -> Optional[dict]:
        """The new top-k / chosen-id output logprobs since output token `start`, and the prompt logprobs
        once the whole prompt is scored (sent once)."""
        if not req.return_logprob:
            return None
        extras: dict = {}
        if req.top_logprobs_num:
            extras["output_top"] = req.output_top_logprobs[start:]
        if req.token_ids_logprob:
            extras["output_ids"] = req.output_token_ids_logprobs[start:]
        if (
            req.logprob_start_len is not None
            and not req.input_logprobs_sent
            and (req.input_logprobs_done or req.finished())
        ):
            req.input_logprobs_sent = True
            got = req.input_logprobs
            extras["input_token"] = got.token
            if req.top_logprobs_num:
                extras["input_top"] = got.top
            if req.token_ids_logprob:
                extras["input_ids"] = got.chosen
        return extras

    def update_stats(self: "Scheduler") -> None:
        s = self.stats
        s.num_running_reqs = self.running_batch.batch_size() if self.running_batch else 0
        s.num_queued_reqs = len(self.waiting_queue)
        s.num_retracted_waiting = sum(1 for r in self.waiting_queue if r.retractions)
        # A tail lent to the KT prefill slot is out of the pool, not used by requests.
        lent = self.allocator.lent_tokens
        used = self.max_total_num_tokens - lent - self.allocator.available_size() - self.tree_cache.evictable_size()
        s.num_used_tokens = used
        s.forward_ct = self.forward_ct
        if self.elastic_slot is not None:
            s.kt_slot = dataclasses.asdict(self.elastic_slot.stats)
        s.max_total_num_tokens = self.max_total_num_tokens
        s.token_usage = used / max(self.max_total_num_tokens, 1)
        now = time.monotonic()
        since, count = self._tokens_since
        if now - since >= 1.0:
            s.gen_throughput = (s.generation_tokens_total - count) / (now - since)
            self._tokens_since = (now, s.generation_tokens_total)
