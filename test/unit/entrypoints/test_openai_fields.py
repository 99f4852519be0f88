from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# No field is silently ignored on the OpenAI endpoints: SGLang's extension fields go where /generate
# takes them (the sampling parameters) or are refused by name, OpenAI's label fields are accepted,
# anything else is a 400 naming it; the legacy functions API maps to tools; chat template variables
# and continue_final_message reach the template.

import json

import openai
import pytest
from pydantic import ValidationError

try:  # the openai package's own HTTP library (httpx2 from openai 3, httpx before)
    import httpx2 as httpx
except ImportError:
    import httpx

from sglang.srt.constrained.grammar_key import UNSATISFIABLE
from sglang.srt.entrypoints.openai.chat_prompt import resolve_tools, template_kwargs, template_messages
from sglang.srt.entrypoints.openai.field_policy import LABEL_FIELDS, check_extra_fields
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.openai.responses_input import responses_error
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.utils import (
    build_sampling_params,
    check_sampling_params,
    name_origin,
    response_format_constraint,
    token_limit_origin,
    with_origin,
)
from sglang.srt.managers.tokenizer_manager import RequestError
from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError

MSG = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def chat(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": MSG, **kw})


def refused(fn, *args) -> str:
    with pytest.raises(RequestError) as e:
        fn(*args)
    assert e.value.status_code == 400
    return e.value.message


def test_openai_client_bodies_are_accepted():
    """Every request field the `openai` package sends for label / hint parameters passes (captured from
    the real client through a mock transport, so a new client version's keys are checked too)."""
    bodies = []

    def capture(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(400, json={"error": {"message": "captured"}})

    client = openai.OpenAI(
        base_url="http://x/v1", api_key="k", http_client=httpx.Client(transport=httpx.MockTransport(capture))
    )
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="default",
            messages=MSG,
            max_completion_tokens=4,
            user="u",
            metadata={"k": "v"},
            service_tier="auto",
            prompt_cache_key="p",
            safety_identifier="s",
            parallel_tool_calls=True,
            stream_options=None,
            store=False,
            modalities=["text"],
            response_format={"type": "text"},
            prediction={"type": "content", "content": "x"},
        )
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="default", prompt="hi", max_tokens=1, echo=True, logprobs=1, user="u")
    chat_req = ChatCompletionRequest.model_validate(bodies[0])
    check_extra_fields(chat_req)
    assert set(chat_req.__pydantic_extra__) <= set(LABEL_FIELDS) | {"store"}
    check_extra_fields(CompletionRequest.model_validate(bodies[1]))


@pytest.mark.parametrize("name", ["use_beam_search", "guided_json", "temprature"])
def test_unknown_fields_are_400s_naming_them(name):
    assert refused(check_extra_fields, chat(**{name: 1})).startswith(f"{name}: unknown field")
    assert name in refused(check_extra_fields, CompletionRequest(prompt="x", **{name: 1}))


@pytest.mark.parametrize(
    "name,value",
    [
        ("lora_path", "adapter"),
        ("priority", 3),
        ("session_params", {"id": "s"}),
        ("return_hidden_states", True),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("reasoning_effort", "high"),
        ("store", True),
        ("web_search_options", {"search_context_size": "low"}),
    ],
)
def test_features_we_lack_are_refused_by_name_and_accepted_at_default(name, value):
    assert refused(check_extra_fields, chat(**{name: value})).startswith(f"{name}: ")
    check_extra_fields(chat(**{name: None}))


def test_messages_with_unknown_keys_are_refused_by_name():
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x", "contnet": "y"}]})
    assert "contnet" in str(e.value)


@pytest.mark.parametrize(
    "field,value",
    [
        ("regex", "[a-z]+"),
        ("ebnf", 'root ::= "a"'),
        ("json_schema", '{"type": "object"}'),
        ("structural_tag", '{"structures": [], "triggers": []}'),
        ("stop_regex", "\\d+"),
    ],
)
def test_constraint_fields_do_what_generate_does(field, value):
    """The key reaches the sampling parameters, and the endpoint's verdict is /generate's (today a 400
    naming the key; once constrained decoding lands, the same acceptance)."""
    for req in (chat(**{field: value}), CompletionRequest(prompt="x", **{field: value})):
        params = build_sampling_params(req, 4)
        assert params[field] == value
        try:
            SamplingParams.from_dict(params)
            native_error = None
        except SamplingParamsError as e:
            native_error = str(e)
        if native_error is None:
            check_sampling_params(params, {})
        else:
            assert refused(check_sampling_params, params, {}) == native_error
            assert native_error.startswith(field)


