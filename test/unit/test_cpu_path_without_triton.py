"""The README's first command installs no triton (it comes with the gpu / test extras): the CPU server's
modules must import without it."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

import subprocess
import sys

CPU_SERVER_MODULES = [
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.llama",
    "sglang.srt.models.qwen3_moe",
    "sglang.srt.layers.linear",
]


def test_cpu_server_modules_import_without_triton():
    code = "import sys\nsys.modules['triton'] = None  # `import triton` now raises ImportError\n" + "".join(
        f"import {m}\n" for m in CPU_SERVER_MODULES
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # The guard itself works: triton is really unimportable in that process.
    blocked = subprocess.run(
        [sys.executable, "-c", "import sys\nsys.modules['triton'] = None\nimport triton"], capture_output=True
    )
    assert blocked.returncode != 0
