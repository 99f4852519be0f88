from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

# A checkpoint whose config.json declares a quantization we do not run (AWQ, GPTQ, a made-up method) is
# refused at start-up by name, with the supported list, before any weight is read: the directory's
# model.safetensors is garbage, so reading it would fail with a different error. Both entry points:
# `python -m sglang.launch_server` (argparse's exit 2) and sglang.Engine (ServerArgsError, no process started).

import json
import subprocess
import sys

import pytest

import sglang
from sglang.srt.configs.model_config import ModelConfig, load_hf_config
from sglang.srt.model_loader.model_source import resolve_model_source
from sglang.srt.server_args import ServerArgsError
from sglang.test.runners import tiny_config
from sglang.test.test_utils import server_env

CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "made-up": {"quant_method": "ternary-magic", "bits": 1.58},
}
NAMES = {"awq": "'awq'", "gptq": "'gptq'", "made-up": "'ternary-magic'"}


def checkpoint(tmp_path, kind: str) -> str:
    d = tmp_path / kind
    tiny_config("llama").save_pretrained(d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "quantization_config": CONFIGS[kind]}))
    (d / "model.safetensors").write_bytes(b"\xff" * 64)  # unreadable: opening it would raise elsewhere
    return str(d)


def assert_names_the_method(message: str, kind: str) -> None:
    assert "quantization_config" in message and NAMES[kind] in message, message[-2000:]
    assert "fp8 (weight_block_size [128, 128]" in message, message[-2000:]  # and lists what we run
    assert "SafetensorError" not in message and "Traceback" not in message, message[-2000:]


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_cli_refuses_by_name(tmp_path, kind):
    d = checkpoint(tmp_path, kind)
    result = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", d, "--device", "cpu", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=server_env(),
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"--model-path {d}" in result.stderr
    assert_names_the_method(result.stderr, kind)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_engine_refuses_by_name(tmp_path, kind):
    d = checkpoint(tmp_path, kind)
    with pytest.raises(ServerArgsError) as e:
        sglang.Engine(model_path=d, device="cpu")
    assert_names_the_method(str(e.value), kind)
    # ModelConfig, built without ServerArgs (benchmarks, the scheduler), refuses the same way.
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf_config(load_hf_config(resolve_model_source(d)))
    assert_names_the_method(str(e.value), kind)
