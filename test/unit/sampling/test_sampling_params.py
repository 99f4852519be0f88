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
    ({"n": 0}, "n must be in"),
    ({"n": 65}, "n must be in"),
    ({"seed": "abc"}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"sampling_seed": -(2**63) - 1}, "seed"),
    ({"top_k": 2**63}, "top_k"),
    ({"max_new_tokens": 2**40}, "max_new_tokens"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": float("inf")}, "top_p"),
    ({"skip_special_tokens": 5}, "skip_special_tokens"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"no_stop_trim": 1}, "no_stop_trim"),
    ({"spaces_between_special_tokens": None, "stream_interval": 0}, "stream_interval"),
    ({"stop": ["x"] * 129}, "stop"),
    ({"stop": "x" * 1025}, "stop"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 1000}}, "logit_bias"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    # Unicode digits are no token ids: "²".isdigit() (int() refuses it: once a 500), "١" (int() reads 1: once
    # silently token 1), "٣٤" likewise.
    ({"logit_bias": {"²": 1}}, "logit_bias"),
    ({"logit_bias": {"١": 1}}, "logit_bias"),
    ({"logit_bias": {"٣٤": 1}}, "logit_bias"),
    ({"regex": ""}, "regex"),
    ({"regex": 5}, "regex"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"structural_tag": "[1, "}, "structural_tag"),
    ({"ebnf": 'root ::= "a"', "regex": "a"}, "regex"),  # at most one constraint per request
    ({"stop_regex": "("}, "stop_regex"),  # does not compile
    ({"stop_regex": "a*"}, "stop_regex"),  # matches the empty string
    ({"stop_regex": ["ok", 3]}, "stop_regex"),
    ({"stop_regex": ["x"] * 17}, "stop_regex"),
    ({"custom_params": {"a": 1}}, "custom_params"),
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


def test_upstream_keys_at_their_defaults_are_accepted():
    """SGLang's frontend sends every key, the unsupported ones as null."""
    p = SamplingParams.from_dict(
        {
            "max_new_tokens": 4,
            "stop": [],
            "stop_token_ids": [],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": -1,
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            "min_new_tokens": 0,
            "n": 1,
            "ignore_eos": False,
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "no_stop_trim": False,
            "regex": None,
            "json_schema": None,
            "ebnf": None,
            "structural_tag": None,
            "stop_regex": None,
            "custom_params": None,
            "stream_interval": None,
            "logit_bias": None,
            "sampling_seed": None,
        }
    )
    assert p.max_new_tokens == 4 and p.stop_strs == [] and p.logit_bias_ids == {}


def test_seeds_wrap_into_int64_and_logit_bias_parses():
    from sglang.srt.sampling.sampling_params import to_int64

    assert SamplingParams.from_dict({"seed": 2**63}).sampling_seed == 2**63
    assert to_int64(2**63) == -(2**63) and to_int64(2**64 - 1) == -1 and to_int64(5) == 5
    p = SamplingParams.from_dict({"logit_bias": {"5": -100, "7": 2.5}, "n": 3})
    p.verify(vocab_size=10)
    assert p.logit_bias_ids == {5: -100.0, 7: 2.5} and p.n == 3
    with pytest.raises(SamplingParamsError, match="logit_bias"):
        p.logit_bias = {"12": 1.0}
        p.verify(vocab_size=10)


def test_changed_fields_are_what_the_request_set_with_grammars_by_length():
    """What --log-requests shows: nothing for the defaults (upstream's keys at their defaults included), the values
    a request set, a grammar as its length (it may be long, or private), no derived field."""
    assert SamplingParams.from_dict({"n": 1, "stop": None, "temperature": 1.0}).changed_fields() == {}
    p = SamplingParams.from_dict({"max_new_tokens": 3, "temperature": 0, "stop": "x", "regex": "(yes|no)"})
    assert p.changed_fields() == {"max_new_tokens": 3, "temperature": 0, "stop": "x", "regex": "<8 chars>"}
    assert p.stop_strs == ["x"]  # derived from stop, and not shown
