"""`loom serve --tensor-parallel-size 2` on the CPU (ranks on threads) against the
same model served whole, through the real `openai` client: greedy completions
with logprobs in every KV sharing mode and the base model, structured output,
and a prompt served again from the host tier give the same tokens; /metrics
and the effective config say how the model is sharded."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
MODES = {"adapter0": "activated", "adapter1": "base", "adapter2": "forked", "adapter3": "isolated"}
INVOCATION = [512 // 2 + 3, 512 // 2 + 7]  # synthetic_alora_invocation_tokens of the tiny model
# A main device pool of 128 tokens (2 layers x K, V x 2 kv heads x 16 x fp32 = 512 bytes a token) beside a
# 128K rCache pool, and a host tier.
HOST_TIER = ["--kv-cache-bytes", "192K", "--residual-kv-cache-memory", "128K", "--host-kv-memory", "2M",
             "--max-lora-rank", "16"]


def token_prompt(length, seed):
    return [10 + (i * 37 + seed * 101 + i * i * seed) % 240 for i in range(length)]


class TensorParallelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.whole = loom_server.LoomServer(HOST_TIER, make_model_args=["--alora"], lora_modes=MODES)
        cls.sharded = loom_server.LoomServer(HOST_TIER + ["--tensor-parallel-size", "2"], lora_modes=MODES,
                                             model_dir=cls.whole.model_dir)
        cls.clients = [openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
                       for server in (cls.whole, cls.sharded)]

    @classmethod
    def tearDownClass(cls):
        statuses = [server.stop() for server in (cls.sharded, cls.whole)]
        cls.sharded.cleanup()
        cls.whole.cleanup()
        assert statuses == [0, 0], f"loom serve exited with {statuses} on SIGTERM"

    def both(self, call):
        return [call(client) for client in self.clients]

    def test_every_mode_gives_the_same_tokens_and_logprobs(self):
        shared = token_prompt(24, 1)
        for model, prompt in [("tiny", shared), ("adapter0", shared + INVOCATION + [40, 41]),
                              ("adapter1", shared), ("adapter2", shared + [9]), ("adapter3", shared)]:
            whole, sharded = self.both(lambda client: client.completions.create(
                model=model, prompt=prompt, max_tokens=8, logprobs=1, **GREEDY).choices[0])
            self.assertEqual(sharded.text, whole.text, model)
            for got, want in zip(sharded.logprobs.token_logprobs, whole.logprobs.token_logprobs):
                self.assertAlmostEqual(got, want, delta=1e-3, msg=model)

    def test_structured_output_is_the_same(self):
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                   "count": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["name", "count"], "additionalProperties": False}
        whole, sharded = self.both(lambda client: client.chat.completions.create(
            model="adapter3", messages=[{"role": "user", "content": "give me one"}], max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}},
            temperature=0.0).choices[0].message.content)
        self.assertEqual(sharded, whole)
        self.assertEqual(list(json.loads(sharded)), ["name", "count"])

    def test_a_prompt_comes_back_from_the_host_tier(self):
        prompt = token_prompt(40, 9)
        first = self.clients[1].completions.create(model="tiny", prompt=prompt, max_tokens=4, **GREEDY)
        # Other prompts push it off the 128-token device pool; the host tier keeps a copy.
        for seed in range(10, 16):
            self.clients[1].completions.create(model="tiny", prompt=token_prompt(40, seed), max_tokens=1, **GREEDY)
        again = self.clients[1].completions.create(model="tiny", prompt=prompt, max_tokens=4, **GREEDY)
        self.assertEqual(again.choices[0].text, first.choices[0].text)
        self.assertGreater(again.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertGreater(self.sharded.metrics().get("loom_loaded_tokens_total", 0), 0)  # loaded from the host

    def test_the_config_says_how_the_model_is_sharded(self):
        status, _, body = self.sharded.request("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertIn('"tensor_parallel_size":2', self.sharded.read_log())


if __name__ == "__main__":
    unittest.main()
