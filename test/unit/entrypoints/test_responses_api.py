from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=7, suite="per-commit-cpu")

# The Responses API's pure parts: input items -> chat messages (function calls and their outputs, reasoning,
# instructions), errors naming the Responses field, the bounded store, and the output items built from a
# fake model text -- streamed events (as the `openai` client parses them) joining to the final items.

import json
import random

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from sglang.srt.entrypoints.openai.chat_output import ChatOutputParser, OutputPlan
from sglang.srt.entrypoints.openai.chat_prompt import resolve_tools
from sglang.srt.entrypoints.openai.responses_input import (
    ResponsesRequest,
    check_responses_fields,
    input_messages,
    responses_error,
    to_chat_request,
)
from sglang.srt.entrypoints.openai.responses_output import ResponseBuilder, ResponseStore
from sglang.srt.entrypoints.openai.utils import response_format_constraint
from sglang.srt.managers.tokenizer_manager import RequestError

TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TEXT = (
    "<think>Two cities, two calls.</think>\n\nOne moment.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>'
)
EVENTS = TypeAdapter(ResponseStreamEvent)


def test_input_items_become_chat_messages():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
    ]
    assert input_messages(items) == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Call it.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    req = ResponsesRequest(input=items, instructions="Be brief.", tools=[TOOL])
    chat = to_chat_request(req, [{"role": "user", "content": "earlier"}])
    assert [m.role for m in chat.messages] == ["system", "user", "user", "assistant", "tool", "assistant"]
    assert chat.tools[0].function.name == "get_weather"


@pytest.mark.parametrize(
    "body,field",
    [
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input.0.content.0"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": 3}}]}, "tools.0.parameters"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
        # A reasoning item's content / summary that is not a list of parts (once a TypeError: a 500).
        ({"input": [{"type": "reasoning", "content": "think"}, {"role": "user", "content": "hi"}]}, "input.0.content"),
        ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": "s"}]}, "input.1.summary"),
        ({"input": [{"type": "reasoning", "content": {"type": "reasoning_text"}}]}, "input.0.content"),
        ({"input": [{"type": "reasoning", "content": 3, "summary": []}]}, "input.0.content"),
        ({"input": [{"type": "reasoning", "content": [], "summary": [{"type": "x"}]}]}, "input.0.summary.0"),
    ],
)
def test_bad_input_is_a_400_naming_the_responses_field(body, field):
    with pytest.raises(RequestError) as e:
        req = to_chat_request(ResponsesRequest.model_validate(body), [])
        resolve_tools(req, "qwen25")
        response_format_constraint(req.response_format)
    message = responses_error(e.value).message
    assert message.startswith(field), message


def test_features_we_lack_are_refused_by_name():
    for name, value in (("background", True), ("conversation", "conv_1"), ("include", ["x"]), ("top_logprobs", 3)):
        with pytest.raises(RequestError) as e:
            check_responses_fields(ResponsesRequest.model_validate({"input": "x", name: value}))
        assert e.value.message.startswith(name)
    check_responses_fields(ResponsesRequest.model_validate({"input": "x", "background": False, "include": []}))


def test_store_is_bounded():
    store = ResponseStore(capacity=2)
    for i in range(3):
        store.put({"id": f"r{i}"}, [])
    assert store.get("r0") is None and store.get("r1") and store.get("r2")


def build(chunks, plan: OutputPlan):
    parser = ChatOutputParser(plan)
    builder = ResponseBuilder(parser)
    events = []
    for c in chunks:
        builder.add(parser.feed(c))
        events += builder.take_events()
    builder.add(parser.finish())
    items = builder.finish()
    return items, events + builder.take_events()


@pytest.mark.parametrize("seed", range(20))
def test_streamed_events_join_to_the_output_items(seed):
    plan = OutputPlan("qwen3", "qwen25", [{"type": "function", "function": TOOL}])
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), rng.randint(1, 40)))
    items, events = build([TEXT[a:b] for a, b in zip([0] + cuts, cuts + [len(TEXT)])], plan)
    whole, _ = build([TEXT], plan)
    strip = lambda xs: [{k: v for k, v in x.items() if k not in ("id", "call_id")} for x in xs]  # noqa: E731
    assert strip(items) == strip(whole)
    response = Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "m",
            "output": items,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [TOOL],
        }
    )
    kinds = [o.type for o in response.output]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    assert response.output_text == "One moment."
    assert [json.loads(o.arguments) for o in response.output[2:]] == [{"city": "Paris"}, {"city": "東京"}]
    # every event parses as the client's event union, and the deltas join to the items
    parsed = [EVENTS.validate_python(dict(e, sequence_number=i)) for i, e in enumerate(events)]
    text = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
    args = {}
    for e in parsed:
        if e.type == "response.function_call_arguments.delta":
            args[e.output_index] = args.get(e.output_index, "") + e.delta
    reasoning = "".join(e.delta for e in parsed if e.type == "response.reasoning_text.delta")
    assert text == "One moment." and reasoning == "Two cities, two calls."
    assert [args[2], args[3]] == [items[2]["arguments"], items[3]["arguments"]]
    done = [e.item.model_dump(exclude_none=True) for e in parsed if e.type == "response.output_item.done"]
    assert strip(done) == strip([{k: v for k, v in i.items()} for i in items])


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "none", "bool", "list", "dict"] if depth < 3 else ["str", "int", "none"]
    kind = rng.choice(kinds)
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == "dict":
        keys = [
            "type",
            "role",
            "content",
            "name",
            "arguments",
            "call_id",
            "output",
            "text",
            "format",
            "schema",
            "function",
            "parameters",
            "json_schema",
        ]
        return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return {"str": "function", "int": 3, "none": None, "bool": True}[kind]


def test_random_request_shapes_are_400s_never_crashes():
    """Responses and chat requests of random shapes: a validation error or a RequestError, nothing else."""
    rng = random.Random(35)
    fields = ["input", "tools", "tool_choice", "text", "instructions", "reasoning", "truncation", "include"]
    for _ in range(3000):
        body = {"input": [{"role": "user", "content": "hi"}]}
        for _ in range(rng.randrange(1, 4)):
            body[rng.choice(fields)] = _random_value(rng)
        try:
            req = ResponsesRequest.model_validate(body)
            check_responses_fields(req)
            chat = to_chat_request(req, [])
            resolve_tools(chat, "qwen25")
            response_format_constraint(chat.response_format)
        except (ValidationError, RequestError):
            pass
