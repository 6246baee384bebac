"""Runs one configuration against one server: warm-up, a /metrics scrape,
the measured tasks (closed loop or Poisson), a second scrape, and the metrics
of report.json."""
import asyncio
import random
import time
from dataclasses import asdict
from typing import Dict, List, Optional

from . import arrivals, prometheus, stats
from .client import CallResult, Client
from .configs import Config
from .text import WORDS, TextSource
from .workflow import Models, TaskContext
from . import workloads


class Sampler:
    """Polls /metrics every interval_s while the measured phase runs (gauges
    such as KV bytes and running requests have no history in Prometheus; each
    sample also keeps its time `t` and the server's generated-token counter).
    `client` should be a client of its own: probes behind hundreds of queued
    calls in one connection pool would arrive late."""

    def __init__(self, client: Client, interval_s: float):
        self.client = client
        self.interval_s = interval_s
        self.samples: List[Dict[str, float]] = []
        self._task: Optional[asyncio.Task] = None

    async def _loop(self):
        while True:
            try:
                scrape = prometheus.parse(await self.client.get_text("/metrics"))
                self.samples.append(dict(gauges(scrape), t=time.perf_counter()))
            except Exception:  # a missed sample is not worth failing the run
                pass
            await asyncio.sleep(self.interval_s)

    def start(self):
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self):
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


def gauges(scrape: prometheus.Samples) -> Dict[str, float]:
    """The gauges one sample keeps (absent ones as 0)."""
    def get(name: str, **labels: str) -> float:
        return prometheus.value(scrape, name, **labels) or 0.0
    return {"running": get("loom_num_requests_running"), "waiting": get("loom_num_requests_waiting"),
            "kv_bytes_device": get("loom_kv_cache_bytes", tier="device"),
            "kv_bytes_base": get("loom_kv_cache_bytes", tier="device", kind="base"),
            "kv_bytes_residual": get("loom_kv_cache_bytes", tier="device", kind="residual"),
            "blocks_in_use": get("loom_kv_cache_blocks", state="in_use"),
            "blocks_cached": get("loom_kv_cache_blocks", state="cached"),
            "residual_blocks_in_use": get("loom_residual_kv_cache_blocks", state="in_use"),
            "residual_blocks_cached": get("loom_residual_kv_cache_blocks", state="cached"),
            "generated_tokens": get("loom_generation_tokens_total")}


def server_output_rate(samples: List[Dict[str, float]], window: Optional[tuple]) -> Optional[float]:
    """Tokens/s the server generated between the first and last sample inside
    `window` (start, end; None = every sample): every token the server made,
    whichever call it was for, so a window shorter than a call still shows the
    server's pace where calls_per_s counts only the calls that ended in it."""
    inside = [s for s in samples if "t" in s and (window is None or window[0] <= s["t"] <= window[1])]
    if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
        return None
    return (inside[-1]["generated_tokens"] - inside[0]["generated_tokens"]) / (inside[-1]["t"] - inside[0]["t"])


def _in_use_share(in_use: float, cached: float) -> float:
    held = in_use + cached
    return in_use / held if held > 0 else 1.0


def kv_bytes_per_agent(samples: List[Dict[str, float]]) -> Optional[float]:
    """Mean over samples with requests running of (device KV bytes held for
    running requests) / (requests running). Held bytes include cached blocks;
    each pool's (base, forked residual) in-use share is its bytes x in_use /
    (in_use + cached) blocks. Shared blocks count once, so sharing modes show
    up as fewer bytes per agent (ForkKV Fig. 14a)."""
    values = []
    for sample in samples:
        if sample["running"] <= 0:
            continue
        base = sample.get("kv_bytes_base", sample["kv_bytes_device"] - sample.get("kv_bytes_residual", 0.0))
        in_use = base * _in_use_share(sample["blocks_in_use"], sample["blocks_cached"])
        in_use += sample.get("kv_bytes_residual", 0.0) * _in_use_share(sample.get("residual_blocks_in_use", 0.0),
                                                                       sample.get("residual_blocks_cached", 0.0))
        values.append(in_use / sample["running"])
    return stats.mean(values)


async def calibrate(client: Client, models: Models, text: TextSource, num_words: int = 400) -> float:
    """Tokens per word of the server's tokenizer on text like the prompts'."""
    if text.context_words is not None:
        sample = " ".join(text.context_words[:num_words])
        num_words = min(num_words, len(text.context_words))
    else:
        import random
        rng = random.Random("calibration")
        sample = " ".join(rng.choice(WORDS) for _ in range(num_words))
    with_text = await client.prompt_tokens(models.base, "x\n" + sample)
    without = await client.prompt_tokens(models.base, "x")
    return max(0.05, (with_text - without) / num_words)


