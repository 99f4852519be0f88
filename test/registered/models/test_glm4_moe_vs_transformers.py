"""GLM-4.5 (Glm4MoeForCausalLM) against transformers on tiny random checkpoints that transformers wrote
(python/sglang/test/tiny_moe_families.py's glm4_moe: partial rotary 0.5, n_group 4 / topk_group 2 with a non-zero
correction bias, routed_scaling_factor 2.5, a shared expert, a leading dense layer), fp32 on the CPU, greedy tokens
identical for prompts of 1, 7 and 23 tokens:

- qk-norm and attention bias on, through sglang.Engine with --tp-size 2;
- qk-norm and attention bias off, two shared experts, two leading dense layers, n_group 2 / topk_group 1, and a
  multi-token-prediction layer in the checkpoint (num_nextn_predict_layers 1), skipped at load with its log line;
- KT hybrid experts (BF16 on the CPU kernels, 3 of 8 experts on the model's device, the full-GPU prefill slot from
  16 tokens), the shared expert on the model's device;
- the GPU's elementwise kernels in the triton interpreter on CPU tensors (the RMSNorms, SiLU-and-mul, and rotary with
  the per-head q/k norm and partial rotary in one kernel), through the scheduler.
"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

import logging
import os
import random

import torch

from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler
from sglang.test.tiny_moe_families import make_tiny_family

NEW_TOKENS = 10
SEED, INIT_STD = 1, 0.15  # peaked enough that every prompt's continuation varies (checked below)
VARIANTS = {
    "qk_norm": dict(use_qk_norm=True, attention_bias=True),
    "plain_mtp": dict(
        use_qk_norm=False,
        attention_bias=False,
        n_shared_experts=2,
        first_k_dense_replace=2,
        num_hidden_layers=4,
        n_group=2,
        topk_group=1,
        num_nextn_predict_layers=1,
    ),
}
_BUILT: dict = {}


def _append_mtp_layer(checkpoint_dir: str, num_layers: int) -> int:
    """Add a NextN layer at index num_layers as GLM's checkpoints carry it (a decoder layer's tensors plus
    eh_proj / enorm / hnorm / shared_head.norm); a loader that did not skip it would fail on these names.
    Returns how many tensors were added."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(checkpoint_dir, "model.safetensors")
    tensors = load_file(path)
    last = f"model.layers.{num_layers - 1}."
    mtp = {name.replace(last, f"model.layers.{num_layers}."): t.clone() for name, t in tensors.items() if last in name}
    hidden = tensors["model.norm.weight"].shape[0]
    prefix = f"model.layers.{num_layers}."
    mtp[prefix + "eh_proj.weight"] = torch.randn(hidden, 2 * hidden)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        mtp[prefix + norm + ".weight"] = torch.ones(hidden)
    save_file({**tensors, **mtp}, path, metadata={"format": "pt"})
    return len(mtp)


def _build(variant: str, tmp_path_factory):
    """(checkpoint dir, transformers model, prompts, greedy reference, MTP tensors added), once per module."""
    if variant not in _BUILT:
        d = str(tmp_path_factory.mktemp(f"tiny_glm4_moe_{variant}"))
        d, hf = make_tiny_family("glm4_moe", d, seed=SEED, init_std=INIT_STD, **VARIANTS[variant])
        added = _append_mtp_layer(d, hf.config.num_hidden_layers) if hf.config.num_nextn_predict_layers else 0
        rng = random.Random(variant)
        prompts = [[rng.randrange(3, hf.config.vocab_size) for _ in range(n)] for n in (1, 7, 23)]
        ref = hf_greedy(hf, prompts, NEW_TOKENS)
        # Not degenerate: different prompts, different continuations, each of several tokens.
        assert len({tuple(r) for r in ref}) == len(prompts) and all(len(set(r)) > 3 for r in ref)
        _BUILT[variant] = (d, hf, prompts, ref, added)
    return _BUILT[variant]


