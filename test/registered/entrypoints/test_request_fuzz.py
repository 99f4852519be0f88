"""No request can hurt the server or its other users: random JSON of the right and the wrong shapes,
against every route, while 8 well-formed streams run. Every fuzzed answer must be a 2xx or a JSON 4xx
(never a 5xx, never a dead process), and each stream must end with exactly the greedy output the
same eight requests get with no fuzz beside them. Also: a multi-megabyte prompt is refused or tokenized without freezing /health.

The fuzzer is seeded (FUZZ_SEED) and bounded in count and time, so a failure can be replayed."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="per-commit-cpu")

import copy
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Tuple

import pytest
import requests

FUZZ_SEED = 20261201
FUZZ_REQUESTS = 200
FUZZ_THREADS = 4
FUZZ_BUDGET_S = 90
TIMEOUT = 120
STREAM_PARAMS = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
STREAM_PROMPTS = [f"Tell me a short story about the number {i}." for i in range(8)]

EDGE_INTS = [-(2**64), -(2**63) - 1, -(2**63), -1, 0, 1, 2, 7, 2**31, 2**63 - 1, 2**63, 2**64, 10**30]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1.0, 1.5, -1.5, 1e-308, 1e308, float("nan"), float("inf")]
EDGE_STRINGS = ["", " ", "x", "hello", "\ud800", "\udfff", "é你好", "\x00", "<|endoftext|>", "a" * 5000, "{{ 7*7 }}"]

TEMPLATES = {
    "/generate": {
        "text": "Hello",
        "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        "stream": False,
        "return_logprob": False,
        "logprob_start_len": -1,
        "top_logprobs_num": 0,
        "rid": None,
        "lora_path": None,
        "input_ids": None,
    },
    "/v1/completions": {
        "model": "default",
        "prompt": "Hello",
        "max_tokens": 2,
        "temperature": 0,
        "top_p": 1.0,
        "logprobs": None,
        "n": 1,
        "stop": None,
        "seed": 1,
        "stream": False,
        "echo": False,
    },
    "/v1/chat/completions": {
        "model": "default",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
        "temperature": 0,
        "logprobs": False,
        "top_logprobs": None,
        "n": 1,
        "seed": 3,
        "stream": False,
        "stop": ["\n"],
        "frequency_penalty": 0.0,
    },
}
GET_ROUTES = [
    "/v1/models",
    "/v1/models/default",
    "/v1/models/nope",
    "/server_info",
    "/get_server_info",
    "/get_model_info",
    "/model_info",
    "/health",
    "/metrics",
    "/flush_cache",
    "/nonexistent",
]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice(EDGE_INTS)
    if kind == 1:
        return rng.choice(EDGE_FLOATS)
    if kind == 2:
        return rng.choice(EDGE_STRINGS)
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return None
    if kind == 5:
        return [rng.choice(EDGE_INTS[3:8]) for _ in range(rng.randrange(4))]
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return {rng.choice(["a", "max_new_tokens", "text", "n", "role"]): random_value(rng, depth + 1)}
    nested: Any = 1
    for _ in range(rng.choice([5, 40])):  # deeper nesting is sent as raw bytes (json.dumps cannot)
        nested = [nested]
    return nested


def mutate(rng: random.Random, body: dict) -> dict:
    body = copy.deepcopy(body)
    for _ in range(rng.randrange(1, 4)):
        target = body
        if "sampling_params" in body and isinstance(body["sampling_params"], dict) and rng.random() < 0.4:
            target = body["sampling_params"]
            target.setdefault(
                rng.choice(
                    [
                        "top_k",
                        "top_p",
                        "min_p",
                        "n",
                        "sampling_seed",
                        "skip_special_tokens",
                        "stop_token_ids",
                        "logit_bias",
                        "regex",
                        "stream_interval",
                    ]
                ),
                None,
            )
        messages = body.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict) and rng.random() < 0.3:
            target = messages[0]
        op = rng.randrange(4)
        if op == 0 and target:
            target[rng.choice(list(target))] = random_value(rng)
        elif op == 1 and target:
            target.pop(rng.choice(list(target)))
        else:
            target[rng.choice(["extra", "text", "input_ids", "prompt", "max_tokens", "n", "rid"])] = random_value(rng)
    return body


def encode(rng: random.Random, body: Any) -> bytes:
    data = json.dumps(body).encode()  # NaN / Infinity become bare literals: invalid JSON the server must refuse
    if rng.random() < 0.03:
        return b'{"text": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    if rng.random() < 0.05:  # truncated or garbled bytes
        cut = rng.randrange(len(data) + 1)
        data = data[:cut] + bytes(rng.randrange(256) for _ in range(rng.randrange(3)))
    return data


def check_answer(r: requests.Response, what: str) -> Optional[str]:
    if r.status_code >= 500:
        return f"{what}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return f"{what}: {r.status_code} without a JSON error: {r.text[:300]}"
        if not message:
            return f"{what}: empty error message"
    return None


@pytest.fixture(scope="module")
def base_url(smollm2_server):
    return smollm2_server.base_url  # shared with the other modules here (conftest.py)


def stream_text(base_url: str, prompt: str) -> Tuple[List[int], bool]:
    body = {"text": prompt, "sampling_params": STREAM_PARAMS, "stream": True}
    r = requests.post(f"{base_url}/generate", json=body, stream=True, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    return json.loads(events[-2])["output_ids"], events[-1] == "[DONE]"


def fuzz_one(rng: random.Random, session: requests.Session, base_url: str, n: int) -> Optional[str]:
    if rng.random() < 0.15:
        path = rng.choice(GET_ROUTES)
        method = rng.choice(["GET", "GET", "POST", "DELETE"])
        return check_answer(session.request(method, f"{base_url}{path}", timeout=TIMEOUT), f"#{n} {method} {path}")
    path = rng.choice(list(TEMPLATES))
    body = mutate(rng, TEMPLATES[path]) if rng.random() < 0.9 else random_value(rng)
    data = encode(rng, body)
    return check_answer(
        session.post(f"{base_url}{path}", data=data, timeout=TIMEOUT), f"#{n} POST {path} {data[:200]!r}"
    )


def test_fuzzed_requests_never_hurt_the_server_or_other_streams(base_url):
    # The reference: the same eight requests at once with no fuzz beside them (greedy outputs are batch-invariant,
    # test_batching_and_cache.py checks that against each alone; at 128 tokens each, sent one by one they took 80 s,
    # at once 19 s).
    with ThreadPoolExecutor(len(STREAM_PROMPTS)) as pool:
        calm = list(
            pool.map(
                lambda p: requests.post(
                    f"{base_url}/generate", json={"text": p, "sampling_params": STREAM_PARAMS}, timeout=TIMEOUT
                ).json()["output_ids"],
                STREAM_PROMPTS,
            )
        )
    problems: List[str] = []
    counts = {"sent": 0, "during_streams": 0}
    lock = threading.Lock()
    with ThreadPoolExecutor(len(STREAM_PROMPTS) + FUZZ_THREADS) as pool:
        streams = [pool.submit(stream_text, base_url, p) for p in STREAM_PROMPTS]
        start = time.monotonic()

        def fuzzer(worker: int) -> None:
            rng, session = random.Random(FUZZ_SEED + worker), requests.Session()
            while time.monotonic() - start < FUZZ_BUDGET_S:
                streaming = any(not s.done() for s in streams)
                with lock:
                    if counts["sent"] >= FUZZ_REQUESTS and not streaming:
                        return
                    counts["sent"] += 1
                    counts["during_streams"] += streaming
                    n = counts["sent"]
                problem = fuzz_one(rng, session, base_url, n)
                if problem:
                    problems.append(problem)

        fuzzers = [pool.submit(fuzzer, w) for w in range(FUZZ_THREADS)]
        for f in fuzzers:
            f.result()
        results = [s.result() for s in streams]
    assert not problems, "\n".join(problems[:20])
    assert counts["during_streams"] >= FUZZ_REQUESTS // 3, f"only {counts} fuzzed while the streams ran"
    assert all(done for _, done in results), "a stream did not end with [DONE]"
    assert [ids for ids, _ in results] == calm
    assert requests.get(f"{base_url}/health", timeout=TIMEOUT).status_code == 200
    print(f"fuzzed requests: {counts}")


def _max_health_latency(base_url: str, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        t = time.monotonic()
        requests.get(f"{base_url}/health", timeout=TIMEOUT)
        out.append(time.monotonic() - t)
        time.sleep(0.02)


@pytest.mark.parametrize("size_mb,word", [(7.5, "bytes"), (1.0, "context length")])
def test_huge_prompts_do_not_freeze_the_server(base_url, size_mb, word):
    """7.5 MB cannot fit (refused from its byte length, before tokenizing); 1 MB could by its byte length,
    so it is tokenized -- off the event loop -- and then refused for its token count."""
    text = "hello world, this is text. " * int(size_mb * 1e6 / 27)
    stop, latencies = threading.Event(), []
    poller = threading.Thread(target=_max_health_latency, args=(base_url, stop, latencies))
    poller.start()
    try:
        time.sleep(0.2)
        start = time.monotonic()
        r = requests.post(f"{base_url}/generate", json={"text": text}, timeout=TIMEOUT)
        took = time.monotonic() - start
        time.sleep(0.2)
    finally:
        stop.set()
        poller.join()
    assert r.status_code == 400 and word in r.json()["error"]["message"], r.text[:300]
    assert max(latencies) < 0.5, f"/health took up to {max(latencies):.2f} s while a {size_mb} MB prompt was handled"
    print(f"{size_mb} MB prompt answered in {took:.2f} s; /health worst {max(latencies) * 1000:.0f} ms")
