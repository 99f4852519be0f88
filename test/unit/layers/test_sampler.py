from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="per-commit-cpu")

# Sampler: greedy, top-k / top-p / min-p filtering, per-request seeds (reproducible and independent
# of the rest of the batch), the distribution sampled, and the counter-based noise itself.

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.sampler import Sampler, filter_probs, uniform_noise, unit_interval
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo, grammar_bitmask
from sglang.srt.sampling.sampling_params import SamplingParams

V = 64


def sample(logits, info):
    out = Sampler()(logits, info)
    return out.next_token_ids, out.logprobs


def make_info(params, seeds, steps=None, vocab=V, output_ids=None, grammars=None):
    reqs = []
    for i, (p, s) in enumerate(zip(params, seeds)):
        sp = SamplingParams.from_dict(p)
        out = list(output_ids[i] if output_ids else [0] * (steps or [0] * len(params))[i])
        reqs.append(
            SimpleNamespace(
                rid=f"r{i}",
                sampling_params=sp,
                sampling_seed=s,
                output_ids=out,
                num_generated=len(out),
                tokens_in_flight=0,
                origin_input_ids=[1, 2],
                stop_token_ids={2},
                grammar=grammars[i] if grammars else None,
                finished=lambda: False,
            )
        )
    info = SamplingBatchInfo.from_reqs(reqs, vocab, "cpu")
    if grammars:  # as Scheduler.sample sets it, just before the sampling
        info.grammar_bitmask = grammar_bitmask(reqs, vocab)
    return info


