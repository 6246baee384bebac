#!/usr/bin/env python3
"""HTTP front-end benchmark of `loom serve` (issue 12). Stdlib only.

Two measurements, each against a server given by URL or started here from a
binary on the tiny random model of `loom make-model`:

  load  N concurrent keep-alive connections (default 256), each sending small
        /v1/completions (max_tokens 1-4, ignore_eos) back to back for T
        seconds: requests/s, latency p50/p99, errors, and the CPU the client
        and the server used (so a client-bound run is visible).
  slow  the latency of a small completion on an idle server, then with 1000
        idle connections and 200 clients trickling one header byte per second
        open at once (each request on a new connection; a request that takes
        longer than --timeout counts as a timeout).

  compare  both, for two binaries side by side in one run (rounds alternate
           the order), into DIR/NAME.json and DIR/NAME.md.

The load client is asyncio on raw sockets (no HTTP library in the loop), spread
over --procs processes; its CPU use is reported next to the figures.

Examples:
  python3 bench/http/http_bench.py load --binary build/loom --connections 256 --duration 20
  python3 bench/http/http_bench.py slow --url http://127.0.0.1:8000
  python3 bench/http/http_bench.py compare --before /tmp/loom-before --after build/loom \\
      --out-dir bench/http/results --name issue12
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

PROMPTS = ["Hello there", "The quick brown fox", "Tell me a story", "What is the capital of France?",
           "Write one word", "Count to three", "Say hi", "A short answer please"]


# ----------------------------------------------------------------------------- server

def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`BINARY serve` on a tiny random model (made once per directory)."""

    def __init__(self, binary, model_dir, extra_args=(), threads=1):
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="loom-http-bench-", suffix=".log", delete=False)
        args = [binary, "serve", "--model", model_dir, "--served-model-name", "tiny", "--port", str(self.port),
                "--threads", str(threads), "--kv-cache-bytes", "256000000", *extra_args]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{binary} serve exited with {self.process.returncode}: {self.read_log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"{binary} serve did not become healthy: {self.read_log()}")
            time.sleep(0.1)

    def read_log(self):
        with open(self.log.name, errors="replace") as file:
            return file.read()[-2000:]

    def cpu_seconds(self):
        """utime + stime of the server process so far."""
        with open(f"/proc/{self.process.pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        os.unlink(self.log.name)


def make_model(binary, directory):
    model_dir = os.path.join(directory, "model")
    subprocess.run([binary, "make-model", "--arch", "llama", "--preset", "tiny", "--out", model_dir], check=True,
                   stdout=subprocess.DEVNULL)
    return model_dir


def host_port(url):
    parsed = urllib.parse.urlparse(url)
    return parsed.hostname, parsed.port or 80


def request_bytes(host, port, body, close=False):
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def small_bodies(max_tokens_range):
    low, high = max_tokens_range
    return [json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                        "ignore_eos": True}).encode()
            for prompt in PROMPTS for tokens in range(low, high + 1)]


def percentile(values, fraction):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


# ----------------------------------------------------------------------------- load

async def _read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value.strip())
        elif name == "connection" and value.strip().lower() == "close":
            close = True
    await reader.readexactly(length)
    return status, close


async def _connection_loop(host, port, requests, start, stop, timeout, rng, out):
    reader = writer = None
    while time.monotonic() < stop:
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
                out["connects"] += 1
            began = time.monotonic()
            writer.write(requests[rng.randrange(len(requests))])
            status, close = await asyncio.wait_for(_read_response(reader), timeout)
            ended = time.monotonic()
            if start <= ended <= stop:
                if status == 200:
                    out["latencies"].append(ended - began)
                else:
                    out["statuses"][str(status)] = out["statuses"].get(str(status), 0) + 1
            if close:
                writer.close()
                reader = writer = None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError) as exc:
            if time.monotonic() <= stop:
                name = type(exc).__name__
                out["errors"][name] = out["errors"].get(name, 0) + 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.05)
    if writer is not None:
        writer.close()


