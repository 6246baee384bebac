#!/usr/bin/env python3
"""Combines the raw outputs of bench/run_cpu_forward.sh into cpu_forward.json and
a markdown table: Loom tokens/s, llama.cpp tokens/s and their ratio for prefill
and decode at each batch size, plus the machine. Standard library only."""
import argparse
import glob
import json
import os
import platform
import statistics
import subprocess


def read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def merge_loom_rounds(raw, prefix):
    """One loom_bench_forward report from raw/PREFIX.r*.json: samples of every round, medians over them."""
    paths = sorted(glob.glob(os.path.join(raw, f"{prefix}.r*.json")))
    if not paths:
        return None
    reports = [read_json(path) for path in paths]
    merged = dict(reports[0])
    merged["repeats"] = sum(report["repeats"] for report in reports)
    results = []
    for entry in reports[0]["results"]:
        combined = {"batch": entry["batch"]}
        for phase in ("prefill", "decode"):
            samples = [sample for report in reports for other in report["results"]
                       if other["batch"] == entry["batch"] for sample in other[phase]["samples_s"]]
            median_s = statistics.median(samples)
            combined[phase] = {"num_tokens": entry[phase]["num_tokens"], "median_s": median_s,
                               "tokens_per_s": entry[phase]["num_tokens"] / median_s, "samples_s": samples}
        results.append(combined)
    merged["results"] = results
    return merged


def merge_llama_bench_rounds(raw, suffix):
    """llama-bench tests from raw/llama_bench{suffix}.r*.json with samples_ns of all rounds."""
    tests = None
    for path in sorted(glob.glob(os.path.join(raw, f"llama_bench{suffix}.r*.json"))):
        round_tests = read_json(path)
        if tests is None:
            tests = round_tests
        else:
            for test, other in zip(tests, round_tests):
                test["samples_ns"] = test["samples_ns"] + other["samples_ns"]
    return tests


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def machine_info(threads):
    info = {"threads_used": threads, "logical_cpus": os.cpu_count(), "kernel": platform.release()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        for key in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
                    "L2 cache", "L3 cache", "Flags"):
            if key in fields:
                info[key] = fields[key]
        flags = info.pop("Flags", "").split()
        info["simd"] = [flag for flag in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni",
                                          "amx_tile") if flag in flags]
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def loom_phase(report, batch, phase):
    if report is None:
        return None
    for entry in report["results"]:
        if entry["batch"] == batch:
            return entry[phase]["tokens_per_s"]
    return None


def llama_bench_phase(tests, phase):
    """Median tokens/s of llama-bench's pp (phase=prefill) or tg (decode) test."""
    for test in tests or []:
        is_prefill = test["n_prompt"] > 0 and test["n_gen"] == 0
        is_decode = test["n_gen"] > 0 and test["n_prompt"] == 0
        if (phase == "prefill" and is_prefill) or (phase == "decode" and is_decode):
            num_tokens = test["n_prompt"] + test["n_gen"]
            return num_tokens / (statistics.median(test["samples_ns"]) * 1e-9)
    return None


