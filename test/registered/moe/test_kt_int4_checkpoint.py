from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")

# Pack-quantized INT4 experts (compressed-tensors W4A16, the format Kimi-K2-Thinking and K2.5 ship their routed experts
# in), tiny transformers-written Qwen3-MoE and DeepSeek-V3 models with their routed experts quantized in groups of 32:
# under KT with an INT4 --kt-method (RAWINT4, KTransformers' name for it; INT4 / AMXINT4 the same here) the CPU
# kernels' and the GPU-side experts hold the checkpoint's own code bytes and group scales (the packed words' bytes are
# this engine's INT4 layout), and greedy tokens equal transformers on the dequantized weights. Without KT the fused
# MoE holds them the same way (the GPU's kernel reads the codes; the CPU dequantizes the experts a step touches);
# with another method they are dequantized, then quantized into it; where the config's ignore list leaves the experts
# in full precision they stay so. The other linears are dequantized at load, as a dense W4A16 model's are. RAWINT4
# on a checkpoint without int4 experts, and an int4 --kt-weight-path, are start-up errors naming the flag.

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import deepseek_v3_full, moe_bf16
from sglang.test.int4_checkpoints import write_int4_experts_checkpoint
from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler

NEW_TOKENS = 12
GROUP = 32


def _prompts(seed: int, vocab: int):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in (3, 19)]


@pytest.fixture(scope="module")
def int4_moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("kt-int4")
    d = write_int4_experts_checkpoint(moe_bf16(str(root / "bf16")), str(root / "int4"), GROUP)
    prompts = _prompts(7, 256)
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not degenerate
    return d, prompts, ref


def _scheduler(d: str, **kw):
    return make_scheduler(reuse_model=False, model_path=d, skip_tokenizer_init=True, max_total_tokens=1024, **kw)


def test_rawint4_holds_the_checkpoints_experts(int4_moe):
    d, prompts, ref = int4_moe
    sched = _scheduler(d, kt_method="RAWINT4", kt_num_gpu_experts=1)
    assert sched.model_runner.config.kt.method == "INT4_G32"  # the checkpoint's groups
    wrapper = sched.model_runner.model.model.layers[1].mlp.experts
    ckpt = load_file(f"{d}/model.safetensors")
    e = "model.layers.1.mlp.experts.2."
    cpu, idx = wrapper.expert_home(2)
    assert cpu is wrapper.cpu_layer and cpu.quant_method.name == "INT4" and cpu.quant_method.group == GROUP
    up = ckpt[e + "up_proj.weight_packed"].view(torch.uint8)
    inter = cpu.w13_weight.shape[1] // 2
    assert torch.equal(cpu.w13_weight[idx, inter:], up)  # the packed words' bytes, as they are
    assert torch.equal(cpu.w2_weight_scale[idx], ckpt[e + "down_proj.weight_scale"].float())
    gpu = wrapper.gpu_experts
    down0 = ckpt["model.layers.1.mlp.experts.0.down_proj.weight_packed"].view(torch.uint8)
    assert gpu.quant_method.group == GROUP and torch.equal(gpu.w2_weight[0], down0)
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
    assert sched.model_runner.model.kt_state.cpu_engine.stats().pairs > 0


def test_without_kt_the_experts_stay_int4_and_another_method_requantizes(int4_moe):
    """A W4A16 MoE checkpoint without KT: its routed experts take a quarter of full precision's bytes (as they
    are), not a dequantized copy."""
    d, prompts, ref = int4_moe
    sched = _scheduler(d)
    experts = sched.model_runner.model.model.layers[1].mlp.experts
    assert experts.quant_method.name == "INT4" and experts.quant_method.group == GROUP
    ckpt = load_file(f"{d}/model.safetensors")
    e = "model.layers.1.mlp.experts.2."
    inter = experts.w13_weight.shape[1] // 2
    assert torch.equal(experts.w2_weight[2], ckpt[e + "down_proj.weight_packed"].view(torch.uint8))
    assert torch.equal(experts.w13_weight_scale[2, inter:], ckpt[e + "up_proj.weight_scale"].float())
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref
    int8 = _scheduler(d, kt_method="INT8", kt_num_gpu_experts=1)
    assert int8.model_runner.model.model.layers[0].mlp.experts.cpu_layer.w13_weight.dtype == torch.int8
    assert len(run_scheduler(int8, prompts[:1], greedy_params(4))[0].output_ids) == 4


def test_two_tensor_parallel_ranks_split_the_int4_experts_on_group_boundaries(int4_moe):
    """Without KT at --tp-size 2 (gloo): each rank holds half of every expert's intermediate dimension as the
    checkpoint's codes, w2's by whole groups of 32 of its inputs; greedy tokens equal transformers'."""
    from sglang.test.runners import engine_greedy_tokens

    d, prompts, ref = int4_moe
    assert engine_greedy_tokens(d, prompts, NEW_TOKENS, tp_size=2) == ref


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "olmoe", "glm4_moe"])
def test_every_moe_family_holds_its_int4_experts(family, tmp_path):
    """The other MoE families (Mixtral's block_sparse_moe / w1-w3 names; Qwen2-MoE's shared expert and its gate;
    OLMoE; GLM-4.5's grouped routing, shared expert and leading dense layer), transformers-written, their routed
    experts pack-quantized in groups of 32, without KT: the experts hold the checkpoint's codes, greedy tokens equal
    transformers' on the dequantized weights."""
    from sglang.test.tiny_moe_families import make_tiny_family

    full, hf = make_tiny_family(family, str(tmp_path / "full"))
    d = write_int4_experts_checkpoint(full, str(tmp_path / "int4"), GROUP)
    prompts = _prompts(12, hf.config.vocab_size)
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    sched = _scheduler(d)
    experts = sched.model_runner.model.model.layers[-1].mlp.experts
    assert experts.quant_method.name == "INT4" and experts.quant_method.group == GROUP
    assert experts.w2_weight.dtype == torch.uint8
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


