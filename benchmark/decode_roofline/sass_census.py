"""The instruction mix of the project's triton kernels compiled for sm_90 (the H100 / H200), on a machine without a GPU.

    python benchmark/decode_roofline/sass_census.py --match "MoE GEMM" --out DIR     # CPU only: triton's ptxas + nvdisasm

Where a kernel is bound by its arithmetic rather than its bytes (the fused MoE over two-codes-a-byte experts, whose
one-token GEMMs ran at 3-8x their bytes), what it executes per weight says more than a guess: a float conversion
(I2F / F2F, a quarter of the FP32 rate on Hopper) costs what four FP32 ops do. Each case of
``test/unit/layers/test_kernels_compile_for_hopper.py`` (a kernel, its pointer dtypes and constexprs as the launcher
passes them) whose name contains ``--match`` is compiled for sm_90 (triton's defaults: 4 warps, 3 stages, or
``--warps`` / ``--stages``), its cubin disassembled, and its instructions counted by class: a static count of the whole
kernel, loop bodies once. The table goes to stdout and ``census.md``, every opcode's count to ``census.json``. Compare
two trees by running each's copy of this script. Not a timing: a branch that wins here still needs the GPU
(docs/gpu_test_runs.md).

The "rings" column is the software pipeline: each loop tile's shared-memory buffers (``64x512xbf16:1``: one buffer, so
the next step's copy is issued after this step's dots and nothing overlaps; 2: double-buffered). With ``--aligned``
(the launch's 16-byte alignment facts) the decode attention kernels show what a launch gets: their rows are gathered
through kv_indices (a load feeding a load), and triton's pipeliner splits num_stages between the two, so 2-4 stages
leave one row buffer and 5 give two (measured on the GPU: two buffers did not pay, ``benchmark/mla/README.md``).

    python benchmark/decode_roofline/sass_census.py --match "MLA decode" --warps 4 --stages 2 --aligned
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES_FILE = ROOT / "test" / "unit" / "layers" / "test_kernels_compile_for_hopper.py"
# Opcode classes: what each costs differs by an order of magnitude on the same SM.
CLASSES = {
    "conversions": ("I2F", "I2FP", "F2F", "F2FP", "F2I", "F2IP", "I2I", "I2IP"),
    "fp32": ("FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP"),
    "fp16x2": ("HFMA2", "HMUL2", "HADD2", "HMNMX2", "HSETP2"),
    "int": ("IMAD", "IADD3", "LOP3", "SHF", "PRMT", "LEA", "VIADD", "SGXT", "ISETP", "SEL", "IABS", "IMNMX"),
    "tensor": ("HGMMA", "HMMA", "QGMMA", "IMMA"),
    "memory": ("LDG", "STG", "LDS", "STS", "LDSM", "LDGSTS", "UTMALDG", "ATOMG", "RED"),
    "barriers": ("BAR", "WARPGROUP", "SYNCS", "DEPBAR"),
    "special": ("MUFU",),
}
OPCODE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def load_compile_test():
    """The compile test's module: its cases (one place for the kernels' launch shapes) and its sm_90 compile."""
    spec = importlib.util.spec_from_file_location("hopper_cases", CASES_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def opcode_counts(sass: str) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        m = OPCODE.match(line)
        if m:
            counts[m.group(1)] += 1
    return counts


def census(compiled, nvdisasm: str) -> collections.Counter:
    """The opcode counts of a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    return opcode_counts(sass)


def by_class(counts: collections.Counter) -> dict:
    row = {name: sum(counts[op] for op in ops) for name, ops in CLASSES.items()}
    row["other"] = sum(counts.values()) - sum(row.values())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--match", default="", help="only the compile test's cases whose name contains this")
    ap.add_argument("--out", default=None, help="folder for census.md / census.json")
    ap.add_argument("--warps", type=int, default=4, help="num_warps to compile with (a launch's, e.g. 4)")
    ap.add_argument("--stages", type=int, default=3, help="num_stages to compile with (a launch's, e.g. 2)")
    ap.add_argument(
        "--aligned",
        action="store_true",
        help="pointers and stride* ints taken as multiples of 16, as triton's launcher specializes a pool's rows "
        "(vectorized loads, hence async copies); a stride that is 1 at the launch is specialized to the constant 1 "
        "instead, which this does not model (the MoE GEMMs' K strides)",
    )
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # compiled for the GPU, not interpreted
    import triton

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    if not os.path.exists(nvdisasm):
        sys.exit(f"this triton build has no nvdisasm ({nvdisasm}): nothing to disassemble with")
    module = load_compile_test()
    cases = [c for c in module._cases() if args.match in c[0]]
    if not cases:
        sys.exit(f"no case of {CASES_FILE.name} has {args.match!r} in its name")
    header = ["case", "instructions", *CLASSES, "other", "rings"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    rows = []
    for case in cases:
        name = case[0]
        compiled = module.compile_for_sm90(*case, num_warps=args.warps, num_stages=args.stages, aligned=args.aligned)
        counts = census(compiled, nvdisasm)
        classes = by_class(counts)
        rings = module.ring_depths(compiled)
        rows.append(
            {
                "case": name,
                "instructions": sum(counts.values()),
                "classes": classes,
                "opcodes": dict(counts),
                "rings": rings,
            }
        )
        ring_text = " ".join(f"{shape}:{depth}" for shape, depth in rings) or "-"
        lines.append(
            f"| {name} | {sum(counts.values())} | " + " | ".join(str(v) for v in classes.values()) + f" | {ring_text} |"
        )
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "census.md").write_text(
            f"sm_90 instruction census (static counts; {args.warps} warps, {args.stages} stages"
            f"{', aligned' if args.aligned else ''}; rings: the software pipeline's shared-memory buffers of each "
            "tile shape)\n\n" + "\n".join(lines) + "\n"
        )
        (out / "census.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
