"""CUDA-graph decode equals eager decode (padding rows included), on a random ~1B Llama shape."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="per-commit-cuda")

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, random_decode_batch, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)


@pytest.fixture(scope="module")
def runner():
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=shape_config_dir("Llama-1B-random"),
        load_format="dummy",
        skip_tokenizer_init=True,
        max_total_tokens=65536,
        max_running_requests=64,
        cuda_graph_max_bs=32,
        mem_fraction_static=0.6,
    )
    return ModelRunner(resolve_engine_config(args))


@pytest.mark.parametrize("bs", [1, 3, 8, 13, 32])
def test_graph_replay_equals_eager(runner, bs):
    mr = runner
    assert mr.cuda_graph_runner is not None
    fb, rows, slots = random_decode_batch(mr, bs, ctx=37)
    try:
        graph_logits = mr.forward(fb).next_token_logits.clone()
        graphs, mr.cuda_graph_runner = mr.cuda_graph_runner, None
        try:
            eager_logits = mr.forward(fb).next_token_logits
        finally:
            mr.cuda_graph_runner = graphs
        assert graph_logits.shape == eager_logits.shape == (bs, mr.model_config.vocab_size)
        torch.testing.assert_close(graph_logits, eager_logits, rtol=0, atol=1e-3)
        assert torch.equal(graph_logits.argmax(-1), eager_logits.argmax(-1))
    finally:
        for r in rows:
            mr.req_to_token_pool.free(r)
        mr.token_to_kv_pool_allocator.free(slots.flatten())