async def fetch_models(client: Client) -> Models:
    data = (await client.get_json("/v1/models"))["data"]
    base = [m["id"] for m in data if not m.get("parent")]
    adapters = [m["id"] for m in data if m.get("parent")]
    if not base:
        raise RuntimeError("/v1/models lists no base model (an entry without 'parent')")
    return Models(base=base[0], adapters=adapters)


def replies(done: List[CallResult], text: TextSource, stand_ins: Optional[random.Random]) -> List[str]:
    """What the task sees of its calls' outputs: their texts, or with
    stand_ins (--synthetic-outputs) random words of each output's token count.
    A random-weight model's outputs are mostly filler tokens whose text
    re-tokenizes to ~10x their length, so fed back they would swamp the
    workload's sizes."""
    if stand_ins is None:
        return [r.text for r in done]
    return [text.random_words(stand_ins, r.output_tokens) for r in done]


async def run_task(client: Client, workload: str, ctx: TaskContext, models: Models, text: TextSource,
                   params: workloads.Params, synthetic_outputs: bool = False, record: Optional[dict] = None) -> dict:
    """Runs one task to the end, or to its first failed call. `record` (a
    fresh dict by default) is filled as the task goes, so a task cancelled by
    --time-limit leaves its finished calls there (end_s stays None)."""
    start = time.perf_counter()
    record = {} if record is None else record
    record.update({"index": ctx.task_index, "copy": ctx.copy_index, "start_s": start, "end_s": None, "calls": [],
                   "error": None})
    task = workloads.make_task(workload, ctx, models, text, params)
    stand_ins = random.Random(f"outputs-{ctx.seed}-{ctx.task_index}") if synthetic_outputs else None
    results: List[CallResult] = record["calls"]
    try:
        stage = next(task)
        while True:
            if stage.delay_s > 0:
                await asyncio.sleep(stage.delay_s)
            done = await asyncio.gather(*(client.complete(call, f"{workload}-{ctx.workflow_id}")
                                          for call in stage.calls))
            results.extend(done)
            failed = [r for r in done if r.error]
            if failed:
                record["error"] = failed[0].error
                task.close()
                break
            stage = task.send(replies(done, text, stand_ins))
    except StopIteration:
        pass
    record["end_s"] = time.perf_counter()
    return record


async def run_tasks(client: Client, workload: str, config: Config, models: Models, text: TextSource,
                    seed: int, task_offset: int = 0, num_tasks: Optional[int] = None,
                    synthetic_outputs: bool = False, time_limit_s: float = 0.0) -> List[dict]:
    """Runs the tasks of `config`'s arrival plan. With time_limit_s > 0 the
    run ends that many seconds after it began: tasks not started are dropped,
    running ones cancelled (their records keep end_s None and the calls that
    finished); the returned records then carry "window_s"."""
    a = config.arrivals
    num_tasks = num_tasks or a.num_tasks
    plan = arrivals.make_plan(num_tasks, a.concurrency, a.rate, seed)
    records: List[dict] = []

    def ctx(index: int, copy: int) -> TaskContext:
        return TaskContext(task_index=task_offset + index, copy_index=copy, seed=seed)

    def new_record() -> dict:
        record: dict = {}
        records.append(record)
        return record

    began = time.perf_counter()
    if plan.is_closed_loop:
        async def slot_worker(slot: int, indices: List[int]) -> None:
            for i in indices:
                await run_task(client, workload, ctx(i, slot), models, text, config.params, synthetic_outputs,
                               new_record())
        everything = asyncio.gather(*(slot_worker(slot, indices) for slot, indices in
                                      enumerate(arrivals.closed_loop_assignment(num_tasks, plan.concurrency))))
    else:
        async def delayed(index: int, offset: float) -> None:
            await asyncio.sleep(max(0.0, began + offset - time.perf_counter()))
            await run_task(client, workload, ctx(index, index % plan.concurrency), models, text, config.params,
                           synthetic_outputs, new_record())
        everything = asyncio.gather(*(delayed(i, off) for i, off in enumerate(plan.offsets_s)))
    truncated = False
    if time_limit_s > 0:
        try:
            await asyncio.wait_for(everything, timeout=time_limit_s)
        except asyncio.TimeoutError:
            truncated = True
    else:
        await everything
    records = [r for r in records if "start_s" in r]
    records.sort(key=lambda r: r["index"])
    if truncated:
        for record in records:
            record["window_s"] = time_limit_s
            record["window_start_s"] = began
    return records


