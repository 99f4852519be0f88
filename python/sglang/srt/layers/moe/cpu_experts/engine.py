"""Python side of the CPU expert kernel: the I/O buffers, one handle per layer, and the two ways to run a step.

One CpuExpertsEngine per model holds the thread pool (--kt-cpuinfer threads, hot between layers) and
the host buffers every MoE layer's step goes through, pinned when CUDA is there: one input block (the
token count, then per token its activations, routing weights and expert ids) and the fp32 output.
The layers run one after another, so they share them.

On CUDA a step is stream-ordered and never waits on the host (it can be captured in a CUDA graph):
    the GPU writes the count, x, weights and ids straight into the pinned block (it is mapped into the
    GPU's address space: UVA), or packs them and copies the block over in one non-blocking copy
    start: ring the doorbell (a stream write of the layer's number into a pinned word that an idle pool
           thread polls), or a host function that routes and starts the pool
    the GPU computes its own experts meanwhile
    end:   a stream wait for the pool's "done" word (then cleared), or a host function that waits for the
           pool                                   <- the stream waits here
    the GPU reads the mixture from the pinned output (or copies it over)
The doorbell (on where a self-test passes; `doorbell=False` forces host functions) never hands the stream to the host: on
the H200 a step with nothing to compute costs 53 us per layer this way, 90 with host functions
(benchmark/kt_decode/probe_doorbell.py).
A decode graph is padded to its captured batch size; the real token count is copied from the device
when the step runs, so padded rows cost the CPU nothing.
"""

from __future__ import annotations

import ctypes
import logging
import types
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from sglang.srt.layers.moe.cpu_experts.build import load_kernel_library
from sglang.srt.layers.quantization.base_config import W2, W13, FusedMoEMethodBase

logger = logging.getLogger(__name__)

# Storage formats the kernel decodes (kernel.cpp's Format).
F32, BF16, INT8, INT4, FP8, MXFP4 = range(6)
HEADER_WORDS = 16  # kernel.cpp's kHeader: int32 words before the first token row
WHOLE_ROW = 1 << 30  # group_k of a scale per row: one group spans any row (a multiple of every vector chunk)


@dataclass(frozen=True)
class KernelFormat:
    code: int
    group_n: int = 1  # rows sharing one scale (FP8 blocks; 1 for FP8_PERCHANNEL)
    group_k: int = 1  # columns sharing one scale (INT4 / FP8 / MXFP4 groups; WHOLE_ROW for FP8_PERCHANNEL)


def kernel_format(method: FusedMoEMethodBase, params_dtype: torch.dtype) -> KernelFormat:
    """How the kernel reads experts stored by `method`; ValueError naming the flags when it cannot."""
    name = method.name
    if name == "BF16":
        if params_dtype == torch.bfloat16:
            return KernelFormat(BF16)
        if params_dtype == torch.float32:
            return KernelFormat(F32)
        raise ValueError(
            f"--kt-method BF16 keeps CPU experts in the model dtype, and the CPU expert kernel reads bfloat16 or "
            f"float32, not {params_dtype}: pass --dtype bfloat16 (or a quantized --kt-method)"
        )
    if name == "INT8":
        return KernelFormat(INT8)
    if name == "INT4":
        return KernelFormat(INT4, group_k=method.group)
    if name == "FP8":
        return KernelFormat(FP8, group_n=method.block, group_k=method.block)
    if name == "FP8_PERCHANNEL":
        return KernelFormat(FP8, group_n=1, group_k=WHOLE_ROW)
    if name == "MXFP4":
        return KernelFormat(MXFP4, group_k=32)
    raise ValueError(f"--kt-method {name}: the CPU expert kernel has no decoder for this format")


@dataclass(frozen=True)
class CpuExpertsStats:
    """Totals since the engine was built (the kt_decode benchmark's profile)."""

    steps: int  # layer steps run
    pairs: int  # (token, CPU expert) pairs computed
    experts_read: int  # expert weight sets read (one per routed CPU expert per step)
    bytes_read: int  # weight + scale bytes those reads cover
    compute_ns: int  # from each step's start to its last task
    wait_blocked_ns: int  # time the stream was held after the GPU reached the step's end

    @classmethod
    def from_raw(cls, raw) -> "CpuExpertsStats":
        return cls(*[int(v) for v in raw])

    def minus(self, other: "CpuExpertsStats") -> "CpuExpertsStats":
        return CpuExpertsStats(*[a - b for a, b in zip(self.__dict__.values(), other.__dict__.values())])


class CpuExpertsLayer:
    """The kernel's handle on one layer's CPU experts. It keeps the tensors it points into alive; it holds
    no reference to its engine, so the engine (and its threads) go when the model goes. `bf16_dot`: the
    layer's dots take bf16 activations (bf16 model, BF16 or INT4 experts, a CPU with AVX512-BF16); `int8_dot`:
    its gate/up dots take int8 activations, one scale per token (INT8 experts, a CPU with AVX512-VNNI)."""

    def __init__(self, handle: int, tensors: tuple, bf16_dot: bool, int8_dot: bool) -> None:
        self.handle, self._tensors, self.bf16_dot, self.int8_dot = handle, tensors, bf16_dot, int8_dot


