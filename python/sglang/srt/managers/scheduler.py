"""Scheduler: continuous batching over one rank's ModelRunner.

Each step either runs a prefill batch (new requests, or the next chunk of a chunked prefill) or one
decode step of every running request. When the KV pool cannot hold the next decode step, requests
are retracted to the waiting queue (their KV goes to the radix tree, where it may still be reused);
none is ever dropped. With overlap scheduling (the default) a step launches its batch before it
processes the previous batch's result, so the host prepares step N + 1 while the device runs step N
(`step`, `drain`); with --enable-mixed-chunk the running requests' decode rides along in prefill batches.
The same class runs in-process (tests, benchmarks) or inside the scheduler process (scheduler_process.py),
which adds the ZeroMQ plumbing and tensor-parallel broadcast.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import deque
from typing import Callable, Deque, List, Optional

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.environ import envs
from sglang.srt.managers.device_timeline import DeviceMark, DeviceTimeline
from sglang.srt.managers.elastic_slot import ElasticKTSlot, HostTailArena
from sglang.srt.managers.io_struct import AbortReq, SchedulerStats, TokenizedGenerateReqInput
from sglang.srt.managers.schedule_batch import FinishReason, Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder, estimated_future_tokens, sort_waiting_queue
from sglang.srt.managers.scheduler_faults import SchedulerFaultMixin
from sglang.srt.managers.scheduler_output import LaunchedBatch, PendingResult, SchedulerOutputMixin
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.sampling_params import SamplingParams, to_int64
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.fault_injection import FaultPlan

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.14
NEW_TOKEN_RATIO_DECAY = 0.001


class Scheduler(SchedulerOutputMixin, SchedulerFaultMixin):
    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int = 0,
        tp_rank: int = 0,
        dist_init_method: Optional[str] = None,
        output_sink: Optional[Callable] = None,
        faults: Optional[FaultPlan] = None,
    ) -> None:
        self.server_args = server_args
        self.faults = faults or FaultPlan()
        self.tp_rank = tp_rank
        self.model_config = ModelConfig.from_server_args(server_args)
        self.model_runner = ModelRunner(
            self.model_config, server_args, gpu_id, tp_rank, server_args.tp_size, dist_init_method
        )
        self.device = server_args.device
        self.tokenizer = None
        if not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_tokenizer import get_tokenizer

            self.tokenizer = get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
        self.eos_token_ids = sorted(set(self.model_config.eos_token_ids) | self._tokenizer_eos())
        self.req_to_token_pool = self.model_runner.req_to_token_pool
        self.allocator = self.model_runner.token_to_kv_pool_allocator
        self.tree_cache = RadixCache(
            self.req_to_token_pool, self.allocator, server_args.page_size, disable=server_args.disable_radix_cache
        )
        self.max_running_requests = self.req_to_token_pool.size  # the request table is sized once, by the planner
        self.elastic_slot = self._elastic_kt_slot()
        chunk = server_args.chunked_prefill_size
        self.chunked_prefill_size = chunk if chunk and chunk > 0 else None
        self.waiting_queue: Deque[Req] = deque()
        self.running_batch: Optional[ScheduleBatch] = None
        self.chunked_req: Optional[Req] = None
        # Overlap scheduling: the next batch is prepared and launched while this one runs on the device.
        self.enable_overlap = not server_args.disable_overlap_schedule
        self.in_flight: Optional[LaunchedBatch] = None  # launched; its result not processed yet
        self._last_decode_launch: Optional[float] = None  # perf_counter of the last launch, if it was a decode
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.output_sink = output_sink or (lambda out: None)
        self.stats = SchedulerStats(max_total_num_tokens=self.model_runner.max_total_num_tokens)
        self.timeline = DeviceTimeline(self.stats)
        self._tokens_since = (time.monotonic(), 0)
        self.forward_ct = 0
        self._finished_reqs: List[Req] = []  # finished outside process_batch_result, sent with the next output
        self._oom_logged = False  # the memory summary is logged at the first out-of-memory error only

    def _elastic_kt_slot(self) -> Optional[ElasticKTSlot]:
        """The KT prefill slot lent from the pool's tail, when the planner made one (post-capture path)."""
        mr = self.model_runner
        tail, kt_state = mr.pool_size.lendable_tail, mr.model.prefill_slot_state()
        threshold = self.server_args.kt_gpu_prefill_token_threshold
        host_tail = envs.SGLANG_TEST_CPU_ELASTIC_SLOT_TAIL_TOKENS.get()
        if kt_state is not None and threshold and self.device == "cpu" and host_tail:
            page = self.server_args.page_size
            self.allocator.resize(self.allocator.size, lendable_tail_pages=host_tail // page)
            arena = HostTailArena(sum(mr.memory_plan.reservations_bytes.values()))
            return ElasticKTSlot(arena, self.allocator, self.tree_cache, kt_state, threshold)
        if tail is None or kt_state is None:
            return None
        return ElasticKTSlot(mr.kv_arena, self.allocator, self.tree_cache, kt_state, threshold)

    def _tokenizer_eos(self) -> set:
        tok = self.tokenizer
        return {tok.eos_token_id} if tok is not None and tok.eos_token_id is not None else set()

    @property
    def max_total_num_tokens(self) -> int:
        return self.allocator.size  # the allocator owns the token count

    # --------------------------------------------------------------- input
    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        """Queue a request; one whose data cannot be handled is answered with an error, never fatal."""
        try:
            self._add_request(recv)
        except Exception as e:  # noqa: BLE001 - the second line of defence behind the tokenizer manager's checks
            logger.exception("Could not admit request %s", recv.rid)
            req = Req(recv.rid, [], SamplingParams(), [], 0)
            req.finished_reason = FinishReason(
                "abort", message=f"the scheduler could not admit this request: {type(e).__name__}: {e}", status_code=400
            )
            self.stream_output([req])

    def _add_request(self, recv: TokenizedGenerateReqInput) -> None:
        params = recv.sampling_params
        seed = to_int64(params.sampling_seed) if params.sampling_seed is not None else random.getrandbits(62)
        req = Req(
            recv.rid,
            recv.input_ids,
            params,
            self.eos_token_ids,
            seed,
            recv.return_logprob,
            recv.stream,
            recv.input_text,
        )
        if recv.return_logprob:
            # SGLang's rule: -1 scores the last prompt token only (the first position it can be asked for).
            start = len(req.origin_input_ids) - 1 if recv.logprob_start_len == -1 else recv.logprob_start_len
            if start >= len(req.origin_input_ids):
                self._abort_new(
                    req,
                    f"logprob_start_len ({start}) must be smaller than the prompt's {len(req.origin_input_ids)} tokens",
                )
                return
            req.logprob_start_len = start
            req.top_logprobs_num = recv.top_logprobs_num
            req.token_ids_logprob = recv.token_ids_logprob
        if len(req.origin_input_ids) >= self.model_config.context_len:
            self._abort_new(
                req,
                f"prompt of {len(req.origin_input_ids)} tokens does not fit the context length {self.model_config.context_len}",
            )
            return
        if len(req.origin_input_ids) + 1 > self.max_total_num_tokens:
            self._abort_new(
                req,
                f"prompt of {len(req.origin_input_ids)} tokens does not fit the KV cache of {self.max_total_num_tokens} tokens",
            )
            return
        # Never generate past the context window. max_new_tokens 0 still runs the prefill, as in SGLang:
        # it caches the prompt (the frontend's prefix caching, parallel samples) and computes prompt logprobs.
        params.max_new_tokens = min(params.max_new_tokens, self.model_config.context_len - len(req.origin_input_ids))
        self.waiting_queue.append(req)

    def _abort_new(self, req: Req, message: str) -> None:
        req.finished_reason = FinishReason("abort", message=message, status_code=400)
        self.stream_output([req])

    def abort_request(self, abort: AbortReq) -> None:
        for req in list(self.waiting_queue):
            if req.rid == abort.rid:
                self.waiting_queue.remove(req)
                req.finished_reason = FinishReason("abort", message=abort.message, status_code=abort.status_code)
                if req.req_pool_idx is not None:  # a retracted request may still hold a row
                    self.tree_cache.cache_finished_req(req)
                self.stream_output([req])
                return
        running = self.running_batch.reqs if self.running_batch else []
        in_flight = list(self.in_flight.reqs) if self.in_flight else []  # e.g. a prefill not yet processed
        for req in running + in_flight + ([self.chunked_req] if self.chunked_req else []):
            if req.rid == abort.rid and not req.finished():
                # Released with the next batch result, so its KV is freed exactly once.
                req.finished_reason = FinishReason("abort", message=abort.message, status_code=abort.status_code)

    def flush_cache(self) -> bool:
        if self.waiting_queue or self.running_batch or self.chunked_req or self.in_flight:
            return False
        self.tree_cache.reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()
        return True

    # ----------------------------------------------------------- scheduling
    def new_batch(self, reqs: List[Req]) -> ScheduleBatch:
        return ScheduleBatch(
            reqs, self.req_to_token_pool, self.allocator, self.tree_cache, self.model_config.vocab_size, self.device
        )

    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        if self.prefill_in_flight() and not self.prefill_may_follow_unprocessed():
            self.drain()
        batch = self.get_new_batch_prefill()
        if batch is not None:
            if self.server_args.enable_mixed_chunk:
                self.mix_running_into(batch)
            return batch
        if self.prefill_in_flight():
            self.drain()  # a prefill's requests join the running batch once its result is in
        running = self.running_batch
        if running is not None and self.in_flight is not None and self.needs_outputs_before_decode(running):
            self.drain()
        if self.running_batch is None or self.running_batch.is_empty():
            self.running_batch = None
            return None
        return self.update_running_batch()

    def prefill_in_flight(self) -> bool:
        return self.in_flight is not None and self.in_flight.forward_mode.is_extend()

    def prefill_may_follow_unprocessed(self) -> bool:
        """Whether the next prefill may go out before the result of the prefill in flight is processed, as in
        SGLang's overlap loop: new requests do not need it (their admission counts the in-flight prefill's
        requests as running, `requests_joining`), so the device runs prefill chunks back to back instead of
        idling while the host processes each result and forms the next batch. A chunked prompt's next chunk
        waits for it (its prefix is inserted into the radix tree there), and so does the elastic KT slot.
        Like SGLang, a waiting request then does not find the in-flight prompts in the radix tree."""
        return (
            self.enable_overlap
            and self.chunked_req is None
            and self.in_flight.chunked_req is None
            and self.elastic_slot is None
            and bool(self.waiting_queue)
        )

    def requests_joining(self) -> List[Req]:
        """The requests of the prefill in flight that will join the running batch when its result is in."""
        if not self.prefill_in_flight():
            return []
        launched = self.in_flight
        return [
            r for r in launched.reqs[: launched.batch_size() - launched.num_decode] if r is not launched.chunked_req
        ]

    def mix_running_into(self, batch: ScheduleBatch) -> None:
        """--enable-mixed-chunk: the running requests take their next decode step inside this prefill batch
        instead of waiting for a step of their own; not when that step needs retraction or their last tokens."""
        running = self.running_batch
        if running is None or running.is_empty() or self.needs_outputs_before_decode(running):
            return
        riders = [r for r in running.reqs if not self.last_step_in_flight(r)]
        if riders:
            batch.mix_with_running(riders)

    @staticmethod
    def last_step_in_flight(req: Req) -> bool:
        """The step in flight is the request's last (by length, or it was aborted): it needs no further step,
        and leaves the running batch when that step's result comes in."""
        return bool(req.tokens_in_flight) and (
            req.finished() or req.num_generated >= req.sampling_params.max_new_tokens
        )

    def needs_outputs_before_decode(self, batch: ScheduleBatch) -> bool:
        """Whether the next decode step must wait for the step in flight: when the pool may not hold it
        (retraction decides on the requests' real lengths, and finished ones free room), or when a request's
        penalties count its output tokens."""
        room = self.allocator.available_size() + self.tree_cache.evictable_size()
        return room < batch.decode_tokens_needed() or any(r.sampling_params.has_penalties for r in batch.reqs)

    def get_new_batch_prefill(self) -> Optional[ScheduleBatch]:
        if not self.waiting_queue and self.chunked_req is None:
            return None
        slot = self.elastic_slot
        if slot is not None:
            self.drain()  # lending the tail reads the pool as the step in flight leaves it
            # Before this batch takes KV pages: it must not land in the tail the slot needs (cached pages
            # elsewhere are evicted for it instead), and admission then counts the pool without the tail.
            a = self.allocator
            tail_free_tokens = a.tail_tokens - a.tail_pages_in_use() * a.page_size
            room = a.available_size() - tail_free_tokens + self.tree_cache.evictable_size()
            if slot.should_take(self.chunked_req, self.waiting_queue, self.chunked_prefill_size, room):
                slot.take(step=self.forward_ct + 1)
        running = (self.running_batch.reqs if self.running_batch else []) + self.requests_joining()
        reserved = sum(estimated_future_tokens(r, self.new_token_ratio) for r in running)
        adder = PrefillAdder(
            page_size=self.server_args.page_size,
            rem_total_tokens=self.allocator.available_size() + self.tree_cache.evictable_size() - reserved,
            rem_input_tokens=self.server_args.max_prefill_tokens,
            rem_chunk_tokens=self.chunked_prefill_size,
            rem_requests=self.max_running_requests - len(running) - (1 if self.chunked_req else 0),
            has_running=bool(running) or self.chunked_req is not None,
        )
        if self.chunked_req is not None:
            self.chunked_req.init_chunk_continuation()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        if self.chunked_req is None:
            sort_waiting_queue(self.waiting_queue, self.server_args.schedule_policy, self.tree_cache)
            while self.waiting_queue:
                req = self.waiting_queue[0]
                req.init_next_round_input(None if self.tree_cache.disable else self.tree_cache)
                if self.req_to_token_pool.available_size() <= len(adder.can_run_list) and req.req_pool_idx is None:
                    break
                verdict = adder.add_one_req(req, self.tree_cache, self.new_token_ratio)
                if verdict == "full":
                    break
                self.waiting_queue.popleft()
                if verdict == "chunked":
                    self.chunked_req = adder.new_chunked_req
                    break
        if not adder.can_run_list:
            return None
        batch = self.new_batch(adder.can_run_list)
        for req in batch.reqs:
            if req.kv_committed_len == 0 and not req.output_ids:  # first admission, not a later chunk
                if req.queue_time is None:
                    req.queue_time = time.monotonic() - req.created_time
                req.cached_tokens = len(req.prefix_indices)
                self.stats.cached_tokens_total += req.cached_tokens
        batch.prepare_for_extend()
        return batch

    def update_running_batch(self) -> Optional[ScheduleBatch]:
        """Make room for the next decode step (retracting requests if the pool cannot hold it) and prepare
        it; returns the batch to run, or None."""
        batch = self.running_batch
        while self.allocator.available_size() + self.tree_cache.evictable_size() < batch.decode_tokens_needed():
            if batch.batch_size() == 1:
                req = batch.reqs[0]
                req.finished_reason = FinishReason(
                    "abort",
                    message=f"KV cache of {self.max_total_num_tokens} tokens cannot hold this request",
                    status_code=400,
                )
                self.release_finished(batch)
                self.running_batch = None
                self.stream_output([])
                return None
            self.retract_one(batch)
        if batch.is_empty():
            self.running_batch = None
            return None
        self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        if any(self.last_step_in_flight(r) for r in batch.reqs):
            batch = self.new_batch([r for r in batch.reqs if not self.last_step_in_flight(r)])
            if batch.is_empty():
                return None
        batch.prepare_for_decode()
        return batch

    def retract_one(self, batch: ScheduleBatch) -> None:
        """Move the request with the fewest generated tokens (longest prompt on ties) back to waiting."""
        victim = min(batch.reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
        batch.filter([r for r in batch.reqs if r is not victim])
        self.tree_cache.cache_finished_req(victim)
        victim.reset_for_retract()
        self.waiting_queue.appendleft(victim)
        self.stats.num_retractions += 1
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.1)
        logger.info("KV cache full: retracted request %s (%d tokens) to the waiting queue", victim.rid, victim.seqlen)

    # -------------------------------------------------------------- running
    def run_batch(self, batch: ScheduleBatch) -> PendingResult:
        """Launch the forward and sampling of `batch`; the result is read later (PendingResult.resolve)."""
        self.forward_ct += 1
        self.faults.before_forward(self.forward_ct)
        worker_batch = batch.get_model_worker_batch()
        forward_batch = ForwardBatch.init_new(worker_batch, self.model_runner)
        start = DeviceMark.now(on_cuda=self.device == "cuda")
        logits_output = self.model_runner.forward(forward_batch)
        sampled = self.model_runner.sample(logits_output, forward_batch)
        return PendingResult.launch(
            sampled, logits_output.input_logprobs, worker_batch.sampling_info.logprob_requests, start
        )

    def step(self) -> bool:
        """Run at most one batch; returns False when there was nothing to do. With overlap scheduling the
        batch is launched first and the previous batch's result processed while it runs (SGLang's overlap
        scheduler); a decode step then goes out before the host has seen the tokens of the step before it,
        so a request that finished there computes one more token, which is dropped."""
        batch = self.get_next_batch_to_run()
        if batch is None:
            drained = self.drain()
            self.timeline.out_of_work()
            return drained
        slot = self.elastic_slot  # taken, if it could be, before the batch was formed (get_new_batch_prefill)
        launched = self.launch_batch(batch)
        previous, self.in_flight = self.in_flight, launched
        if previous is not None:
            self.finish_batch(previous)
        if not self.enable_overlap:
            self.drain()
        if slot is not None and slot.stats.lent and self.chunked_req is None:
            slot.give_back(step=self.forward_ct)  # lent per long prefill: the pool has its whole size between them
        return True

    def launch_batch(self, batch: ScheduleBatch) -> Optional[LaunchedBatch]:
        """Launch `batch`; None if it failed at once (its requests are then answered with the error)."""
        launched = LaunchedBatch.of(batch, self.chunked_req)
        now, last = time.perf_counter(), self._last_decode_launch
        decode = batch.forward_mode.is_decode()
        if decode and last is not None:
            self.stats.decode_periods += 1
            self.stats.decode_period_seconds += now - last
        self._last_decode_launch = now if decode else None
        try:
            pending = self.run_batch(batch)
        except Exception as e:  # noqa: BLE001 - out of memory, or a bug in one batch: fail it, keep serving
            self.drain()  # the step in flight first: its requests are in this batch too
            self.handle_batch_failure(launched, e)
            return None
        for req in launched.reqs:
            req.tokens_in_flight += 1
        return dataclasses.replace(launched, result=pending)

    def finish_batch(self, launched: LaunchedBatch) -> None:
        """Wait for a launched batch's result and hand its tokens to the requests."""
        pending = launched.result
        try:
            result = pending.resolve()
        except Exception as e:  # noqa: BLE001 - an error the device reported late: as if the launch had failed
            for req in launched.reqs:
                req.tokens_in_flight -= 1
            self.handle_batch_failure(launched, e)
        else:
            self.timeline.account(launched.forward_mode.is_extend(), pending.start, pending.end)
            self.process_batch_result(launched, result)

    def drain(self) -> bool:
        """Finish the batch in flight, if there is one (True then)."""
        launched, self.in_flight = self.in_flight, None
        if launched is None:
            return False
        self.finish_batch(launched)
        return True

    def has_work(self) -> bool:
        return (
            bool(self.waiting_queue)
            or self.running_batch is not None
            or self.chunked_req is not None
            or self.in_flight is not None
        )
