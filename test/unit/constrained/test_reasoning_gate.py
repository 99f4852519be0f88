from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# A grammar applies from the end of the reasoning on (--reasoning-parser): the gate over the end tag's token
# ids (one or several, a tag that overlaps itself), a RequestGrammar over SmolLM2's vocabulary that allows
# every token while the model reasons and only the schema's after `</think>`, and which chat requests think.

import pytest
import torch

from sglang.srt.constrained.grammar_key import GrammarKey
from sglang.srt.constrained.reasoning_gate import ReasoningGate, reasoning_end_ids
from sglang.srt.constrained.xgrammar_backend import XGrammarBackend, allocate_bitmask, apply_bitmask
from sglang.srt.parser.reasoning_parser import requires_reasoning
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2

VOCAB = 49152  # SmolLM2's


def run_gate(end, tokens):
    gate = ReasoningGate(tuple(end))
    opened_at = None
    for i, t in enumerate(tokens):
        gate.accept(t)
        if gate.open:
            opened_at = i
            break
    return opened_at


@pytest.mark.parametrize(
    "end,tokens,opened_at",
    [
        ([7], [1, 2, 7, 9], 2),
        ([7, 8], [7, 1, 7, 8, 3], 3),
        ([7, 8], [8, 7, 7, 8], 3),  # a repeated first token keeps the match going
        ([7, 7, 8], [7, 7, 7, 8], 3),  # the tag overlaps itself
        ([7, 8, 7, 9], [7, 8, 7, 8, 7, 9], 5),
        ([7, 8], [8, 1, 7, 1, 8], None),  # the tag's tokens apart do not end the reasoning
    ],
)
def test_gate_opens_right_after_the_end_tag(end, tokens, opened_at):
    assert run_gate(end, tokens) == opened_at


def test_an_empty_end_means_no_reasoning():
    assert ReasoningGate(()).open


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(SMOLLM2)


def allowed(grammar, token: int) -> bool:
    mask = allocate_bitmask(1, VOCAB)
    grammar.fill_bitmask(mask, 0)
    logits = torch.zeros(1, VOCAB)
    apply_bitmask(logits, mask)
    return bool(torch.isfinite(logits[0, token]))


def test_the_schema_applies_after_the_reasoning_end(tokenizer):
    backend = XGrammarBackend(tokenizer, VOCAB, [tokenizer.eos_token_id])
    try:
        key = GrammarKey("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}')
        end = reasoning_end_ids(tokenizer, "</think>")
        assert tokenizer.decode(list(end)) == "</think>"
        grammar = backend.matcher(backend.compile(key), key, end)
        enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        letter, brace = enc("Hmm")[0], enc("{")[0]
        for t in enc("Hmm, {not json} here") + list(end[:-1]):  # free text, braces too, the tag's start
            assert allowed(grammar, letter) and not grammar.is_terminated()
            assert grammar.accept_token(t)
        assert grammar.accept_token(end[-1])  # the reasoning ends: the schema from here on
        assert not allowed(grammar, letter) and allowed(grammar, brace)
        for t in enc('{"a": 5}'):
            assert grammar.accept_token(t)
        assert not grammar.accept_token(letter)  # the grammar refuses what it does not allow
        assert grammar.accept_token(tokenizer.eos_token_id) and grammar.is_terminated()
        plain = backend.matcher(backend.compile(key), key)  # no reasoning: constrained from the first token
        assert not allowed(plain, letter) and allowed(plain, brace)
    finally:
        backend.shutdown()


@pytest.mark.parametrize(
    "parser,kwargs,thinks",
    [
        (None, {}, False),
        ("qwen3", {}, True),
        ("qwen3", {"enable_thinking": False}, False),
        ("glm45", {"enable_thinking": True}, True),
        ("deepseek-r1", {"enable_thinking": False}, True),  # R1 always thinks
        ("kimi_k2", {}, True),
    ],
)
def test_which_chat_requests_think_first(parser, kwargs, thinks):
    assert requires_reasoning(parser, kwargs) is thinks
