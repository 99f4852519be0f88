"""Static KV sizing on the GPU for the Llama-3.1-8B shape with default flags: the pool has exactly the
token count DESIGN 3.1's formulas predict from the inputs the memory plan logged."""

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=180, suite="per-commit-cuda")

import pytest

from sglang.test.gpu_utils import REQUIRES_GPU_REASON, has_gpu, shape_config_dir

pytestmark = pytest.mark.skipif(not has_gpu(), reason=REQUIRES_GPU_REASON)

GiB = 1 << 30


def test_static_sizing_matches_formula(monkeypatch):
    import sglang
    from sglang.srt.environ import envs

    monkeypatch.delenv(envs.SGLANG_ENABLE_POST_CAPTURE_KV_SIZING.name, raising=False)
    engine = sglang.Engine(
        model_path=shape_config_dir("Llama-3.1-8B"), load_format="dummy", skip_tokenizer_init=True, log_level="warning"
    )
    try:
        info = engine.get_server_info()
        out = engine.generate(input_ids=[1, 2, 3, 4], sampling_params={"max_new_tokens": 4, "temperature": 0})
    finally:
        engine.shutdown()
    plan = info["memory_plan"]
    assert plan["path"] == "static"
    # Default mem_fraction_static from the device capacity (MiB) and the H200 tier (chunk 8192, graph bs 256).
    cap_mib = plan["device_capacity_gb"] * 1024
    reserved = 512 + max(info["chunked_prefill_size"], 2048) * 1.5 + 1 * 1 / 8 * 1024 + info["cuda_graph_max_bs"] * 2
    if cap_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    assert plan["mem_fraction_static"] == round((cap_mib - reserved) / cap_mib, 3)
    # KV cell: 8 kv heads * (128 + 128) * 32 layers * 2 bytes.
    assert plan["cell_size_bytes"] == 8 * 256 * 32 * 2
    rest_gb = plan["available_after_weights_gb"] - plan["pre_model_load_memory_gb"] * (1 - plan["mem_fraction_static"])
    predicted = int(rest_gb * GiB) // plan["cell_size_bytes"] // plan["page_size"] * plan["page_size"]
    print(f"static sizing: predicted {predicted}, got {plan['max_total_num_tokens']}; plan {plan}")
    assert plan["max_total_num_tokens"] == predicted == info["max_total_num_tokens"]
    assert plan["weights_gb"] == pytest.approx(16.06e9 / GiB, rel=0.02)
    assert len(out["output_ids"]) == 4
