from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=6, suite="per-commit-cpu")

# The chat serving layer's output path on a fake token stream (SmolLM2 never calls tools by itself, so the
# model's text is given here): reasoning_content, content and tool_calls, streamed and not, as the `openai`
# client reads them; streamed chunks joined equal the non-streamed message for random cuts of the text.

import json
import random
from typing import List

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from sglang.srt.entrypoints.openai.chat_prompt import resolve_tools
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
OUTPUT = (
    "<think>\nThe user asks about two cities; I should call the tool twice.\n</think>\n\n"
    "Checking both — un momento.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京", "note": {"deep": [1, {"x": "}"}]}}}\n'
    "</tool_call>"
)


def serving() -> OpenAIServingChat:
    return OpenAIServingChat(None, "default", None, tool_call_parser="qwen25", reasoning_parser="qwen3")


def request(**kw) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "Weather in Paris and Tokyo?"}], "tools": [TOOL], **kw}
    return ChatCompletionRequest.model_validate(body)


def outputs(text: str, cuts: List[int], reason: str = "stop") -> List[dict]:
    """Cumulative outputs as the tokenizer manager yields them, the last one finished."""
    ends = sorted(set(cuts) | {len(text)})
    outs = [
        {"text": text[:e], "output_ids": list(range(k + 1)), "meta_info": {"finish_reason": None}}
        for k, e in enumerate(ends)
    ]
    outs[-1]["meta_info"]["finish_reason"] = {"type": reason}
    return outs


def non_streamed(text: str, req: ChatCompletionRequest, reason: str = "stop") -> dict:
    chat = serving()
    plan = resolve_tools(req, chat.tool_call_parser)
    choice = chat._choice(0, outputs(text, [], reason)[-1], req, plan, chat._output_plan(req, plan))
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "default", "choices": [choice.model_dump()]}
    return ChatCompletion.model_validate(body).choices[0].model_dump()


def streamed(text: str, req: ChatCompletionRequest, cuts: List[int], reason: str = "stop") -> dict:
    chat = serving()
    plan = resolve_tools(req, chat.tool_call_parser)
    events_for, _ = chat._stream_events(req, "r", "default", plan, chat._output_plan(req, plan))
    content, reasoning, calls, finish, legacy = "", "", {}, None, {"name": None, "arguments": ""}
    for out in outputs(text, cuts, reason):
        for event in events_for(out):
            choice = ChatCompletionChunk.model_validate(event).choices[0]
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for tc in delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.function.name and tc.type == "function"
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            if delta.function_call:
                legacy["name"] = legacy["name"] or delta.function_call.name
                legacy["arguments"] += delta.function_call.arguments or ""
            finish = choice.finish_reason or finish
    return {
        "content": content,
        "reasoning": reasoning,
        "calls": [calls[i] for i in sorted(calls)],
        "finish": finish,
        "legacy": legacy,
    }


def summary(choice: dict) -> dict:
    msg = choice["message"]
    calls = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in msg.get("tool_calls") or []
    ]
    return {
        "content": msg.get("content") or "",
        "reasoning": msg.get("reasoning_content") or "",
        "calls": calls,
        "finish": choice["finish_reason"],
        "legacy": msg.get("function_call"),
    }


def test_non_streamed_message():
    got = summary(non_streamed(OUTPUT, request()))
    assert got["reasoning"] == "The user asks about two cities; I should call the tool twice."
    assert got["content"] == "Checking both — un momento."
    assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "東京", "note": {"deep": [1, {"x": "}"}]}}),
    ]
    assert got["finish"] == "tool_calls"


@pytest.mark.parametrize("seed", range(40))
def test_streamed_equals_non_streamed(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(OUTPUT)), rng.randint(1, 60)))
    whole = summary(non_streamed(OUTPUT, request()))
    got = streamed(OUTPUT, request(), cuts)
    assert len({c["id"] for c in got["calls"]}) == len(got["calls"])
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in got["calls"]] == whole["calls"]
    assert (got["content"], got["reasoning"], got["finish"]) == (whole["content"], whole["reasoning"], whole["finish"])


def test_parallel_tool_calls_false_keeps_the_first_call():
    req = request(parallel_tool_calls=False)
    assert len(summary(non_streamed(OUTPUT, req))["calls"]) == 1
    assert len(streamed(OUTPUT, req, list(range(1, len(OUTPUT), 7)))["calls"]) == 1


def test_tool_choice_none_and_separate_reasoning_false_leave_the_text_alone():
    got = summary(non_streamed(OUTPUT, request(tool_choice="none", separate_reasoning=False)))
    assert got["content"] == OUTPUT and got["calls"] == [] and got["reasoning"] == "" and got["finish"] == "stop"


def test_stream_reasoning_false_sends_the_reasoning_in_one_piece():
    chat = serving()
    req = request(stream_reasoning=False)
    plan = resolve_tools(req, chat.tool_call_parser)
    events_for, _ = chat._stream_events(req, "r", "default", plan, chat._output_plan(req, plan))
    pieces = [
        e["choices"][0]["delta"].get("reasoning_content")
        for out in outputs(OUTPUT, list(range(1, 90, 3)))
        for e in events_for(out)
    ]
    assert [p for p in pieces if p] == ["The user asks about two cities; I should call the tool twice."]


def test_legacy_functions_answer_with_function_call():
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "Weather?"}], "functions": [TOOL["function"]]}
    )
    got = summary(non_streamed(OUTPUT, req))
    assert got["calls"] == [] and got["finish"] == "function_call"
    assert got["legacy"]["name"] == "get_weather" and json.loads(got["legacy"]["arguments"]) == {"city": "Paris"}
    stream = streamed(OUTPUT, req, list(range(5, len(OUTPUT), 11)))
    assert stream["legacy"] == got["legacy"] and stream["finish"] == "function_call"


def test_a_call_cut_off_by_max_tokens_finishes_with_length():
    text = OUTPUT[: OUTPUT.index('"Paris"') + 3]
    whole = summary(non_streamed(text, request(), reason="length"))
    assert whole["finish"] == "length" and whole["calls"][0]["arguments"] == '{"city": "Pa'
    got = streamed(text, request(), [10, 50, 120, 150], reason="length")
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in got["calls"]] == whole["calls"]


def test_special_token_markers_are_kept_only_for_formats_that_need_them():
    from sglang.srt.entrypoints.openai.chat_output import OutputPlan

    assert not OutputPlan("qwen3", "qwen25").needs_special_tokens  # <think>, <tool_call>: ordinary added tokens
    assert OutputPlan(None, "deepseekv3").needs_special_tokens and OutputPlan(None, "kimi_k2").needs_special_tokens
    assert OutputPlan("kimi_k2", None).needs_special_tokens and not OutputPlan(None, None).needs_special_tokens
