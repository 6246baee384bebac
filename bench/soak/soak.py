#!/usr/bin/env python3
"""Soak: N concurrent clients for M minutes against a `loom serve` this script starts, mixing the base model
and adapters in every KV sharing mode, completions and chats, streamed and whole, greedy and sampled, clients
that drop mid-stream and bad requests. It samples the server's RSS, KV blocks in use and the cache gauges of
/metrics (loom_cache_entries / loom_cache_bytes) every few seconds and fails (exit 1) when, after warm-up, the
RSS grows beyond --max-rss-growth, any request gets a 5xx or no answer, a cache holds more than its limit,
the server leaves KV blocks in use once idle, or it does not exit 0 on SIGTERM.

Standard library only (it runs on the GPU machine's bare Python too).

  bench/soak/soak.py --loom build/loom --model DIR [--device cuda] [--clients 64] [--seconds 600]
      [--warmup 60] [--max-rss-growth 0.10] [--out soak.json] [-- extra loom serve flags]

DIR is a `loom make-model --arch llama --preset tiny --adapters 4 --alora` model: its adapters 0-3 are
served as activated, base, forked and isolated (an adapter_config.json without alora_invocation_tokens
makes adapter0 isolated too). The JSON holds every sample and the verdict.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

MODES = ["activated", "base", "forked", "isolated"]
WORDS = ("the agent reads a file then calls a tool and writes the answer to the plan with care "
         "context shared cache block memory request model adapter token step graph").split()
SERVED_NAME = "soak-base"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def parse_metrics(text):
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[re.sub(r'model_name="[^"]*",?', "", name).replace("{}", "")] = float(value)
    return samples


class Server:
    def __init__(self, args, adapters):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="loom-soak-", suffix=".log", delete=False)
        command = [args.loom, "serve", "--model", args.model, "--served-model-name", SERVED_NAME, "--port",
                   str(self.port), "--device", args.device]
        for name, (path, mode) in adapters.items():
            command += ["--lora", f"{name}={path}:{mode}"]
        command += args.serve_args
        print("soak: " + " ".join(command), flush=True)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + args.start_timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"loom serve exited with {self.process.returncode}:\n{self.read_log()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("loom serve never became healthy:\n" + self.read_log())

    def read_log(self):
        with open(self.log.name) as log:
            return log.read()[-4000:]

    def get(self, path):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def metrics(self):
        return parse_metrics(self.get("/metrics")[1].decode())

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


class Load:
    """The clients: each loops over randomly drawn requests until stop; counts outcomes by kind."""

    def __init__(self, server, models, invocation, vocab_size, max_context, seed, simple=False, distinct=False,
                 wide=False, new_connections=False):
        self.server, self.models, self.invocation = server, models, invocation
        self.simple, self.distinct, self.wide, self.new_connections = simple, distinct, wide, new_connections
        self.vocab_size, self.max_context = vocab_size, max_context
        self.seed = seed
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []
        # Shared prompt prefixes, so the prefix cache, the sharing modes and eviction all see traffic.
        rng = random.Random(seed)
        self.prefixes = [[rng.randrange(10, min(vocab_size // 2, 250)) for _ in range(rng.randrange(16, 96))]
                         for _ in range(8)]

    def count(self, key, failure=None):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            if failure is not None and len(self.failures) < 50:
                self.failures.append(failure)

    def run_client(self, index):
        rng = random.Random(self.seed * 1000 + index)
        connection = None
        while not self.stop.is_set():
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
            try:
                keep = self.one_request(rng, connection)
            except (OSError, http.client.HTTPException) as error:
                self.count("transport_error", f"{type(error).__name__}: {error}")
                keep = False
            if not keep or self.new_connections:
                connection.close()
                connection = None
        if connection is not None:
            connection.close()

    def prompt_tokens(self, rng, model_mode):
        if self.distinct:  # no two prompts alike: every block is new, eviction and the host tier never rest
            tokens = [rng.randrange(10, min(self.vocab_size - 1, 250)) for _ in range(rng.randrange(16, 256))]
        else:
            tokens = list(rng.choice(self.prefixes)) + [rng.randrange(10, 250) for _ in range(rng.randrange(1, 24))]
        if model_mode == "activated":
            tokens += self.invocation + [rng.randrange(10, 250) for _ in range(rng.randrange(0, 6))]
        return tokens

    def one_request(self, rng, connection):
        """Sends one request and reads its answer; returns whether the connection can be reused."""
        if not self.simple and rng.random() < 0.05:
            return self.bad_request(rng, connection)
        model, mode = rng.choice(self.models)
        stream = not self.simple and rng.random() < 0.5
        drop = stream and rng.random() < 0.1
        body = {"model": model, "max_tokens": rng.randrange(2, 24), "stream": stream,
                "temperature": 0.0 if self.simple else rng.choice([0.0, 0.0, 0.8]), "seed": rng.randrange(1 << 30)}
        if self.wide:  # the other sampling fields agents send, longer answers, text prompts
            body["max_tokens"] = rng.randrange(2, 128)
            if rng.random() < 0.3:
                body.update(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1, min_p=0.05,
                            logit_bias={str(rng.randrange(10, 200)): 2.0})
            if rng.random() < 0.2:
                body["stop"] = ["\n\n", "END"]
            if rng.random() < 0.1:
                body["n"] = 2
        if self.simple or rng.random() < 0.6 or mode == "activated":
            path = "/v1/completions"
            if self.wide and mode != "activated" and rng.random() < 0.5:
                body["prompt"] = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 120)))
            else:
                body["prompt"] = self.prompt_tokens(rng, mode)
            if self.wide and rng.random() < 0.2:
                body["logprobs"] = 3
        else:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "system", "content": "You are agent %d." % rng.randrange(4)},
                                {"role": "user", "content": "step %d of task %d" % (rng.randrange(50),
                                                                                    rng.randrange(8))}]
            extra = rng.random()
            if extra < 0.15:  # structured output over many distinct schemas: the grammar cache must stay bounded
                field = "f%d" % rng.randrange(200)
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "out", "schema": {
                    "type": "object", "properties": {field: {"type": "integer"}}, "required": [field]}}}
            elif extra < 0.2:  # a per-request chat template, one of many: the template cache too
                body["chat_template"] = ("{%% for m in messages %%}<%d>{{ m['content'] }}\n{%% endfor %%}"
                                         % rng.randrange(50))
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            text = response.read()[:300]
            self.count("unexpected_status", f"{response.status} on {path} {model}: {text!r}")
            return response.status < 500
        if drop:
            response.read1(64) if hasattr(response, "read1") else response.read(64)
            self.count("dropped")
            return False
        payload = response.read()
        if stream and b"data: [DONE]" not in payload:
            self.count("unfinished_stream", f"{path} {model}: {payload[-200:]!r}")
            return False
        self.count("ok_" + mode)
        return True

    def bad_request(self, rng, connection):
        kind = rng.randrange(4)
        if kind == 0:
            raw, expect = b'{"model": "x", "prompt": [1, 2', 400  # malformed JSON
        elif kind == 1:
            raw, expect = json.dumps({"model": "no-such-adapter", "prompt": "hi", "max_tokens": 2}).encode(), 404
        elif kind == 2:
            raw, expect = json.dumps({"model": SERVED_NAME, "prompt": [11] * (self.max_context + 8),
                                      "max_tokens": 2}).encode(), 400
        else:
            raw, expect = b'{"model": "' + bytes([0xff, 0xfe]) + b'", "prompt": "x"}', 400  # bad UTF-8
        connection.request("POST", "/v1/completions", raw, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        if response.status != expect:
            self.count("unexpected_status", f"bad request kind {kind}: {response.status}, expected {expect}")
        else:
            self.count("bad_request_answered")
        return not response.will_close


def adapter_specs(model_dir, modes):
    directory = os.path.join(model_dir, "adapters")
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    specs, invocation = {}, []
    for index, name in enumerate(names[:len(MODES)]):
        path = os.path.join(directory, name)
        with open(os.path.join(path, "adapter_config.json")) as config_file:
            config = json.load(config_file)
        mode = MODES[index]
        if mode == "activated":
            if config.get("alora_invocation_tokens"):
                invocation = list(config["alora_invocation_tokens"])
            else:
                mode = "isolated"
        if mode in modes:
            specs[name] = (path, mode)
    return specs, invocation


def fit_slope(points):
    """Least-squares slope of (x, y) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0


