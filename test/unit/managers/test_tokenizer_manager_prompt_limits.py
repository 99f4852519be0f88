"""Doomed prompts are refused after tokenizing a bounded prefix (tokenizer_manager.refuse_over_limit), never a
prompt that fits: with SmolLM2's tokenizer, the property the bound rests on (a prefix has at most a few tokens
more than the whole text's tokens that start inside it), exact fits accepted, doomed texts refused after a
fraction of their characters, a chat's messages counted together, and /tokenize's larger limit."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=14, suite="per-commit-cpu")

import asyncio
import base64
import random
import time
from typing import List

import pytest

from sglang.srt.managers import tokenizer_manager as tm_module
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import (
    BOUNDARY_SLACK_TOKENS,
    TOKENIZE_CONTEXTS,
    BoundedTokenizer,
    RequestError,
    TokenizerManager,
    refuse_over_limit,
)
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.srt.utils.process import PortArgs

CONTEXT = 8192  # SmolLM2's


@pytest.fixture(scope="module")
def hf():
    return get_tokenizer("SmolLM2-135M-Instruct")


def english(n: int) -> str:
    with open(tm_module.__file__) as f:  # prose and code
        src = f.read()
    return (src * (n // len(src) + 1))[:n]


def samples() -> List[str]:
    rng = random.Random(0)
    return [
        english(60_000),
        "=" * 40_000,  # one 64-character token per 64 '=': the densest text
        "".join(rng.choice(["=" * rng.randint(1, 200), " " * rng.randint(1, 40), "\n", "word "]) for _ in range(3000)),
        "".join(chr(rng.randint(0x4E00, 0x9FFF)) if rng.random() > 0.05 else "，" for _ in range(15_000)),  # CJK
        base64.b64encode(rng.randbytes(30_000)).decode(),
        "".join(chr(rng.choice([rng.randint(32, 0x2FFF), rng.randint(0x300, 0x36F)])) for _ in range(15_000)),
    ]


def test_a_prefix_never_has_many_more_tokens_than_the_whole(hf):
    """What refuse_over_limit rests on: cut anywhere (the worst case; it prefers a space), a prefix has at most a
    few tokens more than the whole text's tokens that start before the cut, far under BOUNDARY_SLACK_TOKENS."""
    rng = random.Random(1)
    worst = 0
    for text in samples():
        enc = hf.backend_tokenizer.encode(text, add_special_tokens=False)
        starts = [start for start, _ in enc.offsets]
        for _ in range(40):
            cut = rng.randint(1, len(text) - 1)
            in_prefix = len(hf.encode(text[:cut], add_special_tokens=False))
            worst = max(worst, in_prefix - sum(1 for s in starts if s < cut))
    assert worst <= 8 < BOUNDARY_SLACK_TOKENS