async def warm_up(client: Client, models: Models, num_requests: int):
    """Short distinct prompts to every model: loads adapters into slots, starts thread pools."""
    from .workflow import Call
    calls = [Call(model, "warmup", f"Warm-up {model} {i}: hello there", 4)
             for model in [models.base, *models.adapters] for i in range(num_requests)]
    for call in calls:  # one at a time: warm-up must not itself be a load test
        result = await client.complete(call)
        if result.error:
            raise RuntimeError(f"warm-up request to {call.model} failed: {result.error}")


def phase_summary(calls: List[CallResult]) -> Dict[str, dict]:
    phases: Dict[str, List[CallResult]] = {}
    for call in calls:
        phases.setdefault(call.call.phase, []).append(call)
    return {name: {"num_calls": len(group),
                   **stats.summarize([c.ttft_s for c in group], "ttft"),
                   **stats.summarize([c.e2e_s for c in group], "e2e"),
                   "prompt_tokens_mean": stats.mean([c.prompt_tokens for c in group]),
                   "output_tokens_mean": stats.mean([c.output_tokens for c in group])}
            for name, group in sorted(phases.items())}


def compute_metrics(tasks: List[dict], before: prometheus.Samples, after: prometheus.Samples,
                    samples: List[Dict[str, float]]) -> dict:
    finished = [t for t in tasks if t["end_s"] is not None]
    ok_tasks = [t for t in finished if not t["error"]]
    calls = [c for t in tasks for c in t["calls"]]
    ok_calls = [c for c in calls if not c.error]
    truncated = any("window_s" in t for t in tasks)
    if truncated:  # --time-limit ended the run: the window from the first start to the limit
        wall = tasks[0]["window_start_s"] + tasks[0]["window_s"] - min(t["start_s"] for t in tasks)
    else:
        wall = (max(t["end_s"] for t in tasks) - min(t["start_s"] for t in tasks)) if tasks else 0.0
    output_tokens = sum(c.output_tokens for c in ok_calls)
    metrics = {
        "truncated": truncated, "num_unfinished_tasks": len(tasks) - len(finished),
        "calls_per_s": stats.ratio(len(ok_calls), wall),
        "num_tasks": len(tasks), "num_failed_tasks": len(finished) - len(ok_tasks),
        "num_calls": len(calls), "num_failed_calls": len(calls) - len(ok_calls), "wall_s": wall,
        "tasks_per_s": stats.ratio(len(ok_tasks), wall),
        "output_tokens_per_s": stats.ratio(output_tokens, wall),
        "prompt_tokens_total": sum(c.prompt_tokens for c in ok_calls), "output_tokens_total": output_tokens,
        **stats.summarize([c.ttft_s for c in ok_calls], "ttft"),
        **stats.summarize([c.e2e_s for c in ok_calls], "e2e"),
        **stats.summarize([t["end_s"] - t["start_s"] for t in ok_tasks], "task"),
    }
    # A window that cut tasks short biases task_* towards the fast ones (only finished tasks count).
    # task_censored_*: every task that did not fail, a running one counted as the time it had run when
    # the window closed: a lower bound of its latency, so these percentiles are lower bounds too.
    if truncated:
        window_end = tasks[0]["window_start_s"] + tasks[0]["window_s"]
        censored = [(t["end_s"] if t["end_s"] is not None else window_end) - t["start_s"]
                    for t in tasks if t["end_s"] is None or not t["error"]]
        metrics.update(stats.summarize(censored, "task_censored"))

    def counter(name: str) -> Optional[float]:
        return prometheus.delta(before, after, name)
    queried = counter("loom_prefix_cache_queried_tokens_total")
    metrics["prefix_hit_rate"] = stats.ratio(counter("loom_prefix_cache_hit_tokens_total"), queried)
    metrics["prefix_queried_tokens"] = queried
    modes = sorted({dict(labels)["mode"] for name, labels in after
                    if name == "loom_prefix_cache_queried_tokens_total" and "mode" in dict(labels)})
    metrics["prefix_hit_rate_by_mode"] = {
        mode: stats.ratio(prometheus.delta(before, after, "loom_prefix_cache_hit_tokens_total", mode=mode),
                          prometheus.delta(before, after, "loom_prefix_cache_queried_tokens_total", mode=mode))
        for mode in modes}
    for key, name in [("queue", "loom_request_queue_time_seconds"), ("prefill", "loom_request_prefill_time_seconds"),
                      ("decode", "loom_request_decode_time_seconds"),
                      ("server_ttft", "loom_time_to_first_token_seconds"),
                      ("server_e2e", "loom_e2e_request_latency_seconds")]:
        histogram = prometheus.HistogramDelta(before, after, name)
        metrics[f"{key}_time_mean_s" if key in ("queue", "prefill", "decode") else f"{key}_mean_s"] = histogram.mean()
        metrics[f"{key}_p95_s"] = histogram.quantile(0.95)
    metrics["decode_batch_size_mean"] = prometheus.HistogramDelta(before, after, "loom_decode_batch_size").mean()
    metrics["preemptions"] = counter("loom_num_preemptions_total")
    metrics["evicted_tokens"] = counter("loom_evicted_tokens_total")
    metrics["loaded_tokens"] = counter("loom_loaded_tokens_total")
    metrics["prefetched_tokens"] = counter("loom_prefetched_tokens_total")
    metrics["offloaded_tokens"] = counter("loom_offloaded_tokens_total")
    metrics["prefetch_in_time_tokens"] = prometheus.delta(before, after, "loom_prefetch_outcome_tokens_total",
                                                          outcome="in_time")
    metrics["prefetch_late_tokens"] = prometheus.delta(before, after, "loom_prefetch_outcome_tokens_total",
                                                       outcome="late")
    load_wait = prometheus.HistogramDelta(before, after, "loom_kv_load_wait_seconds")
    metrics["load_wait_mean_s"] = load_wait.mean()
    metrics["load_wait_p95_s"] = load_wait.quantile(0.95)
    metrics["kv_bytes_per_agent"] = kv_bytes_per_agent(samples)
    metrics["kv_bytes_peak"] = max((s["kv_bytes_device"] for s in samples), default=None)
    metrics["kv_residual_bytes_peak"] = max((s["kv_bytes_residual"] for s in samples), default=None)
    metrics["running_requests_mean"] = stats.mean([s["running"] for s in samples])
    metrics["num_metric_samples"] = len(samples)
    window = (tasks[0]["window_start_s"], tasks[0]["window_start_s"] + tasks[0]["window_s"]) if truncated else None
    metrics["server_output_tokens_per_s"] = server_output_rate(samples, window)
    return metrics


