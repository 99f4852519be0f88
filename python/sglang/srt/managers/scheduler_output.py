"""After a forward pass: append tokens, detect finished requests, free their KV, stream outputs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, List

from sglang.srt.managers.io_struct import BatchTokenIDOut

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler


class SchedulerOutputMixin:
    def process_batch_result(self: "Scheduler", batch: "ScheduleBatch", next_ids: List[int], logprobs: List[float]) -> None:
        extend = batch.forward_mode.is_extend()
        for req, seq_len, token, logprob in zip(batch.reqs, batch.seq_lens, next_ids, logprobs):
            req.kv_committed_len = seq_len
            if extend and req is self.chunked_req:  # more chunks to come: no token yet
                self.tree_cache.cache_unfinished_req(req)
                continue
            if not req.finished():
                self.append_token(req, token, logprob)
        if extend:
            self.stats.prompt_tokens_total += sum(batch.extend_lens)
            done_with_prefill = [r for r in batch.reqs if r is not self.chunked_req]
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
        else:
            self.release_finished(batch)
            if batch.is_empty():
                self.running_batch = None
        self.stream_output(batch.reqs if not extend else [r for r in batch.reqs if r is not self.chunked_req])
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
        interval = self.server_args.stream_interval
        chosen = []
        for req in reqs:
            new_tokens = len(req.output_ids) - req.sent_offset
            if req.finished() or (req.stream and new_tokens >= interval):
                chosen.append(req)
        # Requests finished while not part of this batch (aborts, failed admissions) are sent too.
        chosen += [r for r in self._finished_reqs if r not in chosen and r.finished()]
        self._finished_reqs = []
        if not chosen:
            return
        out = BatchTokenIDOut(
            rids=[], output_ids=[], finished_reasons=[], prompt_tokens=[], completion_tokens=[],
            cached_tokens=[], output_token_logprobs=[], skip_special_tokens=[],
            spaces_between_special_tokens=[], no_stop_trim=[], stop_str_max_len=[], first_token_times=[],
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
            out.skip_special_tokens.append(req.sampling_params.skip_special_tokens)
            out.spaces_between_special_tokens.append(req.sampling_params.spaces_between_special_tokens)
            out.no_stop_trim.append(req.sampling_params.no_stop_trim)
            out.stop_str_max_len.append(req.sampling_params.stop_str_max_len)
            out.first_token_times.append(req.first_token_time)
        self.output_sink(out)

    def update_stats(self: "Scheduler") -> None:
        s = self.stats
        s.num_running_reqs = self.running_batch.batch_size() if self.running_batch else 0
        s.num_queued_reqs = len(self.waiting_queue)
        used = self.max_total_num_tokens - self.allocator.available_size() - self.tree_cache.evictable_size()
        s.num_used_tokens = used
        s.max_total_num_tokens = self.max_total_num_tokens
        s.token_usage = used / max(self.max_total_num_tokens, 1)
        now = time.monotonic()
        since, count = self._tokens_since
        if now - since >= 1.0:
            s.gen_throughput = (s.generation_tokens_total - count) / (now - since)
            self._tokens_since = (now, s.generation_tokens_total)
