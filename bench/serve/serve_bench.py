#!/usr/bin/env python3
"""Serving benchmark for OpenAI-compatible servers (loom serve, llama.cpp's llama-server).

Stdlib only. For each server given (a command to start, or a URL already serving), it measures:
  (a) TTFT of a long (~4K-token) prompt cold (never seen) vs warm (the same prompt again, so a
      prefix-cache hit), as streaming /v1/completions with a few output tokens;
  (b) output tokens/s with 1, 8 and 32 concurrent streaming requests (short distinct prompts,
      ignore_eos, fixed max_tokens), and TTFT p50/p95 under that load.
Servers run one after the other (never at the same time), so they do not compete for the cores.
Results go to a JSON file and a markdown table.

Example:
  python3 bench/serve/serve_bench.py --out-dir bench/serve/results \
    --server "loom=build/loom serve --port {port} --threads 2" \
    --server "llama-server=/path/llama-server -m MODEL.gguf --port {port} -t 2 -tb 2 -np 32 -c 32768 --kv-unified"
"""
import argparse
import http.client
import json
import os
import platform
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

# Common English words: prompts built from them tokenize to roughly one token per word.
WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason research girl guy "
         "moment air teacher force education").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_text(rng, num_words):
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


class Client:
    """One HTTP connection per request (each thread makes its own)."""

    def __init__(self, url, model):
        parsed = urllib.parse.urlparse(url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.model = model

    def get(self, path, timeout=5):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def complete(self, prompt, max_tokens, stream, extra=None, timeout=600):
        """Returns dict(ttft, total, num_tokens, prompt_tokens, text). Times in seconds."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream,
                "ignore_eos": True, "cache_prompt": True}
        if self.model:
            body["model"] = self.model
        if stream:
            body["stream_options"] = {"include_usage": True}
        if extra:
            body.update(extra)
        payload = json.dumps(body).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        start = time.perf_counter()
        try:
            conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
            if not stream:
                data = json.loads(response.read())
                total = time.perf_counter() - start
                usage = data.get("usage") or {}
                return {"ttft": total, "total": total, "num_tokens": usage.get("completion_tokens"),
                        "prompt_tokens": usage.get("prompt_tokens"), "text": data["choices"][0]["text"]}
            ttft = None
            num_chunks = 0
            usage = {}
            text = []
            while True:
                line = response.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or []:
                    piece = choice.get("text") or ""
                    if piece or choice.get("finish_reason") is None:
                        num_chunks += 1
                        if ttft is None:
                            ttft = time.perf_counter() - start
                    text.append(piece)
            total = time.perf_counter() - start
            return {"ttft": ttft if ttft is not None else total, "total": total,
                    "num_tokens": usage.get("completion_tokens") or num_chunks,
                    "prompt_tokens": usage.get("prompt_tokens"), "text": "".join(text)}
        finally:
            conn.close()


def wait_healthy(client, proc, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /health was ok")
        try:
            status, _ = client.get("/health", timeout=2)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not report /health ok in time")


def percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def calibrate_words(client, rng, target_tokens):
    """Words needed for ~target_tokens prompt tokens (measured on a short prompt)."""
    sample_words = 200
    result = client.complete(make_text(rng, sample_words), 1, stream=False)
    tokens_per_word = (result["prompt_tokens"] or sample_words) / sample_words
    return max(1, int(target_tokens / tokens_per_word)), tokens_per_word


def bench_prefix(client, seed, target_tokens, num_reps, max_tokens, log):
    rng = random.Random(seed)
    num_words, tokens_per_word = calibrate_words(client, rng, target_tokens)
    runs = []
    for rep in range(num_reps):
        # A distinct leading tag makes each cold prompt share no prefix with earlier ones.
        prompt = f"Document {rep}-{rng.randrange(10**9)}: " + make_text(rng, num_words)
        cold = client.complete(prompt, max_tokens, stream=True)
        warm = [client.complete(prompt, max_tokens, stream=True) for _ in range(2)]
        warm_ttft = min(w["ttft"] for w in warm)
        runs.append({"prompt_tokens": cold["prompt_tokens"], "cold_ttft_s": cold["ttft"],
                     "warm_ttft_s": [w["ttft"] for w in warm], "warm_same_text": warm[0]["text"] == cold["text"]})
        log(f"  prefix rep {rep}: prompt_tokens={cold['prompt_tokens']} cold={cold['ttft']:.3f}s "
            f"warm={warm_ttft:.3f}s")
    cold_median = statistics.median(r["cold_ttft_s"] for r in runs)
    warm_median = statistics.median(min(r["warm_ttft_s"]) for r in runs)
    return {"target_prompt_tokens": target_tokens, "tokens_per_word": tokens_per_word, "max_tokens": max_tokens,
            "runs": runs, "cold_ttft_median_s": cold_median, "warm_ttft_median_s": warm_median,
            "cold_over_warm": cold_median / warm_median if warm_median > 0 else None}


def bench_concurrency(client, seed, concurrency, prompt_words, max_tokens, log):
    rng = random.Random(seed * 1000 + concurrency)
    prompts = [f"Request {concurrency}-{i}-{rng.randrange(10**9)}: " + make_text(rng, prompt_words)
               for i in range(concurrency)]
    results = [None] * concurrency
    errors = []
    barrier = threading.Barrier(concurrency + 1)

    def worker(i):
        barrier.wait()
        try:
            results[i] = client.complete(prompts[i], max_tokens, stream=True)
        except Exception as error:  # reported below; one failing request must not hang the run
            errors.append(repr(error))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    done = [r for r in results if r is not None]
    num_tokens = sum(r["num_tokens"] or 0 for r in done)
    ttfts = [r["ttft"] for r in done]
    # Per-request decode speed after the first token (what one user sees while streaming).
    per_request = [(r["num_tokens"] - 1) / (r["total"] - r["ttft"]) for r in done
                   if r["num_tokens"] and r["num_tokens"] > 1 and r["total"] > r["ttft"]]
    summary = {"concurrency": concurrency, "max_tokens": max_tokens, "num_ok": len(done), "errors": errors,
               "wall_s": wall, "output_tokens": num_tokens, "output_tokens_per_s": num_tokens / wall,
               "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p95_s": percentile(ttfts, 0.95),
               "per_request_tokens_per_s_median": statistics.median(per_request) if per_request else None,
               "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] or 0 for r in done) if done else None}
    log(f"  concurrency {concurrency}: {num_tokens} tokens in {wall:.2f}s = {summary['output_tokens_per_s']:.1f} tok/s, "
        f"TTFT p50={summary['ttft_p50_s']:.3f}s p95={summary['ttft_p95_s']:.3f}s errors={len(errors)}"
        + (f" first error: {errors[0]}" if errors else ""))
    return summary


def run_server(name, command, url, args, log):
    proc = None
    if command:
        port = free_port()
        argv = [part.replace("{port}", str(port)) for part in shlex.split(command)]
        url = f"http://127.0.0.1:{port}"
        log_path = os.path.join(args.out_dir, f"{name}.server.log")
        log(f"[{name}] starting: {' '.join(argv)}")
        server_log = open(log_path, "w")
        proc = subprocess.Popen(argv, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
    client = Client(url, args.model)
    try:
        started = time.time()
        wait_healthy(client, proc, args.startup_timeout)
        log(f"[{name}] healthy after {time.time() - started:.1f}s at {url}")
        client.complete("Hello", 2, stream=False)  # warm-up: first-touch allocations, thread pools
        result = {"name": name, "command": command, "url": url}
        if not args.skip_prefix:
            result["prefix"] = bench_prefix(client, args.seed, args.prompt_tokens, args.prefix_reps,
                                            args.prefix_max_tokens, log)
        result["concurrency"] = [bench_concurrency(client, args.seed, c, args.short_prompt_words,
                                                   args.output_tokens, log) for c in args.concurrency]
        if proc is not None:
            result["peak_rss_mib"] = peak_rss_mib(proc.pid)
            log(f"[{name}] peak RSS {result['peak_rss_mib']} MiB")
        return result
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def peak_rss_mib(pid):
    """The process's peak resident set (VmHWM), read before it is stopped; None where /proc lacks it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def fmt_s(value):
    return "-" if value is None else f"{value:.3f}"


def fmt_rate(value):
    return "-" if value is None else f"{value:.1f}"


def markdown(report):
    lines = [f"Machine: {report['machine']}; load before run: {report['loadavg_before']}; "
             f"after: {report['loadavg_after']}", ""]
    lines += ["| server | prompt tokens | cold TTFT (s) | warm TTFT (s) | cold/warm |", "|---|---|---|---|---|"]
    for server in report["servers"]:
        p = server.get("prefix")
        if p:
            tokens = statistics.median(r["prompt_tokens"] or 0 for r in p["runs"])
            lines.append(f"| {server['name']} | {tokens:.0f} | {fmt_s(p['cold_ttft_median_s'])} | "
                         f"{fmt_s(p['warm_ttft_median_s'])} | {p['cold_over_warm']:.1f}x |")
    lines += ["", "| server | concurrent | output tok/s | TTFT p50 (s) | TTFT p95 (s) | per-request tok/s | errors |",
              "|---|---|---|---|---|---|---|"]
    for server in report["servers"]:
        for c in server["concurrency"]:
            lines.append(f"| {server['name']} | {c['concurrency']} | {c['output_tokens_per_s']:.1f} | "
                         f"{fmt_s(c['ttft_p50_s'])} | {fmt_s(c['ttft_p95_s'])} | "
                         f"{fmt_rate(c['per_request_tokens_per_s_median'])} | "
                         f"{len(c['errors'])} |")
    if any(server.get("peak_rss_mib") is not None for server in report["servers"]):
        lines += ["", "| server | peak RSS (MiB) |", "|---|---|"]
        lines += [f"| {server['name']} | {server.get('peak_rss_mib')} |" for server in report["servers"]]
    if len(report["servers"]) >= 2:
        base, other = report["servers"][0], report["servers"][1]
        lines += ["", f"Ratios {base['name']} / {other['name']}:"]
        if base.get("prefix") and other.get("prefix"):
            lines.append(f"- warm TTFT: {base['prefix']['warm_ttft_median_s'] / other['prefix']['warm_ttft_median_s']:.2f}; "
                         f"cold TTFT: {base['prefix']['cold_ttft_median_s'] / other['prefix']['cold_ttft_median_s']:.2f}")
        for a, b in zip(base["concurrency"], other["concurrency"]):
            lines.append(f"- output tok/s at {a['concurrency']}: {a['output_tokens_per_s'] / b['output_tokens_per_s']:.2f}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", action="append", default=[],
                        help="NAME=COMMAND (use {port} in COMMAND) or NAME=http://host:port (already running)")
    parser.add_argument("--model", default="", help="model field in requests (default: omitted)")
    parser.add_argument("--out-dir", default="bench/serve/results")
    parser.add_argument("--tag", default=time.strftime("%Y%m%d-%H%M%S"), help="suffix of the result files")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--prefix-reps", type=int, default=3)
    parser.add_argument("--prefix-max-tokens", type=int, default=4)
    parser.add_argument("--skip-prefix", action="store_true")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--short-prompt-words", type=int, default=24)
    parser.add_argument("--startup-timeout", type=float, default=120)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not args.server:
        parser.error("give at least one --server")
    os.makedirs(args.out_dir, exist_ok=True)

    def log(message):
        print(message, flush=True)

    report = {"machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.node()}",
              "loadavg_before": [round(x, 2) for x in os.getloadavg()], "args": vars(args), "servers": []}
    for spec in args.server:
        name, _, target = spec.partition("=")
        is_url = target.startswith("http://")
        report["servers"].append(run_server(name, None if is_url else target, target if is_url else None, args, log))
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    json_path = os.path.join(args.out_dir, f"serve_bench-{args.tag}.json")
    md_path = os.path.join(args.out_dir, f"serve_bench-{args.tag}.md")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    table = markdown(report)
    with open(md_path, "w") as f:
        f.write(table)
    print(table)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    sys.exit(main())
