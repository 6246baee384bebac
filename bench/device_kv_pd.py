#!/usr/bin/env python3
"""Time to first token of one long prompt through prefill/decode disaggregation
(issue 41): one `--role both` engine against `loom router` over a prefill
engine (PE) and a decode engine (DE) whose KV moves device to device
(--kv-device-plane cuda-ipc: layer by layer into the DE's GPU pools while the
PE prefills), and over the same PE with a DE on the staged path (plane none:
PE device -> host -> KV link -> DE host -> device, after the prefill).
Every prompt is fresh random tokens (no cache hit anywhere); each figure is
the median of --repeat streamed requests (max_tokens --gen, greedy), and the
outputs of the three are compared; the decode engine's transfer histograms give the
device path's TTFT in parts. With --kill, a last prompt goes through
the device path and the PE is killed (SIGKILL) a fraction of a one-engine
TTFT after it was sent: the figure is how long the client waits for its
answer (the router cancels the reservation, the DE recomputes) and whether
the DE's pool got every block back (no orphaned or quarantined blocks).
Standard library only (runs on the GPU machine as is).

  bench/device_kv_pd.py --loom build/loom --model random:llama-8b --pe-device cuda:0 --de-device cuda:1 \
      --prompt-tokens 32768 --out device_kv_pd.json
"""
import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dualpath_replay import call, free_port, metrics, start, stop, stream_completion  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom", required=True)
    parser.add_argument("--model", default="random:llama-8b")
    parser.add_argument("--pe-device", default="cuda:0")
    parser.add_argument("--de-device", default="cuda:1")
    parser.add_argument("--prompt-tokens", type=int, default=32768)
    parser.add_argument("--gen", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=30000)
    parser.add_argument("--engine-args", default="--kv-cache-bytes 24G --max-batch-tokens 8192")
    parser.add_argument("--kv-buffer-bytes", default="8G")
    parser.add_argument("--plane", default="cuda-ipc", help="the device plane (socket: CPU engines, to try the script)")
    parser.add_argument("--kill", action="store_true")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="loom-pd-")
    os.makedirs(workdir, exist_ok=True)
    engine = [args.loom, "serve", "--model", args.model, "--served-model-name", "bench", *args.engine_args.split()]
    role = ["--kv-buffer-bytes", args.kv_buffer_bytes]
    ports = {name: free_port() for name in ("both", "pe", "de", "de_staged", "router", "router_staged")}
    processes = {}

    def launch(name, command):
        processes[name] = start(command, ports[name], os.path.join(workdir, name + ".log"))

    try:
        launch("both", [*engine, "--role", "both", "--device", args.pe_device, "--port", str(ports["both"])])
        launch("pe", [*engine, *role, "--role", "prefill", "--device", args.pe_device, "--port", str(ports["pe"]),
                      "--kv-device-plane", args.plane])
        launch("de", [*engine, *role, "--role", "decode", "--device", args.de_device, "--port", str(ports["de"]),
                      "--kv-device-plane", args.plane])
        launch("de_staged", [*engine, *role, "--role", "decode", "--device", args.de_device,
                             "--port", str(ports["de_staged"]), "--kv-device-plane", "none"])
        pe_url = f"http://127.0.0.1:{ports['pe']}"
        for router, decode in (("router", "de"), ("router_staged", "de_staged")):
            launch(router, [args.loom, "router", "--port", str(ports[router]), "--prefill", pe_url,
                            "--decode", f"http://127.0.0.1:{ports[decode]}"])
        rng = random.Random(41)

        def prompt():
            return [rng.randrange(100, args.vocab) for _ in range(args.prompt_tokens)]

        def ask(target, tokens):
            body = {"model": "bench", "prompt": tokens, "max_tokens": args.gen, "temperature": 0.0, "ignore_eos": True}
            _, ttft, _ = stream_completion(ports[target], body)
            return ttft

        ask("both", prompt()[:2048])  # warm-up: graphs, allocations
        ask("router", prompt()[:2048])
        ask("router_staged", prompt()[:2048])
        results = {"prompt_tokens": args.prompt_tokens, "model": args.model, "pe_device": args.pe_device,
                   "de_device": args.de_device, "runs": {}}
        def timers():  # the DE's device-transfer histograms (sum, count)
            m = metrics(ports["de"])
            return {name: (m.get(name + "_sum", 0.0), m.get(name + "_count", 0.0))
                    for name in ("loom_kv_device_transfer_seconds", "loom_kv_device_wait_seconds")}

        before = timers()
        for target in ("both", "router", "router_staged"):
            ttfts = [ask(target, prompt()) for _ in range(args.repeat)]
            results["runs"][target] = {"ttft_median": statistics.median(ttfts), "ttfts": ttfts}
            print(target, "TTFT median %.3f s" % statistics.median(ttfts), ["%.3f" % t for t in ttfts], flush=True)
        after = timers()
        # The device path's TTFT in parts (means over its timed requests): the DE's reservation to every layer
        # landed (the PE's queueing, prefill and copies), and the DE request's wait for it; the rest of the TTFT
        # is the DE's commit, first step and the router's relay.
        results["device_breakdown"] = {
            name.replace("loom_kv_device_", "").replace("_seconds", "_mean_s"):
                (after[name][0] - before[name][0]) / max(1.0, after[name][1] - before[name][1])
            for name in after}
        print("device path breakdown:", results["device_breakdown"], flush=True)
        # The same prompt through each: greedy outputs compared.
        same = prompt()
        texts = {}
        for target in ("both", "router", "router_staged"):
            reply = json.loads(call(ports[target], "POST", "/v1/completions",
                                    {"model": "bench", "prompt": same, "max_tokens": 8, "temperature": 0.0,
                                     "ignore_eos": True}))
            texts[target] = reply["choices"][0]["text"]
        results["outputs_equal"] = {"device_vs_one_engine": texts["router"] == texts["both"],
                                    "staged_vs_one_engine": texts["router_staged"] == texts["both"],
                                    "device_vs_staged": texts["router"] == texts["router_staged"]}
        print("outputs equal:", results["outputs_equal"], flush=True)
        de = metrics(ports["de"])
        results["de_metrics"] = {k: v for k, v in de.items() if k.startswith("loom_kv_device") or
                                 k.startswith("loom_kv_cache_blocks")}
        router = metrics(ports["router"])
        results["router_paths"] = {k: v for k, v in router.items() if k.startswith("loom_router_kv_path")}
        if args.kill:
            import threading
            tokens = prompt()
            delay = 0.3 * results["runs"]["both"]["ttft_median"]
            outcome = {}

            def client():
                started = time.time()
                try:
                    outcome["ttft"] = ask("router", tokens)
                except Exception as error:  # noqa: BLE001: reported
                    outcome["error"] = str(error)
                outcome["seconds"] = time.time() - started

            thread = threading.Thread(target=client)
            thread.start()
            time.sleep(delay)
            processes["pe"].send_signal(signal.SIGKILL)
            thread.join(timeout=300)
            time.sleep(2)
            after = metrics(ports["de"])
            outcome["killed_after_seconds"] = delay
            outcome["de_metrics"] = {k: v for k, v in after.items() if k.startswith("loom_kv_device") or
                                     k.startswith("loom_kv_cache_blocks")}
            outcome["answered"] = "ttft" in outcome
            outcome["pool_clean"] = (outcome["de_metrics"].get('loom_kv_cache_blocks{state="in_use"}') == 0 and
                                     outcome["de_metrics"].get("loom_kv_device_quarantined_blocks") == 0)
            results["kill"] = outcome
            print("kill:", json.dumps(outcome), flush=True)
        if args.out:
            with open(args.out, "w") as out:
                json.dump(results, out, indent=2)
    finally:
        for process in processes.values():
            stop(process)


if __name__ == "__main__":
    main()
