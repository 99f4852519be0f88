"""Every HTTP endpoint of `python -m sglang.launch_server`, against one real server (SmolLM2 on CPU):
SGLang's native /generate (plain, streamed, batched, token ids, logprobs, stop strings), the OpenAI
API through the official `openai` client, and the admin endpoints (/server_info, /metrics, ...)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

import json
import re
from typing import List

import openai
import pytest
import requests

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0, "max_new_tokens": 8}
TIMEOUT = 120  # generous: CI machines are shared and a 2-core box can be slowed down a lot


@pytest.fixture(scope="module")
def base_url(smollm2_server):
    return smollm2_server.base_url  # shared with the other modules here (conftest.py)


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=TIMEOUT, max_retries=0)


def generate(base_url: str, **body) -> requests.Response:
    return requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT)


def sse_events(resp: requests.Response) -> List[str]:
    """The `data:` payloads of a server-sent-event stream, in order."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    return [line[len("data: ") :] for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")]


@pytest.fixture(scope="module")
def greedy_baseline(base_url) -> dict:
    r = generate(base_url, text=PROMPT, sampling_params=GREEDY)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate(greedy_baseline):
    out = greedy_baseline
    assert isinstance(out["text"], str) and out["text"].strip()
    assert len(out["output_ids"]) == 8
    meta = out["meta_info"]
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] == 8
    assert meta["finish_reason"]["type"] == "length"
    assert meta["e2e_latency"] > 0 and meta["id"]


