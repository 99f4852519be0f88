"""Every KV-pool sizing decision, as pure functions: readings in, pool size out.

Start-up (model_runner.py) takes each memory reading once, already agreed by all tensor-parallel
ranks (free memory: the MIN over ranks; per-rank sizes such as the KV cell or a reservation: the
largest rank's, the one that binds), and hands them here as a frozen `MemoryReadings`. The
functions below decide; the KV-cache mixins only apply (allocate, reserve, map, resize, log).
Nothing here touches torch, CUDA or the clock, so every rule is testable with numbers alone.

Both paths share one formula; only the budget and the rounding differ:

    headroom = free_before_weights * (1 - mem_fraction_static)          (SGLang's rule)
    static:        budget = free_after_weights - headroom
                   tokens = (budget - reservations) // cell_size
    post-capture:  budget = free_after_capture - headroom' + KV already backed
                   tokens = (budget - reservations) // cell_size, whole VMM granules per buffer
    then           tokens = min(tokens, --max-total-tokens), rounded down to the page size

The post-capture headroom' is the measured activation peak plus a margin, or without a
measurement SGLang's rule (floored to the activation reserve when decode runs eagerly above the
captured batch size). See docs/memory_planning.md for where each reading is taken.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

GiB = 1 << 30
MiB = 1 << 20
# Kept on top of the measured activation peak: allocator rounding/fragmentation and per-step index tensors.
ACTIVATION_SAFETY_FRACTION = 0.10
ACTIVATION_SAFETY_MARGIN_BYTES = 256 * MiB

PERMANENT_RESERVATION = "permanent (kept out of the KV pool)"
LENT_RESERVATION = "lent: the pool's last tokens, taken for a long prefill and given back"

STATIC_HEADROOM_RULE = "pre_model_load_memory * (1 - mem_fraction_static)"
MEASURED_HEADROOM_RULE = "measured activation peak + 10% + 256 MiB"
POST_CAPTURE_REASON = "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1"


class NotEnoughMemoryError(RuntimeError):
    """No room for a KV cache; the message names the knob to turn."""


# ------------------------------------------------------- defaults from the flags (SGLang's heuristics)
@dataclass(frozen=True)
class TierDefaults:
    """What the device's memory tier sets when the flags do not: chunk size and the largest captured batch."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int


def gpu_tier_defaults(memory_mib: float, tp_size: int) -> TierDefaults:
    """SGLang's tiers: chunked prefill size and the largest captured decode batch follow the device's memory."""
    gib = memory_mib / 1024
    big_tp = tp_size >= 4
    if gib < 20:
        return TierDefaults(2048, 8)
    if gib < 35:
        return TierDefaults(4096, 160 if big_tp else 48)
    if gib < 60:
        return TierDefaults(4096, 160 if big_tp else 32)
    if gib < 160:
        return TierDefaults(8192, 512 if big_tp else 256)
    return TierDefaults(16384, 512)


@dataclass(frozen=True)
class ReserveInputs:
    """The flags (resolved) and the device size SGLang's memory reserves are computed from."""

    capacity_mib: float
    chunked_prefill_size: int  # -1: chunking off
    max_prefill_tokens: int
    tp_size: int
    pp_size: int
    cuda_graph_max_bs: int

    @property
    def activation_tokens(self) -> int:
        base = self.chunked_prefill_size if self.chunked_prefill_size > 0 else self.max_prefill_tokens
        return max(base, 2048)

    @property
    def parallel_reserve_mb(self) -> float:
        return self.tp_size * self.pp_size / 8 * 1024

    def floored_above_60_gib(self, reserved_mb: float) -> float:
        return max(reserved_mb, 10 * 1024) if self.capacity_mib > 60 * 1024 else reserved_mb


def reserve_for_graph_mb(r: ReserveInputs) -> float:
    """SGLang's guess for CUDA-graph memory (MiB); no DP attention in this engine, so no DP terms."""
    return r.cuda_graph_max_bs * 2


