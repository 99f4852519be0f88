"""The triton backend's metadata (kv_indptr / kv_indices from req_to_token, extend with a cached prefix,
decode) gives the torch-native backend's logits; on CPU through the triton interpreter."""

from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")
register_cuda_ci(est_time=30, suite="per-commit-cuda")

import os
import tempfile

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="needs a CUDA GPU or TRITON_INTERPRET=1 (conftest sets it without a GPU)",
)


def _model_runner(config, prefix: str, **flags):
    """A ModelRunner (fp32, torch-native attention, no graphs) over transformers' random init of `config`."""
    from transformers import AutoModelForCausalLM

    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    path = tempfile.mkdtemp(prefix=prefix)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    args = ServerArgs(
        model_path=path,
        skip_tokenizer_init=True,
        max_total_tokens=2048,
        device="cuda" if torch.cuda.is_available() else "cpu",
        dtype="float32",
        disable_cuda_graph=True,
        attention_backend="torch_native",
        mem_fraction_static=0.5,
        **flags,
    )
    return ModelRunner(resolve_engine_config(args))


SHAPE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


@pytest.fixture(scope="module")
def runner():
    from transformers import LlamaConfig

    return _model_runner(LlamaConfig(**SHAPE), "tiny-llama-")


def _run(mr, backend, mode, ids, rows, seqs, loc, ext=None, pre=None) -> torch.Tensor:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ModelWorkerBatch

    mr.attn_backend = backend
    batch = ModelWorkerBatch(mode, ids, rows, seqs, loc, extend_seq_lens=ext, extend_prefix_lens=pre)
    return mr.forward(ForwardBatch.init_new(batch, mr)).next_token_logits


def test_triton_backend_matches_torch_native(runner):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mr = runner
    native, triton_be = mr.attn_backend, TritonAttnBackend(mr)
    rows = mr.req_to_token_pool.alloc(2)
    table = mr.req_to_token_pool.req_to_token
    loc0 = mr.token_to_kv_pool_allocator.alloc(10)
    loc1 = mr.token_to_kv_pool_allocator.alloc(11)
    loc1 = loc1[torch.randperm(11)]  # non-contiguous slots
    table[rows[0], :10] = loc0.to(table)
    table[rows[1], :11] = loc1.to(table)
    ids0, ids1 = list(range(5, 15)), list(range(20, 31))
    # Request 1 has a cached prefix of 6 tokens, computed first.
    _run(mr, native, ForwardMode.EXTEND, ids1[:6], [rows[1]], [6], loc1[:6], [6], [0])
    extend = [
        _run(mr, be, ForwardMode.EXTEND, ids0 + ids1[6:], rows, [10, 11], torch.cat([loc0, loc1[6:]]), [10, 5], [0, 6])
        for be in (native, triton_be)
    ]
    tol = 2e-3 if torch.cuda.is_available() else 1e-4  # tl.dot on the GPU uses tf32 for fp32 inputs
    torch.testing.assert_close(extend[1], extend[0], rtol=tol, atol=tol)
    new = mr.token_to_kv_pool_allocator.alloc(2)
    table[rows[0], 10], table[rows[1], 11] = int(new[0]), int(new[1])
    decode = [_run(mr, be, ForwardMode.DECODE, [3, 4], rows, [11, 12], new) for be in (native, triton_be)]
    torch.testing.assert_close(decode[1], decode[0], rtol=tol, atol=tol)
    assert not torch.equal(decode[0][0], decode[0][1])  # the two requests really differ


@pytest.fixture(scope="module")
def hybrid_runner():
    """A Qwen2 whose second layer slides over 4 keys, on the hybrid SWA pool (a window pool of 1024 tokens)."""
    from transformers import Qwen2Config

    config = Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    return _model_runner(config, "tiny-qwen2-swa-", swa_full_tokens_ratio=0.5)


def test_triton_backend_reads_the_window_pool_as_torch_native(hybrid_runner):
    """The windowed layer reads the window pool through the full-to-window slot map, in extend and decode, also
    after the earliest tokens gave their window slots back (their reads land on a NaN-filled dummy slot, which no
    query may see)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mr = hybrid_runner
    pool, alloc = mr.token_to_kv_pool, mr.token_to_kv_pool_allocator
    assert pool.has_window_pool and [pool.is_swa_layer(i) for i in (0, 1)] == [False, True]
    assert (alloc.size, alloc.swa_size) == (2048, 1024)
    native, triton_be = mr.attn_backend, TritonAttnBackend(mr)
    rows = mr.req_to_token_pool.alloc(2)
    table = mr.req_to_token_pool.req_to_token
    alloc.swa.alloc(7)  # the window slots of the tokens below are not their full slots
    loc0, loc1 = alloc.alloc(10), alloc.alloc(11)
    assert not torch.equal(alloc.full_to_swa_host[loc0.cpu()], loc0.cpu())
    table[rows[0], :10] = loc0.to(table)
    table[rows[1], :11] = loc1.to(table)
    ids0, ids1 = list(range(5, 15)), list(range(20, 31))
    _run(mr, native, ForwardMode.EXTEND, ids1[:6], [rows[1]], [6], loc1[:6], [6], [0])
    alloc.free_swa(loc1[:2])  # the new tokens (positions 6..10) see 3 on: 0 and 1 left every window
    for buf in pool.swa_pool.buffers():
        buf[0].fill_(float("nan"))
    extend = [
        _run(mr, be, ForwardMode.EXTEND, ids0 + ids1[6:], rows, [10, 11], torch.cat([loc0, loc1[6:]]), [10, 5], [0, 6])
        for be in (native, triton_be)
    ]
    tol = 2e-3 if torch.cuda.is_available() else 1e-4
    assert torch.isfinite(extend[0]).all()
    torch.testing.assert_close(extend[1], extend[0], rtol=tol, atol=tol)
    alloc.free_swa(torch.cat([loc0[:6], loc1[:7]]))  # the decode queries (10 and 11) see 7 and 8 on
    new = alloc.alloc(2)
    table[rows[0], 10], table[rows[1], 11] = int(new[0]), int(new[1])
    decode = [_run(mr, be, ForwardMode.DECODE, [3, 4], rows, [11, 12], new) for be in (native, triton_be)]
    assert torch.isfinite(decode[0]).all()
    torch.testing.assert_close(decode[1], decode[0], rtol=tol, atol=tol)
