"""Slots sorted by expert and padded to the GEMM's M tile: the routing layout the fused-MoE GEMMs read.

Two implementations of one contract (AlignedRouting, below), identical outputs:
  - moe_align_block_size_triton: one kernel launch (one program), for the decode-sized case;
  - moe_align_block_size_torch: ~25 torch ops, any size (the reference, and the fallback past
    ALIGN_KERNEL_MAX_SLOTS, where one program would walk too many slots x experts).
Both are CUDA-graph capturable: no host sync, every shape is a host function of the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang.srt.layers.pdl import pdl_available, pdl_prologue

# The kernel walks num_slots x experts one-hot tiles in one program: fine for decode batches (a few
# thousand slots), too serial for long prefills, which amortise torch's ~25 launches anyway.
ALIGN_KERNEL_MAX_SLOTS = 4096


@dataclass(frozen=True)
class AlignedRouting:
    sorted_slot_ids: torch.Tensor  # int32 [capacity]; padding rows hold num_slots
    expert_ids: torch.Tensor  # int32 [capacity // block_m]; -1 past the last used tile
    num_padded: torch.Tensor  # int32 [1]: rows in use (tiles past it exit at once)


def aligned_capacity(num_slots: int, block_m: int, num_experts: int) -> int:
    """Static upper bound of the padded rows: each of the at most min(T*k, E) used experts pads by
    fewer than block_m rows; a multiple of block_m."""
    return -(-(num_slots + min(num_slots, num_experts) * (block_m - 1)) // block_m) * block_m


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> AlignedRouting:
    """The one-launch kernel up to ALIGN_KERNEL_MAX_SLOTS slots, torch past it. Callers are the triton
    fused MoE: a device that runs its GEMM kernels (CUDA, or the CPU in the triton interpreter) runs this one."""
    if topk_ids.numel() <= ALIGN_KERNEL_MAX_SLOTS:
        return moe_align_block_size_triton(topk_ids, block_m, num_experts)
    return moe_align_block_size_torch(topk_ids, block_m, num_experts)


def moe_align_block_size_torch(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> AlignedRouting:
    """Group slots by expert with torch ops only. Within an expert, slots keep their order (stable sort).

    Slots with id -1 (experts computed elsewhere) get no rows at all.
    """
    flat = topk_ids.reshape(-1).long()
    num_slots = flat.numel()
    dev = flat.device
    bucket = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)  # bucket E = skipped
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded

    order = torch.sort(bucket, stable=True).indices
    sorted_bucket = bucket[order]
    count_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_slots, device=dev) - count_start[sorted_bucket]

    capacity = aligned_capacity(num_slots, block_m, num_experts)
    # Skipped slots all land on one trash row past the capacity, which is sliced off.
    # torch.full, not torch.tensor([...]): a host->device copy would break CUDA-graph capture.
    start = torch.cat((padded_start, torch.full((1,), capacity, dtype=torch.long, device=dev)))
    dest = torch.where(sorted_bucket < num_experts, start[sorted_bucket] + rank, capacity)
    sorted_ids = torch.full((capacity + 1,), num_slots, dtype=torch.long, device=dev)
    sorted_ids.scatter_(0, dest, order)

    tile_start = torch.arange(0, capacity, block_m, device=dev)
    expert_ids = torch.searchsorted(padded_end, tile_start, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1)
    return AlignedRouting(
        sorted_slot_ids=sorted_ids[:capacity].to(torch.int32),
        expert_ids=expert_ids.to(torch.int32),
        num_padded=padded_end[-1:].to(torch.int32),
    )


@triton.jit
def _moe_align_kernel(
    ids_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_slots, num_experts, num_tiles,
    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_prologue(PDL)
    # One program. Slots are walked in BLOCK_S chunks as [BLOCK_S, E_PAD] one-hot tiles: the column
    # sums count, the column cumsum ranks a slot among its expert's earlier slots (the torch version's
    # stable order, so both write the same rows). Padding experts (>= num_experts) match no id.
    experts = tl.arange(0, E_PAD)
    # while loops: the triton interpreter's range() rejects runtime bounds (mla_decode.py does the same).
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    s0 = 0
    while s0 < num_slots:
        offs = s0 + tl.arange(0, BLOCK_S)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
        s0 += BLOCK_S
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    padded_start = padded_end - padded
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))

    # Real slots: row = its expert's first row + its rank. Skipped (-1) slots match no column: no row.
    seen = tl.zeros((E_PAD,), dtype=tl.int32)  # slots of each expert in earlier chunks
    s0 = 0
    while s0 < num_slots:
        offs = s0 + tl.arange(0, BLOCK_S)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1).to(tl.int32)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
        rows = padded_start[None, :] + seen[None, :] + tl.cumsum(onehot, axis=0) - 1
        dest = tl.sum(onehot * rows, axis=1)
        tl.store(sorted_ids_ptr + dest, offs, mask=tl.sum(onehot, axis=1) > 0)
        seen += tl.sum(onehot, axis=0)
        s0 += BLOCK_S

    # Tiles: the expert owning each (searchsorted right of its first row in padded_end, -1 past the
    # used rows), and its padding rows (past the expert's real rows) get num_slots. Those are exactly
    # the rows the loop above leaves unwritten, so no store races another (no barrier needed).
    in_tile = tl.arange(0, BLOCK_M)
    t0 = 0
    while t0 < num_tiles:
        tiles = t0 + tl.arange(0, BLOCK_T)
        tile_start = tiles * BLOCK_M
        owner = tl.sum((padded_end[None, :] <= tile_start[:, None]).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + tiles, tl.where(owner < num_experts, owner, -1), mask=tiles < num_tiles)
        real_end = tl.sum(tl.where(experts[None, :] == owner[:, None], (padded_start + counts)[None, :], 0), axis=1)
        real_rows = tl.minimum(tl.maximum(real_end - tile_start, 0), BLOCK_M)
        pad = (in_tile[None, :] >= real_rows[:, None]) & (tiles < num_tiles)[:, None]
        rows = tile_start[:, None] + in_tile[None, :]
        tl.store(sorted_ids_ptr + rows, tl.full((BLOCK_T, BLOCK_M), 0, tl.int32) + num_slots, mask=pad)
        t0 += BLOCK_T


def moe_align_block_size_triton(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> AlignedRouting:
    """moe_align_block_size_torch's result in one kernel launch (outputs are torch.empty: no fill kernels)."""
    flat = topk_ids.reshape(-1)
    num_slots = flat.numel()
    capacity = aligned_capacity(num_slots, block_m, num_experts)
    num_tiles = capacity // block_m
    dev = flat.device
    sorted_ids = torch.empty(capacity, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_tiles, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    e_pad = triton.next_power_of_2(num_experts)
    pdl = pdl_available(flat)
    _moe_align_kernel[(1,)](
        flat, sorted_ids, expert_ids, num_padded,
        num_slots, num_experts, num_tiles,
        BLOCK_M=block_m,
        E_PAD=e_pad,
        BLOCK_S=max(16, min(256, 8192 // e_pad)),  # one-hot tiles of at most ~8K elements
        BLOCK_T=max(16, min(64, 4096 // max(e_pad, block_m))),
        PDL=pdl,
        num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
    return AlignedRouting(sorted_slot_ids=sorted_ids, expert_ids=expert_ids, num_padded=num_padded)