def batched_bench_phase(lines, batch, phase):
    """Median over runs of llama-batched-bench's S_PP (prefill) or S_TG (decode)."""
    key = "speed_pp" if phase == "prefill" else "speed_tg"
    values = [line[key] for line in lines if line["pl"] == batch]
    return statistics.median(values) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--raw", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--loom-env", default="", help="extra environment the Loom runs had")
    parser.add_argument("--loom-precision", default="auto", help="the Loom runs' --cpu-precision")
    parser.add_argument("--json-out", required=True)
    parser.add_argument("--md-out", required=True)
    args = parser.parse_args()

    loom_empty = merge_loom_rounds(args.raw, "loom_empty")
    loom_prompt = merge_loom_rounds(args.raw, "loom_prompt")
    llama_tests = merge_llama_bench_rounds(args.raw, "")
    llama_f32_tests = merge_llama_bench_rounds(args.raw, "_f32")
    batched_lines = read_jsonl(os.path.join(args.raw, "batched_bench.jsonl"))
    batched_f32_lines = read_jsonl(os.path.join(args.raw, "batched_bench_f32.jsonl"))
    has_f32 = bool(llama_f32_tests or batched_f32_lines)
    reference = loom_prompt or loom_empty
    prompt_tokens = reference["prompt_tokens"]
    decode_tokens = reference["decode_tokens"]

    rows = []

    def add(batch, phase, setting, loom, llama, llama_f32):
        row = {"batch": batch, "phase": phase, "setting": setting, "loom_tokens_per_s": loom,
               "llama_cpp_tokens_per_s": llama, "ratio_loom_over_llama_cpp": ratio(loom, llama)}
        if has_f32:
            row["llama_cpp_f32_tokens_per_s"] = llama_f32
            row["ratio_loom_over_llama_cpp_f32"] = ratio(loom, llama_f32)
        rows.append(row)

    for phase in ("prefill", "decode"):
        setting = (f"llama-bench pp{prompt_tokens}" if phase == "prefill"
                   else f"llama-bench tg{decode_tokens} (KV depth 0)")
        add(1, phase, setting, loom_phase(loom_empty, 1, phase), llama_bench_phase(llama_tests, phase),
            llama_bench_phase(llama_f32_tests, phase))
    for batch in sorted({entry["batch"] for entry in (loom_prompt or {"results": []})["results"]}):
        for phase in ("prefill", "decode"):
            setting = (f"batched-bench npp{prompt_tokens} npl{batch}" if phase == "prefill"
                       else f"batched-bench ntg{decode_tokens} npl{batch} (KV depth {prompt_tokens}+)")
            add(batch, phase, setting, loom_phase(loom_prompt, batch, phase),
                batched_bench_phase(batched_lines, batch, phase),
                batched_bench_phase(batched_f32_lines, batch, phase))

    llama_info = {}
    if llama_tests:
        first = llama_tests[0]
        llama_info = {key: first.get(key) for key in ("build_commit", "build_number", "cpu_info", "backends",
                                                        "model_type", "n_threads", "flash_attn", "type_k",
                                                        "type_v", "n_batch", "n_ubatch")}
    if batched_lines:
        llama_info["batched_bench"] = {key: batched_lines[0].get(key) for key in (
            "n_kv_max", "n_batch", "n_ubatch", "flash_attn", "n_threads", "n_threads_batch")}
    skipped_path = os.path.join(args.raw, "llama_skipped.txt")
    if os.path.exists(skipped_path):
        with open(skipped_path) as f:
            llama_info["skipped"] = f.read().strip()
    uptime_path = os.path.join(args.raw, "uptime.txt")
    load = open(uptime_path).read().strip().splitlines() if os.path.exists(uptime_path) else []

    report = {"benchmark": "cpu_forward", "model": args.model, "prompt_tokens": prompt_tokens,
              "decode_tokens": decode_tokens, "repeats": reference["repeats"],
              "loom_env": args.loom_env, "machine": machine_info(args.threads), "load": load, "llama_cpp": llama_info,
              "loom": {"decode_context_empty": loom_empty, "decode_context_prompt": loom_prompt},
              "rows": rows}
    with open(args.json_out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")

    def fmt(value, digits=1):
        return "n/a" if value is None else f"{value:.{digits}f}"

    machine = report["machine"]
    lines = [
        f"# CPU forward: Loom vs llama.cpp ({os.path.basename(args.model)})",
        "",
        f"Machine: {machine.get('Model name', 'unknown CPU')}, {machine.get('CPU(s)', '?')} logical CPUs "
        f"({machine.get('Core(s) per socket', '?')} cores/socket x {machine.get('Thread(s) per core', '?')} "
        f"threads/core), SIMD {','.join(machine.get('simd', []))}; threads used: {args.threads} (both engines).",
        f"Prompt {prompt_tokens} tokens, decode {decode_tokens} tokens, median of {reference['repeats']} rounds "
        "(each round runs every measurement once, engines back to back).",
        f"Loom environment: OMP_NUM_THREADS/OPENBLAS_NUM_THREADS={args.threads}"
        + (f", {args.loom_env}" if args.loom_env else " (nothing else)") + ".",
        "",
    ]
    loom_label = "Loom (quantized)" if args.loom_precision == "auto" else f"Loom ({args.loom_precision})"
    header = f"| batch | phase | llama.cpp setting | {loom_label} tok/s | llama.cpp (model as given) tok/s | Loom / llama.cpp |"
    rule = "|------:|-------|-------------------|------------------:|------------------:|-----------------:|"
    if has_f32:
        header += " llama.cpp (F32 copy) tok/s | Loom / llama.cpp F32 |"
        rule += "------------------:|-----------------:|"
    lines += [header, rule]
    for row in rows:
        line = (f"| {row['batch']} | {row['phase']} | {row['setting']} | {fmt(row['loom_tokens_per_s'])} | "
                f"{fmt(row['llama_cpp_tokens_per_s'])} | {fmt(row['ratio_loom_over_llama_cpp'], 3)} |")
        if has_f32:
            line += (f" {fmt(row['llama_cpp_f32_tokens_per_s'])} |"
                     f" {fmt(row['ratio_loom_over_llama_cpp_f32'], 3)} |")
        lines.append(line)
    if "skipped" in llama_info:
        lines += ["", f"llama.cpp: {llama_info['skipped']}"]
    elif llama_info:
        lines += ["", f"llama.cpp build {llama_info.get('build_commit')} ({llama_info.get('build_number')}), "
                      f"backend {llama_info.get('backends')}, {llama_info.get('model_type')}, "
                      f"KV {llama_info.get('type_k')}/{llama_info.get('type_v')}."]
    if load:
        lines += [""] + [f"- {line}" for line in load]
    with open(args.md_out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
