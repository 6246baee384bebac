#!/usr/bin/env python3
"""Markdown tables from `loom divergence --out` reports (for bench/divergence/README.md).

Usage: markdown.py MAIN.json [OTHER.json ...]
  MAIN: summary table, per-adapter table, per-layer cosine table.
  OTHERs (e.g. other --relative-norm runs): one summary line per case each.
"""
import json
import sys


def layers_shown(num_layers):
    shown = [1, (num_layers + 2) // 4, (num_layers + 1) // 2, (3 * num_layers + 2) // 4, num_layers]
    return sorted(set(shown))


def stats_cells(stats, layers):
    cells = [f"{stats['layer_cosine'][l]:.4f}" for l in layers]
    cells += [f"{stats['min_layer_cosine']:.4f}", f"{stats['mean_kl']:.3g}", f"{stats['max_kl']:.3g}",
              f"{stats['teacher_forced_agreement']:.3f}", f"{stats['free_running_agreement']:.3f}"]
    return cells


def header(first, layers):
    names = [first] + [f"cos L{l}" for l in layers] + ["cos min", "KL mean", "KL max", "TF agr", "FR agr"]
    return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)


def main(paths):
    with open(paths[0]) as f:
        report = json.load(f)
    layers = layers_shown(report["num_layers"])
    print(header("case", layers))
    for item in report["summary"]:
        print("| " + " | ".join([item["case"]] + stats_cells(item, layers)) + " |")

    print()
    print(header("adapter, case (writer)", layers))
    for row in report["rows"]:
        name = row["mode"] + (f" ({row['writer']})" if row["writer"] else "")
        print("| " + " | ".join([f"{row['adapter']} {name}"] + stats_cells(row, layers)) + " |")

    print()
    cases = [item["case"] for item in report["summary"]]
    print("| layer | " + " | ".join(cases) + " |\n|" + "---|" * (len(cases) + 1))
    for l in range(report["num_layers"] + 1):
        print(f"| {l} | " + " | ".join(f"{item['layer_cosine'][l]:.4f}" for item in report["summary"]) + " |")

    for path in paths[1:]:
        with open(path) as f:
            other = json.load(f)
        norms = sorted({a.get("relative_norm") for a in other["adapters"]})
        print(f"\n{path}: relative norm {norms}")
        print(header("case", layers))
        for item in other["summary"]:
            print("| " + " | ".join([item["case"]] + stats_cells(item, layers)) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
