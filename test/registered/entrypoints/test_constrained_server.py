from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="per-commit-cpu")

# Constrained decoding through the HTTP server (SmolLM2 on CPU, which cannot follow a schema unaided), once per
# --grammar-backend (xgrammar, llguidance; llguidance refuses the forced tool calls, xgrammar structural tags):
# /generate json_schema with n > 1 and logprobs; a schema that does not compile is a 400 naming the field
# while a concurrent request succeeds; the openai client's response_format json_schema (chat) and
# json_object (completions); text.format json_schema on /v1/responses; tool_choice required and a named
# function give calls (qwen25 format) whose arguments validate against the tool's parameters.

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
