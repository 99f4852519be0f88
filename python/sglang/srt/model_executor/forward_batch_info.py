"""What one forward pass needs: the batch as device tensors, built from the scheduler's plain lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import TYPE_CHECKING, List, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill: new tokens of each request, after an optional cached prefix
    DECODE = auto()  # one new token per request
    IDLE = auto()  # nothing to do on this rank (kept for TP symmetry)

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


@dataclass
class ModelWorkerBatch:
    """The scheduler's view of a batch: host-side lists only, cheap to build and to send to ranks."""

    forward_mode: ForwardMode
    input_ids: Optional[List[int]]  # None in decode: each request row's last sampled token, on the device
    req_pool_indices: List[int]
    seq_lens: List[int]  # total tokens of each request after this forward
    out_cache_loc: torch.Tensor  # int64 slots for the new tokens (CPU)
    extend_seq_lens: Optional[List[int]] = None
    extend_prefix_lens: Optional[List[int]] = None
    sampling_info: Optional["SamplingBatchInfo"] = None
    return_logprob: bool = False
    # A mixed prefill (--enable-mixed-chunk): the last `num_decode` requests are running decodes riding along,
    # one new token each, whose input is their row's last sampled token on the device (input_ids has a
    # placeholder there).
    num_decode: int = 0


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    req_pool_indices: torch.Tensor  # [bs] int64
    seq_lens: torch.Tensor  # [bs] int64
    out_cache_loc: torch.Tensor  # [num_tokens] int64
    seq_lens_cpu: List[int]
    seq_lens_sum: int
    extend_seq_lens: Optional[torch.Tensor] = None  # [bs]
    extend_prefix_lens: Optional[torch.Tensor] = None  # [bs]
    extend_start_loc: Optional[torch.Tensor] = None  # [bs] row of each request's first new token
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    req_to_token_pool: Optional["ReqToTokenPool"] = None
    token_to_kv_pool: Optional["MHATokenToKVPool"] = None
    attn_backend: Optional["AttentionBackend"] = None
    sampling_info: Optional["SamplingBatchInfo"] = None
    return_logprob: bool = False
    # [1] int32 on the device: rows that are real requests. Set by CUDA-graph replays, whose batches are
    # padded to the captured size; the KT CPU experts read it when the step runs and skip the padding.
    num_real_tokens: Optional[torch.Tensor] = None
    # Filled by the attention backend's init_forward_metadata.
    attn_metadata: object = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def init_new(cls, batch: ModelWorkerBatch, model_runner) -> "ForwardBatch":
        device = model_runner.device
        seq_lens_cpu = list(batch.seq_lens)
        as_long = lambda xs: torch.tensor(xs, dtype=torch.int64).to(device, non_blocking=True)  # noqa: E731
        req_pool_indices = as_long(batch.req_pool_indices)
        if batch.input_ids is None:  # a gather on the device: the host need not have seen the last step's tokens
            input_ids = model_runner.last_sampled_tokens[req_pool_indices]
        else:
            input_ids = as_long(batch.input_ids)
            if batch.num_decode:  # the decodes' tokens are each a request's last row of the flat input
                rows = req_pool_indices[-batch.num_decode :]
                input_ids[-batch.num_decode :] = model_runner.last_sampled_tokens[rows]
        fb = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(seq_lens_cpu),
            input_ids=input_ids,
            positions=None,  # set below
            req_pool_indices=req_pool_indices,
            seq_lens=as_long(seq_lens_cpu),
            out_cache_loc=batch.out_cache_loc.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=sum(seq_lens_cpu),
            req_to_token_pool=model_runner.req_to_token_pool,
            token_to_kv_pool=model_runner.token_to_kv_pool,
            attn_backend=model_runner.attn_backend,
            sampling_info=batch.sampling_info,
            return_logprob=batch.return_logprob,
        )
        if batch.forward_mode.is_extend():
            prefix, ext = batch.extend_prefix_lens, batch.extend_seq_lens
            fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = list(ext), list(prefix)
            fb.extend_seq_lens, fb.extend_prefix_lens = as_long(ext), as_long(prefix)
            starts, acc = [], 0
            for n in ext:
                starts.append(acc)
                acc += n
            fb.extend_start_loc = as_long(starts)
            fb.positions = as_long([p for pre, n in zip(prefix, ext) for p in range(pre, pre + n)])
        else:
            fb.positions = (fb.seq_lens - 1).clamp(min=0)
        return fb