def test_experts_the_config_ignores_stay_in_full_precision(tmp_path):
    """A pack-quantized checkpoint whose ignore list names the routed experts (only attention quantized): they load
    as the checkpoint stores them, in full precision, never quantized to INT4 at load; greedy tokens equal
    transformers'."""
    import re

    attention = re.compile(r".*\.self_attn\.(q|k|v|o)_proj\.weight$")
    ignore = ["lm_head", r"re:.*mlp\.experts.*", r"re:.*mlp\.gate$"]
    d = write_int4_experts_checkpoint(
        moe_bf16(str(tmp_path / "bf16")), str(tmp_path / "int4"), GROUP, attention, ignore
    )
    prompts = _prompts(10, 256)
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    sched = _scheduler(d)
    experts = sched.model_runner.model.model.layers[1].mlp.experts
    assert experts.quant_method.name == "BF16" and experts.w13_weight.dtype == torch.float32
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


def test_kimi_k2_thinking_family_default_kt_method(tmp_path):
    """DeepSeek-V3's classes (Kimi-K2-Thinking's) with int4 routed experts, KT on with the default --kt-method
    (AMXINT4), and without KT: the experts are the checkpoint's groups, the shared expert and attention dequantized
    (full precision in the checkpoint); greedy tokens equal transformers'."""
    d = write_int4_experts_checkpoint(deepseek_v3_full(str(tmp_path / "full")), str(tmp_path / "int4"), GROUP)
    prompts = _prompts(8, 256)
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    sched = _scheduler(d, kt_num_gpu_experts=1)
    assert sched.model_runner.config.kt.method == "INT4_G32"
    model = sched.model_runner.model
    cpu, idx = model.model.layers[1].mlp.experts.expert_home(3)
    ckpt = load_file(f"{d}/model.safetensors")
    down = ckpt["model.layers.1.mlp.experts.3.down_proj.weight_packed"].view(torch.uint8)
    assert torch.equal(cpu.w2_weight[idx], down)
    outs = run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))
    assert [o.output_ids for o in outs] == ref
    plain = _scheduler(d)
    experts = plain.model_runner.model.model.layers[1].mlp.experts
    assert experts.quant_method.name == "INT4" and torch.equal(experts.w2_weight[3], down)
    assert [o.output_ids for o in run_scheduler(plain, prompts, greedy_params(NEW_TOKENS))] == ref


def test_dummy_weights_in_the_checkpoints_groups(int4_moe):
    d, prompts, _ = int4_moe
    sched = _scheduler(d, load_format="dummy", kt_method="RAWINT4", kt_num_gpu_experts=1)
    cpu = sched.model_runner.model.model.layers[0].mlp.experts.cpu_layer
    assert cpu.w13_weight_scale.shape[-1] == cpu.w13_weight.shape[-1] * 2 // GROUP
    assert bool((cpu.w13_weight_scale != 0).all())  # filled from the random weights
    assert len(run_scheduler(sched, prompts[:1], greedy_params(4))[0].output_ids) == 4


def test_dense_w4a16_checkpoint_is_dequantized_at_load(tmp_path):
    """llm-compressor's W4A16 recipe on a dense model (every decoder linear pack-quantized): each is dequantized at
    load, exactly; greedy tokens equal transformers' on the dequantized weights."""
    from sglang.test.fp8_checkpoints import dense_bf16
    from sglang.test.int4_checkpoints import DECODER_LINEAR

    d = write_int4_experts_checkpoint(dense_bf16(str(tmp_path / "bf16")), str(tmp_path / "int4"), GROUP, DECODER_LINEAR)
    prompts = _prompts(9, 512)
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)
    sched = _scheduler(d)
    qkv = sched.model_runner.model.model.layers[1].self_attn.qkv_proj.weight
    assert qkv.dtype == torch.float32
    assert [o.output_ids for o in run_scheduler(sched, prompts, greedy_params(NEW_TOKENS))] == ref


def test_rawint4_and_int4_weight_path_are_refused_by_flag(int4_moe, tmp_path):
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.configs.errors import ServerArgsError
    from sglang.srt.server_args import ServerArgs

    d = int4_moe[0]

    def resolve(**kw):
        return resolve_engine_config(ServerArgs(device="cpu", kt_num_gpu_experts=1, **kw))

    with pytest.raises(ServerArgsError, match="--kt-method RAWINT4 runs a checkpoint's own int4 experts.* INT4"):
        resolve(model_path=d + "-dequantized", kt_method="RAWINT4")
    with pytest.raises(ServerArgsError, match="--kt-weight-path .*int4 checkpoint's experts load from --model-path"):
        resolve(model_path=d + "-dequantized", kt_method="INT4", kt_weight_path=d)
    assert resolve(model_path=d, kt_method="amxint4").kt.method == "INT4_G32"
    assert resolve(model_path=d + "-dequantized", kt_method="INT4").kt.method == "INT4"  # groups of 128, quantized
