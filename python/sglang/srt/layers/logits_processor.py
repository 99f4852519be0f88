"""Logits for the last token of each request only (a prefill of 8k tokens needs one row, not 8k)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglang.srt.distributed import tensor_model_parallel_all_gather


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [bs, vocab] in the model dtype; the sampler promotes row chunks


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, hidden_states: torch.Tensor, lm_head: nn.Module, forward_batch) -> LogitsProcessorOutput:
        if forward_batch.forward_mode.is_extend():
            last = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
            hidden_states = hidden_states[last]
        # Same dtype as the reference's lm_head matmul. Kept in that dtype: an fp32 copy of [bs, vocab]
        # would be GBs at large decode batches; the sampler converts a chunk of rows at a time.
        logits = torch.matmul(hidden_states, lm_head.weight.t())
        logits = tensor_model_parallel_all_gather(logits)[:, : self.vocab_size]
        return LogitsProcessorOutput(next_token_logits=logits)
