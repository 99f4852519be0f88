"""GLM-4.5-Air on the GPU under KT with FP8 experts: its shape cut to 4 layers (1 dense + 3 MoE; scripts/
make_model_configs.py's GLM-4.5-Air-4L), dummy weights, 16 of 128 experts per layer on the GPU, the rest in the CPU
kernels, the full-GPU prefill slot from 4096 tokens.

- The slot's reservation equals a hand count (128 experts x (w13 2816 x 4096 + w2 4096 x 1408) fp8 bytes plus the
  fp32 block-128 scales: 2,215,133,184 bytes), the static path's KV tokens are exactly what is left after it, and
  the slot the first long prompt builds holds exactly those bytes.
- 16 requests decoding, then a 20,000-token prompt arrives: its chunks take the full-GPU path (no hybrid MoE call
  of a prefill over the threshold, every MoE layer streamed through the slot), no OOM, every request finishes with
  all its tokens; on both KV sizing paths (post-capture: the slot over memory lent from the pool's tail).
"""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="per-commit-cuda")

import gc

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)
GiB = 1 << 30
THRESHOLD = 4096
LONG_PROMPT, DECODERS, DECODE_TOKENS, LONG_TOKENS = 20_000, 16, 96, 8
SHORT_PROMPT = 64  # 16 of them prefill together in 1024 rows, below the threshold
# One MoE layer of all 128 experts in the FP8 block-128 layout: w13 [128, 2816, 4096] and w2 [128, 4096, 1408]
# e4m3, scales fp32 [128, 22, 32] and [128, 32, 11].
SLOT_BYTES = 128 * (2816 * 4096 + 4096 * 1408) + 128 * 22 * 32 * 4 + 128 * 32 * 11 * 4


def _scheduler(post_capture: bool):
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.server_args import ServerArgs

    outputs: dict = {}

    def sink(out):
        for rid, ids in zip(out.rids, out.output_ids):
            outputs.setdefault(rid, []).extend(ids)

    args = ServerArgs(
        model_path=shape_config_dir("GLM-4.5-Air-4L"),
        load_format="dummy",
        skip_tokenizer_init=True,
        kt_method="FP8",
        kt_num_gpu_experts=16,
        kt_gpu_prefill_token_threshold=THRESHOLD,
        max_running_requests=64,
        log_level="warning",
    )
    config = resolve_engine_config(args, post_capture=post_capture)
    return build_scheduler(config, output_sink=sink), outputs


def _request(rid: str, prompt: list, new_tokens: int):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams.from_dict({"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
    return TokenizedGenerateReqInput(rid, "", prompt, params, False, False)


def _shutdown(sched) -> None:
    sched.model_runner.shutdown()
    del sched
    gc.collect()
    torch.cuda.empty_cache()


def test_reservation_is_the_hand_count():
    from sglang.srt.layers.moe.layer import param_bytes

    sched, _ = _scheduler(post_capture=False)
    mr = sched.model_runner
    try:
        plan = mr.memory_plan
        assert type(mr.model).__name__ == "Glm4MoeForCausalLM"
        assert SLOT_BYTES == 2_215_133_184
        assert plan.reservations_bytes["kt_full_gpu_prefill_slot"] == SLOT_BYTES == mr.kt_prefill_slot.nbytes
        rest = plan.available_after_weights_gb - plan.pre_model_load_memory_gb * (1 - plan.mem_fraction_static)
        assert mr.max_total_num_tokens == (int(rest * GiB) - SLOT_BYTES) // plan.cell_size_bytes
        assert plan.cell_size_bytes == 4 * 8 * 256 * 2  # 4 layers, 8 KV heads of 128 + 128 bf16 values
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        layer = mr.kt_prefill_slot.acquire()
        after = torch.cuda.memory_allocated()
        assert layer is not None and param_bytes(layer) == SLOT_BYTES
        assert 0 <= (after - before) - SLOT_BYTES <= 512 * len(list(layer.parameters()))  # allocator rounding
        print(f"GLM-4.5-Air-4L KT FP8: reservation {SLOT_BYTES} bytes, tokens {mr.max_total_num_tokens}")
    finally:
        _shutdown(sched)


@pytest.mark.parametrize("post_capture", [False, True], ids=["static", "post-capture"])
def test_long_prompt_while_16_decode_takes_the_full_gpu_path(post_capture, monkeypatch):
    from sglang.srt.layers.moe.kt_ep_wrapper import KTEPWrapperMethod
    from sglang.srt.layers.moe.kt_prefill_slot import KTPrefillSlot

    hybrid_rows, streamed = [], []
    hybrid, load_from = KTEPWrapperMethod.hybrid_forward, KTPrefillSlot.load_from

    def counted_hybrid(self, x, *args, **kwargs):
        hybrid_rows.append(x.shape[0])
        return hybrid(self, x, *args, **kwargs)

    def counted_load(self, wrapper):
        streamed.append(wrapper.layer_id)
        return load_from(self, wrapper)

    sched, outputs = _scheduler(post_capture)
    try:
        mr = sched.model_runner
        assert mr.memory_plan.path == ("post-capture" if post_capture else "static"), mr.memory_plan.path_reason
        monkeypatch.setattr(KTEPWrapperMethod, "hybrid_forward", counted_hybrid)
        monkeypatch.setattr(KTPrefillSlot, "load_from", counted_load)
        for i in range(DECODERS):
            sched.add_request(_request(f"d{i}", [11 + i] * SHORT_PROMPT, DECODE_TOKENS))
        while len([r for r in outputs if outputs[r]]) < DECODERS:  # all 16 have begun decoding
            assert sched.step()
        assert not streamed, "a short prompt took the full-GPU path"
        vocab = mr.model_config.vocab_size
        sched.add_request(_request("long", [(7 * t) % (vocab - 3) + 3 for t in range(LONG_PROMPT)], LONG_TOKENS))
        while sched.has_work():
            sched.step()
        assert {rid: len(ids) for rid, ids in outputs.items()} == {
            **{f"d{i}": DECODE_TOKENS for i in range(DECODERS)},
            "long": LONG_TOKENS,
        }
        moe_layers = [m.layer_id for m in mr.model.modules() if isinstance(m, KTEPWrapperMethod)]
        chunk = sched.chunked_prefill_size or LONG_PROMPT
        assert chunk >= THRESHOLD  # whole chunks qualify (the H200's default is 8192; 20,000 = 8192 + 8192 + 3616)
        full_chunks = LONG_PROMPT // chunk
        # Each full chunk streams every MoE layer into the slot (it holds one layer at a time); the remainder
        # below the threshold runs hybrid, and no prefill over the threshold does.
        assert len(streamed) >= full_chunks * len(moe_layers) and set(streamed) == set(moe_layers)
        assert max(hybrid_rows) < THRESHOLD, "a prefill over the threshold ran the hybrid path"
        print(
            f"{'post-capture' if post_capture else 'static'}: {len(streamed)} layer streams, {full_chunks} full "
            f"chunk(s) of {chunk}, "
            f"largest hybrid batch {max(hybrid_rows)} rows, peak {torch.cuda.max_memory_allocated() / GiB:.1f} GiB "
            f"of {torch.cuda.get_device_properties(0).total_memory / GiB:.1f} GiB"
        )
    finally:
        _shutdown(sched)