def test_engine_tp2_matches_transformers_with_qk_norm(tmp_path_factory):
    from sglang.test.runners import engine_greedy_tokens

    d, hf, prompts, ref, _ = _build("qk_norm", tmp_path_factory)
    assert hf.config.use_qk_norm and hf.config.attention_bias and hf.config.n_group > 1
    # Two tensor-parallel ranks over gloo: each holds 2 of the 4 query heads, 1 of the 2 KV heads, half of every
    # expert's and the shared expert's intermediate dimension; the router and the norms whole.
    assert engine_greedy_tokens(d, prompts, NEW_TOKENS, tp_size=2) == ref


def test_without_qk_norm_and_with_an_mtp_layer(tmp_path_factory, caplog):
    d, hf, prompts, ref, added = _build("plain_mtp", tmp_path_factory)
    assert not hf.config.use_qk_norm and added > 0
    with caplog.at_level(logging.INFO, logger="sglang.srt.models.deepseek_v2"):
        sched = make_scheduler(model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, log_level="warning")
    model = sched.model_runner.model
    assert type(model).__name__ == "Glm4MoeForCausalLM"
    skipped = [r.getMessage() for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert skipped == [
        f"Skipped the multi-token-prediction layer(s) from index 4 (num_nextn_predict_layers=1): {added} "
        "checkpoint tensors, not part of the forward"
    ]
    # Two dense layers, then MoE layers with two shared experts' width on the model's device.
    assert [type(layer.mlp).__name__ for layer in model.model.layers] == ["LlamaMLP"] * 2 + ["DeepseekV2MoE"] * 2
    assert model.model.layers[2].mlp.shared_experts.down_proj.weight.shape[1] == 2 * hf.config.moe_intermediate_size
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


def test_kt_hybrid_experts_match_transformers(tmp_path_factory):
    d, hf, prompts, ref, _ = _build("qk_norm", tmp_path_factory)
    sched = make_scheduler(
        reuse_model=False,
        model_path=d,
        skip_tokenizer_init=True,
        max_total_tokens=1024,
        kt_method="BF16",
        kt_num_gpu_experts=3,  # of 8: both expert homes in every MoE layer
        kt_gpu_prefill_token_threshold=16,  # the 23-token prompt takes the full-GPU prefill path
        log_level="warning",
    )
    model = sched.model_runner.model
    slot = model.kt_prefill_slot()
    assert slot.nbytes > 0 and sched.model_runner.memory_plan.reservations_bytes["kt_full_gpu_prefill_slot"] > 0
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref
    moe_layers = hf.config.num_hidden_layers - hf.config.first_k_dense_replace
    engine = model.kt_state.cpu_engine
    assert len(engine.layers) == moe_layers and engine.stats().pairs > 0
    assert slot.loaded_layer_id is not None  # the long prompt streamed its layers through the slot


def test_rotary_kernel_with_the_qk_norm_in_the_interpreter_gives_the_same_tokens(tmp_path_factory, monkeypatch):
    """The GPU's elementwise kernels (kernel_dispatch.runs_kernel), here in the triton interpreter on CPU tensors:
    the RMSNorms and SiLU-and-mul, and rotary with each head of q and k RMS-normed, then its first half rotated
    (partial rotary 0.5), the unrotated half normed in place: transformers' tokens, and every layer's rotary call took
    the kernel with the norm."""
    import pytest

    from sglang.srt.layers import fused_elementwise, kernel_dispatch

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton kernels on CPU tensors need TRITON_INTERPRET=1")
    d, hf, prompts, ref, _ = _build("qk_norm", tmp_path_factory)
    monkeypatch.setattr(kernel_dispatch, "runs_kernel", lambda t: True)
    calls = []
    real = fused_elementwise.apply_rotary_inplace

    def counted(*args, **kwargs):
        calls.append(kwargs.get("qk_norm") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_elementwise, "apply_rotary_inplace", counted)
    sched = make_scheduler(model_path=d, skip_tokenizer_init=True, max_total_tokens=2048, log_level="warning")
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
    assert calls and all(calls)
