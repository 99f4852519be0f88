"""Bad requests get a 4xx with a JSON error message and leave the requests in flight unharmed;
clients that disconnect have their requests aborted (KV freed); --api-key guards the routes.

One server, started with --api-key (every request here sends the key; the 401 cases omit it)
and a 1 MiB body limit, so the size check is cheap to exercise."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="per-commit-cpu")

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import pytest
import requests

from sglang.test.test_utils import kill_process_tree, popen_launch_server

API_KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY_LIMIT = 1 << 20
TIMEOUT = 120
GOOD_PROMPTS = [f"Write one sentence about the number {i}." for i in range(8)]
GOOD_PARAMS = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


@pytest.fixture(scope="module")
def base_url():
    proc = popen_launch_server(
        ["--max-total-tokens", "16384", "--api-key", API_KEY], env={"SGLANG_MAX_REQUEST_BODY_BYTES": str(BODY_LIMIT)}
    )
    yield proc.base_url
    kill_process_tree(proc.pid)
    proc.wait(10)


def post(base_url: str, path: str, body=None, raw: Optional[bytes] = None, **kw) -> requests.Response:
    if raw is not None:
        return requests.post(f"{base_url}{path}", data=raw, headers=AUTH, timeout=TIMEOUT, **kw)
    return requests.post(f"{base_url}{path}", json=body, headers=AUTH, timeout=TIMEOUT, **kw)


def good_output(base_url: str, prompt: str) -> list:
    r = post(base_url, "/generate", {"text": prompt, "sampling_params": GOOD_PARAMS})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def chat(content="Hi", **kw):
    return {"messages": [{"role": "user", "content": content}], **kw}


LONG_PROMPT = "hello " * 9000  # > 8192 tokens, the model's context length
# (path, body or raw bytes, expected status, a word the error message must contain)
BAD_REQUESTS = [
    ("/generate", b'{"text": "unterminated', 400, "JSON"),
    ("/v1/chat/completions", b"[1, 2", 400, "JSON"),
    ("/generate", {"text": 123}, 400, "text"),
    ("/generate", {"text": "hi", "stream": "yes"}, 400, "stream"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": "ten"}}, 400, "max_new_tokens"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, 400, "max_new_tokens"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 10**6}}, 400, "context length"),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": -0.5}}, 400, "temperature"),
    ("/generate", {"text": "hi", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("/generate", {"text": "hi", "sampling_params": {"bogus": 1}}, 400, "bogus"),
    ("/generate", {"text": ""}, 400, "empty"),
    ("/generate", {"input_ids": []}, 400, "empty"),
    ("/generate", {"input_ids": [1, 49152]}, 400, "vocabulary"),
    ("/generate", {"input_ids": [-3, 5]}, 400, "vocabulary"),
    ("/generate", {"text": LONG_PROMPT}, 400, "context length"),
    ("/generate", {"text": "hi", "lora_path": "my-adapter"}, 400, "lora_path"),
    ("/generate", {"text": "hi", "image_data": ["a.png"]}, 400, "image_data"),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "[a-z"}}, 400, "regex"),  # does not compile
    # Values that once passed validation and killed the scheduler or the detokenizer (issue 18):
    ("/generate", {"text": "hi", "sampling_params": {"sampling_seed": 2**64}}, 400, "seed"),
    ("/generate", {"text": "hi", "sampling_params": {"top_k": 2**63}}, 400, "top_k"),
    ("/generate", {"text": "hi", "sampling_params": {"skip_special_tokens": 5}}, 400, "skip_special_tokens"),
    ("/generate", {"text": "hi", "sampling_params": {"spaces_between_special_tokens": "no"}}, 400, "spaces_between"),
    ("/v1/chat/completions", chat(seed=2**64), 400, "seed"),
    ("/v1/completions", {"prompt": "hi", "seed": -(2**64)}, 400, "seed"),
    ("/generate", b'{"text": "\\ud800"}', 400, "Unicode"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400, "Unicode"),
    ("/generate", b'{"text": ' + b"[" * 50000 + b"]" * 50000 + b"}", 400, "nested"),
    ("/generate", b'{"text": "hi", "sampling_params": {"temperature": NaN}}', 400, "NaN"),
    # The fields added for SGLang's clients (issue 19): each malformed value is a 400 naming it.
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": "x"}, 400, "logprob_start_len"),
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": -5}, 400, "logprob_start_len"),
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": 10**6}, 400, "logprob_start_len"),
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 1000}, 400, "top_logprobs_num"),
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": "3"}, 400, "top_logprobs_num"),
    ("/generate", {"text": "hi", "return_logprob": True, "token_ids_logprob": [1, "a"]}, 400, "token_ids_logprob"),
    ("/generate", {"text": "hi", "return_logprob": True, "token_ids_logprob": [1, 10**9]}, 400, "token_ids_logprob"),
    ("/generate", {"text": "hi", "return_logprob": True, "token_ids_logprob": [[1], [2]]}, 400, "token_ids_logprob"),
    ("/generate", {"text": "hi", "return_text_in_logprobs": "yes"}, 400, "return_text_in_logprobs"),
    ("/generate", {"text": "hi", "return_prompt_token_ids": 5}, 400, "return_prompt_token_ids"),
    ("/generate", {"text": "hi", "log_metrics": "no"}, 400, "log_metrics"),
    ("/generate", {"text": "hi", "session_id": 5}, 400, "session_id"),
    ("/generate", {"text": "hi", "custom_labels": {"a": 1}}, 400, "custom_labels"),
    ("/generate", {"text": "hi", "routing_key": [1]}, 400, "routing_key"),
    ("/generate", {"text": "hi", "conversation_id": 3}, 400, "conversation_id"),
    ("/generate", {"text": "hi", "external_trace_header": "x"}, 400, "external_trace_header"),
    ("/generate", {"text": "hi", "received_time": "t"}, 400, "received_time"),
    ("/generate", {"text": "hi", "http_worker_ipc": 1}, 400, "http_worker_ipc"),
    ("/generate", {"text": "hi", "data_parallel_rank": 2}, 400, "data_parallel_rank"),
    ("/generate", {"text": "hi", "routed_dp_rank": "a"}, 400, "routed_dp_rank"),
    ("/generate", {"text": "hi", "sampling_params": {"stream_interval": 0}}, 400, "stream_interval"),
    ("/generate", {"text": "hi", "sampling_params": {"logit_bias": {"abc": 1}}}, 400, "logit_bias"),
    ("/generate", {"text": "hi", "sampling_params": {"logit_bias": {"5": "x"}}}, 400, "logit_bias"),
    ("/generate", {"text": "hi", "sampling_params": {"logit_bias": {"99999999": 1}}}, 400, "logit_bias"),
    ("/generate", {"text": "hi", "sampling_params": {"n": 1.5}}, 400, "n must be"),
    ("/generate", {"text": "hi", "sampling_params": {"n": 1000}}, 400, "n must be in"),
    # streams of several samples (a batch or n > 1): their values checked as without stream
    ("/generate", {"text": ["a", "b"], "stream": True, "sampling_params": {"n": 1.5}}, 400, "n must be"),
    ("/generate", {"text": ["a", "b"], "stream": "yes"}, 400, "stream"),
    ("/generate", {"text": ["a", "b"], "stream": True, "rid": ["x", "x"]}, 400, "unique"),
    ("/generate", {"text": "hi", "sampling_params": {"ebnf": "x"}}, 400, "ebnf"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 10}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 500}}, 400, "logit_bias"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=25), 400, "top_logprobs"),
    ("/v1/chat/completions", chat(top_logprobs=3), 400, "top_logprobs"),
    ("/v1/chat/completions", chat(logit_bias={"a": 1}), 400, "logit_bias"),
    ("/v1/chat/completions", chat(n=100), 400, "n must be in"),
    ("/v1/chat/completions", chat(n=0, stream=True), 400, "n must be in"),
    ("/v1/chat/completions", chat(n=3, stream=True, stream_options={"include_usage": "yes"}), 400, "include_usage"),
    ("/v1/completions", {"prompt": ["a", "b"], "n": "2", "stream": True}, 400, "n"),
    ("/v1/completions", {"prompt": ["a", "b"], "n": 2, "stream": True, "logprobs": 9}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens (as sampling parameter max_new_tokens)"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, 400, "context length"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": []}, 400, "empty"),
    ("/v1/completions", {"prompt": LONG_PROMPT}, 400, "context length"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n must be in"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/chat/completions", chat(max_tokens=10**6), 400, "context length"),
    ("/v1/chat/completions", chat(temperature=-1), 400, "temperature"),
    ("/v1/chat/completions", chat(top_p=0), 400, "top_p"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", chat(LONG_PROMPT), 400, "context length"),
    ("/v1/chat/completions", chat(max_completion_tokens=-1), 400, "max_completion_tokens (as sampling parameter"),
    # Errors name the field the client sent, not the sampling key it becomes (max_new_tokens, min_new_tokens).
    ("/v1/chat/completions", chat(max_tokens=3, min_tokens=5), 400, "min_tokens (as sampling parameter"),
    ("/v1/chat/completions", chat(max_tokens=10**6), 400, "max_tokens (1000000) exceeds the context length"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens (1000000) exceeds the context"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": -4}, 400, "max_output_tokens (as sampling parameter"),
    # logit_bias keys that are Unicode digits, not token ids ("²": int() refused it, a 500; "١" read as token 1).
    ("/v1/chat/completions", chat(logit_bias={"²": 1}), 400, "logit_bias"),
    ("/generate", {"text": "hi", "sampling_params": {"logit_bias": {"١": 1}}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"٣": 1}}, 400, "logit_bias"),
    # /v1/responses reasoning items whose content / summary is not a list of parts (once a TypeError, a 500).
    (
        "/v1/responses",
        {
            "input": [{"type": "reasoning", "content": "think"}, {"role": "user", "content": "hi"}],
            "max_output_tokens": 4,
        },
        400,
        "input.0.content",
    ),
    (
        "/v1/responses",
        {"input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": "s"}]},
        400,
        "input.1.summary",
    ),
    (
        "/v1/responses",
        {"input": [{"type": "reasoning", "content": {"a": 1}}, {"role": "user", "content": "hi"}]},
        400,
        "input.0.content",
    ),
    (
        "/v1/responses",
        {"input": [{"type": "reasoning", "content": 3}, {"role": "user", "content": "hi"}]},
        400,
        "input.0.content",
    ),
    # OpenAI's endpoints take each field in its own JSON type, as OpenAI does (pydantic had coerced these).
    ("/v1/chat/completions", chat(stream="yes"), 400, "stream"),
    ("/v1/completions", {"prompt": [True]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/responses", {"input": "hi", "stream": 1}, 400, "stream"),
    # stream_options: only with stream, and no unknown option passes unread
    ("/v1/chat/completions", chat(stream_options={"include_usage": True}), 400, "stream_options"),
    (
        "/v1/completions",
        {"prompt": "hi", "stream": True, "stream_options": {"include_usge": True}},
        400,
        "include_usge",
    ),
    ("/v1/responses", {"input": "hi", "stream_options": {"include_obfuscation": False}}, 400, "stream_options"),
    ("/v1/responses", {"input": "hi", "stream": True, "stream_options": {"x": 1}}, 400, "stream_options.x"),
    # a text part without its text; Responses' text options this server cannot honour or does not know
    ("/v1/chat/completions", chat([{"type": "text", "text": None}]), 400, "messages.0.content.0.text"),
    ("/v1/responses", {"input": "hi", "text": {"verbosity": "low"}}, 400, "text.verbosity"),
    ("/v1/responses", {"input": "hi", "text": {"verbosity": 5}}, 400, "text.verbosity"),
    ("/v1/chat/completions", chat(stream=True, stream_options={"include_obfuscation": "yes"}), 400, "include_obfusc"),
    (
        "/v1/responses",
        {"input": "hi", "stream": True, "stream_options": {"include_obfuscation": 1}},
        400,
        "include_obf",
    ),
    ("/v1/responses", {"input": "hi", "top_logprobs": "none"}, 400, "top_logprobs"),
    ("/v1/responses", {"input": "hi", "text": {"formt": {"type": "text"}}}, 400, "text.formt"),
    ("/generate", b'{"text": "' + b"x" * (BODY_LIMIT + 10) + b'"}', 413, "larger than"),
]


def check_error(r: requests.Response, status: int, word: str) -> Optional[str]:
    """None if `r` is the expected JSON error, else a description of what is wrong."""
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"status {r.status_code}, not a JSON error: {r.text[:200]!r}"
    if r.status_code != status or err.get("code") != status:
        return f"status {r.status_code} (code {err.get('code')}), expected {status}: {err.get('message')}"
    if word.lower() not in str(err.get("message", "")).lower():
        return f"message does not mention {word!r}: {err.get('message')!r}"
    return None


def test_bad_requests_get_4xx_while_good_requests_complete(base_url):
    expected = [good_output(base_url, p) for p in GOOD_PROMPTS]  # each prompt alone first
    with ThreadPoolExecutor(len(GOOD_PROMPTS)) as pool:
        futures = [pool.submit(good_output, base_url, p) for p in GOOD_PROMPTS]
        problems, in_flight = [], 0
        for path, body, status, word in BAD_REQUESTS:
            r = post(base_url, path, raw=body) if isinstance(body, bytes) else post(base_url, path, body)
            problem = check_error(r, status, word)
            if problem:
                problems.append(f"{path} {str(body)[:80]}: {problem}")
            in_flight = max(in_flight, sum(not f.done() for f in futures))
        results = [f.result() for f in futures]
    assert not problems, "\n".join(problems)
    assert in_flight > 0, "the good requests finished before the bad ones were sent; the test proves nothing"
    assert results == expected


def test_openai_defaults_spelt_out_are_accepted(base_url):
    """What the strict checks above must still take: a number given as an integer, stream_options with a stream
    (OpenAI's include_obfuscation hint among them), Responses' top_logprobs 0 and text.verbosity "medium" (both
    OpenAI's defaults)."""
    r = post(base_url, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "temperature": 0, "top_p": 1})
    assert r.status_code == 200, r.text
    body = chat(max_tokens=2, stream=True, stream_options={"include_usage": True, "include_obfuscation": False})
    r = post(base_url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    events = [line for line in r.text.splitlines() if line.startswith("data: {")]
    assert '"usage": {' in events[-1].replace('":{', '": {'), events[-1]
    body = {"input": "hi", "max_output_tokens": 2, "top_logprobs": 0, "text": {"verbosity": "medium"}}
    r = post(base_url, "/v1/responses", body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("completed", "incomplete")


def test_any_model_name_is_accepted(base_url):
    r = post(base_url, "/v1/completions", {"model": "gpt-4o", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200, r.text


def scheduler_stats(base_url: str) -> dict:
    return requests.get(f"{base_url}/server_info", headers=AUTH, timeout=TIMEOUT).json()["scheduler_stats"]


def wait_idle(base_url: str, timeout: float) -> dict:
    """Poll until no request runs or waits and no KV slot is held by a request; returns the stats."""
    deadline = time.monotonic() + timeout
    while True:
        s = scheduler_stats(base_url)
        if s["num_running_reqs"] == 0 and s["num_queued_reqs"] == 0 and s["num_used_tokens"] == 0:
            return s
        assert time.monotonic() < deadline, f"not idle after {timeout} s: {s}"
        time.sleep(0.25)


LONG_GEN = {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True}  # minutes of work on a CPU


def wait_running(base_url: str, timeout: float = 30) -> None:
    """Until the scheduler reports the request running (so later stats are newer than its start)."""
    deadline = time.monotonic() + timeout
    while scheduler_stats(base_url)["num_running_reqs"] < 1:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.1)


def assert_aborted(base_url: str) -> None:
    """The request left the scheduler and freed its KV, and no more tokens are generated for it."""
    stats = wait_idle(base_url, 10)
    time.sleep(1.0)
    assert scheduler_stats(base_url)["generation_tokens_total"] == stats["generation_tokens_total"]


def test_stream_disconnect_frees_kv(base_url):
    wait_idle(base_url, 30)
    r = post(
        base_url,
        "/generate",
        {"text": "Tell me a very long story.", "sampling_params": LONG_GEN, "stream": True, "rid": "left-early"},
        stream=True,
    )
    lines = r.iter_lines()  # keep the iterator: dropping it would close the connection already
    assert next(lines).startswith(b"data: ")
    wait_running(base_url)
    r.close()  # the client goes away mid-stream
    assert_aborted(base_url)
    # The scheduler confirmed the abort (its final output freed the id): the id serves a new request, which
    # gets its own answer, not the old one's end.
    again = post(base_url, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 3}, "rid": "left-early"})
    assert again.status_code == 200, again.text
    assert again.json()["meta_info"]["finish_reason"]["type"] == "length"


def test_stream_of_several_samples_disconnect_frees_kv(base_url):
    """A chat stream with n = 3 (its samples interleaved): the client leaves after the first chunk, and all three
    samples leave the scheduler."""
    wait_idle(base_url, 30)
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], "n": 3, "stream": True}
    body.update(max_tokens=4000, temperature=0.8, ignore_eos=True)
    r = post(base_url, "/v1/chat/completions", body, stream=True)
    lines = r.iter_lines()  # keep the iterator: dropping it would close the connection already
    assert next(lines).startswith(b"data: ")
    wait_running(base_url)
    r.close()
    assert_aborted(base_url)


