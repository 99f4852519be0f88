"""Where a kernel's warps wait, instruction by instruction: the hot spots of an Nsight Compute source page.

    ncu --kernel-name regex:_mla_decode_stage1 --launch-skip 2 --launch-count 1 --section SourceCounters \
      --page source --print-source sass --csv python3 benchmark/mla/ncu_mla_decode_target.py > sass.csv
    python3 benchmark/mla/ncu_sass_hotspots.py sass.csv [--top 20] > hotspots.md     # = part of run.sh ncu-mla

ncu's CSV gives one row per SASS instruction with its warp-stall samples, in total and by reason. This prints, as
markdown: the samples by reason over the whole kernel, then the instructions holding the most samples (offset from
the kernel's first instruction, the instruction, its share, how often it ran, and its leading reasons), and the
instruction mix of the loads, copies and barriers that the pipelining questions of `README.md` turn on.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections import Counter
from dataclasses import dataclass

TOTAL = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
# Opcodes whose counts say how the kernel moves its rows: plain global loads, async copies and their waits, shared
# memory traffic, barriers, tensor-core MMAs.
MIX_PREFIXES = ("LDG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDS", "LDSM", "STS", "STSM", "BAR", "HMMA", "HGMMA")


@dataclass(frozen=True)
class Instruction:
    offset: int
    text: str
    samples: int
    executed: int
    reasons: dict[str, int]  # stall reason (ncu's short name, "long_sb") -> samples

    @property
    def opcode(self) -> str:
        words = self.text.split()
        if not words:
            return ""
        return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def parse(text: str) -> list[Instruction]:
    """The instruction rows of ncu's `--page source --print-source sass --csv` output (anything before its header
    row, such as the target's own prints and ncu's ==PROF== lines, is skipped)."""
    rows = list(csv.reader(io.StringIO(text)))
    starts = [i for i, row in enumerate(rows) if row[:2] == ["Address", "Source"]]
    if not starts:
        raise ValueError("no 'Address','Source' header: not an ncu --page source --csv listing")
    header = rows[starts[0]]
    col = {name: i for i, name in enumerate(header)}
    reason_cols = [name for name in header if name.startswith("stall_") and not name.endswith("(Not Issued)")]
    body = [row for row in rows[starts[0] + 1 :] if len(row) == len(header) and row[0].startswith("0x")]
    if not body:
        raise ValueError("the listing has a header but no instruction rows")
    base = int(body[0][0], 16)

    def number(row: list[str], name: str) -> int:
        value = row[col[name]].replace(",", "")
        return int(float(value)) if value not in ("", "-") else 0

    return [
        Instruction(
            offset=int(row[0], 16) - base,
            text=row[1].strip(),
            samples=number(row, TOTAL),
            executed=number(row, EXECUTED),
            reasons={name[len("stall_") :]: number(row, name) for name in reason_cols if number(row, name)},
        )
        for row in body
    ]


def report(instructions: list[Instruction], top: int) -> str:
    total = sum(i.samples for i in instructions)
    by_reason: Counter[str] = Counter()
    for i in instructions:
        by_reason.update(i.reasons)
    lines = [f"{len(instructions)} instructions, {total} warp-stall samples", "", "| reason | samples | share |"]
    lines.append("|---|---:|---:|")
    lines += [f"| {r} | {n} | {100 * n / max(total, 1):.1f}% |" for r, n in by_reason.most_common()]
    lines += [
        "",
        "| offset | instruction | samples | share | executed | leading reasons |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for i in sorted(instructions, key=lambda i: (-i.samples, i.offset))[:top]:
        leading = ", ".join(f"{r} {n}" for r, n in sorted(i.reasons.items(), key=lambda kv: -kv[1])[:3])
        text = i.text.replace("|", "\\|")
        share = 100 * i.samples / max(total, 1)
        lines.append(f"| 0x{i.offset:x} | `{text}` | {i.samples} | {share:.1f}% | {i.executed} | {leading} |")
    mix = Counter(i.opcode for i in instructions if i.opcode.split(".")[0] in MIX_PREFIXES)
    lines += ["", "| opcode | static count | executed (warp instructions) |", "|---|---:|---:|"]
    for opcode in sorted(mix):
        executed = sum(i.executed for i in instructions if i.opcode == opcode)
        lines.append(f"| {opcode} | {mix[opcode]} | {executed} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    p.add_argument("--top", type=int, default=20, help="instructions listed (most samples first)")
    args = p.parse_args(argv)
    with open(args.csv, encoding="utf-8", errors="replace") as f:
        sys.stdout.write(report(parse(f.read()), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
