"""How tensors and attention heads are split across tensor-parallel ranks.

Splits are contiguous and as even as possible, so sizes that do not divide by the rank count still
shard (SmolLM2's 9 query / 3 KV heads over 2 ranks: rank 0 holds KV head 0 and query heads 0-2,
rank 1 KV heads 1-2 and query heads 3-8). Query heads always follow their KV head, so grouped-query
attention stays local to a rank. With fewer KV heads than ranks the KV heads are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass


def shard_range(total: int, tp_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of `rank`'s share of `total` units; the first total % tp_size ranks get one more."""
    base, extra = divmod(total, tp_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class HeadPartition:
    q_start: int
    q_end: int
    kv_start: int
    kv_end: int
    kv_replicas: int  # ranks holding a copy of each KV head (1 unless KV heads < ranks)

    @property
    def num_q_heads(self) -> int:
        return self.q_end - self.q_start

    @property
    def num_kv_heads(self) -> int:
        return self.kv_end - self.kv_start

    @classmethod
    def for_rank(cls, num_q_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> "HeadPartition":
        if num_q_heads % num_kv_heads:
            raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
        group = num_q_heads // num_kv_heads
        if num_kv_heads >= tp_size:
            kv_start, kv_end = shard_range(num_kv_heads, tp_size, rank)
            return cls(kv_start * group, kv_end * group, kv_start, kv_end, 1)
        if tp_size % num_kv_heads:
            raise ValueError(
                f"--tp-size {tp_size} must be a multiple of the {num_kv_heads} KV heads when it exceeds them"
            )
        replicas = tp_size // num_kv_heads
        if group % replicas:
            raise ValueError(
                f"--tp-size {tp_size}: each KV head's {group} query heads cannot be split over {replicas} ranks"
            )
        kv = rank // replicas
        per_rank = group // replicas
        q_start = kv * group + (rank % replicas) * per_rank
        return cls(q_start, q_start + per_rank, kv, kv + 1, replicas)
