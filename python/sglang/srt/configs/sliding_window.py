"""Which attention layers of a model see only a sliding window of keys, as transformers decides it.

transformers' rule (5.x): a config with ``layer_types`` windows the layers typed "sliding_attention" (Qwen2/Qwen3
with use_sliding_window, from max_window_layers on); a config without them (Mistral, Qwen3-MoE) windows every
layer when ``sliding_window`` is set. Within a window of W, the query at position p sees the keys at positions
p - W + 1 .. p (masking_utils.sliding_window_overlay: kv_idx > q_idx - W). A layer type we do not know (chunked
attention, ...) is refused rather than run as full attention.
"""

from __future__ import annotations

from typing import Any, Tuple

NO_WINDOW = -1  # RadixAttention.sliding_window_size of a full-attention layer (SGLang's convention)


def layer_sliding_windows(config: Any) -> Tuple[int, ...]:
    """One entry per decoder layer: its window (> 0) or NO_WINDOW. ValueError for what we cannot honour."""
    window = getattr(config, "sliding_window", None)
    layers = config.num_hidden_layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        kinds = ["sliding_attention" if window else "full_attention"] * layers
    else:
        kinds = list(layer_types)
        unknown = sorted(set(kinds) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"config.layer_types {unknown}: only full_attention and sliding_attention are supported")
    if "sliding_attention" in kinds and (not isinstance(window, int) or window <= 0):
        raise ValueError(f"config.sliding_window {window!r}: sliding_attention layers need a positive window")
    return tuple(window if kind == "sliding_attention" else NO_WINDOW for kind in kinds)


def layer_sliding_window(config: Any, layer_id: int) -> int:
    """The window of decoder layer `layer_id` (NO_WINDOW for full attention)."""
    return layer_sliding_windows(config)[layer_id]
