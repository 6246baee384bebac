"""A short soak (bench/soak/soak.py, under a minute) against a real `loom serve` on the CPU: 16 clients mixing
the base model and adapters in every KV sharing mode (activated, base, forked, isolated), completions and
chats, streamed and whole, clients that drop mid-stream and bad requests, over a small KV pool with a host
tier. The soak itself fails on RSS growth after warm-up beyond 10%, a cache over its limit, any 5xx or lost
answer, KV blocks left in use once idle, or an unclean exit; this test also checks that every mode was served."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SoakTest(unittest.TestCase):
    def test_short_soak_with_adapters_in_every_mode_keeps_rss_flat(self):
        with tempfile.TemporaryDirectory(prefix="loom-soak-") as directory:
            model = os.path.join(directory, "model")
            subprocess.run([loom_server.loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny",
                            "--adapters", "4", "--alora", "--out", model], check=True, stdout=subprocess.DEVNULL)
            report_path = os.path.join(directory, "soak.json")
            result = subprocess.run(
                [sys.executable, os.path.join(ROOT, "bench", "soak", "soak.py"), "--loom", loom_server.loom_binary(),
                 "--model", model, "--device", "cpu", "--clients", "16", "--seconds", "50", "--warmup", "20",
                 "--sample-every", "2", "--max-rss-growth", "0.10", "--out", report_path, "--",
                 "--threads", "1", "--block-size", "4", "--kv-cache-bytes", "2M", "--host-kv-memory", "4M",
                 "--max-lora-rank", "16"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
            self.assertEqual(result.returncode, 0, result.stdout[-6000:])
            with open(report_path) as report_file:
                report = json.load(report_file)
        self.assertEqual(sorted(report["adapters"].values()), ["activated", "base", "forked", "isolated"])
        for mode in ["none", "activated", "base", "forked", "isolated"]:
            self.assertGreater(report["counts"].get("ok_" + mode, 0), 0, mode)
        self.assertGreater(report["counts"].get("dropped", 0), 0)
        self.assertGreater(report["counts"].get("bad_request_answered", 0), 0)
        caches = report["samples"][-1]["caches"]
        for cache in ["grammars", "chat_templates", "bpe_words"]:
            self.assertIn(cache, caches)


if __name__ == "__main__":
    unittest.main()
