"""The disk KV tier across processes, against real `loom serve`s: two servers
on one --disk-kv-path share KV (a prompt one prefilled is a disk hit for the
other, same greedy tokens), a restart with --disk-kv-warm-start is warm, a
server killed with SIGKILL while writing leaves no block that reads back
wrong, and the tier="disk" metrics count it all."""
import concurrent.futures
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

BLOCK = 4  # loom_server's --block-size


def prompt(seed, length=61):
    return [10 + (seed * 31 + i * 7 + (i * i) % 13) % 400 for i in range(length)]


def full_block_tokens(tokens):
    return (len(tokens) - 1) // BLOCK * BLOCK  # the last prompt token is never looked up


class DiskTierTest(unittest.TestCase):
    def setUp(self):
        self.disk = tempfile.mkdtemp(prefix="loom-disk-")
        self.servers = []

    def tearDown(self):
        for server in self.servers:
            server.stop()
            server.cleanup()
        shutil.rmtree(self.disk, ignore_errors=True)

    def start(self, model_dir=None, warm=False, disk=True):
        args = ["--host-kv-memory", "4M"]
        if disk:
            args += ["--disk-kv-path", self.disk, "--disk-kv-bytes", "256M"]
        if warm:
            args.append("--disk-kv-warm-start")
        server = loom_server.LoomServer(args, num_adapters=1, model_dir=model_dir)
        self.servers.append(server)
        return server

    @staticmethod
    def complete(server, tokens, max_tokens=6):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        response = client.completions.create(model="tiny", prompt=tokens, max_tokens=max_tokens, temperature=0.0,
                                             extra_body={"ignore_eos": True})
        return response.choices[0].text, response.usage.prompt_tokens_details.cached_tokens

    @staticmethod
    def wait_stored(server, num_blocks, timeout=20.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if server.metrics().get("loom_disk_kv_stored_blocks_total", 0) >= num_blocks:
                return
            time.sleep(0.05)
        raise AssertionError(f"fewer than {num_blocks} blocks stored: {server.metrics()}")

    def test_two_servers_share_kv_and_a_restart_is_warm(self):
        first = self.start()
        second = self.start(model_dir=first.model_dir)
        tokens = prompt(1)
        text, cached = self.complete(first, tokens)
        self.assertEqual(cached, 0)
        self.wait_stored(first, full_block_tokens(tokens) // BLOCK)

        # A prefill by one server is a disk hit for the other, with the same greedy tokens.
        before = second.metrics()
        self.assertEqual(self.complete(second, tokens), (text, full_block_tokens(tokens)))
        after = second.metrics()
        self.assertGreaterEqual(after["loom_disk_kv_loaded_tokens_total"] - before["loom_disk_kv_loaded_tokens_total"],
                                full_block_tokens(tokens))
        self.assertEqual(after['loom_disk_kv_failures_total{op="read"}'], 0)
        self.assertGreater(after['loom_kv_cache_bytes{tier="disk",kind="all"}'], 0)
        self.assertIn('loom_kv_cache_usage_perc{tier="disk",kind="all"}', after)

        # A restart with warm start knows the directory at once and hits its old prefixes.
        self.assertEqual(first.stop(), 0)
        restarted = self.start(model_dir=first.model_dir, warm=True)
        self.assertGreaterEqual(restarted.metrics()["loom_disk_kv_blocks"], full_block_tokens(tokens) // BLOCK)
        self.assertEqual(self.complete(restarted, tokens), (text, full_block_tokens(tokens)))

    def test_a_writer_killed_mid_write_leaves_no_wrong_block(self):
        writer = self.start()
        prompts = [prompt(100 + i, length=41 + i % 5) for i in range(24)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(self.complete, writer, tokens) for tokens in prompts]
            time.sleep(0.3)
            writer.process.kill()  # SIGKILL while requests (and their write-through) are in flight
            writer.process.wait()
            for future in futures:
                try:
                    future.result()
                except Exception:  # noqa: BLE001 - requests cut by the kill
                    pass
        reference = self.start(model_dir=writer.model_dir, disk=False)
        reader = self.start(model_dir=writer.model_dir, warm=True)
        hits = 0
        for tokens in prompts:
            text, cached = self.complete(reader, tokens)
            self.assertEqual(text, self.complete(reference, tokens)[0])
            hits += cached
        self.assertEqual(reader.metrics()['loom_disk_kv_failures_total{op="read"}'], 0)
        print(f"[ disk ] {hits} prompt tokens hit on disk after the kill")


if __name__ == "__main__":
    unittest.main()
