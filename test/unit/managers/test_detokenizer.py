"""Incremental detokenization: deltas add up to the full text, incomplete UTF-8 is held back, the stop
token is not part of the text, and a stream never shows a stop string's beginning that the final
(trimmed) text does not contain."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")

import pytest

from sglang.srt.managers.detokenizer_manager import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    return get_tokenizer("SmolLM2-135M-Instruct")


def _stream(detok, ids, finish, stop_len=0):
    deltas = []
    for i, tok in enumerate(ids):
        last = i == len(ids) - 1
        deltas.append(detok.step("r", [tok], finish if last else None, True, True, False, stop_len))
    return deltas


def test_deltas_add_up_and_utf8_is_held_back(tokenizer):
    text = "Héllo wörld 你好, fine."
    ids = tokenizer.encode(text)
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids, {"type": "length", "length": len(ids)})
    assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_stop_token_is_not_in_the_text(tokenizer):
    ids = tokenizer.encode("Paris.") + [tokenizer.eos_token_id]
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids, {"type": "stop", "matched": tokenizer.eos_token_id})
    assert "".join(deltas) == tokenizer.decode(ids[:-1])


def test_stream_never_shows_a_trimmed_stop_string(tokenizer):
    ids = tokenizer.encode(" Paris.\n\nThe")  # the scheduler finishes at the token completing the stop
    stop = "\n\nThe"
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids, {"type": "stop", "matched": stop}, stop_len=len(stop))
    final = "".join(deltas)
    assert final == " Paris."
    shown = ""
    for d in deltas:
        shown += d
        assert final.startswith(shown)  # no delta ever had to be taken back
