"""Post-capture KV sizing (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING): reserve the pool as CUDA virtual
memory, capture graphs against it, then back it with what is measured free."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class PostCaptureKVSizingMixin:
    def decide_post_capture_path(self: "ModelRunner") -> bool:
        plan = self.memory_plan
        blockers = self.server_args.post_capture_kv_sizing_blockers()
        plan.path = "static"
        plan.path_reason = "; ".join(blockers) if blockers else ""
        if not blockers:
            # Not built yet: fall back to the static path, loudly.
            plan.path_reason = "post-capture sizing is not available in this build"
            logger.warning("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is set but %s", plan.path_reason)
        return False

    def init_memory_pool_post_capture(self: "ModelRunner") -> None:
        raise AssertionError("unreachable: post-capture path not planned")

    def post_capture_resize_kv_pool(self: "ModelRunner") -> None:
        raise AssertionError("unreachable: post-capture path not planned")

    def release_kv_memory(self: "ModelRunner") -> None:
        """Drop the KV buffers (a VMM arena is unmapped only after its tensors are gone)."""
        pool = getattr(self, "token_to_kv_pool", None)
        if pool is not None:
            pool.release_buffers()
