"""The OpenAI endpoints' agent-facing fields against one real server (SmolLM2 on CPU, started with a
ChatML --chat-template of ours that renders tools and reads `enable_thinking`): SGLang's extension
fields through the `openai` client's extra_body either act or are a 400 naming them, template
variables and continue_final_message change the prompt, completions echo+logprobs as lm-eval sends it,
the router's worker endpoints, /tokenize and /detokenize, tools rendered and tool_choice none."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="per-commit-cpu")

import json
import re

import openai
import pytest
import requests

from sglang.test.test_utils import kill_process_tree, popen_launch_server

TIMEOUT = 120
SYSTEM = "You are terse."
# Our own ChatML template: tools listed in the system turn, earlier calls as Hermes <tool_call> blocks,
# and an empty think block when the request sets enable_thinking false (as Qwen3's template does).
CHAT_TEMPLATE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call these functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif %}
{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ {"name": c.function.name,
"arguments": c.function.arguments} | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}
""".strip()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chatml_tools.jinja"
    template.write_text(CHAT_TEMPLATE)
    proc = popen_launch_server(
        [
            "--max-total-tokens",
            "8192",
            "--chat-template",
            str(template),
            "--tool-call-parser",
            "qwen25",
            "--reasoning-parser",
            "qwen3",
        ]
    )
    yield proc.base_url
    kill_process_tree(proc.pid)
    proc.wait(10)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)


def messages(user: str = "Name a color.") -> list:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def chat(client, **kw):
    kw = {"max_tokens": 4, "temperature": 0, **kw}
    return client.chat.completions.create(model="default", messages=messages(), **kw)


def generate(base_url: str, **body) -> requests.Response:
    return requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT)


@pytest.mark.parametrize(
    "field,value",
    [
        ("regex", "(yes|no)"),
        ("ebnf", 'root ::= "yes" | "no"'),
        ("json_schema", '{"type": "object"}'),
        ("stop_regex", "[.!]"),
        ("structural_tag", '{"structures": [], "triggers": []}'),
    ],
)
def test_constraint_fields_act_as_on_generate(base_url, client, field, value):
    """Through extra_body, each constraint gets /generate's verdict: both accept it, or both are a 400
    naming it (never a 200 with unconstrained text while /generate refuses)."""
    native = generate(base_url, text="Yes or no?", sampling_params={"max_new_tokens": 4, field: value})
    assert native.status_code in (200, 400), native.text
    for call in (
        lambda: chat(client, extra_body={field: value}),
        lambda: client.completions.create(
            model="default", prompt="Yes or no?", max_tokens=4, extra_body={field: value}
        ),
    ):
        if native.status_code == 200:
            call()
        else:
            with pytest.raises(openai.BadRequestError) as e:
                call()
            assert field in e.value.message


@pytest.mark.parametrize("field,value", [("lora_path", "my-adapter"), ("priority", 5), ("no_such_field", 1)])
def test_fields_we_cannot_honour_are_400s_naming_them(client, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, extra_body={field: value})
    assert field in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default", prompt="x", max_tokens=1, extra_body={field: value})
    assert field in e.value.message


NO_THINKING = {"enable_thinking": False}


def test_response_format_json_is_enforced_or_refused_by_name(client):
    for fmt in (
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object"}}},
    ):
        try:  # thinking off: with it on (qwen3's default) the constraint waits for a </think> SmolLM2 never writes
            r = chat(client, response_format=fmt, max_tokens=16, extra_body={"chat_template_kwargs": NO_THINKING})
        except openai.BadRequestError as e:
            assert "response_format" in e.message
        else:
            json.loads(r.choices[0].message.content)


