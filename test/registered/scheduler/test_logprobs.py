from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="per-commit-cpu")

# Logprobs as SGLang returns them (SmolLM2, CPU, in-process scheduler), against transformers on the same weights:
#   * prompt logprobs from logprob_start_len (position 0 has none), their top-k and chosen ids, and the
#     output tokens' top-k, equal transformers' log-softmax within fp32 tolerance;
#   * the same with chunked prefill (prompt rows scored chunk by chunk) and with the prompt already in the
#     radix cache (a request that wants prompt logprobs recomputes what it needs);
#   * max_new_tokens 0 still runs the prefill (SGLang's prefix caching, sgl.select) and returns no tokens.

import pytest
import torch

from sglang.srt.utils.hf_tokenizer import get_tokenizer
from sglang.test.runners import SMOLLM2, greedy_params, load_hf_model, make_scheduler, run_scheduler, smollm2_engine

TOP = 3
CHOSEN = [11, 500, 4000]
TOL = 2e-3


@pytest.fixture(scope="module")
def prompt():
    return get_tokenizer(SMOLLM2).encode("The quick brown fox jumps over the lazy dog, and then it runs far away.")


@pytest.fixture(scope="module")
def reference(prompt):
    """transformers' log-softmax at every position of prompt + its greedy continuation."""
    model = load_hf_model(SMOLLM2)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=4,
            do_sample=False,
            min_new_tokens=4,
            eos_token_id=None,
            pad_token_id=0,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        full = out[0].tolist()
        logits = model(torch.tensor([full])).logits[0].float()
    return full, torch.log_softmax(logits, dim=-1)


def check_prompt(result, prompt, start, lsm):
    got = result.prompt
    tokens, tops, chosen = got["input_token"], got["input_top"], got["input_ids"]
    assert [t for _, t in tokens] == prompt[start:]
    for j, pos in enumerate(range(start, len(prompt))):
        if pos == 0:
            assert tokens[j][0] is None and tops[j] is None and chosen[j] is None
            continue
        ref = lsm[pos - 1]  # position pos is predicted by the hidden state at pos - 1
        assert abs(tokens[j][0] - ref[prompt[pos]].item()) < TOL
        values, ids = ref.topk(TOP)
        assert [i for _, i in tops[j]] == ids.tolist()
        assert max(abs(v - r) for (v, _), r in zip(tops[j], values.tolist())) < TOL
        assert [i for _, i in chosen[j]] == CHOSEN
        assert max(abs(v - ref[i].item()) for v, i in chosen[j]) < TOL


def run(sched, prompt, start, new=4):
    return run_scheduler(
        sched,
        [prompt],
        greedy_params(new),
        return_logprob=True,
        logprob_start_len=start,
        top_logprobs_num=TOP,
        token_ids_logprob=CHOSEN,
    )[0]


@pytest.mark.parametrize("chunk", [None, 8])
@pytest.mark.parametrize("start", [0, 5])
def test_prompt_and_output_logprobs_match_transformers(prompt, reference, chunk, start):
    full, lsm = reference
    chunking = {"chunked_prefill_size": chunk} if chunk else {}  # None: the default (no chunk this short)
    sched = make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=4096, **chunking)
    run_scheduler(sched, [prompt], greedy_params(1))  # the prompt is now in the radix cache
    result = run(sched, prompt, start)
    assert result.output_ids == full[len(prompt) :]
    check_prompt(result, prompt, start, lsm)
    for k, (token, top) in enumerate(zip(result.output_ids, result.output_top)):
        ref = lsm[len(prompt) + k - 1]
        assert abs(result.logprobs[k] - ref[token].item()) < TOL
        assert [i for _, i in top] == ref.topk(TOP).indices.tolist()
    assert [[i for _, i in c] for c in result.output_ids_logprobs] == [CHOSEN] * 4


def test_max_new_tokens_zero_prefills_and_scores_the_prompt(prompt, reference):
    _, lsm = reference
    sched = make_scheduler(model_path=SMOLLM2, skip_tokenizer_init=True, max_total_tokens=4096)
    result = run(sched, prompt, 1, new=0)
    assert result.output_ids == [] and result.finish_reason == {"type": "length", "length": 0}
    check_prompt(result, prompt, 1, lsm)
    assert sched.tree_cache.total_size() >= len(prompt) - 1  # the prompt stays cached for the next request


def test_engine_generate_returns_them_in_sglangs_layout(prompt, reference):
    """sglang.Engine.generate takes the same logprob fields as /generate and answers in meta_info."""
    full, lsm = reference
    out = smollm2_engine().generate(input_ids=prompt, sampling_params=greedy_params(4), return_logprob=True,
                                    logprob_start_len=1, top_logprobs_num=TOP, token_ids_logprob=CHOSEN,
                                    return_text_in_logprobs=True)  # fmt: skip
    meta = out["meta_info"]
    assert out["output_ids"] == full[len(prompt) :]
    assert [e[1] for e in meta["input_token_logprobs"]] == prompt[1:]
    assert abs(meta["input_token_logprobs"][0][0] - lsm[0][prompt[1]].item()) < TOL
    assert all(isinstance(e[2], str) for e in meta["output_token_logprobs"])  # the token's text
    assert [e[1] for e in meta["output_top_logprobs"][0]] == lsm[len(prompt) - 1].topk(TOP).indices.tolist()
    assert [[e[1] for e in c] for c in meta["output_token_ids_logprobs"]] == [CHOSEN] * 4
