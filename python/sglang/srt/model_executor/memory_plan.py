"""MemoryPlan: the report of how device memory was planned, every term of the budget in one object.

Built once at the end of start-up from the readings and the pool size the planner decided
(pool_configurator.py); logged as a table and returned by /server_info under `memory_plan`. Nothing
reads it back to decide anything. Sizes are GiB (floats) unless the name says bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from sglang.srt.model_executor.pool_configurator import (
    CaptureReadings,
    GiB,
    MemoryReadings,
    PoolArgs,
    PoolSize,
    SizingPath,
)


def _reservation_rule(readings: MemoryReadings, pool: PoolSize, path: SizingPath) -> str:
    if not readings.reservations_bytes:
        return ""
    if not path.post_capture:
        return "permanent: the static path has no virtual memory to lend it through"
    return pool.reservation_rule


@dataclass(frozen=True)
class MemoryPlan:
    device: str
    tp_size: int = 1
    path: str = "static"  # "static" or "post-capture"
    path_reason: str = ""
    mem_fraction_static: float = 0.0
    device_capacity_gb: float = 0.0
    pre_model_load_memory_gb: float = 0.0  # free before weights load (MIN over ranks)
    weights_gb: float = 0.0  # measured: free before - free after loading
    available_after_weights_gb: float = 0.0  # free after weights, cache emptied (MIN over ranks)
    headroom_gb: float = 0.0  # kept free for activations and everything not planned below
    headroom_rule: str = ""
    reservations_bytes: Dict[str, int] = field(default_factory=dict)  # e.g. the KT full-GPU prefill slot
    reservation_rule: str = ""  # permanent (out of the pool), or lent from the pool's tail (post-capture)
    lendable_tail_tokens: int = 0  # the pool's last tokens the reservations borrow while a long prefill runs
    cell_size_bytes: int = 0  # KV bytes per token over all layers on one rank
    page_size: int = 1
    max_total_num_tokens: int = 0
    kv_pool_gb: float = 0.0
    # The hybrid SWA pool: the sliding-window layers' own pool (0 without it; the cell size then counts
    # swa_full_tokens_ratio of their bytes per token of the full pool).
    swa_layers: int = 0
    swa_max_total_num_tokens: int = 0
    max_running_requests: int = 0
    req_to_token_gb: float = 0.0
    cuda_graph_gb: float = 0.0  # measured around graph capture
    cuda_graph_max_bs: int = 0
    activation_peak_gb: float = 0.0  # measured by worst-case eager forwards (post-capture path)
    free_after_plan_gb: float = 0.0  # measured once everything is allocated
    token_cap_reason: str = ""  # set when --max-total-tokens capped the pool
    per_rank_available_gb: List[float] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    # Post-capture path only: what static sizing would have given, and SGLang's headroom rule's count.
    static_equivalent_tokens: Optional[int] = None
    sglang_rule_tokens: Optional[int] = None
    # Post-capture path only: free after capture - headroom + KV already backed, before reservations.
    post_capture_budget_bytes: Optional[int] = None

    @classmethod
    def report(
        cls,
        readings: MemoryReadings,
        capture: CaptureReadings,
        pool: PoolSize,
        path: SizingPath,
        args: PoolArgs,
        *,
        device: str,
        tp_size: int,
        weights_bytes: int,
        per_rank_free_after_weights_bytes: Sequence[int],
        req_to_token_bytes: int,
        cuda_graph_max_bs: int,
        free_after_start_up_bytes: int,
        notes: Sequence[str] = (),
    ) -> "MemoryPlan":
        return cls(
            device=device,
            tp_size=tp_size,
            path=path.name,
            path_reason=path.reason,
            mem_fraction_static=args.mem_fraction_static,
            device_capacity_gb=readings.device_capacity_bytes / GiB,
            pre_model_load_memory_gb=readings.free_before_weights_bytes / GiB,
            weights_gb=weights_bytes / GiB,
            available_after_weights_gb=readings.free_after_weights_bytes / GiB,
            headroom_gb=pool.headroom_bytes / GiB,
            headroom_rule=pool.headroom_rule,
            reservations_bytes=dict(readings.reservations_bytes),
            reservation_rule=_reservation_rule(readings, pool, path),
            lendable_tail_tokens=0 if pool.prefill_slot_tail is None else pool.prefill_slot_tail.tokens,
            cell_size_bytes=readings.kv.cell_size_bytes,
            page_size=readings.page_size,
            max_total_num_tokens=pool.tokens,
            kv_pool_gb=pool.tokens * readings.kv.cell_size_bytes / GiB,
            swa_layers=readings.kv.swa_layers,
            swa_max_total_num_tokens=readings.kv.swa_tokens(pool.tokens, readings.page_size),
            max_running_requests=pool.max_running_requests,
            req_to_token_gb=req_to_token_bytes / GiB,
            cuda_graph_gb=capture.graph_bytes / GiB,
            cuda_graph_max_bs=cuda_graph_max_bs,
            activation_peak_gb=(capture.activation_peak_bytes or 0) / GiB,
            free_after_plan_gb=free_after_start_up_bytes / GiB,
            token_cap_reason=pool.cap_reason,
            per_rank_available_gb=[b / GiB for b in per_rank_free_after_weights_bytes],
            notes=list(notes),
            static_equivalent_tokens=pool.static_equivalent_tokens,
            sglang_rule_tokens=pool.sglang_rule_tokens,
            post_capture_budget_bytes=pool.budget_bytes if path.post_capture else None,
        )

    @property
    def reservations_gb(self) -> float:
        return sum(self.reservations_bytes.values()) / GiB

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["reservations_gb"] = round(self.reservations_gb, 4)
        return out

    def format_table(self, measured: bool = True) -> str:
        """The start-up log table; measured=False labels the measured terms as estimates (plan_memory)."""
        how = "measured" if measured else "estimated"
        rows = [
            ("path", f"{self.path} ({self.path_reason})" if self.path_reason else self.path),
            ("device", f"{self.device} x{self.tp_size} rank(s), capacity {self.device_capacity_gb:.2f} GiB"),
            ("mem_fraction_static", f"{self.mem_fraction_static}"),
            ("free before weights", f"{self.pre_model_load_memory_gb:.2f} GiB"),
            ("weights", f"{self.weights_gb:.2f} GiB"),
            ("free after weights", f"{self.available_after_weights_gb:.2f} GiB"),
            ("headroom", f"{self.headroom_gb:.2f} GiB ({self.headroom_rule})"),
        ]
        for name, nbytes in self.reservations_bytes.items():
            rule = f", {self.reservation_rule}" if self.reservation_rule else ""
            rows.append((f"reservation: {name}", f"{nbytes / GiB:.3f} GiB ({nbytes} bytes){rule}"))
        if self.lendable_tail_tokens:
            rows.append(("lendable tail", f"the pool's last {self.lendable_tail_tokens} tokens"))
        rows += [
            ("KV cell size", f"{self.cell_size_bytes} bytes/token"),
            ("KV pool", f"{self.kv_pool_gb:.2f} GiB = {self.max_total_num_tokens} tokens (page {self.page_size})"),
        ]
        if self.swa_layers:
            rows.append(
                (
                    "sliding-window layers",
                    f"{self.swa_layers} in their own pool of {self.swa_max_total_num_tokens} tokens",
                )
            )
        rows += [
            ("req_to_token", f"{self.req_to_token_gb:.3f} GiB for {self.max_running_requests} running requests"),
            ("CUDA graphs", f"{self.cuda_graph_gb:.3f} GiB {how} (max bs {self.cuda_graph_max_bs})"),
        ]
        if self.activation_peak_gb:
            rows.append(("activation peak", f"{self.activation_peak_gb:.3f} GiB {how}"))
        if self.static_equivalent_tokens is not None:
            rows.append(("static path would give", f"{self.static_equivalent_tokens} tokens"))
        if self.sglang_rule_tokens is not None:
            rows.append(("SGLang headroom rule", f"{self.sglang_rule_tokens} tokens"))
        if self.token_cap_reason:
            rows.append(("token cap", self.token_cap_reason))
        if self.free_after_plan_gb:
            rows.append(("free after start-up", f"{self.free_after_plan_gb:.2f} GiB"))
        for note in self.notes:
            rows.append(("note", note))
        width = max(len(k) for k, _ in rows)
        lines = ["Memory plan:"] + [f"  {k.ljust(width)} | {v}" for k, v in rows]
        return "\n".join(lines)
