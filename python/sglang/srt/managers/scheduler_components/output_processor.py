"""After a forward pass: append each request's token (stop checks, logprobs), and stream outputs onward.

OutputProcessor applies one batch's result to its requests and says which of them the result was for;
the scheduler then moves them between its queues (it owns the running batch). OutputStreamer turns
requests into the detokenizer's BatchTokenIDOut messages, including requests that finished outside a
batch (aborts, failed admissions), sent with the next message. Every logprob leaves the scheduler there,
floored at LOGPROB_FLOOR (every route, streamed or not, reads these messages).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

from sglang.srt.managers.io_struct import BatchTokenIDOut, SchedulerStats
from sglang.srt.managers.schedule_batch import FinishReason
from sglang.srt.managers.scheduler_components.batch_result import BatchResult, LaunchedBatch

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.radix_cache import RadixCache


# A token the grammar masks (constrained decoding) has logprob -inf, which JSON cannot carry ("-Infinity" is no JSON,
# and the response encoders refuse it). Logprobs are reported at least this, as vLLM's OpenAI server does
# (`max(logprob, -9999.0)`): a probability of e^-9999 is 0 in every float type. NaN is kept (a bug to surface).
LOGPROB_FLOOR = -9999.0


def floor_logprob(value: Optional[float]) -> Optional[float]:
    return LOGPROB_FLOOR if value is not None and value < LOGPROB_FLOOR else value


def floor_logprobs(values: Sequence[float]) -> List[float]:
    return [floor_logprob(v) for v in values]


def floor_pairs(pairs: Optional[Sequence[Tuple[Optional[float], int]]]) -> Optional[List[Tuple[Optional[float], int]]]:
    """(logprob, token id) pairs with their logprobs floored; None (nothing predicts that position) kept."""
    return None if pairs is None else [(floor_logprob(lp), tid) for lp, tid in pairs]


@dataclass(frozen=True)
class AppliedResult:
    """The requests a result was for (those released while it was in flight excluded)."""

    prefilled: List["Req"]  # a prefill's requests (a chunked request's middle chunks included)
    decoded: List["Req"]  # decode rows (a mixed prefill's running decodes too)


class OutputStreamer:
    def __init__(self, sink: Callable[[BatchTokenIDOut], None], stream_interval: int) -> None:
        self.sink = sink
        self.stream_interval = stream_interval  # --stream-interval, unless a request sets its own
        self._finished_elsewhere: List["Req"] = []  # finished outside a batch result, sent with the next output

    def finish_later(self, req: "Req") -> None:
        self._finished_elsewhere.append(req)

    def stream(self, reqs: List["Req"]) -> None:
        chosen = []
        for req in reqs:
            new_tokens = len(req.output_ids) - req.sent_offset
            interval = req.sampling_params.stream_interval or self.stream_interval
            if req.finished() or (req.stream and new_tokens >= interval):
                chosen.append(req)
        chosen += [r for r in self._finished_elsewhere if r not in chosen and r.finished()]
        self._finished_elsewhere = []
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
            stop_regexes=[],
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
            out.output_token_logprobs.append(
                floor_logprobs(req.output_token_logprobs[start:]) if req.return_logprob else []
            )
            out.logprob_extras.append(_logprob_extras(req, start))
            out.skip_special_tokens.append(req.sampling_params.skip_special_tokens)
            out.spaces_between_special_tokens.append(req.sampling_params.spaces_between_special_tokens)
            out.no_stop_trim.append(req.sampling_params.no_stop_trim)
            out.stop_str_max_len.append(req.sampling_params.stop_str_max_len)
            out.stop_regexes.append(req.sampling_params.stop_regexes)
            out.first_token_times.append(req.first_token_time)
            out.queue_times.append(req.queue_time)
        self.sink(out)


def _logprob_extras(req: "Req", start: int) -> Optional[dict]:
    """The new top-k / chosen-id output logprobs since output token `start`, and the prompt logprobs
    once the whole prompt is scored (sent once); every logprob floored (LOGPROB_FLOOR)."""
    if not req.return_logprob:
        return None
    extras: dict = {}
    if req.top_logprobs_num:
        extras["output_top"] = [floor_pairs(p) for p in req.output_top_logprobs[start:]]
    if req.token_ids_logprob:
        extras["output_ids"] = [floor_pairs(p) for p in req.output_token_ids_logprobs[start:]]
    if (
        req.logprob_start_len is not None
        and not req.input_logprobs_sent
        and (req.input_logprobs_done or req.finished())
    ):
        req.input_logprobs_sent = True
        got = req.input_logprobs
        extras["input_token"] = floor_pairs(got.token)
        if req.top_logprobs_num:
            extras["input_top"] = [floor_pairs(p) for p in got.top]
        if req.token_ids_logprob:
            extras["input_ids"] = [floor_pairs(p) for p in got.chosen]
    return extras


class OutputProcessor:
    def __init__(self, tree_cache: "RadixCache", tokenizer: Optional[Any], stats: SchedulerStats) -> None:
        self.tree_cache = tree_cache
        self.tokenizer = tokenizer  # decodes the output's tail for stop strings (None: token ids only)
        self.stats = stats

    def apply(self, batch: LaunchedBatch, result: BatchResult) -> AppliedResult:
        """Hand the result's tokens and logprobs to the batch's requests."""
        extend = batch.forward_mode.is_extend()
        num_prefill = batch.batch_size() - batch.num_decode  # a mixed prefill's running decodes come last
        prefilled, decoded = [], []
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
        if extend:
            self.stats.prompt_tokens_total += sum(batch.extend_lens[:num_prefill])
        return AppliedResult(prefilled, decoded)

    def append_token(self, req: "Req", token: int, logprob: float) -> None:
        req.output_ids.append(token)
        if req.return_logprob:
            req.output_token_logprobs.append(logprob)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        self.stats.generation_tokens_total += 1
        if req.grammar is not None and not self.accept_grammar_token(req, token):
            return
        tail = None
        params = req.sampling_params
        if (params.stop_strs or params.stop_regexes) and self.tokenizer is not None:
            # one token per character at worst, and one more for a match that starts inside a token
            tail_ids = req.output_ids[-(max(params.stop_str_max_len, params.stop_regex_max_len) + 1) :]
            tail = self.tokenizer.decode(tail_ids, skip_special_tokens=params.skip_special_tokens)
        req.check_finished(tail)
        if req.grammar is not None and not req.finished() and req.grammar.is_terminated():
            req.finished_reason = FinishReason("stop", matched=token)  # the grammar is complete (its stop token)

    @staticmethod
    def accept_grammar_token(req: "Req", token: int) -> bool:
        """Advance the request's matcher; a token the mask allowed is always accepted, so a refusal is a bug,
        reported on this request alone."""
        if req.grammar.accept_token(token):
            return True
        req.finished_reason = FinishReason(
            "abort", message=f"constrained decoding: token {token} broke the request's grammar", status_code=500
        )
        return False
