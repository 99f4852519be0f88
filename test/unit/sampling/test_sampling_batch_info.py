from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="per-commit-cpu")

# grammar_bitmask at a grammar's dead end while decoding (SmolLM2's vocabulary, xgrammar): the grammar is not
# complete yet allows no token. Once, the all-false row let the sampler pick token 0, which the matcher refused:
# a 500. Now that request alone finishes with a 400 naming its constraint; its row is all-allowed (no NaN in the
# sampler), and the other rows of the batch keep their masks.

import math

import pytest
import torch

from sglang.srt.constrained.grammar_key import UNSATISFIABLE
from sglang.srt.constrained.xgrammar_backend import XGrammarBackend
from sglang.srt.layers.sampler import Sampler
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo, grammar_bitmask
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2

VOCAB = 49152  # SmolLM2's


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(SMOLLM2)


@pytest.fixture(scope="module")
def backend(tokenizer):
    b = XGrammarBackend(tokenizer, VOCAB, [tokenizer.eos_token_id])
    yield b
    b.shutdown()


def constrained_req(backend, rid: str, regex: str) -> Req:
    params = SamplingParams.from_dict({"regex": regex, "temperature": 0})
    req = Req(rid, [1, 2, 3], params, [2], 0, return_logprob=True)
    key = params.grammar_key
    req.grammar = backend.matcher(backend.compile(key), key)
    return req


def test_a_dead_end_finishes_its_request_with_a_400_and_leaves_the_others(backend, tokenizer):
    # (a|b)[^\s\S] compiles (a choice comes first), but nothing may follow "a" or "b".
    dead = constrained_req(backend, "dead", r"(a|b)[^\s\S]")
    alive = constrained_req(backend, "alive", "(yes|no)")
    a = tokenizer.encode("a", add_special_tokens=False)
    assert len(a) == 1 and dead.grammar.accept_token(a[0])
    dead.output_ids.append(a[0])
    reqs = [dead, alive]
    bitmask = grammar_bitmask(reqs, VOCAB)
    assert dead.finished_reason is not None and alive.finished_reason is None
    reason = dead.finished_reason.to_json()
    assert reason["type"] == "abort" and reason["status_code"] == 400
    assert reason["message"].startswith(f"regex: {UNSATISFIABLE}: after 1 generated tokens"), reason["message"]
    assert (bitmask[0] == -1).all()  # all-allowed: the dropped token is sampled from finite logits
    assert 0 < int((bitmask[1] != 0).sum()) < bitmask.shape[1]  # the other request keeps its grammar's mask
    # The sampler sees finite logprobs in both rows (an all-false row gave NaN and token 0).
    info = SamplingBatchInfo.from_reqs(reqs, VOCAB, "cpu")
    info.grammar_bitmask = bitmask
    out = Sampler()(torch.randn(2, VOCAB), info, return_logprob=True)
    assert all(math.isfinite(v) for v in out.logprobs.tolist())
    assert tokenizer.decode(out.next_token_ids[1:].tolist()) in ("y", "ye", "yes", "n", "no")
    # A finished request's row is not filled again.
    assert (grammar_bitmask(reqs, VOCAB)[0] == -1).all()
