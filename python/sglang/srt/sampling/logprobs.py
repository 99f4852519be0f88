"""Logprobs beyond the sampled token's, as SGLang returns them, computed on the device in the forward
that produces the logits (no second pass, no full-vocabulary copy to the host):

- top-k: the `top_logprobs_num` most likely tokens at a position, with their logprobs;
- chosen ids: the logprobs of the `token_ids_logprob` tokens at a position;
- prompt positions (prefill only): the logprob of each prompt token from `logprob_start_len` on,
  given the tokens before it, and the top-k / chosen ids there too.

The batch's wishes travel as host lists in `LogprobRequests` (on SamplingBatchInfo); results come back
as small tensors (`LogprobExtras`) that the scheduler turns into per-request lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch


@dataclass
class LogprobRequests:
    top_nums: List[int]  # per batch row: top_logprobs_num (0 = none)
    token_ids: List[Optional[List[int]]]  # per batch row: token_ids_logprob (None = none)
    # Prefill only: the hidden-state rows whose next-token distribution scores a prompt token, that
    # token, and the batch row each one belongs to (prompt positions of several requests, concatenated).
    input_rows: List[int] = field(default_factory=list)
    input_targets: List[int] = field(default_factory=list)
    input_owner: List[int] = field(default_factory=list)

    def max_top(self, owners: Optional[List[int]] = None) -> int:
        rows = range(len(self.top_nums)) if owners is None else owners
        return max((self.top_nums[r] for r in rows), default=0)

    def ids_matrix(self, owners: List[int], device) -> Optional[torch.Tensor]:
        """[len(owners), M] token ids to gather (rows without a list repeat id 0; the host ignores them)."""
        lists = [self.token_ids[r] or [] for r in owners]
        width = max((len(ids) for ids in lists), default=0)
        if width == 0:
            return None
        padded = [ids + [0] * (width - len(ids)) for ids in lists]
        return torch.tensor(padded, dtype=torch.int64).to(device, non_blocking=True)


@dataclass
class LogprobExtras:
    """Per row: top-k (values, ids) with k = the batch's largest top_logprobs_num, and the chosen ids' logprobs."""

    top_values: Optional[torch.Tensor] = None  # [rows, k] fp32
    top_ids: Optional[torch.Tensor] = None  # [rows, k] int64
    chosen: Optional[torch.Tensor] = None  # [rows, M] fp32, aligned with LogprobRequests.ids_matrix

    @staticmethod
    def cat(parts: List["LogprobExtras"]) -> "LogprobExtras":
        def join(name: str) -> Optional[torch.Tensor]:
            values = [getattr(p, name) for p in parts if getattr(p, name) is not None]
            return torch.cat(values) if values else None

        return LogprobExtras(join("top_values"), join("top_ids"), join("chosen"))


def extras_from_logprobs(logprobs: torch.Tensor, top_k: int, ids: Optional[torch.Tensor]) -> LogprobExtras:
    """From [rows, vocab] log-probabilities: the top-k and the chosen ids' values."""
    out = LogprobExtras()
    if top_k > 0:
        out.top_values, out.top_ids = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
    if ids is not None:
        out.chosen = logprobs.gather(-1, ids)
    return out


@dataclass
class InputLogprobs:
    """Prompt-position results of one prefill, row-aligned with LogprobRequests.input_rows."""

    token_logprobs: torch.Tensor  # [rows] fp32: logprob of each target prompt token
    extras: LogprobExtras


# Prompt rows scored at once: [rows, vocab] fp32 logits cost 4 bytes x vocab per row (600 KB for a
# 150k vocabulary), so a long prompt with logprob_start_len 0 is scored in slices of bounded memory.
INPUT_LOGPROB_CHUNK_ROWS = 512


def input_logprobs(hidden: torch.Tensor, requests: LogprobRequests, project) -> InputLogprobs:
    """Score the prompt rows of a prefill. `project(hidden_rows) -> [rows, vocab]` logits (the lm_head
    and, with tensor parallelism, the all-gather)."""
    device = hidden.device
    rows = torch.tensor(requests.input_rows, dtype=torch.int64).to(device, non_blocking=True)
    targets = torch.tensor(requests.input_targets, dtype=torch.int64).to(device, non_blocking=True)
    top_k = requests.max_top(requests.input_owner)
    ids = requests.ids_matrix(requests.input_owner, device)
    token_parts, extra_parts = [], []
    for start in range(0, len(requests.input_rows), INPUT_LOGPROB_CHUNK_ROWS):
        sl = slice(start, start + INPUT_LOGPROB_CHUNK_ROWS)
        logits = project(hidden[rows[sl]]).float()
        logprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        token_parts.append(logprobs.gather(-1, targets[sl, None]).squeeze(-1))
        extra_parts.append(extras_from_logprobs(logprobs, top_k, None if ids is None else ids[sl]))
    return InputLogprobs(torch.cat(token_parts), LogprobExtras.cat(extra_parts))
