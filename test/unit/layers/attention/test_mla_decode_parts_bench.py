"""benchmark/mla/bench_mla_decode_parts.py (the latent kernel by knockout): its edits still match the kernel's lines,
its unedited copy computes what the kernel does, an edited one does not; the CPU smoke writes a row per variant and
slot layout. Under TRITON_INTERPRET=1 (set by conftest without a GPU)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang.srt.layers.attention.triton_ops.mla_decode import mla_decode_fwd
from sglang.test.gpu_utils import triton_has_gpu_tools

SCRIPT = Path(__file__).resolve().parents[4] / "benchmark" / "mla" / "bench_mla_decode_parts.py"


def _load_script(filename: str):
    """A script of benchmark/mla/ imported as a module of its own name."""
    path = SCRIPT.parent / filename
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load_script(SCRIPT.name)


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


def test_cpu_smoke_with_a_kernel_config_names_it(bench, tmp_path):
    """--kernel-config (e.g. 3 stages: two row buffers for the computed slots) goes to every variant's launch and into
    the results."""
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke (on a GPU the script times the real shapes)")
    assert bench.main(["--kernel-config", "32,4,5", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["kernel_config"] == {"block_n": 32, "num_warps": 4, "num_stages": 5}
    assert "kernel config {'block_n': 32, 'num_warps': 4, 'num_stages': 5}" in (tmp_path / "results.md").read_text()
    assert len(results["rows"]) == 2 * len(bench.VARIANTS) - len(bench.CONTIGUOUS_ONLY)


def test_ncu_target_launches_the_latent_kernel(capsys):
    """benchmark/mla/ncu_mla_decode_target.py (run.sh ncu-mla's target) runs its launches (the interpreter's tiny
    case off the GPU) and says what it ran."""
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter's check (the GPU machine profiles the script itself)")
    module = _load_script("ncu_mla_decode_target.py")
    assert module.main(["--launches", "2"]) == 0
    assert "2 launches, batch 2, context 40, (2, 16, 512)" in capsys.readouterr().out


def _sass_listing() -> str:
    """A listing shaped like ncu's `--page source --print-source sass --csv` (its column names, the target's print
    and ncu's lines before the header), three instructions."""
    reasons = ["stall_barrier", "stall_long_sb", "stall_wait"]
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    header += reasons + [f"{r} (Not Issued)" for r in reasons]
    rows = [
        ["0x7f0000000000", "      LDG.E R7, desc[UR14][R2.64]", "2", "512", "0", "2", "0", "0", "2", "0"],
        ["0x7f0000000660", "      DEPBAR.LE SB0, 0x0", "10", "4,096", "0", "0", "10", "0", "0", "10"],
        ["0x7f0000000670", "      BAR.SYNC.DEFER_BLOCKING 0x0", "841", "4,096", "1", "837", "3", "1", "837", "3"],
    ]
    lines = ["==PROF== Connected to process 845", "ncu target: 5 launches", '"Kernel Name","_mla_decode_stage1",']
    lines += [",".join(f'"{v}"' for v in row) for row in [header, *rows]]
    return "\n".join(lines) + "\n"


def _hotspots():
    return _load_script("ncu_sass_hotspots.py")


def test_sass_hotspots_rank_instructions_and_reasons():
    """benchmark/mla/ncu_sass_hotspots.py (run.sh ncu-mla's source page): offsets from the first instruction, the
    barrier first with its leading reason, the reasons summed over the kernel, thousands separators read."""
    hotspots = _hotspots()
    instructions = hotspots.parse(_sass_listing())
    assert [(i.offset, i.opcode, i.samples, i.executed) for i in instructions] == [
        (0x0, "LDG.E", 2, 512),
        (0x660, "DEPBAR.LE", 10, 4096),
        (0x670, "BAR.SYNC.DEFER_BLOCKING", 841, 4096),
    ]
    text = hotspots.report(instructions, top=2)
    assert "3 instructions, 853 warp-stall samples" in text
    assert "| long_sb | 839 | 98.4% |" in text
    listed = [line for line in text.splitlines() if line.startswith("| 0x")]
    assert len(listed) == 2 and listed[0].startswith("| 0x670 | `BAR.SYNC.DEFER_BLOCKING 0x0` | 841 | 98.6% | 4096 |")
    assert "long_sb 837, wait 3, barrier 1" in listed[0]
    assert "| LDG.E | 1 | 512 |" in text


def test_sass_hotspots_refuse_a_file_that_is_not_a_source_page():
    with pytest.raises(ValueError, match="not an ncu --page source"):
        _hotspots().parse("==PROF== Connected\nno table here\n")


@pytest.mark.skipif(not triton_has_gpu_tools("ptxas"), reason="this triton build has no ptxas to compile GPU code with")
def test_buffers_mode_shows_two_row_buffers_at_3_stages_without_the_slot_load(tmp_path):
    """--buffers (compiled for sm_90, no GPU), as benchmark/mla/README.md cites it: at 3 stages the full kernel holds
    one buffer of its [64, 512] row tile (the slot load takes a stage) and the computed-slots variant two; loads only
    holds none (its rows are plain loads)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--buffers", "3", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert set(rows) == {"full", "no latent QK dot", "no PV dot", "loads only", "computed slots"}
    depth = {v: dict(map(tuple, r["rings"])).get("64x512xbf16", 0) for v, r in rows.items()}
    assert depth["full"] == 1 and depth["computed slots"] == 2 and depth["loads only"] == 0, depth
    assert rows["computed slots"]["shared"] > rows["full"]["shared"]
