"""The pure planner with numbers alone: the sizing path, the static and post-capture formulas on H200
numbers, uneven TP head splits, KT reservations, --max-total-tokens, page and granule rounding.

Rows use powers of two where the arithmetic is done by hand in the comments (1 - 0.875 = 1/8 is exact
in binary, so these rows involve no float rounding)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="per-commit-cpu")

import dataclasses
from typing import Optional

import pytest

from sglang.srt.model_executor.pool_configurator import (
    MEASURED_HEADROOM_RULE,
    STATIC_HEADROOM_RULE,
    CaptureReadings,
    KVGeometry,
    MemoryReadings,
    NotEnoughMemoryError,
    PoolArgs,
    backed_bytes_per_buffer,
    decide_sizing_path,
    post_capture_pool_size,
    static_pool_size,
    tokens_backed_before_capture,
    tokens_in_backed_bytes,
    virtual_pool,
)

GiB, MiB = 1 << 30, 1 << 20
H200_CAPACITY = 143771 * MiB
LLAMA_8B = KVGeometry(num_layers=32, kv_heads=8, head_dim=128, v_head_dim=128, dtype_bytes=2)  # 128 KiB/token


def readings(free_before_gib=139.25, free_after_gib=124.25, kv=LLAMA_8B, page=1, reservations=None, **kw):
    return MemoryReadings(
        device_capacity_bytes=H200_CAPACITY,
        free_before_weights_bytes=int(free_before_gib * GiB),
        free_after_weights_bytes=int(free_after_gib * GiB),
        kv=kv,
        page_size=page,
        reservations_bytes=reservations or {},
        **kw,
    )


def args(mfs=0.875, max_total_tokens=None, max_running_requests=None, context_len=131072, reserve_mib=10240):
    return PoolArgs(
        mem_fraction_static=mfs,
        static_mem_fraction_static=0.907,
        max_total_tokens=max_total_tokens,
        max_running_requests=max_running_requests,
        context_len=context_len,
        activation_reserve_bytes=reserve_mib * MiB,
    )


def test_the_planner_is_pure():
    """No torch, no CUDA, no I/O: the module imports only the standard library."""
    import ast
    import inspect

    from sglang.srt.model_executor import pool_configurator

    tree = ast.parse(inspect.getsource(pool_configurator))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert imported <= {"__future__", "dataclasses", "math", "typing", "sglang"}, imported
    runtime_sglang = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module.startswith("sglang")]
    assert runtime_sglang == []


def test_kv_geometry_is_the_one_cell_size():
    assert LLAMA_8B.cell_size_bytes == 8 * (128 + 128) * 32 * 2 == 128 * 1024
    assert LLAMA_8B.k_slot_bytes == LLAMA_8B.v_slot_bytes == LLAMA_8B.widest_slot_bytes == 8 * 128 * 2
    mla_like = KVGeometry(num_layers=2, kv_heads=1, head_dim=192, v_head_dim=128, dtype_bytes=1)
    assert mla_like.widest_slot_bytes == 192 and mla_like.cell_size_bytes == (192 + 128) * 2
    assert mla_like.num_buffers == 4

    assert mla_like.attention == "mha"  # a K/V pair of unequal widths is still MHA's two buffers per layer


# DeepSeek-V3 (61 layers, kv_lora_rank 512, qk_rope_head_dim 64): one latent row of 576 values per token and layer.
DEEPSEEK_V3 = KVGeometry.latent(num_layers=61, kv_lora_rank=512, qk_rope_head_dim=64, dtype_bytes=2)


def test_mla_geometry_is_one_latent_buffer_per_layer():
    assert DEEPSEEK_V3.is_mla and DEEPSEEK_V3.attention == "mla"
    assert DEEPSEEK_V3.cell_size_bytes == 61 * 576 * 2 == 70272  # vs 98,304 for Qwen3-30B-A3B's GQA
    assert DEEPSEEK_V3.k_slot_bytes == DEEPSEEK_V3.widest_slot_bytes == 576 * 2 and DEEPSEEK_V3.v_slot_bytes == 0
    assert DEEPSEEK_V3.num_buffers == 61  # one per layer, not a K and a V
    fp8 = KVGeometry.latent(num_layers=61, kv_lora_rank=512, qk_rope_head_dim=64, dtype_bytes=1)
    assert fp8.cell_size_bytes == 70272 // 2
    lite = KVGeometry.latent(num_layers=27, kv_lora_rank=512, qk_rope_head_dim=64, dtype_bytes=2)  # V2-Lite
    assert lite.cell_size_bytes == 27 * 576 * 2 == 31104
    with pytest.raises(ValueError, match="one latent row"):
        KVGeometry(num_layers=2, kv_heads=2, head_dim=576, v_head_dim=0, dtype_bytes=2, attention="mla")
    with pytest.raises(ValueError, match="attention kind"):
        KVGeometry(num_layers=2, kv_heads=1, head_dim=8, v_head_dim=8, dtype_bytes=2, attention="gqa")


def test_static_pool_size_with_the_deepseek_v3_cell():
    """The same static rule, the latent cell: (budget - reservation) // 70,272 bytes."""
    r = readings(kv=DEEPSEEK_V3, page=64)
    pool = static_pool_size(r, args())
    budget = int(124.25 * GiB - 139.25 * GiB / 8)
    assert pool.budget_bytes == budget
    assert pool.tokens == budget // 70272 // 64 * 64
    # The MHA cell of the same model decompressed (128 heads x (192 + 128) values) would hold 71x fewer tokens.
    mha = KVGeometry(num_layers=61, kv_heads=128, head_dim=192, v_head_dim=128, dtype_bytes=2)
    assert static_pool_size(readings(kv=mha, page=64), args()).tokens == budget // mha.cell_size_bytes // 64 * 64
    assert mha.cell_size_bytes == 61 * 128 * 320 * 2


