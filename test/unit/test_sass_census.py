"""benchmark/decode_roofline/sass_census.py: the opcode parser on disassembler lines, and one kernel case compiled for
sm_90 and counted end to end (where this triton build carries ptxas and nvdisasm)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang.test.gpu_utils import triton_has_gpu_tools

SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "decode_roofline" / "sass_census.py"


def _census_module():
    spec = importlib.util.spec_from_file_location("sass_census", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_opcodes_are_counted_with_predicates_and_modifiers_and_classed():
    census = _census_module()
    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 I2FP.F32.S32 R4, R5 ;
        /*0020*/               @P1 I2FP.F32.S32 R6, R7 ;
        /*0030*/                   HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0040*/                   LOP3.LUT R2, R3, 0xf, RZ, 0xc0, !PT ;
        /*0050*/                   F2FP.BF16.F32.PACK_AB R8, R9, R10 ;
      .L_x_1:
        /*0060*/                   EXIT ;
    """
    counts = census.opcode_counts(sass)
    assert counts == {"LDC": 1, "I2FP": 2, "HGMMA": 1, "LOP3": 1, "F2FP": 1, "EXIT": 1}
    classes = census.by_class(counts)
    assert classes["conversions"] == 3 and classes["tensor"] == 1 and classes["int"] == 1 and classes["other"] == 2
    assert sum(classes.values()) == sum(counts.values())


def _run_census(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The script in a process of its own that compiles for the GPU (not interpreted), its triton cache in tmp_path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(
    not triton_has_gpu_tools("ptxas", "nvdisasm"),
    reason="this triton build has no ptxas / nvdisasm to compile and read GPU code",
)
def test_one_case_compiled_for_sm90_and_counted(tmp_path):
    done = _run_census(tmp_path, "--match", "fused MoE sum over top-k", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "census.json").read_text())
    assert [r["case"] for r in rows] == ["fused MoE sum over top-k"]
    row = rows[0]
    assert row["instructions"] > 0 and sum(row["classes"].values()) == row["instructions"]
    assert row["classes"]["memory"] > 0  # it loads the slots' rows and stores their sum
    assert "| fused MoE sum over top-k |" in (tmp_path / "census.md").read_text()
    no_case = _run_census(tmp_path, "--match", "no such kernel")
    assert no_case.returncode != 0 and "no case" in no_case.stderr


@pytest.mark.skipif(
    not triton_has_gpu_tools("ptxas", "nvdisasm"),
    reason="this triton build has no ptxas / nvdisasm to compile and read GPU code",
)
def test_rings_show_the_latent_kernels_row_buffers_by_stage_count(tmp_path):
    """The rings column as benchmark/mla/README.md cites it: the MLA latent kernel compiled as launched (aligned
    pool rows) holds one buffer of its [64, 512] row tile at 2 stages (the default) and two at 5."""
    rings = {}
    for stages in (2, 5):
        out = tmp_path / f"s{stages}"
        done = _run_census(
            tmp_path, "--match", "MLA decode over", "--stages", str(stages), "--aligned", "--out", str(out)
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        (row,) = json.loads((out / "census.json").read_text())
        rings[stages] = dict(map(tuple, row["rings"]))
    assert rings[2]["64x512xbf16"] == 1 and rings[5]["64x512xbf16"] == 2, rings
