"""Sampling parameters of a batch as tensors, built once per forward from its requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import torch

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
    # Penalties: dense [bs, vocab] additive term and repetition factors, only when some request uses them.
    penalty_bias: Optional[torch.Tensor] = None
    repetition: Optional[torch.Tensor] = None  # [bs, vocab] factor (1 where the token was not seen)
    min_new_tokens_block: Optional[torch.Tensor] = None  # [bs, vocab] -inf on stop ids while below min_new_tokens

    @classmethod
    def from_reqs(cls, reqs: List["Req"], vocab_size: int, device: str) -> "SamplingBatchInfo":
        ps = [r.sampling_params for r in reqs]
        greedy = [p.is_greedy for p in ps]
        f = lambda xs, dt=torch.float32: torch.tensor(xs, dtype=dt).to(device, non_blocking=True)  # noqa: E731
        info = cls(
            temperatures=f([max(p.temperature, 1e-6) for p in ps]).view(-1, 1),
            top_ps=f([p.top_p for p in ps]),
            top_ks=f([p.top_k if p.top_k > 0 else vocab_size for p in ps], torch.int64),
            min_ps=f([p.min_p for p in ps]),
            seeds=f([r.sampling_seed for r in reqs], torch.int64),
            steps=f([len(r.output_ids) for r in reqs], torch.int64),
            is_all_greedy=all(greedy),
            greedy_mask=f(greedy, torch.bool),
            need_top_p_top_k=any(p.top_p < 1 or 0 < p.top_k < vocab_size for p in ps),
            need_min_p=any(p.min_p > 0 for p in ps),
        )
        if any(p.has_penalties for p in ps):
            info._build_penalties(reqs, vocab_size, device)
        if any(len(r.output_ids) < r.sampling_params.min_new_tokens for r in reqs):
            block = torch.zeros(len(reqs), vocab_size)
            for i, r in enumerate(reqs):
                if len(r.output_ids) < r.sampling_params.min_new_tokens:
                    ids = [t for t in r.stop_token_ids if t < vocab_size]
                    block[i, ids] = float("-inf")
            info.min_new_tokens_block = block.to(device)
        return info

    def _build_penalties(self, reqs: List["Req"], vocab_size: int, device: str) -> None:
        counts = torch.zeros(len(reqs), vocab_size)
        for i, r in enumerate(reqs):
            if r.output_ids:
                counts[i].index_add_(0, torch.tensor(r.output_ids), torch.ones(len(r.output_ids)))
        freq = torch.tensor([r.sampling_params.frequency_penalty for r in reqs]).view(-1, 1)
        pres = torch.tensor([r.sampling_params.presence_penalty for r in reqs]).view(-1, 1)
        self.penalty_bias = (-(freq * counts) - pres * (counts > 0)).to(device)
        rep = torch.tensor([r.sampling_params.repetition_penalty for r in reqs]).view(-1, 1)
        seen = torch.zeros(len(reqs), vocab_size, dtype=torch.bool)
        for i, r in enumerate(reqs):
            seen[i, r.origin_input_ids + r.output_ids] = True
        self.repetition = torch.where(seen, rep.expand_as(seen), torch.ones(())).to(device)
