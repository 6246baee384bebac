"""`--compare KEY=V1,V2,...`: the configurations of one run.

Several --compare flags give their cartesian product (in the order given).
Keys:
  sharing=MODE       every --lora becomes NAME=PATH:MODE (the KV sharing modes:
                     isolated | activated | base | forked)
  eviction=POLICY    `loom serve --eviction-policy POLICY` (lru | workflow);
                     the flag name lives in SERVE_FLAGS below, one place to change
  host_load=POLICY   `loom serve --host-load-policy POLICY` (background | blocking: HiCache's
                     load-back, the KVFlow paper's baseline); with a cache=...+host preset
  cache=PRESET       the KV cache setup of the workflow benchmark, one of CACHE_PRESETS:
                     lru | lru+host | lru+host+disk | workflow | workflow+host | workflow+host+disk |
                     workflow+prefetch | workflow+prefetch+disk
                     (+host: a host tier of --host-kv-memory; +prefetch: also --prefetch-agents 2;
                     +disk: a disk tier in a fresh temporary directory, capped at 64 GB)
  serve.FLAG=V       any other `loom serve --FLAG V` (e.g. serve.kv-cache-bytes=...)
  workflows / concurrency, rate, num_tasks       arrival settings
  any workload parameter (context_tokens, output_tokens, agents, ...; see workloads.Params)
"""
import itertools
import tempfile
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from . import workloads

SHARING_MODES = ("isolated", "activated", "base", "forked")
SERVE_FLAGS = {"eviction": "--eviction-policy", "host_load": "--host-load-policy"}
# cache=PRESET -> `loom serve` flags; "{host}" is the harness's --host-kv-memory.
CACHE_PRESETS = {
    "lru": ["--eviction-policy", "lru", "--host-kv-memory", "0"],
    "lru+host": ["--eviction-policy", "lru", "--host-kv-memory", "{host}", "--prefetch-agents", "0"],
    "workflow": ["--eviction-policy", "workflow", "--host-kv-memory", "0"],
    "workflow+host": ["--eviction-policy", "workflow", "--host-kv-memory", "{host}", "--prefetch-agents", "0"],
    "workflow+prefetch": ["--eviction-policy", "workflow", "--host-kv-memory", "{host}", "--prefetch-agents", "2"],
}
DISK_FLAGS = ["--disk-kv-path", "{disk}", "--disk-kv-bytes", "64G"]
for _preset in ("lru+host", "workflow+host", "workflow+prefetch"):
    CACHE_PRESETS[_preset + "+disk"] = CACHE_PRESETS[_preset] + DISK_FLAGS
ARRIVAL_KEYS = {"workflows": "concurrency", "concurrency": "concurrency", "rate": "rate", "num_tasks": "num_tasks",
                "num-tasks": "num_tasks"}


@dataclass(frozen=True)
class Arrivals:
    num_tasks: int
    concurrency: int
    rate: Optional[float] = None


@dataclass
class Config:
    name: str
    compare: Dict[str, str]
    serve_args: List[str]
    params: workloads.Params
    arrivals: Arrivals
    needs_own_server: bool = False  # a server-side key differs between configs


def parse_compare(spec: str) -> Tuple[str, List[str]]:
    """'KEY=V1,V2' -> (KEY, [V1, V2])."""
    key, sep, values_text = spec.partition("=")
    values = [v.strip() for v in values_text.split(",") if v.strip()]
    if not sep or not key.strip() or not values:
        raise ValueError(f"bad --compare {spec!r}: use KEY=V1,V2,...")
    key = key.strip()
    if len(set(values)) != len(values):
        raise ValueError(f"--compare {spec!r} repeats a value")
    if key == "cache":
        for value in values:
            if value not in CACHE_PRESETS:
                raise ValueError(f"--compare cache: unknown preset {value!r} (one of {', '.join(CACHE_PRESETS)})")
    if key == "sharing":
        for value in values:
            if value not in SHARING_MODES:
                raise ValueError(f"--compare sharing: unknown mode {value!r} (one of {', '.join(SHARING_MODES)})")
    return key, values


def with_lora_mode(lora_spec: str, mode: str) -> str:
    """NAME=PATH[:OLD] -> NAME=PATH:MODE (a trailing ':word' without '/' is a mode, as in `loom serve`)."""
    name, _, path = lora_spec.partition("=")
    colon = path.rfind(":")
    if colon >= 0 and "/" not in path[colon:]:
        path = path[:colon]
    return f"{name}={path}:{mode}"


def is_server_key(key: str) -> bool:
    return key in ("sharing", "cache") or key in SERVE_FLAGS or key.startswith("serve.")


def apply_serve_key(serve_args: List[str], loras: List[str], key: str, value: str,
                    host_kv_memory: str = "2G") -> Tuple[List[str], List[str]]:
    if key == "sharing":
        return serve_args, [with_lora_mode(spec, value) for spec in loras]
    if key == "cache":
        disk = tempfile.mkdtemp(prefix="loom-bench-disk-") if "{disk}" in CACHE_PRESETS[value] else ""
        return serve_args + [flag.format(host=host_kv_memory, disk=disk) for flag in CACHE_PRESETS[value]], loras
    flag = SERVE_FLAGS.get(key) or "--" + key[len("serve."):]
    return serve_args + [flag, value], loras


def build(workload: str, compare_specs: List[str], serve_args: List[str], loras: List[str],
          params: workloads.Params, arrivals: Arrivals, host_kv_memory: str = "2G") -> List[Config]:
    """Every configuration, each with its final `loom serve` args (base args,
    then --lora flags) and resolved workload parameters."""
    axes = [parse_compare(spec) for spec in compare_specs]
    keys = [key for key, _ in axes]
    if len(set(keys)) != len(keys):
        raise ValueError("a --compare key is given twice")
    if "sharing" in keys and not loras:
        raise ValueError("--compare sharing needs adapters: give --lora (or --make-model) for launched servers")
    configs = []
    for combination in itertools.product(*(values for _, values in axes)) if axes else [()]:
        args, config_loras = list(serve_args), list(loras)
        config_params, config_arrivals = params, arrivals
        chosen = dict(zip(keys, combination))
        for key, value in chosen.items():
            if is_server_key(key):
                args, config_loras = apply_serve_key(args, config_loras, key, value, host_kv_memory)
            elif key in ARRIVAL_KEYS:
                field_name = ARRIVAL_KEYS[key]
                typed = float(value) if field_name == "rate" else int(value)
                config_arrivals = replace(config_arrivals, **{field_name: typed})
            else:
                try:
                    config_params = workloads.with_value(config_params, key, value)
                except KeyError:
                    raise ValueError(f"--compare: unknown key {key!r}") from None
        for spec in config_loras:
            args += ["--lora", spec]
        name = ",".join(f"{k}={v}" for k, v in chosen.items()) or "default"
        configs.append(Config(name, chosen, args, workloads.resolve(workload, config_params), config_arrivals,
                              needs_own_server=any(is_server_key(k) for k in keys)))
    return configs