def test_chat_template_kwargs_reach_the_template(client):
    plain = chat(client)
    no_think = chat(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    # the template adds an empty think block (<think>, </think> and blank lines) for enable_thinking false
    assert no_think.usage.prompt_tokens > plain.usage.prompt_tokens


def test_continue_final_message_continues_the_assistant_text(base_url, client):
    partial = "The capital of France is"
    r = client.chat.completions.create(
        model="default",
        messages=messages("Tell me about France.") + [{"role": "assistant", "content": partial}],
        max_tokens=6,
        temperature=0,
        extra_body={"continue_final_message": True},
    )
    text = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nTell me about France.<|im_end|>\n"
        f"<|im_start|>assistant\n{partial}"
    )
    native = generate(base_url, text=text, sampling_params={"max_new_tokens": 6, "temperature": 0})
    assert native.status_code == 200, native.text
    assert r.choices[0].message.content == native.json()["text"]
    assert r.usage.prompt_tokens == native.json()["meta_info"]["prompt_tokens"]


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_echo_logprobs_as_lm_eval_sends_them(base_url, max_tokens):
    """lm-eval 0.4.x local-completions (loglikelihood): token-id prompts in a batch, echo, logprobs 1,
    max_tokens 1 (or 0). Every prompt token has an entry (null first), the logprobs equal /generate's
    prompt logprobs, and the top alternative at each position is at least the token's own logprob."""
    prompts = [[504, 3575, 282, 4649, 314], [1203, 9096, 17, 28]]  # token ids, as lm-eval sends them
    body = {
        "model": "default",
        "prompt": prompts,
        "echo": True,
        "logprobs": 1,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1234,
    }
    r = requests.post(f"{base_url}/v1/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    for ids, choice in zip(prompts, choices):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ids) + max_tokens == len(lp["token_logprobs"]) == len(lp["text_offset"])
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        native = generate(
            base_url,
            input_ids=ids,
            return_logprob=True,
            logprob_start_len=0,
            sampling_params={"max_new_tokens": 1, "temperature": 0},
        )
        assert native.status_code == 200, native.text
        expected = [e[0] for e in native.json()["meta_info"]["input_token_logprobs"]]
        assert lp["token_logprobs"][: len(ids)] == pytest.approx(expected, abs=1e-4)
        for value, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
            assert len(top) == 1 and max(top.values()) >= value - 1e-4
        assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
        assert choice["text"].startswith(
            requests.post(f"{base_url}/detokenize", json={"tokens": ids}, timeout=TIMEOUT).json()["text"]
        )


def test_echo_logprobs_streamed_equal_non_streamed(client):
    kw = dict(model="default", prompt="The capital of France is", echo=True, logprobs=2, max_tokens=3, temperature=0)
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    logprobs = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    offsets = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.text_offset]
    assert text == whole.text and tokens == whole.logprobs.tokens and offsets == whole.logprobs.text_offset
    assert logprobs[0] is None and logprobs[1:] == pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-4)


def test_tokenize_and_detokenize_round_trip(base_url):
    r = requests.post(
        f"{base_url}/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}, timeout=TIMEOUT
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 8192
    native = generate(base_url, text="Hello world", return_prompt_token_ids=True, sampling_params={"max_new_tokens": 1})
    assert native.json()["meta_info"]["prompt_token_ids"] == body["tokens"]  # the engine's own tokenization
    batch = requests.post(f"{base_url}/v1/tokenize", json={"prompt": ["a b", "c"]}, timeout=TIMEOUT).json()
    assert batch["count"] == [len(t) for t in batch["tokens"]]
    back = requests.post(f"{base_url}/detokenize", json={"tokens": body["tokens"]}, timeout=TIMEOUT)
    assert back.json() == {"text": "Hello world"}
    both = requests.post(f"{base_url}/v1/detokenize", json={"tokens": batch["tokens"]}, timeout=TIMEOUT).json()
    assert both == {"text": ["a b", "c"]}
    bad = requests.post(f"{base_url}/detokenize", json={"tokens": [10**9]}, timeout=TIMEOUT)
    assert bad.status_code == 400 and "tokens" in bad.json()["error"]["message"]
    typo = requests.post(f"{base_url}/tokenize", json={"prompt": "x", "add_bos": True}, timeout=TIMEOUT)
    assert typo.status_code == 400 and "add_bos" in typo.json()["error"]["message"]


def test_router_worker_contract(base_url, client):
    info = requests.get(f"{base_url}/server_info", timeout=TIMEOUT).json()
    assert (info["dp_size"], info["tp_size"], info["load_balance_method"], info["disaggregation_mode"]) == (
        1,
        1,
        "round_robin",
        "null",
    )
    model_info = requests.get(f"{base_url}/get_model_info", timeout=TIMEOUT).json()
    assert model_info["is_generation"] is True and model_info["model_path"] == info["model_path"]
    idle = requests.get(f"{base_url}/get_load", timeout=TIMEOUT).json()
    assert [(e["dp_rank"], e["num_reqs"], e["num_waiting_reqs"], e["num_tokens"]) for e in idle] == [(0, 0, 0, 0)]
    # while a streamed request is in flight, its tokens are the load
    stream = client.completions.create(
        model="default", prompt="Count: 1, 2, 3,", max_tokens=40, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    busy = requests.get(f"{base_url}/get_load", timeout=TIMEOUT).json()[0]
    stream.close()
    assert busy["num_reqs"] == 1 and busy["num_tokens"] > 8
    assert client.models.retrieve("default").id == info["served_model_name"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_tools_are_rendered_and_tool_choice_none_answers_in_text(client):
    plain = chat(client, max_tokens=8)
    none = chat(client, max_tokens=8, tools=[WEATHER], tool_choice="none")
    # the template lists the tool in a system block: the prompt grows by the tool's JSON and the instructions
    assert none.usage.prompt_tokens > plain.usage.prompt_tokens + 30
    message = none.choices[0].message
    assert message.tool_calls is None and isinstance(message.content, str)
    assert none.choices[0].finish_reason in ("stop", "length")
    # auto goes through the qwen25 parser: SmolLM2 writes no call, so the answer is text (streamed the same)
    auto = chat(client, max_tokens=8, tools=[WEATHER])
    chunks = list(chat(client, max_tokens=8, tools=[WEATHER], stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert auto.choices[0].message.tool_calls is None and streamed == auto.choices[0].message.content


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "send_mail"}}}, "tool_choice"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools.0.function.parameters",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
    ],
)
def test_tool_errors_are_400s_naming_the_field(client, kw, field):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, **kw)
    assert e.value.message.startswith(field) or f"'{field}" in e.value.message or field in e.value.message


