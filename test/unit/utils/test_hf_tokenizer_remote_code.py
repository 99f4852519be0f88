"""--trust-remote-code and tokenizers: a tokenizer that ships its own Python (Kimi-K2's tiktoken one) is refused
with a message naming the flag, and runs its code only when the flag is given."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

import json

import pytest

from sglang.srt.server_args import ServerArgs, parse_server_args
from sglang.srt.utils.hf_tokenizer import get_tokenizer


@pytest.fixture()
def custom_tokenizer_dir(tmp_path):
    config = {"tokenizer_class": "MyTok", "auto_map": {"AutoTokenizer": ["tokenization_my.MyTok", None]}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenization_my.py").write_text("raise RuntimeError('the tokenizer code ran')\n")
    return str(tmp_path)


def test_custom_tokenizer_code_needs_the_flag(custom_tokenizer_dir):
    with pytest.raises(ValueError, match="--trust-remote-code"):
        get_tokenizer(custom_tokenizer_dir)
    with pytest.raises(RuntimeError, match="the tokenizer code ran"):  # with the flag its code does run
        get_tokenizer(custom_tokenizer_dir, trust_remote_code=True)


def test_the_flag_is_parsed_and_shown():
    assert parse_server_args(["--trust-remote-code", "--device", "cpu"]).trust_remote_code
    args = ServerArgs(device="cpu")
    assert args.trust_remote_code is False and args.to_public_dict()["trust_remote_code"] is False
