"""Huge doomed prompts are cheap to refuse and do not stall other users; prompts that fit are never refused.
Against the shared SmolLM2 server (context 8192). Measured on 2 cores before the fix: 20 concurrent chats with a
5.2 MB message took 126 s to be refused and a tiny chat beside them 124 s; an 8 MB /tokenize held every other
tokenization for 16 s. After: 2 s, 0.4 s and 5 ms. The bounds below are generous (a busy CI machine)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang.srt.managers import tokenizer_manager

TIMEOUT = 120
CONTEXT = 8192


@pytest.fixture(scope="module")
def base_url(smollm2_server):
    return smollm2_server.base_url  # shared with the other modules here (conftest.py)


def text(n: int) -> str:
    """n characters of prose and code (~2-3 characters a token)."""
    with open(tokenizer_manager.__file__) as f:
        src = f.read()
    return (src * (n // len(src) + 1))[:n]


def chat(base_url: str, messages, max_tokens: int = 1) -> requests.Response:
    body = json.dumps({"model": "default", "messages": messages, "max_tokens": max_tokens})
    return requests.post(
        f"{base_url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}, timeout=TIMEOUT
    )


def timed(fn, *args):
    start = time.monotonic()
    r = fn(*args)
    return r, time.monotonic() - start


def test_doomed_chats_are_refused_quickly_and_others_served(base_url):
    big = [{"role": "user", "content": text(5_200_000)}]
    with ThreadPoolExecutor(8) as pool:
        start = time.monotonic()
        doomed = [pool.submit(chat, base_url, big) for _ in range(8)]
        time.sleep(0.5)
        short, short_s = timed(chat, base_url, [{"role": "user", "content": "Say hi"}], 4)
        outs = [f.result(timeout=TIMEOUT) for f in doomed]
        all_s = time.monotonic() - start
    for r in outs:
        assert r.status_code == 400, r.text[:300]
        assert f"this model's context length is {CONTEXT}" in r.json()["error"]["message"]
    assert short.status_code == 200, short.text
    assert all_s < 30 and short_s < 15, (all_s, short_s)  # before: ~6 s each, one after another


def test_messages_count_together(base_url):
    """No message alone is over the byte bound; the rendered prompt, all of them, is far over the context."""
    parts = [{"role": role, "content": text(2_000_000)} for role in ("user", "assistant", "user")]
    r, took = timed(chat, base_url, parts)
    assert r.status_code == 400 and f"context length is {CONTEXT}" in r.json()["error"]["message"], r.text[:300]
    assert took < 20


def test_a_dense_prompt_that_fits_is_accepted(base_url):
    """~1100 tokens of 64 characters each: longer than the first prefix checked (8 characters a token of the
    context), so the prefix checks run, and must not refuse it."""
    r = chat(base_url, [{"role": "user", "content": ("=" * 6400 + "\n") * 11}])
    assert r.status_code == 200, r.text[:300]


def test_the_exact_count_decides_near_the_limits(base_url):
    """Texts just under and just over a limit pass the prefix checks; the exact count decides. (Accepting a prompt
    of exactly context - 1 tokens costs a minute of CPU prefill here: test/unit/managers/test_tokenizer_manager_prompt_limits.py
    checks it at the tokenizer manager.)"""
    tokenize = lambda s: requests.post(f"{base_url}/tokenize", json={"prompt": s}, timeout=TIMEOUT)  # noqa: E731
    fits = "=" * (64 * (CONTEXT - 1))  # one token a 64 '='
    assert tokenize(fits).json()["count"] == CONTEXT - 1
    r = requests.post(
        f"{base_url}/generate", json={"text": fits + "=" * 64, "sampling_params": {"max_new_tokens": 1}}, timeout=60
    )
    assert r.status_code == 400 and f"the prompt has {CONTEXT} tokens;" in r.json()["error"]["message"], r.text
    # /tokenize: 2.2 M characters, over its first prefix, 34375 tokens: far under its limit, counted.
    r = tokenize("=" * 2_200_000)
    assert r.status_code == 200 and r.json()["count"] == 2_200_000 // 64, r.text[:300]


def test_tokenize_refuses_a_huge_text_and_serves_others_meanwhile(base_url):
    tokenize = lambda s: requests.post(f"{base_url}/tokenize", json={"prompt": s}, timeout=TIMEOUT)  # noqa: E731
    with ThreadPoolExecutor(1) as pool:
        huge = pool.submit(timed, tokenize, text(8_000_000))
        time.sleep(0.3)
        short, short_s = timed(tokenize, "hello world")
        r, took = huge.result(timeout=TIMEOUT)
    assert r.status_code == 400 and "tokenizes at most" in r.json()["error"]["message"], r.text[:300]
    assert short.status_code == 200 and short.json()["count"] == 2
    assert took < 15 and short_s < 2, (took, short_s)  # before: served after 17 s, the short one after 16 s


def test_tokenize_still_counts_a_document_longer_than_the_context(base_url):
    r = requests.post(f"{base_url}/tokenize", json={"prompt": text(200_000)}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["count"] > 4 * CONTEXT
