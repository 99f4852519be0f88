"""DeepSeek-V2 and DeepSeek-V3 (MLA + DeepSeekMoE) against transformers on tiny random checkpoints that
transformers wrote (python/sglang/test/tiny_deepseek.py: V2 with q_lora_rank null and greedy top-k; V3 with
q_lora_rank, n_group/topk_group, a non-zero correction bias, routed_scaling_factor 2.5 and YaRN), fp32 on the CPU:

- greedy tokens identical and logprobs within the usual tolerance, through the in-process scheduler, with the
  latent KV pool (one row of kv_lora_rank + qk_rope_head_dim per token and layer);
- chunked prefill and radix-cache hits (extends over a cached prefix) give the same tokens;
- the latent's norm and store in rotary (attention skipping its store), the GPU's MoE-layer kernels
  (the router's logits, the shared down_proj's sum kernel adding the routed output, one token's shared experts as
  slots of the routed experts' GEMMs), the triton backend's latent
  decode kernel and both extend forms (interpreter), KT hybrid experts (BF16 on the CPU kernels, the
  full-GPU prefill slot over 16 tokens);
- sglang.Engine with --tp-size 2 (heads and experts split over two gloo ranks) and `launch_server` too.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")

import random

import pytest
import requests
import torch

from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler
from sglang.test.test_utils import kill_process_tree, popen_launch_server
from sglang.test.tiny_deepseek import make_tiny_deepseek

NEW_TOKENS = 12
TOL = 2e-3  # test/registered/scheduler/test_logprobs.py's


_BUILT: dict = {}


def _build(version: str, tmp_path_factory):
    """(version, checkpoint dir, transformers model, prompts, greedy reference), built once per module."""
    if version not in _BUILT:
        d, hf = make_tiny_deepseek(version, str(tmp_path_factory.mktemp(f"tiny_deepseek_{version}")), seed=3)
        rng = random.Random(len(version))
        prompts = [[rng.randrange(3, hf.config.vocab_size) for _ in range(n)] for n in (1, 6, 19, 41)]
        _BUILT[version] = (version, d, hf, prompts, hf_greedy(hf, prompts, NEW_TOKENS))
    return _BUILT[version]


@pytest.fixture(scope="module", params=["v2", "v3"])
def tiny(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


@torch.no_grad()
def _hf_logprobs(hf, prompt, tokens):
    x = torch.tensor([prompt + tokens])
    logp = torch.log_softmax(hf(x).logits[0].float(), -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1)
    return logp[pos, torch.tensor(tokens)]


def test_greedy_and_logprobs_match_transformers(tiny):
    version, d, hf, prompts, ref = tiny
    sched = make_scheduler(model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, log_level="warning")
    mr = sched.model_runner
    assert type(mr.model).__name__ == hf.config.architectures[0]
    pool = mr.token_to_kv_pool
    assert isinstance(pool, MLATokenToKVPool)
    cfg = hf.config
    row = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    assert [tuple(b.shape) for b in pool.buffers()] == [(2048 + 1, 1, row)] * cfg.num_hidden_layers
    assert mr.kv_geometry.cell_size_bytes == cfg.num_hidden_layers * row * 4  # fp32 KV on the CPU
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS), return_logprob=True)
    for prompt, out, r in zip(prompts, outs, ref):
        assert out.output_ids == r, f"{version} prompt of {len(prompt)} tokens"
        expected = _hf_logprobs(hf, prompt, r)
        assert (torch.tensor(out.logprobs) - expected).abs().max().item() < TOL, version
    # Not degenerate: different prompts, different continuations.
    assert len({tuple(r) for r in ref}) == len(prompts) and all(len(set(r)) > 2 for r in ref)


def test_chunked_prefill_and_cached_prefixes_match(tiny):
    """Extends over a prefix already in the latent cache: a 16-token chunk size splits the long prompts, and a
    second round of the same prompts starts from the radix cache."""
    version, d, _, prompts, ref = tiny
    sched = make_scheduler(
        model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, chunked_prefill_size=16, log_level="warning"
    )
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref
    again = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in again] == ref
    assert again[-1].cached_tokens > 0, "the second round should have reused the cached prefix"


def test_rotary_norms_and_stores_the_latent_rows(tiny, monkeypatch):
    """Rotary norms the latent in place and stores the latent rows itself (models/utils.create_fused_latent_store_arg,
    on the CPU through RotaryEmbedding's torch path, on the GPU in its kernel), attention skips its own store
    (save_kv_cache=False) and the extends read the normed latent: every layer call takes that path, and the tokens
    are transformers', chunked and over cached prefixes too."""
    version, d, hf, prompts, ref = tiny
    sched = make_scheduler(
        model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, chunked_prefill_size=16, log_level="warning"
    )
    pool = sched.model_runner.token_to_kv_pool
    fused = []
    real = pool.fused_store_buffers
    monkeypatch.setattr(pool, "fused_store_buffers", lambda *a: fused.append(real(*a)) or fused[-1])
    outs = run_scheduler(sched, prompts + prompts[2:], greedy_params(NEW_TOKENS))  # the repeats hit the cache
    assert [o.output_ids for o in outs] == ref + ref[2:]
    assert fused and all(buffers is not None for buffers in fused)


def test_moe_layer_gpu_kernels_in_the_interpreter_give_the_same_tokens(tmp_path_factory, monkeypatch):
    """The GPU's MoE-layer kernels, here in the triton interpreter on CPU tensors: the router's logits kernel
    (layers/moe/router_gemm.py) and the shared experts' down_proj through the skinny GEMM with a split-K plan, whose
    sum kernel adds the routed output, the residual and the next layer's norm (addend): transformers' tokens."""
    import os

    from sglang.srt.layers import decode_gemm
    from sglang.srt.layers.moe import router_gemm
    from sglang.srt.models import deepseek_v2

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton kernels on CPU tensors need TRITON_INTERPRET=1")
    _, d, _, prompts, ref = _build("v2", tmp_path_factory)
    monkeypatch.setattr(deepseek_v2, "router_logits", router_gemm.router_logits_triton)
    sched = make_scheduler(model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, log_level="warning")
    model = sched.model_runner.model
    split_k = decode_gemm.GemmPlan(((64, decode_gemm.GemmConfig(16, 16, 16, 4, 1, split_k=2)),))
    downs = [layer.mlp.shared_experts.down_proj for layer in model.model.layers if hasattr(layer.mlp, "routed")]
    fused = []
    real = decode_gemm.linear_add_rmsnorm

    def counted(x, weight, plan, residual, norm_weight, eps, addend=None):
        out = real(x, weight, plan, residual, norm_weight, eps, addend)
        if addend is not None:  # a shared down_proj's call (o_proj's have none)
            fused.append(out is not None)
        return out

    monkeypatch.setattr("sglang.srt.layers.linear.linear_add_rmsnorm", counted)
    for down in downs:
        down.gemm_plan = split_k
        down.weight.data = down.weight.data.contiguous()  # the CPU stores weights column-major; the kernel reads rows
    picked = [1, 2]
    outs = run_scheduler(sched, [prompts[i] for i in picked], greedy_params(4))
    assert [o.output_ids for o in outs] == [ref[i][:4] for i in picked]
    assert downs and fused and all(fused)  # every shared down_proj call took the sum kernel with the addend


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_one_token_shared_slots_in_the_interpreter_give_the_same_tokens(version, tmp_path_factory, monkeypatch):
    """One token's shared experts as the last slots of the routed experts' triton GEMMs, reading the shared MLP's own
    weights (one_token_shared_slots; on the GPU every batch-1 step), here in the interpreter on CPU tensors: V2's two
    shared experts, V3's one beside a routed_scaling_factor of 2.5 that must not scale it. Every one-token step takes
    them (the 1-token prompt's prefill too), and the tokens are transformers'."""
    import os

    from sglang.srt.layers import kernel_dispatch
    from sglang.srt.layers.moe import fused_moe_triton

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton kernels on CPU tensors need TRITON_INTERPRET=1")
    _, d, hf, prompts, ref = _build(version, tmp_path_factory)
    monkeypatch.setattr(kernel_dispatch, "runs_moe_kernel", lambda x: True)  # the experts' kernel, as on the GPU
    calls = []
    real = fused_moe_triton.fused_experts_triton

    def counted(x, w13, w2, topk_weights, topk_ids, configs=None, shared=None):
        calls.append((x.shape[0], shared is not None))
        return real(x, w13, w2, topk_weights, topk_ids, configs, shared)

    monkeypatch.setattr(fused_moe_triton, "fused_experts_triton", counted)
    sched = make_scheduler(
        model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, log_level="warning", reuse_model=False
    )
    moe = [layer.mlp for layer in sched.model_runner.model.model.layers if hasattr(layer.mlp, "routed")]
    assert moe and all(m.shared_slots.count == hf.config.n_shared_experts for m in moe)
    for m in moe:  # the GPU's row-major layout (the CPU stores linear weights column-major for its GEMM)
        for linear in (m.shared_experts.gate_up_proj, m.shared_experts.down_proj):
            linear.weight.data = linear.weight.data.contiguous()
    for i in (0, 2):  # one request at a time: every decode step one token
        out = run_scheduler(sched, [prompts[i]], greedy_params(6))[0]
        assert out.output_ids == ref[i][:6], f"{version} prompt of {len(prompts[i])} tokens"
    assert calls and all(with_shared == (tokens == 1) for tokens, with_shared in calls)
    assert sum(with_shared for _, with_shared in calls) >= 2 * 5 * len(moe)


def test_fp8_latent_cache(tmp_path_factory):
    """--kv-cache-dtype fp8_e4m3 for MLA: one byte per latent value (half the fp16/bf16 cell), and the model
    stays close to transformers' fp32 (3 mantissa bits: first-token logprobs within 0.1)."""
    _, d, hf, prompts, ref = _build("v3", tmp_path_factory)
    sched = make_scheduler(
        model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, kv_cache_dtype="fp8_e4m3", log_level="warning"
    )
    pool, cfg = sched.model_runner.token_to_kv_pool, hf.config
    row = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    assert all(b.dtype == torch.uint8 and b.shape[-1] == row for b in pool.buffers())
    assert pool.get_key_buffer(0).dtype == torch.float8_e4m3fn
    assert sched.model_runner.kv_geometry.cell_size_bytes == cfg.num_hidden_layers * row
    outs = run_scheduler(sched, prompts, greedy_params(2), return_logprob=True)
    for prompt, out in zip(prompts, outs):
        expected = _hf_logprobs(hf, prompt, out.output_ids[:1])[0].item()
        assert abs(out.logprobs[0] - expected) < 0.1
    assert any(
        abs(o.logprobs[0] - _hf_logprobs(hf, p, o.output_ids[:1])[0].item()) > 1e-4 for p, o in zip(prompts, outs)
    )


def test_triton_backend_decodes_through_the_latent_kernel(tmp_path_factory, monkeypatch):
    """The triton backend's forward_mla, here in the interpreter on CPU tensors: decode through the latent kernel
    (triton_ops/mla_decode.py), extends in both forms (layers/attention/mla_triton.py; the threshold lowered to 10:
    the first 16-token batch, the 6-token prompt and the long one's first 10, is absorbed, its next chunks of 16
    and 15 over their cached prefix decompressed): the same tokens. The absorbed forms take the query through W_UK
    from rotary (the backend's mla_query_absorb), the decompressed one does not."""
    import os

    from sglang.srt.layers.attention import mla_triton
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("triton kernels need TRITON_INTERPRET=1 or a GPU")
    _, d, _, prompts, ref = _build("v3", tmp_path_factory)
    sched = make_scheduler(
        model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, chunked_prefill_size=16, log_level="warning"
    )
    mr = sched.model_runner
    mr.attn_backend = TritonAttnBackend(mr)
    monkeypatch.setattr(mla_triton, "ABSORBED_EXTEND_MAX_TOKENS", 10)
    forms = []
    kernel_path = TritonAttnBackend.forward_mla

    def counted(self, q_nope, q_rope, latent, k_rope, w_kv_b, layer, fb, save_kv_cache=True, q_latent=None):
        absorbed = fb.attn_metadata.token_kv_indptr is not None
        form = "decode" if fb.forward_mode.is_decode() else "absorbed" if absorbed else "decompressed"
        # The absorbed forms get the query through W_UK from rotary (mla_query_absorb), the decompressed none.
        forms.append(form if (q_latent is not None) == (form != "decompressed") else f"{form} with q_latent {q_latent}")
        return kernel_path(self, q_nope, q_rope, latent, k_rope, w_kv_b, layer, fb, save_kv_cache, q_latent)

    monkeypatch.setattr(TritonAttnBackend, "forward_mla", counted)
    picked = [1, 3]  # 6 tokens, and 41 in chunks of 16 (extends over a cached prefix)
    outs = run_scheduler(sched, [prompts[i] for i in picked], greedy_params(4))
    assert [o.output_ids for o in outs] == [ref[i][:4] for i in picked]
    layers = mr.model_config.num_hidden_layers
    assert forms.count("decode") >= 3 * layers and forms.count("decompressed") >= 2 * layers
    assert forms.count("absorbed") >= layers
    assert set(forms) == {"decode", "absorbed", "decompressed"}, set(forms)


def test_kt_hybrid_experts_match_transformers(tmp_path_factory):
    """KT on DeepSeekMoE (V3): routed experts split between the model's device and the CPU kernels (BF16), shared
    experts on the device; prompts of >= 16 tokens take the full-GPU prefill path (one shared slot)."""
    _, d, _, prompts, ref = _build("v3", tmp_path_factory)
    sched = make_scheduler(
        reuse_model=False,
        model_path=d,
        skip_tokenizer_init=True,
        max_total_tokens=2048,
        kt_method="BF16",
        kt_num_gpu_experts=3,  # of 8: both expert homes in every layer
        kt_gpu_prefill_token_threshold=16,
        log_level="warning",
    )
    model = sched.model_runner.model
    assert (
        model.kt_prefill_slot().nbytes > 0
        and sched.model_runner.memory_plan.reservations_bytes["kt_full_gpu_prefill_slot"] > 0
    )
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref
    moe_layers = model.config.num_hidden_layers - model.config.first_k_dense_replace
    assert len(model.kt_state.cpu_engine.layers) == moe_layers and model.kt_state.cpu_engine.stats().pairs > 0


def test_engine_tp2_matches_transformers(tmp_path_factory):
    """sglang.Engine (V3), two tensor-parallel ranks over gloo: each holds half the heads and of every expert."""
    import sglang

    _, d, _, prompts, ref = _build("v3", tmp_path_factory)
    engine = sglang.Engine(
        model_path=d, tp_size=2, device="cpu", skip_tokenizer_init=True, max_total_tokens=2048, log_level="warning"
    )
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=greedy_params(NEW_TOKENS))
    finally:
        engine.shutdown()
    assert [o["output_ids"] for o in outs] == ref


def test_launch_server_matches_transformers(tmp_path_factory):
    """python -m sglang.launch_server (V2), /generate with input ids."""
    _, d, _, prompts, ref = _build("v2", tmp_path_factory)
    proc = popen_launch_server(["--model-path", d, "--skip-tokenizer-init", "--max-total-tokens", "2048"])
    try:
        for prompt, r in zip(prompts, ref):
            resp = requests.post(
                proc.base_url + "/generate",
                json={"input_ids": prompt, "sampling_params": greedy_params(NEW_TOKENS)},
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["output_ids"] == r
    finally:
        kill_process_tree(proc.pid)