def reserve_for_deepep_a2a_mb(r: ReserveInputs) -> float:
    """SGLang reserves 2048 MiB for DeepEP all-to-all buffers with decode graphs; this engine has no DeepEP
    backend, so the term is always 0 (kept so the formula reads like SGLang's)."""
    return 0.0


def pre_capture_activation_reserve_mb(r: ReserveInputs) -> float:
    """The generic activation reserve (MiB): constant metadata + a chunked prefill's activations."""
    return r.floored_above_60_gib(512 + r.activation_tokens * 1.5 + r.parallel_reserve_mb)


def static_reserved_mem_mb(r: ReserveInputs) -> float:
    """Everything the classic default of mem_fraction_static keeps out of the static pool (MiB)."""
    reserved = 512 + r.activation_tokens * 1.5 + r.parallel_reserve_mb + reserve_for_graph_mb(r)
    return r.floored_above_60_gib(reserved) + reserve_for_deepep_a2a_mb(r)


def post_capture_reserved_mem_mb(r: ReserveInputs) -> float:
    """With post-capture sizing, activations and graphs are measured, not guessed (MiB)."""
    return 1536 + r.parallel_reserve_mb


def default_mem_fraction_static(capacity_mib: float, reserved_mb: float) -> float:
    """SGLang's default: what is left of the device once `reserved_mb` is kept out, as a fraction."""
    return round((capacity_mib - reserved_mb) / capacity_mib, 3)


# ----------------------------------------------------------------------------- the path
@dataclass(frozen=True)
class SizingPath:
    """Static or post-capture, and why: decided once, before the default mem_fraction_static."""

    post_capture: bool
    reason: str

    @property
    def name(self) -> str:
        return "post-capture" if self.post_capture else "static"


def decide_sizing_path(
    *,
    flag_on: bool,
    device: str,
    cuda_graphs: bool,
    chunked_prefill_size: int,
    attention_backend: str,
    vmm_problem: Callable[[], Optional[str]],
) -> SizingPath:
    """Post-capture sizing needs the flag, CUDA, decode graphs, chunked prefill, a backend that can be
    captured and CUDA VMM. `vmm_problem` (None when VMM works) is asked only when all else allows it,
    so a server with the flag off never touches the driver. MHA and MLA pools are both one VMM range
    per buffer (KVGeometry.num_buffers); nothing else claims the KV memory (no hybrid SWA/mamba pools,
    no disaggregation)."""
    blockers = []
    if not flag_on:
        blockers.append("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off")
    if device != "cuda":
        blockers.append("device is not CUDA")
    if not cuda_graphs:
        blockers.append("decode CUDA graphs are disabled")
    if chunked_prefill_size <= 0:
        blockers.append("chunked prefill is disabled")
    if device == "cuda" and attention_backend != "triton":
        blockers.append(f"the {attention_backend} attention backend has no CUDA graphs")
    if blockers:
        return SizingPath(False, "; ".join(blockers))
    problem = vmm_problem()
    if problem:
        return SizingPath(False, f"CUDA VMM unavailable: {problem}")
    return SizingPath(True, POST_CAPTURE_REASON)


@dataclass(frozen=True)
class SWAPoolDecision:
    """Whether the sliding-window layers get their own pool (the hybrid SWA pool), and why."""

    swa_full_tokens_ratio: Optional[float]  # None: every layer keeps every token in the one pool
    reason: str


def decide_swa_pool(*, window_layers: int, swa_full_tokens_ratio: float, disabled: bool) -> SWAPoolDecision:
    """The hybrid SWA pool runs where a model has sliding-window layers, on both sizing paths (post-capture: the
    windowed layers' buffers are VMM ranges of their own, backed to the window pool's tokens)."""
    if not window_layers:
        return SWAPoolDecision(None, "no sliding-window layers")
    if disabled:
        return SWAPoolDecision(None, "--disable-hybrid-swa-memory")
    return SWAPoolDecision(swa_full_tokens_ratio, f"{window_layers} sliding-window layers, --swa-full-tokens-ratio")