# ------------------------------------------------------------------------ the path
def _path(vmm: Optional[str] = None, **kw):
    """(the decided path, whether the VMM probe was asked)."""
    base = dict(flag_on=True, device="cuda", cuda_graphs=True, chunked_prefill_size=8192, attention_backend="triton")
    asked = []

    def vmm_problem() -> Optional[str]:
        asked.append(True)
        return vmm

    return decide_sizing_path(**{**base, **kw}, vmm_problem=vmm_problem), bool(asked)


PATH_CASES = [
    (dict(), True, "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1", True),
    (dict(flag_on=False), False, "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off", False),
    (dict(device="cpu", attention_backend="torch_native"), False, "device is not CUDA", False),
    (dict(cuda_graphs=False), False, "decode CUDA graphs are disabled", False),
    (dict(chunked_prefill_size=-1), False, "chunked prefill is disabled", False),
    (dict(attention_backend="torch_native"), False, "the torch_native attention backend has no CUDA graphs", False),
    (dict(vmm="no driver"), False, "CUDA VMM unavailable: no driver", True),
]


@pytest.mark.parametrize("kw,post_capture,reason,vmm_asked", PATH_CASES)
def test_path_is_decided_once_with_its_reason(kw, post_capture, reason, vmm_asked):
    path, asked = _path(**kw)
    assert path.post_capture == post_capture
    assert reason in path.reason
    assert path.name == ("post-capture" if post_capture else "static")
    assert asked == vmm_asked  # the driver is asked only when nothing else rules post-capture out


def test_every_blocker_is_named():
    path, _ = _path(flag_on=False, cuda_graphs=False, chunked_prefill_size=-1)
    assert path.reason.split("; ") == [
        "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off",
        "decode CUDA graphs are disabled",
        "chunked prefill is disabled",
    ]


