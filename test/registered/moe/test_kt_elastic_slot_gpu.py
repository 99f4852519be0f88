"""The elastic KT prefill slot on the GPU (post-capture path, Qwen3-30B-A3B shape cut to 12 layers, dummy
weights, KT BF16 with 16 of 128 experts per layer on the GPU, threshold 1024):

- the pool keeps the slot's memory: from the same start-up readings, its tokens equal those the planner
  gives without the reservation within one granule of every buffer, and its last tokens are the tail;
- a 2048-token prompt, with 4 short requests decoding, takes the tail (the arena remaps it into the slot's
  range), runs the full-GPU path over it, and gives it back; the slot laid over the lent memory holds
  exactly what a freshly allocated slot holds after loading the same layer;
- every output equals the permanent-reservation server's (SGLANG_KT_ELASTIC_SLOT=0).
"""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=150, suite="per-commit-cuda")

import os

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

THRESHOLD = 1024


def scheduler(threshold, elastic: bool):
    """elastic: the post-capture path, which lends the slot from the pool's tail; else the static path (a
    permanent slot)."""
    from sglang.srt.configs.engine_config import resolve_engine_config
    from sglang.srt.managers.scheduler import build_scheduler
    from sglang.srt.server_args import ServerArgs
    from sglang.test.gpu_utils import shape_config_dir
    from sglang.test.runners import OutputCollector

    args = ServerArgs(
        model_path=shape_config_dir("Qwen3-30B-A3B-12L"), load_format="dummy", skip_tokenizer_init=True,
        kt_method="BF16", kt_num_gpu_experts=16, kt_gpu_prefill_token_threshold=threshold,
        kt_cpuinfer=os.cpu_count(), chunked_prefill_size=8192, max_running_requests=32, log_level="warning",
    )  # fmt: skip
    collector = OutputCollector()
    return build_scheduler(resolve_engine_config(args, post_capture=elastic), output_sink=collector), collector


def run(sched, collector) -> dict:
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    def submit(rid, ids, n):
        params = SamplingParams.from_dict({"max_new_tokens": n, "temperature": 0, "ignore_eos": True})
        sched.add_request(TokenizedGenerateReqInput(rid, "", ids, params, False, False))

    for i in range(4):
        submit(f"short-{i}", [(13 * i + 7 * j) % 150000 + 5 for j in range(32)], 16)
    sched.step()
    submit("long", [(31 * j) % 150000 + 5 for j in range(2048)], 4)
    while sched.has_work():
        sched.step()
    return {rid: r.output_ids for rid, r in sorted(collector.results.items())}


def release(sched) -> None:
    sched.model_runner.shutdown()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_elastic_slot_lends_the_tail_and_matches_the_permanent_slot():
    import dataclasses

    from sglang.srt.layers.moe.kt_ep_wrapper import KTEPWrapperMethod
    from sglang.srt.layers.moe.kt_prefill_slot import KTPrefillSlot
    from sglang.srt.model_executor.pool_configurator import post_capture_pool_size, whole_granule_tokens

    permanent, out_p = scheduler(THRESHOLD, elastic=False)
    assert permanent.kt_slot_lender is None and permanent.model_runner.pool_size.prefill_slot_tail is None
    tokens_permanent = permanent.max_total_num_tokens
    outputs_permanent = run(permanent, out_p)
    release(permanent)
    del permanent

    sched, out = scheduler(THRESHOLD, elastic=True)
    mr = sched.model_runner
    tail = mr.pool_size.prefill_slot_tail
    unit = whole_granule_tokens(mr.readings)
    # The same readings without the reservation, and with it kept out (another start measures a little
    # differently: those counts are the benchmark's, benchmark/kt_elastic/).
    cap = mr.capture_readings
    without = post_capture_pool_size(dataclasses.replace(mr.readings, reservations_bytes={}), cap, mr.pool_args).tokens
    kept = post_capture_pool_size(mr.readings, cap, dataclasses.replace(mr.pool_args, lend_reservations=False)).tokens
    print(f"tokens: elastic {sched.max_total_num_tokens}, same readings without the reservation {without}, kept out "
          f"{kept}; the permanent start {tokens_permanent}; tail {tail.tokens}, granule unit {unit}")  # fmt: skip
    assert 0 <= without - sched.max_total_num_tokens < unit  # within one granule of every buffer
    assert sched.max_total_num_tokens - tail.tokens >= kept - unit
    outputs = run(sched, out)
    stats = sched.kt_slot_lender.stats
    print(f"takes {stats.takes}, returns {stats.returns}, take {stats.last_take_ms:.1f} ms, "
          f"return {stats.last_return_ms:.1f} ms")  # fmt: skip
    assert (stats.takes, stats.returns, stats.refusals, stats.lent) == (1, 1, 0, False)
    assert outputs == outputs_permanent
    assert len(outputs["long"]) == 4 and all(len(outputs[f"short-{i}"]) == 16 for i in range(4))
    # The slot over lent memory holds what a freshly allocated one holds after loading the same layer.
    lent = mr.kt_prefill_slot
    assert sched.kt_slot_lender.take(step=0)
    wrapper = next(m for m in mr.model.modules() if isinstance(m, KTEPWrapperMethod))
    lent_layer = lent.acquire()
    lent.load_from(wrapper)
    # Built in host memory: the pool holds every free byte of the GPU (the point of lending).
    fresh = KTPrefillSlot(
        wrapper.num_experts, wrapper.hidden_size, wrapper.intermediate_size, wrapper.params_dtype, "BF16",
        torch.device("cpu"),
    )  # fmt: skip
    fresh_layer = fresh.acquire()
    fresh.load_from(wrapper)
    lent_params, fresh_params = dict(lent_layer.named_parameters()), dict(fresh_layer.named_parameters())
    assert lent_params.keys() == fresh_params.keys()
    slot = mr.kv_arena.slot_tensor()
    for name, p in lent_params.items():
        assert slot.data_ptr() <= p.data_ptr() < slot.data_ptr() + slot.numel()
        assert torch.equal(p.cpu(), fresh_params[name]), name
    del lent_layer, lent_params, slot, fresh, fresh_layer, fresh_params
    sched.kt_slot_lender.give_back(step=0)
    assert not sched.allocator.tail_lent and stats.takes == 2 and stats.returns == 2
    release(sched)
