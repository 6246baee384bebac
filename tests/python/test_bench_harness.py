"""Unit tests of the `loom bench` harness's own logic (bench/harness/loombench):
arrival processes, percentiles, workflow step generation, /metrics parsing and
differences, --compare expansion, and the report's shape. Pure Python: no
server, no third-party packages."""
import math
import os
import random
import statistics
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "harness"))

from loombench import arrivals, configs, prometheus, report, shapes, stats, workloads  # noqa: E402
from loombench.text import TextSource  # noqa: E402
from loombench.workflow import Models, TaskContext, run_offline  # noqa: E402

MODELS = Models("base", [f"a{i}" for i in range(8)])


def stages_of(workload, copy=0, task=0, seed=0, reply="ok", **params):
    p = workloads.resolve(workload, workloads.Params(**params))
    return run_offline(workloads.make_task(workload, TaskContext(task, copy, seed), MODELS, TextSource(), p), reply)


class ArrivalTest(unittest.TestCase):
    def test_poisson_is_seeded_and_has_the_rate(self):
        offsets = arrivals.poisson_offsets(4000, rate=2.0, seed=7)
        self.assertEqual(offsets, arrivals.poisson_offsets(4000, rate=2.0, seed=7))
        self.assertNotEqual(offsets, arrivals.poisson_offsets(4000, rate=2.0, seed=8))
        self.assertEqual(offsets[0], 0.0)
        self.assertEqual(offsets, sorted(offsets))
        gaps = [b - a for a, b in zip(offsets, offsets[1:])]
        self.assertAlmostEqual(statistics.mean(gaps), 0.5, delta=0.03)  # mean gap 1/rate
        # exponential gaps: standard deviation equals the mean
        self.assertAlmostEqual(statistics.pstdev(gaps), 0.5, delta=0.05)

    def test_closed_loop_splits_tasks_over_slots(self):
        self.assertEqual(arrivals.closed_loop_assignment(7, 3), [[0, 3, 6], [1, 4], [2, 5]])
        self.assertEqual(arrivals.closed_loop_assignment(2, 5), [[0], [1]])
        plan = arrivals.make_plan(10, concurrency=4)
        self.assertTrue(plan.is_closed_loop)
        self.assertEqual(plan.concurrency, 4)
        open_plan = arrivals.make_plan(5, rate=1.0, seed=3)
        self.assertFalse(open_plan.is_closed_loop)
        self.assertEqual(len(open_plan.offsets_s), 5)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            arrivals.make_plan(0)
        with self.assertRaises(ValueError):
            arrivals.poisson_offsets(3, rate=0.0, seed=1)