def test_generate_stream_is_cumulative_and_matches(base_url, greedy_baseline):
    r = requests.post(
        f"{base_url}/generate",
        json={"text": PROMPT, "sampling_params": GREEDY, "stream": True},
        stream=True,
        timeout=TIMEOUT,
    )
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    outs = [json.loads(e) for e in events[:-1]]
    assert len(outs) >= 2  # streamed token by token, not in one piece
    for prev, cur in zip(outs, outs[1:]):
        assert cur["text"].startswith(prev["text"])
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
    assert all(o["meta_info"]["finish_reason"] is None for o in outs[:-1])
    assert outs[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert outs[-1]["text"] == greedy_baseline["text"]
    assert outs[-1]["output_ids"] == greedy_baseline["output_ids"]


def test_generate_equals_v1_completions(base_url, greedy_baseline):
    r = requests.post(
        f"{base_url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0}, timeout=TIMEOUT
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == greedy_baseline["text"]


def test_input_ids_path(base_url, greedy_baseline):
    from sglang.srt.utils.hf_tokenizer import get_tokenizer

    ids = get_tokenizer("SmolLM2-135M-Instruct").encode(PROMPT)  # cached by the server's first start
    r = generate(base_url, input_ids=ids, sampling_params=GREEDY)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == greedy_baseline["output_ids"]
    # Token ids through the OpenAI completions API, and a batch of two through /generate.
    r = requests.post(
        f"{base_url}/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0}, timeout=TIMEOUT
    )
    assert r.json()["choices"][0]["text"] == greedy_baseline["text"]
    r = generate(base_url, input_ids=[ids, ids[:3]], sampling_params=GREEDY)
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == 2
    assert outs[0]["output_ids"] == greedy_baseline["output_ids"]
    assert outs[1]["meta_info"]["prompt_tokens"] == 3


def test_return_logprob(base_url, greedy_baseline):
    r = generate(base_url, text=PROMPT, sampling_params=GREEDY, return_logprob=True, return_text_in_logprobs=True)
    out = r.json()
    lps = out["meta_info"]["output_token_logprobs"]
    assert len(lps) == len(out["output_ids"]) == 8
    assert [e[1] for e in lps] == out["output_ids"]
    assert all(e[0] <= 0 for e in lps)
    assert "".join(e[2] for e in lps) == out["text"]


def test_stop_string_is_trimmed(base_url, greedy_baseline):
    text = greedy_baseline["text"]
    words = text.split()
    assert len(words) >= 2, f"need two words in the greedy output, got {text!r}"
    stop = words[1]
    expected = text[: text.index(stop)]
    out = generate(base_url, text=PROMPT, sampling_params={**GREEDY, "stop": [stop]}).json()
    assert out["text"] == expected
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    r = requests.post(
        f"{base_url}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stop": stop},
        timeout=TIMEOUT,
    )
    choice = r.json()["choices"][0]
    assert choice["text"] == expected and choice["finish_reason"] == "stop"


def test_openai_completions(client, greedy_baseline):
    resp = client.completions.create(model="anything", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0)
    choice = resp.choices[0]
    assert choice.text == greedy_baseline["text"] and choice.finish_reason == "length"
    assert len(choice.logprobs.token_logprobs) == 8 and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert resp.usage.completion_tokens == 8
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 8
    stream = client.completions.create(
        model="anything",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == greedy_baseline["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_openai_chat(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    resp = client.chat.completions.create(model="m", messages=messages, max_tokens=16, temperature=0, logprobs=True)
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert len(choice.logprobs.content) == resp.usage.completion_tokens
    assert resp.usage.prompt_tokens > len(messages[0]["content"].split())  # the chat template was applied
    stream = client.chat.completions.create(
        model="m",
        messages=messages,
        max_completion_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.total_tokens == resp.usage.total_tokens


def test_chat_stream_raw_sse_ends_with_done(base_url):
    r = requests.post(
        f"{base_url}/v1/chat/completions",
        stream=True,
        timeout=TIMEOUT,
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "stream": True},
    )
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["object"] == "chat.completion.chunk"


def test_models(base_url, client):
    data = requests.get(f"{base_url}/v1/models", timeout=TIMEOUT).json()
    assert data["object"] == "list" and data["data"][0]["id"] == "SmolLM2-135M-Instruct"
    assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct"]


def test_server_info(base_url):
    for path in ("/server_info", "/get_server_info"):
        info = requests.get(f"{base_url}{path}", timeout=TIMEOUT).json()
        assert info["max_total_num_tokens"] == 16384
        assert info["memory_plan"]["max_total_num_tokens"] == 16384 > 0
        assert info["max_running_requests"] > 0 and info["version"]
        assert info["model_path"] == "SmolLM2-135M-Instruct" and info["max_total_tokens"] == 16384
        assert {"num_running_reqs", "num_used_tokens", "token_usage"} <= set(info["scheduler_stats"])


def test_server_info_has_upstreams_shape(base_url):
    info = requests.get(f"{base_url}/get_server_info", timeout=TIMEOUT).json()
    (state,) = info["internal_states"]  # one data-parallel rank
    assert state["avg_spec_accept_length"] is None and state["memory_usage"]["token_capacity"] == 16384
    assert state["memory_plan"] == info["memory_plan"] and "startup_time" in info
    for path in ("/model_info", "/get_model_info"):
        model = requests.get(f"{base_url}{path}", timeout=TIMEOUT).json()
        assert model["is_generation"] is True and model["model_path"] == "SmolLM2-135M-Instruct"
        assert model["architectures"] == ["LlamaForCausalLM"] and model["model_type"] == "llama"
    assert (
        requests.get(f"{base_url}/v1/models/SmolLM2-135M-Instruct", timeout=TIMEOUT).json()["id"]
        == "SmolLM2-135M-Instruct"
    )
    assert requests.get(f"{base_url}/v1/models/other", timeout=TIMEOUT).status_code == 404


def test_parallel_samples_share_one_prefill(base_url):
    body = {
        "text": "Once upon a time, in a land far away, there lived",
        "sampling_params": {"n": 3, "temperature": 0.9, "max_new_tokens": 8, "sampling_seed": 42, "ignore_eos": True},
    }
    outs = generate(base_url, **body).json()
    assert len(outs) == 3 and len({tuple(o["output_ids"]) for o in outs}) > 1  # three different samples
    for o in outs:
        meta = o["meta_info"]
        assert meta["cached_tokens"] == meta["prompt_tokens"] - 1  # the prompt was computed once, before them
    again = generate(base_url, **body).json()
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in outs]  # seeded: reproducible
    batch = generate(base_url, text=["Hi", "Bye"], sampling_params={"n": 2, "max_new_tokens": 2}).json()
    assert len(batch) == 4  # prompt-major: Hi, Hi, Bye, Bye
    assert batch[0]["meta_info"]["prompt_tokens"] == batch[1]["meta_info"]["prompt_tokens"]


def stream_finals(events: List[str], index_of) -> dict:
    """Each index's last event of a stream (the `[DONE]` end checked and dropped)."""
    assert events[-1] == "[DONE]"
    finals = {}
    for e in events[:-1]:
        out = json.loads(e)
        finals[index_of(out)] = out
    return finals


def test_streams_of_several_samples_end_as_without_stream(base_url, client):
    """A batch or n > 1 streams every sample interleaved, each event naming its place (SGLang's "index", prompt-
    major; OpenAI's choice index). Seeded, every index's stream adds up to what the same request returns without
    stream, and the usage chunk counts every choice."""
    body = {"text": ["Hi", "Bye"], "sampling_params": {"n": 2, "max_new_tokens": 4, "sampling_seed": 7}}
    whole = generate(base_url, **body).json()
    r = requests.post(f"{base_url}/generate", json=dict(body, stream=True), stream=True, timeout=TIMEOUT)
    finals = stream_finals(sse_events(r), lambda out: out["index"])
    assert [finals[i]["output_ids"] for i in range(4)] == [o["output_ids"] for o in whole]
    shown = [finals[i]["meta_info"]["id"].split("-", 1)[1] for i in range(4)]  # after the batch's random id
    assert shown == [o["meta_info"]["id"].split("-", 1)[1] for o in whole] == ["0-0", "0-1", "1-0", "1-1"]

    messages = [{"role": "user", "content": "Name a fruit."}]
    kw = dict(model="m", messages=messages, n=3, max_tokens=6, seed=11)
    resp = client.chat.completions.create(**kw)
    texts, roles, reasons, usage = {}, {}, {}, None
    for c in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        usage = c.usage or usage
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            roles.setdefault(ch.index, ch.delta.role)  # each choice's first chunk carries the role
            reasons[ch.index] = ch.finish_reason or reasons.get(ch.index)
    assert texts == {ch.index: ch.message.content for ch in resp.choices}
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert reasons == {ch.index: ch.finish_reason for ch in resp.choices}
    assert usage.completion_tokens == resp.usage.completion_tokens and usage.prompt_tokens == resp.usage.prompt_tokens

    kw = dict(model="m", prompt=["The capital of France is", "One, two,"], n=2, max_tokens=5, echo=True, seed=3)
    resp = client.completions.create(**kw)
    texts, usage = {}, None
    for c in client.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        usage = c.usage or usage
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert texts == {ch.index: ch.text for ch in resp.choices}
    assert texts[1].startswith("The capital of France is") and texts[2].startswith("One, two,")  # per prompt
    assert (usage.prompt_tokens, usage.completion_tokens) == (resp.usage.prompt_tokens, resp.usage.completion_tokens)


def test_health(base_url):
    assert requests.get(f"{base_url}/health", timeout=TIMEOUT).status_code == 200
    assert requests.get(f"{base_url}/health_generate", timeout=TIMEOUT).status_code == 200


def test_metrics(base_url, greedy_baseline):
    r = requests.get(f"{base_url}/metrics", timeout=TIMEOUT)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "sglang:num_running_reqs" in r.text
    m = re.search(r"^sglang:time_to_first_token_seconds_count\{[^}]*\} (\S+)$", r.text, re.M)
    assert m and float(m.group(1)) >= 1, "TTFT histogram has no observation after a request"


def test_flush_cache(base_url):
    prompt = "Flushing test: a prompt long enough to be cached in the radix tree."
    params = {"temperature": 0, "max_new_tokens": 2}
    generate(base_url, text=prompt, sampling_params=params)
    assert generate(base_url, text=prompt, sampling_params=params).json()["meta_info"]["cached_tokens"] > 0
    r = requests.post(f"{base_url}/flush_cache", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["success"] is True
    assert generate(base_url, text=prompt, sampling_params=params).json()["meta_info"]["cached_tokens"] == 0
    assert requests.get(f"{base_url}/flush_cache", timeout=TIMEOUT).status_code == 200


def test_unknown_route_is_json_404(base_url):
    r = requests.get(f"{base_url}/no_such_route", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
