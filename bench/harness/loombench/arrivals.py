"""When tasks start: closed loop (a fixed number in flight) or open loop (Poisson).

Both are pure functions of their arguments and a seed, so two configurations
compared in one run see exactly the same arrival pattern.
"""
import random
from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class ArrivalPlan:
    """How `num_tasks` tasks are released.

    closed loop (rate is None): `concurrency` tasks run at once; a new one
      starts as soon as one finishes; slot k always runs copy k (a "workflow
      copy" keeps its own adapters/contexts, as in ForkKV's N workflows).
    open loop (rate > 0): task i starts at offsets_s[i] (Poisson, mean gap
      1/rate) whatever is still running; it runs copy i % num_copies.
    """
    num_tasks: int
    concurrency: int = 1
    rate: Optional[float] = None
    offsets_s: tuple = ()

    @property
    def is_closed_loop(self) -> bool:
        return self.rate is None


def poisson_offsets(num_tasks: int, rate: float, seed: int) -> List[float]:
    """Start times (seconds from 0) of num_tasks Poisson arrivals at `rate` per
    second; the first arrives at 0 so a run never begins with idle time."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be > 0, got {rate}")
    rng = random.Random(f"arrivals-{seed}")
    offsets, now = [], 0.0
    for index in range(num_tasks):
        if index > 0:
            now += rng.expovariate(rate)
        offsets.append(now)
    return offsets


def make_plan(num_tasks: int, concurrency: int = 1, rate: Optional[float] = None, seed: int = 0) -> ArrivalPlan:
    if num_tasks < 1:
        raise ValueError(f"need at least one task, got {num_tasks}")
    if rate is None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        return ArrivalPlan(num_tasks=num_tasks, concurrency=min(concurrency, num_tasks))
    return ArrivalPlan(num_tasks=num_tasks, concurrency=concurrency, rate=rate,
                       offsets_s=tuple(poisson_offsets(num_tasks, rate, seed)))


def closed_loop_assignment(num_tasks: int, concurrency: int) -> List[List[int]]:
    """Task indices each closed-loop slot runs, in order: slot k runs tasks k,
    k + concurrency, ... (a fixed split, so the copy a task belongs to does not
    depend on timing)."""
    return [list(range(slot, num_tasks, concurrency)) for slot in range(min(concurrency, num_tasks))]