def _load_process(args):
    url, connections, begin_at, warmup, duration, timeout, max_tokens, seed = args
    host, port = host_port(url)
    requests = [request_bytes(host, port, body) for body in small_bodies(max_tokens)]
    out = {"latencies": [], "statuses": {}, "errors": {}, "connects": 0}
    usage_before = resource.getrusage(resource.RUSAGE_SELF)

    async def main():
        delay = begin_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.monotonic()
        start, stop = now + warmup, now + warmup + duration
        rng = random.Random(seed)
        await asyncio.gather(*[_connection_loop(host, port, requests, start, stop, timeout,
                                                random.Random(rng.random()), out) for _ in range(connections)])

    asyncio.run(main())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_seconds"] = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)
    return out


def run_load(url, connections=256, duration=20.0, warmup=3.0, procs=1, timeout=60.0, max_tokens=(1, 4),
             server=None):
    """Requests/s and latency percentiles of `connections` keep-alive clients."""
    raise_open_file_limit(connections + 256)
    procs = max(1, min(procs, connections))
    shares = [connections // procs + (1 if i < connections % procs else 0) for i in range(procs)]
    begin_at = time.time() + 0.5 + 0.2 * procs
    jobs = [(url, share, begin_at, warmup, duration, timeout, max_tokens, 1000 + i) for i, share in enumerate(shares)]
    server_cpu = server.cpu_seconds() if server else None
    wall = time.monotonic()
    if procs == 1:
        results = [_load_process(jobs[0])]
    else:
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            results = pool.map(_load_process, jobs)
    wall = time.monotonic() - wall
    latencies = [value for result in results for value in result["latencies"]]
    merged = {"statuses": {}, "errors": {}}
    for result in results:
        for key in ("statuses", "errors"):
            for name, count in result[key].items():
                merged[key][name] = merged[key].get(name, 0) + count
    report = {
        "connections": connections, "duration_s": duration, "warmup_s": warmup, "client_processes": procs,
        "max_tokens": list(max_tokens), "requests": len(latencies),
        "requests_per_s": len(latencies) / duration,
        "latency_ms": {"p50": ms(percentile(latencies, 0.50)), "p90": ms(percentile(latencies, 0.90)),
                       "p99": ms(percentile(latencies, 0.99)), "max": ms(max(latencies) if latencies else None),
                       "mean": ms(statistics.fmean(latencies) if latencies else None)},
        "non_200": merged["statuses"], "errors": merged["errors"],
        "connects": sum(result["connects"] for result in results),
        "client_cpu_cores": sum(result["cpu_seconds"] for result in results) / wall,
    }
    if server:
        report["server_cpu_cores"] = (server.cpu_seconds() - server_cpu) / wall
    return report


def ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 2)


def raise_open_file_limit(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# ----------------------------------------------------------------------------- slow clients

def timed_request(url, timeout):
    """Seconds for one small completion on a new connection, or None on timeout / failure."""
    host, port = host_port(url)
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 4, "temperature": 0,
                       "ignore_eos": True}).encode()
    began = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(max(0.1, timeout - (time.monotonic() - began)))
            sock.sendall(request_bytes(host, port, body, close=True))
            data = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        if not data.startswith(b"HTTP/1.1 200"):
            return None
    except OSError:
        return None
    return time.monotonic() - began


