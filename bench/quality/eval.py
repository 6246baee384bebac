#!/usr/bin/env python3
"""Scores trained adapters (tools/train/train.py) served by `loom serve` in each
KV sharing mode on a task's held-out split (issue 39): greedy, the prompt sent
as token ids (the question's and INVOCATION's tokens joined, as in training),
accuracy with a 95% Wilson interval. One server serves every row:

    bench/quality/eval.py --model SmolLM2.gguf --task arithmetic \\
        --adapter lora=DIR --adapter alora=DIR --adapter icarus=DIR [--cpu-precision fp32|auto] \\
        [--device cuda] --out report.json

Rows (ADAPTER:MODE):
  lora:isolated           the adapter's own K/V (what vLLM serves)
  lora:forked             ForkKV, the agent writing its own shared bCache (exact in math)
  lora:forked-inherits    ForkKV, the prompt's bCache written first by another agent (--adapter writer=DIR,
                          e.g. another task's trained LoRA; else the aLoRA adapter's weights) served as a
                          second forked adapter: ForkKV's inheritance
  lora:base               ICaRus: every K/V the base model's (lossy for a plain LoRA)
  alora:activated         aLoRA: the base model's K/V up to the invocation
  alora:isolated          the aLoRA adapter as a plain LoRA over the whole prompt
  icarus:base             an ICaRus-trained adapter (train.py --kind icarus) over the base model's K/V:
                          exact for it
  icarus:isolated         the ICaRus adapter as a plain LoRA over its own K/V (not how it was trained)
  base model              no adapter
  LABEL (--external)      any OpenAI-compatible server already running at URL (e.g. llama.cpp's
                          llama-server with the adapter as a GGUF LoRA: bench/quality/llama_cpp_rows.sh),
                          sent the same token ids through /v1/completions

Each row keeps its per-item scores ("correct", in held-out order; a smaller --heldout scores a prefix
of the same items), so two rows or two reports compare item by item. The report is rewritten after every row ("complete": false until the last), so a run cut short keeps
the rows it scored.
"""
import argparse
import concurrent.futures
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from tasks import INVOCATION, TASKS, make_split  # noqa: E402


def wilson(correct, total, z=1.96):
    if total == 0:
        return [0.0, 0.0]
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return [round(centre - half, 4), round(centre + half, 4)]


def post(base_url, path, body):
    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom", default=os.environ.get("LOOM_BINARY", "build/loom"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--adapter", action="append", default=[],
                        help="lora=DIR, alora=DIR, icarus=DIR or writer=DIR (the other agent of lora:forked-inherits)")
    parser.add_argument("--cpu-precision", default="fp32", help="cpu only: fp32 or auto")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--kv-cache-bytes", default="2G")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="one more `loom serve` argument, e.g. --serve-arg=--quantization --serve-arg=fp8")
    parser.add_argument("--external", action="append", default=[],
                        help="LABEL=URL: one more row, scored against the server at URL (token-id prompts)")
    parser.add_argument("--rows", help="comma-separated labels: score only these rows (default all)")
    parser.add_argument("--out")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    adapters = dict(spec.split("=", 1) for spec in args.adapter)
    unknown = sorted(set(adapters) - {"lora", "alora", "icarus", "writer"})
    if unknown:
        parser.error(f"unknown adapter kind {unknown[0]} (lora, alora, icarus or writer)")

    # Each group of rows gets a fresh server: an inheriting row must not find its own earlier bCache.
    external = [tuple(spec.split("=", 1)) for spec in args.external]
    if any(len(row) != 2 or not row[1].startswith("http") for row in external):
        parser.error("--external takes LABEL=http://HOST:PORT")
    # The first group's server also tokenizes the external rows' prompts.
    groups = [([("base model", None)] + [(label, None, url) for label, url in external], [])]
    if "lora" in adapters:
        flags = []
        for mode in ["isolated", "forked", "base"]:
            flags += ["--lora", f"lora_{mode}={adapters['lora']}:{mode}"]
        groups.append(([("lora:isolated", "lora_isolated"), ("lora:forked", "lora_forked"), ("lora:base", "lora_base")],
                       flags))
        writer = adapters.get("writer", adapters.get("alora"))
        if writer:  # another agent, served forked, writes the shared bCache first
            groups.append(([("lora:forked-inherits", "lora_forked")],
                           ["--lora", f"lora_forked={adapters['lora']}:forked",
                            "--lora", f"writer_forked={writer}:forked"]))
    if "alora" in adapters:
        groups.append(([("alora:activated", "alora_activated"), ("alora:isolated", "alora_isolated")],
                       ["--lora", f"alora_activated={adapters['alora']}:activated",
                        "--lora", f"alora_isolated={adapters['alora']}:isolated"]))
    if "icarus" in adapters:
        groups.append(([("icarus:base", "icarus_base"), ("icarus:isolated", "icarus_isolated")],
                       ["--lora", f"icarus_base={adapters['icarus']}:base",
                        "--lora", f"icarus_isolated={adapters['icarus']}:isolated"]))
    if args.rows:
        wanted = set(args.rows.split(","))
        known = {row[0] for rows, _ in groups for row in rows}
        if wanted - known:
            parser.error(f"--rows: no row {sorted(wanted - known)[0]} with these adapters ({', '.join(sorted(known))})")
        groups = [([row for row in rows if row[0] in wanted], flags) for rows, flags in groups]
        groups = [(rows, flags) for rows, flags in groups if rows]
    items = make_split(args.task, "heldout", args.heldout)
    on_cpu = args.device == "cpu"
    report = {"task": args.task, "heldout": len(items), "serve_args": args.serve_arg, "cpu_precision": args.cpu_precision if on_cpu else None,
              "device": args.device, "model": os.path.basename(os.path.normpath(args.model)),
              "adapters": {kind: os.path.normpath(path) for kind, path in adapters.items()}, "complete": False,
              "rows": {}}
    for rows, lora_flags in groups:
        run_rows(args, items, rows, lora_flags, report)
    report["complete"] = True
    save(args, report)


