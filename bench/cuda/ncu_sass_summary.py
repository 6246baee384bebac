#!/usr/bin/env python3
"""Sums an Nsight Compute source page (ncu --import R --page source --csv --print-source sass)
by opcode and by warp-stall reason: where a kernel's instructions and stall samples go.
    python3 bench/cuda/ncu_sass_summary.py ncu_sass_residual.csv [--json out.json]"""
import argparse
import collections
import csv
import json
import sys


def summarize(path):
    with open(path) as file:
        rows = list(csv.reader(file))
    header_row = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r), None)
    if header_row is None:
        sys.exit(f"ncu_sass_summary: {path} is no SASS source page "
                 "(ncu --import R --page source --csv --print-source sass)")
    header = rows[header_row]
    column = {name: i for i, name in enumerate(header)}
    stall_names = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    instructions, samples_by_op, stalls = collections.Counter(), collections.Counter(), collections.Counter()
    samples = 0
    for row in rows[header_row + 1:]:
        try:
            executed = int(row[column["Instructions Executed"]] or 0)
            sampled = int(row[column["Warp Stall Sampling (All Samples)"]] or 0)
        except (ValueError, IndexError):
            continue
        if executed == 0 and sampled == 0:  # never ran, never sampled: nothing to add
            continue
        source = row[column["Source"]].strip()
        if source.startswith("@"):  # predicate
            source = source.split(None, 1)[1]
        opcode = source.split()[0].split(".")[0] if source else "?"
        instructions[opcode] += executed
        samples_by_op[opcode] += sampled
        samples += sampled
        for name in stall_names:
            stalls[name] += int(row[column[name]] or 0)
    total = sum(instructions.values())
    return {
        "instructions": total,
        "stall_samples": samples,
        "stalls": {k: {"samples": v, "share": v / max(samples, 1)} for k, v in stalls.most_common() if v},
        "opcodes": {k: {"executed": v, "share": v / max(total, 1), "stall_samples": samples_by_op[k]}
                    for k, v in instructions.most_common()},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--json")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    summary = summarize(args.csv)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(summary, out, indent=1)
    print(f"{summary['instructions']:,} instructions, {summary['stall_samples']:,} stall samples")
    for name, value in list(summary["stalls"].items())[:8]:
        print(f"  {name:26s} {100 * value['share']:5.1f}%")
    for name, value in list(summary["opcodes"].items())[:args.top]:
        print(f"  {name:10s} {value['executed']:>12,} {100 * value['share']:5.1f}%  samples {value['stall_samples']}")


if __name__ == "__main__":
    main()
