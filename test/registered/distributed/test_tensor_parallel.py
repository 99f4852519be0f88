"""Tensor parallelism over gloo on the CPU: --tp-size 2 (with overlap scheduling) generates exactly what
--tp-size 1 (without) does (SmolLM2 with its 9 query / 3 KV heads split unevenly, a tiny random Qwen3, a tiny
Qwen3-MoE with KT experts), the memory planner takes the MIN over ranks, and a --tp-size 2 server serves and
shuts down cleanly."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="per-commit-cpu")

import signal
import tempfile

import pytest
import requests

from sglang.test.runners import (
    SMOLLM2,
    greedy_params,
    make_scheduler,
    make_tiny_hf_model,
    make_tiny_qwen3_moe,
    run_scheduler,
)
from sglang.test.test_utils import descendant_pids, kill_process_tree, popen_launch_server, wait_pids_gone

PROMPTS = [[504, 3575, 282, 4649, 314], [19556, 28, 957, 1462, 314, 30, 40, 41], list(range(100, 140))]
NEW_TOKENS = 16


def _tiny_moe_dir() -> str:
    overrides = dict(vocab_size=512, max_position_embeddings=512, norm_topk_prob=True, initializer_range=0.08)
    return make_tiny_qwen3_moe(seed=3, **overrides)[0]


# SmolLM2's TP=2 run is the server's (test_server_with_tp2_matches_tp1_and_shuts_down): one start for both.
CASES = {
    "qwen3": lambda: dict(
        model_path=make_tiny_hf_model("qwen3", tempfile.mkdtemp(prefix="tiny-qwen3-")), skip_tokenizer_init=True
    ),
    "qwen3-moe-kt": lambda: dict(
        model_path=_tiny_moe_dir(),
        skip_tokenizer_init=True,
        kt_method="BF16",
        kt_num_gpu_experts=3,
        kt_gpu_prefill_token_threshold=32,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tp2_matches_tp1(case):
    import sglang

    args = CASES[case]()
    prompts = [[t % 500 for t in p] for p in PROMPTS]
    # The reference without overlap scheduling, the TP=2 engine with it (the default): equal outputs cover both.
    reference = make_scheduler(max_total_tokens=4096, disable_overlap_schedule=True, **args)
    tp1 = run_scheduler(reference, prompts, greedy_params(NEW_TOKENS))
    engine = sglang.Engine(tp_size=2, device="cpu", max_total_tokens=4096, log_level="warning", **args)
    try:
        tp2 = engine.generate(input_ids=prompts, sampling_params=greedy_params(NEW_TOKENS))
        info = engine.get_server_info()
        streamed = {}  # the batch streamed: each update names its prompt's index; the last is the whole output
        for out in engine.generate(input_ids=prompts, sampling_params=greedy_params(NEW_TOKENS), stream=True):
            streamed[out["index"]] = out["output_ids"]
    finally:
        engine.shutdown()
    assert [r.output_ids for r in tp1] == [o["output_ids"] for o in tp2]
    assert [streamed[i] for i in range(len(prompts))] == [o["output_ids"] for o in tp2]
    assert len(info["memory_plan"]["per_rank_available_gb"]) == 2
    if case == "qwen3-moe-kt":
        # Each rank reserves its own slice of the full-GPU slot: half of the single-rank layer.
        one_rank = make_scheduler(max_total_tokens=4096, **args).model_runner.memory_plan.reservations_bytes
        assert (
            info["memory_plan"]["reservations_bytes"]["kt_full_gpu_prefill_slot"] * 2
            == one_rank["kt_full_gpu_prefill_slot"]
        )


def test_planner_takes_the_min_over_ranks(monkeypatch):
    """Injected per-rank readings: rank 1 sees 1 GiB less free memory, so both ranks size from it."""
    from sglang.srt.distributed import parallel_state

    GiB = 1 << 30

    class TwoRanks(parallel_state.GroupCoordinator):
        def all_gather_floats(self, value: float):
            if value == 6 * GiB:  # the after-weights reading of this (rank-0) process
                return [6.0 * GiB, 5.0 * GiB]
            return [float(value), float(value)]

    from sglang.srt.model_executor.model_runner import ModelRunner

    seq = iter([8 * GiB, 6 * GiB, 5.5 * GiB])  # free before weights, after weights, after start-up (bytes)
    monkeypatch.setattr(ModelRunner, "read_free_memory_bytes", lambda self: next(seq))
    monkeypatch.setattr(parallel_state, "initialize_model_parallel", lambda tp: None)
    monkeypatch.setattr(parallel_state, "_TP", TwoRanks(0, 1))
    sched = make_scheduler(
        reuse_model=False,
        poison_kv=False,
        model_path=make_tiny_hf_model("llama", tempfile.mkdtemp()),
        skip_tokenizer_init=True,
        mem_fraction_static=0.9,
    )
    plan = sched.model_runner.memory_plan
    assert plan.per_rank_available_gb == [6.0, 5.0]
    assert plan.available_after_weights_gb == 5.0
    expected = int((5.0 - 8.0 * (1 - 0.9)) * (1 << 30)) // plan.cell_size_bytes
    assert plan.max_total_num_tokens == expected


def test_server_with_tp2_matches_tp1_and_shuts_down():
    """SmolLM2 (9 query / 3 KV heads split unevenly) through a --tp-size 2 server: the same greedy tokens as the
    in-process TP=1 scheduler without overlap, text requests served, both ranks in the memory plan, and SIGTERM
    stops every process."""
    prompts = [[t % 500 for t in p] for p in PROMPTS]
    reference = make_scheduler(model_path=SMOLLM2, max_total_tokens=4096, disable_overlap_schedule=True)
    tp1 = run_scheduler(reference, prompts, greedy_params(NEW_TOKENS))
    proc = popen_launch_server(["--tp-size", "2", "--device", "cpu", "--max-total-tokens", "4096"])
    try:
        children = descendant_pids(proc.pid)
        assert len(children) >= 3  # two scheduler ranks and the detokenizer
        r = requests.post(
            f"{proc.base_url}/generate",
            json={"input_ids": prompts, "sampling_params": greedy_params(NEW_TOKENS)},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert [o["output_ids"] for o in r.json()] == [t.output_ids for t in tp1]
        r = requests.post(
            f"{proc.base_url}/generate",
            json={"text": "The capital of France is", "sampling_params": greedy_params(8)},
            timeout=120,
        )
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 8
        info = requests.get(f"{proc.base_url}/server_info", timeout=30).json()
        assert info["tp_size"] == 2 and len(info["memory_plan"]["per_rank_available_gb"]) == 2
    finally:
        kill_process_tree(proc.pid, signal.SIGTERM)
    proc.wait(30)
    assert wait_pids_gone([proc.pid, *children], 10) == []
