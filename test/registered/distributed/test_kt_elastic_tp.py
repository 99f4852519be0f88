"""The elastic KT prefill slot with tensor parallelism, on CPU ranks (gloo): every rank takes the pool's
tail before the same step and gives it back after the same step, because the decision is the scheduler's
and every rank's scheduler state is the same. The slot's memory comes from host bytes here
(SGLANG_TEST_CPU_ELASTIC_SLOT_TAIL_TOKENS; on the GPU the VMM arena remaps it: test_kt_elastic_slot_gpu.py),
and --tp-size 2 generates exactly what --tp-size 1 does."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

import re

from sglang.test.runners import greedy_params, make_scheduler, make_tiny_qwen3_moe, run_scheduler

THRESHOLD = 32
LONG = [(11 * i) % 500 + 3 for i in range(48)]
SHORT = [[7, 8, 9], [40, 41, 42, 43]]
TP_OVERRIDES = dict(vocab_size=512, max_position_embeddings=512, norm_topk_prob=True, initializer_range=0.08)
STEP_LINE = re.compile(r"\[[^\]]* (TP\d)\] KT prefill slot: (taken|given back)\b.* step (\d+)")


def test_every_rank_takes_and_returns_the_slot_in_the_same_step(capfd, monkeypatch):
    import sglang
    from sglang.srt.environ import envs

    model = make_tiny_qwen3_moe(seed=3, **TP_OVERRIDES)[0]
    args = dict(model_path=model, skip_tokenizer_init=True, kt_method="BF16", kt_num_gpu_experts=3,
                kt_gpu_prefill_token_threshold=THRESHOLD)  # fmt: skip
    prompts = SHORT + [LONG]
    tp1 = run_scheduler(make_scheduler(max_total_tokens=4096, **args), prompts, greedy_params(8))
    monkeypatch.setenv(envs.SGLANG_TEST_CPU_ELASTIC_SLOT_TAIL_TOKENS.name, "1024")  # the children read it
    engine = sglang.Engine(tp_size=2, device="cpu", max_total_tokens=4096, log_level="info", **args)
    try:
        short = engine.generate(input_ids=SHORT, sampling_params=greedy_params(8))  # 7 tokens: no slot
        long = engine.generate(input_ids=LONG, sampling_params=greedy_params(8))  # 48 tokens: takes it
        info = engine.get_server_info()
    finally:
        engine.shutdown()
    assert [o["output_ids"] for o in short] + [long["output_ids"]] == [r.output_ids for r in tp1]
    slot = info["memory_plan"]["kt_slot"]
    assert (slot["takes"], slot["returns"], slot["lent"], slot["tail_tokens"]) == (1, 1, False, 1024)
    events = {}
    for rank, what, step in STEP_LINE.findall(capfd.readouterr().err):
        events.setdefault(rank, []).append((what, int(step)))
    assert set(events) == {"TP0", "TP1"}, events
    assert events["TP0"] == events["TP1"] and [w for w, _ in events["TP0"]] == ["taken", "given back"]
