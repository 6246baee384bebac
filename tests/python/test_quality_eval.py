"""bench/quality/eval.py end to end on the tiny random model with two synthetic
adapters (issue 39's harness in CI; the first also stands in for an ICaRus
adapter): every row of the table is served by a fresh `loom serve`, scored,
and reported with its interval; an --external row (another server, here a second
`loom serve` of the same model) is sent the same token ids and scores the
same items as the base-model row. The random model scores ~0; what is checked
is the plumbing and the report."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EVAL = os.path.join(HERE, "..", "..", "bench", "quality", "eval.py")


class QualityEvalTest(unittest.TestCase):
    def test_every_row_is_served_and_scored(self):
        with tempfile.TemporaryDirectory() as directory:
            model = os.path.join(directory, "model")
            subprocess.run([loom_server.loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny",
                            "--adapters", "2", "--alora", "--out", model], check=True, stdout=subprocess.DEVNULL)
            report_path = os.path.join(directory, "report.json")
            port = loom_server.free_port()
            external_log = open(os.path.join(directory, "external.log"), "w")
            external = subprocess.Popen([loom_server.loom_binary(), "serve", "--model", model, "--served-model-name",
                                         "base", "--port", str(port), "--threads", "1"],
                                        stdout=external_log, stderr=subprocess.STDOUT)
            try:
                loom_server.wait_healthy(external, f"http://127.0.0.1:{port}",
                                         lambda: open(external_log.name).read())
                result = self.run_eval(model, report_path, f"http://127.0.0.1:{port}")
            finally:
                loom_server.stop_process(external)
                external_log.close()
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(report_path) as report_file:
                report = json.load(report_file)
        self.assertEqual(report["task"], "sorting")
        self.assertEqual(report["heldout"], 6)
        self.assertEqual(sorted(report["rows"]), sorted([
            "base model", "lora:isolated", "lora:forked", "lora:forked-inherits", "lora:base", "alora:activated",
            "alora:isolated", "icarus:base", "icarus:isolated", "another server"]))
        self.assertTrue(report["complete"])
        for label, row in report["rows"].items():
            self.assertTrue(0.0 <= row["accuracy"] <= 1.0, label)
            low, high = row["interval95"]
            self.assertTrue(0.0 <= low <= row["accuracy"] <= high <= 1.0, (label, row))
            self.assertIsInstance(row["example"], str)
            self.assertEqual(len(row["correct"]), 6, label)
            self.assertAlmostEqual(sum(row["correct"]) / 6, row["accuracy"], places=3)
        # The same model and token ids, greedy: the same text (block sizes differ; fp32 attention, same order).
        self.assertEqual(report["rows"]["another server"]["example"], report["rows"]["base model"]["example"])
        self.assertEqual(report["rows"]["another server"]["correct"], report["rows"]["base model"]["correct"])

    def run_eval(self, model, report_path, external_url):
        return subprocess.run(
            [sys.executable, EVAL, "--loom", loom_server.loom_binary(), "--model", model, "--task", "sorting",
             "--adapter", f"lora={model}/adapters/adapter0", "--adapter", f"alora={model}/adapters/adapter1",
             "--adapter", f"icarus={model}/adapters/adapter0",
             "--heldout", "6", "--max-tokens", "4", "--concurrency", "3", "--kv-cache-bytes", "16M",
             "--external", f"another server={external_url}", "--out", report_path],
            capture_output=True, text=True, timeout=240)

    def test_rows_and_another_agent_as_the_writer(self):
        """--rows scores only the rows named; writer=DIR is the agent writing the inherited bCache."""
        with tempfile.TemporaryDirectory() as directory:
            model = os.path.join(directory, "model")
            subprocess.run([loom_server.loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny",
                            "--adapters", "2", "--out", model], check=True, stdout=subprocess.DEVNULL)
            report_path = os.path.join(directory, "report.json")
            command = [sys.executable, EVAL, "--loom", loom_server.loom_binary(), "--model", model, "--task",
                       "labelling", "--adapter", f"lora={model}/adapters/adapter0", "--adapter",
                       f"writer={model}/adapters/adapter1", "--heldout", "4", "--max-tokens", "2", "--concurrency",
                       "2", "--kv-cache-bytes", "16M", "--out", report_path]
            result = subprocess.run(command + ["--rows", "lora:forked-inherits,lora:isolated"], capture_output=True,
                                    text=True, timeout=240)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            with open(report_path) as report_file:
                report = json.load(report_file)
            self.assertEqual(sorted(report["rows"]), ["lora:forked-inherits", "lora:isolated"])
            self.assertEqual(report["adapters"]["writer"], os.path.normpath(f"{model}/adapters/adapter1"))
            refused = subprocess.run(command + ["--rows", "alora:activated"], capture_output=True, text=True,
                                     timeout=60)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("no row alora:activated", refused.stderr)


if __name__ == "__main__":
    unittest.main()