class OnlyToken:
    """A grammar stand-in whose matcher allows one token."""

    def __init__(self, token: int) -> None:
        self.token = token

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        bitmask[row, self.token // 32] = 1 << (self.token % 32)


def test_grammar_mask_allows_only_its_tokens_and_logprobs_are_masked():
    n = 64
    grammars = [OnlyToken(37) if i % 2 else None for i in range(n)]
    info = make_info([{"temperature": 1.0}] * n, list(range(n)), grammars=grammars)
    out = Sampler()(logits_rows(n), info, return_logprob=True)
    assert out.next_token_ids[1::2].tolist() == [37] * (n // 2)
    assert torch.allclose(out.logprobs[1::2], torch.zeros(n // 2), atol=1e-6)  # the only allowed token: p = 1
    assert len(set(out.next_token_ids[0::2].tolist())) > 10  # rows without a grammar sample freely


def logits_rows(n, seed=0, vocab=V):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_with_logprobs():
    logits = logits_rows(5)
    info = make_info([{"temperature": 0}] * 5, [1, 2, 3, 4, 5])
    assert info.is_all_greedy
    ids, lps = sample(logits, info)
    assert ids.tolist() == logits.argmax(-1).tolist()
    assert torch.allclose(lps, torch.log_softmax(logits, -1).max(-1).values)


def test_top_k_one_is_greedy_even_with_temperature():
    logits = logits_rows(4, seed=1)
    info = make_info([{"temperature": 1.5, "top_k": 1}] * 4, [7, 8, 9, 10])
    ids, _ = sample(logits, info)
    assert ids.tolist() == logits.argmax(-1).tolist()


def test_mixed_batch_greedy_rows_stay_greedy():
    logits = logits_rows(6, seed=2)
    params = [{"temperature": 0}, {"temperature": 1.0}] * 3
    info = make_info(params, list(range(6)))
    assert not info.is_all_greedy
    ids, _ = sample(logits, info)
    greedy = logits.argmax(-1)
    assert ids[0::2].tolist() == greedy[0::2].tolist()


def _probs_info(**kw):
    return SimpleNamespace(
        need_top_p_top_k=kw.get("need_top_p_top_k", False),
        need_min_p=kw.get("need_min_p", False),
        top_ks=torch.tensor(kw.get("top_ks", [4])),
        top_ps=torch.tensor(kw.get("top_ps", [1.0])),
        min_ps=torch.tensor(kw.get("min_ps", [0.0])),
    )


PROBS = torch.tensor([[0.05, 0.5, 0.15, 0.3]])


def test_filter_top_k():
    out = filter_probs(PROBS.clone(), _probs_info(need_top_p_top_k=True, top_ks=[2]))
    assert out.tolist() == [[0.0, 0.5, 0.0, 0.30000001192092896]]


def test_filter_top_p_keeps_smallest_set_reaching_p():
    # Sorted: 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95. top_p 0.7 keeps 0.5 and 0.3.
    out = filter_probs(PROBS.clone(), _probs_info(need_top_p_top_k=True, top_ps=[0.7]))
    assert (out > 0).tolist() == [[False, True, False, True]]
    out = filter_probs(PROBS.clone(), _probs_info(need_top_p_top_k=True, top_ps=[0.85]))
    assert (out > 0).tolist() == [[False, True, True, True]]
    # The most likely token always survives, however small p is.
    out = filter_probs(PROBS.clone(), _probs_info(need_top_p_top_k=True, top_ps=[0.01]))
    assert (out > 0).tolist() == [[False, True, False, False]]


def test_filter_min_p_is_relative_to_the_top_token():
    out = filter_probs(PROBS.clone(), _probs_info(need_min_p=True, min_ps=[0.5]))  # threshold 0.25
    assert (out > 0).tolist() == [[False, True, False, True]]
    out = filter_probs(PROBS.clone(), _probs_info(need_min_p=True, min_ps=[0.2]))  # threshold 0.1
    assert (out > 0).tolist() == [[False, True, True, True]]


def test_filters_per_row():
    probs = PROBS.repeat(3, 1)
    out = filter_probs(probs, _probs_info(need_top_p_top_k=True, top_ks=[1, 4, 3], top_ps=[1.0, 0.7, 1.0]))
    assert (out > 0).sum(-1).tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    "params,allowed",
    [({"top_k": 3}, 3), ({"top_p": 0.6}, None), ({"min_p": 0.3}, None)],
)
def test_sampled_tokens_respect_filters(params, allowed):
    n = 400
    logits = logits_rows(1, seed=3).repeat(n, 1)
    info = make_info([{"temperature": 1.0, **params}] * n, list(range(1000, 1000 + n)))
    ids, _ = sample(logits, info)
    probs = torch.softmax(logits[0], -1)
    order = probs.argsort(descending=True)
    if "top_k" in params:
        ok = set(order[:allowed].tolist())
    elif "top_p" in params:
        before = probs[order].cumsum(0) - probs[order]
        ok = set(order[before <= params["top_p"]].tolist())
    else:
        ok = set(torch.nonzero(probs >= probs.max() * params["min_p"]).flatten().tolist())
    assert set(ids.tolist()) <= ok
    assert len(set(ids.tolist())) > 1  # it does sample, not argmax


def test_sampling_frequencies_match_probabilities():
    target = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20000
    logits = target.log().repeat(n, 1)
    info = make_info([{"temperature": 1.0}] * n, list(range(n)), vocab=4)
    ids, _ = sample(logits, info)
    freq = torch.bincount(ids, minlength=4).float() / n
    # Binomial standard error is at most ~0.0035 here; allow 4 sigma.
    assert torch.allclose(freq, target, atol=0.015), freq


def test_temperature_sharpens():
    target = torch.tensor([0.4, 0.3, 0.2, 0.1])
    n = 8000
    logits = target.log().repeat(n, 1)
    cold = make_info([{"temperature": 0.25}] * n, list(range(n)), vocab=4)
    hot = make_info([{"temperature": 1.0}] * n, list(range(n)), vocab=4)
    top_cold = (sample(logits, cold)[0] == 0).float().mean()
    top_hot = (sample(logits, hot)[0] == 0).float().mean()
    assert top_cold > top_hot + 0.2


def test_seeded_sampling_is_reproducible_and_batch_invariant():
    logits = logits_rows(8, seed=4)
    params = [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 0},
        {"temperature": 1.2, "top_k": 10},
    ] * 2
    seeds = [11, 22, 33, 44, 55, 66, 77, 88]
    info = make_info(params, seeds, steps=[3] * 8)
    ids_batch, lp_batch = sample(logits, info)
    ids_again, _ = sample(logits, make_info(params, seeds, steps=[3] * 8))
    assert ids_batch.tolist() == ids_again.tolist()
    for i in range(8):
        alone, lp = sample(logits[i : i + 1], make_info([params[i]], [seeds[i]], steps=[3]))
        assert alone.item() == ids_batch[i].item()
        assert torch.allclose(lp, lp_batch[i : i + 1])
    # Reversing the batch order changes nothing either.
    rev, _ = sample(logits.flip(0), make_info(params[::-1], seeds[::-1], steps=[3] * 8))
    assert rev.flip(0).tolist() == ids_batch.tolist()


def test_seed_and_step_change_the_draw():
    n = 256
    logits = torch.zeros(n, V)  # uniform: every token equally likely
    a = sample(logits, make_info([{"temperature": 1.0}] * n, [5] * n, steps=list(range(n))))[0]
    assert len(set(a.tolist())) > 40  # a fixed seed still draws differently at each step
    b = sample(logits, make_info([{"temperature": 1.0}] * n, list(range(n)), steps=[0] * n))[0]
    assert len(set(b.tolist())) > 40


def test_uniform_noise_is_uniform_ish():
    seeds = torch.arange(64, dtype=torch.int64) * 7919
    steps = torch.arange(64, dtype=torch.int64)
    u = uniform_noise(seeds, steps, 4096)
    assert u.shape == (64, 4096)
    assert u.min() > 0 and u.max() < 1
    flat = u.flatten()
    assert abs(flat.mean().item() - 0.5) < 0.005
    assert abs(flat.var().item() - 1 / 12) < 0.002
    hist = torch.histc(flat, bins=20, min=0, max=1) / flat.numel()
    assert (hist - 0.05).abs().max() < 0.004

    # Neighbouring tokens, steps and seeds are uncorrelated.
    def corr(x, y):
        return torch.corrcoef(torch.stack((x.flatten(), y.flatten())))[0, 1].abs().item()

    assert corr(u[:, 1:], u[:, :-1]) < 0.02
    assert corr(u[1:], u[:-1]) < 0.02


def test_noise_stays_inside_the_open_unit_interval_at_its_extremes():
    """Every hash maps strictly inside (0, 1): the largest one once rounded to 1.0, whose exponential noise
    is 0, so that token won the race whatever its probability (a masked one too)."""
    extremes = torch.tensor([-1, 0, (1 << 63) - 1, -(1 << 63), (1 << 41) - 1], dtype=torch.int64)
    u = unit_interval(extremes)
    assert (u > 0).all() and (u < 1).all()
    assert torch.isfinite(-torch.log(u)).all() and (-torch.log(u) > 0).all()


def test_noise_of_neighbouring_seeds_is_not_a_shifted_copy():
    """Seed s+1 must not reuse seed s's noise one token over (a linear seed/token mix does that)."""
    steps = torch.zeros(2, dtype=torch.int64)
    u = uniform_noise(torch.tensor([100, 101]), steps, 512)
    assert not torch.equal(u[1, :-1], u[0, 1:])
    assert (u[1, :-1] - u[0, 1:]).abs().mean() > 0.1
    v = uniform_noise(torch.tensor([100, 100]), torch.tensor([0, 1]), 512)
    assert (v[1, :-1] - v[0, 1:]).abs().mean() > 0.1


def test_noise_is_deterministic_across_calls_and_batch_positions():
    a = uniform_noise(torch.tensor([3, 9]), torch.tensor([1, 2]), 100)
    b = uniform_noise(torch.tensor([9]), torch.tensor([2]), 100)
    assert torch.equal(a[1], b[0])


def test_penalties_change_only_seen_tokens():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    info = make_info([{"temperature": 0, "repetition_penalty": 2.0}], [0], vocab=4, output_ids=[[3]])
    # origin_input_ids [1, 2] and output [3] are seen: positive logits halve, negative double.
    from sglang.srt.layers.sampler import apply_penalties

    # The penalties work in place on the logits (no dense [bs, vocab] temporaries): pass copies.
    assert apply_penalties(logits.clone(), info).tolist() == [[2.0, -2.0, 0.25, 1.5]]
    info = make_info([{"temperature": 0, "frequency_penalty": 1.0}], [0], vocab=4, output_ids=[[3, 3]])
    assert apply_penalties(logits.clone(), info).tolist() == [[2.0, -1.0, 0.5, 1.0]]
    ids, _ = sample(logits.clone(), info)
    assert ids.item() == 0  # the penalty moved the argmax


def test_min_new_tokens_blocks_stop_tokens():
    logits = torch.tensor([[0.0, 0.0, 9.0, 1.0]])  # token 2 is the stop token and the argmax
    info = make_info([{"temperature": 0, "min_new_tokens": 2}], [0], vocab=4, output_ids=[[3]])
    assert sample(logits.clone(), info)[0].item() == 3
    info = make_info([{"temperature": 0, "min_new_tokens": 1}], [0], vocab=4, output_ids=[[3]])
    assert sample(logits.clone(), info)[0].item() == 2
