"""Per-turn length distributions of the ICaRus setting's agent workloads, and
the samplers that draw them (seeded, so a task's lengths are a pure function
of its seed and index).

The ICaRus paper (Woo et al., "ICaRus: Identical Cache Reuse for Efficient
Multi Model Inference", §4.3 and Appendix A.2.3) runs ReAct and Reflexion on
HotPotQA "following the setup of Kim et al. (2025)" ("The Cost of Dynamic
Reasoning: Demystifying AI Agents and Test-Time Scaling from an AI
Infrastructure Perspective", arXiv:2506.04301), with input/output
distributions "based on empirical measurements" of that paper. Neither paper's
per-turn numbers were available to this work, so every length below is an
ASSUMPTION, grounded where possible in the agent code Kim et al. publish with
their paper (VIA-Research/AgentBench: ReAct on HotPotQA with 5 few-shot
trajectories in the system prompt, a 30-node LangGraph limit = 15
thought/action/observation steps, generation stopped at "\\nObservation:";
Reflexion with 2 few-shot trajectories, 10 steps between reflections, at most
3 reflections) and in the ReAct paper's HotPotQA prompt (Yao et al., "ReAct:
Synergizing Reasoning and Acting in Language Models", arXiv:2210.03629:
Search[] returns a Wikipedia page's first paragraph). bench/README.md lists
them beside the figures they produce; change them here, in one place.
"""
import math
import random
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class LogNormal:
    """A length in tokens: lognormal with this mean and log-space sigma,
    rounded, clipped to [low, high]. The clip range is wide enough that it
    moves the mean by under 1% (tests check the mean and median)."""
    mean: float
    sigma: float
    low: int
    high: int

    @property
    def mu(self) -> float:
        return math.log(self.mean) - self.sigma ** 2 / 2  # so that E[X] = mean

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    def draw(self, rng: random.Random) -> int:
        return int(min(self.high, max(self.low, round(rng.lognormvariate(self.mu, self.sigma)))))

    def scaled(self, mean: float) -> "LogNormal":
        """The same shape with another mean (the clip range scales with it)."""
        factor = mean / self.mean
        return LogNormal(mean, self.sigma, max(1, round(self.low * factor)), max(2, round(self.high * factor)))


@dataclass(frozen=True)
class ShiftedGeometric:
    """A count: minimum + Geometric(p) on {0, 1, ...}, truncated at maximum
    (what lies beyond is put on maximum: an agent that hits the step limit
    stops there). p is set from the mean the untruncated count would have."""
    minimum: int
    mean: float
    maximum: int

    @property
    def p(self) -> float:
        return 1.0 / (1.0 + (self.mean - self.minimum))

    def draw(self, rng: random.Random) -> int:
        count = self.minimum
        while count < self.maximum and rng.random() >= self.p:
            count += 1
        return count

    def exact_mean(self) -> float:
        """The truncated distribution's mean (what draws average to)."""
        q = 1.0 - self.p
        total = 0.0
        for k in range(self.minimum, self.maximum):
            total += k * q ** (k - self.minimum) * self.p
        return total + self.maximum * q ** (self.maximum - self.minimum)


@dataclass(frozen=True)
class AgentTurnShape:
    """One HotPotQA agent episode's token lengths.

    fewshot_tokens: the system prompt (instructions + few-shot trajectories),
      identical for every task, so every task shares it as a prefix.
    question: the HotPotQA question.
    steps: thought/action/observation steps until Finish[] (or the limit).
    thought: one generated thought + action (generation stops at
      "\\nObservation:").
    observation: a tool result (a Wikipedia first paragraph, or Lookup's
      sentence); the last step (Finish) has none.
    """
    fewshot_tokens: int
    question: LogNormal
    steps: ShiftedGeometric
    thought: LogNormal
    observation: LogNormal


# ReAct on HotPotQA (ICaRus §4.3, Fig. 4/5): ASSUMPTIONS, see the module docstring.
#   few-shot: ReAct's HotPotQA instruction + 5 trajectories (Kim et al.'s setting), ~1.5K Llama-3 tokens
#   question: HotPotQA questions are one sentence, ~24 tokens
#   steps: at least 2 (one Search, then Finish), mean 5, limit 15 (Kim et al.'s 30-node graph limit)
#   thought+action: ~64 tokens (a sentence or two of reasoning + "Action: Search[...]")
#   observation: ~160 tokens (a Wikipedia page's first paragraph)
REACT_HOTPOTQA = AgentTurnShape(
    fewshot_tokens=1536,
    question=LogNormal(mean=24, sigma=0.35, low=8, high=96),
    steps=ShiftedGeometric(minimum=2, mean=5.0, maximum=15),
    thought=LogNormal(mean=64, sigma=0.45, low=12, high=384),
    observation=LogNormal(mean=160, sigma=0.6, low=12, high=1024),
)