@pytest.mark.parametrize("chars_per_token", [1, tm_module.PREFIX_CHARS_PER_TOKEN])
def test_a_text_of_exactly_the_limit_is_never_refused(hf, monkeypatch, chars_per_token):
    """1 character a token: prefixes of every text are tokenized (not only of dense ones), the case closest to
    a false refusal."""
    monkeypatch.setattr(tm_module, "PREFIX_CHARS_PER_TOKEN", chars_per_token)
    refused = 0
    for text in samples():
        n = len(hf.encode(text))
        for limit in (n, n + 1):
            refuse_over_limit(text, limit, hf.encode, lambda k: f"refused at {k}")  # raises nothing
        # Four times over: refused when a prefix shows it (else the exact count after the whole is tokenized
        # does), and the count it reports is a true lower bound.
        try:
            refuse_over_limit(text, n // 4, hf.encode, lambda k: f"refused at {k}")
        except RequestError as e:
            refused += 1
            assert n // 4 < int(e.message.split()[-1]) <= n
    assert refused >= (4 if chars_per_token == 1 else 1)  # by default only texts much longer than the limit


def test_a_doomed_text_costs_a_bounded_prefix(hf):
    """5.2 MB (as in the report) is refused after tokenizing a small part of it, whatever its size."""
    for text in (english(5_200_000), "=" * 5_200_000):
        seen: List[int] = []
        with pytest.raises(RequestError):
            refuse_over_limit(text, CONTEXT - 1, lambda s, seen=seen: seen.append(len(s)) or hf.encode(s), str)
        assert sum(seen) < len(text) / 3, seen


def new_tm(hf) -> TokenizerManager:
    args = ServerArgs(model_path="SmolLM2-135M-Instruct")
    info = {"context_len": CONTEXT, "vocab_size": 49152, "max_total_num_tokens": 16384}
    return TokenizerManager(args, PortArgs.init_new(), info, tokenizer=hf)


@pytest.fixture(scope="module")
def tm(hf):
    return new_tm(hf)  # never started: its methods are called directly


def with_context(tm: TokenizerManager, context_len: int) -> TokenizerManager:
    tm.context_len = context_len
    tm.tokenizer = BoundedTokenizer(tm.tokenizer.unbounded, context_len)
    return tm


@pytest.mark.parametrize("kind", ["english", "dense"])
def test_a_prompt_that_exactly_fits_is_accepted(tm, hf, kind):
    """A prompt of context_len - 1 tokens with max_new_tokens 1 is accepted; one token more is refused, by the
    exact count. The dense prompt (longer than the first prefix) goes through the prefix checks first."""
    text = english(30_000) if kind == "english" else ("=" * 64 + " ") * 2500
    n = len(hf.encode(text))
    assert kind == "english" or len(text) > (n + BOUNDARY_SLACK_TOKENS) * tm_module.PREFIX_CHARS_PER_TOKEN
    req = GenerateReqInput(text=text, sampling_params={"max_new_tokens": 1})
    try:
        assert len(with_context(tm, n + 1).tokenize_one(req).input_ids) == n
        with pytest.raises(RequestError, match=f"the prompt has {n} tokens; this model's context length is {n}"):
            with_context(tm, n).tokenize_one(req)
    finally:
        with_context(tm, CONTEXT)


def test_generate_refuses_a_doomed_prompt_quickly(hf):
    tm = new_tm(hf)

    async def main() -> float:
        start = time.monotonic()
        try:
            with pytest.raises(RequestError, match="this model's context length is 8192") as e:
                await tm.generate_request(GenerateReqInput(text=english(5_200_000))).__anext__()
        finally:
            await tm.stop()
        assert e.value.status_code == 400 and "the prompt has at least" in e.value.message
        return time.monotonic() - start

    assert asyncio.run(main()) < 3.0  # tokenizing it whole took ~5 s on 2 cores; its first prefix takes ~0.05 s


def test_chat_messages_count_together(tm):
    """Each message alone fits; together they do not: the rendered prompt is what is checked (the chat endpoints
    encode it with encode_prompt)."""
    tok = tm.tokenizer
    part = english(12_000)
    assert len(tok.unbounded.encode(part)) < CONTEXT / 2
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": part} for i in range(15)]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with pytest.raises(RequestError, match="the prompt has at least .* context length is 8192"):
        tok.encode_prompt(prompt, add_special_tokens=False)
    assert len(tok.encode(prompt, add_special_tokens=False)) > CONTEXT  # /tokenize's limit is larger
    small = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert tok.encode_prompt(small, add_special_tokens=False) == tok.unbounded.encode(small, add_special_tokens=False)


def test_tokenize_counts_long_documents_up_to_its_limit(tm):
    """/tokenize's encode: a document of several contexts is counted; one far over TOKENIZE_CONTEXTS contexts is
    refused after a prefix."""
    tok = tm.tokenizer
    doc = english(200_000)  # ~ 6 contexts
    assert len(tok.encode(doc)) > 4 * CONTEXT
    with pytest.raises(RequestError, match=f"tokenizes at most {TOKENIZE_CONTEXTS * CONTEXT}"):
        tok.encode(english(8_000_000))


def test_a_short_request_is_tokenized_while_a_long_one_runs(tm):
    """Two tokenizer threads: a request is not queued behind a long tokenization (a blocked thread here)."""

    async def main() -> float:
        long = asyncio.ensure_future(tm.run_cpu(time.sleep, 2.0))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        await tm.run_cpu(tm.tokenize_one, GenerateReqInput(text="Hello", sampling_params={"max_new_tokens": 1}))
        took = time.monotonic() - start
        await long
        return took

    assert asyncio.run(main()) < 1.0
