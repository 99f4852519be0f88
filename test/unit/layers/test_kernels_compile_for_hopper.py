"""Every triton kernel of the project, which the CPU suite runs in the interpreter, also compiles for the GPU
(sm_90, the H100/H200), here without one: triton's own ptxas turns each into a cubin. The interpreter runs code the
GPU compiler refuses (a global that is not a constexpr, a dtype an op does not take on that architecture), which a
CPU-only check would otherwise leave to the GPU machine. Each case names a kernel, its pointer dtypes and
constexprs as the launcher passes them; the compiles run in a subprocess without TRITON_INTERPRET (conftest sets it
for this process)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="per-commit-cpu")

import os
import re
import subprocess
import sys

import pytest

from sglang.test.gpu_utils import triton_has_gpu_tools

FP8 = "fp8e4nv"
# The rotary kernel's pointers with the q/k norm's weights and the KV store, all bf16 (GLM-4.5's and Gemma 3's cases).
ROTARY_QK_NORM_POINTERS = dict(
    q_ptr="bf16",
    k_ptr="bf16",
    cos_ptr="bf16",
    sin_ptr="bf16",
    pos_ptr="i64",
    v_ptr="bf16",
    k_buf="bf16",
    v_buf="bf16",
    loc_ptr="i64",
    vw_ptr="bf16",
    qw_ptr="bf16",
    kw_ptr="bf16",
    ax_ptr="bf16",
    aw_ptr="bf16",
    ay_ptr="bf16",
)


def _cases():
    """(name, kernel, pointer dtypes, float args, constexprs): every kernel of the project, each with the
    constexprs of a real launch (a block-fp8 model's decode step, the MoE and MLA kernels, prefill attention)."""
    import triton.language as tl

    from sglang.srt.layers import fused_elementwise as fe
    from sglang.srt.layers.attention.triton_ops import decode_attention as da
    from sglang.srt.layers.attention.triton_ops import extend_attention as ea
    from sglang.srt.layers.attention.triton_ops import head_matmul as hm
    from sglang.srt.layers.attention.triton_ops import kv_indices as ki
    from sglang.srt.layers.attention.triton_ops import mla_decode as md
    from sglang.srt.layers.decode_gemm import kernel as dk
    from sglang.srt.layers.moe import router_gemm as rg
    from sglang.srt.layers.moe import topk_triton as tt
    from sglang.srt.layers.moe.fused_moe_triton import fused_moe as fm
    from sglang.srt.layers.moe.fused_moe_triton import moe_align as ma
    from sglang.srt.layers.quantization import fp8_activation_kernel as fak
    from sglang.srt.layers.quantization import fp8_block_kernels as fbk
    from sglang.srt.mem_cache import kv_store_kernel as ks
    from sglang.srt.mem_cache import latent_store as ls

    # GLM-4.5's rotary: the per-head q/k norm, partial rotary (half of each 128-wide head), the KV store
    glm_rotary = dict(
        HEAD_DIM=128,
        HALF=32,
        BLOCK_HALF=32,
        BLOCK_PASS=64,
        BLOCK_H=32,
        STORE_KV=True,
        BLOCK_V=1024,
        NORM_V=False,
        INTERLEAVED=False,
        QK_NORM=True,
        QK_UNIT_OFFSET=False,
        ABSORB=False,
        A_K=1,
        A_N=1,
        A_BLOCK_T=1,
        A_BLOCK_N=1,
        A_BLOCK_K=1,
        A_N_BLOCKS=1,
        A_T_BLOCKS=1,
        A_DOT_PRECISION="ieee",
        PDL=True,
    )
    # The skinny decode GEMM on a block-fp8 projection (a Qwen3-8B decode step's, with PDL and the L2 prefetch)
    moe_gemm_pointers = dict(
        a_ptr="bf16",
        b_ptr=FP8,
        scale_ptr="fp32",
        c_ptr="bf16",
        topk_weights_ptr="fp32",
        sh_ptr=FP8,  # unused: the experts' weight stands in
        sorted_ids_ptr="i32",
        expert_ids_ptr="i32",
        num_padded_ptr="i32",
    )
    moe_gemm_block_fp8 = dict(
        N=2048,
        K=7168,
        A_ROW_DIV=1,
        A_GATED=False,
        MUL_ROUTED_WEIGHT=False,
        QUANT=int(fm._Q_FP8),
        GROUP_N=128,
        GROUP_K=128,
        SCALE_K_PER_TILE=True,
        TILE_GROUPS=1,
        DOT_PRECISION="tf32",
        ONE_TOKEN=False,
        ROUTED_SLOTS=0,
        SH_COUNT=0,
        SH_WIDTH=1,
        SH_GATED=False,
        BLOCK_M=16,
        BLOCK_N=64,
        BLOCK_K=128,
        PDL=True,
    )
    # Two codes a byte in groups of 32, four a K step, gate/up with SiLU-and-mul loads (INT4 and MXFP4 alike).
    packed_groups_of_32 = dict(
        moe_gemm_block_fp8, GROUP_N=1, GROUP_K=32, SCALE_K_PER_TILE=False, TILE_GROUPS=4, BLOCK_N=128, A_GATED=True
    )
    skinny_block_fp8 = dict(
        HAS_BIAS=False,
        SCALED=False,
        BLOCK_SCALED=True,
        GATED=False,
        BLOCK_M=16,
        BLOCK_N=64,
        BLOCK_K=128,
        DOT_PRECISION="tf32",
        IMPRECISE_ACC=128,
        WHILE_LOOPS=False,
        USE_PDL=True,
        PREFETCH=True,
    )
    # Decode attention's stage 1 over a bf16 KV cache (a 128-wide GQA head, no soft-cap, no window)
    decode_stage1_pointers = dict(
        Q="bf16",
        K_Buf="bf16",
        V_Buf="bf16",
        Kv_Indptr="i32",
        Kv_Indices="i32",
        Att_Out="fp32",
        Att_Lse="fp32",
        O="bf16",
        QOut="bf16",
        QScale="bf16",
        Num_Kv_Splits="i32",
    )
    decode_stage1 = dict(
        kv_group_num=4,
        progs_per_kv_head=1,
        D=128,
        DV=128,
        BLOCK_D=128,
        BLOCK_DV=128,
        BLOCK_N=128,
        BLOCK_H=16,
        SPLIT_ALIGN=128,
        USE_CAP=False,
        WHILE_LOOPS=False,
        PDL=True,
        DOT_DTYPE=tl.bfloat16,
        KV_HEADS_ADJACENT=True,
        SINGLE_SPLIT_DIRECT=True,
        USE_WINDOW=False,
        V_SCALED=False,
        QUANTIZE=False,
        ROUND_BY_HAND=False,
    )
    cases = []
    for q in (False, True):
        qp, qs = (FP8, "fp32") if q else ("bf16", "bf16")  # dummies (x's dtype) where nothing is quantized
        cases += [
            (
                f"rmsnorm quantize={q}",
                fe._rmsnorm_kernel,
                dict(x_ptr="bf16", res_ptr="bf16", out_ptr="bf16", w_ptr="bf16", q_ptr=qp, qs_ptr=qs),
                {"eps"},
                dict(HAS_RESIDUAL=True, BLOCK=4096, QUANTIZE=q, ROUND_BY_HAND=False, PDL=True),
            ),
            (
                f"silu_and_mul quantize={q}",
                fe._silu_and_mul_kernel,
                dict(x_ptr="bf16", out_ptr="bf16", q_ptr=qp, qs_ptr=qs),
                set(),
                dict(BLOCK=2048, QUANTIZE=q, ROUND_BY_HAND=False, PDL=True),
            ),
            (
                f"split-K sum with add-norm quantize={q}",
                dk._sum_splits_kernel,
                dict(
                    Partials="fp32",
                    Bias="bf16",
                    Residual="bf16",
                    NormWeight="bf16",
                    Addend="bf16",
                    Out="bf16",
                    QOut=qp,
                    QScale=qs,
                ),
                {"eps"},
                dict(
                    SPLIT_K=4,
                    BLOCK=4096,
                    HAS_BIAS=False,
                    ADD_NORM=True,
                    HAS_ADDEND=True,
                    QUANTIZE=q,
                    ROUND_BY_HAND=False,
                    PDL=True,
                ),
            ),
            (
                f"decode attention stage 1 quantize={q}",
                da._decode_grouped_stage1,
                dict(decode_stage1_pointers, QOut=qp, QScale=qs),
                {"sm_scale", "logit_cap", "v_scale"},
                dict(decode_stage1, QUANTIZE=q),
            ),
            (
                f"decode attention stage 2 quantize={q}",
                da._decode_stage2,
                dict(
                    Att_Out="fp32", Att_Lse="fp32", O="bf16", QOut=qp, QScale=qs, Kv_Indptr="i32", Num_Kv_Splits="i32"
                ),
                set(),
                dict(
                    MAX_KV_SPLITS=16,
                    BLOCK_S=16,
                    DV=128,
                    BLOCK_DV=128,
                    SPLIT_ALIGN=128,
                    PDL=True,
                    SINGLE_SPLIT_DIRECT=True,
                    USE_WINDOW=False,
                    QUANTIZE=q,
                    ROUND_BY_HAND=False,
                ),
            ),
        ]
    cases += [
        (
            "activation quantization per 128-column group",
            fbk._quantize_groups_kernel,
            dict(x_ptr="bf16", q_ptr=FP8, scale_ptr="fp32"),
            set(),
            dict(BLOCK=1024, ROUND_BY_HAND=False, PDL=True),
        ),
        (
            "skinny GEMM on block-fp8 operands",
            dk._skinny_gemm_kernel,
            dict(X=FP8, W=FP8, Bias="bf16", XScale="fp32", WScale="fp32", Out="fp32"),
            set(),
            skinny_block_fp8,
        ),
        (
            "decode attention stage 1 with Gemma 2's logit soft-cap (tanh) and sliding window",
            da._decode_grouped_stage1,
            decode_stage1_pointers,
            {"sm_scale", "logit_cap", "v_scale"},
            # 256-wide heads in groups of 2 (Gemma 2 9B's 16 q / 8 kv), the launcher's choice for them
            dict(
                decode_stage1,
                kv_group_num=2,
                D=256,
                DV=256,
                BLOCK_D=256,
                BLOCK_DV=256,
                BLOCK_N=64,
                SPLIT_ALIGN=64,
                USE_CAP=True,
                USE_WINDOW=True,
            ),
        ),
        (
            "Gemma's GeGLU",
            fe._gelu_tanh_and_mul_kernel,
            dict(x_ptr="bf16", out_ptr="bf16"),
            set(),
            dict(BLOCK=2048, PDL=True),
        ),
        (
            "MLA's W_UK / W_UV per head (DeepSeek's 128 x 512)",
            hm._head_matmul_kernel,
            dict(X="bf16", W="bf16", Y="bf16"),
            set(),
            dict(K=128, N=512, BLOCK_T=16, BLOCK_N=64, BLOCK_K=128, DOT_PRECISION="tf32", PDL=True),
        ),
        (
            "skinny GEMM, bf16, SiLU-and-mul epilogue",
            dk._skinny_gemm_kernel,
            dict(X="bf16", W="bf16", Bias="bf16", XScale="bf16", WScale="bf16", Out="bf16"),
            set(),
            dict(skinny_block_fp8, HAS_BIAS=True, BLOCK_SCALED=False, GATED=True, BLOCK_N=32, IMPRECISE_ACC=None),
        ),
        (
            "triton block-scaled fp8 GEMM",
            fbk._block_fp8_gemm_kernel,
            dict(a_ptr=FP8, a_scale_ptr="fp32", b_ptr=FP8, b_scale_ptr="fp32", bias_ptr="bf16", c_ptr="bf16"),
            set(),
            dict(HAS_BIAS=True, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, WHILE_LOOPS=False),
        ),
        (
            "activation quantization per token",
            fak._quantize_rows_kernel,
            dict(x_ptr="bf16", q_ptr=FP8, scale_ptr="fp32"),
            set(),
            dict(BLOCK=4096, ROUND_BY_HAND=False, PDL=True),
        ),
        (
            "rotary with the KV store, the latent norm and the query's W_UK (MLA)",
            fe._rotary_kernel,
            dict(ROTARY_QK_NORM_POINTERS, cos_ptr="fp32", sin_ptr="fp32"),
            {"v_eps", "qk_eps"},
            # DeepSeek's 64-wide rope part rotating as interleaved pairs, the 512-wide latent normed and stored,
            # V2-Lite's 16 heads of q_nope (128) through W_UK (512) at one token as the extra programs' tiles
            dict(
                glm_rotary,
                HEAD_DIM=64,
                BLOCK_PASS=0,
                BLOCK_H=16,
                BLOCK_V=512,
                NORM_V=True,
                INTERLEAVED=True,
                QK_NORM=False,
                ABSORB=True,
                A_K=128,
                A_N=512,
                A_BLOCK_T=16,
                A_BLOCK_N=64,
                A_BLOCK_K=128,
                A_N_BLOCKS=8,
                A_T_BLOCKS=1,
                A_DOT_PRECISION="tf32",
            ),
        ),
        (
            "rotary with the per-head q/k norm, partial rotary and the KV store (GLM-4.5)",
            fe._rotary_kernel,
            ROTARY_QK_NORM_POINTERS,
            {"v_eps", "qk_eps"},
            glm_rotary,
        ),
        (
            "rotary with Gemma 3's (1 + w) per-head q/k norm and the KV store",
            fe._rotary_kernel,
            ROTARY_QK_NORM_POINTERS,
            {"v_eps", "qk_eps"},
            dict(glm_rotary, HALF=64, BLOCK_HALF=64, BLOCK_PASS=0, QK_UNIT_OFFSET=True),  # whole heads rotate
        ),
        (
            "Gemma's RMSNorm, the sandwich between two blocks",
            fe._gemma_rmsnorm_kernel,
            dict(x_ptr="bf16", res_ptr="bf16", out_ptr="bf16", post_w_ptr="bf16", w_ptr="bf16"),
            {"post_eps", "eps"},
            dict(SANDWICH=True, BLOCK=4096, PDL=True),
        ),
        (
            "fused MoE GEMM on block-fp8 experts",
            fm._moe_gemm_kernel,
            moe_gemm_pointers,
            set(),
            moe_gemm_block_fp8,
        ),
        (
            "fused MoE GEMM, one token's slots as tiles (no alignment), SiLU-and-mul loads, routed weights",
            fm._moe_gemm_kernel,
            moe_gemm_pointers,
            set(),
            dict(moe_gemm_block_fp8, ONE_TOKEN=True, A_GATED=True, MUL_ROUTED_WEIGHT=True),
        ),
        (
            "fused MoE GEMM on int4 experts in groups of 32 (two codes a byte: two nibble dots a K step of 4 groups)",
            fm._moe_gemm_kernel,
            dict(moe_gemm_pointers, b_ptr="u8", sh_ptr="u8"),
            set(),
            dict(packed_groups_of_32, QUANT=int(fm._Q_INT4)),
        ),
        (
            "fused MoE GEMM on MXFP4 experts (e2m1 codes, e8m0 scales in groups of 32: four a K step)",
            fm._moe_gemm_kernel,
            dict(moe_gemm_pointers, b_ptr="u8", sh_ptr="u8", scale_ptr="u8"),
            set(),
            dict(packed_groups_of_32, QUANT=int(fm._Q_MXFP4)),
        ),
        (
            "fused MoE GEMM on int4 experts in groups of 128 (a group spans the K step: the weight the right operand)",
            fm._moe_gemm_kernel,
            dict(moe_gemm_pointers, b_ptr="u8", sh_ptr="u8"),
            set(),
            dict(moe_gemm_block_fp8, QUANT=int(fm._Q_INT4), GROUP_N=1, GROUP_K=128, BLOCK_N=128, A_GATED=True),
        ),
        (
            "fused MoE GEMM, one token's gate/up with a dense shared MLP's [gate; up] rows as its last 2 slots (bf16)",
            fm._moe_gemm_kernel,
            dict(moe_gemm_pointers, b_ptr="bf16", sh_ptr="bf16", scale_ptr="bf16"),
            set(),
            dict(
                moe_gemm_block_fp8,
                N=2816,
                K=2048,
                A_ROW_DIV=8,
                QUANT=0,
                SCALE_K_PER_TILE=False,
                ONE_TOKEN=True,
                ROUTED_SLOTS=6,
                SH_COUNT=2,
                SH_WIDTH=1408,
                SH_GATED=True,
                BLOCK_N=128,
            ),
        ),
        (
            "fused MoE GEMM, one token's down with a dense shared MLP's columns as its last 2 slots (bf16)",
            fm._moe_gemm_kernel,
            dict(moe_gemm_pointers, b_ptr="bf16", sh_ptr="bf16", scale_ptr="bf16"),
            set(),
            dict(
                moe_gemm_block_fp8,
                N=2048,
                K=1408,
                QUANT=0,
                SCALE_K_PER_TILE=False,
                ONE_TOKEN=True,
                A_GATED=True,
                MUL_ROUTED_WEIGHT=True,
                ROUTED_SLOTS=6,
                SH_COUNT=2,
                SH_WIDTH=1408,
                SH_GATED=False,
                BLOCK_N=256,
            ),
        ),
        (
            "fused MoE sum over top-k",
            fm._moe_sum_kernel,
            dict(cache_ptr="bf16", ids_ptr="i32", out_ptr="bf16"),
            set(),
            dict(TOP_K=8, BLOCK_H=1024, PDL=True),
        ),
        (
            "extend (prefill) attention, causal, GQA",
            ea._extend_fwd_kernel,
            dict(
                Q="bf16",
                K_Ext="bf16",
                V_Ext="bf16",
                O="bf16",
                K_Buf="bf16",
                V_Buf="bf16",
                Qo_Indptr="i32",
                Kv_Indptr="i32",
                Kv_Indices="i64",
            ),
            {"sm_scale", "logit_cap", "k_scale", "v_scale"},
            dict(
                kv_group_num=4,
                D=128,
                DV=128,
                BLOCK_D=128,
                BLOCK_DV=128,
                BLOCK_M=64,
                BLOCK_N=64,
                IS_CAUSAL=True,
                USE_CAP=False,
                WHILE_LOOPS=False,
                USE_WINDOW=True,
                V_SCALED=False,
            ),
        ),
        (
            "MLA decode over the latent cache",
            md._mla_decode_stage1,
            dict(
                q_latent="bf16",
                q_rope="bf16",
                cache="bf16",
                kv_indptr="i32",
                kv_indices="i64",
                partial="fp32",
                lse="fp32",
                out="bf16",
            ),
            {"scaling_log2"},
            dict(KV_LORA=512, ROPE=64, BLOCK_ROPE=64, BLOCK_H=16, BLOCK_N=64, DIRECT=True, WHILE_LOOPS=False, PDL=True),
        ),
        (
            "MLA merge of the splits",
            md._mla_merge_splits,
            dict(partial="fp32", lse="fp32", out="bf16"),
            set(),
            dict(BLOCK_S=16, BLOCK_D=512, PDL=True),
        ),
        (
            "KV indices and split counts",
            ki._fill_kv_indices_kernel,
            dict(Req_To_Token="i32", Req_Pool_Indices="i64", Kv_Indptr="i32", Kv_Indices="i64", Num_Kv_Splits="i32"),
            set(),
            dict(BLOCK=1024, WITH_SPLITS=True, WHILE_LOOPS=False),
        ),
        (
            "router logits (GEMV)",
            rg._router_logits_kernel,
            dict(X="bf16", W="fp32", Out="fp32"),
            set(),
            dict(BLOCK_E=rg.DEFAULT_TILE.experts, BLOCK_K=rg.DEFAULT_TILE.block_k, WHILE_LOOPS=False, PDL=True),
        ),
        (
            "router logits, the first tile (bench_router_logits.py's comparison)",
            rg._router_logits_kernel,
            dict(X="bf16", W="fp32", Out="fp32"),
            set(),
            dict(BLOCK_E=8, BLOCK_K=512, WHILE_LOOPS=False, PDL=True),
        ),
        (
            "grouped top-k (DeepSeek-V3's noaux_tc)",
            tt._route_topk_kernel,
            dict(logits_ptr="fp32", bias_ptr="fp32", weights_ptr="fp32", ids_ptr="i32"),
            {"scaling"},
            dict(
                TOP_K=8,
                N_GROUP=8,
                GROUP_SIZE=32,
                TOPK_GROUP=4,
                SCORE=int(tt._SIGMOID),
                GROUP_SCORE=int(tt._GROUP_TOP2_SUM),
                HAS_BIAS=True,
                WEIGHT_FROM_SCORES=True,
                RENORMALIZE=True,
                RENORM_EPS=1e-20,
                N_APPEND=0,
                G_PAD=8,
                S_PAD=32,
                K_PAD=8,
                PDL=True,
            ),
        ),
        (
            "softmax top-k with two shared experts' slots appended (DeepSeek-V2-Lite at one token)",
            tt._route_topk_kernel,
            dict(logits_ptr="fp32", bias_ptr="fp32", weights_ptr="fp32", ids_ptr="i32"),
            {"scaling"},
            dict(
                TOP_K=6,
                N_GROUP=1,
                GROUP_SIZE=64,
                TOPK_GROUP=1,
                SCORE=int(tt._SOFTMAX),
                GROUP_SCORE=int(tt._GROUP_NONE),
                HAS_BIAS=False,
                WEIGHT_FROM_SCORES=False,
                RENORMALIZE=False,
                RENORM_EPS=1e-20,
                N_APPEND=2,
                G_PAD=1,
                S_PAD=64,
                K_PAD=8,
                PDL=True,
            ),
        ),
        (
            "MoE alignment of routed tokens",
            ma._moe_align_kernel,
            dict(ids_ptr="i32", sorted_ids_ptr="i32", expert_ids_ptr="i32", num_padded_ptr="i32"),
            set(),
            dict(BLOCK_M=16, E_PAD=256, BLOCK_S=32, BLOCK_T=16, PDL=True),
        ),
        (
            "KV store",
            ks._store_kv_kernel,
            dict(K="bf16", V="bf16", K_Buf="bf16", V_Buf="bf16", Loc="i64"),
            set(),
            dict(ROW_K=1024, ROW_V=1024, BLOCK_K=1024, BLOCK_V=1024),
        ),
        (
            "MLA latent store",
            ls._store_latent_rows,
            dict(cache="bf16", loc="i64", latent="bf16", k_rope="bf16"),
            set(),
            dict(KV_LORA=512, ROPE=64, BLOCK_LORA=512, BLOCK_ROPE=64, PDL=True),
        ),
    ]
    return cases


def compile_for_sm90(
    name: str,
    kernel,
    pointers: dict,
    floats: set,
    constexprs: dict,
    *,
    num_warps: int = 4,
    num_stages: int = 3,
    aligned: bool = False,
):
    """One case compiled for sm_90 (the calling process must not interpret triton): the compiled kernel, whose
    ``asm["cubin"]`` is the GPU code (also benchmark/decode_roofline/sass_census.py's) and ``asm["ttgir"]`` the
    pipelined loop. ``aligned``: every pointer and every ``stride*`` int taken as a multiple of 16, as triton's
    launcher specializes them when their values are (a pool's rows, a tensor's row strides); without it the
    loads cannot be vectorized, so the software pipeline of their copies is not the one a launch gets."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {
        p.name: "constexpr"
        if p.is_constexpr
        else "*" + pointers[p.name]
        if p.name in pointers
        else "fp32"
        if p.name in floats
        else "i32"
        for p in kernel.params
    }
    unset = [p.name for p in kernel.params if p.is_constexpr and p.name not in constexprs]
    assert not unset, f"{name}: constexprs not given: {unset}"
    multiples_of_16 = [
        i
        for i, p in enumerate(kernel.params)
        if not p.is_constexpr and (p.name in pointers or p.name.startswith("stride"))
    ]
    attrs = {(i,): [["tt.divisibility", 16]] for i in multiples_of_16} if aligned else {}
    return triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def ring_depths(compiled) -> list:
    """The software pipeline's shared-memory rings of a compiled kernel, one (tile shape, buffers) a ring: e.g.
    ("64x512xbf16", 2) where the loop's [64, 512] tile is double-buffered (its copy for the next step runs during
    this step's dots), 1 where the next copy is issued only after this step's dots, so nothing overlaps."""
    rings = re.findall(r"local_alloc : \(\) -> !ttg\.memdesc<(\d+)x([0-9x]+x\w+?)[,>]", compiled.asm["ttgir"])
    return [(shape, int(depth)) for depth, shape in rings]


def _compile_all() -> None:
    """Compile every case for sm_90 (this process must not interpret triton); print one line a case."""
    for case in _cases():
        compiled = compile_for_sm90(*case)
        print(f"compiled {case[0]}: {len(compiled.asm['cubin'])} bytes of sm_90 code")


@pytest.mark.skipif(not triton_has_gpu_tools("ptxas"), reason="this triton build has no ptxas to compile GPU code with")
def test_every_kernel_compiles_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, not taken from an earlier run's cache
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert done.stdout.count("compiled ") == len(_cases()), done.stdout


if __name__ == "__main__":
    _compile_all()
