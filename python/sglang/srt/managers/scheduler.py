"""Scheduler: continuous batching over one rank's ModelRunner.

Each step either runs a prefill batch (new requests, or the next chunk of a chunked prefill) or one
decode step of every running request. When the KV pool cannot hold the next decode step, requests
are retracted to the waiting queue (their KV goes to the radix tree, where it may still be reused);
none is ever dropped. With overlap scheduling (the default) a step launches its batch before it
processes the previous batch's result, so the host prepares step N + 1 while the device runs step N;
`step` is that loop, and every wait for the batch in flight (`drain`) is in it. With
--enable-mixed-chunk the running requests' decode rides along in prefill batches.

The scheduler is composed of parts with named dependencies (scheduler_components/): the output
processor and streamer, the failure policy, the grammar queue (constrained decoding), and the KT prefill
slot's lender. `build_scheduler` wires
them over a new ModelRunner; the scheduler process (scheduler_process.py) adds ZeroMQ and the
tensor-parallel broadcast; tests build it in-process and replace parts with their stand-ins.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional

from sglang.srt.configs.engine_config import EngineConfig
from sglang.srt.constrained.reasoning_gate import reasoning_end_ids
from sglang.srt.managers.device_timeline import DeviceMark, DeviceTimeline
from sglang.srt.managers.io_struct import AbortReq, SchedulerStats, TokenizedGenerateReqInput
from sglang.srt.managers.schedule_batch import FinishReason, Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder, estimated_future_tokens, sort_waiting_queue
from sglang.srt.managers.scheduler_components.batch_result import (
    BatchResult,
    LaunchedBatch,
    PendingResult,
    UnsampledForward,
)
from sglang.srt.managers.scheduler_components.failure_policy import BatchFailurePolicy
from sglang.srt.managers.scheduler_components.grammar_queue import GrammarQueue
from sglang.srt.managers.scheduler_components.kt_prefill_slot_lender import HostSlotMemory, KTPrefillSlotLender
from sglang.srt.managers.scheduler_components.output_processor import OutputProcessor, OutputStreamer
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.parser.reasoning_parser import FORMATS as REASONING_FORMATS
from sglang.srt.sampling.sampling_batch_info import grammar_bitmask
from sglang.srt.sampling.sampling_params import SamplingParams, to_int64
from sglang.srt.utils.fault_injection import FaultPlan

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.14
NEW_TOKEN_RATIO_DECAY = 0.001
GRAMMAR_IDLE_WAIT_S = 0.005  # nothing to run but grammars compiling: how long one wait for them lasts


def build_scheduler(
    config: EngineConfig,
    gpu_id: int = 0,
    tp_rank: int = 0,
    dist_init_method: Optional[str] = None,
    output_sink: Optional[Callable] = None,
    faults: Optional[FaultPlan] = None,
    host_slot_tail_tokens: int = 0,
) -> "Scheduler":
    """A Scheduler over a new ModelRunner for this rank (the composition root)."""
    model_runner = ModelRunner(config, gpu_id, tp_rank, dist_init_method)
    tokenizer = None
    if not config.args.skip_tokenizer_init:
        from sglang.srt.utils.hf_tokenizer import get_tokenizer

        tokenizer = get_tokenizer(config.args.tokenizer_path, config.args.trust_remote_code)
    return Scheduler(
        config,
        model_runner,
        tokenizer=tokenizer,
        output_sink=output_sink,
        faults=faults,
        host_slot_tail_tokens=host_slot_tail_tokens,
    )


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        model_runner: ModelRunner,
        *,
        tokenizer: Optional[Any] = None,
        output_sink: Optional[Callable] = None,
        faults: Optional[FaultPlan] = None,
        host_slot_tail_tokens: int = 0,
    ) -> None:
        """`host_slot_tail_tokens` (tests, --device cpu): lend the KT prefill slot from the pool's last N tokens
        through host memory (HostSlotMemory), where there is no VMM arena to lend it from."""
        args = config.args
        self.config = config
        self.args = args
        self.faults = faults or FaultPlan()
        self.tp_rank = model_runner.tp_rank
        self.model_config = config.model
        self.model_runner = model_runner
        self.device = config.device.kind
        self.tokenizer = tokenizer
        self.eos_token_ids = sorted(set(self.model_config.eos_token_ids) | self._tokenizer_eos())
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.allocator = model_runner.token_to_kv_pool_allocator
        self.tree_cache = self._tree_cache(model_runner)
        self.max_running_requests = self.req_to_token_pool.size  # the request table is sized once, by the planner
        chunk = args.chunked_prefill_size
        self.chunked_prefill_size = chunk if chunk and chunk > 0 else None
        self.waiting_queue: Deque[Req] = deque()
        self.running_batch: Optional[ScheduleBatch] = None
        self.chunked_req: Optional[Req] = None
        # Overlap scheduling: the next batch is prepared and launched while this one runs on the device.
        self.enable_overlap = not args.disable_overlap_schedule
        self.in_flight: Optional[LaunchedBatch] = None  # launched; its result not processed yet
        self._last_decode_launch: Optional[float] = None  # perf_counter of the last launch, if it was a decode
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.output_sink = output_sink or (lambda out: None)
        self.stats = SchedulerStats(max_total_num_tokens=model_runner.max_total_num_tokens)
        self.timeline = DeviceTimeline(self.stats)
        self._tokens_since = (time.monotonic(), 0)
        self.forward_ct = 0
        # The parts.
        self.streamer = OutputStreamer(self.output_sink, args.stream_interval)
        self.outputs = OutputProcessor(self.tree_cache, tokenizer, self.stats)
        self.failures = BatchFailurePolicy(
            args.tp_size, self.tp_rank, self.device, self.stats, lambda: model_runner.memory_plan.format_table()
        )
        self.kt_slot_lender = self._kt_slot_lender(host_slot_tail_tokens)
        self.grammar_queue = self._grammar_queue()

    def _tree_cache(self, model_runner: ModelRunner) -> RadixCache:
        """The radix cache over the pool the runner built (the hybrid SWA pool's knows about windows)."""
        args = self.args
        if model_runner.kv_geometry.is_hybrid_swa:
            window = self.model_config.max_sliding_window
            return SWARadixCache(
                self.req_to_token_pool, self.allocator, args.page_size, window, disable=args.disable_radix_cache
            )
        return RadixCache(self.req_to_token_pool, self.allocator, args.page_size, disable=args.disable_radix_cache)

    def _grammar_queue(self) -> GrammarQueue:
        """Compiles the requests' grammars (--grammar-backend xgrammar / llguidance) over the model's vocabulary."""
        args = self.args
        if args.grammar_backend == "none":
            return GrammarQueue(None, "constrained decoding is off on this server (--grammar-backend none)", False)
        if self.tokenizer is None:
            return GrammarQueue(None, "constrained decoding needs the tokenizer (--skip-tokenizer-init is set)", False)
        if args.grammar_backend == "llguidance":
            from sglang.srt.constrained.llguidance_backend import LLGuidanceBackend as Backend
        else:
            from sglang.srt.constrained.xgrammar_backend import XGrammarBackend as Backend
        backend = Backend(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        end = ()
        if args.reasoning_parser is not None:  # a request that thinks first is constrained after its reasoning
            end = reasoning_end_ids(self.tokenizer, REASONING_FORMATS[args.reasoning_parser].end)
        return GrammarQueue(backend, "", wait_for_compile=args.tp_size > 1, reasoning_end=end)

    def _kt_slot_lender(self, host_tail_tokens: int) -> Optional[KTPrefillSlotLender]:
        """The KT prefill slot's lender, when the planner lent the slot from the pool's tail (post-capture path),
        or host memory stands in for the arena (CPU tests)."""
        mr, threshold = self.model_runner, self.config.args.kt_gpu_prefill_token_threshold
        slot = mr.kt_prefill_slot
        if slot is None:
            return None
        if self.device == "cpu" and host_tail_tokens:
            self.allocator.resize(self.allocator.size, lendable_tail_pages=host_tail_tokens // self.args.page_size)
            memory = HostSlotMemory(sum(mr.memory_plan.reservations_bytes.values()))
            return KTPrefillSlotLender(memory, self.allocator, self.tree_cache, slot, threshold)
        if mr.pool_size.prefill_slot_tail is None:
            return None
        return KTPrefillSlotLender(mr.kv_arena, self.allocator, self.tree_cache, slot, threshold)

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
            req.abort(f"the scheduler could not admit this request: {type(e).__name__}: {e}", 400)
            self.streamer.stream([req])

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
        req.require_reasoning = recv.require_reasoning
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
        if params.grammar_key is None:
            self.waiting_queue.append(req)
        elif not self.grammar_queue.add(req):  # waits there for its own compile only
            self.streamer.stream([req])
        else:
            self.admit_compiled()

    def admit_compiled(self) -> None:
        """Requests whose grammar compiled join the waiting queue; those whose grammar failed are answered."""
        if not self.grammar_queue:
            return
        ready, failed = self.grammar_queue.pop_done()
        self.waiting_queue.extend(ready)
        if failed:
            self.streamer.stream(failed)

    def _abort_new(self, req: Req, message: str) -> None:
        req.abort(message, 400)
        self.streamer.stream([req])

    def abort_request(self, abort: AbortReq) -> None:
        compiling = self.grammar_queue.remove(abort.rid)
        if compiling is not None:
            compiling.abort(abort.message, abort.status_code)
            self.streamer.stream([compiling])
            return
        for req in list(self.waiting_queue):
            if req.rid == abort.rid:
                self.waiting_queue.remove(req)
                req.abort(abort.message, abort.status_code)
                if req.req_pool_idx is not None:  # a retracted request may still hold a row
                    self.tree_cache.cache_finished_req(req)
                self.streamer.stream([req])
                return
        running = self.running_batch.reqs if self.running_batch else []
        in_flight = list(self.in_flight.reqs) if self.in_flight else []  # e.g. a prefill not yet processed
        for req in running + in_flight + ([self.chunked_req] if self.chunked_req else []):
            if req.rid == abort.rid and not req.finished():
                # Released with the next batch result, so its KV is freed exactly once.
                req.abort(abort.message, abort.status_code)

    def flush_cache(self) -> bool:
        if self.waiting_queue or self.running_batch or self.chunked_req or self.in_flight or self.grammar_queue:
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

    def prefill_in_flight(self) -> bool:
        return self.in_flight is not None and self.in_flight.forward_mode.is_extend()

    def prefill_may_follow_unprocessed(self) -> bool:
        """Whether the next prefill may go out before the result of the prefill in flight is processed, as in
        SGLang's overlap loop: new requests do not need it (their admission counts the in-flight prefill's
        requests as running, `requests_joining`), so the device runs prefill chunks back to back instead of
        idling while the host processes each result and forms the next batch. A chunked prompt's next chunk
        waits for it (its prefix is inserted into the radix tree there), and so does lending the KT prefill slot.
        Like SGLang, a waiting request then does not find the in-flight prompts in the radix tree."""
        return (
            self.enable_overlap
            and self.chunked_req is None
            and self.in_flight.chunked_req is None
            and self.kt_slot_lender is None
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
        penalties count its output tokens. Batches without such requests keep overlapping; so do requests
        with a grammar: only their sampling waits for the step in flight (`sample_when_matchers_ready`)."""
        return self.decode_room_short(batch) or any(r.sampling_params.has_penalties for r in batch.reqs)

    def decode_room_short(self, batch: ScheduleBatch) -> bool:
        """The pool (and the window pool, hybrid SWA) cannot hold the next decode step even after evicting."""
        need = batch.decode_tokens_needed()
        if self.allocator.available_size() + self.tree_cache.evictable_size() < need:
            return True
        swa_room = self.tree_cache.swa_room()
        if swa_room is None or swa_room >= need:
            return False
        return self.tree_cache.swa_room(batch.reqs) < need  # what they would release counts: update_running_batch does

    def has_prefill_work(self) -> bool:
        return bool(self.waiting_queue) or self.chunked_req is not None

    def lend_kt_slot_if_needed(self) -> None:
        """Before the next prefill batch takes KV pages: lend the pool's tail to the KT prefill slot when that
        batch can reach the threshold. The batch must not land in the tail the slot needs (cached pages
        elsewhere are evicted for it instead), and admission then counts the pool without the tail."""
        a, lender = self.allocator, self.kt_slot_lender
        tail_free_tokens = a.tail_tokens - a.tail_pages_in_use() * a.page_size
        room = a.available_size() - tail_free_tokens + self.tree_cache.evictable_size()
        if lender.should_take(self.chunked_req, self.waiting_queue, self.chunked_prefill_size, room):
            lender.take(step=self.forward_ct + 1)

    def get_new_batch_prefill(self) -> Optional[ScheduleBatch]:
        if not self.has_prefill_work():
            return None
        running = (self.running_batch.reqs if self.running_batch else []) + self.requests_joining()
        reserved = sum(estimated_future_tokens(r, self.new_token_ratio) for r in running)
        # The window pool (hybrid SWA), if it has not a chunk's room: running requests' tokens out of their windows
        # give their window slots back first.
        chunk_need = (self.chunked_prefill_size or self.args.max_prefill_tokens) + self.args.page_size * len(running)
        owners = running + ([self.chunked_req] if self.chunked_req is not None else [])
        self.tree_cache.release_out_of_window(owners, chunk_need)
        swa_room = self.tree_cache.swa_room()
        adder = PrefillAdder(
            page_size=self.args.page_size,
            rem_total_tokens=self.allocator.available_size() + self.tree_cache.evictable_size() - reserved,
            rem_input_tokens=self.args.max_prefill_tokens,
            rem_chunk_tokens=self.chunked_prefill_size,
            rem_requests=self.max_running_requests - len(running) - (1 if self.chunked_req else 0),
            has_running=bool(running) or self.chunked_req is not None,
            # Each running request's next decode step takes a page of the window pool.
            rem_swa_tokens=None if swa_room is None else swa_room - self.args.page_size * len(running),
        )
        if self.chunked_req is not None:
            self.chunked_req.init_chunk_continuation()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        if self.chunked_req is None:
            sort_waiting_queue(self.waiting_queue, self.args.schedule_policy, self.tree_cache)
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
        if batch is None or batch.is_empty():
            self.running_batch = None
            return None
        self.tree_cache.release_out_of_window(batch.reqs, batch.decode_tokens_needed())
        while self.decode_room_short(batch):
            if batch.batch_size() == 1:
                req = batch.reqs[0]
                req.abort(f"KV cache of {self.max_total_num_tokens} tokens cannot hold this request", 400)
                self.release_finished(batch)
                self.running_batch = None
                self.streamer.stream([])
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
    def run_batch(self, batch: ScheduleBatch) -> UnsampledForward:
        """Launch the forward of `batch`; its sampling is launched by `sample`."""
        self.forward_ct += 1
        self.faults.before_forward(self.forward_ct)
        forward_batch = ForwardBatch.init_new(batch.get_model_worker_batch(), self.model_runner)
        start = DeviceMark.now(on_cuda=self.device == "cuda")
        return UnsampledForward(self.model_runner.forward(forward_batch), forward_batch, start)

    def sample(self, forward: UnsampledForward, reqs: tuple[Req, ...]) -> PendingResult:
        """Launch the sampling of a launched forward whose rows are `reqs`; the result is read later
        (PendingResult.resolve). Rows with a grammar get their token masks now, from their matchers."""
        info = forward.forward_batch.sampling_info
        if any(r.grammar is not None for r in reqs):
            info.grammar_bitmask = grammar_bitmask(reqs, self.model_config.vocab_size).to(
                forward.logits.next_token_logits.device, non_blocking=True
            )
        sampled = self.model_runner.sample(forward.logits, forward.forward_batch)
        return PendingResult.launch(sampled, forward.logits.input_logprobs, info.logprob_requests, forward.start)

    def step(self) -> bool:
        """One turn of the overlap loop: run at most one batch; False when there was nothing to do.

        With overlap scheduling the batch is launched first and the previous batch's result processed while
        it runs (SGLang's overlap scheduler); a decode step then goes out before the host has seen the tokens
        of the step before it, so a request that finished there computes one more token, which is dropped.
        Every wait for the batch in flight (`drain`) is here, each with its reason."""
        self.admit_compiled()
        if self.prefill_in_flight() and not self.prefill_may_follow_unprocessed():
            self.drain()  # the next batch needs that prefill's result (a chunk's prefix, the waiting queue)
        lender = self.kt_slot_lender
        if lender is not None and self.has_prefill_work():
            self.drain()  # lending the pool's tail reads the pool as the step in flight leaves it
            self.lend_kt_slot_if_needed()
        batch = self.get_new_batch_prefill()
        if batch is not None:
            if self.args.enable_mixed_chunk:
                self.mix_running_into(batch)
        else:
            if self.prefill_in_flight():
                self.drain()  # a prefill's requests join the running batch once its result is in
            running = self.running_batch
            if running is not None and self.in_flight is not None and self.needs_outputs_before_decode(running):
                self.drain()  # the pool may not hold the next step, penalties or a grammar need the tokens in flight
            batch = self.update_running_batch()
        if batch is None:
            drained = self.drain()  # nothing to launch: finish what is in flight
            if not drained and self.grammar_queue:
                self.grammar_queue.wait(GRAMMAR_IDLE_WAIT_S)  # only compiles pending: wait for one, not spin
                return True
            self.timeline.out_of_work()
            return drained
        launched = LaunchedBatch.of(batch, self.chunked_req)
        try:
            launched = self.launch_batch(batch, launched)
        except Exception as e:  # noqa: BLE001 - out of memory, or a bug in one batch: fail it, keep serving
            self.drain()  # the step in flight first: its requests are in this batch too
            self.handle_batch_failure(launched, e)
            launched = None
        previous, self.in_flight = self.in_flight, launched
        if previous is not None:
            self.finish_batch(previous)  # the previous step's result, processed while this one runs
        if launched is not None and launched.result is None:
            self.in_flight = self.sample_when_matchers_ready(launched)
        if not self.enable_overlap:
            self.drain()  # overlap off: each batch's result before the next batch is formed
        if lender is not None and lender.stats.lent and self.chunked_req is None:
            lender.give_back(step=self.forward_ct)  # lent per long prefill: the pool has its whole size between them
        return True

    def launch_batch(self, batch: ScheduleBatch, launched: LaunchedBatch) -> LaunchedBatch:
        """Launch `batch` (`launched`: how it was launched); raises if the launch failed at once."""
        now, last = time.perf_counter(), self._last_decode_launch
        decode = batch.forward_mode.is_decode()
        if decode and last is not None:
            self.stats.decode_periods += 1
            self.stats.decode_period_seconds += now - last
        self._last_decode_launch = now if decode else None
        forward = self.run_batch(batch)
        if self.in_flight is not None and any(r.grammar is not None for r in launched.reqs):
            # A matcher must accept its request's token in flight before it says what may follow: this batch's
            # sampling waits for that step's result, which the host processes while the device runs this forward.
            launched = dataclasses.replace(launched, unsampled=forward)
        else:
            launched = dataclasses.replace(launched, result=self.sample(forward, launched.reqs))
        for req in launched.reqs:  # only once the launch went through (a failed one raised above)
            req.tokens_in_flight += 1
        return launched

    def sample_when_matchers_ready(self, launched: LaunchedBatch) -> Optional[LaunchedBatch]:
        """Launch the sampling that waited for the step before (`launch_batch`), now processed: the batch in
        flight, or None when the sampling failed (its requests then answered as a failed batch's)."""
        try:
            result = self.sample(launched.unsampled, launched.reqs)
        except Exception as e:  # noqa: BLE001 - as a failed launch: fail this batch, keep serving
            for req in launched.reqs:
                req.tokens_in_flight -= 1
            self.handle_batch_failure(launched, e)
            return None
        return dataclasses.replace(launched, result=result, unsampled=None)

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
            or bool(self.grammar_queue)
        )

    # ------------------------------------------------------------- results
    def process_batch_result(self, batch: LaunchedBatch, result: BatchResult) -> None:
        """Hand the result to its requests (OutputProcessor), then move them: finished ones leave with their
        KV cached, a prefill's others join the running batch; stream what is due."""
        applied = self.outputs.apply(batch, result)
        if applied.decoded and self.running_batch is not None:
            self.release_finished(self.running_batch)
            if self.running_batch.is_empty():
                self.running_batch = None
        done_with_prefill = []
        if batch.forward_mode.is_extend():
            done_with_prefill = [r for r in applied.prefilled if r is not batch.chunked_req]
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
        self.streamer.stream(done_with_prefill + applied.decoded)
        self.update_stats()

    def release_finished(self, batch: ScheduleBatch) -> None:
        """Return finished requests' KV to the radix tree / pool and drop them from the batch."""
        keep = []
        for req in batch.reqs:
            if req.finished():
                if req.req_pool_idx is not None:
                    self.tree_cache.cache_finished_req(req)
                self.streamer.finish_later(req)
            else:
                keep.append(req)
        batch.filter(keep)

    def update_stats(self) -> None:
        s = self.stats
        s.num_running_reqs = self.running_batch.batch_size() if self.running_batch else 0
        s.num_queued_reqs = len(self.waiting_queue)
        s.num_retracted_waiting = sum(1 for r in self.waiting_queue if r.retractions)
        # A tail lent to the KT prefill slot is out of the pool, not used by requests.
        lent = self.allocator.lent_tokens
        used = self.max_total_num_tokens - lent - self.allocator.available_size() - self.tree_cache.evictable_size()
        s.num_used_tokens = used
        s.forward_ct = self.forward_ct
        if self.kt_slot_lender is not None:
            s.kt_slot = dataclasses.asdict(self.kt_slot_lender.stats)
        s.max_total_num_tokens = self.max_total_num_tokens
        s.token_usage = used / max(self.max_total_num_tokens, 1)
        swa_room, swa_size = self.tree_cache.swa_room(), self.tree_cache.swa_pool_size()
        if swa_room is not None:
            s.num_used_swa_tokens = swa_size - swa_room
            s.swa_token_usage = s.num_used_swa_tokens / max(swa_size, 1)
        now = time.monotonic()
        since, count = self._tokens_since
        if now - since >= 1.0:
            s.gen_throughput = (s.generation_tokens_total - count) / (now - since)
            self._tokens_since = (now, s.generation_tokens_total)

    # ------------------------------------------------------------- failures
    def handle_batch_failure(self, batch: LaunchedBatch, exc: Exception) -> None:
        """Answer a failed batch's requests as the failure policy says (or stop, when it raises)."""
        self.fail_batch(batch, self.failures.finish_reason(batch, exc))

    def fail_batch(self, batch: LaunchedBatch, reason: FinishReason) -> None:
        """Finish every request of `batch` with `reason` and free the KV it holds. Only the K/V written
        before this batch (the prefix for a prefill, all but the new token for a decode) may be cached."""
        extend = batch.forward_mode.is_extend()
        failed = [r for r in batch.reqs if r.req_pool_idx is not None]  # the others finished before it
        for i, req in enumerate(batch.reqs):
            if req.req_pool_idx is None:
                continue
            if not req.finished():
                req.finished_reason = reason
            req.kv_committed_len = batch.prefix_lens[i] if extend else batch.seq_lens[i] - 1
            self.tree_cache.cache_finished_req(req)  # the slots this batch allocated go back to the pool
            if req is self.chunked_req:
                self.chunked_req = None
        running = self.running_batch
        if running is not None:  # a failed decode (or a mixed prefill's decodes) leaves the running batch
            running.filter([r for r in running.reqs if r.req_pool_idx is not None])
            if running.is_empty():
                self.running_batch = None
        self.streamer.stream(failed)
        self.update_stats()
