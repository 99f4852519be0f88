"""benchmark/mla/bench_mla_decode_parts.py (the latent kernel by knockout): its edits still match the kernel's lines,
its unedited copy computes what the kernel does, an edited one does not; the CPU smoke writes a row per variant and
slot layout. Under TRITON_INTERPRET=1 (set by conftest without a GPU)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from sglang.srt.layers.attention.triton_ops.mla_decode import mla_decode_fwd

SCRIPT = Path(__file__).resolve().parents[4] / "benchmark" / "mla" / "bench_mla_decode_parts.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_mla_decode_parts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_copy_matches_the_kernel_and_an_edited_copy_does_not(bench, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter's check (the GPU runs the benchmark itself)")
    q_latent, q_rope, cache, indptr, indices = bench.make_case(16, 2, 40, bench.KV_LORA, bench.ROPE, "cpu", 3)
    want = mla_decode_fwd(q_latent, q_rope, cache, indptr, indices, 0.1)
    full = bench.variant_module("full", bench.VARIANTS["full"], str(tmp_path))
    loads_only = bench.variant_module("loads only", bench.VARIANTS["loads only"], str(tmp_path))
    torch.testing.assert_close(full.mla_decode_fwd(q_latent, q_rope, cache, indptr, indices, 0.1), want)
    assert not torch.allclose(loads_only.mla_decode_fwd(q_latent, q_rope, cache, indptr, indices, 0.1), want)


def test_computed_slots_equal_the_loaded_ones_on_contiguous_slots(bench, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter's check (the GPU runs the benchmark itself)")
    q_latent, q_rope, cache, indptr, _ = bench.make_case(16, 2, 40, bench.KV_LORA, bench.ROPE, "cpu", 3)
    contiguous = torch.arange(1, cache.shape[0], dtype=torch.int32)
    want = mla_decode_fwd(q_latent, q_rope, cache, indptr, contiguous, 0.1)
    computed = bench.variant_module("computed slots", bench.VARIANTS["computed slots"], str(tmp_path))
    torch.testing.assert_close(computed.mla_decode_fwd(q_latent, q_rope, cache, indptr, contiguous, 0.1), want)


def test_an_edit_that_no_longer_matches_the_kernel_stops_with_its_line(bench, tmp_path):
    with pytest.raises(SystemExit, match="no longer has the line"):
        bench.variant_module("stale", {"    no such line\n": "    x = 1\n"}, str(tmp_path))


def test_cpu_smoke_writes_a_row_per_variant_and_slot_layout(bench, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke (on a GPU the script times the real shapes)")
    assert bench.main(["--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["slots"], r["variant"]) for r in rows} == {
        (slots, name)
        for slots in ("shuffled", "contiguous")
        for name in bench.VARIANTS
        if slots == "contiguous" or name not in bench.CONTIGUOUS_ONLY
    }
    assert all(r["us"] is None for r in rows)  # no timings off the GPU


def test_ncu_target_launches_the_latent_kernel(capsys):
    """benchmark/mla/ncu_mla_decode_target.py (run.sh ncu-mla's target) runs its launches (the interpreter's tiny
    case off the GPU) and says what it ran."""
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter's check (the GPU machine profiles the script itself)")
    spec = importlib.util.spec_from_file_location("ncu_target", SCRIPT.parent / "ncu_mla_decode_target.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--launches", "2"]) == 0
    assert "2 launches, batch 2, context 40, (2, 16, 512)" in capsys.readouterr().out
