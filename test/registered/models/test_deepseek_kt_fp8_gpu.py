"""KT on a DeepSeek-V3 shape with FP8 experts on the GPU machine: DeepSeek-V3's layers cut to 4 (3 dense + 1 MoE of
256 experts, every routed expert in the CPU kernels as FP8), dummy weights.

- The full-GPU prefill slot's reservation is the hand count of one DeepSeek-V3 MoE layer in FP8 block-128:
  256 x 3 x 7168 x 2048 weight bytes + 1,835,008 + 917,504 scale bytes = 11,277,041,664, and the slot built on
  the first long prompt holds exactly that many parameter bytes;
- a 20k-token prompt (chunks of 8192, each over the threshold: the full-GPU path) while 16 requests decode (their
  steps replayed from CUDA graphs, CPU experts inside) runs without OOM, and the slot served every chunk;
- the ratio of one 8192-token chunk on the hybrid path (CPU experts) to the full-GPU path is printed.
"""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=180, suite="per-commit-cuda")

import os
import time

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, random_decode_batch, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

SLOT_BYTES = 256 * 3 * 7168 * 2048 + 1_835_008 + 917_504  # = 11,277,041,664
CHUNK = 8192
PROMPT = 20 * 1024
DECODING = 16


def _runner():
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=shape_config_dir("DeepSeek-V3-4L"),
        load_format="dummy",
        skip_tokenizer_init=True,
        kt_method="FP8",
        kt_num_gpu_experts=0,
        kt_gpu_prefill_token_threshold=4096,
        kt_cpuinfer=os.cpu_count(),
        chunked_prefill_size=CHUNK,
        cuda_graph_max_bs=DECODING,
        max_running_requests=32,
        mem_fraction_static=0.85,
        log_level="warning",
    )
    return ModelRunner(resolve_engine_config(args))


def _chunk(mr, row, slots, done: int, n: int):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode, ModelWorkerBatch

    batch = ModelWorkerBatch(
        ForwardMode.EXTEND, [3] * n, [row], [done + n], slots[done : done + n],
        extend_seq_lens=[n], extend_prefix_lens=[done],
    )  # fmt: skip
    torch.cuda.synchronize()
    start = time.perf_counter()
    logits = mr.forward(ForwardBatch.init_new(batch, mr)).next_token_logits
    assert torch.isfinite(logits).all()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def test_deepseek_v3_kt_fp8_slot_and_long_prompt_beside_decodes():
    from sglang.srt.layers.moe.layer import param_bytes

    assert SLOT_BYTES == 11_277_041_664
    mr = _runner()
    try:
        plan = mr.memory_plan
        assert plan.reservations_bytes == {"kt_full_gpu_prefill_slot": SLOT_BYTES}
        assert plan.cell_size_bytes == 4 * 576 * 2 and mr.cuda_graph_runner is not None
        slot = mr.kt_prefill_slot
        assert slot.nbytes == SLOT_BYTES

        decode_fb, decode_rows, decode_slots = random_decode_batch(mr, DECODING, 1024)
        (row,) = mr.req_to_token_pool.alloc(1)
        slots = mr.token_to_kv_pool_allocator.alloc(PROMPT)
        mr.req_to_token_pool.req_to_token[row, :PROMPT] = slots.to(torch.int32).cuda()
        full, done = [], 0
        while done < PROMPT:
            n = min(CHUNK, PROMPT - done)
            full.append(_chunk(mr, row, slots, done, n))
            assert slot.layer is not None and slot.loaded_layer_id == 3  # the chunk's MoE ran in the slot
            step = mr.forward(decode_fb).next_token_logits  # the 16 decoding requests, between the chunks
            assert torch.isfinite(step).all()
            done += n
        assert param_bytes(slot.layer) == SLOT_BYTES

        # The ratio: the first chunk again on the full-GPU path (the slot is built now) and on the hybrid path
        # (what a prompt under the threshold takes; the slot switched off for one chunk).
        full_again = _chunk(mr, row, slots, 0, CHUNK)
        slot.disabled = True
        hybrid = _chunk(mr, row, slots, 0, CHUNK)
        slot.disabled = False
        print(
            f"DeepSeek-V3-4L KT FP8: reservation {SLOT_BYTES} bytes; 20k prompt in {sum(full):.2f} s "
            f"(chunks {', '.join(f'{t:.2f}' for t in full)} s) beside {DECODING} decoding requests; one {CHUNK}-token "
            f"chunk hybrid {hybrid:.2f} s vs full-GPU {full_again:.2f} s: {hybrid / full_again:.1f}x"
        )
        mr.req_to_token_pool.free(row)
        mr.token_to_kv_pool_allocator.free(slots)
        for r in decode_rows:
            mr.req_to_token_pool.free(r)
        mr.token_to_kv_pool_allocator.free(decode_slots.flatten())
    finally:
        mr.shutdown()
