from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# MemoryPlan: the start-up table names every term, aligned, with optional rows only when they apply.

from sglang.srt.model_executor.memory_plan import GiB, MemoryPlan


def _plan(**kw):
    base = dict(
        device="cuda", tp_size=2, mem_fraction_static=0.835, device_capacity_gb=79.65,
        pre_model_load_memory_gb=78.9, weights_gb=15.25, available_after_weights_gb=63.5,
        headroom_gb=13.0, headroom_rule="pre_model_load_memory * (1 - mem_fraction_static)",
        cell_size_bytes=131072, page_size=16, max_total_num_tokens=400000, kv_pool_gb=48.83,
        max_running_requests=2048, req_to_token_gb=0.066, cuda_graph_gb=0.75, cuda_graph_max_bs=256,
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
    for name in ("activation peak", "static path would give", "SGLang headroom rule", "token cap",
                 "free after start-up", "note"):
        assert name not in rows


def test_optional_rows_and_reservations():
    plan = _plan(
        path="post-capture", path_reason="flag on", activation_peak_gb=1.234, static_equivalent_tokens=390000,
        sglang_rule_tokens=380000, token_cap_reason="--max-total-tokens 100000", free_after_plan_gb=2.5,
        notes=["hello"], reservations_bytes={"kt_prefill_slot": 3 * GiB // 2},
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
