"""Sampling parameters of a batch as tensors, built once per forward from its requests."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence

import torch

from sglang.srt.constrained.grammar_key import UNSATISFIABLE
from sglang.srt.sampling.logprobs import LogprobRequests

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # [bs, 1]
    top_ps: torch.Tensor  # [bs]
    top_ks: torch.Tensor  # [bs] int64, vocab size when off
    min_ps: torch.Tensor  # [bs]
    seeds: torch.Tensor  # [bs] int64
    steps: torch.Tensor  # [bs] int64 (tokens generated so far: the noise differs every step)
    is_all_greedy: bool
    greedy_mask: torch.Tensor  # [bs] bool
    need_top_p_top_k: bool
    need_min_p: bool
    # Penalties and min_new_tokens as sparse (row, token) lists, only when some request uses them:
    # dense [bs, vocab] tensors would cost GBs at large batch sizes (memory the planner must keep free).
    penalty_rows: Optional[torch.Tensor] = None  # [n] int64
    penalty_cols: Optional[torch.Tensor] = None  # [n] int64: tokens generated so far
    penalty_bias: Optional[torch.Tensor] = None  # [n]: -(frequency * count + presence), plus logit_bias
    repetition_rows: Optional[torch.Tensor] = None  # [m] int64
    repetition_cols: Optional[torch.Tensor] = None  # [m] int64: tokens seen (prompt and output)
    repetition_factor: Optional[torch.Tensor] = None  # [m]
    block_rows: Optional[torch.Tensor] = None  # stop tokens forbidden while below min_new_tokens
    block_cols: Optional[torch.Tensor] = None
    logprob_requests: Optional[LogprobRequests] = None  # top-k / chosen-id / prompt logprobs some row asked for
    # Constrained decoding: [bs, ceil(vocab / 32)] int32, bit set = token allowed; only when some row has a
    # grammar. Set by the scheduler just before it launches the sampling (Scheduler.sample), from each row's
    # matcher, while the device runs this batch's forward.
    grammar_bitmask: Optional[torch.Tensor] = None

    @classmethod
    def from_reqs(
        cls, reqs: List["Req"], vocab_size: int, device: str, logprob_requests: Optional[LogprobRequests] = None
    ) -> "SamplingBatchInfo":
        ps = [r.sampling_params for r in reqs]
        greedy = [p.is_greedy for p in ps]
        f = lambda xs, dt=torch.float32: torch.tensor(xs, dtype=dt).to(device, non_blocking=True)  # noqa: E731
        info = cls(
            temperatures=f([max(p.temperature, 1e-6) for p in ps]).view(-1, 1),
            top_ps=f([p.top_p for p in ps]),
            top_ks=f([min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in ps], torch.int64),
            min_ps=f([p.min_p for p in ps]),
            seeds=f([r.sampling_seed for r in reqs], torch.int64),
            steps=f([r.num_generated for r in reqs], torch.int64),
            is_all_greedy=all(greedy),
            greedy_mask=f(greedy, torch.bool),
            need_top_p_top_k=any(p.top_p < 1 or 0 < p.top_k < vocab_size for p in ps),
            need_min_p=any(p.min_p > 0 for p in ps),
            logprob_requests=logprob_requests,
        )
        if any(p.has_penalties or p.logit_bias_ids for p in ps):
            info._build_penalties(reqs, f)
        blocked = [
            (i, t)
            for i, r in enumerate(reqs)
            if r.num_generated < r.sampling_params.min_new_tokens
            for t in sorted(r.stop_token_ids)
            if t < vocab_size
        ]
        if blocked:
            info.block_rows = f([i for i, _ in blocked], torch.int64)
            info.block_cols = f([t for _, t in blocked], torch.int64)
        return info

    def _build_penalties(self, reqs: List["Req"], f) -> None:
        rows, cols, bias, rrows, rcols, rfac = [], [], [], [], [], []
        for i, r in enumerate(reqs):
            p = r.sampling_params
            if p.has_penalties and r.tokens_in_flight:
                # The scheduler finishes the step in flight first (Scheduler.needs_outputs_before_decode).
                raise RuntimeError(f"request {r.rid}: penalties need its output tokens, one is still in flight")
            if p.frequency_penalty or p.presence_penalty:
                counts = Counter(r.output_ids)
                for tok, n in counts.items():
                    rows.append(i)
                    cols.append(tok)
                    bias.append(-(p.frequency_penalty * n + p.presence_penalty))
            for tok, b in p.logit_bias_ids.items():  # added like a penalty (index_put_ accumulates)
                rows.append(i)
                cols.append(tok)
                bias.append(b)
            if p.repetition_penalty != 1:
                for tok in set(r.origin_input_ids) | set(r.output_ids):
                    rrows.append(i)
                    rcols.append(tok)
                    rfac.append(p.repetition_penalty)
        if rows:
            self.penalty_rows, self.penalty_cols, self.penalty_bias = (
                f(rows, torch.int64),
                f(cols, torch.int64),
                f(bias),
            )
        if rrows:
            self.repetition_rows, self.repetition_cols = f(rrows, torch.int64), f(rcols, torch.int64)
            self.repetition_factor = f(rfac)


def grammar_bitmask(reqs: Sequence["Req"], vocab_size: int) -> torch.Tensor:
    """The allowed next tokens of each row with a grammar (every token for the other rows; a finished request's
    row too: its token is dropped). Each request's only token in flight must be the one this mask is for.

    A request whose grammar allows no token here (a dead end: no output can satisfy it any more) is finished now
    with a 400 naming its constraint, as an abort of a running request is: released with this batch's result,
    its row all-allowed (an all-false row would make the sampler pick token 0 and the matcher refuse it)."""
    from sglang.srt.constrained.xgrammar_backend import allocate_bitmask

    bitmask = allocate_bitmask(len(reqs), vocab_size)
    filled = False
    for i, r in enumerate(reqs):
        if r.grammar is None or r.finished():
            continue
        if r.tokens_in_flight > 1:
            # The scheduler samples after the step before is processed (Scheduler.sample_when_matchers_ready).
            raise RuntimeError(f"request {r.rid}: its grammar needs its last token, which is still in flight")
        r.grammar.fill_bitmask(bitmask, i)
        filled = True
    # All-false rows found in one pass over the mask: each row's own check cost about as much as its fill
    # (benchmark/constrained/bench_grammar_bitmask.py). Rows without a grammar are all-allowed.
    empty_rows = (~bitmask.any(dim=1)).nonzero().flatten().tolist() if filled else []
    for i in empty_rows:
        r = reqs[i]
        if r.grammar.at_dead_end():
            bitmask[i] = -1
            r.abort(
                f"{r.grammar.key.kind}: {UNSATISFIABLE}: after {len(r.output_ids)} generated tokens the grammar "
                "allows no next token (a dead end of the constraint)",
                400,
            )
    return bitmask
