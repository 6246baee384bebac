#!/usr/bin/env python3
"""DualPath's offline setting at small scale (issue 18): a multi-turn agentic
replay through `loom router` over one prefill engine (PE) and one decode engine
(DE) sharing a disk tier, each engine's storage reads capped by
--disk-kv-read-bandwidth (its emulated storage NIC). Compares the router's
--path-policy prefill (every hit is read by the PE: today's PD-disaggregated
systems) with dual (DualPath: the router sends a request's reads to the side
whose read queue is shorter; DE reads go DE -> PE over the KV link), and with
both: no disaggregation, two `--role both` engines (one per --pe-device /
--de-device), each agent pinned to one. Requests stream, so each turn gives a
TTFT and a TPOT.
Standard library only (runs on the GPU machine as is).

  bench/dualpath_replay.py --loom build/loom --model ~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --engine-args "--kv-cache-bytes 256M --host-kv-memory 128M --threads 1" --read-bandwidth 64M \
      --agents 8 --turns 4 --context 1024 --append 32 --gen 4 --out bench/results/dualpath/cpu.json

Workload (DualPath §7.2's replay, synthetic tokens): each agent starts from a
context of --context random tokens, prefilled once untimed (it lands on the
disk tier); then --turns timed turns, each appending --append tokens and
generating --gen tokens; the next turn's prompt is the previous prompt, --gen
filler tokens (the "generated" part, as the trace replays it) and the new
append. Agents run concurrently, each agent's turns in order (offline: job
completion time of the whole batch). Caches, host tiers and buffers must be
small next to agents x context, so that hits come from storage as in the paper.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port, method, path, body=None, timeout=600):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    connection.request(method, path, body=json.dumps(body) if body is not None else None,
                       headers={"content-type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{method} {path}: {response.status} {data[:300]!r}")
    return data


def stream_completion(port, body, timeout=600):
    """POSTs a streamed /v1/completions; returns (usage, ttft seconds, tpot seconds or None)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.time()
    connection.request("POST", "/v1/completions",
                       body=json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
                       headers={"content-type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"POST /v1/completions: {response.status} {response.read()[:300]!r}")
    token_times, usage = [], None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        if chunk.get("choices"):
            token_times.append(time.time())
    if usage is None or not token_times:
        raise RuntimeError("the stream ended without tokens or usage")
    ttft = token_times[0] - started
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return usage, ttft, tpot


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else None


def metrics(port):
    samples = {}
    for line in call(port, "GET", "/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = name.replace('{model_name="bench"}', "").replace('model_name="bench",', "")
            samples[name] = float(value)
    return samples


def wait_healthy(process, port, log_path, timeout=900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"exited with {process.returncode}: see {log_path}\n" + open(log_path).read()[-3000:])
        try:
            call(port, "GET", "/health", timeout=2)
            return
        except (OSError, RuntimeError):
            time.sleep(0.2)
    sys.exit(f"not healthy: see {log_path}")


def start(command, port, log_path):
    log = open(log_path, "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(process, port, log_path)
    return process


def stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_policy(args, policy, workdir):
    """policy prefill / dual: router + PE + DE; both: two `--role both` engines (one per device), each agent
    pinned to one of them (agent i on engine i % 2), no router."""
    disk = os.path.join(workdir, f"disk-{policy}")
    shutil.rmtree(disk, ignore_errors=True)
    pe_port, de_port, router_port = free_port(), free_port(), free_port()
    engines = []
    roles = ("both", "both") if policy == "both" else ("prefill", "decode")
    for role, port, bandwidth, device, name in (
            (roles[0], pe_port, args.read_bandwidth, args.pe_device or args.device, "pe"),
            (roles[1], de_port, args.de_read_bandwidth or args.read_bandwidth, args.de_device or args.device, "de")):
        command = [args.loom, "serve", "--model", args.model, "--served-model-name", "bench", "--port", str(port),
                   "--role", role, "--disk-kv-path", disk, "--disk-kv-bytes", args.disk_kv_bytes,
                   "--disk-kv-read-bandwidth", bandwidth, *args.engine_args.split()]
        if role != "both":
            command += ["--kv-buffer-bytes", args.kv_buffer_bytes, *args.role_args.split()]
        if device != "cpu":
            command += ["--device", device]
        engines.append(start(command, port, os.path.join(workdir, f"{policy}-{name}-{role}.log")))
    router = None
    if policy != "both":
        router = start([args.loom, "router", "--port", str(router_port), "--prefill", f"http://127.0.0.1:{pe_port}",
                        "--decode", f"http://127.0.0.1:{de_port}", "--path-policy", policy, *args.router_args.split()],
                       router_port, os.path.join(workdir, f"{policy}-router.log"))
    try:
        rng = random.Random(args.seed)
        vocab = args.vocab
        contexts = [[rng.randrange(100, vocab) for _ in range(args.context)] for _ in range(args.agents)]

        def target(agent_index):
            if policy != "both":
                return router_port
            return (pe_port, de_port)[agent_index % 2]

        def complete(agent_index, prompt, max_tokens):
            body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                    "ignore_eos": True}
            return stream_completion(target(agent_index), body)

        peak_rss = [0, 0]  # MiB, PE and DE, sampled while the replay runs
        sampling = threading.Event()

        def sample_rss():
            while not sampling.wait(0.5):
                for i, engine in enumerate(engines):
                    try:
                        with open(f"/proc/{engine.pid}/status") as status:
                            rss = int(status.read().split("VmRSS:")[1].split()[0]) // 1024
                        peak_rss[i] = max(peak_rss[i], rss)
                    except (OSError, IndexError, ValueError):
                        pass

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        # Untimed: every agent's context prefilled once, so its blocks are on the disk tier.
        threads = [threading.Thread(target=complete, args=(i, context, 1)) for i, context in enumerate(contexts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Until the engines' write-through has landed: stored block counts still for `settle` seconds.
        def stored():
            return [metrics(port).get("loom_disk_kv_stored_blocks_total", 0.0) for port in (pe_port, de_port)]

        deadline, last, still_since = time.time() + 300, stored(), time.time()
        while time.time() < deadline and time.time() - still_since < args.settle:
            time.sleep(0.5)
            now = stored()
            if now != last:
                last, still_since = now, time.time()
        pe_before, de_before = metrics(pe_port), metrics(de_port)
        router_before = metrics(router_port) if router else {}

        results = [[] for _ in range(args.agents)]
        errors = []

        def agent(index):
            prompt = list(contexts[index])
            agent_rng = random.Random(args.seed * 1000 + index)
            try:
                for _ in range(args.turns):
                    prompt += [agent_rng.randrange(100, vocab) for _ in range(args.append)]
                    started = time.time()
                    usage, ttft, tpot = complete(index, prompt, args.gen)
                    results[index].append({"seconds": time.time() - started, "ttft": ttft, "tpot": tpot,
                                           "prompt_tokens": usage["prompt_tokens"],
                                           "cached_tokens": (usage.get("prompt_tokens_details") or {}).get(
                                               "cached_tokens", 0)})
                    prompt += [agent_rng.randrange(100, vocab) for _ in range(args.gen)]
            except Exception as error:  # noqa: BLE001 (reported below)
                errors.append(repr(error))

        started = time.time()
        threads = [threading.Thread(target=agent, args=(i,)) for i in range(args.agents)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        jct = time.time() - started
        sampling.set()
        if errors:
            codes = [process.poll() for process in [*engines, router] if process]
            sys.exit(f"{policy}: {errors[:3]}; exit codes of PE, DE, router (None: running): {codes}; "
                     f"peak RSS MiB PE, DE: {peak_rss}")
        pe_after, de_after = metrics(pe_port), metrics(de_port)
        router_after = metrics(router_port) if router else {}

        def delta(after, before, name):
            return after.get(name, 0.0) - before.get(name, 0.0)

        turns = [turn for agent_turns in results for turn in agent_turns]
        prompt_tokens = sum(turn["prompt_tokens"] for turn in turns)
        paths = {path: delta(router_after, router_before, f'loom_router_requests_total{{path="{path}"}}')
                 for path in ("prefill", "decode", "none", "direct")}
        return {
            "policy": policy,
            "jct_seconds": jct,
            "requests": len(turns),
            "requests_per_second": len(turns) / jct,
            "prompt_tokens_per_second": prompt_tokens / jct,
            "mean_request_seconds": sum(turn["seconds"] for turn in turns) / len(turns),
            "ttft_p50": percentile([turn["ttft"] for turn in turns], 0.5),
            "ttft_p95": percentile([turn["ttft"] for turn in turns], 0.95),
            "tpot_p50": percentile([turn["tpot"] for turn in turns if turn["tpot"] is not None], 0.5),
            "tpot_p95": percentile([turn["tpot"] for turn in turns if turn["tpot"] is not None], 0.95),
            "engine_hit_rate": sum(turn["cached_tokens"] for turn in turns) / prompt_tokens,
            "paths": paths,
            "pe_storage_read_bytes": delta(pe_after, pe_before, "loom_disk_kv_read_bytes_total"),
            "de_storage_read_bytes": delta(de_after, de_before, "loom_disk_kv_read_bytes_total"),
            "pe_to_de_bytes": delta(pe_after, pe_before, 'loom_kv_link_bytes_total{direction="sent"}'),
            "de_to_pe_bytes": delta(de_after, de_before, 'loom_kv_link_bytes_total{direction="sent"}'),
            "de_missing_blocks": delta(pe_after, pe_before, 'loom_kv_link_blocks_total{direction="missing"}'),
            "link_seconds": delta(pe_after, pe_before, "loom_kv_link_seconds_total") +
                            delta(de_after, de_before, "loom_kv_link_seconds_total"),
            "channel_bytes": delta(pe_after, pe_before, 'loom_kv_link_channel_bytes_total{direction="sent"}') +
                             delta(de_after, de_before, 'loom_kv_link_channel_bytes_total{direction="sent"}'),
            "peak_rss_mib": {"prefill_engine": peak_rss[0], "decode_engine": peak_rss[1]},
            "stored_blocks": pe_after.get("loom_disk_kv_stored_blocks_total", 0) +
                             de_after.get("loom_disk_kv_stored_blocks_total", 0),
            "pe_disk_loaded_tokens": delta(pe_after, pe_before, "loom_disk_kv_loaded_tokens_total"),
            "pe_host_loaded_tokens": delta(pe_after, pe_before, "loom_loaded_tokens_total"),
            "pe_prefix_hit_tokens": delta(pe_after, pe_before, "loom_prefix_cache_hit_tokens_total"),
            "pe_prompt_tokens": delta(pe_after, pe_before, "loom_prompt_tokens_total"),
        }
    finally:
        if router:
            stop(router)
        for engine in engines:
            stop(engine)
        shutil.rmtree(disk, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom", default="build/loom")
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pe-device", default="", help="the PE's --device (policy both: the first engine's)")
    parser.add_argument("--de-device", default="", help="the DE's --device (policy both: the second engine's)")
    parser.add_argument("--engine-args", default="", help="more `loom serve` flags for every engine")
    parser.add_argument("--role-args", default="", help="more flags for the PE and DE only (e.g. --kv-transfer-backend)")
    parser.add_argument("--router-args", default="")
    parser.add_argument("--read-bandwidth", default="64M", help="each engine's storage read cap (B/s)")
    parser.add_argument("--de-read-bandwidth", default="", help="the DE's, when it differs")
    parser.add_argument("--disk-kv-bytes", default="8G")
    parser.add_argument("--kv-buffer-bytes", default="256M")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--append", type=int, default=32)
    parser.add_argument("--gen", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=30000, help="token ids drawn below this")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="before timing, wait until the engines stored no new block for this many seconds")
    parser.add_argument("--policies", default="prefill,dual",
                        help="prefill, dual (router + PE + DE) and both (two --role both engines, no router)")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="loom-dualpath-")
    os.makedirs(workdir, exist_ok=True)
    runs = []
    report = {"config": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")}, "runs": runs}
    for policy in args.policies.split(","):
        runs.append(run_policy(args, policy, workdir))
        if args.out:  # each policy's figures as soon as it is done: a run cut short keeps them
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as out:
                json.dump(report, out, indent=2)
    by_policy = {run["policy"]: run for run in runs}
    if "prefill" in by_policy and "dual" in by_policy:
        report["dual_over_prefill_throughput"] = (by_policy["dual"]["requests_per_second"] /
                                                  by_policy["prefill"]["requests_per_second"])
    if "both" in by_policy and "dual" in by_policy:
        report["dual_over_both_throughput"] = (by_policy["dual"]["requests_per_second"] /
                                               by_policy["both"]["requests_per_second"])
    print(json.dumps(report, indent=2))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
