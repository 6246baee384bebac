#!/usr/bin/env python3
"""TTFT of a prompt whose prefix sits only on the disk tier vs recomputing it
(issue 17), and the read bandwidth Loom reaches vs `dd` with O_DIRECT on the
same files. Standard library only (runs on the GPU machine as is).

  bench/disk_tier_ttft.py --loom build/loom --model ~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --tokens 8000 --disk /tmp/loom-disk --host-kv-memory 1G --out bench/results/disk_tier/cpu.json

1. server A (disk tier on an empty DIR) prefills the prompt (1 output token): the recompute TTFT; its
   blocks are written through to DIR; A stops (SIGTERM drains the writes).
2. server B, a fresh process on DIR with --disk-kv-warm-start, gets the same prompt: TTFT with the prefix
   read disk -> host -> device; its /metrics give the bytes and seconds of the reads.
3. `dd` writes then reads (O_DIRECT, 4 MiB blocks) one file of the same size: the file system's own bandwidth.
The page cache is not dropped between 1 and 2 unless --drop-caches (root) is given; O_DIRECT reads bypass it.
"""
import argparse
import glob
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time


def metrics(port):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    samples = {}
    for line in connection.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = name.replace('{model_name="bench"}', "").replace('model_name="bench",', "")
            samples[name] = float(value)
    return samples


def start(args, port, warm, log_path):
    command = [args.loom, "serve", "--model", args.model, "--served-model-name", "bench", "--port", str(port),
               "--host-kv-memory", args.host_kv_memory, "--disk-kv-path", args.disk, "--disk-kv-bytes",
               args.disk_kv_bytes, *args.serve_args.split()]
    if warm:
        command.append("--disk-kv-warm-start")
    log = open(log_path, "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"loom serve exited: see {log_path}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("loom serve did not start")


def ttft(port, prompt):
    body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    begin = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = json.loads(connection.getresponse().read())
    seconds = time.perf_counter() - begin
    if "error" in response:
        sys.exit(f"request failed: {response['error']}")
    return seconds, response["usage"]


def stop(process):
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=600)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom", default="build/loom")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--disk", required=True, help="an empty or missing directory (it is emptied first)")
    parser.add_argument("--host-kv-memory", default="2G", help="must hold the prompt's KV: only backed-up blocks reach disk")
    parser.add_argument("--disk-kv-bytes", default="64G")
    parser.add_argument("--serve-args", default="", help="more `loom serve` flags, e.g. '--device cuda'")
    parser.add_argument("--port", type=int, default=8131)
    parser.add_argument("--drop-caches", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    shutil.rmtree(args.disk, ignore_errors=True)
    rng = random.Random(args.tokens)
    prompt = [rng.randrange(300, 20000) for _ in range(args.tokens)]
    log_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else "."
    os.makedirs(log_dir, exist_ok=True)

    warmup = [rng.randrange(300, 20000) for _ in range(64)]  # first-request costs stay out of the timings
    first = start(args, args.port, False, os.path.join(log_dir, "disk_tier_server_a.log"))
    ttft(args.port, warmup)
    recompute_s, usage = ttft(args.port, prompt)
    stop(first)  # drains: every planned write-through lands
    files = glob.glob(os.path.join(args.disk, "??", "*.kv"))
    disk_bytes = sum(os.path.getsize(path) for path in files)
    if args.drop_caches:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)

    second = start(args, args.port + 1, True, os.path.join(log_dir, "disk_tier_server_b.log"))
    ttft(args.port + 1, warmup)
    from_disk_s, usage_b = ttft(args.port + 1, prompt)
    samples = metrics(args.port + 1)
    stop(second)

    # The file system's own sequential bandwidth: one file of the same size, written then read with O_DIRECT.
    probe = os.path.join(args.disk, "dd-probe")
    count = max(1, disk_bytes // (4 << 20))
    subprocess.run(["dd", "if=/dev/zero", f"of={probe}", "bs=4M", f"count={count}", "oflag=direct"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dd_begin = time.perf_counter()
    subprocess.run(["dd", f"if={probe}", "of=/dev/null", "bs=4M", "iflag=direct"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dd_s = time.perf_counter() - dd_begin
    os.remove(probe)
    read_bytes = samples.get("loom_disk_kv_read_bytes_total", 0)
    read_s = samples.get("loom_disk_kv_read_seconds_total", 0)
    result = {
        "model": args.model, "serve_args": args.serve_args, "prompt_tokens": usage["prompt_tokens"],
        "ttft_recompute_s": round(recompute_s, 4), "ttft_from_disk_s": round(from_disk_s, 4),
        "speedup": round(recompute_s / from_disk_s, 2) if from_disk_s > 0 else None,
        "cached_tokens_from_disk": (usage_b.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "disk_files": len(files), "disk_bytes": disk_bytes,
        "loom_read_bytes": read_bytes, "loom_read_seconds": round(read_s, 4),
        "loom_read_gb_per_s": round(read_bytes / read_s / 1e9, 3) if read_s > 0 else None,
        "dd_direct_read_gb_per_s": round(count * (4 << 20) / dd_s / 1e9, 3) if dd_s > 0 else None,
        "loom_disk_kv_failures_read": samples.get('loom_disk_kv_failures_total{op="read"}'),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
