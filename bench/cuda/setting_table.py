#!/usr/bin/env python3
"""Markdown rows for bench/README.md from an issue-42 study's reports, with the
paper's figure beside each: `setting_table.py icarus|forkkv|kvflow DIR` (DIR =
$OUT/STUDY of icarus_setting.sh, forkkv_setting.sh, kvflow_setting.sh; every
point is DIR/NAME/report.json with one configuration). Also writes
DIR/summary.json (the same rows as data). Points that failed or were skipped
show as missing, never as zero."""
import json
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

# The papers' headline figures (cited by title in bench/README.md).
ICARUS_PAPER = {  # ICaRus §4.3 (Fig. 4/5), appendix E (swap, 8 models)
    2: {"throughput": "1.4x", "p95": "3.8x"},
    4: {"throughput": "2.3x", "p95": "5.1x (at QPS 0.3)"},
    8: {"throughput": "3.8x", "p95": "11.1x", "swap_throughput": "3.8x", "swap_p95": "12.1x"},
}
FORKKV_PAPER = {  # ForkKV §7.2: Fig. 11 (8 workflows, three datasets/models), Fig. 12 (workflows), Fig. 13 (steady state)
    "react": "1.25-3.04x (Fig. 11); 1.84-2.33x at 8 workflows, below 1x at 4 (Fig. 12); ~2.52x steady state (Fig. 13)",
    "mapreduce": "1.68-2.60x (Fig. 11); 1.31-2.51x at high contention (Fig. 12); ~2.05x steady state (Fig. 13)",
}
KVFLOW_PAPER = {  # KVFlow §5 (Fig. 5, 6)
    "single": "1.83x over SGLang w/ HiCache, 2.91x over SGLang (A10G, 8192/32/32, Fig. 5)",
    "concurrent": "up to 2.19x over HiCache, 1.25x over SGLang; HiCache 0.57x of SGLang at 1024 x 64 (H100, Fig. 6)",
    "peer": "up to 1.08x over HiCache, 1.12x over SGLang (PEER-style workflow, Fig. 8)",
    "sweep": "Fig. 6: KVFlow ahead of SGLang and HiCache at every concurrency (up to 1.25x / 2.19x)",
}


def load(directory: str) -> Dict[str, dict]:
    """NAME -> the metrics of DIR/NAME/report.json's only configuration (None: failed)."""
    points = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name, "report.json")
        if not os.path.isfile(path):
            continue
        with open(path) as file:
            report = json.load(file)
        configs = report.get("configs") or [{}]
        points[name] = configs[0].get("metrics")
    return points


def num(value: Optional[float], spec: str = "{:.3f}") -> str:
    return "-" if value is None else spec.format(value)


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b not in (None, 0) else None


def x(value: Optional[float]) -> str:
    return "-" if value is None else f"**{value:.2f}x**"


def task_p95_ratio(baseline: dict, base: dict) -> Tuple[Optional[float], str]:
    """Baseline task P95 over base task P95, and what the ratio is ("" exact, ">= " a lower bound, "~" neither).
    A window that cut tasks short leaves task_p95_s over the finished ones only (the fast ones); then the
    censored P95 (a running task counted as the time it had run: runner.compute_metrics) is a lower bound
    of the true P95. The ratio is a lower bound when only the baseline was cut."""
    def p95(m: dict) -> Optional[float]:
        return m.get("task_censored_p95_s") if m.get("num_unfinished_tasks") else m.get("task_p95_s")
    value = ratio(p95(baseline), p95(base))
    if not baseline.get("num_unfinished_tasks") and not base.get("num_unfinished_tasks"):
        return value, ""
    return value, ">= " if not base.get("num_unfinished_tasks") else "~"


