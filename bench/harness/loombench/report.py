"""report.json (docs/design.md §4's shape plus more keys) and report.md."""
import json
import os
from typing import List, Optional

# The keys docs/design.md §4 fixes for every configuration's metrics.
REQUIRED_METRICS = ("tasks_per_s", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "e2e_p95_s",
                    "prefix_hit_rate", "kv_bytes_per_agent")

# (metric, column title, formatter) of the markdown table.
COLUMNS = [
    ("tasks_per_s", "tasks/s", "{:.3f}"), ("output_tokens_per_s", "out tok/s", "{:.1f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"), ("ttft_p95_s", "TTFT p95 s", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.3f}"), ("e2e_p50_s", "e2e p50 s", "{:.3f}"),
    ("e2e_p95_s", "e2e p95 s", "{:.3f}"), ("e2e_p99_s", "e2e p99 s", "{:.3f}"),
    ("queue_time_mean_s", "queue s", "{:.3f}"), ("prefill_time_mean_s", "prefill s", "{:.3f}"),
    ("decode_time_mean_s", "decode s", "{:.3f}"), ("prefix_hit_rate", "hit rate", "{:.1%}"),
    ("kv_bytes_per_agent", "KV MiB/agent", "mib"), ("kv_bytes_peak", "KV MiB peak", "mib"), ("decode_batch_size_mean", "decode batch", "{:.2f}"),
    ("preemptions", "preempt", "{:.0f}"), ("evicted_tokens", "evicted tok", "{:.0f}"),
    ("num_failed_calls", "failed calls", "{:.0f}"),
]
RATIO_METRICS = [("tasks_per_s", "tasks/s"), ("output_tokens_per_s", "out tok/s"), ("ttft_p95_s", "TTFT p95"),
                 ("e2e_p95_s", "e2e p95"), ("kv_bytes_per_agent", "KV/agent")]


def fmt(value: Optional[float], spec: str) -> str:
    if value is None:
        return "-"
    if spec == "mib":
        return f"{value / 2**20:.2f}"
    return spec.format(value)


def compared_key(configs: List[dict]) -> Optional[str]:
    """The first --compare key that takes more than one value."""
    keys = list((configs[0].get("compare") or {}) if configs else {})
    for key in keys:
        if len({(c.get("compare") or {}).get(key) for c in configs}) > 1:
            return key
    return None


def baseline_of(config: dict, configs: List[dict]) -> Optional[dict]:
    """The configuration `config` is compared with: the same values of every
    --compare key but compared_key(), which takes its first value (so with
    sharing x workflows, forked@4 is divided by isolated@4)."""
    compare = config.get("compare") or {}
    first_key = compared_key(configs)
    if first_key is None:
        return configs[0] if configs else None
    for candidate in configs:
        other = candidate.get("compare") or {}
        if other.get(first_key) == (configs[0].get("compare") or {}).get(first_key) and all(
                other.get(k) == v for k, v in compare.items() if k != first_key):
            return candidate
    return None


def ratios(configs: List[dict]) -> dict:
    """Headline metrics of each configuration over its baseline_of()'s:
    {"baseline": first config's name, NAME: {"over": baseline name, metric: ratio}}."""
    ok = [c for c in configs if c.get("metrics")]
    if len(ok) < 2:
        return {}
    out = {"baseline": ok[0]["name"]}
    for config in ok:
        base = baseline_of(config, ok)
        if base is None or base is config:
            continue
        out[config["name"]] = {"over": base["name"], **{
            metric: (config["metrics"][metric] / base["metrics"][metric]
                     if config["metrics"].get(metric) is not None and base["metrics"].get(metric) else None)
            for metric, _ in RATIO_METRICS}}
    return out


def markdown(report: dict) -> str:
    lines = [f"# loom bench {report['workload']}", "",
             f"Machine: {report.get('machine', '?')}; {report.get('created', '')}", "",
             f"Command: `{report.get('command', '')}`", ""]
    header = "| config | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines += [header, "|" + "---|" * (len(COLUMNS) + 1)]
    for config in report["configs"]:
        metrics = config.get("metrics")
        if not metrics:
            lines.append(f"| {config['name']} | failed: {config.get('error', '?')[:120]} |")
            continue
        lines.append(f"| {config['name']} | " + " | ".join(fmt(metrics.get(m), spec) for m, _, spec in COLUMNS) + " |")
    table_ratios = report.get("ratios") or {}
    if table_ratios:
        lines += ["", "Ratios (each over the configuration that differs only in the first compared key):", ""]
        for name, values in table_ratios.items():
            if name == "baseline":
                continue
            parts = [f"{title} {values[m]:.2f}x" for m, title in RATIO_METRICS if values.get(m) is not None]
            lines.append(f"- `{name}` over `{values['over']}`: " + ", ".join(parts))
    phase_names = sorted({p for c in report["configs"] for p in (c.get("phases") or {})})
    if len(phase_names) > 1:
        lines += ["", "Per phase (client side):", "",
                  "| config | phase | calls | prompt tok | TTFT p50 s | TTFT p95 s | e2e p50 s | e2e p95 s |",
                  "|---|---|---|---|---|---|---|---|"]
        for config in report["configs"]:
            for phase, p in (config.get("phases") or {}).items():
                lines.append(f"| {config['name']} | {phase} | {p['num_calls']} | {fmt(p['prompt_tokens_mean'], '{:.0f}')} | "
                             f"{fmt(p['ttft_p50_s'], '{:.3f}')} | {fmt(p['ttft_p95_s'], '{:.3f}')} | "
                             f"{fmt(p['e2e_p50_s'], '{:.3f}')} | {fmt(p['e2e_p95_s'], '{:.3f}')} |")
    errors = [(c["name"], e) for c in report["configs"] for e in (c.get("errors") or [])]
    if errors:
        lines += ["", "First errors:", ""] + [f"- `{name}`: {error[:200]}" for name, error in errors[:5]]
    return "\n".join(lines) + "\n"


def write(out_dir: str, report: dict) -> List[str]:
    report["ratios"] = ratios(report["configs"])
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "report.json")
    with open(json_path, "w") as file:
        json.dump(report, file, indent=2)
    md_path = os.path.join(out_dir, "report.md")
    with open(md_path, "w") as file:
        file.write(markdown(report))
    return [json_path, md_path]
