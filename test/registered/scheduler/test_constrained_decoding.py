from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="per-commit-cpu")

# Constrained decoding in the scheduler (SmolLM2 on CPU, in-process, overlap scheduling on): SmolLM2 cannot
# follow a schema unaided, so an output that validates comes from the grammar.
#   * twelve JSON schemas (enums, integer ranges, arrays with min/max items, nested objects,
#     additionalProperties false, optional fields, ...) in one batch: each output validates with jsonschema;
#   * regex and EBNF outputs match; a stop string still ends a constrained request;
#   * logprobs are those of the masked distribution (the top alternatives are all allowed tokens);
#   * a grammar that does not compile answers its request with a 400 naming the field while a normal
#     request in the same batch finishes;
#   * chunked prefill and retraction (a 192-token pool): each constrained output equals the same request run
#     in a roomy pool, so a retracted request resumes with its matcher where its tokens left it;
#   * constrained decode steps keep overlapping: step N + 1's forward goes out before step N's result is
#     processed, its sampling (with the masks the matchers give once they accepted step N) after; the outputs
#     equal those of the overlap-off scheduler.

import json
import re

import jsonschema
import pytest

from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2, make_scheduler, run_scheduler

SCHEMAS = [
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 65}},
        "required": ["age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 2, "maxItems": 3}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 12},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["person"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 20}, "subtitle": {"type": "string", "maxLength": 20}},
        "required": ["title"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}},
        "required": ["ok", "note"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"price": {"type": "number", "minimum": 0, "maximum": 100}},
        "required": ["price"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 2,
    },
    {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "string", "maxLength": 5}]}
        },
        "required": ["value"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"version": {"const": 2}, "level": {"enum": [1, 2, 3]}},
        "required": ["version", "level"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    {"enum": ["alpha", "beta"]},
]
NEW = 64


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer(SMOLLM2)


@pytest.fixture(scope="module")
def sched():
    return make_scheduler(model_path=SMOLLM2, max_total_tokens=4096, log_level="warning")


def chat(tok, text: str) -> list:
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(rendered, add_special_tokens=False)


def text_of(tok, result) -> str:
    return tok.decode(result.output_ids, skip_special_tokens=True)


def test_json_schemas_validate(sched, tok):
    prompts = [chat(tok, "Tell me about your day.")] * len(SCHEMAS)
    params = [{"max_new_tokens": NEW, "temperature": 0.0, "json_schema": json.dumps(s)} for s in SCHEMAS]
    for schema, out in zip(SCHEMAS, run_scheduler(sched, prompts, params)):
        assert out.finish_reason["type"] == "stop", (schema, text_of(tok, out))
        assert out.output_ids[-1] == tok.eos_token_id  # the grammar completed, then allowed only the stop token
        jsonschema.validate(json.loads(text_of(tok, out)), schema)


def test_regex_ebnf_and_stop_strings(sched, tok):
    prompt = chat(tok, "What is your phone number?")
    cases = [
        ({"regex": r"\+1 [0-9]{3}-[0-9]{4}"}, r"\+1 [0-9]{3}-[0-9]{4}"),
        ({"regex": "(yes|no|maybe)!"}, "(yes|no|maybe)!"),
        ({"ebnf": 'root ::= "<" word ("," word)* ">"\nword ::= [a-z]+'}, r"<[a-z]+(,[a-z]+)*>"),
    ]
    params = [{"max_new_tokens": 40, "temperature": 0.0, **c} for c, _ in cases]
    # A stop string ends a constrained request before its grammar completes: "ab" repeats forever otherwise.
    params.append({"max_new_tokens": 40, "temperature": 0.0, "regex": "(ab)+c", "stop": "abab"})
    outs = run_scheduler(sched, [prompt] * len(params), params)
    for (_, pattern), out in zip(cases, outs):
        assert out.finish_reason["type"] == "stop"
        assert re.fullmatch(pattern, text_of(tok, out)), text_of(tok, out)
    stopped = outs[-1]
    assert stopped.finish_reason == {"type": "stop", "matched": "abab"}
    assert text_of(tok, stopped).startswith("abab")


