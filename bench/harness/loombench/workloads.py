"""The agentic workloads. Each turns (task identity, models, text source,
parameters) into a task generator of Stages (see workflow.py).

Sizes are in tokens (converted to words through TextSource); outputs are
forced to their length with ignore_eos by the client. Prompts are plain text
segments joined by newlines, so a later call's prompt extends an earlier one's
and prefix caching can find it.
"""
import random
from dataclasses import dataclass, fields, replace
from typing import Callable, Dict, List, Optional

from . import shapes
from .text import TextSource
from .workflow import Call, Models, Stage, TaskContext, TaskGenerator, agent_graph


@dataclass(frozen=True)
class Params:
    """Workload knobs; None means the workload's own default (DEFAULTS below)."""
    agents: Optional[int] = None            # agents (models) per workflow
    context_tokens: Optional[int] = None    # static context / fixed prompt / pipeline prompt x
    instruction_tokens: Optional[int] = None  # dynamic, task-specific part
    output_tokens: Optional[int] = None     # generated per agent call (pipeline: first base call)
    observation_tokens: int = 100           # tool observation appended after a step
    tool_latency_s: float = 0.1             # simulated tool call
    loops: int = 2                          # react: loops over the agents
    trials: int = 2                         # reflexion: actor/evaluator/reflection rounds
    eval_tokens: int = 16                   # reflexion evaluator, pipeline adapter evaluations
    final_tokens: int = 64                  # pipeline: consolidating base call (0 = no final call)
    pipeline_adapters: int = 5              # pipeline: adapters invoked in parallel
    num_contexts: int = 1                   # distinct static contexts (copy i uses i % num_contexts)
    distinct_adapters: bool = True          # react/mapreduce: each copy's agents use other adapters
    invocation: str = "round-robin"         # reflexion: round-robin | skewed
    skew_probability: float = 0.5           # reflexion skewed: share of the hot agent
    agent_models: str = "auto"              # sequential: base | adapters (auto = base, as KVFlow)
    reducer: str = "adapter"                # mapreduce: adapter | base
    share_fixed: bool = False               # sequential: copies share the agents' fixed prompts
    invocation_text: str = ""               # pipeline: text before each adapter's answer (aLoRA)
    steps: Optional[float] = None           # *-hotpotqa: mean thought/action/observation steps per episode
    max_steps: Optional[int] = None         # *-hotpotqa: the step limit


DEFAULTS: Dict[str, Dict[str, object]] = {
    # ForkKV §7.1: 32K static context, ~24-token instructions, 256 output tokens, 100-token observations.
    "react": dict(agents=4, context_tokens=2048, instruction_tokens=24, output_tokens=64),
    "mapreduce": dict(agents=4, context_tokens=2048, instruction_tokens=24, output_tokens=64),
    # ICaRus §4.3: 2/4/8 models, multi-turn requests routed round-robin (skewed: one agent 50%).
    "reflexion": dict(agents=4, context_tokens=512, instruction_tokens=24, output_tokens=64),
    "reflexion-skewed": dict(agents=4, context_tokens=512, instruction_tokens=24, output_tokens=64,
                             invocation="skewed"),
    # ICaRus §4.3 (Fig. 4/5, appendices A.2, E, F) in its own setting: HotPotQA agents whose per-turn
    # lengths are drawn from shapes.REACT_HOTPOTQA / REFLEXION_HOTPOTQA (assumptions stated there), every
    # turn routed round-robin (or skewed) over `agents` models shared by all tasks.
    "react-hotpotqa": dict(agents=4, context_tokens=shapes.REACT_HOTPOTQA.fewshot_tokens,
                           instruction_tokens=round(shapes.REACT_HOTPOTQA.question.mean),
                           output_tokens=round(shapes.REACT_HOTPOTQA.thought.mean),
                           observation_tokens=round(shapes.REACT_HOTPOTQA.observation.mean),
                           steps=shapes.REACT_HOTPOTQA.steps.mean, max_steps=shapes.REACT_HOTPOTQA.steps.maximum),
    "reflexion-hotpotqa": dict(agents=4, context_tokens=shapes.REFLEXION_HOTPOTQA.fewshot_tokens,
                               instruction_tokens=round(shapes.REFLEXION_HOTPOTQA.question.mean),
                               output_tokens=round(shapes.REFLEXION_HOTPOTQA.thought.mean),
                               observation_tokens=round(shapes.REFLEXION_HOTPOTQA.observation.mean),
                               steps=shapes.REFLEXION_HOTPOTQA.steps.mean,
                               max_steps=shapes.REFLEXION_HOTPOTQA.steps.maximum),
    # alora-serving §4: prompt 256, base generation 256, 5 adapters x 16 tokens, final base call.
    "pipeline": dict(agents=5, context_tokens=256, instruction_tokens=0, output_tokens=256),
    # KVFlow: 10-agent sequential workflow, fixed/dynamic/output = 8192/32/32 (scaled down here).
    "sequential": dict(agents=10, context_tokens=512, instruction_tokens=32, output_tokens=32),
    # KVFlow §5's PEER-style workflow (Fig. 7/8): plan -> execute -> express -> review; lengths drawn from
    # shapes.PEER_FINQA (assumptions stated there).
    "peer": dict(agents=len(shapes.PEER_ROLES), context_tokens=round(shapes.PEER_FINQA.role.mean),
                 instruction_tokens=round(shapes.PEER_FINQA.question.mean),
                 output_tokens=round(shapes.PEER_FINQA.mean_output())),
}

