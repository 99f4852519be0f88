"""Request ids that collide with an n > 1 request's internal ids (its warm-up prefill, its samples) never make a
request hang: both users get their answers, or the second a 400 naming the id. The two reported repros, against
the shared SmolLM2 server; every wait is bounded, so a hang fails instead of stalling the suite.
(test/unit/managers/test_tokenizer_manager_request_ids.py holds every interleaving exactly, with a fake scheduler.)"""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="per-commit-cpu")

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

TIMEOUT = 120  # bounded: a request that hangs fails the test


@pytest.fixture(scope="module")
def base_url(smollm2_server):
    return smollm2_server.base_url  # shared with the other modules here (conftest.py)


def generate(base_url: str, **body) -> requests.Response:
    return requests.post(f"{base_url}/generate", json=body, timeout=TIMEOUT)


def slow_parallel_request(pool: ThreadPoolExecutor, base_url: str, rid: str, max_new_tokens: int):
    """An n = 2 request whose warm-up prefill is slow (an uncached 1500-token prompt), sent on `pool`."""
    assert requests.post(f"{base_url}/flush_cache", timeout=TIMEOUT).status_code == 200
    return pool.submit(
        generate,
        base_url,
        input_ids=list(range(100, 1600)),
        rid=rid,
        sampling_params={"max_new_tokens": max_new_tokens, "n": 2, "temperature": 0},
    )


def test_a_request_named_like_the_warmup_is_not_taken_over(base_url):
    """Repro A: `abc-prefill` runs when `abc` with n = 2 starts (its warm-up was once named `abc-prefill`)."""
    abc = f"abc{uuid.uuid4().hex[:6]}"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            generate,
            base_url,
            text="Count: 1, 2, 3,",
            rid=f"{abc}-prefill",
            sampling_params={"max_new_tokens": 60, "temperature": 0, "ignore_eos": True},
        )
        time.sleep(0.5)
        second = generate(base_url, text="Hello", rid=abc, sampling_params={"max_new_tokens": 4, "n": 2})
        r = first.result(timeout=TIMEOUT)
    assert second.status_code == 200, second.text
    assert [o["meta_info"]["id"] for o in second.json()] == [f"{abc}-0", f"{abc}-1"]
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["id"] == f"{abc}-prefill" and len(r.json()["output_ids"]) == 60


def test_a_request_named_like_a_sample_is_not_taken_over(base_url):
    """Repro B: `job3-0` arrives while `job3` (n = 2) is in its warm-up prefill (slow: an uncached 1500-token
    prompt), and runs on when job3's samples start."""
    job = f"job{uuid.uuid4().hex[:6]}"
    with ThreadPoolExecutor(1) as pool:
        a = slow_parallel_request(pool, base_url, job, max_new_tokens=8)
        time.sleep(1.0)
        b = generate(
            base_url,
            text="Count: 1, 2, 3,",
            rid=f"{job}-0",
            sampling_params={"max_new_tokens": 40, "temperature": 0, "ignore_eos": True},
        )
        ra = a.result(timeout=TIMEOUT)
    assert b.status_code == 200, b.text
    assert b.json()["meta_info"]["id"] == f"{job}-0" and len(b.json()["output_ids"]) == 40
    assert ra.status_code == 200, ra.text
    assert [len(o["output_ids"]) for o in ra.json()] == [8, 8]


def test_the_same_id_twice_gets_400_or_waits_its_turn(base_url):
    """The id of an n > 1 request in flight (never registered itself: only reserved) is refused with 400 naming
    it; had the first already finished, the second simply runs. Never a hang."""
    job = f"twice{uuid.uuid4().hex[:6]}"
    with ThreadPoolExecutor(1) as pool:
        a = slow_parallel_request(pool, base_url, job, max_new_tokens=4)
        time.sleep(0.5)
        b = generate(base_url, text="Hi", rid=job, sampling_params={"max_new_tokens": 4})
        ra = a.result(timeout=TIMEOUT)
    assert ra.status_code == 200, ra.text
    assert b.status_code == 200 or (b.status_code == 400 and f"request id '{job}' is already in flight" in b.text)
