from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="per-commit-cpu")

# Both grammar backends (xgrammar, llguidance) over SmolLM2's vocabulary: the compile cache (a repeated (kind, text) is a hit and
# the same future; a 20-property schema compiles well under a second), errors that name the field for every
# kind, and a matcher whose bitmask masks CPU logits to the grammar's next tokens, with rollback; grammars no
# output can satisfy are refused when they compile.

import json
import time

import llguidance
import pytest
import torch

from sglang.srt.constrained.grammar_key import ANY_JSON, UNSATISFIABLE, GrammarKey
from sglang.srt.constrained.llguidance_backend import LLGuidanceBackend
from sglang.srt.constrained.xgrammar_backend import (
    GrammarCompileError,
    XGrammarBackend,
    allocate_bitmask,
    apply_bitmask,
)
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2

VOCAB = 49152  # SmolLM2's


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(SMOLLM2)


BACKENDS = {"xgrammar": XGrammarBackend, "llguidance": LLGuidanceBackend}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request, tokenizer):
    b = BACKENDS[request.param](tokenizer, VOCAB, [tokenizer.eos_token_id])
    yield b
    b.shutdown()


def twenty_properties(tag: str) -> str:
    props = {f"{tag}_{i}": {"type": ["integer", "string", "boolean"][i % 3]} for i in range(20)}
    return json.dumps({"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False})


def test_second_compile_is_a_cache_hit_and_a_big_schema_compiles_fast(backend):
    key = GrammarKey("json_schema", twenty_properties("p"))
    start = time.perf_counter()
    first = backend.compile(key)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"a 20-property schema took {elapsed:.3f} s to compile"
    assert backend.cache_stats().misses == 1 and backend.cache_stats().hits == 0
    start = time.perf_counter()
    again = backend.compile(GrammarKey("json_schema", twenty_properties("p")))  # an equal key, a new object
    assert again is first
    assert backend.cache_stats().hits == 1 and backend.cache_stats().misses == 1
    assert time.perf_counter() - start < 0.01
    other = backend.compile_async(GrammarKey("regex", twenty_properties("p")))  # same text, other kind
    assert isinstance(other.exception(), GrammarCompileError)  # its own entry (the schema is no regex)
    assert backend.cache_stats().misses == 2


def test_cache_is_bounded_lru(tokenizer):
    b = XGrammarBackend(tokenizer, VOCAB, cache_size=2)
    try:
        keys = [GrammarKey("regex", f"[a-z]{{{n}}}") for n in (1, 2, 3)]
        b.compile(keys[0])
        b.compile(keys[1])
        b.compile(keys[0])  # most recent now
        b.compile(keys[2])  # evicts keys[1]
        assert b.cache_stats().size == 2
        b.compile(keys[0])
        assert b.cache_stats().hits == 2
        b.compile(keys[1])
        assert b.cache_stats().misses == 4
    finally:
        b.shutdown()


@pytest.mark.parametrize(
    "kind,text",
    [
        ("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}'),
        ("regex", "(unclosed"),
        ("ebnf", "root ::= missing_rule"),
        ("structural_tag", '{"type": "structural_tag", "format": {"type": "no_such_format"}}'),
    ],
)
def test_a_grammar_that_does_not_compile_names_its_field(backend, kind, text):
    future = backend.compile_async(GrammarKey(kind, text))
    with pytest.raises(GrammarCompileError) as e:
        future.result()
    refused = isinstance(backend, LLGuidanceBackend) and kind == "structural_tag"  # xgrammar's format only
    assert str(e.value).startswith(f"{kind}: " + ("not served by" if refused else "does not compile: "))
    assert "/project/" not in str(e.value)  # xgrammar's source location is cut off
    assert backend.compile_async(GrammarKey(kind, text)) is future  # a failure is cached too


def allowed_tokens(grammar, tokenizer) -> set:
    bitmask = allocate_bitmask(2, VOCAB)
    grammar.fill_bitmask(bitmask, 1)
    logits = torch.zeros(2, VOCAB)
    apply_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0]).all()  # row 0 has no grammar: untouched
    return set(torch.nonzero(torch.isfinite(logits[1])).flatten().tolist())


def test_matcher_masks_logits_to_the_grammar_and_rolls_back(backend, tokenizer):
    key = GrammarKey("regex", "(yes|no)")
    grammar = backend.matcher(backend.compile(key), key)
    first = allowed_tokens(grammar, tokenizer)
    texts = {tokenizer.decode([t]) for t in first}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts)
    yes = tokenizer.encode("yes", add_special_tokens=False)
    for t in yes:
        assert grammar.accept_token(t)
    assert allowed_tokens(grammar, tokenizer) == {tokenizer.eos_token_id}  # complete: only the stop token
    assert not grammar.is_terminated()  # until the stop token comes
    grammar.rollback(len(yes))
    assert allowed_tokens(grammar, tokenizer) == first
    assert grammar.accept_token(tokenizer.encode("no", add_special_tokens=False)[0])
    assert grammar.accept_token(tokenizer.eos_token_id) and grammar.is_terminated()
    assert not grammar.accept_token(tokenizer.encode("x", add_special_tokens=False)[0])  # nothing after the end


