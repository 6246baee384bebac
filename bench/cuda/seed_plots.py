#!/usr/bin/env python3
"""Draws the seeds' headline figures (bench/results/seeds/figures.json: Loom on one H200
in each paper's setting, the paper's figure beside) as three PNGs:
    python3 bench/cuda/seed_plots.py [--figures FILE] [--out DIR]
icarus.png (max-throughput and P95 ratios against the number of models), kvflow.png
(ratio over each baseline per setting), forkkv.png (forked over isolated per point, the
paper's range shaded)."""
import argparse
import json
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIGURES = os.path.join(HERE, "..", "results", "seeds", "figures.json")


def icarus(data, path):
    models = data["models"]
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for axis, key, title in ((axes[0], "throughput_ratio", "max throughput, base over isolated"),
                             (axes[1], "p95_ratio", "task P95, isolated over base\n(at the isolated side's sustainable rate)")):
        axis.plot(models, data[key]["loom"], "o-", label="Loom (H200)")
        axis.plot(models, data[key]["paper"], "s--", label="paper (A100)")
        axis.set_xticks(models)
        axis.set_xlabel("LoRA models")
        axis.set_ylabel("ratio (x)")
        axis.set_title(title, fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("ICaRus, ReAct on HotPotQA-shaped turns, Llama-3.1-8B shape", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def save_ratio_plot(figure, axis, labels, ylabel, title, path):
    """A ratio-per-point plot's common finish: the 1x line, point labels, legend, grid; written to path."""
    axis.axhline(1.0, color="gray", linewidth=0.8)
    axis.set_xticks(range(len(labels)))
    axis.set_xticklabels(labels, fontsize=7)
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def kvflow(data, path):
    points = data["points"]
    labels = [f"{textwrap.fill(p['setting'], 20)}\nover {p['baseline']}" for p in points]
    x = range(len(points))
    figure, axis = plt.subplots(figsize=(max(9.0, 1.4 * len(points)), 3.8))  # room for every label
    axis.bar([i - 0.2 for i in x], [p["loom"] for p in points], 0.4, label="Loom (H200)")
    axis.bar([i + 0.2 for i in x], [p["paper"] for p in points], 0.4, label="paper (A10G single; H100 concurrent, PEER)")
    save_ratio_plot(figure, axis, labels, "KVFlow over baseline (x)", "KVFlow, 10-agent sequential and PEER-style workflows", path)


def forkkv(data, path):
    points = data["points"]
    figure, axis = plt.subplots(figsize=(max(9.0, 1.1 * len(points)), 3.8))  # room for every label
    for i, point in enumerate(points):
        low = point["paper_low"] if point["paper_low"] is not None else 0.0
        axis.add_patch(plt.Rectangle((i - 0.35, low), 0.7, point["paper_high"] - low, color="tab:orange", alpha=0.25,
                                     label="paper's range" if i == 0 else None))
    axis.plot(range(len(points)), [p["loom"] for p in points], "o", color="tab:blue", markersize=8, label="Loom (H200)")
    axis.set_xlim(-0.6, len(points) - 0.4)
    axis.set_ylim(0, max(max(p["loom"] for p in points), max(p["paper_high"] for p in points)) * 1.15)
    save_ratio_plot(figure, axis, [p["point"].replace(", ", "\n", 1) for p in points], "forked over isolated, out tok/s (x)",
                    "ForkKV, 8 rank-16 agents per workflow, L40-sized pool", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figures", default=DEFAULT_FIGURES)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(DEFAULT_FIGURES), "plots"))
    args = parser.parse_args()
    with open(args.figures) as file:
        figures = json.load(file)
    studies = (("icarus", icarus), ("kvflow", kvflow), ("forkkv", forkkv))
    missing = [name for name, _ in studies if name not in figures]
    if missing:
        sys.exit(f"seed_plots: {args.figures} has no {', '.join(missing)}")
    os.makedirs(args.out, exist_ok=True)
    for name, draw in studies:
        path = os.path.join(args.out, f"{name}.png")
        draw(figures[name], path)
        print(path)


if __name__ == "__main__":
    main()
