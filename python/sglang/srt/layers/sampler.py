"""Batched sampling: penalties, grammar masks (constrained decoding), greedy, temperature, top-k, top-p, min-p, and per-request seeds.

Randomness comes from a counter-based hash of (seed, step, token id), not from a stateful generator,
so a seeded request samples the same tokens whatever else is in its batch, on any device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import nn

from sglang.srt.constrained.xgrammar_backend import apply_bitmask
from sglang.srt.sampling.logprobs import LogprobExtras, extras_from_logprobs
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

_MASK64 = (1 << 64) - 1


def _i64(x: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)
_STEP = _i64(0xD1B54A32D192ED03)


def _lshr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer (int64 multiplies wrap mod 2^64)."""
    x = (x ^ _lshr(x, 30)) * _MIX1
    x = (x ^ _lshr(x, 27)) * _MIX2
    return x ^ _lshr(x, 31)


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[bs, vocab] floats in (0, 1): splitmix64 of (seed, step, token).

    (seed, step) is hashed first: hashing `seed * G + token * G` directly would make seed s + 1's
    noise for token i equal seed s's for token i + 1, correlating requests with neighbouring seeds.
    """
    idx = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    base = _mix(seeds * _GOLDEN + steps * _STEP)
    x = _mix(base[:, None] + (idx[None, :] + 1) * _GOLDEN)
    return unit_interval(x)


def unit_interval(x: torch.Tensor) -> torch.Tensor:
    """int64 hashes -> fp32 in the open interval (0, 1), from their top 23 bits. With 24 bits the largest
    value, (2^24 - 0.5) / 2^24, rounds to 1.0 in fp32: its exponential noise -log(u) is then 0, and the
    race p / 0 picks that token whatever its probability (inf), even a masked one (0 / 0 = NaN wins argmax)."""
    return (_lshr(x, 41).to(torch.float32) + 0.5) / float(1 << 23)


def _in_rows(rows_idx: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return (rows_idx >= start) & (rows_idx < stop)


def apply_penalties(logits: torch.Tensor, info: SamplingBatchInfo, start: int = 0) -> torch.Tensor:
    """In place on fp32 logits holding batch rows [start, start + len), touching only penalised pairs."""
    stop = start + logits.shape[0]
    if info.repetition_rows is not None:
        # Repetition penalty as in CTRL / transformers: shrink positive logits, grow negative ones.
        m = _in_rows(info.repetition_rows, start, stop)
        r, c, f = info.repetition_rows[m] - start, info.repetition_cols[m], info.repetition_factor[m]
        v = logits[r, c]
        logits[r, c] = torch.where(v > 0, v / f, v * f)
    if info.penalty_rows is not None:
        m = _in_rows(info.penalty_rows, start, stop)
        logits.index_put_((info.penalty_rows[m] - start, info.penalty_cols[m]), info.penalty_bias[m], accumulate=True)
    if info.block_rows is not None:
        m = _in_rows(info.block_rows, start, stop)
        logits[info.block_rows[m] - start, info.block_cols[m]] = float("-inf")
    return logits


def filter_probs(probs: torch.Tensor, info: SamplingBatchInfo, rows: slice = slice(None)) -> torch.Tensor:
    """Zero what top-k / top-p / min-p exclude; `probs` holds the batch rows `rows`."""
    top_ps, top_ks, min_ps = info.top_ps[rows], info.top_ks[rows], info.min_ps[rows]
    if info.need_top_p_top_k:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
        drop = ranks >= top_ks[:, None]
        drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_ps[:, None]
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    if info.need_min_p:
        threshold = probs.max(dim=-1, keepdim=True).values * min_ps[:, None]
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


# Rows sampled at once: fp32 logits, sorting and noise cost ~50 bytes per vocabulary entry per row, so
# chunks keep sampling's memory flat at any batch size (the post-capture planner measures this peak).
SAMPLING_CHUNK_ROWS = 64


@dataclass
class SampleOutput:
    next_token_ids: torch.Tensor  # [bs] int64
    logprobs: Optional[torch.Tensor]  # [bs] fp32: of each sampled token, under the penalised logits
    extras: Optional[LogprobExtras] = None  # top-k and chosen ids at this position, where asked


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, info: SamplingBatchInfo, return_logprob: bool = True) -> SampleOutput:
        """Sample one token per row. With return_logprob, also its logprob under the penalised logits
        and whatever top-k / chosen-id logprobs the batch asked for (`info.logprob_requests`).
        `logits` may be in any float dtype; each row chunk is promoted."""
        bs = logits.shape[0]
        ids = torch.empty(bs, dtype=torch.int64, device=logits.device)
        logprobs = torch.empty(bs, dtype=torch.float32, device=logits.device) if return_logprob else None
        wanted = info.logprob_requests if return_logprob else None
        top_k = wanted.max_top() if wanted is not None else 0
        chosen_ids = wanted.ids_matrix(list(range(bs)), logits.device) if wanted is not None else None
        extra_parts: List[LogprobExtras] = []
        for start in range(0, bs, SAMPLING_CHUNK_ROWS):
            rows = slice(start, start + SAMPLING_CHUNK_ROWS)
            chunk = apply_penalties(logits[rows].float(), info, start)
            if info.grammar_bitmask is not None:  # before anything reads the logits: logprobs are the masked ones
                apply_bitmask(chunk, info.grammar_bitmask[rows])
            chunk_ids = chunk.argmax(dim=-1)
            if not info.is_all_greedy:
                probs = torch.softmax(chunk / info.temperatures[rows], dim=-1)
                probs = filter_probs(probs, info, rows)
                # Exponential race: argmax(p / E), E ~ Exp(1), draws index i with probability p_i.
                exp_noise = -torch.log(uniform_noise(info.seeds[rows], info.steps[rows], chunk.shape[-1]))
                sampled = (probs / exp_noise).argmax(dim=-1)
                chunk_ids = torch.where(info.greedy_mask[rows], chunk_ids, sampled)
            ids[rows] = chunk_ids
            if logprobs is not None:
                normalizer = torch.logsumexp(chunk, dim=-1, keepdim=True)
                logprobs[rows] = (chunk.gather(-1, chunk_ids[:, None]) - normalizer).squeeze(-1)
                if top_k or chosen_ids is not None:
                    extra_parts.append(
                        extras_from_logprobs(
                            chunk - normalizer, top_k, None if chosen_ids is None else chosen_ids[rows]
                        )
                    )
        return SampleOutput(ids, logprobs, LogprobExtras.cat(extra_parts) if extra_parts else None)