def test_response_format_maps_to_json_schema_and_errors_name_it():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert response_format_constraint(fmt) == ("json_schema", json.dumps(schema))
    assert response_format_constraint({"type": "json_object"}) == ("json_schema", json.dumps({"type": "object"}))
    assert response_format_constraint({"type": "text"}) is None
    assert "response_format.type" in refused(response_format_constraint, {"type": "xml"})
    assert "response_format.json_schema.schema" in refused(
        response_format_constraint, {"type": "json_schema"} | {"json_schema": {"name": "x"}}
    )
    params = {"max_new_tokens": 4, "json_schema": json.dumps(schema)}
    try:
        SamplingParams.from_dict(params)
    except SamplingParamsError:
        assert refused(check_sampling_params, params, {"json_schema": "response_format"}).startswith(
            "response_format (as sampling parameter json_schema)"
        )


def test_legacy_functions_map_to_tools():
    fn = TOOL["function"]
    plan = resolve_tools(chat(functions=[fn], function_call="auto"), "qwen25")
    assert plan.legacy and plan.parse_calls and plan.tools[0]["function"]["name"] == "get_weather"
    plan = resolve_tools(chat(functions=[fn], function_call="none"), None)
    assert plan.legacy and not plan.parse_calls and plan.tools is not None
    assert "function_call" in refused(resolve_tools, chat(functions=[fn], function_call={"name": "nope"}), "qwen25")
    assert "functions" in refused(resolve_tools, chat(functions=[fn], tools=[TOOL]), "qwen25")
    # an assistant's legacy function_call in the history becomes a tool call for the template
    msgs = template_messages(
        ChatCompletionRequest.model_validate(
            {
                "messages": MSG
                + [
                    {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": '{"a": 1}'}},
                    {"role": "function", "name": "f", "content": "42"},
                ]
            }
        )
    )
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert msgs[2] == {"role": "tool", "content": "42", "name": "f"}


def test_tool_choice_rules():
    assert "tool_choice" in refused(resolve_tools, chat(tool_choice="auto"), "qwen25")  # no tools
    assert resolve_tools(chat(tools=[TOOL], tool_choice="none"), None).parse_calls is False
    assert "--tool-call-parser" in refused(resolve_tools, chat(tools=[TOOL]), None)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):  # enforced by a grammar of the parser's call format
        plan = resolve_tools(chat(tools=[TOOL], tool_choice=choice), "qwen25")
        assert plan.parse_calls and plan.forced == choice and plan.choice_field == "tool_choice"
        assert "--tool-call-parser" in refused(resolve_tools, chat(tools=[TOOL], tool_choice=choice), None)
    unknown = {"type": "function", "function": {"name": "send_mail"}}
    assert "'send_mail' is not among the tools" in refused(resolve_tools, chat(tools=[TOOL], tool_choice=unknown), "x")
    assert refused(resolve_tools, chat(tools=[TOOL], tool_choice="sometimes"), "x").startswith("tool_choice")


def test_invalid_tool_schemas_are_400s_naming_the_field():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
    assert refused(resolve_tools, chat(tools=[TOOL, bad]), "qwen25").startswith("tools.1.function.parameters")
    dup = [TOOL, TOOL]
    assert "defined twice" in refused(resolve_tools, chat(tools=dup), "qwen25")


def test_template_kwargs_and_continue_final_message():
    assert template_kwargs(chat(chat_template_kwargs={"enable_thinking": False})) == {
        "enable_thinking": False,
        "add_generation_prompt": True,
    }
    assert "chat_template_kwargs.tools" in refused(template_kwargs, chat(chat_template_kwargs={"tools": []}))
    cont = ChatCompletionRequest.model_validate(
        {"messages": MSG + [{"role": "assistant", "content": "Sure"}], "continue_final_message": True}
    )
    assert template_kwargs(cont) == {"add_generation_prompt": False, "continue_final_message": True}
    assert "continue_final_message" in refused(template_kwargs, chat(continue_final_message=True))


