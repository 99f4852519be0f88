"""The post-capture path's activation probe: run the worst-case eager forwards and measure their peak.

A full chunked prefill spread over as many requests as allowed (logits + sampling of each), and a decode
step at max_running_requests (eager above the captured batch size) with top-p sampling and logprobs. All
KV writes go to the dummy slot, so nothing but slot 0 needs to be backed. The peak (less what the model
reserves apart, e.g. a KT prefill slot a probe prefill built) is the headroom the planner keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner


def _worst_case_batches(max_reqs: int, chunk: int) -> list[ModelWorkerBatch]:
    n_prefill = max(1, min(max_reqs, chunk))
    ext = [chunk // n_prefill + (1 if i < chunk % n_prefill else 0) for i in range(n_prefill)]
    return [
        ModelWorkerBatch(
            ForwardMode.EXTEND,
            [1] * chunk,
            [0] * n_prefill,
            ext,
            torch.zeros(chunk, dtype=torch.int64),
            extend_seq_lens=ext,
            extend_prefix_lens=[0] * n_prefill,
        ),
        ModelWorkerBatch(
            ForwardMode.DECODE,
            [1] * max_reqs,
            [0] * max_reqs,
            [1] * max_reqs,
            torch.zeros(max_reqs, dtype=torch.int64),
        ),
    ]


def _top_p_sampling(bs: int, vocab_size: int, device: str) -> SamplingBatchInfo:
    return SamplingBatchInfo(
        temperatures=torch.ones(bs, 1, device=device),
        top_ps=torch.full((bs,), 0.9, device=device),
        top_ks=torch.full((bs,), vocab_size, device=device, dtype=torch.int64),
        min_ps=torch.zeros(bs, device=device),
        seeds=torch.zeros(bs, dtype=torch.int64, device=device),
        steps=torch.zeros(bs, dtype=torch.int64, device=device),
        is_all_greedy=False,
        greedy_mask=torch.zeros(bs, dtype=torch.bool, device=device),
        need_top_p_top_k=True,
        need_min_p=False,
    )


def measure_activation_peak_bytes(runner: "ModelRunner") -> int:
    """Peak device memory (bytes) the worst-case eager work takes on `runner` (CUDA)."""
    probes = _worst_case_batches(runner.req_to_token_pool.size, runner.config.args.chunked_prefill_size)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    for batch in probes:
        batch.sampling_info = _top_p_sampling(len(batch.seq_lens), runner.model_config.vocab_size, runner.device)
        batch.return_logprob = True  # the worst case computes logprobs too
        fb = ForwardBatch.init_new(batch, runner)
        runner.sample(runner.forward(fb), fb)
        del fb
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_reserved() - base
    # A prefill probe may have built the KT prefill slot (over --kt-gpu-prefill-token-threshold): reserved
    # apart, not activations. Freed here; the first real long prompt builds it again.
    slot = runner.kt_prefill_slot
    if slot is not None:
        peak -= slot.release()
    torch.cuda.empty_cache()
    return max(peak, 0)