def icarus(points: Dict[str, dict]) -> (List[str], dict):
    """Per model count: each side's points (rate, tasks/s, task p95, TTFT p95, hit, preempt), then the
    max-throughput ratio and the P95 ratio at the baseline's (iso-recompute's) peak rate."""
    sides: Dict[int, Dict[str, Dict[float, dict]]] = {}
    for name, metrics in points.items():
        match = re.fullmatch(r"n(\d+)-(base|iso-recompute|iso-swap)-r([0-9.]+)", name)
        if match and metrics:
            sides.setdefault(int(match[1]), {}).setdefault(match[2], {})[float(match[3])] = metrics
    lines = ["| models | side | rate /s | tasks/s | out tok/s | task p95 s | TTFT p95 s | hit rate | preempt | "
             "unfinished |", "|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for n in sorted(sides):
        for side in ("iso-recompute", "iso-swap", "base"):
            for rate, m in sorted(sides[n].get(side, {}).items()):
                lines.append(f"| {n} | {side} | {rate:g} | {num(m.get('tasks_per_s'))} | "
                             f"{num(m.get('output_tokens_per_s'), '{:.0f}')} | {num(m.get('task_p95_s'), '{:.2f}')} | "
                             f"{num(m.get('ttft_p95_s'))} | {num(m.get('prefix_hit_rate'), '{:.1%}')} | "
                             f"{num(m.get('preemptions'), '{:.0f}')} | {m.get('num_unfinished_tasks', 0)} |")
    lines += ["", "| models | baseline | max tasks/s base vs baseline | P95 at the baseline's peak rate | paper |",
              "|---|---|---|---|---|"]
    for n in sorted(sides):
        base = sides[n].get("base", {})
        for baseline_side, keys in (("iso-recompute", ("throughput", "p95")), ("iso-swap", ("swap_throughput", "swap_p95"))):
            baseline = sides[n].get(baseline_side, {})
            if not baseline or not base:
                continue
            best = lambda runs: max((m.get("tasks_per_s") or 0.0 for m in runs.values()), default=None)  # noqa: E731
            throughput = ratio(best(base), best(baseline))
            peak_rate = max(baseline, key=lambda r: baseline[r].get("tasks_per_s") or 0.0)
            p95, bound = task_p95_ratio(baseline[peak_rate], base.get(peak_rate) or {})
            paper = ICARUS_PAPER.get(n, {})
            lines.append(f"| {n} | {baseline_side} | {num(best(base))} vs {num(best(baseline))} = {x(throughput)} | "
                         f"at {peak_rate:g}/s: {bound}{x(p95)} lower | {paper.get(keys[0], '-')} / "
                         f"{paper.get(keys[1], '-')} |")
            summary[f"{n}/{baseline_side}"] = {"throughput_ratio": throughput, "p95_ratio": p95,
                                               "p95_ratio_is": {"": "exact", ">= ": "a lower bound",
                                                                "~": "unbounded: both sides cut"}[bound],
                                               "baseline_peak_rate": peak_rate}
    return lines, summary


def forkkv(points: Dict[str, dict]) -> (List[str], dict):
    pairs: Dict[str, Dict[str, dict]] = {}
    for name, metrics in points.items():
        match = re.fullmatch(r"(.+)-(forked|isolated)", name)
        if match and metrics:
            pairs.setdefault(match[1], {})[match[2]] = metrics
    # out tok/s counts the calls that ended in the window; server out tok/s every token the server made in it
    # (the pace when calls are longer than what the window shows of them).
    lines = ["| point | forked vs isolated out tok/s | server out tok/s | calls/s | tasks/s (finished in window) | "
             "hit rate | KV MiB/agent | TTFT p95 s | preempt | paper |", "|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for point, sides in sorted(pairs.items()):
        f, i = sides.get("forked"), sides.get("isolated")
        if not f or not i:
            lines.append(f"| {point} | one side missing | | | | | | | | |")
            continue

        def both(key, spec="{:.3f}", scale=1.0):
            fv, iv = f.get(key), i.get(key)
            fv = None if fv is None else fv * scale
            iv = None if iv is None else iv * scale
            return f"{num(fv, spec)} vs {num(iv, spec)}"
        tokens = ratio(f.get("output_tokens_per_s"), i.get("output_tokens_per_s"))
        server = ratio(f.get("server_output_tokens_per_s"), i.get("server_output_tokens_per_s"))
        lines.append(f"| {point} | {both('output_tokens_per_s', '{:.0f}')} = {x(tokens)} | "
                     f"{both('server_output_tokens_per_s', '{:.0f}')} = {x(server)} | "
                     f"{both('calls_per_s')} = {x(ratio(f.get('calls_per_s'), i.get('calls_per_s')))} | "
                     f"{both('tasks_per_s')} | {both('prefix_hit_rate', '{:.1%}')} | "
                     f"{both('kv_bytes_per_agent', '{:.0f}', 1 / 2**20)} | {both('ttft_p95_s', '{:.2f}')} | "
                     f"{both('preemptions', '{:.0f}')} | {FORKKV_PAPER[point.split('-')[0]]} |")
        summary[point] = {"output_tokens_ratio": tokens, "server_output_tokens_ratio": server, "calls_ratio": ratio(f.get("calls_per_s"), i.get("calls_per_s"))}
    return lines, summary


def kvflow(points: Dict[str, dict]) -> (List[str], dict):
    lines = ["| setting | configuration | workflow latency mean s | calls/s | vs hicache | vs lru (GPU only) | "
             "hit rate | loaded tok | load wait p95 s | prefetch in time / late tok | paper |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    # single, concurrent, peer, then sweepN (the concurrency sweep) and peerN (PEER at N workflows) by N
    found = {name.split("-", 1)[0] for name in points}
    sweeps = sorted((s for s in found if re.fullmatch(r"sweep\d+", s)), key=lambda s: int(s[5:]))
    peers = sorted((s for s in found if re.fullmatch(r"peer\d+", s)), key=lambda s: int(s[4:]))
    for setting in ["single", "concurrent", "peer"] + sweeps + peers:
        runs = {name.split("-", 1)[1]: m for name, m in points.items() if name.startswith(setting + "-") and m}
        if not runs:
            continue

        def speedup(config: str, against: str) -> Optional[float]:
            a, b = runs.get(config), runs.get(against)
            if not a or not b:
                return None
            if setting == "single":  # latency: the baseline's over this configuration's
                return ratio(b.get("task_mean_s"), a.get("task_mean_s"))
            return ratio(a.get("calls_per_s"), b.get("calls_per_s"))
        paper_text = KVFLOW_PAPER["sweep" if setting in sweeps else "peer" if setting in peers else setting]
        for config in ("lru", "hicache", "lru-bg", "kvflow-blocking", "kvflow"):
            m = runs.get(config)
            if not m:
                continue
            lines.append(f"| {setting} | {config} | {num(m.get('task_mean_s'), '{:.2f}')} | "
                         f"{num(m.get('calls_per_s'))} | {x(speedup(config, 'hicache'))} | {x(speedup(config, 'lru'))} | "
                         f"{num(m.get('prefix_hit_rate'), '{:.1%}')} | {num(m.get('loaded_tokens'), '{:.0f}')} | "
                         f"{num(m.get('load_wait_p95_s'))} | {num(m.get('prefetch_in_time_tokens'), '{:.0f}')} / "
                         f"{num(m.get('prefetch_late_tokens'), '{:.0f}')} | "
                         f"{paper_text if config == 'kvflow' else ''} |")
            summary[f"{setting}/{config}"] = {"vs_hicache": speedup(config, "hicache"), "vs_lru": speedup(config, "lru")}
    return lines, summary


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("icarus", "forkkv", "kvflow"):
        print(__doc__)
        return 2
    study, directory = sys.argv[1], sys.argv[2]
    points = load(directory)
    lines, summary = {"icarus": icarus, "forkkv": forkkv, "kvflow": kvflow}[study](points)
    failed = sorted(name for name, metrics in points.items() if metrics is None)
    if failed:
        lines += ["", "failed points (see NAME.log and NAME/server-0.log): " + ", ".join(failed)]
    print("\n".join(lines))
    with open(os.path.join(directory, "summary.json"), "w") as file:
        json.dump({"study": study, "rows": summary, "failed": failed}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
