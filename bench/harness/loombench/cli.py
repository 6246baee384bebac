"""`loom bench WORKLOAD [options] [loom serve flags]`: argument parsing and
the run over configurations. Flags it does not know go to every `loom serve`
it launches (so `--threads 2 --kv-cache-bytes 64000000` work as in serve)."""
import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict

from . import configs as configs_module
from . import plots, report, workloads
from .arrivals import make_plan
from .server import LaunchedServer
from .text import TextSource
from .workflow import Models, TaskContext, run_offline

EPILOG = """examples:
  loom bench react --make-model 8 --compare sharing=isolated,forked --out /tmp/react
  loom bench sequential --model DIR --compare eviction=lru,workflow --compare workflows=8,32 --out /tmp/seq
  loom bench pipeline --make-model 5 --compare prompt_tokens=128,256,512 --out /tmp/pipe
  loom bench reflexion-skewed --url http://127.0.0.1:8000 --rate 0.5 --num-tasks 128 --out /tmp/refl
Other flags are passed to every `loom serve` the harness launches."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loom bench", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=sorted(workloads.WORKLOADS))
    g = p.add_argument_group("servers")
    g.add_argument("--url", help="benchmark this running server instead of launching one per configuration")
    g.add_argument("--api-key", default="", help="Bearer key for --url")
    g.add_argument("--loom-binary", default=os.environ.get("LOOM_BINARY", ""), help="`loom` to launch (set by `loom bench`)")
    g.add_argument("--model", help="passed to `loom serve --model` (default: the built-in model)")
    g.add_argument("--lora", action="append", default=[], metavar="NAME=PATH[:MODE]",
                   help="passed to `loom serve` (repeatable); default: every adapter under MODEL/adapters")
    g.add_argument("--make-model", type=int, metavar="N",
                   help="first write a tiny random llama model with N adapters into OUT/model and serve it")
    g.add_argument("--make-model-args", default="--arch llama --preset tiny",
                   help="`loom make-model` flags for --make-model (default: %(default)s)")
    g.add_argument("--compare", action="append", default=[], metavar="KEY=V1,V2",
                   help="one configuration per value (several: their product); keys: sharing, eviction, "
                        "cache (lru, lru+host[+disk], workflow, workflow+host[+disk], workflow+prefetch[+disk]), serve.FLAG, workflows, rate, num_tasks, any workload parameter")
    g.add_argument("--host-kv-memory", default="2G",
                   help="host tier size of the +host cache presets (--compare cache=...; default %(default)s)")
    g.add_argument("--startup-timeout", type=float, default=300.0)
    a = p.add_argument_group("arrivals")
    a.add_argument("--num-tasks", type=int, default=8, help="measured tasks per configuration (ICaRus: 128)")
    a.add_argument("--concurrency", "--workflows", type=int, default=4, dest="concurrency",
                   help="closed loop: tasks in flight (= concurrent workflows); open loop: workflow copies")
    a.add_argument("--rate", type=float, help="open loop: Poisson arrivals of tasks per second")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--warmup-requests", type=int, default=1, help="short requests per model before measuring")
    a.add_argument("--warmup-tasks", type=int, default=0, help="unmeasured tasks (other seeds) before measuring")
    a.add_argument("--steady-state", action="store_true",
                   help="warm-up tasks use the measured seed (the same contexts and fixed prompts per workflow "
                        "copy, other task inputs), so the measured tasks see a warm cache, as KVFlow measures; "
                        "two warm-up tasks per workflow reach the steady state (the server takes an agent's first "
                        "prompt as its fixed prefix and detects the real one from the second)")
    w = p.add_argument_group("workload (defaults per workload: see bench/README.md)")
    w.add_argument("--agents", type=int)
    w.add_argument("--context-tokens", "--prompt-tokens", "--fixed-tokens", type=int, dest="context_tokens")
    w.add_argument("--instruction-tokens", "--dynamic-tokens", type=int, dest="instruction_tokens")
    w.add_argument("--output-tokens", "--gen-tokens", type=int, dest="output_tokens")
    w.add_argument("--observation-tokens", type=int, default=100)
    w.add_argument("--tool-latency", type=float, default=0.1, dest="tool_latency_s")
    w.add_argument("--loops", type=int, default=2)
    w.add_argument("--trials", type=int, default=2)
    w.add_argument("--eval-tokens", type=int, default=16)
    w.add_argument("--final-tokens", type=int, default=64)
    w.add_argument("--pipeline-adapters", type=int, default=5)
    w.add_argument("--num-contexts", type=int, default=1)
    w.add_argument("--same-adapters", action="store_true",
                   help="react/mapreduce: every workflow copy uses the same adapters")
    w.add_argument("--invocation", choices=["round-robin", "skewed"], default="round-robin")
    w.add_argument("--skew-probability", type=float, default=0.5)
    w.add_argument("--agent-models", choices=["auto", "base", "adapters"], default="auto")
    w.add_argument("--reducer", choices=["adapter", "base"], default="adapter")
    w.add_argument("--share-fixed", action="store_true", help="sequential, peer: copies share fixed prompts")
    w.add_argument("--invocation-text", default="", help="pipeline: text before each adapter's answer (aLoRA)")
    w.add_argument("--context-file", help="static contexts from this text file (default: synthesised)")
    w.add_argument("--steps", type=float, help="react-hotpotqa / reflexion-hotpotqa: mean thought/action steps "
                   "per episode (default: bench/harness/loombench/shapes.py)")
    w.add_argument("--max-steps", type=int, help="react-hotpotqa / reflexion-hotpotqa: the step limit")
    r = p.add_argument_group("requests and output")
    r.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    r.add_argument("--synthetic-outputs", action="store_true",
                   help="feed later prompts random words of each output's token count instead of its text "
                        "(random-weight models: their outputs re-tokenize to ~10x their length)")
    r.add_argument("--no-workflow-hints", dest="workflow_hints", action="store_false",
                   help="do not send `workflow`/`agent` request fields")
    r.add_argument("--declare-workflows", action="store_true",
                   help="PUT /v1/workflows/{id} with each copy's agent graph before measuring")
    r.add_argument("--sample-interval", type=float, default=0.25, help="seconds between /metrics samples")
    r.add_argument("--request-timeout", type=float, default=600.0)
    r.add_argument("--time-limit", type=float, default=0.0, metavar="S",
                   help="end the warm-up tasks and the measured phase after S seconds each (0 = none): tasks not "
                        "started are dropped, running ones are cancelled; throughput counts what finished inside "
                        "the window (metrics.truncated says whether the window ended the run)")
    r.add_argument("--warmup-time-limit", type=float, default=None, metavar="S",
                   help="the warm-up tasks' window instead of --time-limit's (0 = none): a short warm-up before a "
                        "long measured window")
    r.add_argument("--out", help="output directory (default: loom-bench-WORKLOAD)")
    r.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    r.add_argument("--dry-run", action="store_true", help="print the first task's calls and exit (no server)")
    r.add_argument("--replot", action="store_true", help="rewrite report.md and plots from OUT/report.json")
    return p


def params_from(args) -> workloads.Params:
    return workloads.Params(
        agents=args.agents, context_tokens=args.context_tokens, instruction_tokens=args.instruction_tokens,
        output_tokens=args.output_tokens, observation_tokens=args.observation_tokens,
        tool_latency_s=args.tool_latency_s, loops=args.loops, trials=args.trials, eval_tokens=args.eval_tokens,
        final_tokens=args.final_tokens, pipeline_adapters=args.pipeline_adapters, num_contexts=args.num_contexts,
        distinct_adapters=not args.same_adapters, invocation=args.invocation,
        skew_probability=args.skew_probability, agent_models=args.agent_models, reducer=args.reducer,
        share_fixed=args.share_fixed, invocation_text=args.invocation_text, steps=args.steps,
        max_steps=args.max_steps)


def find_loom(args) -> str:
    if args.loom_binary:
        return args.loom_binary
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for candidate in (shutil.which("loom"), os.path.join(root, "build", "loom")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise SystemExit("loom bench: cannot find the `loom` binary; run it as `loom bench` or give --loom-binary")


def make_model(args, out_dir: str) -> None:
    """--make-model N: writes OUT/model and points --model/--lora at it."""
    model_dir = os.path.join(out_dir, "model")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        command = [find_loom(args), "make-model", *shlex.split(args.make_model_args), "--adapters",
                   str(args.make_model), "--out", model_dir]
        print("loom bench:", " ".join(command), flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    args.model = model_dir


def default_loras(model: str) -> list:
    """NAME=PATH for every adapter directory under MODEL/adapters."""
    adapters = os.path.join(model, "adapters") if model and os.path.isdir(model) else ""
    if not adapters or not os.path.isdir(adapters):
        return []
    return [f"{name}={os.path.join(adapters, name)}" for name in sorted(os.listdir(adapters))
            if os.path.isfile(os.path.join(adapters, name, "adapter_config.json"))]


def dry_run(args, params: workloads.Params) -> int:
    config = configs_module.build(args.workload, args.compare, [], ["a=/x"] if args.compare else [], params,
                                  configs_module.Arrivals(args.num_tasks, args.concurrency, args.rate))[0]
    models = Models("base", [f"adapter{i}" for i in range(8)])
    text = TextSource.from_file(args.context_file) if args.context_file else TextSource()
    task = workloads.make_task(args.workload, TaskContext(0, 0, args.seed), models, text, config.params)
    for number, stage in enumerate(run_offline(task, reply="<output>")):
        for call in stage.calls:
            print(f"stage {number} (+{stage.delay_s:.2f}s) {call.phase:<10} {call.model:<10} {call.agent:<12} "
                  f"max_tokens={call.max_tokens:<4} prompt_words={len(call.prompt.split())}")
    print("params:", json.dumps(asdict(config.params)))
    plan = make_plan(args.num_tasks, args.concurrency, args.rate, args.seed)
    print("arrivals:", "closed loop" if plan.is_closed_loop else f"offsets {[round(x, 2) for x in plan.offsets_s]}")
    return 0


def main(argv=None) -> int:
    args, serve_args = parser().parse_known_args(argv)
    out_dir = args.out or f"loom-bench-{args.workload}"
    if args.replot:
        with open(os.path.join(out_dir, "report.json")) as file:
            saved = json.load(file)
        for path in report.write(out_dir, saved) + plots.write(out_dir, saved):
            print("wrote", path)
        return 0
    params = params_from(args)
    if args.dry_run:
        return dry_run(args, params)
    if args.url and (serve_args or args.model or args.lora or args.make_model):
        raise SystemExit(f"loom bench: --url benchmarks a running server; server flags make no sense with it: "
                         f"{' '.join(serve_args) or '--model/--lora/--make-model'}")
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise SystemExit(f"loom bench: {sys.executable} lacks httpx: pip install -r scripts/python-requirements.txt "
                         "(or point LOOM_PYTHON at a python that has it)")
    os.makedirs(out_dir, exist_ok=True)
    if args.make_model:
        make_model(args, out_dir)
    loras = args.lora or default_loras(args.model)
    base_serve_args = (["--model", args.model] if args.model else []) + serve_args
    arrivals = configs_module.Arrivals(args.num_tasks, args.concurrency, args.rate)
    try:
        configs = configs_module.build(args.workload, args.compare, base_serve_args, [] if args.url else loras,
                                       params, arrivals, args.host_kv_memory)
    except ValueError as error:
        raise SystemExit(f"loom bench: {error}")
    if args.url and any(c.needs_own_server for c in configs):
        raise SystemExit("loom bench: --compare of server settings (sharing, eviction, serve.*) needs launched "
                         "servers, not --url")
    text = TextSource.from_file(args.context_file) if args.context_file else TextSource()
    args.calibrate = True
    result = {"workload": args.workload, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
              "command": "loom bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
                                                  if a != args.loom_binary and a != "--loom-binary"),
              "loadavg_before": [round(x, 2) for x in os.getloadavg()], "configs": []}
    for number, config in enumerate(configs):
        print(f"[{number + 1}/{len(configs)}] {args.workload} {config.name}", flush=True)
        entry = {"name": config.name, "compare": config.compare}
        server = None
        try:
            if args.url:
                url = args.url
            else:
                log_path = os.path.join(out_dir, f"server-{number}.log")
                server = LaunchedServer(find_loom(args), config.serve_args, log_path, args.startup_timeout)
                url = server.url
                entry["serve_args"] = config.serve_args
            entry.update(asyncio.run(configs_module_run(url, args, config, text)))
            m = entry["metrics"]
            print(f"    tasks/s {m['tasks_per_s'] or 0:.3f}  out tok/s {m['output_tokens_per_s'] or 0:.1f}  "
                  f"TTFT p50 {m['ttft_p50_s'] or 0:.3f}s p95 {m['ttft_p95_s'] or 0:.3f}s  "
                  f"hit {m['prefix_hit_rate'] if m['prefix_hit_rate'] is not None else float('nan'):.1%}  "
                  f"failed calls {m['num_failed_calls']}", flush=True)
        except Exception as error:  # one configuration failing (e.g. a mode not built yet) must not lose the rest
            entry["error"] = f"{type(error).__name__}: {error}"
            print(f"    failed: {entry['error']}", flush=True)
        finally:
            if server is not None:
                entry["server_exit_status"] = server.stop()
        result["configs"].append(entry)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    paths = report.write(out_dir, result) + (plots.write(out_dir, result) if args.plots else [])
    print(report.markdown(result))
    for path in paths:
        print("wrote", path)
    return 0 if all("metrics" in c for c in result["configs"]) else 1


async def configs_module_run(url, args, config, text):
    from .runner import run_config  # imports httpx
    return await run_config(url, args.api_key, args.workload, config, text, args)