# ------------------------------------------------------------------------- the inputs
ATTENTION_KINDS = ("mha", "mla")


@dataclass(frozen=True)
class KVGeometry:
    """One rank's KV layout.

    MHA (and GQA): per layer one K and one V buffer of [slots, kv_heads, head_dim] / [.., v_head_dim].
    MLA (multi-head latent attention, DeepSeek-V2/V3): per layer ONE buffer of [slots, 1, kv_lora_rank +
    qk_rope_head_dim], the latent row every head's K and V are computed from; described here as one
    "head" of that width and no V buffer (`KVGeometry.latent`), so the cell-size rule below is the same
    for both: (K slot + V slot) x layers."""

    num_layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype_bytes: int
    attention: str = "mha"  # one of ATTENTION_KINDS
    # The hybrid SWA pool (mem_cache/swa_memory_pool.py): `swa_layers` of the layers attend through a sliding
    # window and keep their K/V in a second pool of swa_full_tokens_ratio x the tokens of the full-attention
    # layers' pool (upstream's --swa-full-tokens-ratio). The planner's token count is the full pool's.
    swa_layers: int = 0
    swa_full_tokens_ratio: float = 1.0
    swa_window: int = 0  # the widest window of those layers

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        if self.attention == "mla" and (self.kv_heads != 1 or self.v_head_dim != 0):
            raise ValueError("an MLA layout is one latent row per token and layer (kv_heads 1, no V buffer)")
        if not 0 <= self.swa_layers <= self.num_layers or (self.swa_layers and self.is_mla):
            raise ValueError(f"{self.swa_layers} sliding-window layers do not fit this layout")
        if not 0 < self.swa_full_tokens_ratio <= 1:
            raise ValueError(f"swa_full_tokens_ratio must be in (0, 1], got {self.swa_full_tokens_ratio}")

    @classmethod
    def latent(cls, num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: int) -> "KVGeometry":
        """MLA's layout: kv_lora_rank + qk_rope_head_dim values per token and layer (576 for DeepSeek-V3),
        the same on every tensor-parallel rank (the latent is shared by all heads)."""
        return cls(num_layers, 1, kv_lora_rank + qk_rope_head_dim, 0, dtype_bytes, attention="mla")

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def k_slot_bytes(self) -> int:
        """Bytes per token of one layer's K buffer (MLA: of its latent row)."""
        return self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def v_slot_bytes(self) -> int:
        """Bytes per token of one layer's V buffer (MLA: 0, there is none)."""
        return self.kv_heads * self.v_head_dim * self.dtype_bytes

    @property
    def widest_slot_bytes(self) -> int:
        """Bytes per token of the wider of the K and V buffers (VMM ranges are sized by it)."""
        return max(self.k_slot_bytes, self.v_slot_bytes)

    @property
    def is_hybrid_swa(self) -> bool:
        return self.swa_layers > 0

    @property
    def full_layers(self) -> int:
        """Layers whose K/V live in the full pool (every layer without the hybrid SWA pool)."""
        return self.num_layers - self.swa_layers

    @property
    def layer_cell_bytes(self) -> int:
        """K/V bytes of one token in one layer."""
        return self.k_slot_bytes + self.v_slot_bytes

    @property
    def cell_size_bytes(self) -> int:
        """KV bytes per token over all layers: MHA kv_heads * (head_dim + v_head_dim) * layers * dtype bytes;
        MLA (kv_lora_rank + qk_rope_head_dim) * layers * dtype bytes. With the hybrid SWA pool, per token of
        the full pool: its layers' cells plus swa_full_tokens_ratio of the windowed layers' (rounded up)."""
        if not self.is_hybrid_swa:
            return self.layer_cell_bytes * self.num_layers
        swa = self.layer_cell_bytes * self.swa_layers * self.swa_full_tokens_ratio
        return self.layer_cell_bytes * self.full_layers + math.ceil(swa)

    def min_swa_tokens(self, page_size: int) -> int:
        """The smallest window pool that lets one request always progress: its cached prefix's last window
        (locked while it runs) and its own window, each with a page of slack at both ends."""
        return 2 * (-(-self.swa_window // page_size) + 2) * page_size if self.is_hybrid_swa else 0

    def swa_tokens(self, tokens: int, page_size: int) -> int:
        """The windowed layers' pool for a full pool of `tokens`: swa_full_tokens_ratio of it, whole pages (one
        at least)."""
        if not self.is_hybrid_swa:
            return 0
        return max(page_size, int(tokens * self.swa_full_tokens_ratio) // page_size * page_size)

    @property
    def num_buffers(self) -> int:
        return self.num_layers if self.is_mla else 2 * self.num_layers

    @property
    def full_buffers(self) -> int:
        """The buffers sized by the full pool's tokens (every buffer without the hybrid SWA pool)."""
        return self.num_buffers - self.swa_buffers

    @property
    def swa_buffers(self) -> int:
        """The windowed layers' K and V buffers, sized by the window pool's tokens."""
        return 2 * self.swa_layers


@dataclass(frozen=True)
class MemoryReadings:
    """What start-up measured, each reading taken once and agreed by every rank (bytes throughout)."""

    device_capacity_bytes: int
    free_before_weights_bytes: int  # right after distributed init (MIN over ranks)
    free_after_weights_bytes: int  # weights loaded, cache emptied (MIN over ranks)
    kv: KVGeometry  # the largest rank's (uneven head splits: the first ranks hold more)
    page_size: int
    reservations_bytes: Mapping[str, int] = field(default_factory=dict)  # e.g. the KT prefill slot (largest rank)
    vmm_granularity_bytes: Optional[int] = None  # post-capture: CUDA VMM's physical granularity on this device

    @property
    def reserved_bytes(self) -> int:
        return sum(self.reservations_bytes.values())

    def granularity(self) -> int:
        """The VMM arena's granularity: only the post-capture path has one."""
        if self.vmm_granularity_bytes is None:
            raise ValueError("post-capture sizing needs the VMM granularity (read from the arena)")
        return self.vmm_granularity_bytes

    @property
    def backed_before_capture_bytes(self) -> int:
        """KV memory already physically backed when capture runs: one granule of every buffer."""
        return self.granularity() * self.kv.num_buffers


@dataclass(frozen=True)
class CaptureReadings:
    """What start-up measured around and after CUDA-graph capture, taken once when capture is done."""

    graph_bytes: int = 0  # measured around CUDA-graph capture
    captured_graph_max_bs: int = 0  # largest captured decode batch; 0 without graphs
    free_after_capture_bytes: Optional[int] = None  # post-capture: after capture and the probe (MIN over ranks)
    activation_peak_bytes: Optional[int] = None  # post-capture: measured worst-case eager forwards


@dataclass(frozen=True)
class PoolArgs:
    """The flags and model facts the sizing reads, resolved once at start-up (configs/engine_config.py)."""

    mem_fraction_static: float
    static_mem_fraction_static: float  # what the static path would use (the post-capture comparison)
    max_total_tokens: Optional[int]
    max_running_requests: Optional[int]
    context_len: int
    activation_reserve_bytes: int  # SGLang's generic activation reserve (pre_capture_activation_reserve_mb)
    # Post-capture only: the reservations are lent from the pool's tail instead of kept out of it; needs
    # every rank to hold the same KV heads (one tail size for all).
    lend_reservations: bool = False


# ------------------------------------------------------------------------- the output
@dataclass(frozen=True)
class PrefillSlotTail:
    """The pool's last `tokens` slots, lent to the KT prefill slot while a long prefill runs: whole pages, and
    whole VMM granules of every K and V buffer, so their physical memory can leave the KV ranges and come back."""

    tokens: int
    bytes_per_buffer: int


@dataclass(frozen=True)
class PoolSize:
    tokens: int
    max_running_requests: int
    headroom_bytes: int  # kept free for activations and everything not planned
    headroom_rule: str
    budget_bytes: int  # what the KV pool and the reservations share
    cap_reason: str = ""  # set when --max-total-tokens capped the pool
    warnings: tuple[str, ...] = ()  # for the log
    # Post-capture only: what the static path and SGLang's headroom rule give from the same readings.
    static_equivalent_tokens: Optional[int] = None
    sglang_rule_tokens: Optional[int] = None
    prefill_slot_tail: Optional[PrefillSlotTail] = None  # set when the reservations are lent from the pool
    reservation_rule: str = PERMANENT_RESERVATION


@dataclass(frozen=True)
class VirtualPool:
    """Post-capture, before capture: the address space to reserve and the request-table size."""

    max_tokens: int  # the pool can never grow past this (every free byte as KV, --max-total-tokens)
    memory_bound_tokens: int  # the same bound from memory alone
    max_running_requests: int  # decided now: the request table is captured by the graphs
    reserve_bytes_per_buffer: int
    # The hybrid SWA pool: the windowed layers' buffers, reserved for the window pool of max_tokens.
    swa_reserve_bytes_per_buffer: int = 0


# ------------------------------------------------------------------ the common terms
def minimal_headroom_bytes(readings: MemoryReadings, mem_fraction_static: float) -> float:
    """SGLang's headroom: what mem_fraction_static leaves of the memory free before the weights."""
    return readings.free_before_weights_bytes * (1 - mem_fraction_static)


def default_max_running_requests(tokens: int, args: PoolArgs) -> int:
    if args.max_running_requests is not None:
        return args.max_running_requests
    return min(max(int(tokens / args.context_len * 512), 2048), 4096)


@dataclass(frozen=True)
class _Capped:
    tokens: int
    reason: str
    warnings: tuple[str, ...]


def _cap_and_align(memory_tokens: int, page_size: int, max_total_tokens: Optional[int]) -> _Capped:
    """--max-total-tokens, then whole pages: the same for both paths."""
    tokens, reason, warnings = memory_tokens, "", ()
    if max_total_tokens is not None:
        if max_total_tokens > memory_tokens:
            warnings = (
                f"--max-total-tokens {max_total_tokens} is larger than the memory allows ({memory_tokens}); "
                f"using {memory_tokens}",
            )
        elif max_total_tokens < memory_tokens:
            reason = f"--max-total-tokens {max_total_tokens} (memory allows {memory_tokens})"
            tokens = max_total_tokens
    return _Capped(tokens // page_size * page_size, reason, warnings)


def _static_sizing(readings: MemoryReadings, mem_fraction_static: float, max_total_tokens: Optional[int]):
    """(headroom, budget, capped tokens) of the static path; the budget truncates to whole bytes as
    SGLang does, the reservations (exact byte counts) are subtracted as integers."""
    headroom = minimal_headroom_bytes(readings, mem_fraction_static)
    budget = int(readings.free_after_weights_bytes - headroom)
    memory_tokens = (budget - readings.reserved_bytes) // readings.kv.cell_size_bytes
    return headroom, budget, _cap_and_align(memory_tokens, readings.page_size, max_total_tokens)


def _check_window_pool(readings: MemoryReadings, tokens: int) -> None:
    """Both paths: a hybrid SWA pool too small for one request's windows is an error naming the flag."""
    kv, page = readings.kv, readings.page_size
    if kv.swa_tokens(tokens, page) < kv.min_swa_tokens(page):
        raise NotEnoughMemoryError(
            f"The sliding-window layers' KV pool of {kv.swa_tokens(tokens, page)} tokens cannot hold one "
            f"request's windows ({kv.min_swa_tokens(page)} tokens for a window of {kv.swa_window}, page "
            f"{page}); raise --swa-full-tokens-ratio (now {kv.swa_full_tokens_ratio}) or --max-total-tokens, or "
            "use --disable-hybrid-swa-memory."
        )


# ---------------------------------------------------------------------- static path
def static_pool_size(readings: MemoryReadings, args: PoolArgs) -> PoolSize:
    """SGLang's profile_max_num_token: the pool is what the weights leave, less the headroom and the
    reservations."""
    headroom, budget, capped = _static_sizing(readings, args.mem_fraction_static, args.max_total_tokens)
    if capped.tokens <= 0:
        raise NotEnoughMemoryError(
            f"Not enough memory for the KV cache (max_total_num_tokens={capped.tokens}). "
            f"Increase --mem-fraction-static (now {args.mem_fraction_static}) or free device memory."
        )
    _check_window_pool(readings, capped.tokens)
    return PoolSize(
        tokens=capped.tokens,
        max_running_requests=default_max_running_requests(capped.tokens, args),
        headroom_bytes=int(headroom),
        headroom_rule=STATIC_HEADROOM_RULE,
        budget_bytes=budget,
        cap_reason=capped.reason,
        warnings=capped.warnings,
    )


# ---------------------------------------------------------------- post-capture path
def virtual_pool(readings: MemoryReadings, args: PoolArgs) -> VirtualPool:
    """Before capture: every byte free after the weights as KV bounds the pool (address space is
    cheap, nothing is backed); the request table is sized from that bound, once."""
    page = readings.page_size
    memory_bound = readings.free_after_weights_bytes // readings.kv.cell_size_bytes // page * page
    bound = memory_bound if args.max_total_tokens is None else min(memory_bound, args.max_total_tokens // page * page)
    if bound <= 0:
        raise NotEnoughMemoryError("no free memory for a KV cache after loading the weights")
    kv = readings.kv
    return VirtualPool(
        max_tokens=bound,
        memory_bound_tokens=memory_bound,
        max_running_requests=default_max_running_requests(bound, args),
        reserve_bytes_per_buffer=(bound + page) * kv.widest_slot_bytes,
        swa_reserve_bytes_per_buffer=(kv.swa_tokens(bound, page) + page) * kv.widest_slot_bytes if kv.swa_layers else 0,
    )


def tokens_in_backed_bytes(bytes_per_buffer: int, readings: MemoryReadings) -> int:
    """Usable tokens when every buffer has this many bytes backed: whole pages, the first page the dummy."""
    page = readings.page_size
    slots = bytes_per_buffer // readings.kv.widest_slot_bytes
    return max(0, slots // page * page - page)


def tokens_backed_before_capture(readings: MemoryReadings, pool: VirtualPool) -> int:
    """The pool's size while graphs are captured: what the first granule of each buffer holds."""
    page = readings.page_size
    return max(page, min(pool.max_tokens, tokens_in_backed_bytes(readings.granularity(), readings)))


def backed_bytes_per_buffer(tokens: int, slot_bytes: int, page_size: int, granularity: int) -> int:
    """Bytes to back in each buffer so `tokens` (plus the dummy page) fit: whole granules, rounded up.
    `slot_bytes` is this rank's widest slot (ranks holding fewer heads back less)."""
    return -(-(tokens + page_size) * slot_bytes // granularity) * granularity


def backed_kv_bytes(tokens: int, readings: MemoryReadings) -> int:
    """Device memory a pool of `tokens` maps over all its buffers: each buffer's slots (the dummy page included) in
    whole granules; with the hybrid SWA pool the windowed layers' buffers hold the window pool's tokens."""
    kv, page, gran = readings.kv, readings.page_size, readings.granularity()
    full = backed_bytes_per_buffer(tokens, kv.widest_slot_bytes, page, gran) * kv.full_buffers
    if not kv.swa_layers:
        return full
    return (
        full + backed_bytes_per_buffer(kv.swa_tokens(tokens, page), kv.widest_slot_bytes, page, gran) * kv.swa_buffers
    )


def _granule_tokens(budget_bytes: int, readings: MemoryReadings, bound: int) -> int:
    """Tokens a KV budget holds: whole pages, then whole granules per buffer, rounded down so the
    mapping stays inside the budget."""
    page, gran, kv = readings.page_size, readings.granularity(), readings.kv
    tokens = min(max(budget_bytes, 0) // kv.cell_size_bytes // page * page, bound)
    if not kv.swa_layers:
        per_buffer = (tokens + page) * kv.widest_slot_bytes // gran * gran
        return tokens_in_backed_bytes(per_buffer, readings)
    # Two pools of different token counts round up to granules apart: the most whole pages whose mapping fits
    # (each buffer rounds up by less than a granule, so the answer is within that many tokens of the cell count).
    slack = kv.num_buffers * (gran + page * kv.widest_slot_bytes)  # the dummy page and a granule per buffer
    lo = max(0, (budget_bytes - slack) // kv.cell_size_bytes // page * page)
    lo, hi = min(lo, tokens), tokens
    if backed_kv_bytes(lo, readings) > budget_bytes:
        return 0
    while lo < hi:
        mid = (lo + hi + page) // 2 // page * page
        lo, hi = (mid, hi) if backed_kv_bytes(mid, readings) <= budget_bytes else (lo, mid - page)
    return lo


def _post_capture_headroom(
    readings: MemoryReadings, capture: CaptureReadings, args: PoolArgs, max_running_requests: int
) -> tuple[int, int, str, tuple[str, ...]]:
    """(headroom kept, headroom by SGLang's rule alone, the rule applied, warnings).

    SGLang's rule: the minimal headroom, floored to the activation reserve when decode runs eagerly
    above the captured batch size. With a measurement (the worst-case eager forwards, sampled) the
    measured peak plus a margin replaces both guesses."""
    minimal = minimal_headroom_bytes(readings, args.mem_fraction_static)
    sglang_headroom, rule, warnings = minimal, STATIC_HEADROOM_RULE, ()
    graph_bs, peak = capture.captured_graph_max_bs, capture.activation_peak_bytes
    if graph_bs < max_running_requests:
        floor = args.activation_reserve_bytes
        measured = "" if peak is None else f", the measured worst case needs {peak / MiB:.0f} MiB"
        warnings = (
            f"Decode runs eagerly above the captured batch size (cuda_graph_max_bs={graph_bs} < "
            f"max_running_requests={max_running_requests}); SGLang's rule would keep the activation reserve "
            f"of {floor / MiB:.0f} MiB{measured}",
        )
        if floor > sglang_headroom:
            sglang_headroom = floor
            rule = f"activation reserve (cuda_graph_max_bs {graph_bs} < max_running_requests {max_running_requests})"
    if peak is None:
        return int(sglang_headroom), int(sglang_headroom), rule, warnings
    needed = peak * (1 + ACTIVATION_SAFETY_FRACTION) + ACTIVATION_SAFETY_MARGIN_BYTES
    return int(needed), int(sglang_headroom), MEASURED_HEADROOM_RULE, warnings


def whole_granule_tokens(readings: MemoryReadings) -> int:
    """The fewest tokens that fill whole pages and whole granules of every buffer (K and V slots alike)."""
    slot, gran = readings.kv.widest_slot_bytes, readings.granularity()
    return math.lcm(gran // math.gcd(gran, slot), readings.page_size)


def can_lend_reservations(readings: MemoryReadings, args: PoolArgs) -> bool:
    """Lending needs a reservation, one tail size for every buffer (K and V slots of one width, or MLA's latent
    buffers, all alike) and every rank holding the same KV heads (PoolArgs.lend_reservations)."""
    kv = readings.kv
    same_width = kv.is_mla or kv.k_slot_bytes == kv.v_slot_bytes
    # A hybrid SWA pool's two kinds of buffer hold different token counts: no one tail of whole pages for all.
    return args.lend_reservations and readings.reserved_bytes > 0 and same_width and not kv.swa_layers


def smallest_prefill_slot_tail(readings: MemoryReadings) -> PrefillSlotTail:
    """The smallest tail of whole granule units whose memory, over all buffers, holds every reservation
    (the lent slot packs its parameters without gaps: kt_prefill_slot.KTPrefillSlot._over_memory)."""
    unit = whole_granule_tokens(readings)
    unit_bytes = unit * readings.kv.widest_slot_bytes * readings.kv.num_buffers
    tokens = -(-readings.reserved_bytes // unit_bytes) * unit
    return PrefillSlotTail(tokens=tokens, bytes_per_buffer=tokens * readings.kv.widest_slot_bytes)


def post_capture_pool_size(readings: MemoryReadings, capture: CaptureReadings, args: PoolArgs) -> PoolSize:
    """After capture: what is really free, minus the headroom and the reservations, plus the KV
    already backed, in whole granules per buffer, capped like the static path. When the reservations
    can be lent (can_lend_reservations), they are not subtracted: the pool's last tokens (the prefill slot's
    tail, handed out last by the allocator) give them their memory while a long prefill needs it."""
    if capture.free_after_capture_bytes is None:
        raise ValueError("post-capture sizing needs the free memory after capture")
    pool = virtual_pool(readings, args)  # the same bound and request table as before capture
    free, reserved, mtt = capture.free_after_capture_bytes, readings.reserved_bytes, args.max_total_tokens
    backed = readings.backed_before_capture_bytes
    headroom, sglang_headroom, rule, warnings = _post_capture_headroom(
        readings, capture, args, pool.max_running_requests
    )
    budget = free - headroom + backed
    lend = can_lend_reservations(readings, args)
    if args.lend_reservations and reserved and readings.kv.swa_layers:
        warnings += (
            "The KT prefill slot's memory is kept out of the KV pool: a hybrid SWA pool lends no tail "
            "(--disable-hybrid-swa-memory lends it from one pool's tail)",
        )
    memory_tokens = _granule_tokens(budget - (0 if lend else reserved), readings, pool.memory_bound_tokens)
    capped = _cap_and_align(memory_tokens, readings.page_size, mtt)
    tail = None
    if lend:
        # Whole granule units end to end, so the tail starts and ends on a granule of every buffer.
        unit, page = whole_granule_tokens(readings), readings.page_size
        tokens = (capped.tokens + page) // unit * unit - page
        tail = smallest_prefill_slot_tail(readings)
        if tokens - tail.tokens >= unit:  # lending beats keeping it out whenever the tail fits in the pool
            capped = dataclasses.replace(capped, tokens=tokens)
        else:
            tail, lend = None, False
            memory_tokens = _granule_tokens(budget - reserved, readings, pool.memory_bound_tokens)
            capped = _cap_and_align(memory_tokens, readings.page_size, mtt)
    if capped.tokens <= 0:
        raise NotEnoughMemoryError(
            f"Post-capture KV sizing found no room for the KV cache: {free / GiB:.2f} GiB free, "
            f"headroom {headroom / GiB:.2f} GiB, reservations {reserved / GiB:.2f} GiB. "
            f"Lower --max-running-requests or --chunked-prefill-size, or free device memory."
        )
    _check_window_pool(readings, capped.tokens)
    sglang_tokens = _granule_tokens(free - sglang_headroom + backed - reserved, readings, pool.memory_bound_tokens)
    return PoolSize(
        tokens=capped.tokens,
        max_running_requests=pool.max_running_requests,
        headroom_bytes=headroom,
        headroom_rule=rule,
        budget_bytes=budget,
        cap_reason=capped.reason,
        warnings=warnings + capped.warnings,
        static_equivalent_tokens=max(0, _static_sizing(readings, args.static_mem_fraction_static, mtt)[2].tokens),
        sglang_rule_tokens=max(0, _cap_and_align(sglang_tokens, readings.page_size, mtt).tokens),
        prefill_slot_tail=tail,
        reservation_rule=LENT_RESERVATION if tail is not None else PERMANENT_RESERVATION,
    )