# ---------------------------------------------------------------------- static path
# (free before, free after, page, reservation bytes, --max-total-tokens) -> tokens, by hand:
#   headroom = 139.25 GiB / 8 = 17.40625 GiB; budget = 124.25 - 17.40625 = 106.84375 GiB
#   tokens = (budget - reservation) // 128 KiB, then the cap, then whole pages.
STATIC_CASES = [
    ("H200 Llama-3.1-8B", 1, 0, None, 106.84375 * 8192),  # = 875264
    ("page 64 (divides)", 64, 0, None, 875264),  # 875264 = 64 * 13676
    # KT slot of 0.5 GiB + 1000 bytes: 106.34375 GiB - 1000 B -> 871168 - 1 tokens; page 16 -> 871152.
    ("KT reservation", 1, GiB // 2 + 1000, None, 871167),
    ("KT reservation, page 16", 16, GiB // 2 + 1000, None, 871152),
    ("--max-total-tokens caps", 1, 0, 500000, 500000),
    ("--max-total-tokens caps, page 64", 64, 0, 500000, 499968),  # 500000 // 64 * 64
    ("--max-total-tokens above memory", 1, 0, 10**7, 875264),
]


@pytest.mark.parametrize("name,page,reserved,mtt,tokens", STATIC_CASES, ids=[c[0] for c in STATIC_CASES])
def test_static_pool_size(name, page, reserved, mtt, tokens):
    r = readings(page=page, reservations={"kt_full_gpu_prefill_slot": reserved} if reserved else None)
    pool = static_pool_size(r, args(max_total_tokens=mtt))
    assert pool.tokens == tokens
    assert pool.headroom_bytes == int(139.25 * GiB / 8) and pool.headroom_rule == STATIC_HEADROOM_RULE
    assert pool.budget_bytes == int(106.84375 * GiB)
    # max_running_requests = min(max(tokens / context_len * 512, 2048), 4096)
    assert pool.max_running_requests == min(max(int(tokens / 131072 * 512), 2048), 4096)
    if mtt is not None and mtt < 875264:
        assert pool.cap_reason.startswith(f"--max-total-tokens {mtt} (memory allows ")
        assert pool.warnings == ()
    elif mtt is not None:
        assert (
            pool.cap_reason == "" and f"--max-total-tokens {mtt} is larger than the memory allows" in pool.warnings[0]
        )
    else:
        assert pool.cap_reason == "" and pool.warnings == ()


def test_static_default_fraction_on_the_h200():
    """The default mem_fraction_static of an H200 (0.907) with 139.29 GiB free before the weights keeps
    12.95 GiB of headroom (benchmark/kv_sizing's Llama-3.1-8B row: 12.9536 GiB)."""
    pool = static_pool_size(readings(139.2862, 124.33), args(mfs=0.907))
    assert pool.headroom_bytes / GiB == pytest.approx(12.9536, abs=1e-3)
    assert pool.tokens == int(124.33 * GiB - int(139.2862 * GiB) * (1 - 0.907)) // LLAMA_8B.cell_size_bytes


def test_user_max_running_requests_wins():
    assert static_pool_size(readings(), args(max_running_requests=7)).max_running_requests == 7
    small = static_pool_size(readings(free_after_gib=18.0), args(context_len=131072))
    assert small.max_running_requests == 2048  # the floor: few tokens per context
    many = static_pool_size(readings(), args(context_len=4096))
    assert many.max_running_requests == 4096  # the ceiling


def test_no_room_names_the_knob():
    with pytest.raises(NotEnoughMemoryError, match="--mem-fraction-static"):
        static_pool_size(readings(free_after_gib=17.0), args())  # 17 GiB < the 17.4 GiB headroom


def test_uneven_heads_size_from_the_largest_rank():
    """SmolLM2's 3 KV heads over 2 ranks: rank 0 holds 2, rank 1 holds 1. The planner sizes from the
    largest rank, which is what the MIN over every rank's own count gives (each rank fits its pool)."""
    from transformers import LlamaConfig

    from sglang.srt.configs.model_config import ModelConfig

    mc = ModelConfig.from_hf_config(
        LlamaConfig(
            vocab_size=64,
            hidden_size=576,
            num_attention_heads=9,
            num_key_value_heads=3,
            num_hidden_layers=30,
            max_position_embeddings=2048,
        ),
        dtype="bfloat16",
        device="cuda",
    )
    per_rank = [mc.kv_geometry(2, rank) for rank in range(2)]
    assert [g.kv_heads for g in per_rank] == [2, 1]
    largest = mc.largest_kv_geometry(2)
    assert largest.kv_heads == 2 and largest.cell_size_bytes == 2 * (64 + 64) * 30 * 2
    shared = static_pool_size(readings(kv=largest, page=16), args())
    each = [static_pool_size(readings(kv=g, page=16), args()).tokens for g in per_rank]
    assert shared.tokens == min(each) < max(each)
    # The KT slot is split by the same rule (the first ranks hold more): the largest is rank 0's too.
    r = readings(kv=largest, page=16, reservations={"kt": 3 * GiB})
    assert static_pool_size(r, args()).tokens == min(
        static_pool_size(readings(kv=g, page=16, reservations={"kt": res}), args()).tokens
        for g, res in zip(sorted(per_rank, key=lambda g: -g.kv_heads), (3 * GiB, 2 * GiB))
    )


# ---------------------------------------------------------------- post-capture path
GRANULE = 2 * MiB


def post_readings(
    free_after_capture_gib=122.25,
    peak=None,
    graph_bs=256,
    page=1,
    reservations=None,
    kv=LLAMA_8B,
    free_after_gib=124.25,
):
    """(MemoryReadings, CaptureReadings) of a post-capture start."""
    r = readings(
        free_after_gib=free_after_gib, page=page, kv=kv, reservations=reservations, vmm_granularity_bytes=GRANULE
    )
    return r, CaptureReadings(
        graph_bytes=int(1.46 * GiB),
        captured_graph_max_bs=graph_bs,
        free_after_capture_bytes=int(free_after_capture_gib * GiB),
        activation_peak_bytes=peak,
    )


def test_virtual_pool_bounds_the_pool_and_sizes_the_request_table_once():
    r, r_cap = post_readings()
    pool = virtual_pool(r, args(mfs=0.988))
    # every byte free after the weights as KV: 124.25 GiB / 128 KiB = 1017856 tokens
    assert pool.max_tokens == pool.memory_bound_tokens == 124.25 * 8192
    assert pool.reserve_bytes_per_buffer == (pool.max_tokens + 1) * 2048
    assert pool.max_running_requests == 3976  # 1017856 / 131072 * 512 = 3976.0
    size = post_capture_pool_size(r, r_cap, args(mfs=0.988))
    assert size.max_running_requests == pool.max_running_requests  # decided once, before capture
    capped = virtual_pool(readings(page=16), args(max_total_tokens=100001))
    assert capped.max_tokens == 100000 and capped.memory_bound_tokens == 1017856
    assert capped.max_running_requests == 2048


def test_before_capture_only_the_first_granule_is_backed():
    r, r_cap = post_readings(page=16)
    pool = virtual_pool(r, args())
    # 2 MiB / 2048 bytes = 1024 slots -> 1024 - one dummy page of 16 = 1008 tokens
    assert tokens_in_backed_bytes(GRANULE, r) == 1008
    assert tokens_backed_before_capture(r, pool) == 1008
    assert r.backed_before_capture_bytes == 64 * GRANULE


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("reserved", [0, GiB // 2 + 1000])
def test_measured_headroom_and_granule_rounding(page, reserved):
    peak = 2 * GiB
    r, r_cap = post_readings(peak=peak, page=page, reservations={"kt": reserved} if reserved else None)
    size = post_capture_pool_size(r, r_cap, args(mfs=0.988))
    headroom = int(peak * 1.1 + 256 * MiB)  # measured peak + 10% + 256 MiB
    assert size.headroom_bytes == headroom and size.headroom_rule == MEASURED_HEADROOM_RULE
    backed = 64 * GRANULE
    assert size.budget_bytes == int(122.25 * GiB) - headroom + backed
    kv_budget = size.budget_bytes - reserved
    exact = kv_budget // LLAMA_8B.cell_size_bytes
    assert size.tokens % page == 0
    # Whole granules per buffer, rounded down: the mapping stays inside the budget ...
    mapped = backed_bytes_per_buffer(size.tokens, LLAMA_8B.widest_slot_bytes, page, GRANULE)
    assert mapped % GRANULE == 0 and mapped * LLAMA_8B.num_buffers <= kv_budget
    assert (size.tokens + page) * LLAMA_8B.widest_slot_bytes <= mapped
    # ... and loses less than one granule (plus the pages) per buffer.
    assert exact - size.tokens < GRANULE // LLAMA_8B.widest_slot_bytes + 2 * page


def test_sglang_rule_floors_to_the_activation_reserve_when_decode_runs_eagerly():
    r, r_cap = post_readings(graph_bs=32)  # no measurement: SGLang's rule
    size = post_capture_pool_size(r, r_cap, args(mfs=0.988, max_running_requests=64, reserve_mib=10240))
    minimal = int(int(139.25 * GiB) * (1 - 0.988))
    assert minimal < 10240 * MiB
    assert size.headroom_bytes == 10240 * MiB  # floored
    assert "activation reserve (cuda_graph_max_bs 32 < max_running_requests 64)" == size.headroom_rule
    assert "cuda_graph_max_bs=32 < max_running_requests=64" in size.warnings[0]
    assert size.sglang_rule_tokens == size.tokens
    # Decode never eager: the minimal headroom, no warning.
    fits = post_capture_pool_size(*post_readings(graph_bs=64), args(mfs=0.988, max_running_requests=64))
    assert fits.headroom_bytes == minimal and fits.headroom_rule == STATIC_HEADROOM_RULE and fits.warnings == ()
    assert fits.tokens > size.tokens
    # With a measurement the warning names both, and SGLang's count is still reported for comparison.
    measured = post_capture_pool_size(*post_readings(graph_bs=32, peak=GiB), args(mfs=0.988, max_running_requests=64))
    assert "the measured worst case needs 1024 MiB" in measured.warnings[0]
    assert measured.sglang_rule_tokens == size.tokens < measured.tokens


def test_post_capture_reports_the_static_equivalent():
    r, r_cap = post_readings(peak=GiB)
    size = post_capture_pool_size(r, r_cap, args(mfs=0.988))
    static_args = dataclasses.replace(args(), mem_fraction_static=0.907)
    assert size.static_equivalent_tokens == static_pool_size(r, static_args).tokens


def test_post_capture_honours_max_total_tokens_exactly():
    """A cap far below memory: exactly that many tokens (whole pages), backed in whole granules."""
    r, r_cap = post_readings(peak=GiB, page=16)
    size = post_capture_pool_size(r, r_cap, args(max_total_tokens=1000))
    assert size.tokens == 992 and size.cap_reason.startswith("--max-total-tokens 1000 (memory allows ")
    assert backed_bytes_per_buffer(992, 2048, 16, GRANULE) == GRANULE  # (992 + 16) * 2 KiB fits one granule
    above = post_capture_pool_size(r, r_cap, args(max_total_tokens=10**8))
    assert above.cap_reason == "" and "is larger than the memory allows" in above.warnings[-1]


def test_post_capture_no_room_names_the_knobs():
    with pytest.raises(NotEnoughMemoryError, match="--max-running-requests or --chunked-prefill-size"):
        post_capture_pool_size(*post_readings(free_after_capture_gib=1.0, peak=2 * GiB), args())


def test_post_capture_needs_its_readings():
    with pytest.raises(ValueError, match="free memory after capture"):
        post_capture_pool_size(readings(vmm_granularity_bytes=GRANULE), CaptureReadings(), args())
    with pytest.raises(ValueError, match="granularity"):
        post_capture_pool_size(readings(), CaptureReadings(free_after_capture_bytes=GiB), args())


# ----------------------------------------------------------------- the lendable tail (elastic KT slot)
QWEN3_30B_12L = KVGeometry(num_layers=12, kv_heads=4, head_dim=128, v_head_dim=128, dtype_bytes=2)  # 24 KiB/token
KT_BF16_SLOT = 1207959552  # measured on the H200: the Qwen3-30B-A3B shape's full-GPU prefill slot in BF16


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("reserved", [KT_BF16_SLOT, 604127232, 3 * MiB + 5])  # BF16, FP8, tiny and odd
def test_lent_reservation_keeps_the_pool_whole_and_the_tail_on_granules(page, reserved):
    r, r_cap = post_readings(peak=GiB, page=page, kv=QWEN3_30B_12L, reservations={"kt": reserved})
    lent = post_capture_pool_size(r, r_cap, dataclasses.replace(args(mfs=0.988), lend_reservations=True))
    kept = post_capture_pool_size(r, r_cap, args(mfs=0.988))
    none = post_capture_pool_size(*post_readings(peak=GiB, page=page, kv=QWEN3_30B_12L), args(mfs=0.988))
    slot, buffers = QWEN3_30B_12L.widest_slot_bytes, QWEN3_30B_12L.num_buffers
    unit = GRANULE // slot  # 2048 tokens fill one granule of every buffer (1 KiB slots), page 1 and 16 alike
    assert lent.reservation_rule.startswith("lent") and kept.reservation_rule.startswith("permanent")
    # The pool is as large as without any reservation, within one granule per buffer ...
    assert 0 <= none.tokens - lent.tokens < unit
    assert kept.tokens <= lent.tokens and (reserved < unit * slot * buffers or kept.tokens < lent.tokens)
    # ... its end and its tail's start lie on granules of every buffer, in whole pages ...
    tail = lent.prefill_slot_tail
    assert (lent.tokens + page) * slot % GRANULE == 0 and tail.tokens % unit == 0 and tail.tokens % page == 0
    assert tail.bytes_per_buffer == tail.tokens * slot
    # ... and the tail holds the reservation with less than one granule per buffer to spare.
    assert tail.bytes_per_buffer * buffers >= reserved > (tail.tokens - unit) * slot * buffers
    if reserved == KT_BF16_SLOT:
        assert tail.tokens == 49152 == reserved // QWEN3_30B_12L.cell_size_bytes  # exactly 24 granules a buffer


def test_reservations_stay_permanent_when_they_cannot_be_lent():
    r, r_cap = post_readings(peak=GiB, kv=QWEN3_30B_12L, reservations={"kt": KT_BF16_SLOT})
    assert post_capture_pool_size(r, r_cap, args(mfs=0.988)).prefill_slot_tail is None  # the flag is off
    mla_like = dataclasses.replace(QWEN3_30B_12L, v_head_dim=64)  # K and V slots differ: no single tail size
    r, r_cap = post_readings(peak=GiB, kv=mla_like, reservations={"kt": KT_BF16_SLOT})
    assert (
        post_capture_pool_size(r, r_cap, dataclasses.replace(args(mfs=0.988), lend_reservations=True)).prefill_slot_tail
        is None
    )
    # Lending never does worse than keeping the memory out: a reservation that leaves the pool almost
    # nothing else is lent (the pool has its whole size while no long prefill runs) ...
    tight, tight_cap = post_readings(
        free_after_capture_gib=20.0, peak=GiB, kv=QWEN3_30B_12L, reservations={"kt": 17 * GiB}
    )
    lent = post_capture_pool_size(tight, tight_cap, dataclasses.replace(args(mfs=0.988), lend_reservations=True))
    kept = post_capture_pool_size(tight, tight_cap, args(mfs=0.988))
    assert lent.tokens - lent.prefill_slot_tail.tokens >= kept.tokens - 2048  # as much KV as kept while lent
    # ... and one larger than the pool cannot be lent at all: the permanent path's error names the knobs.
    with pytest.raises(NotEnoughMemoryError, match="reservations"):
        over, over_cap = post_readings(
            free_after_capture_gib=20.0, peak=GiB, kv=QWEN3_30B_12L, reservations={"kt": 40 * GiB}
        )
        post_capture_pool_size(over, over_cap, dataclasses.replace(args(mfs=0.988), lend_reservations=True))


@pytest.mark.parametrize("page", [1, 64])
def test_post_capture_with_the_latent_buffers(page):
    """MLA on the post-capture path: one VMM range per layer (61 for DeepSeek-V3), whole granules of each, and a
    KT reservation lent from the tail of all of them (every latent buffer has the same slot width)."""
    reserved = 11_277_041_664  # DeepSeek-V3's FP8 full-GPU prefill slot
    r, r_cap = post_readings(peak=GiB, page=page, kv=DEEPSEEK_V3, reservations={"kt": reserved})
    assert r.backed_before_capture_bytes == 61 * GRANULE  # the first granule of each latent range
    lent = post_capture_pool_size(r, r_cap, dataclasses.replace(args(mfs=0.988), lend_reservations=True))
    kept = post_capture_pool_size(r, r_cap, args(mfs=0.988))
    slot = DEEPSEEK_V3.widest_slot_bytes  # 1152-byte rows: the pool's end falls on a granule of every range
    assert (lent.tokens + page) * slot % GRANULE == 0 and lent.reservation_rule.startswith("lent")
    tail = lent.prefill_slot_tail
    assert tail.bytes_per_buffer * 61 >= reserved and tail.bytes_per_buffer == tail.tokens * slot
    assert kept.reservation_rule.startswith("permanent") and kept.tokens < lent.tokens
    # Kept out, the reservation leaves the budget's latent rows, in whole granules of the 61 buffers.
    assert kept.tokens * DEEPSEEK_V3.cell_size_bytes <= kept.budget_bytes - reserved


# Gemma-3-27B: 62 layers, 52 of them sliding (window 1,024), 16 KV heads of 128 in bf16.
GEMMA3_27B = KVGeometry(
    num_layers=62, kv_heads=16, head_dim=128, v_head_dim=128, dtype_bytes=2, swa_layers=52, swa_window=1024
)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("ratio", [0.8, 0.25])
def test_post_capture_with_the_window_pool(page, ratio):
    """The hybrid SWA pool on the post-capture path: the windowed layers' 104 ranges are reserved and backed for the
    window pool's tokens, the other 20 for the full pool's; both in whole granules, inside the budget, and the most
    whole pages that fit. A KT reservation is kept out (no one tail of whole pages for both kinds of buffer)."""
    from sglang.srt.model_executor.pool_configurator import backed_kv_bytes

    kv = dataclasses.replace(GEMMA3_27B, swa_full_tokens_ratio=ratio)
    assert (kv.full_buffers, kv.swa_buffers) == (20, 104)
    r, r_cap = post_readings(peak=GiB, page=page, kv=kv, free_after_gib=88.87, free_after_capture_gib=86.0)
    pool = virtual_pool(r, args(mfs=0.988))
    slot = kv.widest_slot_bytes  # 4 KiB
    assert pool.reserve_bytes_per_buffer == (pool.max_tokens + page) * slot
    assert pool.swa_reserve_bytes_per_buffer == (kv.swa_tokens(pool.max_tokens, page) + page) * slot
    assert r.backed_before_capture_bytes == 124 * GRANULE
    size = post_capture_pool_size(r, r_cap, args(mfs=0.988))
    tokens, swa = size.tokens, kv.swa_tokens(size.tokens, page)
    assert tokens % page == 0 and swa == int(tokens * ratio) // page * page
    mapped = backed_kv_bytes(tokens, r)
    assert mapped == 20 * backed_bytes_per_buffer(tokens, slot, page, GRANULE) + 104 * backed_bytes_per_buffer(
        swa, slot, page, GRANULE
    )
    assert mapped <= size.budget_bytes < backed_kv_bytes(tokens + page, r)  # inside the budget, and the most
    # Against the cell count, the rounding to granules costs less than a granule per buffer (and the dummy pages).
    assert size.budget_bytes // kv.cell_size_bytes - tokens < 124 * (GRANULE + page * slot) // kv.cell_size_bytes + page
    one_pool_kv = dataclasses.replace(GEMMA3_27B, swa_layers=0)
    one_pool = post_capture_pool_size(
        *post_readings(peak=GiB, page=page, kv=one_pool_kv, free_after_gib=88.87, free_after_capture_gib=86.0),
        args(mfs=0.988),
    )
    assert tokens > one_pool.tokens > swa  # the full-attention layers keep more tokens, the windowed ones fewer
    lent = post_capture_pool_size(
        *post_readings(
            peak=GiB, page=page, kv=kv, free_after_gib=88.87, free_after_capture_gib=86.0, reservations={"kt": GiB}
        ),
        dataclasses.replace(args(mfs=0.988), lend_reservations=True),
    )
    assert lent.prefill_slot_tail is None and lent.reservation_rule.startswith("permanent")
    assert any("--disable-hybrid-swa-memory" in w for w in lent.warnings)
    assert backed_kv_bytes(lent.tokens, r) <= lent.budget_bytes - GiB


def test_post_capture_window_pool_too_small_names_the_flag():
    kv = dataclasses.replace(GEMMA3_27B, swa_full_tokens_ratio=0.001)
    r, r_cap = post_readings(peak=GiB, kv=kv, free_after_gib=88.87, free_after_capture_gib=86.0)
    with pytest.raises(NotEnoughMemoryError, match="--swa-full-tokens-ratio"):
        post_capture_pool_size(r, r_cap, args(mfs=0.988, max_total_tokens=100_000))
