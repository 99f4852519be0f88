"""The triton attention backend with attention logit soft-capping (Gemma 2's attn_logit_softcapping), alone and
with a sliding window, against the torch-native backend (the CPU path, itself checked against transformers in
test_softcap_torch_attention.py) on the same pool and layer: extend over cached prefixes, eager decode, and decode
captured in a CUDA graph and replayed with other lengths and slots (the graph keeps the cap and the window).
CUDA: a bf16 pool and bf16 kernels, Gemma's 256-wide heads, contexts of thousands of tokens (many key blocks,
split-KV decode), against the torch-native backend reading the same bf16 pool in fp32 (its own bf16 score rounding
would be larger than the kernels' error at these logit sizes). CPU: the triton interpreter on small fp32 shapes
(the CUDA-graph case needs a GPU)."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")
register_cuda_ci(est_time=30, suite="per-commit-cuda")

from types import SimpleNamespace

import pytest
import torch
from transformers import Gemma2Config

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, triton_test_devices

HQ, HKV = 8, 2
CAP = 5.0
# (cap, window): capped full attention, capped sliding window, and the window alone as a control.
LAYERS = [(CAP, -1), (CAP, 40), (0.0, 40)]


def shapes(device: str) -> dict:
    if device == "cuda":
        return dict(dtype=torch.bfloat16, tol=3e-2, d=256, prefix=[0, 700, 1500], ext=[300, 1, 257], decode=3000)
    return dict(dtype=torch.float32, tol=1e-4, d=32, prefix=[0, 45, 70], ext=[50, 1, 9], decode=130)


class Env:
    """One layer's pool, request table, both backends, and a batch builder (the fields the backends read)."""

    def __init__(self, device: str, d: int, dtype: torch.dtype, slots: int, max_len: int) -> None:
        config = Gemma2Config(
            num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=d, hidden_size=HQ * d, num_hidden_layers=1
        )
        model_config = ModelConfig.from_hf_config(config, dtype="float32" if dtype == torch.float32 else "bfloat16")
        self.device, self.d, self.dtype = device, d, dtype
        self.pool = MHATokenToKVPool(slots, 1, dtype, HKV, d, d, 1, device)
        self.rows = ReqToTokenPool(4, max_len, device)
        runner = SimpleNamespace(
            model_config=model_config,
            device=device,
            tp_size=1,
            tp_rank=0,
            req_to_token_pool=self.rows,
            token_to_kv_pool=self.pool,
        )
        self.native = TorchNativeAttnBackend(runner)
        self.triton = TritonAttnBackend(runner)

    def batch(self, backend, mode, seq_lens, out_loc, prefix=None, ext=None):
        dev = self.device
        fb = SimpleNamespace(
            forward_mode=mode,
            batch_size=len(seq_lens),
            req_pool_indices=torch.arange(len(seq_lens), device=dev),
            seq_lens=torch.tensor(seq_lens, device=dev),
            seq_lens_cpu=list(seq_lens),
            seq_lens_sum=sum(seq_lens),
            out_cache_loc=out_loc,
            req_to_token_pool=self.rows,
            token_to_kv_pool=self.pool,
            attn_backend=backend,
            extend_prefix_lens=None if prefix is None else torch.tensor(prefix, device=dev, dtype=torch.int32),
            extend_prefix_lens_cpu=prefix,
            extend_seq_lens=None if ext is None else torch.tensor(ext, device=dev, dtype=torch.int32),
            extend_seq_lens_cpu=ext,
        )
        backend.init_forward_metadata(fb)
        return fb

    def random(self, *shape, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape)).to(self.device, self.dtype)


def fp32(*tensors: torch.Tensor):
    """The torch-native reference's inputs: the same values in fp32 (it reads the pool in its query's dtype)."""
    return tuple(t.float() for t in tensors)


def layer(d: int, cap: float, window: int) -> RadixAttention:
    # query_pre_attn_scalar 256, Gemma 2's; queries and keys are drawn large enough for the cap to bite.
    return RadixAttention(HQ, d, 256**-0.5, HKV, layer_id=0, logit_cap=cap, sliding_window_size=window)


