"""Req (one request's scheduling state) and ScheduleBatch (the requests of one forward pass).

Life of a request: waiting -> prefill (maybe in chunks) -> running decode -> finished. Its KV slots
are recorded in ReqToTokenPool row `req_pool_idx`; a cached prefix comes from the radix tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode, ModelWorkerBatch
from sglang.srt.sampling.logprobs import LogprobRequests
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_regex import StopRegexTimeout, first_match

if TYPE_CHECKING:
    from sglang.srt.constrained.base_backend import RequestGrammar
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode


@dataclass
class FinishReason:
    kind: str  # "stop" | "length" | "abort"
    matched: Optional[object] = None  # token id or stop string
    length: int = 0
    message: str = ""
    status_code: int = 0

    def to_json(self) -> dict:
        if self.kind == "length":
            return {"type": "length", "length": self.length}
        if self.kind == "abort":
            return {"type": "abort", "message": self.message, "status_code": self.status_code}
        return {"type": "stop", "matched": self.matched}


@dataclass
class PromptLogprobs:
    """A request's prompt-position logprobs, from logprob_start_len on: per position the prompt token's
    (logprob, id) (logprob None at position 0, which nothing predicts), its top-k and chosen-id pairs."""

    token: List[Tuple[Optional[float], int]] = field(default_factory=list)
    top: List[Optional[List[Tuple[float, int]]]] = field(default_factory=list)
    chosen: List[Optional[List[Tuple[float, int]]]] = field(default_factory=list)


class Req:
    def __init__(
        self,
        rid: str,
        input_ids: List[int],
        sampling_params: SamplingParams,
        eos_token_ids: List[int],
        sampling_seed: int,
        return_logprob: bool = False,
        stream: bool = False,
        input_text: str = "",
    ) -> None:
        self.rid = rid
        self.origin_input_text = input_text
        self.origin_input_ids = list(input_ids)
        self.sampling_params = sampling_params
        self.sampling_seed = sampling_seed
        self.return_logprob = return_logprob
        self.stream = stream
        self.stop_token_ids = set(sampling_params.stop_token_ids or [])
        if not sampling_params.ignore_eos:
            self.stop_token_ids |= set(eos_token_ids)
        self.output_ids: List[int] = []
        self.output_token_logprobs: List[float] = []
        # Logprobs beyond the sampled token's (SGLang's logprob_start_len / top_logprobs_num / token_ids_logprob).
        self.logprob_start_len: Optional[int] = None  # first prompt position scored; None: no prompt logprobs
        self.top_logprobs_num = 0
        self.token_ids_logprob: Optional[List[int]] = None
        self.input_logprobs = PromptLogprobs()  # filled chunk by chunk during the prefill
        self.input_logprobs_done = False  # the whole prompt was scored (not again after a retraction)
        self.input_logprobs_sent = False
        self.output_top_logprobs: List[List[Tuple[float, int]]] = []
        self.output_token_ids_logprobs: List[List[Tuple[float, int]]] = []
        self.finished_reason: Optional[FinishReason] = None
        # Its grammar's matcher (constrained decoding), set when the grammar compiled; it has accepted every
        # token of output_ids, and only those (the scheduler never lets a constrained request run ahead of it).
        self.grammar: Optional["RequestGrammar"] = None
        # The model reasons first (--reasoning-parser, thinking on): its grammar applies after the reasoning.
        self.require_reasoning = False
        # KV bookkeeping
        self.fill_ids: List[int] = []
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.last_node: Optional["TreeNode"] = None
        self.cache_protected_len = 0  # leading tokens whose slots belong to the radix tree
        self.swa_released_len = 0  # hybrid SWA pool: its own tokens before this gave back their window slots
        self.req_pool_idx: Optional[int] = None
        self.kv_committed_len = 0  # tokens whose K/V are written
        self.kv_allocated_len = 0  # positions of its request row that hold slots (>= kv_committed_len)
        # Tokens a launched forward samples for this request that are not yet in output_ids (0 or 1): the
        # overlap scheduler prepares the next decode step before the last one's tokens reach the host.
        self.tokens_in_flight = 0
        self.extend_input_len = 0
        self.cached_tokens = 0  # prompt tokens served from the radix cache (reported once)
        self.retractions = 0
        self.created_time = time.monotonic()
        self.first_token_time: Optional[float] = None
        self.queue_time: Optional[float] = None  # arrival -> first prefill, seconds
        self.sent_offset = 0  # output tokens already sent to the detokenizer

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def scheduled_len(self) -> int:
        """seqlen once the tokens in flight are counted: the length the next decode step works from."""
        return self.seqlen + self.tokens_in_flight

    @property
    def num_generated(self) -> int:
        """Output tokens, counting those in flight (the sampler's step number, min_new_tokens)."""
        return len(self.output_ids) + self.tokens_in_flight

    def finished(self) -> bool:
        return self.finished_reason is not None

    def abort(self, message: str, status_code: int) -> None:
        """Finish with an error the client gets as `status_code` (released with the batch's result)."""
        self.finished_reason = FinishReason("abort", message=message, status_code=status_code)

    @property
    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len is not None and not self.input_logprobs_done

    def init_next_round_input(self, tree_cache: Optional["RadixCache"]) -> None:
        """Set fill_ids and match the longest cached prefix (the last token is always recomputed)."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        if tree_cache is not None:
            key = self.fill_ids[: len(self.fill_ids) - 1]
            if self.wants_input_logprobs:
                # Prompt token q is scored from the hidden state at q - 1: those must be computed here.
                key = key[: max(self.logprob_start_len, 1) - 1]
            self.prefix_indices, self.last_node = tree_cache.match_prefix(key)
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def init_chunk_continuation(self) -> None:
        """Next chunk of a chunked prefill: everything after the slots this request already holds."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def check_finished(self, tail_text: Optional[str] = None) -> None:
        """After a new token: length limit, stop token, or a stop string / stop regex in `tail_text` (the
        decoded tail)."""
        if self.finished():
            return
        params = self.sampling_params
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = FinishReason("length", length=params.max_new_tokens)
            return
        if len(self.output_ids) < params.min_new_tokens:
            return
        last = self.output_ids[-1]
        if last in self.stop_token_ids:
            self.finished_reason = FinishReason("stop", matched=last)
            return
        if tail_text is not None:
            for stop in params.stop_strs:
                if stop in tail_text:
                    self.finished_reason = FinishReason("stop", matched=stop)
                    return
            try:
                pattern = first_match(params.stop_regexes, tail_text)
            except StopRegexTimeout as e:  # too costly to match: this request ends with a 400, the others run on
                self.abort(str(e), 400)
                return
            if pattern is not None:  # reported as upstream reports it: the pattern itself
                self.finished_reason = FinishReason("stop", matched=pattern)

    def reset_for_retract(self) -> None:
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.last_node = None
        self.cache_protected_len = 0
        self.swa_released_len = 0
        self.req_pool_idx = None
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.retractions += 1


class ScheduleBatch:
    def __init__(
        self,
        reqs: List[Req],
        req_to_token_pool: "ReqToTokenPool",
        allocator: "TokenToKVPoolAllocator",
        tree_cache: "RadixCache",
        vocab_size: int,
        device: str,
    ) -> None:
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.vocab_size = vocab_size
        self.device = device
        self.forward_mode = ForwardMode.DECODE
        self.out_cache_loc: Optional[torch.Tensor] = None
        self.input_ids: Optional[List[int]] = []  # None in decode: the device's last sampled tokens
        self.seq_lens: List[int] = []
        self.prefix_lens: List[int] = []
        self.extend_lens: List[int] = []
        self.num_decode = 0  # a mixed prefill: its last num_decode requests are running decodes (one token each)

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    def _alloc_slots(self, alloc_fn, *args) -> torch.Tensor:
        out = alloc_fn(*args)
        if out is None:
            need = sum(self.extend_lens) if self.forward_mode.is_extend() else len(self.reqs)
            need += self.allocator.page_size * len(self.reqs)
            self.tree_cache.release_out_of_window(self.reqs, need)  # the window pool (hybrid SWA), if short
            self.tree_cache.evict(need)
            out = alloc_fn(*args)
        if out is None:
            raise RuntimeError("KV pool exhausted after eviction; the scheduler admitted too much")
        return out

    def _last_locs(self, lens: List[int], reqs: Optional[List[Req]] = None) -> Optional[List[int]]:
        """The slot of each request's token lens[i] - 1 (-1 when lens[i] is 0), which the allocator continues
        a partly used page from; None with one-token pages, where no page is ever continued. Read from the
        request table's host copy: a device read would wait for the forward in flight."""
        if self.allocator.page_size == 1:
            return None
        reqs = self.reqs if reqs is None else reqs
        rows, positions = [r.req_pool_idx for r in reqs], [max(n - 1, 0) for n in lens]
        slots = self.req_to_token_pool.read_positions(rows, positions)
        return [slot if n > 0 else -1 for slot, n in zip(slots, lens)]

    def prepare_for_extend(self) -> None:
        self.forward_mode = ForwardMode.EXTEND
        for req in self.reqs:
            if req.req_pool_idx is None:
                (req.req_pool_idx,) = self.req_to_token_pool.alloc(1)
        self.prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        self.extend_lens = [r.extend_input_len for r in self.reqs]
        self.seq_lens = [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]
        self.input_ids = [t for r, p, s in zip(self.reqs, self.prefix_lens, self.seq_lens) for t in r.fill_ids[p:s]]
        pool = self.req_to_token_pool
        for req, p in zip(self.reqs, self.prefix_lens):
            if p:  # point the row at the prefix's slots (the tree's, or this request's earlier chunks)
                pool.write(req.req_pool_idx, 0, req.prefix_indices)
        self.out_cache_loc = self._alloc_slots(
            self.allocator.alloc_extend, self.prefix_lens, self.seq_lens, self._last_locs(self.prefix_lens)
        )
        start = 0
        for req, p, s in zip(self.reqs, self.prefix_lens, self.seq_lens):
            pool.write(req.req_pool_idx, p, self.out_cache_loc[start : start + s - p])
            req.kv_allocated_len = s
            start += s - p

    def prepare_for_decode(self) -> None:
        """One new token per request. The input token is not read here: the forward takes each row's last
        sampled token on the device, so this works before the previous step's tokens reach the host."""
        self.forward_mode = ForwardMode.DECODE
        self.input_ids = None
        self.seq_lens = [r.scheduled_len for r in self.reqs]
        self.out_cache_loc = self._alloc_slots(
            self.allocator.alloc_decode, self.seq_lens, self._last_locs([s - 1 for s in self.seq_lens])
        )
        rows = [r.req_pool_idx for r in self.reqs]
        self.req_to_token_pool.write_positions(rows, [s - 1 for s in self.seq_lens], self.out_cache_loc)
        for req, s in zip(self.reqs, self.seq_lens):
            req.kv_allocated_len = s

    def mix_with_running(self, decoding: List[Req]) -> None:
        """Let running requests take their next decode step inside this prefill batch (SGLang's mixed chunk):
        each extends its sequence by one token, its last sampled one, which the forward reads on the device."""
        seq_lens = [r.scheduled_len for r in decoding]
        locs = self._alloc_slots(
            self.allocator.alloc_decode, seq_lens, self._last_locs([s - 1 for s in seq_lens], decoding)
        )
        rows = [r.req_pool_idx for r in decoding]
        self.req_to_token_pool.write_positions(rows, [s - 1 for s in seq_lens], locs)
        for req, s in zip(decoding, seq_lens):
            req.kv_allocated_len = s
        self.reqs = self.reqs + decoding
        self.prefix_lens += [s - 1 for s in seq_lens]
        self.extend_lens += [1] * len(decoding)
        self.seq_lens += seq_lens
        self.input_ids += [0] * len(decoding)  # placeholders: the forward takes the last sampled tokens
        self.out_cache_loc = torch.cat((self.out_cache_loc, locs))
        self.num_decode = len(decoding)

    def decode_tokens_needed(self) -> int:
        """Slots the next decode step takes (a new page for requests whose last page is full)."""
        ps = self.allocator.page_size
        return sum(ps if r.scheduled_len % ps == 1 % ps else 0 for r in self.reqs) if ps > 1 else len(self.reqs)

    def filter(self, keep: List[Req]) -> None:
        self.reqs = keep

    def merge(self, other: "ScheduleBatch") -> None:
        self.reqs = self.reqs + other.reqs

    def logprob_requests(self) -> Optional[LogprobRequests]:
        """What this batch asks of logprobs beyond the sampled tokens, or None if no request wants logprobs.
        In a prefill, the rows of prompt positions to score: hidden row r (position pos) scores token pos + 1."""
        if not any(r.return_logprob for r in self.reqs):
            return None
        wanted = LogprobRequests(
            top_nums=[r.top_logprobs_num if r.return_logprob else 0 for r in self.reqs],
            token_ids=[r.token_ids_logprob if r.return_logprob else None for r in self.reqs],
        )
        if not self.forward_mode.is_extend():
            return wanted
        first_row = 0
        for i, (req, prefix, ext) in enumerate(zip(self.reqs, self.prefix_lens, self.extend_lens)):
            if req.wants_input_logprobs:
                prompt = req.origin_input_ids
                lo, hi = max(prefix, max(req.logprob_start_len, 1) - 1), min(prefix + ext, len(prompt) - 1)
                for pos in range(lo, hi):
                    wanted.input_rows.append(first_row + pos - prefix)
                    wanted.input_targets.append(prompt[pos + 1])
                    wanted.input_owner.append(i)
            first_row += ext
        return wanted

    def get_model_worker_batch(self) -> ModelWorkerBatch:
        extend = self.forward_mode.is_extend()
        return ModelWorkerBatch(
            forward_mode=self.forward_mode,
            input_ids=self.input_ids,
            req_pool_indices=[r.req_pool_idx for r in self.reqs],
            seq_lens=self.seq_lens,
            out_cache_loc=self.out_cache_loc,
            extend_seq_lens=self.extend_lens if extend else None,
            extend_prefix_lens=self.prefix_lens if extend else None,
            sampling_info=SamplingBatchInfo.from_reqs(self.reqs, self.vocab_size, self.device, self.logprob_requests()),
            return_logprob=any(r.return_logprob for r in self.reqs),
            num_decode=self.num_decode if extend else 0,
        )
