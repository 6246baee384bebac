"""Smoke runs of `loom bench` (the C++ subcommand running bench/harness) for
every workload against a tiny random model, each in seconds: the run ends
well, every call is made and counted, and report.json / report.md / plots
have the shape docs/design.md §4 fixes."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

try:
    import httpx  # noqa: F401
except ImportError:
    print("SKIPPED: the `httpx` package is missing (pip install -r scripts/python-requirements.txt)")
    sys.exit(loom_server.SKIP_EXIT_CODE)

REQUIRED = ("tasks_per_s", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "e2e_p95_s", "prefix_hit_rate",
            "kv_bytes_per_agent")
SMALL = ["--num-tasks", "2", "--concurrency", "2", "--context-tokens", "48", "--instruction-tokens", "6",
         "--output-tokens", "4", "--observation-tokens", "8", "--tool-latency", "0.01", "--eval-tokens", "3",
         "--final-tokens", "3", "--sample-interval", "0.02"]
SERVE = ["--threads", "1", "--block-size", "4"]


class BenchSmokeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="loom-bench-")
        cls.model = os.path.join(cls.directory, "model")
        subprocess.run([loom_server.loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny",
                        "--adapters", "4", "--out", cls.model], check=True, stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.directory, ignore_errors=True)

    def bench(self, workload, *args, expect_ok=True, plots=False):
        out = os.path.join(self.directory, f"{workload}-{self.id().rsplit('.', 1)[-1]}")
        command = [loom_server.loom_binary(), "bench", workload, "--model", self.model, "--out", out, *SMALL,
                   *args, *SERVE] + ([] if plots else ["--no-plots"])
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if expect_ok:
            self.assertEqual(result.returncode, 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}")
        with open(os.path.join(out, "report.json")) as file:
            report = json.load(file)
        self.assertEqual(report["workload"], workload)
        self.assertTrue(os.path.exists(os.path.join(out, "report.md")))
        return report, out

    def check_config(self, config, num_calls, num_tasks=2):
        metrics = config["metrics"]
        for key in REQUIRED:
            self.assertIn(key, metrics)
        self.assertEqual(metrics["num_tasks"], num_tasks)
        self.assertEqual(metrics["num_failed_calls"], 0, config.get("errors"))
        self.assertEqual(metrics["num_calls"], num_calls)
        self.assertGreater(metrics["tasks_per_s"], 0)
        self.assertGreater(metrics["ttft_p95_s"], 0)
        self.assertGreaterEqual(metrics["e2e_p95_s"], metrics["ttft_p50_s"])
        # every call reached the server: its TTFT histogram grew by the number of calls
        self.assertGreater(metrics["prefix_queried_tokens"], 0)
        self.assertIsNotNone(metrics["queue_time_mean_s"])
        self.assertEqual(config["models"]["adapters"], ["adapter0", "adapter1", "adapter2", "adapter3"])

    def test_react(self):
        report, out = self.bench("react", "--agents", "2", "--loops", "1", plots=True)
        [config] = report["configs"]
        self.assertEqual(config["name"], "default")
        self.check_config(config, num_calls=4)
        self.assertEqual(config["metrics"]["output_tokens_total"], 4 * 4)  # ignore_eos: exactly max_tokens
        self.assertTrue(os.path.exists(os.path.join(out, "summary.png")))

    def test_mapreduce(self):
        report, _ = self.bench("mapreduce", "--agents", "2")
        self.check_config(report["configs"][0], num_calls=2 * 3)
        self.assertEqual(set(report["configs"][0]["phases"]), {"map", "reduce"})

    def test_reflexion_and_skewed(self):
        for workload in ("reflexion", "reflexion-skewed"):
            report, _ = self.bench(workload, "--agents", "2", "--trials", "1")
            self.check_config(report["configs"][0], num_calls=2 * 3)

    def test_hotpotqa_agents(self):
        # ICaRus's setting: drawn turn counts and lengths; the calls made are the ones the generator yields
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sys.path.insert(0, os.path.join(root, "bench", "harness"))
        from loombench import workloads
        from loombench.text import TextSource
        from loombench.workflow import Models, TaskContext, run_offline
        for workload in ("react-hotpotqa", "reflexion-hotpotqa"):
            args = ["--agents", "2", "--steps", "2.5", "--max-steps", "3"]
            report, _ = self.bench(workload, *args)
            config = report["configs"][0]
            params = workloads.Params(**config["params"])
            expected = sum(len(stage.calls) for task in range(2) for stage in run_offline(workloads.make_task(
                workload, TaskContext(task, task % 2, 0), Models("b", ["a0", "a1"]), TextSource(), params)))
            self.check_config(config, num_calls=expected)

    def test_pipeline_open_loop(self):
        report, _ = self.bench("pipeline", "--rate", "20", "--pipeline-adapters", "2")
        config = report["configs"][0]
        self.check_config(config, num_calls=2 * 4)
        self.assertEqual(config["arrivals"]["rate"], 20.0)
        self.assertEqual(config["phases"]["eval"]["num_calls"], 4)

    def test_sequential_reuses_fixed_prompts(self):
        report, _ = self.bench("sequential", "--agents", "3", "--share-fixed", "--concurrency", "1")
        config = report["configs"][0]
        self.check_config(config, num_calls=2 * 3)
        # the second task finds the three agents' fixed prompts cached
        self.assertGreater(config["metrics"]["prefix_hit_rate"], 0.2)

    def test_compare_launches_one_server_per_configuration(self):
        # bench/README.md's `loom bench react --compare` example, at smoke size
        report, out = self.bench("react", "--agents", "2", "--loops", "1", "--compare", "sharing=isolated,forked",
                                 "--compare", "workflows=1,2", plots=True)
        names = [c["name"] for c in report["configs"]]
        self.assertEqual(names, ["sharing=isolated,workflows=1", "sharing=isolated,workflows=2",
                                 "sharing=forked,workflows=1", "sharing=forked,workflows=2"])
        for config in report["configs"]:
            self.check_config(config, num_calls=4)
            self.assertEqual(config["server_exit_status"], 0)
            mode = config["compare"]["sharing"]
            self.assertIn("adapter0=" + os.path.join(self.model, "adapters", "adapter0") + ":" + mode,
                          config["serve_args"])
            self.assertEqual(config["arrivals"]["concurrency"], int(config["compare"]["workflows"]))
            # the server counted the prompt tokens under the mode asked for
            self.assertIsNotNone(config["metrics"]["prefix_hit_rate_by_mode"].get(mode))
        self.assertEqual(report["ratios"]["sharing=forked,workflows=2"]["over"], "sharing=isolated,workflows=2")
        self.assertTrue(os.path.exists(os.path.join(out, "tasks_per_s_vs_workflows.png")))

    def test_failed_configuration_is_reported(self):
        report, _ = self.bench("react", "--agents", "1", "--loops", "1", "--compare", "serve.block-size=0",
                               expect_ok=False)
        [config] = report["configs"]
        self.assertIn("ServerError", config["error"])
        self.assertNotIn("metrics", config)

    def test_help(self):
        result = subprocess.run([loom_server.loom_binary(), "bench", "--help"], capture_output=True, text=True,
                                timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("reflexion-skewed", result.stdout)
        self.assertIn("--compare", result.stdout)
        bad = subprocess.run([loom_server.loom_binary(), "bench", "nonsense"], capture_output=True, text=True,
                             timeout=60)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("invalid choice", bad.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
