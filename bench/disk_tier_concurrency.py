#!/usr/bin/env python3
"""How many of N concurrent requests whose prefixes sit on the disk tier are served from it (issue 18's
finding, for the disk tier's scheduling): one `loom serve` with a disk tier and a host tier smaller than
the reads, N prefixes prefilled once (written through), then N concurrent continuations. Prints each
request's cached prompt tokens and the tokens read from disk vs loaded host -> device. Standard library only.

  bench/disk_tier_concurrency.py --loom build/loom --model /tmp/tiny \
      --serve-args "--kv-cache-bytes 6M --host-kv-memory 8M --threads 1" --requests 24 --prefix 3000

On 2026-11-27 (CPU box, tiny model, the arguments above), before the disk tier's reservations: 2-4 of 24 hit
although ~120K tokens were read from disk (~6K loaded host -> device; 2.7 s wall); with --max-num-seqs 2
added, 21 of 24. After (blocks read for a waiting request are reserved until it is admitted, reads follow a
host budget in arrival order, a request waits for its read or for device room instead of recomputing):
22-23 of 24 hit (the rest partly, 1424 tokens), ~60K tokens read and as many loaded, 0.42-0.47 s wall;
with --max-num-seqs 2, 23 of 24.
"""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dualpath_replay as replay  # noqa: E402  (its process and HTTP helpers)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom", default="build/loom")
    parser.add_argument("--model", required=True)
    parser.add_argument("--serve-args", default="--kv-cache-bytes 6M --host-kv-memory 8M --threads 1")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--prefix", type=int, default=3000)
    parser.add_argument("--append", type=int, default=40)
    parser.add_argument("--vocab", type=int, default=500)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="loom-disk-concurrency-")
    port = replay.free_port()
    server = replay.start([args.loom, "serve", "--model", args.model, "--served-model-name", "bench", "--port",
                           str(port), "--disk-kv-path", os.path.join(workdir, "disk"), "--disk-kv-bytes", "4G",
                           *args.serve_args.split()], port, os.path.join(workdir, "serve.log"))
    try:
        rng = random.Random(1)
        prefixes = [[rng.randrange(10, args.vocab) for _ in range(args.prefix)] for _ in range(args.requests)]

        def complete(prompt, out=None):
            started = time.time()
            body = {"model": "bench", "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
            response = json.loads(replay.call(port, "POST", "/v1/completions", body))
            if out is not None:
                out.append({"cached": response["usage"]["prompt_tokens_details"]["cached_tokens"],
                            "seconds": round(time.time() - started, 3)})

        for prefix in prefixes:
            complete(prefix)
        time.sleep(3)
        before = replay.metrics(port)
        results = []
        threads = [threading.Thread(target=complete, args=(prefix + [rng.randrange(10, args.vocab)
                                                                     for _ in range(args.append)], results))
                   for prefix in prefixes]
        started = time.time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = replay.metrics(port)
        hits = sum(1 for result in results if result["cached"] >= args.prefix - 16)
        print(json.dumps({
            "requests": args.requests, "served_from_cache": hits, "wall_seconds": round(time.time() - started, 3),
            "cached_tokens": sorted(result["cached"] for result in results),
            "disk_read_tokens": after["loom_disk_kv_loaded_tokens_total"] - before["loom_disk_kv_loaded_tokens_total"],
            "host_to_device_tokens": after["loom_loaded_tokens_total"] - before["loom_loaded_tokens_total"],
        }, indent=2))
    finally:
        replay.stop(server)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
