"""Helpers for GPU tests and benchmarks: model-shape configs, random HF checkpoints, in-process runners."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Optional

import torch

REQUIRES_GPU_REASON = "needs a CUDA GPU (run on the GPU machine)"


INTERPRETER_REASON = "CPU cases need TRITON_INTERPRET=1 (conftest sets it without a GPU)"


def triton_test_devices() -> list:
    """pytest params for triton kernel tests: "cpu" through the triton interpreter, "cuda" on a GPU;
    each skips with a visible reason where it cannot run."""
    import pytest

    return [
        pytest.param(
            "cpu", marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason=INTERPRETER_REASON)
        ),
        pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)),
    ]


def triton_has_gpu_tools(*tools: str) -> bool:
    """Whether this triton build ships the named CUDA tools (``"ptxas"``, ``"nvdisasm"``): code can be compiled for
    sm_90 (and disassembled) on a machine without a GPU."""
    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return all(os.path.exists(os.path.join(bin_dir, tool)) for tool in tools)


def has_gpu() -> bool:
    return torch.cuda.is_available()


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def shape_config_dir(name: str, root: Optional[str] = None, **overrides) -> str:
    """A directory with config.json for one of scripts/make_model_configs.py's shapes."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "..", "scripts", "make_model_configs.py")
    spec = importlib.util.spec_from_file_location("make_model_configs", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = {**module.SHAPES[name], **overrides}
    root = root or tempfile.mkdtemp(prefix="sglang-shapes-")
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return path


def save_random_hf_model(config_dir: str, out_dir: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> str:
    """transformers' own random init of the config, saved as safetensors (the reference's exact weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(seed)
    with torch.device("cuda" if has_gpu() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out_dir)
    del model
    return out_dir


def random_decode_batch(mr, bs: int, ctx: int):
    """A decode ForwardBatch of `bs` requests with `ctx` tokens of random KV each (rows and slots taken from
    the runner's pools: return them with `req_to_token_pool.free` / `token_to_kv_pool_allocator.free`)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    rows = mr.req_to_token_pool.alloc(bs)
    slots = mr.token_to_kv_pool_allocator.alloc(bs * ctx).view(bs, ctx)
    for r, s in zip(rows, slots):
        mr.req_to_token_pool.req_to_token[r, :ctx] = s.to(torch.int32).cuda()
    # Fill the KV of the context with random values so attention has something to read.
    for layer in range(mr.model_config.num_hidden_layers):
        k = mr.token_to_kv_pool.get_key_buffer(layer)
        k[slots.flatten().cuda()] = torch.randn_like(k[slots.flatten().cuda()])
        v = mr.token_to_kv_pool.get_value_buffer(layer)
        v[slots.flatten().cuda()] = torch.randn_like(v[slots.flatten().cuda()])
    batch = ModelWorkerBatch(
        ForwardMode.DECODE,
        input_ids=list(range(100, 100 + bs)),
        req_pool_indices=rows,
        seq_lens=[ctx] * bs,
        out_cache_loc=slots[:, -1].contiguous(),
    )
    return ForwardBatch.init_new(batch, mr), rows, slots


def extend_batch(mr, prompts: list):
    """A prefill ForwardBatch of new prompts (token-id lists, no cached prefix) on the runner's pools, and a
    function that frees their request rows and KV slots."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    lengths = [len(p) for p in prompts]
    rows = mr.req_to_token_pool.alloc(len(prompts))
    slots = mr.token_to_kv_pool_allocator.alloc(sum(lengths))
    device_slots = slots.to(torch.int32).to(mr.device)
    offset = 0
    for row, n in zip(rows, lengths):
        mr.req_to_token_pool.req_to_token[row, :n] = device_slots[offset : offset + n]
        offset += n
    worker_batch = ModelWorkerBatch(
        ForwardMode.EXTEND,
        input_ids=[t for p in prompts for t in p],
        req_pool_indices=rows,
        seq_lens=lengths,
        out_cache_loc=slots,
        extend_seq_lens=lengths,
        extend_prefix_lens=[0] * len(prompts),
    )

    def release() -> None:
        for row in rows:
            mr.req_to_token_pool.free(row)
        mr.token_to_kv_pool_allocator.free(slots)

    return ForwardBatch.init_new(worker_batch, mr), release


def decode_logits_three_ways(mr, bs: int, ctx: int = 37, capture=None):
    """One random decode batch's logits (fp32) as CUDA-graph replay, eager, and eager with every linear layer on
    its untuned GEMM (the plan ``CUBLAS_ONLY``: cuBLAS, or ``torch._scaled_mm`` for fp8 weights; gate_up's
    SiLU-and-mul then a kernel of its own); the runner's graphs, plans and pool slots are restored. ``capture``:
    a module whose eager outputs are collected (one per eager forward, the graph replay runs no hooks);
    returned as the fourth item."""
    from sglang.srt.layers.decode_gemm import CUBLAS_ONLY
    from sglang.srt.layers.linear import LinearBase, MergedColumnParallelLinear

    fb, rows, slots = random_decode_batch(mr, bs, ctx)
    linears = [m for m in mr.model.modules() if isinstance(m, LinearBase)]
    gate_ups = [m for m in linears if isinstance(m, MergedColumnParallelLinear)]
    plans = [m.gemm_plan for m in linears]
    silu_plans = [m.silu_plan for m in gate_ups]
    graphs = mr.cuda_graph_runner
    captured = []
    hook = None
    if capture is not None:
        hook = capture.register_forward_hook(lambda module, args, out: captured.append(out.float().clone()))
    try:
        graph_logits = mr.forward(fb).next_token_logits.float().clone()
        mr.cuda_graph_runner = None
        eager_logits = mr.forward(fb).next_token_logits.float().clone()  # the same kernels, launched one by one
        for m in linears:
            m.gemm_plan = CUBLAS_ONLY
        for m in gate_ups:
            m.silu_plan = CUBLAS_ONLY
        untuned_logits = mr.forward(fb).next_token_logits.float()
    finally:
        if hook is not None:
            hook.remove()
        mr.cuda_graph_runner = graphs
        for m, plan in zip(linears, plans):
            m.gemm_plan = plan
        for m, plan in zip(gate_ups, silu_plans):
            m.silu_plan = plan
        for r in rows:
            mr.req_to_token_pool.free(r)
        mr.token_to_kv_pool_allocator.free(slots.flatten())
    return graph_logits, eager_logits, untuned_logits, captured