class CpuExpertsEngine:
    def __init__(
        self,
        threads: int,
        hidden: int,
        inter: int,
        top_k: int,
        num_cpu_experts: int,
        expert_offset: int,
        capacity: int,
        pin_memory: bool,
        spin_us: int,
        int8_activations: bool = False,
        doorbell: bool = False,
        library: Optional[ctypes.CDLL] = None,
    ) -> None:
        """`int8_activations`: INT8 layers quantize their activations to int8 (one scale per token, and per
        pair for down_proj) and use int8 dot products where the CPU has AVX512-VNNI (KT models: always; tests and
        benchmarks compare with fp32 activations).
        `doorbell` (CUDA models): stream steps hand over through stream memory operations on pinned words
        where a self-test passes, else through host functions; `self.handover` says which. `library`: the
        compiled kernel (default: built for this CPU; tests pass a portable build)."""
        self.lib = library or load_kernel_library()
        self.int8_activations = int8_activations
        self.hidden, self.top_k, self.capacity, self.threads = hidden, top_k, capacity, threads

        self.row_width = hidden + 2 * top_k  # activations, routing weights, expert ids (int32 bits)
        self.inputs = torch.zeros(HEADER_WORDS + capacity * self.row_width, pin_memory=pin_memory)
        self.count = self.inputs[:1].view(torch.int32)
        rows = self.inputs[HEADER_WORDS:].view(capacity, self.row_width)
        self.x, self.weights = rows[:, :hidden], rows[:, hidden : hidden + top_k]
        self.ids = rows[:, hidden + top_k :].view(torch.int32)
        self.out = torch.zeros(capacity, hidden, pin_memory=pin_memory)
        # CUDA tensors over the same pinned bytes: kernels read and write them in place, so a step needs no
        # copy nodes (each costs tens of microseconds in a graph). None: copy the block instead.
        self.device_inputs = self.device_out = None
        if pin_memory:
            self.device_inputs, self.device_out = _mapped(self.inputs), _mapped(self.out)
            if self.device_inputs is None or self.device_out is None:
                self.device_inputs = self.device_out = None
                logger.warning("KT CPU experts: pinned buffers are not mapped for the GPU; steps copy them")
        # The doorbell's two words (ring at 0, done at 16: separate cache lines), or None: host functions.
        self.doorbell_words: Optional[torch.Tensor] = None
        if doorbell:
            reason = _stream_memops_fail_reason(self.lib)
            if reason is None:
                self.doorbell_words = torch.zeros(32, dtype=torch.int32, pin_memory=pin_memory)
            else:
                logger.warning("KT CPU experts: steps hand over through host functions (%s)", reason)
        self.handle = self.lib.ktc_engine_create(
            threads,
            hidden,
            inter,
            top_k,
            num_cpu_experts,
            expert_offset,
            capacity,
            self.inputs.data_ptr(),
            self.out.data_ptr(),
            spin_us,
            None if self.doorbell_words is None else self.doorbell_words.data_ptr(),
        )
        self.layers: list[CpuExpertsLayer] = []
        # The kernel's objects are freed with the engine (the finalizer holds plain handles, not the engine).
        self._layer_handles: list[int] = []
        self._finalizer = weakref.finalize(self, _destroy, self.lib, self.handle, self._layer_handles)

    @property
    def handover(self) -> str:
        """How stream steps reach the pool: "doorbell" or "host functions"."""
        return "host functions" if self.doorbell_words is None else "doorbell"

    # ------------------------------------------------------------------ layers
    def add_layer(self, layer: nn.Module, method: FusedMoEMethodBase) -> CpuExpertsLayer:
        """Register one layer's CPU experts (its parameters must not move afterwards)."""
        spec = layer.moe_weight_spec
        fmt = kernel_format(method, spec.params_dtype)
        tensors = []
        for prefix in (W13, W2):
            weight, scale = method.stored(layer, prefix)
            tensors += [weight.contiguous(), None if scale is None else scale.contiguous()]
        ptrs = [None if t is None else t.data_ptr() for t in tensors]
        bf16_activations = spec.params_dtype == torch.bfloat16
        handle = self.lib.ktc_layer_create(
            self.handle, fmt.code, *ptrs, fmt.group_n, fmt.group_k, bf16_activations, self.int8_activations
        )
        registered = CpuExpertsLayer(
            handle,
            tuple(tensors),
            bf16_dot=bool(self.lib.ktc_layer_uses_bf16_dot(handle)),
            int8_dot=bool(self.lib.ktc_layer_uses_int8_dot(handle)),
        )
        self.layers.append(registered)
        self._layer_handles.append(handle)
        return registered

    def close(self) -> None:
        """Stop the pool's threads and free the kernel's objects now (otherwise when the engine is collected)."""
        self._finalizer()

    def stats(self) -> CpuExpertsStats:
        raw = (ctypes.c_int64 * 6)()
        self.lib.ktc_engine_stats(self.handle, raw)
        return CpuExpertsStats.from_raw(raw)

    # ------------------------------------------------------------------- steps
    def run_on_host(
        self, layer: CpuExpertsLayer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """The CPU experts' mixture for CPU tensors, computed now: [T, hidden] fp32."""
        out = torch.empty((x.shape[0], self.hidden), dtype=torch.float32)
        for start in range(0, x.shape[0], self.capacity):
            n = min(self.capacity, x.shape[0] - start)
            rows = slice(start, start + n)
            self.x[:n].copy_(x[rows])
            self.ids[:n].copy_(topk_ids[rows])
            self.weights[:n].copy_(topk_weights[rows])
            self.count[0] = n
            self.lib.ktc_run(layer.handle)  # ctypes drops the GIL for the call
            out[rows].copy_(self.out[:n])
        return out

    def run_on_stream(
        self,
        layer: CpuExpertsLayer,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        num_real_tokens: Optional[torch.Tensor],
        gpu_work: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """Enqueue the step on the current CUDA stream and return gpu_work()'s output ([T, hidden], enqueued
        between the first slice's start and end, so the GPU computes while the CPU does) with the CPU
        experts' mixture added in place, in stream order. `num_real_tokens` ([1] int32 on the device)
        counts the rows that are not padding."""
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        mapped = self.device_inputs is not None
        out = None
        for start in range(0, max(x.shape[0], 1), self.capacity):
            n = min(self.capacity, x.shape[0] - start)
            rows = slice(start, start + n)
            # The GPU writes the block in place (mapped), or packs it and copies it over in one copy.
            size = HEADER_WORDS + n * self.row_width
            block = self.device_inputs[:size] if mapped else torch.empty(size, dtype=torch.float32, device=x.device)
            count = block[:1].view(torch.int32)
            if num_real_tokens is not None and x.shape[0] <= self.capacity:
                count.copy_(num_real_tokens)
            else:
                count.fill_(n)
            packed = block[HEADER_WORDS:].view(n, self.row_width)
            torch.cat([x[rows], topk_weights[rows], topk_ids[rows].view(torch.float32)], dim=1, out=packed)
            if not mapped:
                self.inputs[:size].copy_(block, non_blocking=True)
            _check(self.lib.ktc_enqueue_submit(layer.handle, stream), "start")
            if out is None:
                out = gpu_work()
            _check(self.lib.ktc_enqueue_wait(layer.handle, stream), "end")
            mixture = self.device_out[:n] if mapped else self.out[:n].to(x.device, non_blocking=True)
            out[rows] += mixture  # computed in fp32, rounded once to the output's dtype
        return out


def _mapped(host: torch.Tensor) -> Optional[torch.Tensor]:
    """A CUDA tensor over a pinned host tensor's bytes (pinned memory is mapped into the GPU's address
    space at the same address under UVA), or None where torch will not make one."""
    ptr, nbytes = host.data_ptr(), host.numel() * host.element_size()
    cai = {"version": 3, "shape": (nbytes,), "typestr": "|u1", "strides": None, "data": (ptr, False)}
    try:
        # The exporter holds the host tensor: the view keeps the pinned memory alive.
        view = torch.as_tensor(types.SimpleNamespace(__cuda_array_interface__=cai, host=host), device="cuda")
    except (RuntimeError, TypeError) as e:
        logger.debug("no CUDA view of pinned memory: %s", e)
        return None
    if not view.is_cuda or view.data_ptr() != ptr:
        return None
    return view.view(host.dtype).view(host.shape)


def _stream_memops_fail_reason(lib) -> Optional[str]:
    """None where stream memory operations on pinned host words work (a wait on a word already set, then a
    write, on a side stream: a failed write cannot leave the wait hanging), else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    words = torch.zeros(32, dtype=torch.int32, pin_memory=True)
    words[0] = 7
    stream = torch.cuda.Stream()
    handle = ctypes.c_void_p(stream.cuda_stream)
    wait_at, write_at = ctypes.c_void_p(words.data_ptr()), ctypes.c_void_p(words.data_ptr() + 64)
    result = lib.ktc_stream_wait_value(handle, wait_at, 7) or lib.ktc_stream_write_value(handle, write_at, 9)
    if result != 0:
        return "no CUDA driver (libcuda.so.1)" if result == -1 else f"stream memory operations: CUresult {result}"
    stream.synchronize()
    return None if int(words[16]) == 9 else "a stream write did not reach pinned memory"


def _check(result: int, what: str) -> None:
    if result != 0:
        reason = "no CUDA driver (libcuda.so.1) was found" if result == -1 else f"CUresult {result}"
        raise RuntimeError(f"enqueueing the CPU experts' step {what} on the CUDA stream failed: {reason}")


def _destroy(lib, handle: int, layer_handles: list) -> None:
    lib.ktc_engine_destroy(handle)  # joins the threads first: no step can be running on a layer after this
    for layer in layer_handles:
        lib.ktc_layer_destroy(layer)
