"""PNG plots of a report: one metric against each numeric --compare key (a
line per value of the other keys), and a bar chart of every configuration.

  tasks_per_s vs workflows/concurrency  -> throughput against number of workflows
  tasks_per_s vs rate                   -> throughput against arrival rate
  ttft_p50_s vs context_tokens          -> TTFT against prompt length (pipeline: its "eval" phase)
"""
import os
from typing import Dict, List, Optional, Tuple

PLOTTED = [("tasks_per_s", "tasks/s"), ("output_tokens_per_s", "output tokens/s"), ("ttft_p50_s", "TTFT p50 (s)"),
           ("ttft_p95_s", "TTFT p95 (s)")]


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _metric(config: dict, metric: str) -> Optional[float]:
    """A config's metric; TTFT of the pipeline is its adapter-evaluation phase's (alora-serving Fig. 6)."""
    phases = config.get("phases") or {}
    if metric.startswith("ttft") and "eval" in phases:
        return phases["eval"].get(metric)
    return (config.get("metrics") or {}).get(metric)


def series(configs: List[dict], key: str, metric: str) -> Dict[str, List[Tuple[float, float]]]:
    """{label of the other keys: [(x, y)] sorted by x} for a numeric key."""
    lines: Dict[str, List[Tuple[float, float]]] = {}
    for config in configs:
        compare = config.get("compare") or {}
        x = _number(compare.get(key))
        y = _metric(config, metric)
        if x is None or y is None:
            continue
        label = ",".join(f"{k}={v}" for k, v in compare.items() if k != key) or metric
        lines.setdefault(label, []).append((x, y))
    return {label: sorted(points) for label, points in lines.items()}


def write(out_dir: str, report: dict) -> List[str]:
    """Writes the PNGs; returns their paths ([] without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("loom bench: matplotlib is missing, no plots (pip install -r scripts/python-requirements.txt)")
        return []
    configs = [c for c in report["configs"] if c.get("metrics")]
    paths = []
    keys = []
    for config in configs:
        for key, value in (config.get("compare") or {}).items():
            if key not in keys and _number(value) is not None:
                keys.append(key)
    for key in keys:
        for metric, title in PLOTTED:
            lines = series(configs, key, metric)
            if not any(len(points) >= 2 for points in lines.values()):
                continue
            figure, axes = plt.subplots(figsize=(6, 4))
            for label, points in lines.items():
                axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
            axes.set_xlabel(key)
            axes.set_ylabel(title)
            from_eval = metric.startswith("ttft") and any("eval" in (c.get("phases") or {}) for c in configs)
            axes.set_title(f"{report['workload']}: {title}{' of the eval step' if from_eval else ''} vs {key}")
            axes.grid(True, alpha=0.3)
            axes.legend(fontsize=8)
            path = os.path.join(out_dir, f"{metric}_vs_{key}.png")
            figure.tight_layout()
            figure.savefig(path, dpi=100)
            plt.close(figure)
            paths.append(path)
    if configs:
        figure, axes = plt.subplots(1, 3, figsize=(12, 4))
        names = [c["name"] for c in configs]
        for axis, (metric, title) in zip(axes, [("tasks_per_s", "tasks/s"), ("ttft_p95_s", "TTFT p95 (s)"),
                                                ("e2e_p95_s", "e2e p95 (s)")]):
            axis.bar(range(len(names)), [(c["metrics"].get(metric) or 0) for c in configs])
            axis.set_xticks(range(len(names)))
            axis.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
            axis.set_title(title)
        figure.suptitle(f"loom bench {report['workload']}")
        figure.tight_layout()
        path = os.path.join(out_dir, "summary.png")
        figure.savefig(path, dpi=100)
        plt.close(figure)
        paths.append(path)
    return paths