SERVERS = []  # the running `loom serve`, ended on SIGTERM (`timeout`) so that none outlives the harness


def on_sigterm(*_):
    for server in SERVERS:
        server.kill()
    os._exit(143)


def save(args, report):
    if args.out:
        with open(args.out + ".tmp", "w") as out:
            json.dump(report, out, indent=1)
        os.replace(args.out + ".tmp", args.out)


def run_rows(args, items, rows, lora_flags, report):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    precision = ["--cpu-precision", args.cpu_precision] if args.device == "cpu" else []
    server = subprocess.Popen([args.loom, "serve", "--model", args.model, "--port", str(port), "--device", args.device,
                               *precision, "--max-lora-rank", "16",
                               "--served-model-name", "base", "--kv-cache-bytes", args.kv_cache_bytes, *lora_flags,
                               *args.serve_arg],
                              stdout=log, stderr=subprocess.STDOUT)
    SERVERS.append(server)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base_url + "/health", timeout=1)
                break
            except Exception:
                if server.poll() is not None:
                    raise SystemExit(open(log.name).read())
                time.sleep(0.2)
        invocation = post(base_url, "/tokenize", {"model": "base", "prompt": INVOCATION,
                                                  "add_special_tokens": False})["tokens"]
        prompts = [post(base_url, "/tokenize", {"model": "base", "prompt": item["prompt"][: -len(INVOCATION)],
                                                "add_special_tokens": False})["tokens"] + invocation for item in items]

        def complete(model, prompt, url=base_url):
            body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0.0}
            return post(url, "/v1/completions", body)["choices"][0]["text"]

        for label, model, *external_url in rows:
            url = external_url[0] if external_url else base_url
            start = time.time()
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                if label.endswith("forked-inherits"):  # the other agent writes each prompt's bCache first
                    list(pool.map(lambda prompt: complete("writer_forked", prompt), prompts))
                texts = list(pool.map(lambda prompt: complete(model or "base", prompt, url), prompts))
            scores = [TASKS[args.task].score(text, item["answer"]) for text, item in zip(texts, items)]
            correct = sum(scores)
            report["rows"][label] = {"accuracy": round(correct / len(items), 4),
                                     "interval95": wilson(correct, len(items)),
                                     "seconds": round(time.time() - start, 1), "example": texts[0],
                                     "correct": [int(score) for score in scores]}  # per item: paired comparisons
            print(label, {k: v for k, v in report["rows"][label].items() if k != "correct"}, flush=True)
            save(args, report)
    finally:
        server.terminate()
        server.wait(timeout=30)
        SERVERS.remove(server)


if __name__ == "__main__":
    main()