async def run_config(url: str, api_key: str, workload: str, config: Config, text: TextSource, options) -> dict:
    """Measures `config` on the server at `url`. text.tokens_per_word is set
    by the first configuration (calibration) and reused, so every configuration
    sends the same prompts."""
    extra = {"ignore_eos": True} if options.ignore_eos else {}
    client = Client(url, api_key, extra_body=extra, hints=options.workflow_hints,
                    timeout_s=options.request_timeout)
    probe = Client(url, api_key, timeout_s=options.request_timeout, max_connections=2)  # /metrics, off the calls' pool
    try:
        models = await fetch_models(client)
        if options.calibrate:
            text.tokens_per_word = await calibrate(client, models, text)
            options.calibrate = False
        if options.warmup_requests > 0:
            await warm_up(client, models, options.warmup_requests)
        time_limit_s = getattr(options, "time_limit", 0.0) or 0.0
        warmup_limit_s = getattr(options, "warmup_time_limit", None)
        warmup_limit_s = time_limit_s if warmup_limit_s is None else warmup_limit_s
        warmup_truncated = None
        if options.warmup_tasks > 0:
            warmup_seed = options.seed if getattr(options, "steady_state", False) else options.seed + 7777
            warmed = await run_tasks(client, workload, config, models, text, warmup_seed, task_offset=10**6,
                                     num_tasks=options.warmup_tasks, synthetic_outputs=options.synthetic_outputs,
                                     time_limit_s=warmup_limit_s)
            warmup_truncated = any("window_s" in t for t in warmed)
        graph = workloads.graph(workload, config.params)
        declared = []
        if options.declare_workflows and graph:
            for copy in range(max(config.arrivals.concurrency, 1)):
                status = await client.put_json(f"/v1/workflows/{workload}-copy{copy}", graph)
                declared.append(status)
        before = prometheus.parse(await probe.get_text("/metrics"))
        sampler = Sampler(probe, options.sample_interval)
        sampler.start()
        try:
            tasks = await run_tasks(client, workload, config, models, text, options.seed,
                                    synthetic_outputs=options.synthetic_outputs, time_limit_s=time_limit_s)
        finally:
            await sampler.stop()
        after = prometheus.parse(await probe.get_text("/metrics"))
        metrics = compute_metrics(tasks, before, after, sampler.samples)
        metrics["warmup_truncated"] = warmup_truncated
        metrics["warmup_window_s"] = warmup_limit_s if options.warmup_tasks > 0 else None
        calls = [c for t in tasks for c in t["calls"] if not c.error]
        errors = [t["error"] for t in tasks if t["error"]]
        return {"name": config.name, "compare": config.compare, "metrics": metrics, "phases": phase_summary(calls),
                "models": asdict(models), "tokens_per_word": text.tokens_per_word,
                "params": asdict(config.params), "arrivals": asdict(config.arrivals),
                "workflows_declared": declared, "errors": errors[:5]}
    finally:
        await client.close()
        await probe.close()
