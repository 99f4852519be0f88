from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="per-commit-cpu")

# Constrained decoding through the HTTP server (SmolLM2 on CPU, which cannot follow a schema unaided), once per
# --grammar-backend (xgrammar, llguidance; llguidance refuses the forced tool calls, xgrammar structural tags):
# /generate json_schema with n > 1 and logprobs; a schema that does not compile is a 400 naming the field
# while a concurrent request succeeds; the openai client's response_format json_schema (chat) and
# json_object (completions); text.format json_schema on /v1/responses; tool_choice required and a named
# function give calls (qwen25 format) whose arguments validate against the tool's parameters. Logprobs of
# constrained requests are JSON (masked tokens at -9999.0), streamed or not; a grammar no output can satisfy is
# a 400 naming the field the client sent (regex, ebnf, json_schema, response_format, a forced tool's parameters).

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import requests

from sglang.test.test_utils import kill_process_tree, popen_launch_server

TIMEOUT = 300
# ChatML with the tools listed in the system turn, so SmolLM2 sees them.
CHAT_TEMPLATE = """
{%- if tools %}<|im_start|>system
You may call these functions:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content or '' }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
""".strip()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def grammar_backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def base_url(tmp_path_factory, grammar_backend):
    template = tmp_path_factory.mktemp("template") / "chatml_tools.jinja"
    template.write_text(CHAT_TEMPLATE)
    args = ["--max-total-tokens", "4096", "--chat-template", str(template), "--tool-call-parser", "qwen25"]
    args += ["--grammar-backend", grammar_backend]
    proc = popen_launch_server(args)
    yield proc.base_url
    kill_process_tree(proc.pid)
    proc.wait(10)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)


def generate(base_url: str, **body) -> requests.Response:
    return requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT)


def test_generate_json_schema_with_n_and_logprobs(base_url):
    r = generate(
        base_url,
        text="Describe someone.",
        sampling_params={"max_new_tokens": 48, "temperature": 1.0, "n": 2, "seed": 7, "json_schema": PERSON},
        return_logprob=True,
    )
    assert r.status_code == 200, r.text
    outs = r.json()
    assert len(outs) == 2
    for out in outs:
        meta = out["meta_info"]
        assert meta["finish_reason"]["type"] == "stop", out["text"]
        jsonschema.validate(json.loads(out["text"]), PERSON)
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
        assert all(lp is not None and lp <= 0 for lp, *_ in meta["output_token_logprobs"])


def test_a_schema_that_does_not_compile_is_a_400_while_others_are_served(base_url):
    bad = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
    with ThreadPoolExecutor(2) as pool:
        normal = pool.submit(
            generate, base_url, text="Hello", sampling_params={"max_new_tokens": 6, "ignore_eos": True}
        )
        refused = pool.submit(
            generate, base_url, text="Hello", sampling_params={"max_new_tokens": 6, "json_schema": bad}
        )
        normal, refused = normal.result(), refused.result()
    assert refused.status_code == 400 and "json_schema" in refused.json()["error"]["message"], refused.text
    assert normal.status_code == 200 and normal.json()["meta_info"]["completion_tokens"] == 6


def test_regex_and_ebnf_on_generate(base_url):
    r = generate(base_url, text="Pick:", sampling_params={"max_new_tokens": 8, "regex": "(red|green|blue)"})
    assert r.status_code == 200 and r.json()["text"] in ("red", "green", "blue"), r.text
    ebnf = 'root ::= "[" num ("," num)? ("," num)? "]"\nnum ::= [1-9]'
    r = generate(base_url, text="Numbers:", sampling_params={"max_new_tokens": 24, "temperature": 0, "ebnf": ebnf})
    assert r.status_code == 200 and json.loads(r.json()["text"]), r.text


def test_openai_response_format_json_schema_and_json_object(client):
    r = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Tell me a joke."}],
        max_tokens=48,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    c = client.completions.create(
        model="default",
        prompt="Once upon a time",
        max_tokens=32,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert isinstance(json.loads(c.choices[0].text), dict)


def test_a_bad_schema_through_openai_names_the_request_field(client):
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )
    assert "response_format (as sampling parameter json_schema): does not compile" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            model="default", input="Hi", text={"format": {"type": "json_schema", "name": "x", "schema": bad}}
        )
    assert "400 - text.format" in e.value.message and "does not compile" in e.value.message, e.value.message


def test_responses_text_format_json_schema(client):
    r = client.responses.create(
        model="default",
        input="Tell me a joke.",
        max_output_tokens=48,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
    )
    jsonschema.validate(json.loads(r.output_text), PERSON)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_tool_choice_required_and_named_give_valid_calls(client, grammar_backend, choice):
    kw = dict(model="default", messages=[{"role": "user", "content": "Hi there!"}], max_tokens=64, temperature=0)
    kw.update(tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False)
    if grammar_backend == "llguidance":  # a forced call is an xgrammar structural tag: refused by name there
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**kw)
        assert "tool_choice" in e.value.message and "llguidance" in e.value.message, e.value.message
        return
    r = client.chat.completions.create(**kw)
    calls = r.choices[0].message.tool_calls
    assert calls and len(calls) == 1, r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    if choice != "required":
        assert calls[0].function.name == "get_time"
    jsonschema.validate(json.loads(calls[0].function.arguments), tools[calls[0].function.name])