@pytest.mark.parametrize("device", triton_test_devices())
@pytest.mark.parametrize("cap,window", LAYERS)
def test_extend_then_decode_match_torch_native(device, cap, window):
    s = shapes(device)
    torch.manual_seed(0)
    prefix, ext, d = s["prefix"], s["ext"], s["d"]
    lens = [p + e for p, e in zip(prefix, ext)]
    env = Env(device, d, s["dtype"], slots=sum(lens) + 64, max_len=max(lens) + 8)
    perm = torch.randperm(sum(lens) + 3, device=device) + 1  # scattered, distinct slots (+1 decode slot each)
    slots, start = [], 0
    for i, n in enumerate(lens):
        slots.append(perm[start : start + n + 1])
        start += n + 1
        env.rows.req_to_token[i, : n + 1] = slots[i].to(torch.int32)
    lyr = layer(d, cap, window)
    # The cached prefixes, written once.
    for i, p in enumerate(prefix):
        if p:
            env.pool.set_kv_buffer(0, slots[i][:p], env.random(p, HKV, d, scale=4.0), env.random(p, HKV, d))
    n = sum(ext)
    q, k, v = env.random(n, HQ * d, scale=4.0), env.random(n, HKV * d, scale=4.0), env.random(n, HKV * d)
    out_loc = torch.cat([slots[i][p : p + e] for i, (p, e) in enumerate(zip(prefix, ext))])
    outs = [
        be.forward(*qkv, lyr, env.batch(be, ForwardMode.EXTEND, lens, out_loc, prefix, ext))
        for be, qkv in ((env.native, fp32(q, k, v)), (env.triton, (q, k, v)))
    ]
    torch.testing.assert_close(outs[1].float(), outs[0], atol=s["tol"], rtol=s["tol"])

    dq, dk, dv = env.random(3, HQ * d, scale=4.0), env.random(3, HKV * d, scale=4.0), env.random(3, HKV * d)
    dec_loc = torch.stack([sl[-1] for sl in slots])
    dec_lens = [x + 1 for x in lens]
    outs = [
        be.forward(*qkv, lyr, env.batch(be, ForwardMode.DECODE, dec_lens, dec_loc))
        for be, qkv in ((env.native, fp32(dq, dk, dv)), (env.triton, (dq, dk, dv)))
    ]
    assert torch.isfinite(outs[1].float()).all()
    torch.testing.assert_close(outs[1].float(), outs[0], atol=s["tol"], rtol=s["tol"])
    if cap > 0:  # the cap changes the answer at these logit sizes, so the comparison sees it
        plain = layer(d, 0.0, window)
        fb = env.batch(env.native, ForwardMode.DECODE, dec_lens, dec_loc)
        uncapped = env.native.forward(*fp32(dq, dk, dv), plain, fb, save_kv_cache=False)
        assert not torch.allclose(uncapped, outs[0], atol=10 * s["tol"], rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=REQUIRES_GPU_REASON)
@pytest.mark.parametrize("cap,window", LAYERS)
def test_decode_cuda_graph_keeps_cap_and_window(cap, window):
    """Capture decode once (graph metadata from the backend's own hooks), then replay with other lengths and slots:
    each replay equals the torch-native decode of that batch."""
    s, device, bs = shapes("cuda"), "cuda", 4
    d = s["d"]
    torch.manual_seed(1)
    max_len = 4100
    env = Env(device, d, s["dtype"], slots=bs * max_len + 8, max_len=max_len)
    lyr = layer(d, cap, window)
    env.pool.set_kv_buffer(
        0,
        torch.arange(1, bs * max_len + 1, device=device),
        env.random(bs * max_len, HKV, d, scale=4.0),
        env.random(bs * max_len, HKV, d),
    )
    env.triton.init_cuda_graph_state(bs)
    req_pool_indices = torch.arange(bs, device=device)
    seq_lens = torch.ones(bs, dtype=torch.int64, device=device)
    q, k, v = env.random(bs, HQ * d, scale=4.0), env.random(bs, HKV * d, scale=4.0), env.random(bs, HKV * d)
    out_loc = torch.zeros(bs, dtype=torch.int64, device=device)

    def captured_batch():
        fb = SimpleNamespace(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            out_cache_loc=out_loc,
            token_to_kv_pool=env.pool,
            attn_backend=env.triton,
        )
        fb.attn_metadata = env.triton.init_forward_metadata_capture_cuda_graph(bs, req_pool_indices, seq_lens)
        return fb

    fb = captured_batch()
    env.triton.forward(q, k, v, lyr, fb, save_kv_cache=False)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = env.triton.forward(q, k, v, lyr, fb, save_kv_cache=False)
    for lens in ([1, 39, 41, 4000], [3000, 2, 700, 128]):
        perm = torch.randperm(bs * max_len, device=device)[: sum(lens)] + 1
        start = 0
        for i, n in enumerate(lens):
            env.rows.req_to_token[i, :n] = perm[start : start + n].to(torch.int32)
            start += n
        seq_lens.copy_(torch.tensor(lens))
        env.triton.init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, sum(lens))
        graph.replay()
        torch.cuda.synchronize()
        fb = env.batch(env.native, ForwardMode.DECODE, lens, out_loc)
        ref = env.native.forward(*fp32(q, k, v), lyr, fb, save_kv_cache=False)
        torch.testing.assert_close(out.float(), ref, atol=s["tol"], rtol=s["tol"])
