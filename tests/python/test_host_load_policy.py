"""`loom serve --host-load-policy blocking|background` against real servers on one tiny model, each with a
device pool of 128 tokens and a host tier: both accept the flag and say so in their effective config, and
prompts pushed off the device and served again from the host (alone, and beside other requests running) give
the same greedy tokens under both policies, as loads from the host (loom_loaded_tokens_total) on both."""
import concurrent.futures
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
# 2 layers x K, V x 2 kv heads x 16 x fp32 = 512 bytes a token: a 128-token device pool.
HOST_TIER = ["--kv-cache-bytes", "64K", "--host-kv-memory", "2M", "--max-batch-tokens", "64"]
POLICIES = ("blocking", "background")


def token_prompt(length, seed):
    return [10 + (i * 37 + seed * 101 + i * i * seed) % 240 for i in range(length)]


class HostLoadPolicyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = {}
        model_dir = None
        for policy in POLICIES:
            server = loom_server.LoomServer(HOST_TIER + ["--host-load-policy", policy], num_adapters=1,
                                            model_dir=model_dir)
            model_dir = model_dir or server.model_dir
            cls.servers[policy] = server
        cls.clients = {policy: openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0,
                                             timeout=120) for policy, server in cls.servers.items()}

    @classmethod
    def tearDownClass(cls):
        statuses = [server.stop() for server in reversed(list(cls.servers.values()))]
        for server in cls.servers.values():
            server.cleanup()
        assert statuses == [0, 0], f"loom serve exited with {statuses} on SIGTERM"

    def complete(self, policy, prompt, max_tokens):
        choice = self.clients[policy].completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                                         **GREEDY)
        return choice.choices[0].text, choice.usage.prompt_tokens_details.cached_tokens

    def scenario(self, policy, seed):
        """A prompt, others that push it to the host, then it again beside three fresh requests."""
        prompt = token_prompt(40, seed)
        first = self.complete(policy, prompt, 6)
        for other in range(seed + 1, seed + 6):
            self.complete(policy, token_prompt(40, other), 1)
        fresh = [token_prompt(12, seed + 50 + i) for i in range(3)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            again = pool.submit(self.complete, policy, prompt, 6)
            others = [pool.submit(self.complete, policy, p, 8) for p in fresh]
            return first, again.result(), [o.result()[0] for o in others]

    def test_the_flag_is_in_the_effective_config(self):
        for policy, server in self.servers.items():
            line = next(line for line in server.read_log().splitlines() if "config: {" in line)
            self.assertEqual(json.loads(line[line.index("{"):])["host_load_policy"], policy)

    def test_both_policies_give_the_same_tokens_from_the_host_tier(self):
        results = {}
        for policy in POLICIES:
            before = self.servers[policy].metrics().get("loom_loaded_tokens_total", 0)
            results[policy] = [self.scenario(policy, seed) for seed in (1, 20)]
            after = self.servers[policy].metrics().get("loom_loaded_tokens_total", 0)
            self.assertGreater(after, before, f"{policy}: nothing loaded from the host")
            for first, again, _ in results[policy]:
                self.assertEqual(again[0], first[0], policy)  # served from the host: the same tokens
                self.assertGreater(again[1], 0, policy)       # a hit
        texts = {policy: [(first[0], again[0], others) for first, again, others in runs]
                 for policy, runs in results.items()}
        self.assertEqual(texts["blocking"], texts["background"])


if __name__ == "__main__":
    unittest.main()