def test_reasoning_parser_leaves_a_thinkless_answer_as_content(client):
    r = chat(client, max_tokens=8)
    assert getattr(r.choices[0].message, "reasoning_content", None) is None and r.choices[0].message.content


def test_stop_regex_stops_at_the_first_match_and_trims_it_streamed_and_not(base_url, client):
    prompt, pattern = "Count from one: 1, 2, 3, 4, 5, 6, 7, 8", r"1\d,"
    params = {"max_new_tokens": 16, "temperature": 0}
    free = generate(base_url, text=prompt, sampling_params=params).json()["text"]
    match = re.search(pattern, free)
    assert match, f"the greedy continuation {free!r} has no match: pick another pattern"
    native = generate(base_url, text=prompt, sampling_params={**params, "stop_regex": pattern}).json()
    assert native["text"] == free[: match.start()]
    assert native["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = generate(base_url, text=prompt, sampling_params={**params, "stop_regex": [pattern], "no_stop_trim": True})
    assert kept.json()["text"] == free[: match.end()]
    kw = dict(model="default", prompt=prompt, max_tokens=16, temperature=0, extra_body={"stop_regex": pattern})
    whole = client.completions.create(**kw).choices[0]
    assert whole.text == native["text"] and whole.finish_reason == "stop"
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(pieces) == whole.text
    bad = generate(base_url, text=prompt, sampling_params={"stop_regex": "(unclosed"})
    assert bad.status_code == 400 and "stop_regex" in bad.json()["error"]["message"]


# Two earlier turns teach SmolLM2 to think in <think> tags, then answer {"a": n}: it does so greedily.
THINKING_SHOTS = [
    {"role": "user", "content": "Name a color."},
    {"role": "assistant", "content": '<think>Colors: red.</think>\n{"a": 1}'},
    {"role": "user", "content": "Name a fruit."},
    {"role": "assistant", "content": '<think>Fruits: apple.</think>\n{"a": 2}'},
    {"role": "user", "content": "Name an animal."},
]
B_ONLY = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"], "additionalProperties": False}


def test_a_constraint_applies_from_the_end_of_the_reasoning(base_url, client):
    """--reasoning-parser qwen3, thinking on: the reasoning is free text (the schema would force `{` first) and
    the answer follows the schema (the model's own habit is {"a": n}); thinking off: constrained from the start."""
    kw = dict(model="default", messages=THINKING_SHOTS, max_tokens=40, temperature=0)
    free = client.chat.completions.create(**kw).choices[0].message
    assert free.reasoning_content and json.loads(free.content) != {"b": 1} and "a" in json.loads(free.content)
    fmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": B_ONLY, "strict": True}}
    thought = client.chat.completions.create(response_format=fmt, **kw).choices[0].message
    assert thought.reasoning_content == free.reasoning_content  # the same free text up to </think>
    assert set(json.loads(thought.content)) == {"b"} and isinstance(json.loads(thought.content)["b"], int)
    off = (
        client.chat.completions.create(response_format=fmt, extra_body={"chat_template_kwargs": NO_THINKING}, **kw)
        .choices[0]
        .message
    )
    assert getattr(off, "reasoning_content", None) is None and set(json.loads(off.content)) == {"b"}
    forced = client.chat.completions.create(
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **{**kw, "max_tokens": 80},
    ).choices[0]
    assert forced.message.reasoning_content == free.reasoning_content and forced.finish_reason == "tool_calls"
    (call,) = forced.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    # /generate: require_reasoning (upstream's field) asks for the same
    shots = 'Q: Name a color.\nA: <think>Colors: red.</think>\n{"a": 1}\nQ: Name a fruit.\nA: <think>Fruits: apple.'
    prompt = shots + '</think>\n{"a": 2}\nQ: Name an animal.\nA: <think>'
    params = {"json_schema": json.dumps(B_ONLY), "max_new_tokens": 20, "temperature": 0}
    texts = []
    for thinks in (True, False):
        r = generate(base_url, text=prompt, require_reasoning=thinks, sampling_params=params)
        assert r.status_code == 200, r.text
        texts.append(r.json()["text"])
    reasoning, _, answer = texts[0].partition("</think>")
    assert reasoning and "{" not in reasoning and set(json.loads(answer)) == {"b"}
    assert set(json.loads(texts[1])) == {"b"}  # constrained from the first token
    typo = generate(base_url, text="x", require_reasoning="yes")
    assert typo.status_code == 400 and "require_reasoning" in typo.json()["error"]["message"]


def test_responses_create_text_streamed_and_not(client):
    kw = dict(model="default", input="Name a color.", instructions=SYSTEM, max_output_tokens=6, temperature=0)
    r = client.responses.create(**kw)
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text and r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == r.output_text == events[-1].response.output_text
    # the same prompt through chat completions gives the same text
    same = chat(client, max_tokens=6)
    assert same.choices[0].message.content == r.output_text


def test_responses_with_a_function_tool_and_previous_response_id(base_url, client):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    first = client.responses.create(
        model="default", input="Weather in Paris?", tools=[tool], max_output_tokens=6, temperature=0
    )
    assert first.status in ("completed", "incomplete") and all(
        o.type in ("message", "function_call") for o in first.output
    )
    # a function call and its output fed back as items, continuing the stored conversation
    follow = client.responses.create(
        model="default",
        previous_response_id=first.id,
        input=[
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C and sunny"},
        ],
        tools=[tool],
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.previous_response_id == first.id
    assert follow.usage.input_tokens > first.usage.input_tokens + 10  # the earlier turn is part of the prompt
    stored = requests.get(f"{base_url}/v1/responses/{follow.id}", timeout=TIMEOUT).json()
    assert stored["id"] == follow.id and stored["output"][0]["content"][0]["text"] == follow.output_text
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="default", input="x", previous_response_id="resp_nope", max_output_tokens=1)
    assert "previous_response_id" in e.value.message


def test_responses_json_schema_applies_after_the_reasoning(client):
    """/v1/responses on a thinking server (qwen3, no template switch there): text.format follows the reasoning,
    which comes back as a reasoning item."""
    fmt = {"format": {"type": "json_schema", "name": "b", "schema": B_ONLY, "strict": True}}
    r = client.responses.create(model="default", input=THINKING_SHOTS, text=fmt, max_output_tokens=40, temperature=0)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"], kinds
    assert set(json.loads(r.output_text)) == {"b"}


def test_langchain_openai_bind_tools_and_structured_output(base_url):
    """langchain-openai's ChatOpenAI against the server: every field it sends is accepted; bind_tools renders
    the tool (SmolLM2 answers in text); with_structured_output is enforced (constrained decoding)."""
    from langchain_openai import ChatOpenAI  # a test dependency (pyproject.toml)

    llm = ChatOpenAI(
        base_url=f"{base_url}/v1", api_key="EMPTY", model="default", max_tokens=8, temperature=0, max_retries=0
    )
    plain = llm.invoke("Name a color.")
    tooled = llm.bind_tools([WEATHER]).invoke("Name a color.")
    assert isinstance(tooled.content, str) and tooled.tool_calls == []
    assert tooled.usage_metadata["input_tokens"] > plain.usage_metadata["input_tokens"] + 30  # the tool is rendered
    streamed = "".join(chunk.content for chunk in llm.bind_tools([WEATHER]).stream("Name a color."))
    assert streamed == tooled.content
    # Enforced by constrained decoding: response_format json_schema, and a forced tool call (tool_choice named).
    schema = {
        "title": "Color",
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}},
        "required": ["name"],
    }
    roomy = ChatOpenAI(  # thinking off: SmolLM2 never ends a reasoning, after which the constraint would apply
        base_url=f"{base_url}/v1",
        api_key="EMPTY",
        model="default",
        max_tokens=48,
        temperature=0,
        max_retries=0,
        extra_body={"chat_template_kwargs": NO_THINKING},
    )
    for method in ("json_schema", "function_calling"):
        out = roomy.with_structured_output(schema, method=method).invoke("Name a color.")
        assert isinstance(out.get("name"), str) and len(out["name"]) <= 12