# Reflexion on HotPotQA (ICaRus Fig. 5): ASSUMPTIONS. Kim et al.'s Reflexion
# agent: 2 few-shot trajectories (~700 tokens with the instructions), up to 10
# ReAct steps per trial, up to 3 reflections (so up to 4 trials); HotPotQA's
# evaluator is exact match (no model call); a failed trial is followed by a
# reflection call (~96 tokens generated) and the next trial restarts its
# scratchpad after the reflections so far. Trials: 1 + a geometric count of
# failures, mean 2, at most 4.
REFLEXION_HOTPOTQA = AgentTurnShape(
    fewshot_tokens=768,
    question=LogNormal(mean=24, sigma=0.35, low=8, high=96),
    steps=ShiftedGeometric(minimum=2, mean=4.0, maximum=10),
    thought=LogNormal(mean=64, sigma=0.45, low=12, high=384),
    observation=LogNormal(mean=160, sigma=0.6, low=12, high=1024),
)
REFLEXION_TRIALS = ShiftedGeometric(minimum=1, mean=2.0, maximum=4)
REFLECTION = LogNormal(mean=96, sigma=0.4, low=16, high=384)


@dataclass(frozen=True)
class PeerShape:
    """One PEER-style workflow's token lengths (KVFlow §5's "real workflow").

    preamble_tokens: the opening every role prompt shares (their partial prefix overlap).
    role: the rest of an agent's fixed prompt, drawn once per (workflow copy, agent): every task of a copy
      sends each agent the same fixed prompt.
    question: the task's question with its table excerpt (the dynamic part, with the earlier agents' outputs).
    outputs: generated per role, in PEER_ROLES order.
    """
    preamble_tokens: int
    role: LogNormal
    question: LogNormal
    outputs: Tuple[LogNormal, ...]

    def mean_output(self) -> float:
        return sum(o.mean for o in self.outputs) / len(self.outputs)


# KVFlow §5 ("KVFlow: Efficient Prefix Caching for Accelerating LLM-Based Multi-Agent Workflows", Fig. 7/8): the
# PEER framework (Wang et al., "PEER: Expertizing Domain-Specific Tasks with a Multi-Agent Framework and Tuning
# Methods", arXiv:2407.06985) on a Financial QA dataset, four agents in sequence (Plan, Execute, Express,
# Review), each role prompt generated by an LLM from its role and instructions ("diverse, with partial prefix
# overlap"). Fig. 7 plots the fixed / dynamic / output token distributions without numbers this work could use,
# so every length below is an ASSUMPTION:
#   preamble: 256 tokens of the framework's shared instructions open every role prompt
#   role prompt: ~1K tokens (role description, instructions, an example), lognormal sigma 0.4
#   question: ~320 tokens (a financial question with its table excerpt), sigma 0.5
#   outputs: plan ~96 (a few sub-questions), execute ~256 (answers with figures), express ~192 (the
#   written answer), review ~64 (a verdict and score)
PEER_ROLES = ("plan", "execute", "express", "review")
PEER_FINQA = PeerShape(
    preamble_tokens=256,
    role=LogNormal(mean=1024, sigma=0.4, low=256, high=4096),
    question=LogNormal(mean=320, sigma=0.5, low=48, high=2048),
    outputs=(LogNormal(mean=96, sigma=0.4, low=16, high=512), LogNormal(mean=256, sigma=0.45, low=32, high=1024),
             LogNormal(mean=192, sigma=0.4, low=32, high=768), LogNormal(mean=64, sigma=0.4, low=12, high=256)),
)


def peer_shape_with(shape: PeerShape, role_tokens=None, question_tokens=None, output_tokens=None) -> PeerShape:
    """`shape` with other means (None keeps the shape's own): --context-tokens sets the role prompts' mean,
    --instruction-tokens the question's, --output-tokens the mean over the four roles' outputs (each scaled
    by the same factor)."""
    factor = output_tokens / shape.mean_output() if output_tokens else 1.0
    return PeerShape(
        preamble_tokens=shape.preamble_tokens,
        role=shape.role.scaled(role_tokens) if role_tokens else shape.role,
        question=shape.question.scaled(question_tokens) if question_tokens else shape.question,
        outputs=tuple(o.scaled(o.mean * factor) for o in shape.outputs) if output_tokens else shape.outputs,
    )


def shape_with(shape: AgentTurnShape, fewshot_tokens=None, question_tokens=None, mean_steps=None,
               max_steps=None, thought_tokens=None, observation_tokens=None) -> AgentTurnShape:
    """`shape` with the given means changed (None keeps the shape's own): the
    workload's --context-tokens, --instruction-tokens, --steps, --max-steps,
    --output-tokens and --observation-tokens."""
    steps = shape.steps
    if mean_steps is not None or max_steps is not None:
        maximum = max_steps if max_steps is not None else steps.maximum
        mean = mean_steps if mean_steps is not None else steps.mean
        steps = ShiftedGeometric(min(steps.minimum, maximum), min(mean, maximum), maximum)
    return AgentTurnShape(
        fewshot_tokens=fewshot_tokens if fewshot_tokens is not None else shape.fewshot_tokens,
        question=shape.question.scaled(question_tokens) if question_tokens else shape.question,
        steps=steps,
        thought=shape.thought.scaled(thought_tokens) if thought_tokens else shape.thought,
        observation=shape.observation.scaled(observation_tokens) if observation_tokens else shape.observation,
    )
