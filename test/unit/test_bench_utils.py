"""The benchmarks' shared result writer (the GPU timer is exercised by the benchmarks on the GPU machine)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="per-commit-cpu")

import json

from sglang.test.bench_utils import write_results


def test_write_results_writes_json_and_markdown(tmp_path):
    out = tmp_path / "new_dir"
    write_results(str(out), {"rows": [{"batch": 1, "ms": 4.8}]}, "| batch | ms |\n|---|---|\n| 1 | 4.8 |\n\n")
    assert json.loads((out / "results.json").read_text()) == {"rows": [{"batch": 1, "ms": 4.8}]}
    assert (out / "results.md").read_text() == "| batch | ms |\n|---|---|\n| 1 | 4.8 |\n"  # one final newline


def test_write_results_under_another_name(tmp_path):
    """A second shape's rows beside the first's (bench_kt_decode.py --shape DeepSeek-V3: results_deepseek_v3.*)."""
    write_results(str(tmp_path), {"rows": []}, "| a |\n", name="results_deepseek_v3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results_deepseek_v3.json", "results_deepseek_v3.md"]