ALIASES = {"prompt_tokens": "context_tokens", "fixed_tokens": "context_tokens", "gen_tokens": "output_tokens",
           "dynamic_tokens": "instruction_tokens"}


def resolve(workload: str, params: Params) -> Params:
    """params with the workload's defaults filled in where None."""
    if workload not in DEFAULTS:
        raise ValueError(f"unknown workload {workload!r}; one of {', '.join(sorted(DEFAULTS))}")
    given = {f.name: getattr(params, f.name) for f in fields(Params)}
    defaults = Params()
    for key, default in DEFAULTS[workload].items():
        # a field still at its dataclass default takes the workload's default
        if given[key] is None or given[key] == getattr(defaults, key):
            given[key] = default
    resolved = Params(**given)
    if resolved.agents < 1:
        raise ValueError("--agents must be >= 1")
    if workload == "peer" and resolved.agents != len(shapes.PEER_ROLES):
        raise ValueError(f"peer has {len(shapes.PEER_ROLES)} agents ({', '.join(shapes.PEER_ROLES)}), "
                         f"got --agents {resolved.agents}")
    if resolved.invocation not in ("round-robin", "skewed"):
        raise ValueError(f"--invocation must be round-robin or skewed, got {resolved.invocation!r}")
    return resolved


def with_value(params: Params, key: str, text: str) -> Params:
    """params with field `key` (or an alias) set from its string form."""
    key = ALIASES.get(key, key).replace("-", "_")
    names = {f.name: f for f in fields(Params)}
    if key not in names:
        raise KeyError(key)
    current = getattr(Params(), key)
    if key == "steps":
        return replace(params, steps=float(text))
    if isinstance(current, bool):
        value: object = text.lower() in ("1", "true", "yes", "on")
    elif isinstance(current, float):
        value = float(text)
    elif isinstance(current, str):
        value = text
    else:  # int or Optional[int]
        value = int(text)
    return replace(params, **{key: value})


class Builder:
    """Prompt pieces of one task: a seeded rng and the text source."""

    def __init__(self, ctx: TaskContext, text: TextSource, workload: str):
        self.ctx = ctx
        self.text = text
        self.rng = random.Random(f"{workload}-{ctx.seed}-{ctx.task_index}")

    def words(self, num_tokens: int) -> str:
        return self.text.random_words(self.rng, num_tokens) if num_tokens > 0 else ""

    def context(self, index: int, num_tokens: int) -> str:
        return self.text.context(index, num_tokens, self.ctx.seed)


def join(*parts: str) -> str:
    return "\n".join(part for part in parts if part)


