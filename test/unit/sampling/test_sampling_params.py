from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# SamplingParams: SGLang's names and defaults; every bad value is refused with a message naming the field.

import pytest

from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError


def test_defaults_and_greedy():
    p = SamplingParams.from_dict(None)
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (128, 1.0, 1.0, -1, 0.0)
    assert not p.is_greedy and not p.has_penalties
    assert SamplingParams.from_dict({"temperature": 0}).is_greedy
    assert SamplingParams.from_dict({"top_k": 1}).is_greedy
    assert SamplingParams.from_dict({"repetition_penalty": 1.1}).has_penalties


def test_seed_alias_and_stop_strings():
    p = SamplingParams.from_dict({"seed": 7, "stop": "###"})
    assert p.sampling_seed == 7
    assert p.stop_strs == ["###"] and p.stop_str_max_len == 3
    p = SamplingParams.from_dict({"stop": ["a", "bcd"]})
    assert p.stop_strs == ["a", "bcd"] and p.stop_str_max_len == 3
    # None means "default", as JSON clients send it.
    assert SamplingParams.from_dict({"top_p": None}).top_p == 1.0


BAD = [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 3}, "min_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"n": 2}, "n must be 1"),
    ({"seed": "abc"}, "seed"),
    ({"stop": ""}, "stop"),
    ({"stop": ["ok", 3]}, "stop"),
    ({"stop_token_ids": [1, "x"]}, "stop_token_ids"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"bogus": 1}, "bogus"),
]


@pytest.mark.parametrize("d,field", BAD, ids=[repr(d) for d, _ in BAD])
def test_bad_values_are_refused_naming_the_field(d, field):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams.from_dict(d)
    assert field in str(e.value)


def test_stop_token_ids_checked_against_vocab():
    p = SamplingParams.from_dict({"stop_token_ids": [3, 600]})
    p.verify(vocab_size=1000)
    with pytest.raises(SamplingParamsError, match="stop_token_ids"):
        p.verify(vocab_size=512)