def test_forced_calls_of_several_choices_stream_each_on_its_own(client, grammar_backend):
    """n = 2 with a forced call, streamed: each choice's tool-call deltas (its own parser) join to the call the same
    seeded request returns without stream, under its own id, and each choice ends with tool_calls."""
    kw = dict(model="default", messages=[{"role": "user", "content": "Hi there!"}], max_tokens=64, n=2, seed=5)
    kw.update(temperature=0.8, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    if grammar_backend == "llguidance":  # a forced call is an xgrammar structural tag: refused by name, streamed too
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**kw, stream=True)
        assert "tool_choice" in e.value.message and "llguidance" in e.value.message, e.value.message
        return
    whole = client.chat.completions.create(**kw)
    calls, ids, reasons = {}, {}, {}
    for c in client.chat.completions.create(**kw, stream=True):
        for ch in c.choices:
            reasons[ch.index] = ch.finish_reason or reasons.get(ch.index)
            for d in ch.delta.tool_calls or ():
                name, args = calls.get(ch.index, ("", ""))
                calls[ch.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
                if d.id:
                    ids.setdefault(ch.index, set()).add(d.id)
    expected = {
        ch.index: [(t.function.name, t.function.arguments) for t in ch.message.tool_calls] for ch in whole.choices
    }
    assert {i: [call] for i, call in calls.items()} == expected
    assert reasons == {0: "tool_calls", 1: "tool_calls"}
    assert all(len(v) == 1 for v in ids.values()) and ids[0] != ids[1]


# ---- Constrained decoding with logprobs: masked tokens' logprobs (-inf) are reported as -9999.0 (vLLM's floor).
# Once a 500 ("Out of range float values are not JSON compliant") without streaming and "-Infinity" (invalid JSON)
# in streamed events.
LOGPROB_FLOOR = -9999.0


def strict_json(text) -> object:
    """JSON as the standard has it: NaN / Infinity / -Infinity are refused (Python's json.loads takes them)."""

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def sse_payloads(r: requests.Response) -> list:
    assert r.status_code == 200, r.text
    lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]", lines[-3:]
    return [strict_json(line[len(b"data: ") :]) for line in lines[:-1]]


def all_numbers(value) -> list:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in all_numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in all_numbers(v)]
    return []


YES_NO = {"max_new_tokens": 4, "regex": "(yes|no)", "temperature": 0}


def test_generate_constrained_with_top_and_chosen_logprobs_is_json(base_url):
    body = dict(text="Answer:", sampling_params=YES_NO, return_logprob=True, top_logprobs_num=5)
    body["token_ids_logprob"] = [0, 1]  # special tokens: never allowed by the grammar
    r = requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    out = strict_json(r.text)
    assert out["text"] in ("yes", "no"), out["text"]
    meta = out["meta_info"]
    tops = [lp for position in meta["output_top_logprobs"] for lp, *_ in position]
    assert LOGPROB_FLOOR in tops  # the stop token's position: one token allowed, four of the top five masked
    chosen = [lp for position in meta["output_token_ids_logprobs"] for lp, *_ in position]
    assert chosen and all(lp == LOGPROB_FLOOR for lp in chosen), chosen
    assert all(LOGPROB_FLOOR <= lp <= 0 for lp, *_ in meta["output_token_logprobs"])
    events = sse_payloads(
        requests.post(f"{base_url}/generate", json=dict(body, stream=True), stream=True, timeout=TIMEOUT)
    )
    assert events[-1]["meta_info"]["output_top_logprobs"] == meta["output_top_logprobs"]  # greedy: the same


