#!/usr/bin/env python3
"""One decode step, kernel by kernel, against the bandwidth floor (issue 43, item 4).

Reads Nsight Compute's raw CSV page (plain or .xz) of a run that collected at least
gpu__time_duration.sum and dram__bytes.sum, e.g.
    ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum \\
        --launch-skip 40 --launch-count 650 --csv --page raw loom_cuda_bench --what decode --batch-sizes 64
and takes one step: the launches from the first `--step-kernel` (the embedding, which runs once a step)
up to the next one (or to the end). For each kernel it sums time and DRAM bytes and sets them against the
time those bytes take at `--bandwidth` (default: the "measured device-to-device copy: X TB/s" line that
loom_cuda_bench prints into the same file): the excess over that floor, and its share of the step's excess,
say which kernels hold the gap.
    python3 bench/cuda/ncu_decode_breakdown.py ncu_b64.csv[.xz] [--bandwidth 4.29e12] [--json out.json]
"""
import argparse
import csv
import json
import lzma
import re
import sys

TIME_UNITS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1.0,
              "second": 1.0}
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def read_lines(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", errors="replace") as file:
        return file.read().splitlines()


def number(text):
    return float(text.replace(",", "")) if text not in ("", "n/a") else 0.0


def short_name(name):
    """The kernel's name without its argument list and namespace noise: attention_kernel<128, 1, 0>."""
    name = re.sub(r"\(int\)|\(bool\)|\(unsigned int\)", "", name)
    depth, cut = 0, len(name)
    for index, char in enumerate(name):  # the argument list is the first '(' outside template brackets
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(depth - 1, 0)  # some exports drop the '<' of "<unnamed>"
        elif char == "(" and depth == 0:
            cut = index
            break
    name = name[:cut].replace("void ", "").strip()
    return re.sub(r"^(loom::)?(cuda::)?(\(anonymous namespace\)|<?unnamed>)::", "", name)


def parse(lines):
    """(launches as (name, seconds, bytes), bandwidth from the bench's own line or None)."""
    bandwidth = None
    for line in lines:
        match = re.search(r"measured device-to-device copy: ([0-9.]+) TB/s", line)
        if match:
            bandwidth = float(match.group(1)) * 1e12
    starts = [i for i, line in enumerate(lines) if line.startswith('"ID"')]
    if not starts:
        raise SystemExit("no ncu raw CSV page (a header row starting with \"ID\") in the input")
    rows = list(csv.reader(lines[starts[0]:]))
    header, units = rows[0], rows[1]
    try:
        name_at, time_at, bytes_at = (header.index(k) for k in ("Kernel Name", "gpu__time_duration.sum", "dram__bytes.sum"))
    except ValueError as error:
        raise SystemExit(f"the ncu page lacks a needed column: {error}")
    time_scale = TIME_UNITS.get(units[time_at])
    byte_scale = BYTE_UNITS.get(units[bytes_at])
    if time_scale is None or byte_scale is None:
        raise SystemExit(f"unknown units: {units[time_at]!r}, {units[bytes_at]!r}")
    launches = []
    for row in rows[2:]:
        if len(row) <= max(name_at, time_at, bytes_at) or not row[name_at]:
            continue
        launches.append((short_name(row[name_at]), number(row[time_at]) * time_scale,
                         number(row[bytes_at]) * byte_scale))
    return launches, bandwidth


def one_step(launches, step_kernel):
    marks = [i for i, (name, _, _) in enumerate(launches) if step_kernel in name]
    if not marks:
        raise SystemExit(f"no {step_kernel!r} launch: cannot tell where a step starts (--step-kernel)")
    end = marks[1] if len(marks) > 1 else len(launches)
    return launches[marks[0]:end]


def breakdown(step, bandwidth):
    kernels = {}
    for name, seconds, size in step:
        entry = kernels.setdefault(name, {"launches": 0, "seconds": 0.0, "bytes": 0.0})
        entry["launches"] += 1
        entry["seconds"] += seconds
        entry["bytes"] += size
    total_seconds = sum(k["seconds"] for k in kernels.values())
    total_bytes = sum(k["bytes"] for k in kernels.values())
    rows = []
    for name, k in kernels.items():
        floor = k["bytes"] / bandwidth
        rows.append({"kernel": name, "launches": k["launches"], "us_per_launch": 1e6 * k["seconds"] / k["launches"],
                     "share_of_step": k["seconds"] / total_seconds if total_seconds else 0.0,
                     "bandwidth_GBps": k["bytes"] / k["seconds"] / 1e9 if k["seconds"] else 0.0,
                     "floor_us": 1e6 * floor, "excess_us": 1e6 * max(k["seconds"] - floor, 0.0)})
    total_excess = sum(r["excess_us"] for r in rows)
    for row in rows:
        row["share_of_excess"] = row["excess_us"] / total_excess if total_excess else 0.0
    rows.sort(key=lambda r: -r["excess_us"])
    return {"launches": len(step), "step_us": 1e6 * total_seconds, "dram_bytes": total_bytes,
            "floor_us": 1e6 * total_bytes / bandwidth, "bandwidth_Bps": bandwidth,
            "x_floor": total_seconds / (total_bytes / bandwidth) if total_bytes else 0.0, "kernels": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--bandwidth", type=float, help="bytes/s of the floor (default: the bench's measured copy)")
    parser.add_argument("--step-kernel", default="embedding_kernel", help="a kernel that runs once per step")
    parser.add_argument("--json", help="write the breakdown here")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    launches, measured = parse(read_lines(args.csv))
    bandwidth = args.bandwidth or measured
    if not bandwidth:
        raise SystemExit("no bandwidth: pass --bandwidth (bytes/s) or profile loom_cuda_bench, which prints it")
    result = breakdown(one_step(launches, args.step_kernel), bandwidth)
    print(f"one step: {result['launches']} launches, {result['step_us']:.0f} us, DRAM {result['dram_bytes'] / 1e9:.2f} GB "
          f"= {result['floor_us']:.0f} us at {bandwidth / 1e12:.2f} TB/s: {result['x_floor']:.2f}x its own floor")
    print(f"  {'kernel':48s} {'n':>4s} {'us/launch':>9s} {'step':>6s} {'GB/s':>6s} {'excess us':>9s} {'of excess':>9s}")
    for row in result["kernels"][:args.top]:
        print(f"  {row['kernel'][:48]:48s} {row['launches']:4d} {row['us_per_launch']:9.1f} "
              f"{100 * row['share_of_step']:5.1f}% {row['bandwidth_GBps']:6.0f} {row['excess_us']:9.0f} "
              f"{100 * row['share_of_excess']:8.1f}%")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # piped into head
        sys.exit(0)