def test_non_streaming_disconnect_frees_kv(base_url):
    wait_idle(base_url, 30)
    body = {"prompt": "Tell me another long story.", "max_tokens": 4000, "ignore_eos": True}
    done = threading.Event()

    def client():
        try:  # the client gives up (closes its connection) when the timeout expires
            requests.post(f"{base_url}/v1/completions", headers=AUTH, json=body, timeout=3)
        except requests.exceptions.ReadTimeout:
            done.set()

    t = threading.Thread(target=client)
    t.start()
    wait_running(base_url)
    t.join(30)
    assert done.is_set(), "the request should still have been running when the client gave up"
    assert_aborted(base_url)


def test_api_key(base_url):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
    assert requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT).status_code == 401
    r = requests.post(f"{base_url}/generate", json=body, headers={"Authorization": "Bearer wrong"}, timeout=TIMEOUT)
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    for path in ("/v1/models", "/server_info", "/flush_cache"):
        assert requests.get(f"{base_url}{path}", timeout=TIMEOUT).status_code == 401, path
    assert requests.post(f"{base_url}/generate", json=body, headers=AUTH, timeout=TIMEOUT).status_code == 200
    assert requests.get(f"{base_url}/v1/models", headers=AUTH, timeout=TIMEOUT).status_code == 200
    # As in SGLang, probes and scrapes need no key.
    assert requests.get(f"{base_url}/health", timeout=TIMEOUT).status_code == 200
    assert requests.get(f"{base_url}/metrics", timeout=TIMEOUT).status_code == 200
