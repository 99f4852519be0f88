"""MLA's pieces against their references: the absorbed decode equals attention over decompressed keys and
values (padding rows holding NaN change nothing), DeepSeek's interleaved rotary equals transformers' V3 form
(and gives V2's complex-form dot products), and the YaRN softmax scale equals transformers' attention scaling."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="per-commit-cpu")

import math

import pytest
import torch
from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, apply_rotary_pos_emb_interleave

from sglang.srt.layers.attention.mla_torch import absorbed_decode, decompressed_attention, split_kv_b
from sglang.srt.layers.rotary_embedding import rotate_pairs
from sglang.srt.models.deepseek_v2 import yarn_softmax_scale
from sglang.test.tiny_deepseek import tiny_deepseek_config

HEADS, NOPE, ROPE, V, LORA = 4, 16, 8, 12, 32


def _weights(gen):
    w_kv_b = torch.randn(HEADS * (NOPE + V), LORA, generator=gen, dtype=torch.float64) * 0.2
    return split_kv_b(w_kv_b, HEADS, NOPE)


def test_split_kv_b_takes_each_heads_key_then_value_rows():
    w = torch.arange(HEADS * (NOPE + V) * LORA, dtype=torch.float64).view(HEADS * (NOPE + V), LORA)
    w_uk, w_uv = split_kv_b(w, HEADS, NOPE)
    assert w_uk.shape == (HEADS, NOPE, LORA) and w_uv.shape == (HEADS, V, LORA)
    assert torch.equal(w_uk[2, 0], w[2 * (NOPE + V)]) and torch.equal(w_uv[1, 0], w[(NOPE + V) + NOPE])


def test_absorbed_decode_equals_the_decompressed_attention():
    gen = torch.Generator().manual_seed(0)
    w_uk, w_uv = _weights(gen)
    lens = [5, 1, 9]
    rows = torch.full((len(lens), max(lens), LORA + ROPE), float("nan"), dtype=torch.float64)  # padding: NaN
    for b, n in enumerate(lens):
        rows[b, :n] = torch.randn(n, LORA + ROPE, generator=gen, dtype=torch.float64)
    valid = torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]
    q_nope = torch.randn(len(lens), HEADS, NOPE, generator=gen, dtype=torch.float64)
    q_rope = torch.randn(len(lens), HEADS, ROPE, generator=gen, dtype=torch.float64)
    scale = (NOPE + ROPE) ** -0.5
    out = absorbed_decode(q_nope, q_rope, rows, valid, w_uk, w_uv, scale)
    assert out.shape == (len(lens), HEADS, V) and torch.isfinite(out).all()
    for b, n in enumerate(lens):
        # The same query as the last of n tokens, attending to its whole (decompressed) history.
        ref = decompressed_attention(q_nope[b : b + 1], q_rope[b : b + 1], rows[b, :n], w_uk, w_uv, n - 1, scale)
        torch.testing.assert_close(out[b], ref[0], rtol=1e-5, atol=1e-6)  # fp32 softmax
        # And by hand: keys/values of every head from kv_b_proj, softmax over the n positions.
        k = torch.cat(
            [torch.einsum("lc,hnc->hln", rows[b, :n, :LORA], w_uk), rows[b, :n, LORA:].expand(HEADS, n, ROPE)], -1
        )
        vals = torch.einsum("lc,hvc->hlv", rows[b, :n, :LORA], w_uv)
        p = torch.softmax(torch.einsum("hd,hld->hl", torch.cat([q_nope[b], q_rope[b]], -1), k) * scale, -1)
        torch.testing.assert_close(out[b], torch.einsum("hl,hlv->hv", p, vals), rtol=1e-5, atol=1e-6)


def test_decompressed_attention_is_causal_after_the_prefix():
    gen = torch.Generator().manual_seed(1)
    w_uk, w_uv = _weights(gen)
    rows = torch.randn(7, LORA + ROPE, generator=gen, dtype=torch.float64)
    q_nope = torch.randn(3, HEADS, NOPE, generator=gen, dtype=torch.float64)
    q_rope = torch.randn(3, HEADS, ROPE, generator=gen, dtype=torch.float64)
    full = decompressed_attention(q_nope, q_rope, rows, w_uk, w_uv, prefix=4, scaling=0.3)
    for i in range(3):  # token i sees rows [0, 4 + i]: the same as a decode over exactly those rows
        alone = decompressed_attention(q_nope[i : i + 1], q_rope[i : i + 1], rows[: 5 + i], w_uk, w_uv, 4 + i, 0.3)
        torch.testing.assert_close(full[i], alone[0], rtol=1e-10, atol=1e-12)


def test_interleaved_rotary_matches_transformers():
    gen = torch.Generator().manual_seed(2)
    pos = torch.arange(6)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, ROPE, 2, dtype=torch.float) / ROPE))
    freqs = pos[:, None].float() * inv_freq[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    q = torch.randn(6, HEADS, ROPE, generator=gen)
    k = torch.randn(6, 1, ROPE, generator=gen)
    ours_q, ours_k = rotate_pairs(q, cos[:, None], sin[:, None]), rotate_pairs(k, cos[:, None], sin[:, None])
    # transformers' V3: [batch, heads, seq, dim] with cos/sin [batch, seq, dim]
    ref_q, ref_k = apply_rotary_pos_emb_interleave(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    torch.testing.assert_close(ours_q, ref_q[0].transpose(0, 1))
    torch.testing.assert_close(ours_k, ref_k[0].transpose(0, 1))
    # transformers' V2 rotates the pairs in place (complex form): another layout, the same dot products.
    v2_q, v2_k = apply_rotary_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], torch.polar(torch.ones_like(freqs), freqs)[None]
    )
    dots = torch.einsum("thd,tkd->th", ours_q, ours_k)
    torch.testing.assert_close(dots, torch.einsum("htd,ktd->th", v2_q[0], v2_k[0]), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours_q, q)  # the rotation did something


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_softmax_scale_equals_transformers(version):
    config = tiny_deepseek_config(version)
    config._attn_implementation = "eager"
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    ref = DeepseekV3Attention(config, 0).scaling  # the same rule in V2 and V3 (yarn_apply_mscale)
    assert yarn_softmax_scale(config, qk) == pytest.approx(ref, rel=1e-12)
    if version == "v3":  # YaRN with mscale_all_dim 0.8 and factor 4: (0.1 * 0.8 * ln 4 + 1)^2 times qk^-0.5
        assert yarn_softmax_scale(config, qk) == pytest.approx(qk**-0.5 * (0.08 * math.log(4) + 1) ** 2)
        assert yarn_softmax_scale(config, qk) > qk**-0.5 * 1.2
    else:
        assert yarn_softmax_scale(config, qk) == qk**-0.5
