"""The issue-42 study scripts (bench/cuda/icarus_setting.sh, forkkv_setting.sh,
kvflow_setting.sh) run end to end on the CPU against a tiny random model at
toy sizes: the plumbing the H200 runs use (adapters made, pools passed,
every side's `loom bench` point, --time-limit windows, the summary table with
the papers' figures) is exercised in CI. No figure is asserted. Also the
seeds' plots (bench/cuda/seed_plots.py) from bench/results/seeds/figures.json."""
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ("--threads 1 --block-size 4 --instruction-tokens 6 --observation-tokens 8 --tool-latency 0.01 "
         "--sample-interval 0.05 --warmup-requests 1")


class SettingScriptsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="loom-settings-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.directory, ignore_errors=True)

    def run_script(self, script, study, out_name=None, **env):
        out = os.path.join(self.directory, out_name or script.split(".")[0])
        environment = dict(os.environ, LOOM=loom_server.loom_binary(), DEVICE="cpu", MODEL="random:tiny", OUT=out,
                           BUDGET="120", **env)
        result = subprocess.run(["bash", os.path.join("bench", "cuda", script)], cwd=ROOT, env=environment,
                                capture_output=True, text=True, timeout=180)
        logs = ""
        study_dir = os.path.join(out, study)
        for name in sorted(os.listdir(study_dir)) if os.path.isdir(study_dir) else []:
            if name.endswith(".log"):
                with open(os.path.join(study_dir, name)) as file:
                    logs += f"\n--- {name}\n" + file.read()[-3000:]
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr + logs)
        with open(os.path.join(study_dir, "points.txt")) as file:
            points = [line.split() for line in file if line.strip()]
        for name, rc, _ in points:
            self.assertEqual(rc, "0", f"{name}: {result.stdout}{logs}")
        with open(os.path.join(study_dir, "summary.json")) as file:
            summary = json.load(file)
        self.assertEqual(summary["failed"], [], result.stdout + logs)
        with open(os.path.join(study_dir, "skipped.txt")) as file:
            self.assertEqual(file.read(), "")
        reports = {}
        for name, _, _ in points:
            with open(os.path.join(study_dir, name, "report.json")) as file:
                report = json.load(file)
            reports[name] = dict(report["configs"][0], command=report["command"])
        return result.stdout, reports, summary

    def test_icarus(self):
        stdout, reports, summary = self.run_script(
            "icarus_setting.sh", "icarus", AGENT_COUNTS="2", SAT_RATE="50", SAT_TASKS="2", RATES="", RANK="4",
            KV_BYTES="3000000", SWAP_SPACE="4M", POINT_LIMIT="30",
            LOOM_BENCH_ARGS=SMALL + " --context-tokens 32 --output-tokens 3 --steps 2 --max-steps 3")
        self.assertEqual(sorted(reports), ["n2-base-r50", "n2-iso-recompute-r50", "n2-iso-swap-r50"])
        for name, config in reports.items():
            metrics = config["metrics"]
            self.assertEqual(metrics["num_tasks"], 2, name)
            self.assertEqual(metrics["num_failed_calls"], 0, config.get("errors"))
            self.assertFalse(metrics["truncated"])
            self.assertIn("task_p95_s", metrics)
        self.assertIn(":base", " ".join(reports["n2-base-r50"]["serve_args"]))
        self.assertIn("--preemption-mode", reports["n2-iso-swap-r50"]["serve_args"])
        self.assertEqual(set(summary["rows"]), {"2/iso-recompute", "2/iso-swap"})
        self.assertIn("| 2 | iso-recompute |", stdout)
        self.assertIn("1.4x / 3.8x", stdout)  # the paper's figures beside Loom's

    def test_icarus_shapes(self):
        # SHAPE picks the model and its pool arithmetic; anything else is refused before any point runs.
        environment = dict(os.environ, LOOM=loom_server.loom_binary(), DEVICE="cpu",
                           OUT=os.path.join(self.directory, "shape"), SHAPE="llama-70b")
        result = subprocess.run(["bash", os.path.join("bench", "cuda", "icarus_setting.sh")], cwd=ROOT,
                                env=environment, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("SHAPE: llama-8b or qwen3-14b", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.directory, "shape", "icarus", "points.txt")))

    def test_forkkv(self):
        stdout, reports, summary = self.run_script(
            "forkkv_setting.sh", "forkkv", PRESET="react:32:1:warm mapreduce:32:1:cold", RANK="4",
            CONTEXT_32K="40", OUTPUT="3", RATE="4", POINT_LIMIT="3", WARMUP_LIMIT="1", KV_BYTES="3000000",
            RESIDUAL_BYTES_PER_TOKEN="64", POINTS="react-32k-w1-warm-forked react-32k-w1-warm-isolated",
            LOOM_BENCH_ARGS=SMALL)
        self.assertEqual(sorted(reports), ["react-32k-w1-warm-forked", "react-32k-w1-warm-isolated"])
        forked = reports["react-32k-w1-warm-forked"]
        self.assertIn(":forked", " ".join(forked["serve_args"]))
        self.assertIn("--residual-kv-cache-memory", forked["serve_args"])
        for config in reports.values():
            metrics = config["metrics"]
            self.assertTrue(metrics["truncated"])  # the window, not the task count, ended the phase
            self.assertTrue(metrics["warmup_truncated"])
            self.assertEqual(metrics["warmup_window_s"], 1.0)  # a warm-up window of its own (WARMUP_LIMIT)
            self.assertAlmostEqual(metrics["wall_s"], 3.0, delta=0.5)
            self.assertGreater(metrics["calls_per_s"], 0)
            self.assertGreater(metrics["server_output_tokens_per_s"], 0)  # sampled on a client of its own
        self.assertIn("react-32k-w1-warm", summary["rows"])
        self.assertIn("1.25-3.04x", stdout)

    def test_kvflow(self):
        stdout, reports, summary = self.run_script(
            "kvflow_setting.sh", "kvflow", FIXED_SINGLE="40", FIXED_CONCURRENT="24", WORKFLOWS="2",
            TASKS_SINGLE="1", KV_SINGLE="6000000", KV_CONCURRENT="6000000", HOST="8M", POINT_LIMIT="3",
            POINTS="single-hicache single-kvflow concurrent-kvflow", LOOM_BENCH_ARGS=SMALL + " --agents 3")
        self.assertEqual(sorted(reports), ["concurrent-kvflow", "single-hicache", "single-kvflow"])
        self.assertIn("blocking", reports["single-hicache"]["serve_args"])
        self.assertIn("workflow", reports["single-kvflow"]["serve_args"])
        self.assertTrue(all(status < 300 for status in reports["single-kvflow"]["workflows_declared"]))
        self.assertEqual(reports["single-kvflow"]["metrics"]["num_failed_calls"], 0)
        self.assertIn("single/kvflow", summary["rows"])
        self.assertIn("1.83x", stdout)

    def test_kvflow_peer(self):
        stdout, reports, summary = self.run_script(
            "kvflow_setting.sh", "kvflow", out_name="kvflow_peer", PRESET="peer", WORKFLOWS_PEER="2",
            KV_CONCURRENT="6000000", HOST="8M", POINT_LIMIT="3", PEER_LIMIT="3", POINTS="peer-hicache peer-kvflow",
            LOOM_BENCH_ARGS=SMALL + " --context-tokens 16 --instruction-tokens 8 --output-tokens 4")
        self.assertEqual(sorted(reports), ["peer-hicache", "peer-kvflow"])
        self.assertIn("blocking", reports["peer-hicache"]["serve_args"])
        self.assertIn("--synthetic-outputs", reports["peer-kvflow"]["command"])
        self.assertTrue(all(status < 300 for status in reports["peer-kvflow"]["workflows_declared"]))
        self.assertEqual(reports["peer-kvflow"]["metrics"]["num_failed_calls"], 0)
        self.assertGreater(reports["peer-kvflow"]["metrics"]["calls_per_s"], 0)
        self.assertIn("peer/kvflow", summary["rows"])
        self.assertIn("1.08x over HiCache", stdout)

    def test_kvflow_concurrency_sweep(self):
        stdout, reports, summary = self.run_script(
            "kvflow_setting.sh", "kvflow", out_name="kvflow_sweep", PRESET="sweep", WORKFLOWS_SWEEP="1 2",
            FIXED_CONCURRENT="24", KV_CONCURRENT="6000000", HOST="8M", POINT_LIMIT="3",
            POINTS="sweep1-hicache sweep1-kvflow sweep2-kvflow", LOOM_BENCH_ARGS=SMALL + " --agents 3")
        self.assertEqual(sorted(reports), ["sweep1-hicache", "sweep1-kvflow", "sweep2-kvflow"])
        self.assertEqual(reports["sweep1-kvflow"]["arrivals"]["concurrency"], 1)  # each point its concurrency
        self.assertEqual(reports["sweep2-kvflow"]["arrivals"]["concurrency"], 2)
        self.assertEqual(len(reports["sweep2-kvflow"]["workflows_declared"]), 2)
        self.assertIsNotNone(summary["rows"]["sweep1/kvflow"]["vs_hicache"])  # both sides ran at 1 workflow
        self.assertIsNone(summary["rows"]["sweep2/kvflow"]["vs_hicache"])    # no baseline at 2: no ratio
        self.assertLess(stdout.index("| sweep1 |"), stdout.index("| sweep2 |"))

    def test_kvflow_peer_sweep(self):
        stdout, reports, summary = self.run_script(
            "kvflow_setting.sh", "kvflow", out_name="kvflow_peersweep", PRESET="peersweep",
            WORKFLOWS_PEER_SWEEP="1 2", KV_CONCURRENT="6000000", HOST="8M", POINT_LIMIT="3", PEER_LIMIT="3",
            POINTS="peer1-hicache peer1-kvflow peer2-kvflow",
            LOOM_BENCH_ARGS=SMALL + " --context-tokens 16 --instruction-tokens 8 --output-tokens 4")
        self.assertEqual(sorted(reports), ["peer1-hicache", "peer1-kvflow", "peer2-kvflow"])
        self.assertEqual(len(reports["peer1-kvflow"]["workflows_declared"]), 1)  # each point its workflows
        self.assertEqual(len(reports["peer2-kvflow"]["workflows_declared"]), 2)
        self.assertIn("--synthetic-outputs", reports["peer2-kvflow"]["command"])
        self.assertIsNotNone(summary["rows"]["peer1/kvflow"]["vs_hicache"])
        self.assertIsNone(summary["rows"]["peer2/kvflow"]["vs_hicache"])  # no baseline at 2: no ratio
        self.assertLess(stdout.index("| peer1 |"), stdout.index("| peer2 |"))
        self.assertIn("1.08x over HiCache", stdout)  # the PEER figure beside each peerN row

    def test_seed_plots_draw_each_study_from_the_figures_file(self):
        out = os.path.join(self.directory, "plots")
        figures = os.path.join(ROOT, "bench", "results", "seeds", "figures.json")
        result = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cuda", "seed_plots.py"), "--figures",
                                 figures, "--out", out], capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        for name in ("icarus", "kvflow", "forkkv"):
            with open(os.path.join(out, f"{name}.png"), "rb") as file:
                self.assertEqual(file.read(8), b"\x89PNG\r\n\x1a\n")
        # A study missing from the figures file is an error, not an empty plot.
        with open(figures) as file:
            partial = json.load(file)
        del partial["forkkv"]
        partial_path = os.path.join(self.directory, "partial_figures.json")
        with open(partial_path, "w") as file:
            json.dump(partial, file)
        result = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cuda", "seed_plots.py"), "--figures",
                                 partial_path, "--out", out], capture_output=True, text=True, timeout=120)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("forkkv", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
