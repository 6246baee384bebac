"""The shape every workload produces: a task is a generator of stages.

A task generator yields a Stage (calls to run in parallel, after an optional
tool delay) and receives the list of their output texts (same order) through
send(); it returns when the task is done. Workloads are pure Python over a
seeded random.Random, so the step sequence is unit-testable without a server.
"""
from dataclasses import dataclass, field
from typing import Dict, Generator, List, Optional


@dataclass(frozen=True)
class Call:
    """One completion request.

    model: served model name (the base model or an adapter).
    agent: the agent's name, unique within its workflow (sent as a hint).
    phase: label for per-phase statistics (e.g. "eval" in the pipeline).
    """
    model: str
    agent: str
    prompt: str
    max_tokens: int
    phase: str = "step"


@dataclass(frozen=True)
class Stage:
    calls: List[Call]
    delay_s: float = 0.0  # simulated tool latency before the calls are sent


TaskGenerator = Generator[Stage, List[str], None]


@dataclass(frozen=True)
class Models:
    """What the server serves: the base model's name and its adapters."""
    base: str
    adapters: List[str] = field(default_factory=list)

    def adapter(self, index: int) -> str:
        """Adapter number `index`, wrapping around (the base model if none)."""
        return self.adapters[index % len(self.adapters)] if self.adapters else self.base


@dataclass(frozen=True)
class TaskContext:
    """Identity of one task: its index in the run and the workflow copy it
    belongs to (closed loop: the slot; open loop: index % copies)."""
    task_index: int
    copy_index: int
    seed: int

    @property
    def workflow_id(self) -> str:
        return f"copy{self.copy_index}"


def run_offline(task: TaskGenerator, reply: str = "ok") -> List[Stage]:
    """Drives a task with a fixed reply to every call; returns its stages
    (tests and --dry-run use it)."""
    stages = []
    try:
        stage = next(task)
        while True:
            stages.append(stage)
            stage = task.send([reply] * len(stage.calls))
    except StopIteration:
        return stages


def agent_graph(order: List[str], cyclic: bool = True, joins: Optional[Dict[str, List[str]]] = None) -> dict:
    """A workflow declaration body (PUT /v1/workflows/{id}): each
    agent runs after its predecessor in `order` (the first after the last when
    `cyclic`), or after the agents `joins` names for it (join all)."""
    agents = []
    for position, name in enumerate(order):
        if joins and name in joins:
            agents.append({"name": name, "after": list(joins[name]), "join": "all"})
        elif position > 0 or cyclic:
            agents.append({"name": name, "after": [order[position - 1]]})
        else:
            agents.append({"name": name, "after": []})
    return {"agents": agents}