class PercentileTest(unittest.TestCase):
    def test_linear_interpolation(self):
        values = [5.0, 1.0, 4.0, 2.0, 3.0]
        self.assertEqual(stats.percentile(values, 0), 1.0)
        self.assertEqual(stats.percentile(values, 50), 3.0)
        self.assertEqual(stats.percentile(values, 100), 5.0)
        self.assertAlmostEqual(stats.percentile(values, 95), 4.8)
        self.assertAlmostEqual(stats.percentile(range(1, 101), 99), 99.01)
        self.assertIsNone(stats.percentile([], 50))
        self.assertEqual(stats.percentile([2.5], 99), 2.5)
        with self.assertRaises(ValueError):
            stats.percentile(values, 101)

    def test_summary_keys(self):
        summary = stats.summarize([0.1, 0.2, 0.3], "ttft")
        self.assertEqual(set(summary), {"ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "ttft_mean_s"})
        self.assertAlmostEqual(summary["ttft_p50_s"], 0.2)
        self.assertIsNone(stats.ratio(1.0, 0.0))


class WorkloadTest(unittest.TestCase):
    def test_react_loops_agents_over_a_growing_shared_prefix(self):
        stages = stages_of("react", copy=1, agents=3, loops=2, context_tokens=50, output_tokens=7, reply="THOUGHT")
        self.assertEqual(len(stages), 6)
        calls = [stage.calls[0] for stage in stages]
        # copy 1 of 3-agent workflows uses adapters 3, 4, 5 (distinct from copy 0's)
        self.assertEqual([c.model for c in calls], ["a3", "a4", "a5", "a3", "a4", "a5"])
        self.assertEqual([s.delay_s for s in stages], [0.0] + [0.1] * 5)
        self.assertTrue(all(c.max_tokens == 7 for c in calls))
        for earlier, later in zip(calls, calls[1:]):
            static_and_history = earlier.prompt.rsplit("\n", 1)[0]
            self.assertTrue(later.prompt.startswith(static_and_history))
            self.assertIn("THOUGHT\nObservation: ", later.prompt)
            # each step adds the thought and a ~100-token observation (words at 1 token/word)
            self.assertGreater(len(later.prompt.split()), len(earlier.prompt.split()) + 100)

    def test_same_seed_same_prompts_other_task_other_instruction(self):
        first = stages_of("react", task=0)
        self.assertEqual([s.calls[0].prompt for s in first], [s.calls[0].prompt for s in stages_of("react", task=0)])
        other = stages_of("react", task=1)
        context = first[0].calls[0].prompt.split("\nTask:")[0]
        self.assertEqual(context, other[0].calls[0].prompt.split("\nTask:")[0])  # one static context
        self.assertNotEqual(first[0].calls[0].prompt, other[0].calls[0].prompt)

    def test_mapreduce_fans_out_then_reduces_every_output(self):
        stages = stages_of("mapreduce", agents=4, reply="MAPPED")
        self.assertEqual([len(s.calls) for s in stages], [4, 1])
        self.assertEqual([c.model for c in stages[0].calls], ["a0", "a1", "a2", "a3"])
        reducer = stages[1].calls[0]
        self.assertEqual((reducer.model, reducer.phase), ("a4", "reduce"))
        self.assertEqual(reducer.prompt.count("MAPPED"), 4)
        self.assertEqual(stages_of("mapreduce", agents=2, reducer="base")[1].calls[0].model, "base")

    def test_reflexion_round_robin_and_skewed(self):
        stages = stages_of("reflexion", agents=2, trials=2)
        calls = [s.calls[0] for s in stages]
        self.assertEqual([c.phase for c in calls], ["actor", "evaluator", "reflection"] * 2)
        self.assertEqual([c.model for c in calls], ["a0", "a1"] * 3)
        self.assertEqual(calls[1].max_tokens, 16)
        # skewed: agent 0 takes about half of the calls over many tasks
        models = [s.calls[0].model for task in range(60)
                  for s in stages_of("reflexion-skewed", task=task, agents=4, trials=3)]
        share = models.count("a0") / len(models)
        self.assertAlmostEqual(share, 0.5, delta=0.08)
        self.assertEqual(set(models), {"a0", "a1", "a2", "a3"})

    def test_pipeline_base_then_parallel_adapters_then_base(self):
        stages = stages_of("pipeline", context_tokens=40, output_tokens=30, reply="Y")
        self.assertEqual([len(s.calls) for s in stages], [1, 5, 1])
        base, evaluations, final = stages[0].calls[0], stages[1].calls, stages[2].calls[0]
        self.assertEqual((base.model, base.max_tokens, base.phase), ("base", 30, "base"))
        self.assertEqual([c.model for c in evaluations], ["a0", "a1", "a2", "a3", "a4"])
        self.assertTrue(all(c.prompt.startswith(base.prompt + "\nY") and c.max_tokens == 16 for c in evaluations))
        self.assertEqual((final.model, final.phase), ("base", "final"))
        self.assertEqual(final.prompt.count("Evaluation "), 5)
        self.assertEqual(len(stages_of("pipeline", final_tokens=0)), 2)

    def test_sequential_ten_agents_with_fixed_prompts_per_copy(self):
        stages = stages_of("sequential", context_tokens=20, instruction_tokens=5, output_tokens=3)
        self.assertEqual(len(stages), 10)
        self.assertTrue(all(s.calls[0].model == "base" and s.calls[0].max_tokens == 3 for s in stages))
        fixed = [s.calls[0].prompt.split("\nInput:")[0] for s in stages]
        self.assertEqual(len(set(fixed)), 10)
        again = [s.calls[0].prompt.split("\nInput:")[0] for s in stages_of("sequential", task=5, context_tokens=20)]
        self.assertEqual(fixed, again)  # the next task of copy 0 reuses the fixed prompts
        other_copy = [s.calls[0].prompt.split("\nInput:")[0] for s in stages_of("sequential", copy=1, context_tokens=20)]
        self.assertFalse(set(fixed) & set(other_copy))
        shared = [s.calls[0].prompt.split("\nInput:")[0]
                  for s in stages_of("sequential", copy=1, context_tokens=20, share_fixed=True)]
        self.assertEqual(fixed, shared)

    def test_text_sizes_follow_tokens_per_word(self):
        text = TextSource(tokens_per_word=2.0)
        self.assertEqual(text.num_words(100), 50)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as file:
            file.write("alpha beta gamma delta\nepsilon")
        try:
            source = TextSource.from_file(file.name)
            self.assertEqual(source.context(0, 7, seed=0), "Context 0:\nalpha beta gamma delta epsilon alpha beta")
        finally:
            os.unlink(file.name)

    def test_synthetic_outputs_stand_in_words_of_the_output_length(self):
        import random
        from loombench.client import CallResult
        from loombench.runner import replies
        from loombench.workflow import Call
        done = [CallResult(Call("a0", "agent0", "p", 64), 0.0, 0.1, 0.2, 10, 64, "<|reserved_7|>" * 64),
                CallResult(Call("a1", "agent1", "p", 64), 0.0, 0.1, 0.2, 10, 12, "short")]
        text = TextSource(tokens_per_word=2.0)
        self.assertEqual(replies(done, text, None), [done[0].text, "short"])
        first = replies(done, text, random.Random("x"))
        self.assertEqual([len(reply.split()) for reply in first], [32, 6])
        self.assertEqual(first, replies(done, text, random.Random("x")))
        self.assertNotIn("reserved", " ".join(first))

    def test_graphs(self):
        p = workloads.resolve("sequential", workloads.Params(agents=3))
        self.assertEqual(workloads.graph("sequential", p)["agents"][0], {"name": "agent0", "after": ["agent2"]})
        mr = workloads.graph("mapreduce", workloads.resolve("mapreduce", workloads.Params(agents=2)))
        self.assertIn({"name": "reducer", "after": ["mapper0", "mapper1"], "join": "all"}, mr["agents"])
        self.assertIsNone(workloads.graph("reflexion-skewed", workloads.resolve("reflexion-skewed", workloads.Params())))


class PeerWorkloadTest(unittest.TestCase):
    """KVFlow's PEER-style workflow: four roles in order, fixed prompts that
    share a preamble and repeat across a copy's tasks, the dynamic part
    growing with the earlier roles' outputs, lengths from shapes.PEER_FINQA."""

    @staticmethod
    def fixed(stage):
        return stage.calls[0].prompt.split("\nQuestion: ")[0]

    def test_four_roles_in_order_over_fixed_prompts_with_a_shared_preamble(self):
        stages = stages_of("peer")
        self.assertEqual([s.calls[0].agent for s in stages], list(shapes.PEER_ROLES))
        self.assertEqual([s.calls[0].phase for s in stages], list(shapes.PEER_ROLES))
        self.assertTrue(all(s.calls[0].model == "base" for s in stages))
        fixed = [self.fixed(s) for s in stages]
        self.assertEqual(len(set(fixed)), 4)
        preamble = fixed[0].split("\nRole: ")[0]
        self.assertEqual(len(preamble.split("\n", 1)[1].split()), shapes.PEER_FINQA.preamble_tokens)
        self.assertTrue(all(f.startswith(preamble + "\nRole: ") for f in fixed))  # the partial prefix overlap
        # each role reads the question and every earlier role's output
        for k, stage in enumerate(stages):
            prompt = stage.calls[0].prompt
            for earlier in shapes.PEER_ROLES[:k]:
                self.assertIn(f"\n{earlier.capitalize()}: ok", prompt)
            self.assertTrue(prompt.endswith(f"{shapes.PEER_ROLES[k].capitalize()}:"))
        # a copy's next task repeats its fixed prompts; another copy has its own unless share_fixed
        self.assertEqual([self.fixed(s) for s in stages_of("peer", task=9)], fixed)
        other = [self.fixed(s) for s in stages_of("peer", copy=1)]
        self.assertFalse(set(fixed) & set(other))
        self.assertEqual([self.fixed(s) for s in stages_of("peer", copy=1, share_fixed=True)], fixed)
        adapters = stages_of("peer", agent_models="adapters")
        self.assertEqual([s.calls[0].model for s in adapters], ["a0", "a1", "a2", "a3"])
        self.assertEqual(workloads.graph("peer", workloads.resolve("peer", workloads.Params()))["agents"][0],
                         {"name": "plan", "after": ["review"]})
        with self.assertRaises(ValueError):
            workloads.resolve("peer", workloads.Params(agents=3))

    def test_lengths_follow_the_stated_distributions(self):
        shape = shapes.PEER_FINQA
        tasks = [stages_of("peer", task=t) for t in range(800)]
        for k, role in enumerate(shapes.PEER_ROLES):
            outputs = [stages[k].calls[0].max_tokens for stages in tasks]
            self.assertAlmostEqual(statistics.mean(outputs) / shape.outputs[k].mean, 1.0, delta=0.05, msg=role)
            self.assertGreaterEqual(min(outputs), shape.outputs[k].low)
            self.assertLessEqual(max(outputs), shape.outputs[k].high)
        questions = [len(stages[0].calls[0].prompt.split("\nQuestion: ")[1].split("\n")[0].split())
                     for stages in tasks]
        self.assertAlmostEqual(statistics.mean(questions) / shape.question.mean, 1.0, delta=0.06)
        # role prompts are drawn per (copy, agent): their mean over many copies is the shape's
        roles = [len(self.fixed(stage).split("\nRole: ")[1].split("\n", 2)[2].split())  # past "Context N:"
                 for copy in range(300) for stage in stages_of("peer", copy=copy)]
        self.assertAlmostEqual(statistics.mean(roles) / shape.role.mean, 1.0, delta=0.05)
        # the means move with the parameters; output_tokens keeps the roles' proportions
        moved = [stages_of("peer", task=t, context_tokens=200, instruction_tokens=40, output_tokens=50)
                 for t in range(400)]
        outputs = [[stages[k].calls[0].max_tokens for stages in moved] for k in range(4)]
        self.assertAlmostEqual(statistics.mean(statistics.mean(o) for o in outputs) / 50, 1.0, delta=0.06)
        self.assertGreater(statistics.mean(outputs[1]), 2 * statistics.mean(outputs[3]))  # execute > review
        self.assertEqual(tasks[5], stages_of("peer", task=5))  # a pure function of (seed, task)


METRICS_BEFORE = """# HELP loom_prefix_cache_hit_tokens_total x
# TYPE loom_prefix_cache_hit_tokens_total counter
loom_prefix_cache_hit_tokens_total 100
loom_prefix_cache_queried_tokens_total 400
loom_kv_cache_bytes{tier="device",kind="base"} 1000
loom_kv_cache_bytes{tier="device",kind="residual"} 24
loom_kv_cache_bytes{tier="host",kind="base"} 0
loom_request_queue_time_seconds_bucket{le="0.1"} 2
loom_request_queue_time_seconds_bucket{le="1"} 2
loom_request_queue_time_seconds_bucket{le="+Inf"} 2
loom_request_queue_time_seconds_sum 0.1
loom_request_queue_time_seconds_count 2
"""
METRICS_AFTER = METRICS_BEFORE.replace(" 100\n", " 400\n").replace("queried_tokens_total 400", "queried_tokens_total 1000") \
    .replace('le="0.1"} 2', 'le="0.1"} 4').replace('le="1"} 2', 'le="1"} 12').replace('le="+Inf"} 2', 'le="+Inf"} 12') \
    .replace("_sum 0.1", "_sum 5.1").replace("_count 2", "_count 12")


class HotpotqaShapeTest(unittest.TestCase):
    """The ICaRus-setting workloads' lengths follow the distributions
    shapes.py states (means and medians within tolerance over many draws),
    and a task's draws are a pure function of (seed, task index)."""
    DRAWS = 20000

    def test_lognormal_mean_median_and_bounds(self):
        for dist in (shapes.REACT_HOTPOTQA.thought, shapes.REACT_HOTPOTQA.observation,
                     shapes.REACT_HOTPOTQA.question, shapes.REFLECTION):
            rng = random.Random(5)
            values = [dist.draw(rng) for _ in range(self.DRAWS)]
            self.assertTrue(all(dist.low <= v <= dist.high for v in values))
            self.assertAlmostEqual(statistics.mean(values) / dist.mean, 1.0, delta=0.03, msg=dist)
            self.assertAlmostEqual(statistics.median(values) / dist.median, 1.0, delta=0.04, msg=dist)
            # the log-space spread is the stated sigma
            logs = [math.log(v) for v in values]
            self.assertAlmostEqual(statistics.pstdev(logs), dist.sigma, delta=0.05 * dist.sigma + 0.02, msg=dist)
            again = random.Random(5)
            self.assertEqual(values[:100], [dist.draw(again) for _ in range(100)])

    def test_scaled_lognormal_keeps_the_shape(self):
        dist = shapes.REACT_HOTPOTQA.observation.scaled(40)
        rng = random.Random(1)
        values = [dist.draw(rng) for _ in range(self.DRAWS)]
        self.assertAlmostEqual(statistics.mean(values) / 40, 1.0, delta=0.04)
        self.assertEqual(dist.sigma, shapes.REACT_HOTPOTQA.observation.sigma)

    def test_shifted_geometric_mean_and_limits(self):
        for dist in (shapes.REACT_HOTPOTQA.steps, shapes.REFLEXION_HOTPOTQA.steps, shapes.REFLEXION_TRIALS):
            rng = random.Random(2)
            values = [dist.draw(rng) for _ in range(self.DRAWS)]
            self.assertEqual(min(values), dist.minimum)
            self.assertLessEqual(max(values), dist.maximum)
            self.assertAlmostEqual(statistics.mean(values), dist.exact_mean(), delta=0.03 * dist.exact_mean())
            # truncation only trims: the exact mean lies between the minimum and the untruncated mean
            self.assertLessEqual(dist.exact_mean(), dist.mean + 1e-9)
            self.assertGreater(dist.exact_mean(), dist.minimum)
        # P(count = minimum) = p
        dist = shapes.REACT_HOTPOTQA.steps
        rng = random.Random(3)
        values = [dist.draw(rng) for _ in range(self.DRAWS)]
        self.assertAlmostEqual(values.count(dist.minimum) / self.DRAWS, dist.p, delta=0.015)

    def tasks(self, workload, num_tasks, seed=0, **params):
        return [stages_of(workload, task=t, seed=seed, **params) for t in range(num_tasks)]

    def test_react_hotpotqa_steps_lengths_and_round_robin(self):
        tasks = self.tasks("react-hotpotqa", 600, agents=4)
        steps = [len(stages) for stages in tasks]
        shape = shapes.REACT_HOTPOTQA
        self.assertAlmostEqual(statistics.mean(steps), shape.steps.exact_mean(),
                               delta=0.06 * shape.steps.exact_mean())
        self.assertGreaterEqual(min(steps), shape.steps.minimum)
        self.assertLessEqual(max(steps), shape.steps.maximum)
        outputs = [stage.calls[0].max_tokens for stages in tasks for stage in stages]
        self.assertAlmostEqual(statistics.mean(outputs) / shape.thought.mean, 1.0, delta=0.04)
        few_shot = tasks[0][0].calls[0].prompt.split("\nQuestion: ")[0]
        for stages in tasks[:50]:
            self.assertEqual([s.calls[0].model for s in stages], [f"a{k % 4}" for k in range(len(stages))])
            self.assertEqual([s.calls[0].agent for s in stages], [f"agent{k % 4}" for k in range(len(stages))])
            prompts = [s.calls[0].prompt for s in stages]
            self.assertTrue(prompts[0].startswith(few_shot + "\nQuestion: "))  # every task shares the few-shot
            for earlier, later in zip(prompts, prompts[1:]):  # each turn's prompt extends the last one's
                self.assertTrue(later.startswith(earlier.rsplit("\n", 1)[0] + "\n"))
            self.assertEqual(stages[0].delay_s, 0.0)
            self.assertTrue(all(s.delay_s == 0.1 for s in stages[1:]))
        # the few-shot prompt is context_tokens long, the observations observation_tokens on average
        self.assertEqual(len(few_shot.split("\n", 1)[1].split()), shape.fewshot_tokens)
        observations = [len(line.split()) - 2 for stages in tasks[:200]
                        for line in stages[-1].calls[0].prompt.split("\n") if line.startswith("Observation ")]
        self.assertAlmostEqual(statistics.mean(observations) / shape.observation.mean, 1.0, delta=0.06)
        # deterministic per (seed, task); another seed draws other lengths
        self.assertEqual(stages_of("react-hotpotqa", task=7, agents=4), tasks[7])
        def lengths(some):
            return [[c.max_tokens for s in st for c in s.calls] for st in some]
        self.assertNotEqual(lengths(self.tasks("react-hotpotqa", 20, seed=1, agents=4)), lengths(tasks[:20]))

    def test_draws_do_not_depend_on_the_tokenizer(self):
        # the server's tokens per word changes how many words the text takes, never the drawn turns
        for workload in ("react-hotpotqa", "reflexion-hotpotqa"):
            p = workloads.resolve(workload, workloads.Params(agents=3, invocation="skewed"))
            shapes_of = []
            for tokens_per_word in (1.0, 2.7):
                stages = run_offline(workloads.make_task(workload, TaskContext(5, 0, 0), MODELS,
                                                         TextSource(tokens_per_word=tokens_per_word), p))
                shapes_of.append([(c.model, c.max_tokens, c.phase) for s in stages for c in s.calls])
            self.assertEqual(shapes_of[0], shapes_of[1], workload)

    def test_react_hotpotqa_params_move_the_means(self):
        tasks = self.tasks("react-hotpotqa", 400, agents=2, output_tokens=16, steps=3.0, max_steps=6,
                           context_tokens=100)
        steps = [len(stages) for stages in tasks]
        self.assertLessEqual(max(steps), 6)
        self.assertAlmostEqual(statistics.mean(steps), shapes.ShiftedGeometric(2, 3.0, 6).exact_mean(), delta=0.2)
        outputs = [stage.calls[0].max_tokens for stages in tasks for stage in stages]
        self.assertAlmostEqual(statistics.mean(outputs) / 16, 1.0, delta=0.06)
        self.assertEqual({s.calls[0].model for st in tasks for s in st}, {"a0", "a1"})

    def test_react_hotpotqa_skewed(self):
        tasks = self.tasks("react-hotpotqa", 300, agents=8, invocation="skewed")
        models = [s.calls[0].model for st in tasks for s in st]
        self.assertAlmostEqual(models.count("a0") / len(models), 0.5, delta=0.04)
        self.assertEqual(set(models), {f"a{i}" for i in range(8)})
        self.assertIsNone(workloads.graph("react-hotpotqa", workloads.resolve(
            "react-hotpotqa", workloads.Params(agents=8, invocation="skewed"))))

    def test_reflexion_hotpotqa_trials_and_reflections(self):
        tasks = self.tasks("reflexion-hotpotqa", 600, agents=4)
        trials = [1 + sum(1 for s in st if s.calls[0].phase == "reflection") for st in tasks]
        self.assertAlmostEqual(statistics.mean(trials), shapes.REFLEXION_TRIALS.exact_mean(), delta=0.1)
        self.assertLessEqual(max(trials), shapes.REFLEXION_TRIALS.maximum)
        reflections = [s.calls[0].max_tokens for st in tasks for s in st if s.calls[0].phase == "reflection"]
        self.assertAlmostEqual(statistics.mean(reflections) / shapes.REFLECTION.mean, 1.0, delta=0.06)
        for stages in tasks[:50]:
            # every call goes to the next model, reflections included
            self.assertEqual([s.calls[0].model for s in stages], [f"a{k % 4}" for k in range(len(stages))])
            # a trial after a reflection restarts its scratchpad with the reflection before the question
            for before, after in zip(stages, stages[1:]):
                if before.calls[0].phase == "reflection":
                    self.assertIn("Reflection 1:", after.calls[0].prompt.split("Question:")[0])
                    self.assertNotIn("Observation", after.calls[0].prompt)


class TimeLimitTest(unittest.TestCase):
    """--time-limit: the run ends at the window; finished tasks and calls count, running ones are cut."""

    class SlowClient:
        async def complete(self, call, workflow=None):
            import asyncio
            await asyncio.sleep(0.2)
            from loombench.client import CallResult
            return CallResult(call=call, start_s=0.0, ttft_s=0.01, e2e_s=0.2, prompt_tokens=10,
                              output_tokens=call.max_tokens, text="x")

    def run_window(self, rate, limit, num_tasks=50):
        import asyncio
        from loombench import runner
        p = workloads.Params(agents=2, loops=2, tool_latency_s=0.0, output_tokens=5)
        config = configs.build("react", [], [], [], p, configs.Arrivals(num_tasks, 2, rate))[0]
        tasks = asyncio.run(runner.run_tasks(self.SlowClient(), "react", config, MODELS, TextSource(), 0,
                                             time_limit_s=limit))
        return tasks, runner.compute_metrics(tasks, {}, {}, [])

    def test_closed_loop_window(self):
        tasks, metrics = self.run_window(None, 1.0)  # a task is 4 calls of 0.2 s: each slot finishes one
        # Two finished tasks of ~0.8 s and two cut after ~0.2 s: the censored median sits between them.
        self.assertGreater(metrics["task_censored_p95_s"], 0.7)
        self.assertLess(metrics["task_censored_p50_s"], metrics["task_p50_s"])
        self.assertTrue(metrics["truncated"])
        self.assertAlmostEqual(metrics["wall_s"], 1.0, delta=0.05)
        self.assertEqual(metrics["num_tasks"] - metrics["num_unfinished_tasks"], 2)
        self.assertEqual(metrics["num_failed_tasks"], 0)
        self.assertAlmostEqual(metrics["tasks_per_s"], 2.0, delta=0.1)
        self.assertEqual(metrics["num_calls"], sum(len(t["calls"]) for t in tasks))
        self.assertGreaterEqual(metrics["num_calls"], 8)

    def test_open_loop_window_and_no_limit(self):
        _, metrics = self.run_window(10.0, 0.5)
        self.assertTrue(metrics["truncated"])
        self.assertGreater(metrics["num_unfinished_tasks"], 0)
        # Running tasks count with the time they had run: never below the finished ones' figures.
        self.assertGreaterEqual(metrics["task_censored_p95_s"], metrics["task_p95_s"] or 0.0)
        self.assertLessEqual(metrics["task_censored_p95_s"], 0.5 + 0.05)
        _, metrics = self.run_window(None, 10.0, num_tasks=2)  # ends before the window: not truncated
        self.assertFalse(metrics["truncated"])
        self.assertEqual(metrics["num_unfinished_tasks"], 0)
        self.assertLess(metrics["wall_s"], 2.0)

    def test_window_ends_at_once_with_thousands_of_calls_queued(self):
        """Calls beyond the connection pool wait on the client's own slots: cancelling 1500 calls queued
        inside httpx's pool took ~20 s here (each cancellation rescans the pool's queue), which let a
        --time-limit window overrun by minutes on the H200."""
        import asyncio
        import time
        try:
            from loombench.client import Client
        except ImportError:
            self.skipTest("httpx is missing")
        from loombench.workflow import Call

        async def scenario():
            connections = []

            async def hold(reader, writer):  # reads a request and never answers
                connections.append(writer)
                try:
                    await reader.read(1 << 16)
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    pass
            server = await asyncio.start_server(hold, "127.0.0.1", 0)
            client = Client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", max_connections=16)
            calls = asyncio.gather(*(client.complete(Call("m", "a", f"p{i}", 4)) for i in range(1500)))
            began = time.perf_counter()
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(calls, timeout=0.5)
            ended = time.perf_counter() - began
            await client.close()
            server.close()
            return ended, len(connections)
        ended, num_connections = asyncio.run(scenario())
        self.assertLess(ended, 5.0)
        self.assertLessEqual(num_connections, 16)

    def test_server_rate_counts_tokens_inside_the_window_only(self):
        from loombench import runner
        samples = [{"t": t, "generated_tokens": tokens} for t, tokens in
                   [(9.0, 0.0), (10.0, 100.0), (12.0, 500.0), (14.0, 900.0), (15.0, 5000.0)]]
        # 800 tokens over the 4 s between the first and the last sample in [10, 14]; the spike after is left out
        self.assertAlmostEqual(runner.server_output_rate(samples, (10.0, 14.5)), 200.0)
        self.assertAlmostEqual(runner.server_output_rate(samples, None), 5000.0 / 6.0)
        self.assertIsNone(runner.server_output_rate(samples, (11.0, 13.0)))  # one sample: no rate
        self.assertIsNone(runner.server_output_rate([{"generated_tokens": 5.0}], None))


class PrometheusTest(unittest.TestCase):
    def test_parse_labels_and_sums(self):
        samples = prometheus.parse(METRICS_BEFORE + 'odd{a="x\\"y",b="2"} +Inf\n')
        self.assertEqual(prometheus.value(samples, "loom_kv_cache_bytes", tier="device", kind="base"), 1000)
        self.assertEqual(prometheus.value(samples, "loom_kv_cache_bytes", tier="device"), 1024)
        self.assertEqual(prometheus.value(samples, "odd", a='x"y'), float("inf"))
        self.assertIsNone(prometheus.value(samples, "absent"))
        # an unlabelled total is not added to its per-mode breakdown
        by_mode = prometheus.parse('hits 10\nhits{mode="forked"} 6\nhits{mode="none"} 4\n')
        self.assertEqual(prometheus.value(by_mode, "hits"), 10)
        self.assertEqual(prometheus.value(by_mode, "hits", mode="forked"), 6)
        with self.assertRaises(ValueError):
            prometheus.parse("not a metric line at all {")
        # loom serve's model_name label is dropped, so the total still wins over the breakdown
        labelled = prometheus.parse('hits{model_name="m"} 10\nhits{model_name="m",mode="forked"} 6\n'
                                    'hits{model_name="m",mode="none"} 4\n')
        self.assertEqual(prometheus.value(labelled, "hits"), 10)
        self.assertEqual(prometheus.value(labelled, "hits", mode="none"), 4)

    def test_counter_and_histogram_deltas(self):
        before, after = prometheus.parse(METRICS_BEFORE), prometheus.parse(METRICS_AFTER)
        hit = prometheus.delta(before, after, "loom_prefix_cache_hit_tokens_total")
        queried = prometheus.delta(before, after, "loom_prefix_cache_queried_tokens_total")
        self.assertEqual((hit, queried), (300, 600))
        histogram = prometheus.HistogramDelta(before, after, "loom_request_queue_time_seconds")
        self.assertEqual(histogram.count, 10)
        self.assertAlmostEqual(histogram.mean(), 0.5)
        self.assertEqual(histogram.buckets, [(0.1, 2), (1.0, 10), (float("inf"), 10)])
        # rank 5 of 10 lies in (0.1, 1]: 0.1 + 0.9 * (5 - 2) / 8
        self.assertAlmostEqual(histogram.quantile(0.5), 0.1 + 0.9 * 3 / 8)
        self.assertAlmostEqual(histogram.quantile(0.1), 0.05)
        self.assertIsNone(prometheus.HistogramDelta(before, before, "loom_request_queue_time_seconds").quantile(0.5))

    def test_kv_bytes_per_agent_counts_running_requests_only(self):
        from loombench.runner import kv_bytes_per_agent  # needs no server, but imports the client module
        samples = [{"running": 0, "kv_bytes_device": 5000, "blocks_in_use": 0, "blocks_cached": 5},
                   {"running": 2, "kv_bytes_device": 4000, "blocks_in_use": 2, "blocks_cached": 2},
                   {"running": 1, "kv_bytes_device": 3000, "blocks_in_use": 3, "blocks_cached": 0}]
        self.assertAlmostEqual(kv_bytes_per_agent(samples), (1000 + 3000) / 2)
        self.assertIsNone(kv_bytes_per_agent(samples[:1]))
        # forked: the residual pool's in-use share is added to the base pool's
        forked = [{"running": 2, "kv_bytes_device": 1400, "kv_bytes_base": 1000, "kv_bytes_residual": 400,
                   "blocks_in_use": 1, "blocks_cached": 4, "residual_blocks_in_use": 2, "residual_blocks_cached": 2}]
        self.assertAlmostEqual(kv_bytes_per_agent(forked), (200 + 200) / 2)


class CompareTest(unittest.TestCase):
    def build(self, *specs, loras=("x=/m/adapters/x", "y=/m/y:isolated")):
        return configs.build("react", list(specs), ["--model", "/m"], list(loras), workloads.Params(),
                             configs.Arrivals(num_tasks=4, concurrency=2))

    def test_sharing_rewrites_every_lora(self):
        result = self.build("sharing=isolated,forked")
        self.assertEqual([c.name for c in result], ["sharing=isolated", "sharing=forked"])
        self.assertEqual(result[1].serve_args, ["--model", "/m", "--lora", "x=/m/adapters/x:forked",
                                                "--lora", "y=/m/y:forked"])
        self.assertTrue(result[0].needs_own_server)
        with self.assertRaises(ValueError):
            self.build("sharing=shared")
        with self.assertRaises(ValueError):
            self.build("sharing=forked", loras=())

    def test_product_of_server_and_workload_keys(self):
        result = self.build("eviction=lru,workflow", "workflows=1,8", "context_tokens=64")
        self.assertEqual(len(result), 4)
        last = result[-1]
        self.assertEqual(last.name, "eviction=workflow,workflows=8,context_tokens=64")
        self.assertIn("--eviction-policy", last.serve_args)
        self.assertEqual(last.arrivals.concurrency, 8)
        self.assertEqual(last.params.context_tokens, 64)
        self.assertEqual(last.params.output_tokens, 64)  # react's default still filled in
        plain = self.build("serve.max-batch-tokens=128", "prompt_tokens=32", "rate=0.5")[0]
        self.assertEqual(plain.serve_args[2:4], ["--max-batch-tokens", "128"])
        self.assertEqual((plain.params.context_tokens, plain.arrivals.rate), (32, 0.5))
        self.assertFalse(self.build("prompt_tokens=32")[0].needs_own_server)
        for bad in ("nonsense=1", "sharing", "workflows=1,1"):
            with self.assertRaises(ValueError):
                self.build(bad)


    def test_cache_presets_set_policy_host_tier_and_prefetch(self):
        result = configs.build("sequential", ["cache=lru,lru+host,workflow+prefetch"], ["--model", "/m"], [],
                               workloads.Params(), configs.Arrivals(num_tasks=4, concurrency=2), "512M")
        self.assertEqual([c.name for c in result], ["cache=lru", "cache=lru+host", "cache=workflow+prefetch"])
        self.assertEqual(result[0].serve_args[2:], ["--eviction-policy", "lru", "--host-kv-memory", "0"])
        self.assertEqual(result[1].serve_args[2:], ["--eviction-policy", "lru", "--host-kv-memory", "512M",
                                                    "--prefetch-agents", "0"])
        self.assertEqual(result[2].serve_args[2:], ["--eviction-policy", "workflow", "--host-kv-memory", "512M",
                                                    "--prefetch-agents", "2"])
        self.assertTrue(all(c.needs_own_server for c in result))
        with self.assertRaises(ValueError):
            self.build("cache=lru+disk")
        # KVFlow's baseline beside Loom's admission: blocking (HiCache's load-back) vs background host loads.
        result = configs.build("sequential", ["cache=lru+host", "host_load=blocking,background"], ["--model", "/m"],
                               [], workloads.Params(), configs.Arrivals(num_tasks=4, concurrency=2), "512M")
        self.assertEqual([c.name for c in result], ["cache=lru+host,host_load=blocking",
                                                    "cache=lru+host,host_load=background"])
        self.assertEqual(result[0].serve_args[-2:], ["--host-load-policy", "blocking"])
        self.assertTrue(all(c.needs_own_server for c in result))

    def test_disk_presets_add_a_fresh_disk_tier(self):
        result = configs.build("sequential", ["cache=lru+host+disk,workflow+prefetch+disk"], ["--model", "/m"], [],
                               workloads.Params(), configs.Arrivals(num_tasks=4, concurrency=2), "512M")
        directories = []
        for config in result:
            args = config.serve_args
            self.assertIn("--host-kv-memory", args)
            directory = args[args.index("--disk-kv-path") + 1]
            self.assertTrue(os.path.isdir(directory) and not os.listdir(directory))
            self.assertEqual(args[args.index("--disk-kv-bytes") + 1], "64G")
            directories.append(directory)
            os.rmdir(directory)
        self.assertNotEqual(directories[0], directories[1])


class ReportTest(unittest.TestCase):
    def test_ratios_keep_the_other_keys_fixed(self):
        def config(sharing, workflows, tasks_per_s):
            return {"name": f"sharing={sharing},workflows={workflows}",
                    "compare": {"sharing": sharing, "workflows": workflows}, "metrics": {"tasks_per_s": tasks_per_s}}
        configs_ = [config("isolated", "1", 1.0), config("isolated", "4", 2.0), config("forked", "1", 3.0),
                    config("forked", "4", 8.0)]
        result = report.ratios(configs_)
        self.assertEqual(result["sharing=forked,workflows=4"]["over"], "sharing=isolated,workflows=4")
        self.assertAlmostEqual(result["sharing=forked,workflows=4"]["tasks_per_s"], 4.0)
        self.assertAlmostEqual(result["sharing=forked,workflows=1"]["tasks_per_s"], 3.0)
        self.assertNotIn("sharing=isolated,workflows=4", result)  # its own baseline
        # a key with one value is not the compared one
        single = [dict(c, compare={"eviction": "lru", **c["compare"]}) for c in configs_[:2]]
        self.assertEqual(report.ratios(single)["sharing=isolated,workflows=4"]["over"], "sharing=isolated,workflows=1")

    def test_design_shape_ratios_and_table(self):
        def config(name, tasks_per_s):
            metrics = {key: 1.0 for key in report.REQUIRED_METRICS}
            metrics["tasks_per_s"] = tasks_per_s
            return {"name": name, "compare": {"sharing": name}, "metrics": metrics, "phases": {}}
        data = {"workload": "react", "configs": [config("isolated", 2.0), config("forked", 5.0),
                                                 {"name": "broken", "compare": {}, "error": "RuntimeError: x"}]}
        with tempfile.TemporaryDirectory() as out:
            json_path, md_path = report.write(out, data)
            import json
            with open(json_path) as file:
                saved = json.load(file)
            for entry in saved["configs"][:2]:
                self.assertTrue(set(report.REQUIRED_METRICS) <= set(entry["metrics"]))
            self.assertAlmostEqual(saved["ratios"]["forked"]["tasks_per_s"], 2.5)
            with open(md_path) as file:
                table = file.read()
        self.assertIn("| forked | 5.000 |", table)
        self.assertIn("`forked` over `isolated`: tasks/s 2.50x", table)
        self.assertIn("| broken | failed: RuntimeError: x |", table)


if __name__ == "__main__":
    unittest.main(verbosity=2)