def test_logprobs_are_of_the_masked_distribution(sched, tok):
    prompt = chat(tok, "Is the sky green?")
    (out,) = run_scheduler(
        sched,
        [prompt],
        {"max_new_tokens": 8, "temperature": 0.0, "regex": "(yes|no), (yes|no)"},
        return_logprob=True,
        top_logprobs_num=5,
    )
    text = text_of(tok, out)
    assert re.fullmatch("(yes|no), (yes|no)", text)
    assert len(out.logprobs) == len(out.output_ids)
    first_top = out.output_top[0]
    assert first_top[0][1] == out.output_ids[0] and first_top[0][0] == pytest.approx(out.logprobs[0])
    for logprob, token in first_top:  # every alternative with probability > 0 starts "yes" or "no"
        if logprob > float("-inf"):
            piece = tok.decode([token])
            assert "yes".startswith(piece) or "no".startswith(piece), piece
    # The masked distribution's mass is on the allowed tokens: the chosen first token is (near) certain
    # or shares it with the other answer only.
    assert sum(2.718281828459045**lp for lp, _ in first_top if lp > float("-inf")) == pytest.approx(1.0, abs=1e-3)


def test_bad_grammar_is_a_400_naming_the_field_and_others_finish(sched, tok):
    prompt = chat(tok, "Hello!")
    params = [
        {"max_new_tokens": 8, "json_schema": json.dumps({"type": "object", "properties": {"a": {"$ref": "#/x"}}})},
        {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True},
        {"max_new_tokens": 8, "regex": "[unclosed"},
    ]
    bad_schema, normal, bad_regex = run_scheduler(sched, [prompt] * 3, params)
    assert bad_schema.finish_reason["status_code"] == 400
    assert bad_schema.finish_reason["message"].startswith("json_schema: does not compile")
    assert bad_regex.finish_reason["status_code"] == 400
    assert bad_regex.finish_reason["message"].startswith("regex: does not compile")
    assert normal.finish_reason["type"] == "length" and len(normal.output_ids) == 8
    assert not sched.has_work()


def test_chunked_prefill_and_retraction_keep_each_matcher_in_step(sched, tok):
    topics = ["rain", "cats", "tea"] * 2
    prompts = [chat(tok, f"Write {i} short words about {topic}.") for i, topic in enumerate(topics)]
    params = {"max_new_tokens": 16, "temperature": 0.0, "regex": "([a-z]+ )+"}  # never complete: runs to length
    small = make_scheduler(
        model_path=SMOLLM2, max_total_tokens=192, chunked_prefill_size=16, page_size=4, log_level="warning"
    )
    assert sum(len(p) + 16 for p in prompts) > 192
    outs = run_scheduler(small, prompts, params)
    assert small.stats.num_retractions > 0, "the pool was meant to be too small: no request was retracted"
    # The same requests where all fit (batching does not change greedy tokens: test_batching_and_cache.py).
    roomy = run_scheduler(sched, prompts, params)
    for out, ref in zip(outs, roomy):
        assert out.output_ids == ref.output_ids
        assert out.finish_reason["type"] == "length"
        assert re.fullmatch("([a-z]+ )*[a-z]*", text_of(tok, out)), text_of(tok, out)


def test_constrained_steps_overlap_and_match_overlap_off(sched, tok):
    prompts = [chat(tok, "Tell me about your day."), chat(tok, "What is your phone number?")]
    params = [
        {"max_new_tokens": NEW, "temperature": 0.0, "json_schema": json.dumps(SCHEMAS[3])},
        {"max_new_tokens": 40, "temperature": 0.0, "regex": r"\+1 [0-9]{3}-[0-9]{4}"},
    ]
    events = []
    for method, label in (("run_batch", "forward"), ("sample", "sample"), ("process_batch_result", "process")):
        original = getattr(sched, method)
        setattr(sched, method, lambda *a, original=original, label=label: (events.append(label), original(*a))[1])
    try:
        outs = run_scheduler(sched, prompts, params)
    finally:
        for method in ("run_batch", "sample", "process_batch_result"):
            delattr(sched, method)  # the instance's wrappers: the class's methods again
    off = make_scheduler(model_path=SMOLLM2, max_total_tokens=4096, log_level="warning", disable_overlap_schedule=True)
    for out, ref in zip(outs, run_scheduler(off, prompts, params)):
        assert out.output_ids == ref.output_ids and out.finish_reason == ref.finish_reason
    jsonschema.validate(json.loads(text_of(tok, outs[0])), SCHEMAS[3])
    assert re.fullmatch(r"\+1 [0-9]{3}-[0-9]{4}", text_of(tok, outs[1]))
    # Overlapped steps: a forward, then the result of the step before, then this step's sampling.
    overlapped = sum(events[i : i + 3] == ["forward", "process", "sample"] for i in range(len(events) - 2))
    decodes = len(outs[0].output_ids) - 1  # the JSON request's decode steps (the other one's overlap them)
    assert overlapped >= decodes - 2, events
    assert not sched.has_work() and sched.in_flight is None
