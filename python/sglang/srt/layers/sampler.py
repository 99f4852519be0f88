"""Batched sampling: penalties, greedy, temperature, top-k, top-p, min-p, and per-request seeds.

Randomness comes from a counter-based hash of (seed, step, token id), not from a stateful generator,
so a seeded request samples the same tokens whatever else is in its batch, on any device.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

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


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[bs, vocab] floats in (0, 1): splitmix64 of (seed, step, token); int64 multiply wraps mod 2^64."""
    idx = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    x = seeds[:, None] * _GOLDEN + steps[:, None] * _STEP + idx[None, :] * _GOLDEN
    x = (x ^ _lshr(x, 30)) * _MIX1
    x = (x ^ _lshr(x, 27)) * _MIX2
    x = x ^ _lshr(x, 31)
    return (_lshr(x, 40).to(torch.float32) + 0.5) / float(1 << 24)


def apply_penalties(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    if info.repetition is not None:
        # Repetition penalty as in CTRL / transformers: shrink positive logits, grow negative ones.
        logits = torch.where(logits > 0, logits / info.repetition, logits * info.repetition)
    if info.penalty_bias is not None:
        logits = logits + info.penalty_bias
    if info.min_new_tokens_block is not None:
        logits = logits + info.min_new_tokens_block
    return logits


def filter_probs(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    if info.need_top_p_top_k:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
        drop = ranks >= info.top_ks[:, None]
        drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > info.top_ps[:, None]
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    if info.need_min_p:
        threshold = probs.max(dim=-1, keepdim=True).values * info.min_ps[:, None]
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, info: SamplingBatchInfo) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns (next token ids [bs] int64, their log-probabilities under the penalised logits [bs])."""
        logits = apply_penalties(logits, info)
        logprobs = torch.log_softmax(logits, dim=-1)
        greedy_ids = logits.argmax(dim=-1)
        if info.is_all_greedy:
            ids = greedy_ids
        else:
            probs = torch.softmax(logits / info.temperatures, dim=-1)
            probs = filter_probs(probs, info)
            # Exponential race: argmax(p / E), E ~ Exp(1), draws index i with probability p_i.
            exp_noise = -torch.log(uniform_noise(info.seeds, info.steps, logits.shape[-1]))
            sampled = (probs / exp_noise).argmax(dim=-1)
            ids = torch.where(info.greedy_mask, greedy_ids, sampled)
        return ids, logprobs.gather(-1, ids[:, None]).squeeze(-1)
