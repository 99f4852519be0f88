from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

# Request bodies: strict JSON (no NaN, no out-of-range floats, bounded nesting, valid Unicode), and
# /generate's upstream GenerateReqInput fields: honoured ones typed and range-checked, those of
# features we lack accepted at their default and refused by name when set, unknown keys ignored.

import pytest

from sglang.srt.entrypoints.http_utils import MAX_JSON_DEPTH, decode_json_body
from sglang.srt.entrypoints.native_protocol import GenerateRequest, to_generate_input
from sglang.srt.managers.tokenizer_manager import RequestError


@pytest.mark.parametrize(
    "raw,word",
    [
        (b'{"a": NaN}', "NaN"),
        (b'{"a": -Infinity}', "Infinity"),
        (b'{"a": 1e400}', "out of range"),
        (b'{"text": "\\ud800"}', "text: not valid Unicode"),
        (b'{"ok": {"k\\udfff": 1}}', "not valid Unicode"),
        (b"[1, 2]", "JSON object"),
        (b'"x"', "JSON object"),
        (b"", "JSON object"),
        (b'{"a": ', "malformed JSON"),
        (b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nested"),
        (b'{"a": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}", "nested deeper"),
        (b'{"a": 1' + b"0" * 5000 + b"}", "malformed JSON"),
    ],
)
def test_bad_bodies_are_400s_naming_the_problem(raw, word):
    with pytest.raises(RequestError) as e:
        decode_json_body(raw)
    assert e.value.status_code == 400 and word in e.value.message, e.value.message


def test_good_body():
    assert decode_json_body(b'{"text": "h\\u00e9", "x": [[1.5]]}') == {"text": "hé", "x": [[1.5]]}


def parse(**body):
    return to_generate_input(GenerateRequest.model_validate(body))


def test_upstream_client_fields_at_default_are_accepted():
    # What sglang.bench_serving (0.4.6 and 0.5.x) and the frontend language send on every request.
    obj, rids = parse(
        text="hi",
        sampling_params={"max_new_tokens": 2},
        stream=True,
        lora_path=None,
        return_logprob=False,
        logprob_start_len=-1,
        return_routed_experts=False,
        image_data=None,
        return_hidden_states=False,
        top_logprobs_num=0,
        return_text_in_logprobs=True,
        modalities=[],
        data_parallel_rank=None,
        custom_logit_processor=None,
        some_future_field={"x": 1},
    )
    assert obj.text == "hi" and obj.stream and len(rids) == 1 and obj.return_text_in_logprobs


@pytest.mark.parametrize(
    "body,word",
    [
        ({"lora_path": "adapter-1"}, "lora_path: LoRA adapters"),
        ({"image_data": "http://x/cat.png"}, "image_data: image inputs"),
        ({"return_hidden_states": True}, "return_hidden_states"),
        ({"session_params": {"id": "s"}}, "session_params"),
        ({"data_parallel_rank": 1}, "data_parallel_rank"),
        ({"lora_path": [None, "a"], "text": ["x", "y"]}, "lora_path"),
        ({"top_logprobs_num": 1000}, "top_logprobs_num"),
        ({"logprob_start_len": -5}, "logprob_start_len"),
        ({"text": ["a", "b"], "return_logprob": [True]}, "return_logprob has 1 entries for a batch of 2"),
        ({"rid": ["a", "b"]}, "rid may be a list only for a batch"),
    ],
)
def test_unsupported_or_bad_values_are_refused_by_name(body, word):
    body.setdefault("text", "hi")
    with pytest.raises(RequestError) as e:
        parse(**body)
    assert word in e.value.message, e.value.message


def test_batches_get_per_item_fields():
    obj, rids = parse(
        text=["a", "b"],
        rid="r",
        return_logprob=[True, False],
        top_logprobs_num=2,
        token_ids_logprob=[5, 6],
        logprob_start_len=[0, 1],
    )
    assert rids == ["r-0", "r-1"]
    first, second = obj.item(0), obj.item(1)
    assert (first.return_logprob, second.return_logprob) == (True, False)
    assert (first.top_logprobs_num, second.top_logprobs_num) == (2, 2)
    assert first.token_ids_logprob == [5, 6] == second.token_ids_logprob
    assert (first.logprob_start_len, second.logprob_start_len) == (0, 1)
    obj, _ = parse(text=["a", "b"], token_ids_logprob=[[1], [2, 3]])
    assert obj.item(1).token_ids_logprob == [2, 3]