def test_any_json_compiles_the_builtin_json_grammar(backend, tokenizer):
    key = GrammarKey("json_schema", ANY_JSON)
    grammar = backend.matcher(backend.compile(key), key)
    for t in tokenizer.encode('[1, "a", {"b": null}]', add_special_tokens=False):
        assert grammar.accept_token(t)
    assert grammar.accept_token(tokenizer.eos_token_id)


# Grammars no output can satisfy (issue: they were sampled from an all-false mask, token 0, then a 500). Each is
# refused when it compiles, naming its field: no token may start it, or none may follow the text it forces.
# llguidance finds some of these unsatisfiable itself ("does not compile: Unsatisfiable schema", a regex it
# cannot read); either way a GrammarCompileError, which the scheduler answers with a 400.
UNSATISFIABLE_GRAMMARS = [
    ("regex", r"[^\s\S]"),
    ("regex", r"a[^\s\S]"),  # a dead end after "a", the text it forces
    ("ebnf", r"root ::= [^\x00-\U0010FFFF]"),
    ("json_schema", json.dumps({"type": "string", "pattern": r"[^\s\S]"})),
    (
        "json_schema",
        json.dumps(
            {"type": "object", "properties": {"a": {"pattern": r"[^\s\S]", "type": "string"}}, "required": ["a"]}
        ),
    ),
]


@pytest.mark.parametrize("kind,text", UNSATISFIABLE_GRAMMARS)
def test_a_grammar_no_output_satisfies_is_refused_when_it_compiles(backend, kind, text):
    with pytest.raises(GrammarCompileError) as e:
        backend.compile(GrammarKey(kind, text))
    message = str(e.value)
    assert message.startswith(f"{kind}: "), message
    if isinstance(backend, XGrammarBackend):
        assert message.startswith(f"{kind}: {UNSATISFIABLE}: "), message
    else:
        assert UNSATISFIABLE in message or "does not compile" in message, message


def test_a_satisfiable_grammar_that_forces_text_still_compiles(backend, tokenizer):
    """The check follows forced text (a const, a fixed prefix) without refusing what can complete."""
    for key in (
        GrammarKey("json_schema", json.dumps({"const": "a fixed answer of several words"})),
        GrammarKey("regex", "prefix: (yes|no)"),
        GrammarKey("regex", r"(a|b)[^\s\S]"),  # a dead end past a choice: found while decoding, not here
    ):
        if isinstance(backend, LLGuidanceBackend) and key.text == r"(a|b)[^\s\S]":
            continue  # llguidance sees this one is empty: refused when it compiles
        grammar = backend.matcher(backend.compile(key), key)
        assert allowed_tokens(grammar, tokenizer)


def test_llguidance_allows_no_token_where_no_output_can_follow(tokenizer):
    """llguidance allows the stop token in its error state, which would end an unsatisfiable request as a
    success with output its grammar refuses; the matcher allows no token instead (a dead end)."""
    b = LLGuidanceBackend(tokenizer, VOCAB, [tokenizer.eos_token_id])
    try:
        grammar = b._new_matcher(llguidance.LLMatcher.grammar_from_regex(r"[^\s\S]"))
        bitmask = allocate_bitmask(1, VOCAB)
        grammar.fill_next_token_bitmask(bitmask, 0)
        assert not bitmask.any()
    finally:
        b.shutdown()


def test_a_forced_tool_call_whose_parameters_no_arguments_satisfy_is_refused(tokenizer):
    """A forced call's tag allows free whitespace in its JSON, where the forced text stops; its schema is
    checked compact too. With another tool to call, the grammar can still be satisfied: compiled."""
    from sglang.srt.function_call.tool_choice_grammar import forced_tool_choice_tag

    empty = {"type": "object", "properties": {"a": {"type": "string", "pattern": r"[^\s\S]"}}, "required": ["a"]}
    bad = {"type": "function", "function": {"name": "f", "parameters": empty}}
    good = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}
    b = XGrammarBackend(tokenizer, VOCAB, [tokenizer.eos_token_id])
    try:
        for tools, choice in (([bad], "required"), ([good, bad], {"type": "function", "function": {"name": "f"}})):
            tag = forced_tool_choice_tag("qwen25", tools, choice, False, "tool_choice")
            with pytest.raises(GrammarCompileError) as e:
                b.compile(GrammarKey("structural_tag", tag))
            assert str(e.value).startswith(f"structural_tag: {UNSATISFIABLE}: "), str(e.value)
        b.compile(GrammarKey("structural_tag", forced_tool_choice_tag("qwen25", [good, bad], "required", False, "x")))
    finally:
        b.shutdown()
