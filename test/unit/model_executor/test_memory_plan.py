from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# MemoryPlan: the start-up table names every term, aligned, with optional rows only when they apply.

from sglang.srt.model_executor.memory_plan import GiB, MemoryPlan


def _plan(**kw):
    base = dict(
        device="cuda",
        tp_size=2,
        mem_fraction_static=0.835,
        device_capacity_gb=79.65,
        pre_model_load_memory_gb=78.9,
        weights_gb=15.25,
        available_after_weights_gb=63.5,
        headroom_gb=13.0,
        headroom_rule="pre_model_load_memory * (1 - mem_fraction_static)",
        cell_size_bytes=131072,
        page_size=16,
        max_total_num_tokens=400000,
        kv_pool_gb=48.83,
        max_running_requests=2048,
        req_to_token_gb=0.066,
        cuda_graph_gb=0.75,
        cuda_graph_max_bs=256,
    )
    base.update(kw)
    return MemoryPlan(**base)


def test_table_names_every_term_aligned():
    text = _plan().format_table()
    lines = text.splitlines()
    assert lines[0] == "Memory plan:"
    body = lines[1:]
    # Every row is "  <name padded> | <value>", the bars in one column.
    assert len({line.index(" | ") for line in body}) == 1
    rows = {line.split(" | ")[0].strip(): line.split(" | ", 1)[1] for line in body}
    assert rows["path"] == "static"
    assert rows["device"] == "cuda x2 rank(s), capacity 79.65 GiB"
    assert rows["mem_fraction_static"] == "0.835"
    assert rows["free before weights"] == "78.90 GiB"
    assert rows["weights"] == "15.25 GiB"
    assert rows["free after weights"] == "63.50 GiB"
    assert rows["headroom"] == "13.00 GiB (pre_model_load_memory * (1 - mem_fraction_static))"
    assert rows["KV cell size"] == "131072 bytes/token"
    assert rows["KV pool"] == "48.83 GiB = 400000 tokens (page 16)"
    assert rows["req_to_token"] == "0.066 GiB for 2048 running requests"
    assert rows["CUDA graphs"] == "0.750 GiB measured (max bs 256)"
    # Optional rows are absent when they do not apply.
    for name in (
        "activation peak",
        "static path would give",
        "SGLang headroom rule",
        "token cap",
        "free after start-up",
        "note",
    ):
        assert name not in rows


