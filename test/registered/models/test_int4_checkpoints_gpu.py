"""Pack-quantized INT4 checkpoints (compressed-tensors W4A16) on the GPU without KT: the routed experts stay in the
checkpoint's groups in the fused MoE (its INT4 groups of 32 read from the codes), not a dequantized copy. Tiny
transformers-written Qwen3-MoE and DeepSeek-V3 (Kimi-K2-Thinking's classes) models, fp32, their routed experts
pack-quantized in groups of 32: the experts on the GPU hold the checkpoint's bytes, and greedy tokens with CUDA graphs
equal those without and equal transformers' on the dequantized weights."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="per-commit-cuda")

import random

import pytest
import torch
from safetensors.torch import load_file

from sglang.test.fp8_checkpoints import deepseek_v3_full, moe_bf16
from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu
from sglang.test.int4_checkpoints import write_int4_experts_checkpoint
from sglang.test.runners import greedy_params, hf_greedy, make_scheduler, run_scheduler

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

NEW_TOKENS = 12
GROUP = 32
WRITERS = {"qwen3-moe": moe_bf16, "deepseek-v3": deepseek_v3_full}


@pytest.mark.parametrize("arch", list(WRITERS))
def test_int4_experts_stay_int4_on_the_gpu(arch, tmp_path):
    d = write_int4_experts_checkpoint(WRITERS[arch](str(tmp_path / "full")), str(tmp_path / "int4"), GROUP)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (3, 19, 40)]
    ref = hf_greedy(d + "-dequantized", prompts, NEW_TOKENS)

    def scheduler(**kw):
        return make_scheduler(
            reuse_model=False, model_path=d, device="cuda", dtype="float32", skip_tokenizer_init=True,
            max_total_tokens=1024, cuda_graph_max_bs=4, **kw,
        )  # fmt: skip

    graphs = scheduler()
    assert graphs.model_runner.cuda_graph_runner is not None
    experts = graphs.model_runner.model.model.layers[1].mlp.experts
    assert experts.quant_method.name == "INT4" and experts.quant_method.group == GROUP
    assert experts.w2_weight.is_cuda and experts.w2_weight.dtype == torch.uint8
    down = load_file(f"{d}/model.safetensors")["model.layers.1.mlp.experts.2.down_proj.weight_packed"]
    assert torch.equal(experts.w2_weight[2].cpu(), down.view(torch.uint8))
    with_graphs = [o.output_ids for o in run_scheduler(graphs, prompts, greedy_params(NEW_TOKENS))]
    eager = scheduler(disable_cuda_graph=True)
    assert with_graphs == [o.output_ids for o in run_scheduler(eager, prompts, greedy_params(NEW_TOKENS))]
    assert with_graphs == ref