def test_openai_constrained_with_logprobs_is_json(base_url, grammar_backend):
    url = f"{base_url}/v1"
    chat = {"messages": [{"role": "user", "content": "Yes or no?"}], "max_tokens": 4, "temperature": 0}
    chat.update(logprobs=True, top_logprobs=5)
    bodies = [
        ("chat/completions", dict(chat, regex="(yes|no)")),
        (
            "chat/completions",
            dict(
                chat,
                response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}},
            ),
        ),
        ("completions", {"prompt": "Answer:", "max_tokens": 4, "temperature": 0, "regex": "(yes|no)", "logprobs": 5}),
    ]
    if grammar_backend == "xgrammar":  # llguidance refuses the forced call's structural tag by name
        forced = dict(chat, max_tokens=48, tools=[TIME], tool_choice="required", parallel_tool_calls=False)
        bodies.append(("chat/completions", forced))
    for path, body in bodies:
        r = requests.post(f"{url}/{path}", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, (path, r.text)
        numbers = all_numbers(strict_json(r.text)["choices"])
        assert LOGPROB_FLOOR in numbers, (path, r.text[:400])
        if path == "completions" or "tools" in body:
            continue  # (streamed below for chat only: the same choices)
        events = sse_payloads(
            requests.post(f"{url}/{path}", json=dict(body, stream=True), stream=True, timeout=TIMEOUT)
        )
        assert LOGPROB_FLOOR in all_numbers(events), (path, events[:3])
    events = sse_payloads(
        requests.post(f"{url}/completions", json=dict(bodies[2][1], stream=True), stream=True, timeout=TIMEOUT)
    )
    assert LOGPROB_FLOOR in all_numbers(events)


# ---- Grammars no output can satisfy: a 400 naming the field the client sent (once a 500: the sampler took token 0
# from an all-false mask and the matcher refused it). Refused when they compile where no token may start them (or
# follow the text they force); a dead end further on finishes the request with a 400 as it is found.
EMPTY_PATTERN = {"type": "string", "pattern": "[^\\s\\S]"}
UNSATISFIABLE_ON_GENERATE = [
    ({"regex": "[^\\s\\S]"}, "regex"),
    ({"regex": "a[^\\s\\S]"}, "regex"),  # a dead end after "a" (forced)
    ({"regex": "(a|b)[^\\s\\S]"}, "regex"),  # after a choice: xgrammar finds it while decoding
    ({"ebnf": "root ::= [^\\x00-\\U0010FFFF]"}, "ebnf"),
    ({"json_schema": EMPTY_PATTERN}, "json_schema"),
]


def error_message(r: requests.Response, status: int = 400) -> str:
    assert r.status_code == status, r.text
    return strict_json(r.text)["error"]["message"]


@pytest.mark.parametrize("constraint,field", UNSATISFIABLE_ON_GENERATE, ids=[f for _, f in UNSATISFIABLE_ON_GENERATE])
def test_an_unsatisfiable_grammar_is_a_400_naming_its_field_while_others_are_served(base_url, constraint, field):
    params = {"max_new_tokens": 8, **constraint}
    with ThreadPoolExecutor(2) as pool:
        normal = pool.submit(
            generate, base_url, text="Hello", sampling_params={"max_new_tokens": 6, "ignore_eos": True}
        )
        refused = pool.submit(generate, base_url, text="Hi", sampling_params=params)
        normal, refused = normal.result(), refused.result()
    assert error_message(refused).startswith(f"{field}: "), refused.text
    assert normal.status_code == 200 and normal.json()["meta_info"]["completion_tokens"] == 6
    # Streamed: the 400 before any event, or (a dead end found after the first token) an error event naming it.
    r = requests.post(
        f"{base_url}/generate",
        json={"text": "Hi", "sampling_params": params, "stream": True},
        stream=True,
        timeout=TIMEOUT,
    )
    if r.status_code == 400:
        assert error_message(r).startswith(f"{field}: ")
    else:
        events = sse_payloads(r)
        assert events[-1]["error"]["code"] == 400 and events[-1]["error"]["message"].startswith(f"{field}: "), events


def test_an_unsatisfiable_grammar_names_the_openai_field(base_url, grammar_backend):
    url = f"{base_url}/v1"
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": EMPTY_PATTERN}}
    cases = [
        ("chat/completions", dict(chat, response_format=fmt), "response_format (as sampling parameter json_schema)"),
        ("chat/completions", dict(chat, regex="[^\\s\\S]"), "regex: "),
        ("completions", {"prompt": "Hi", "max_tokens": 8, "regex": "a[^\\s\\S]"}, "regex: "),
        ("completions", {"prompt": "Hi", "max_tokens": 8, "response_format": fmt}, "response_format (as sampling"),
    ]
    if grammar_backend == "xgrammar":  # llguidance refuses the forced call's structural tag by name
        bad_tool = {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a": EMPTY_PATTERN}, "required": ["a"]},
            },
        }
        forced = dict(chat, tools=[TIME, bad_tool], tool_choice={"type": "function", "function": {"name": "f"}})
        cases.append(("chat/completions", forced, "tools.1.function.parameters (as sampling parameter structural_tag)"))
    for path, body, named in cases:
        for stream in (False, True):
            r = requests.post(f"{url}/{path}", json=dict(body, stream=stream), timeout=TIMEOUT)
            assert error_message(r).startswith(named), (path, stream, r.text)
    r = requests.post(
        f"{url}/responses",
        json={
            "input": "Hi",
            "max_output_tokens": 8,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": EMPTY_PATTERN}},
        },
        timeout=TIMEOUT,
    )
    assert error_message(r).startswith("text.format (as sampling parameter json_schema)"), r.text
