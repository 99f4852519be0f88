"""Logits for the last token of each request only (a prefill of 8k tokens needs one row, not 8k), plus
the prompt positions a request asked logprobs for (SGLang's `logprob_start_len`), scored here because
only this forward has their hidden states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from sglang.srt.distributed import tensor_model_parallel_all_gather
from sglang.srt.sampling.logprobs import InputLogprobs, input_logprobs


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [bs, vocab] in the model dtype; the sampler promotes row chunks
    input_logprobs: Optional[InputLogprobs] = None  # prefill rows of requests that asked for prompt logprobs


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int, final_logit_softcapping: Optional[float] = None) -> None:
        """`final_logit_softcapping` (Gemma 2/3): logits become cap * tanh(logits / cap) before anything reads
        them, so sampling and every logprob (prompt and output) see the capped values, as transformers returns."""
        super().__init__()
        self.vocab_size = vocab_size
        self.final_logit_softcapping = final_logit_softcapping

    def _project(self, hidden_states: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        # Same dtype as the reference's lm_head matmul. Kept in that dtype: an fp32 copy of [bs, vocab]
        # would be GBs at large decode batches; the sampler converts a chunk of rows at a time.
        logits = torch.matmul(hidden_states, lm_head.weight.t())
        logits = tensor_model_parallel_all_gather(logits)[:, : self.vocab_size]
        cap = self.final_logit_softcapping
        if cap:  # in place on this fresh tensor, in transformers' order: divide, tanh, multiply
            logits.div_(cap).tanh_().mul_(cap)
        return logits

    def forward(self, hidden_states: torch.Tensor, lm_head: nn.Module, forward_batch) -> LogitsProcessorOutput:
        prompt_scores = None
        if forward_batch.forward_mode.is_extend():
            info = forward_batch.sampling_info
            wanted = info.logprob_requests if info is not None else None
            if wanted is not None and wanted.input_rows:
                prompt_scores = input_logprobs(hidden_states, wanted, lambda h: self._project(h, lm_head))
            last = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
            hidden_states = hidden_states[last]
        return LogitsProcessorOutput(self._project(hidden_states, lm_head), prompt_scores)
