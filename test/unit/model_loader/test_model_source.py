from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

# A tokenizer needs no weights: `--load-format dummy --model-path DIR` with DIR = config.json + a
# tokenizer, and `--tokenizer-path` to a tokenizer-only directory, both load it; a directory with
# neither tokenizer files nor a GGUF is refused naming the flag and the way out.

import json

import pytest

from sglang.srt.model_loader.model_source import resolve_model_source, resolve_tokenizer_source
from sglang.srt.server_args import ServerArgsError
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    get_tokenizer(SMOLLM2).save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return str(path)


def test_weightless_directory_serves_its_tokenizer(tokenizer_dir):
    assert resolve_model_source(tokenizer_dir, "dummy").kind == "hf"
    with pytest.raises(ServerArgsError, match="safetensors"):  # real weights are still required without dummy
        resolve_model_source(tokenizer_dir, "auto")
    assert resolve_tokenizer_source(tokenizer_dir).kind == "hf"
    tok = get_tokenizer(tokenizer_dir)
    assert tok.decode(tok.encode("The capital of France")) == get_tokenizer(SMOLLM2).decode(
        get_tokenizer(SMOLLM2).encode("The capital of France")
    )


def test_builtin_and_missing(tmp_path):
    assert resolve_tokenizer_source(SMOLLM2).kind == "gguf"
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ServerArgsError, match="--tokenizer-path .*--skip-tokenizer-init"):
        resolve_tokenizer_source(str(tmp_path))
    with pytest.raises(ServerArgsError, match="no such file"):
        resolve_tokenizer_source(str(tmp_path / "nope"))


def test_cli_refuses_a_format_we_do_not_run_before_importing_torch(tmp_path):
    """check_model_path reads config.json's quantization_config as JSON: the launcher refuses an AWQ checkpoint
    by name (argparse's exit 2) without importing torch or transformers (resolve would, seconds later)."""
    import subprocess
    import sys

    from sglang.srt.model_loader.model_source import check_model_path

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "quantization_config": {"quant_method": "awq"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)  # never opened
    with pytest.raises(ServerArgsError, match=f"--model-path {tmp_path}: quantization_config: quant_method 'awq'"):
        check_model_path(str(tmp_path))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({**config, "quantization_config": None}))
    assert check_model_path(str(tmp_path / "plain"), "dummy").kind == "hf"  # full precision: resolve's to read
    code = (
        "import sys\nfrom sglang.launch_server import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    print(e.code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code, "--model-path", str(tmp_path), "--port", "1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.stdout.strip() == "2 []", run.stdout + run.stderr[-2000:]
    assert "quant_method 'awq' is not supported" in run.stderr