def react(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """ForkKV's ReAct: a loop of agents (distinct adapters) over one static
    context plus the task's instruction; each step's thought and a tool
    observation (after tool_latency_s) are appended for the next agent."""
    b = Builder(ctx, text, "react")
    static = join(b.context(ctx.copy_index % p.num_contexts, p.context_tokens),
                  "Task: " + b.words(p.instruction_tokens))
    history: List[str] = []
    num_steps = p.agents * p.loops
    for step in range(num_steps):
        agent = step % p.agents
        model = models.adapter(ctx.copy_index * p.agents + agent if p.distinct_adapters else agent)
        prompt = join(static, *history, f"Agent {agent} thought:")
        [thought] = yield Stage([Call(model, f"agent{agent}", prompt, p.output_tokens)],
                               delay_s=p.tool_latency_s if step > 0 else 0.0)
        history.append(f"Agent {agent} thought: {thought}")
        if step + 1 < num_steps:
            history.append("Observation: " + b.words(p.observation_tokens))


def mapreduce(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """Fan-out of `agents` mappers over one static context (each with its own
    sub-instruction), then a reducer that reads every mapper's output."""
    b = Builder(ctx, text, "mapreduce")
    static = join(b.context(ctx.copy_index % p.num_contexts, p.context_tokens),
                  "Task: " + b.words(p.instruction_tokens))
    first_adapter = ctx.copy_index * (p.agents + 1) if p.distinct_adapters else 0
    calls = [Call(models.adapter(first_adapter + k), f"mapper{k}",
                  join(static, f"Mapper {k}: " + b.words(p.instruction_tokens), "Answer:"), p.output_tokens,
                  phase="map")
             for k in range(p.agents)]
    outputs = yield Stage(calls)
    reducer_model = models.base if p.reducer == "base" else models.adapter(first_adapter + p.agents)
    prompt = join(static, *(f"Mapper {k} answer: {out}" for k, out in enumerate(outputs)), "Reduce:")
    yield Stage([Call(reducer_model, "reducer", prompt, p.output_tokens, phase="reduce")])


def reflexion(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """ICaRus's Reflexion: trials of actor (then a tool observation), evaluator
    and reflection over a growing shared history. Call k goes to model k mod
    agents (round-robin), or with `skewed` to agent 0 with skew_probability and
    otherwise to a uniformly random other agent."""
    b = Builder(ctx, text, "reflexion")
    history = [b.context(ctx.copy_index % p.num_contexts, p.context_tokens),
               "Question: " + b.words(p.instruction_tokens)]
    call_index = 0

    def pick_agent() -> int:
        nonlocal call_index
        call_index += 1
        if p.invocation == "round-robin" or p.agents == 1:
            return (call_index - 1) % p.agents
        if b.rng.random() < p.skew_probability:
            return 0
        return 1 + b.rng.randrange(p.agents - 1)

    roles = [("actor", p.output_tokens), ("evaluator", p.eval_tokens), ("reflection", p.output_tokens)]
    for trial in range(p.trials):
        for role, max_tokens in roles:
            agent = pick_agent()
            prompt = join(*history, f"{role.capitalize()} (trial {trial}):")
            delay = p.tool_latency_s if role == "evaluator" else 0.0  # the actor's action ran a tool
            [out] = yield Stage([Call(models.adapter(agent), f"agent{agent}", prompt, max_tokens, phase=role)],
                                delay_s=delay)
            history.append(f"{role.capitalize()} (trial {trial}): {out}")
            if role == "actor":
                history.append("Observation: " + b.words(p.observation_tokens))


def pipeline(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """alora-serving §4: base model on prompt x (context_tokens of fresh
    random text) generates y (output_tokens); `pipeline_adapters` adapters
    evaluate x+y in parallel (eval_tokens each, after invocation_text); a final
    base call consolidates x+y+evaluations (final_tokens; 0 skips it)."""
    b = Builder(ctx, text, "pipeline")
    x = join(f"Request {ctx.task_index}:", b.words(p.context_tokens))
    [y] = yield Stage([Call(models.base, "base", x, p.output_tokens, phase="base")])
    conversation = join(x, y)
    calls = [Call(models.adapter(k), f"evaluator{k}", join(conversation, p.invocation_text), p.eval_tokens,
                  phase="eval")
             for k in range(p.pipeline_adapters)]
    evaluations = yield Stage(calls)
    if p.final_tokens > 0:
        prompt = join(conversation, *(f"Evaluation {k}: {e}" for k, e in enumerate(evaluations)), "Final answer:")
        yield Stage([Call(models.base, "base", prompt, p.final_tokens, phase="final")])


def sequential(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """KVFlow's sequential workflow: agents run one after the other, each on
    its own fixed prompt (context_tokens; distinct per copy unless
    share_fixed) plus fresh dynamic tokens, generating output_tokens. Running
    many copies at once makes the fixed prompts compete for the cache."""
    b = Builder(ctx, text, "sequential")
    use_adapters = p.agent_models == "adapters"
    for agent in range(p.agents):
        fixed_index = agent if p.share_fixed else ctx.copy_index * p.agents + agent
        fixed = b.context(1000 + fixed_index, p.context_tokens)  # 1000+: apart from the other workloads'
        prompt = join(fixed, "Input: " + b.words(p.instruction_tokens), f"Agent {agent}:")
        model = models.adapter(agent) if use_adapters else models.base
        yield Stage([Call(model, f"agent{agent}", prompt, p.output_tokens)])


def peer(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """KVFlow's PEER-style workflow (§5, Fig. 7/8): plan, execute, express and
    review run one after the other. Each agent's fixed prompt is a preamble
    every role shares plus its own role text (drawn once per workflow copy and
    agent, so a copy's tasks repeat it; copies differ unless share_fixed); the
    dynamic part is the task's question and the earlier agents' outputs.
    Base model unless agent_models is adapters. Lengths: shapes.PEER_FINQA,
    means from Params."""
    b = Builder(ctx, text, "peer")
    draws = length_rng(ctx, "peer")
    shape = shapes.peer_shape_with(shapes.PEER_FINQA, role_tokens=p.context_tokens,
                                   question_tokens=p.instruction_tokens, output_tokens=p.output_tokens)
    preamble = b.context(2000, shape.preamble_tokens)  # 2000+: apart from the other workloads' contexts
    question = "Question: " + b.words(shape.question.draw(draws))
    done: List[str] = []
    for k, role in enumerate(shapes.PEER_ROLES):
        fixed_index = k if p.share_fixed else ctx.copy_index * len(shapes.PEER_ROLES) + k
        role_tokens = shape.role.draw(random.Random(f"peer-role-{ctx.seed}-{fixed_index}"))
        fixed = join(preamble, f"Role: {role}", b.context(2100 + fixed_index, role_tokens))
        model = models.adapter(k) if p.agent_models == "adapters" else models.base
        [out] = yield Stage([Call(model, role, join(fixed, question, *done, f"{role.capitalize()}:"),
                                  shape.outputs[k].draw(draws), phase=role)])
        done.append(f"{role.capitalize()}: {out}")


def hotpotqa_shape(workload: str, p: Params) -> shapes.AgentTurnShape:
    """The workload's length distributions with the means Params sets."""
    base = shapes.REACT_HOTPOTQA if workload.startswith("react") else shapes.REFLEXION_HOTPOTQA
    return shapes.shape_with(base, fewshot_tokens=p.context_tokens, question_tokens=p.instruction_tokens,
                             mean_steps=p.steps, max_steps=p.max_steps, thought_tokens=p.output_tokens,
                             observation_tokens=p.observation_tokens)


def length_rng(ctx: TaskContext, workload: str) -> random.Random:
    """The generator of a task's drawn lengths, counts and routing: apart from
    the text's (whose use depends on the server's tokens per word), so the
    same (seed, task) gets the same turns whatever the tokenizer."""
    return random.Random(f"{workload}-draws-{ctx.seed}-{ctx.task_index}")


class AgentPicker:
    """Which of `agents` models serves call k of a task: round-robin (call k
    -> k mod agents, ICaRus §4.3), or skewed (ICaRus appendix F: agent 0 with
    skew_probability, else a uniformly random other agent)."""

    def __init__(self, p: Params, rng: random.Random):
        self.p, self.rng, self.calls = p, rng, 0

    def next(self) -> int:
        self.calls += 1
        if self.p.invocation == "round-robin" or self.p.agents == 1:
            return (self.calls - 1) % self.p.agents
        if self.rng.random() < self.p.skew_probability:
            return 0
        return 1 + self.rng.randrange(self.p.agents - 1)


def react_hotpotqa(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """ICaRus's ReAct on HotPotQA (Kim et al.'s agent): one system prompt of
    few-shot trajectories shared by every task (context_tokens), the task's
    question, then `steps` thought/action turns, each generating a drawn
    length and followed (but the last, Finish[]) by a drawn-length tool
    observation after tool_latency_s. Turn k goes to model k mod agents
    (round-robin; skewed with --invocation skewed); the models are the same
    for every task (no per-copy adapters). Lengths: shapes.REACT_HOTPOTQA,
    means from Params."""
    b = Builder(ctx, text, "react-hotpotqa")
    draws = length_rng(ctx, "react-hotpotqa")
    shape = hotpotqa_shape("react", p)
    picker = AgentPicker(p, draws)
    num_steps = shape.steps.draw(draws)
    history = [b.context(0, shape.fewshot_tokens), "Question: " + b.words(shape.question.draw(draws))]
    for step in range(1, num_steps + 1):
        agent = picker.next()
        [thought] = yield Stage([Call(models.adapter(agent), f"agent{agent}", join(*history, f"Thought {step}:"),
                                      shape.thought.draw(draws), phase="thought")],
                                delay_s=p.tool_latency_s if step > 1 else 0.0)
        history.append(f"Thought {step}: {thought}")
        if step < num_steps:
            history.append(f"Observation {step}: " + b.words(shape.observation.draw(draws)))


def reflexion_hotpotqa(ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    """ICaRus's Reflexion on HotPotQA (Kim et al.'s agent): trials of a ReAct
    episode (as react_hotpotqa, over a shorter few-shot prompt) judged by exact
    match (no model call); a failed trial (all but the last) is followed by a
    reflection call over the trial's scratchpad, and the next trial restarts
    from the system prompt, the reflections so far and the question. Every
    call goes to the next model round-robin (or skewed). Lengths:
    shapes.REFLEXION_HOTPOTQA, REFLEXION_TRIALS, REFLECTION."""
    b = Builder(ctx, text, "reflexion-hotpotqa")
    draws = length_rng(ctx, "reflexion-hotpotqa")
    shape = hotpotqa_shape("reflexion", p)
    picker = AgentPicker(p, draws)
    num_trials = shapes.REFLEXION_TRIALS.draw(draws)
    system = b.context(0, shape.fewshot_tokens)
    question = "Question: " + b.words(shape.question.draw(draws))
    reflections: List[str] = []
    for trial in range(num_trials):
        head = [system, *reflections, question]
        scratchpad: List[str] = []
        num_steps = shape.steps.draw(draws)
        for step in range(1, num_steps + 1):
            agent = picker.next()
            [thought] = yield Stage([Call(models.adapter(agent), f"agent{agent}",
                                          join(*head, *scratchpad, f"Thought {step}:"), shape.thought.draw(draws),
                                          phase="thought")],
                                    delay_s=p.tool_latency_s if step > 1 else 0.0)
            scratchpad.append(f"Thought {step}: {thought}")
            if step < num_steps:
                scratchpad.append(f"Observation {step}: " + b.words(shape.observation.draw(draws)))
        if trial + 1 < num_trials:
            agent = picker.next()
            [reflection] = yield Stage([Call(models.adapter(agent), f"agent{agent}",
                                             join(*head, *scratchpad, "Reflection:"),
                                             shapes.REFLECTION.draw(draws), phase="reflection")])
            reflections.append(f"Reflection {trial + 1}: {reflection}")


WORKLOADS: Dict[str, Callable[[TaskContext, Models, TextSource, Params], TaskGenerator]] = {
    "react": react, "mapreduce": mapreduce, "reflexion": reflexion, "reflexion-skewed": reflexion,
    "pipeline": pipeline, "sequential": sequential,
    "react-hotpotqa": react_hotpotqa, "reflexion-hotpotqa": reflexion_hotpotqa, "peer": peer,
}


def graph(workload: str, p: Params) -> Optional[dict]:
    """The agent step graph a workflow copy declares, or None when
    the order is random (skewed reflexion)."""
    if workload in ("react", "sequential") or (workload in ("reflexion", "react-hotpotqa", "reflexion-hotpotqa")
                                                and p.invocation == "round-robin"):
        return agent_graph([f"agent{a}" for a in range(p.agents)], cyclic=True)
    if workload == "peer":
        return agent_graph(list(shapes.PEER_ROLES), cyclic=True)
    if workload == "mapreduce":
        mappers = [f"mapper{k}" for k in range(p.agents)]
        return agent_graph(mappers + ["reducer"], cyclic=False,
                           joins={"reducer": mappers, **{m: ["reducer"] for m in mappers}})
    if workload == "pipeline":
        evaluators = [f"evaluator{k}" for k in range(p.pipeline_adapters)]
        return agent_graph(["base"] + evaluators, cyclic=False,
                           joins={"base": evaluators, **{e: ["base"] for e in evaluators}})
    return None


def make_task(workload: str, ctx: TaskContext, models: Models, text: TextSource, p: Params) -> TaskGenerator:
    return WORKLOADS[workload](ctx, models, text, p)