def test_optional_rows_and_reservations():
    plan = _plan(
        path="post-capture",
        path_reason="flag on",
        activation_peak_gb=1.234,
        static_equivalent_tokens=390000,
        sglang_rule_tokens=380000,
        token_cap_reason="--max-total-tokens 100000",
        free_after_plan_gb=2.5,
        notes=["hello"],
        reservations_bytes={"kt_prefill_slot": 3 * GiB // 2},
    )
    text = plan.format_table()
    rows = {line.split(" | ")[0].strip(): line.split(" | ", 1)[1] for line in text.splitlines()[1:]}
    assert rows["path"] == "post-capture (flag on)"
    assert rows["reservation: kt_prefill_slot"] == f"1.500 GiB ({3 * GiB // 2} bytes)"
    assert rows["activation peak"] == "1.234 GiB measured"
    assert rows["static path would give"] == "390000 tokens"
    assert rows["SGLang headroom rule"] == "380000 tokens"
    assert rows["token cap"] == "--max-total-tokens 100000"
    assert rows["free after start-up"] == "2.50 GiB"
    assert rows["note"] == "hello"
    assert len({line.index(" | ") for line in text.splitlines()[1:]}) == 1
    d = plan.to_dict()
    assert d["reservations_gb"] == 1.5 and d["max_total_num_tokens"] == 400000 and d["path"] == "post-capture"


# The keys /server_info serves under memory_plan: clients and the GPU tests read them.
SERVER_INFO_KEYS = {
    "device",
    "tp_size",
    "path",
    "path_reason",
    "mem_fraction_static",
    "device_capacity_gb",
    "pre_model_load_memory_gb",
    "weights_gb",
    "available_after_weights_gb",
    "headroom_gb",
    "headroom_rule",
    "reservations_bytes",
    "reservation_rule",
    "lendable_tail_tokens",
    "cell_size_bytes",
    "page_size",
    "max_total_num_tokens",
    "kv_pool_gb",
    "swa_layers",
    "swa_max_total_num_tokens",
    "max_running_requests",
    "req_to_token_gb",
    "cuda_graph_gb",
    "cuda_graph_max_bs",
    "activation_peak_gb",
    "free_after_plan_gb",
    "token_cap_reason",
    "per_rank_available_gb",
    "notes",
    "static_equivalent_tokens",
    "sglang_rule_tokens",
    "post_capture_budget_bytes",
    "reservations_gb",
}


def _report(post_capture: bool):
    from sglang.srt.model_executor.pool_configurator import (
        CaptureReadings,
        KVGeometry,
        MemoryReadings,
        PoolArgs,
        SizingPath,
        post_capture_pool_size,
        static_pool_size,
    )

    kv = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, v_head_dim=128, dtype_bytes=2)
    readings = MemoryReadings(
        device_capacity_bytes=80 * GiB,
        free_before_weights_bytes=78 * GiB,
        free_after_weights_bytes=62 * GiB,
        kv=kv,
        page_size=16,
        reservations_bytes={"kt_full_gpu_prefill_slot": GiB // 2},
        vmm_granularity_bytes=2 << 20,
    )
    capture = CaptureReadings(
        graph_bytes=GiB // 4, captured_graph_max_bs=256, free_after_capture_bytes=60 * GiB, activation_peak_bytes=GiB
    )
    args = PoolArgs(
        mem_fraction_static=0.875,
        static_mem_fraction_static=0.835,
        max_total_tokens=None,
        max_running_requests=256,
        context_len=8192,
        activation_reserve_bytes=10 * GiB,
    )
    pool = post_capture_pool_size(readings, capture, args) if post_capture else static_pool_size(readings, args)
    path = SizingPath(post_capture, "why")
    plan = MemoryPlan.report(
        readings,
        capture,
        pool,
        path,
        args,
        device="cuda",
        tp_size=2,
        weights_bytes=16 * GiB,
        per_rank_free_after_weights_bytes=[62 * GiB, 63 * GiB],
        req_to_token_bytes=GiB // 8,
        cuda_graph_max_bs=256,
        free_after_start_up_bytes=3 * GiB,
        notes=["n"],
    )
    return plan, readings, pool


def test_report_is_built_from_readings_and_pool_size():
    plan, readings, pool = _report(post_capture=False)
    assert set(plan.to_dict()) == SERVER_INFO_KEYS
    assert (plan.path, plan.path_reason, plan.tp_size) == ("static", "why", 2)
    assert plan.max_total_num_tokens == pool.tokens and plan.max_running_requests == pool.max_running_requests == 256
    assert plan.headroom_gb == pool.headroom_bytes / GiB and plan.headroom_rule == pool.headroom_rule
    assert plan.pre_model_load_memory_gb == 78 and plan.available_after_weights_gb == 62 and plan.weights_gb == 16
    assert plan.cell_size_bytes == readings.kv.cell_size_bytes and plan.page_size == 16
    assert plan.kv_pool_gb == pool.tokens * readings.kv.cell_size_bytes / GiB
    assert plan.reservations_bytes == {"kt_full_gpu_prefill_slot": GiB // 2} and plan.reservations_gb == 0.5
    assert plan.cuda_graph_gb == 0.25 and plan.req_to_token_gb == 0.125 and plan.free_after_plan_gb == 3
    assert plan.per_rank_available_gb == [62, 63] and plan.notes == ["n"]
    assert plan.post_capture_budget_bytes is None and plan.static_equivalent_tokens is None
    post, _, post_pool = _report(post_capture=True)
    assert set(post.to_dict()) == SERVER_INFO_KEYS and post.path == "post-capture"
    assert post.post_capture_budget_bytes == post_pool.budget_bytes
    assert post.static_equivalent_tokens == post_pool.static_equivalent_tokens is not None
    assert post.activation_peak_gb == 1.0


def test_estimated_tables_say_so():
    plan, _, _ = _report(post_capture=True)
    measured, estimated = plan.format_table(), plan.format_table(measured=False)
    assert "GiB measured (max bs 256)" in measured and "estimated" not in measured
    assert "GiB estimated (max bs 256)" in estimated and "1.000 GiB estimated" in estimated
