"""Overlap scheduling on the GPU, CUDA graphs on (a random ~1B Llama shape, dummy weights):
* greedy outputs and forward counts are identical with overlap on and off (lengths 1..40, chunked prefill);
* a steady decode step (launch of step N + 1 and processing of step N) makes no host-device synchronisation
  that torch can see (torch.cuda.set_sync_debug_mode("error")): the host never waits for the GPU except
  for the previous step's result, which is already done by the time it is read."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="per-commit-cuda")

import random

import pytest
import torch

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)


def cuda_scheduler(overlap: bool, mixed: bool = False):
    from sglang.test.runners import make_scheduler

    return make_scheduler(
        model_path=shape_config_dir("Llama-1B-random"),
        load_format="dummy",
        device="cuda",
        skip_tokenizer_init=True,
        max_total_tokens=32768,
        max_running_requests=64,
        cuda_graph_max_bs=32,
        chunked_prefill_size=256,
        mem_fraction_static=0.3,
        disable_overlap_schedule=not overlap,
        enable_mixed_chunk=mixed,
    )


@pytest.fixture(scope="module")
def pair():
    on = cuda_scheduler(True)
    assert on.model_runner.cuda_graph_runner is not None
    return on, cuda_scheduler(False)


def workload(n: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 30000) for _ in range(rng.randrange(5, 600))] for _ in range(n)]
    params = [{"max_new_tokens": rng.randrange(1, 41), "temperature": 0.0, "ignore_eos": True} for _ in range(n)]
    return prompts, params


def test_greedy_outputs_and_steps_identical(pair):
    from sglang.test.runners import run_scheduler

    prompts, params = workload(24, seed=0)
    outs, steps = [], []
    for sched in pair:
        before = sched.forward_ct
        outs.append(run_scheduler(sched, prompts, params))
        steps.append(sched.forward_ct - before)
        assert not sched.has_work() and sched.in_flight is None
        assert sched.allocator.available_size() + sched.tree_cache.evictable_size() == sched.max_total_num_tokens
    for i, (a, b) in enumerate(zip(*outs)):
        assert a.output_ids == b.output_ids and len(a.output_ids) == params[i]["max_new_tokens"], f"request {i}"
    assert steps[0] == steps[1]  # no step wasted on requests finishing by length


def test_steady_decode_step_never_synchronises(pair):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    sched = pair[0]
    prompts, _ = workload(16, seed=1)
    params = {"max_new_tokens": 64, "temperature": 0.7, "top_p": 0.9, "ignore_eos": True}
    for i, ids in enumerate(prompts):
        sched.add_request(
            TokenizedGenerateReqInput(f"sync-{i}", "", ids, SamplingParams.from_dict(params), False, False)
        )
    while (
        sched.waiting_queue
        or sched.chunked_req is not None
        or sched.in_flight is None
        or (not sched.in_flight.forward_mode.is_decode())
    ):
        sched.step()  # prefills (their metadata may read the device) until decoding is steady
    sched.step()
    steady = 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            assert sched.in_flight is not None and sched.in_flight.forward_mode.is_decode()
            sched.step()  # raises RuntimeError at any synchronising call
            steady += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert steady == 20
    while sched.has_work():
        sched.step()
    results = [sched.collector.results.pop(f"sync-{i}") for i in range(len(prompts))]
    assert all(len(r.output_ids) == 64 for r in results)


def test_mixed_chunks_on_the_gpu(pair):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    prompts, params = workload(24, seed=2)
    outs = {}
    for mixed, sched in ((False, pair[0]), (True, cuda_scheduler(True, mixed=True))):
        riders = []
        run_batch = sched.run_batch
        sched.run_batch = lambda b, run_batch=run_batch, riders=riders: (riders.append(b.num_decode), run_batch(b))[1]
        for i, (ids, p) in enumerate(zip(prompts, params)):  # eight arrive at once, then one every other step
            sched.add_request(
                TokenizedGenerateReqInput(f"mix{int(mixed)}-{i}", "", ids, SamplingParams.from_dict(p), False, False)
            )
            if i >= 8:
                sched.step()
                sched.step()
        while sched.has_work():
            sched.step()
        sched.run_batch = run_batch
        outs[mixed] = [sched.collector.results.pop(f"mix{int(mixed)}-{i}").output_ids for i in range(len(prompts))]
        assert [len(o) for o in outs[mixed]] == [p["max_new_tokens"] for p in params]
        assert sched.allocator.available_size() + sched.tree_cache.evictable_size() == sched.max_total_num_tokens
        assert (sum(riders) > 0) == mixed, riders
    same = sum(a == b for a, b in zip(outs[False], outs[True]))
    print(f"mixed vs plain: {same} of {len(prompts)} greedy outputs identical (random weights, other kernels)")
