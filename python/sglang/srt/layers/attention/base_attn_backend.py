"""The interface every attention backend implements (torch-native reference, triton)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.layers.quantization.block_fp8_activation import Activation, ActivationLayout, BlockFp8Activation

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend(ABC):
    # Whether decode can be captured in a CUDA graph (needs fixed-shape, sync-free metadata).
    supports_cuda_graph: bool = False

    @abstractmethod
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Build whatever per-batch index tensors the kernels need, once per forward (not per layer)."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
        quantize: Optional[ActivationLayout] = None,
    ) -> Activation:
        """q: [T, Hq*D], k: [T, Hkv*D], v: [T, Hkv*Dv] -> [T, Hq*Dv]. Writes k, v to the KV pool first.
        ``quantize``: the output handed to a block-fp8 o_proj, quantized in that layout: by the decode kernels
        where the backend can (``forward_decode_quantized``), else by the quantization kernel after."""
        if forward_batch.forward_mode.is_decode():
            if quantize is not None:
                handed = self.forward_decode_quantized(q, k, v, layer, forward_batch, save_kv_cache, quantize)
                if handed is not None:
                    return handed
            out = self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        else:
            out = self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        if quantize is None:
            return out
        from sglang.srt.layers.quantization.fp8_block_linear import quantize_activation

        return quantize_activation(out, quantize)

    def forward_decode_quantized(
        self, q, k, v, layer, forward_batch, save_kv_cache: bool, layout: ActivationLayout
    ) -> Optional[BlockFp8Activation]:
        """Decode with the output written quantized in ``layout`` by the attention kernels themselves; None where
        this backend cannot (the caller quantizes forward_decode's output)."""
        return None

    def forward_mla(
        self, q_nope, q_rope, latent, k_rope, w_kv_b, layer, forward_batch, save_kv_cache=True, q_latent=None
    ) -> torch.Tensor:
        """Multi-head latent attention (DeepSeek-V2/V3) over the latent pool: stores this step's rows (unless
        `save_kv_cache` is False: stored already), then attends (see mla_torch.py for the shapes). The torch
        implementation serves every backend until one has kernels of its own. `q_latent` is only ever given where
        `mla_query_absorb` asked for it (never here)."""
        from sglang.srt.layers.attention import mla_torch

        return mla_torch.forward(q_nope, q_rope, latent, k_rope, w_kv_b, layer, forward_batch, save_kv_cache)

    def mla_query_absorb(self, q_nope, w_kv_b, layer, forward_batch):
        """A head_matmul.HeadMatmul of q_nope through W_UK for the kernel before attention to compute, where
        `forward_mla` takes the product as `q_latent` for this batch; None here (the torch path absorbs itself)."""
        return None

    @abstractmethod
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor: ...

    @abstractmethod
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor: ...

    # ---- CUDA graph hooks (only backends with supports_cuda_graph implement them)
    def init_cuda_graph_state(self, max_bs: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot run in CUDA graphs")

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int
    ) -> None:
        raise NotImplementedError

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """seq_len of padded graph rows: 1 token, which lives in the dummy slot."""
        return 1