def run_slow(url, idle=1000, trickle=200, samples=10, timeout=30.0, max_timeouts=2):
    """Small-completion latency on an idle server, then beside idle and trickling connections."""
    raise_open_file_limit(idle + trickle + 256)
    baseline = [timed_request(url, timeout) for _ in range(samples)]
    host, port = host_port(url)
    idle_socks, trickle_socks = [], []
    stop = threading.Event()
    text = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" * 40
    loaded, timeouts = [], 0
    try:
        for _ in range(idle):
            idle_socks.append(socket.create_connection((host, port), timeout=10))
        for _ in range(trickle):
            trickle_socks.append(socket.create_connection((host, port), timeout=10))

        def trickler():
            for position in range(len(text)):
                if stop.is_set():
                    return
                for sock in trickle_socks:
                    try:
                        sock.send(text[position:position + 1])
                    except OSError:
                        pass
                stop.wait(1.0)

        thread = threading.Thread(target=trickler, daemon=True)
        thread.start()
        time.sleep(2.0)
        for _ in range(samples):
            latency = timed_request(url, timeout)
            loaded.append(latency)
            if latency is None:
                timeouts += 1
                if timeouts >= max_timeouts:
                    break
    finally:
        stop.set()
        for sock in idle_socks + trickle_socks:
            sock.close()
    done = [value for value in loaded if value is not None]
    ok = [value for value in baseline if value is not None]
    return {"idle_connections": idle, "trickling_connections": trickle, "timeout_s": timeout,
            "idle_server_ms": {"p50": ms(statistics.median(ok) if ok else None), "max": ms(max(ok) if ok else None),
                               "failed": len(baseline) - len(ok)},
            "with_slow_clients_ms": {"p50": ms(statistics.median(done) if done else None),
                                     "max": ms(max(done) if done else None), "completed": len(done),
                                     "timeouts": timeouts, "attempts": len(loaded)}}


# ----------------------------------------------------------------------------- compare

def machine():
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "load_average": os.getloadavg(), "python": platform.python_version(),
            "kernel": platform.release()}


def sha256(path):
    import hashlib
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def dash(value):
    return "-" if value is None else value


def markdown(report):
    rows = ["| binary | round | req/s | p50 ms | p99 ms | max ms | non-200 / errors | client CPU | server CPU |",
            "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for run in report["runs"]:
        load = run["load"]
        bad = {**load["non_200"], **load["errors"]}
        rows.append(f"| {run['label']} | {run['round']} | {load['requests_per_s']:.0f} | {load['latency_ms']['p50']} | "
                    f"{load['latency_ms']['p99']} | {load['latency_ms']['max']} | "
                    f"{', '.join(f'{k} {v}' for k, v in bad.items()) or '0'} | "
                    f"{load['client_cpu_cores']:.2f} | {load.get('server_cpu_cores', 0):.2f} |")
    slow = ["| binary | round | idle server p50 ms | with 1000 idle + 200 trickling: p50 ms | max ms | completed / tried |",
            "|---|---:|---:|---:|---:|---|"]
    for run in report["runs"]:
        s = run["slow"]
        loaded = s["with_slow_clients_ms"]
        timeouts = f" ({loaded['timeouts']} over {s['timeout_s']:.0f} s)" if loaded["timeouts"] else ""
        slow.append(f"| {run['label']} | {run['round']} | {dash(s['idle_server_ms']['p50'])} | "
                    f"{dash(loaded['p50'])} | {dash(loaded['max'])} | "
                    f"{loaded['completed']} / {loaded['attempts']}{timeouts} |")
    settings = report["settings"]
    head = (f"# HTTP front end: before vs after\n\n{report['machine']['cpu']}, {report['machine']['cores']} cores, "
            f"load average at start {', '.join(f'{x:.2f}' for x in report['machine']['load_average'])}; "
            f"{report['date']}.\n\n"
            f"Load: {settings['connections']} keep-alive connections, small /v1/completions (max_tokens "
            f"{settings['max_tokens'][0]}-{settings['max_tokens'][1]}, tiny random model, `--threads 1`), "
            f"{settings['duration']} s after {settings['warmup']} s warm-up, client on {settings['procs']} "
            f"process(es); CPU columns are cores used (CPU seconds / wall seconds).\n\n")
    return head + "\n".join(rows) + "\n\nSlow clients (a new connection per request):\n\n" + "\n".join(slow) + "\n"


def compare(args):
    binaries = [("before", args.before, args.before_args), ("after", args.after, args.after_args)]
    directory = tempfile.mkdtemp(prefix="loom-http-bench-")
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "settings": {"connections": args.connections, "duration": args.duration, "warmup": args.warmup,
                           "procs": args.procs, "max_tokens": args.max_tokens, "rounds": args.rounds,
                           "idle": args.idle, "trickle": args.trickle},
              "binaries": {label: {"path": os.path.abspath(path), "sha256": sha256(path), "extra_args": extra}
                           for label, path, extra in binaries},
              "runs": []}
    try:
        model_dir = make_model(args.after, directory)
        for round_index in range(args.rounds):
            order = binaries if round_index % 2 == 0 else binaries[::-1]
            for label, binary, extra in order:
                print(f"round {round_index + 1}: {label} ({binary})", flush=True)
                server = Server(binary, model_dir, extra.split() if extra else [])
                try:
                    load = run_load(server.url, args.connections, args.duration, args.warmup, args.procs,
                                    max_tokens=tuple(args.max_tokens), server=server)
                    print(f"  load: {load['requests_per_s']:.0f} req/s, p50 {load['latency_ms']['p50']} ms, "
                          f"p99 {load['latency_ms']['p99']} ms, errors {load['non_200']} {load['errors']}, "
                          f"client CPU {load['client_cpu_cores']:.2f}", flush=True)
                    slow = run_slow(server.url, args.idle, args.trickle, args.samples, args.timeout)
                    print(f"  slow clients: {slow}", flush=True)
                finally:
                    server.stop()
                report["runs"].append({"label": label, "round": round_index + 1, "load": load, "slow": slow})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, args.name + ".json"), "w") as file:
        json.dump(report, file, indent=2)
    text = markdown(report)
    with open(os.path.join(args.out_dir, args.name + ".md"), "w") as file:
        file.write(text)
    print(text)


