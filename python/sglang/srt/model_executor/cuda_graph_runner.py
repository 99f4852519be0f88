"""Decode CUDA graphs: one graph per batch size, captured largest first into one shared memory pool.

A decode batch of size b runs the graph of the smallest captured size >= b; the padded rows point
at request row 0 with seq_len 1 and write their K/V to the dummy slot 0, so they never touch a
real request's cache. Inputs are copied into static buffers before each replay.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional

import torch
from tqdm.auto import tqdm

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


class CudaGraphRunner:
    def __init__(
        self,
        model_runner,
        capture_bs: Optional[List[int]] = None,
        capture_stream: Optional[torch.cuda.Stream] = None,
    ) -> None:
        """``capture_bs``: the batch sizes to capture (default: the kernel config's, ``--cuda-graph-bs`` or SGLang's
        list up to ``--cuda-graph-max-bs``, within the request table). ``capture_stream``: the stream to capture on (default a new one); a green
        context's stream confines the graphs' kernels to its SMs (benchmark/serving/bench_prefill_decode_overlap.py).
        The attention backend's graph buffers are made anew: graphs of an earlier runner must not replay after."""
        self.model_runner = model_runner
        rows = model_runner.req_to_token_pool.size
        if capture_bs is None:
            self.capture_bs = model_runner.config.kernels.capture_batch_sizes(rows)
        else:
            max_bs = min(model_runner.config.kernels.cuda_graph_max_bs, rows)
            self.capture_bs = [bs for bs in capture_bs if bs <= max_bs]
        self.max_bs = self.capture_bs[-1]
        dev = model_runner.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.num_real_tokens = torch.ones(1, dtype=torch.int32, device=dev)
        self.fill_value = model_runner.attn_backend.get_cuda_graph_seq_len_fill_value()
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.capture(capture_stream or torch.cuda.Stream())

    def _forward_batch(self, bs: int) -> ForwardBatch:
        mr = self.model_runner
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens_cpu=[self.fill_value] * bs,
            seq_lens_sum=self.fill_value * bs,
            req_to_token_pool=mr.req_to_token_pool,
            token_to_kv_pool=mr.token_to_kv_pool,
            attn_backend=mr.attn_backend,
            num_real_tokens=self.num_real_tokens,
        )
        fb.attn_metadata = mr.attn_backend.init_forward_metadata_capture_cuda_graph(
            bs, self.req_pool_indices, self.seq_lens
        )
        return fb

    def capture(self, stream: torch.cuda.Stream) -> None:
        """Capture every batch size on `stream`; the model runner measures the memory this takes and logs it."""
        mr = self.model_runner
        for bs in tqdm(list(reversed(self.capture_bs)), desc="Capturing CUDA graphs", leave=False):
            fb = self._forward_batch(bs)
            self.num_real_tokens.fill_(bs)
            with torch.cuda.stream(stream):
                # Warm-up outside capture: triton compiles and lazy cuBLAS inits must not be captured.
                mr.model.forward(fb.input_ids, fb.positions, fb)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    out = mr.model.forward(fb.input_ids, fb.positions, fb)
            self.graphs[bs] = graph
            self.outputs[bs] = out.next_token_logits
        torch.cuda.synchronize()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_decode() and forward_batch.batch_size <= self.max_bs

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:  # padding rows: request row 0, one token, the dummy slot
            self.req_pool_indices[raw_bs:bs].zero_()
            self.seq_lens[raw_bs:bs].fill_(self.fill_value)
            self.out_cache_loc[raw_bs:bs].zero_()
            self.positions[raw_bs:bs].zero_()
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.positions[:raw_bs].copy_(forward_batch.positions)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(forward_batch.out_cache_loc)
        self.num_real_tokens.fill_(raw_bs)
        seq_lens_sum = forward_batch.seq_lens_sum + (bs - raw_bs) * self.fill_value
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_pool_indices, self.seq_lens, seq_lens_sum
        )
        self.graphs[bs].replay()
        return LogitsProcessorOutput(next_token_logits=self.outputs[bs][:raw_bs])