def test_a_returned_message_appended_to_the_conversation_is_accepted():
    """The openai client's usual loop: append the assistant message it got back (with annotations / refusal
    / audio null and tool calls with their index) and send the tool's result."""
    from openai.types.chat import ChatCompletionMessage

    returned = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "annotations": [],
            "audio": None,
            "tool_calls": [
                {"id": "call_1", "index": 0, "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        }
    )
    body = {"messages": MSG + [returned.model_dump(), {"role": "tool", "tool_call_id": "call_1", "content": "2"}]}
    msgs = template_messages(ChatCompletionRequest.model_validate(body))
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert msgs[2] == {"role": "tool", "content": "2", "tool_call_id": "call_1"}
    body["messages"][1]["audio"] = {"id": "audio_1"}
    assert "messages.1.audio" in refused(template_messages, ChatCompletionRequest.model_validate(body))


def test_random_chat_request_shapes_are_400s_never_crashes():
    import random

    def value(rng, depth=0):
        kind = rng.choice(["str", "int", "none", "list", "dict"] if depth < 3 else ["str", "none"])
        if kind == "list":
            return [value(rng, depth + 1) for _ in range(rng.randrange(3))]
        if kind == "dict":
            keys = ["type", "function", "name", "parameters", "role", "content", "arguments", "tool_calls", "id"]
            return {rng.choice(keys): value(rng, depth + 1) for _ in range(rng.randrange(4))}
        return {"str": "function", "int": 7, "none": None}[kind]

    rng = random.Random(35)
    fields = [
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "messages",
        "response_format",
        "chat_template_kwargs",
        "continue_final_message",
    ]
    for _ in range(3000):
        body = {"messages": [{"role": "user", "content": "hi"}]}
        for _ in range(rng.randrange(1, 4)):
            body[rng.choice(fields)] = value(rng)
        try:
            req = ChatCompletionRequest.model_validate(body)
            check_extra_fields(req)
            resolve_tools(req, "qwen25")
            template_messages(req)
            template_kwargs(req)
            response_format_constraint(req.response_format)
        except (ValidationError, RequestError):
            pass


def test_token_limit_errors_name_the_field_the_client_sent():
    """max_tokens / max_completion_tokens / min_tokens, not the sampling keys they become (max_new_tokens,
    min_new_tokens), also where a message names a limit further on."""
    message = refused(check_sampling_params, {"max_new_tokens": -5}, token_limit_origin("max_tokens"))
    assert message.startswith("max_tokens (as sampling parameter max_new_tokens) must be in"), message
    origin = token_limit_origin("max_completion_tokens")
    message = refused(check_sampling_params, {"max_new_tokens": 3, "min_new_tokens": 5}, origin)
    assert message.startswith("min_tokens (as sampling parameter min_new_tokens) must be in [0, max_completion_tokens]")
    engine = RequestError("prompt (5 tokens) + max_new_tokens (9000) exceeds the context length of 8192 tokens")
    assert with_origin(engine, origin).message.startswith("prompt (5 tokens) + max_completion_tokens (9000) exceeds")
    # The Responses API sends max_output_tokens as the chat request's max_completion_tokens.
    renamed = responses_error(with_origin(engine, origin)).message
    assert "max_output_tokens (9000)" in renamed and "max_completion_tokens" not in renamed, renamed
    head = responses_error(RequestError(name_origin("max_new_tokens must be in [0, 5], got -1", origin))).message
    assert head.startswith("max_output_tokens (as sampling parameter max_new_tokens) must be"), head


def test_an_unsatisfiable_forced_call_names_the_tool_parameters():
    """A forced call's grammar that no output can satisfy is refused naming the parameters it was built from
    (the call format's own text always fits); other structural_tag errors keep naming tool_choice."""
    other = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
    dead = RequestError(f"structural_tag: {UNSATISFIABLE}: after the text it forces ('<tool_call>') ...")
    origin = {"structural_tag": "tool_choice"}
    cases = [
        (chat(tools=[TOOL], tool_choice="required"), "tools.0.function.parameters"),
        (
            chat(tools=[other, TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
            "tools.1.function.parameters",
        ),
        (chat(tools=[other, TOOL], tool_choice="required"), "tools.*.function.parameters"),
        (
            chat(functions=[other["function"], TOOL["function"]], function_call={"name": "get_weather"}),
            "functions.1.parameters",
        ),
    ]
    for req, field in cases:
        plan = resolve_tools(req, "qwen25")
        message = OpenAIServingChat.refusal(dead, origin, plan).message
        assert message.startswith(f"{field} (as sampling parameter structural_tag): {UNSATISFIABLE}"), message
        assert OpenAIServingChat.refusal(RequestError("structural_tag: not served"), origin, plan).message.startswith(
            "tool_choice (as sampling parameter structural_tag)"
        )