# ----------------------------------------------------------------------------- CLI

def with_server(args, body):
    if args.url:
        return body(args.url, None)
    directory = tempfile.mkdtemp(prefix="loom-http-bench-")
    try:
        server = Server(args.binary, make_model(args.binary, directory), args.server_args.split())
        try:
            return body(server.url, server)
        finally:
            server.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    def load_options(sub):
        sub.add_argument("--connections", type=int, default=256)
        sub.add_argument("--duration", type=float, default=20.0, help="measured seconds")
        sub.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
        sub.add_argument("--procs", type=int, default=1, help="client processes")
        sub.add_argument("--max-tokens", type=int, nargs=2, default=[1, 4], metavar=("LOW", "HIGH"))

    def slow_options(sub):
        sub.add_argument("--idle", type=int, default=1000)
        sub.add_argument("--trickle", type=int, default=200)
        sub.add_argument("--samples", type=int, default=10)
        sub.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take")

    for name, options in (("load", load_options), ("slow", slow_options)):
        sub = commands.add_parser(name)
        target = sub.add_mutually_exclusive_group(required=True)
        target.add_argument("--url", help="a server already running (model name 'tiny' or its default)")
        target.add_argument("--binary", help="start `BINARY serve` on a tiny random model")
        sub.add_argument("--server-args", default="", help="extra `serve` flags with --binary")
        sub.add_argument("--json", help="also write the result here")
        options(sub)
    sub = commands.add_parser("compare")
    sub.add_argument("--before", required=True)
    sub.add_argument("--after", required=True)
    sub.add_argument("--before-args", default="", help="extra `serve` flags of the before binary")
    sub.add_argument("--after-args", default="", help="extra `serve` flags of the after binary")
    sub.add_argument("--rounds", type=int, default=2, help="rounds; the order alternates")
    sub.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    sub.add_argument("--name", default="compare")
    load_options(sub)
    slow_options(sub)
    args = parser.parse_args()

    if args.command == "compare":
        compare(args)
        return
    if args.command == "load":
        result = with_server(args, lambda url, server: run_load(url, args.connections, args.duration, args.warmup,
                                                                args.procs, max_tokens=tuple(args.max_tokens),
                                                                server=server))
    else:
        result = with_server(args, lambda url, server: run_slow(url, args.idle, args.trickle, args.samples,
                                                                args.timeout))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as file:
            file.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