def cache_gauges(metrics):
    gauges = {}
    for key, value in metrics.items():
        match = re.match(r'loom_cache_(entries|bytes|capacity|evictions_total)\{cache="([^"]+)"\}', key)
        if match:
            gauges.setdefault(match.group(2), {})[match.group(1)] = value
    return gauges


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loom", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--warmup", type=float, default=60, help="seconds of load before the RSS baseline")
    parser.add_argument("--sample-every", type=float, default=5)
    parser.add_argument("--max-rss-growth", type=float, default=0.10, help="fraction over the post-warm-up RSS")
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES), help="the sharing modes to serve adapters in")
    parser.add_argument("--mix", choices=["full", "simple", "wide"], default="full",
                        help="simple: greedy whole completions only (no streams, drops, bad requests or chats); "
                             "wide: full plus penalties, logit_bias, stop strings, n=2, logprobs, text prompts and "
                             "answers up to 128 tokens")
    parser.add_argument("--new-connections", action="store_true", help="one connection per request (no keep-alive)")
    parser.add_argument("--prompts", choices=["shared", "distinct"], default="shared",
                        help="shared: prompts over 8 common prefixes; distinct: every prompt new")
    parser.add_argument("--out", default="")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: extra loom serve flags")
    args = parser.parse_args()
    args.serve_args = [a for a in args.serve_args if a != "--"]

    with open(os.path.join(args.model, "config.json")) as config_file:
        config = json.load(config_file)
    adapters, invocation = adapter_specs(args.model, args.modes.split(","))
    server = Server(args, adapters)
    models = [(SERVED_NAME, "none")] + [(name, mode) for name, (_, mode) in adapters.items()]
    status, body = server.get("/v1/models")
    max_context = json.loads(body)["data"][0].get("max_model_len") or config.get("max_position_embeddings", 2048)
    load = Load(server, models, invocation, config["vocab_size"], int(max_context), args.seed,
                simple=args.mix == "simple", distinct=args.prompts == "distinct", wide=args.mix == "wide",
                new_connections=args.new_connections)
    threads = [threading.Thread(target=load.run_client, args=(i,), daemon=True) for i in range(args.clients)]
    start = time.time()
    for thread in threads:
        thread.start()
    samples = []
    try:
        while time.time() - start < args.seconds:
            time.sleep(args.sample_every)
            metrics = server.metrics()
            with load.lock:
                done = sum(v for k, v in load.counts.items() if k.startswith("ok_") or k in ("dropped",
                                                                                           "bad_request_answered"))
            sample = {"t": round(time.time() - start, 1), "rss_mib": round(rss_bytes(server.process.pid) / 2**20, 1),
                      "requests": done,
                      "kv_blocks_in_use": metrics.get('loom_kv_cache_blocks{state="in_use"}', -1),
                      "caches": cache_gauges(metrics)}
            samples.append(sample)
            print(f"soak: t={sample['t']:6.0f}s rss={sample['rss_mib']:8.1f} MiB requests={done} "
                  f"kv_in_use={sample['kv_blocks_in_use']:.0f} " +
                  " ".join(f"{name}={g.get('entries', 0):.0f}/{g.get('evictions_total', 0):.0f}ev"
                           for name, g in sample["caches"].items()), flush=True)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=150)
    # Idle: nothing running, no KV block held by a request.
    idle_in_use = None
    for _ in range(60):
        metrics = server.metrics()
        idle_in_use = metrics.get('loom_kv_cache_blocks{state="in_use"}', 0)
        if idle_in_use == 0 and metrics.get("loom_num_requests_running", 0) == 0:
            break
        time.sleep(0.5)
    idle_rss = round(rss_bytes(server.process.pid) / 2**20, 1)
    exit_code = server.stop()

    problems = []
    after = [s for s in samples if s["t"] >= args.warmup]
    if len(after) < 2:
        problems.append("too few samples after warm-up: run longer or warm up less")
        baseline = final = peak = 0.0
        slope = 0.0
    else:
        baseline = after[0]["rss_mib"]
        final = after[-1]["rss_mib"]
        peak = max(s["rss_mib"] for s in after)
        slope = fit_slope([(s["requests"], s["rss_mib"] * 2**20) for s in after])
        if peak > baseline * (1 + args.max_rss_growth):
            problems.append(f"RSS grew from {baseline} MiB after warm-up to a peak of {peak} MiB "
                            f"(> +{args.max_rss_growth:.0%})")
    for sample in samples:
        for name, gauge in sample["caches"].items():
            if gauge.get("capacity", 0) > 0 and gauge.get("entries", 0) > gauge["capacity"]:
                problems.append(f"cache {name} holds {gauge['entries']} entries over its limit {gauge['capacity']}")
    for key in ("unexpected_status", "transport_error", "unfinished_stream"):
        if load.counts.get(key):
            problems.append(f"{load.counts[key]} requests: {key}")
    if idle_in_use:
        problems.append(f"{idle_in_use} KV blocks still in use once idle")
    if exit_code != 0:
        problems.append(f"loom serve exited with {exit_code} on SIGTERM")
    requests = samples[-1]["requests"] if samples else 0
    report = {"device": args.device, "clients": args.clients, "seconds": args.seconds, "warmup": args.warmup,
              "mix": args.mix, "prompts": args.prompts,
              "adapters": {name: mode for name, (_, mode) in adapters.items()}, "counts": load.counts,
              "failures": load.failures[:20], "rss_after_warmup_mib": baseline, "rss_final_mib": final,
              "rss_peak_mib": peak, "rss_idle_mib": idle_rss, "bytes_per_request_slope": round(slope, 1),
              "requests": requests, "samples": samples, "problems": problems, "pass": not problems}
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=1)
    print(f"soak: {requests} requests, RSS {baseline} MiB after warm-up -> {final} MiB (peak {peak}, idle "
          f"{idle_rss}), {slope:.0f} B/request; counts {load.counts}", flush=True)
    for problem in problems:
        print("soak: FAIL: " + problem, flush=True)
    if problems:
        print(server.read_log()[-1500:], file=sys.stderr)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
