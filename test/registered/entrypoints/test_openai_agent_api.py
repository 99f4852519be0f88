"""The OpenAI endpoints' agent-facing fields against one real server (SmolLM2 on CPU, started with a
ChatML --chat-template of ours that renders tools and reads `enable_thinking`): SGLang's extension
fields through the `openai` client's extra_body either act or are a 400 naming them, template
variables and continue_final_message change the prompt, completions echo+logprobs as lm-eval sends it,
the router's worker endpoints, /tokenize and /detokenize, tools rendered and tool_choice none."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="per-commit-cpu")

import json

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


def test_response_format_json_is_enforced_or_refused_by_name(client):
    for fmt in (
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object"}}},
    ):
        try:
            r = chat(client, response_format=fmt, max_tokens=16)
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
