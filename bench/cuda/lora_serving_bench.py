#!/usr/bin/env python3
"""Output tokens/s of a running `loom serve` under N concurrent completions
spread round-robin over the given models (issue 14: multi-LoRA in serving).
Stdlib only. Each stream sends one /v1/completions of --prompt-tokens random
token ids (distinct per stream) with --output-tokens forced by ignore_eos,
greedy; all streams start together. A first burst warms up (adapters bound,
buffers grown, graphs captured); the next --bursts are measured:
tok/s = completion tokens / the burst's wall time.

  python3 bench/cuda/lora_serving_bench.py --url http://127.0.0.1:8123 \\
      --models agent0,agent1 --streams 64 --out result.json --label lora
"""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse


def complete(url, body):
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data}")
        return data["usage"]["completion_tokens"]
    finally:
        connection.close()


def burst(url, models, streams, prompt_tokens, output_tokens, seed, extra_body=None):
    rng = random.Random(seed)
    bodies = [{"model": models[i % len(models)], "prompt": [rng.randrange(300, 20000) for _ in range(prompt_tokens)],
               "max_tokens": output_tokens, "ignore_eos": True, "temperature": 0, **(extra_body or {})}
              for i in range(streams)]
    tokens = [0] * streams
    errors = []

    def run(i):
        try:
            tokens[i] = complete(url, bodies[i])
        except Exception as error:  # reported, not fatal: the figure says how many failed
            errors.append(str(error))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    return {"wall_s": wall, "completion_tokens": sum(tokens), "tokens_per_s": sum(tokens) / wall,
            "errors": len(errors), "first_error": errors[0] if errors else None}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--models", required=True, help="comma-separated model names, used round-robin")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--bursts", type=int, default=2)
    p.add_argument("--label", default="")
    p.add_argument("--extra-body", default="{}", help="JSON fields added to every request (e.g. structured outputs)")
    p.add_argument("--out", help="append one JSON line here")
    args = p.parse_args()
    models = args.models.split(",")
    extra = json.loads(args.extra_body)
    burst(args.url, models, args.streams, args.prompt_tokens, 32, seed=-1, extra_body=extra)  # warm-up
    runs = [burst(args.url, models, args.streams, args.prompt_tokens, args.output_tokens, seed=b, extra_body=extra)
            for b in range(args.bursts)]
    result = {"label": args.label, "models": models, "streams": args.streams, "prompt_tokens": args.prompt_tokens,
              "output_tokens": args.output_tokens, "runs": runs,
              "extra_body": extra, "tokens_per_s_best": max(r["tokens_per_s"] for r in runs)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as file:
            file.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
