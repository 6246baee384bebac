"""Black-box tests of the KV sharing modes (isolated, activated, base, forked)
through `loom serve` and the real `openai` client: one server serves adapters in
every mode, concurrent requests mixing them (and the base model) give what each
gives alone, /v1/models and /metrics report the modes, and the runtime load
body takes "kv_sharing"."""
import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
MODES = {"adapter0": "activated", "adapter1": "base", "adapter2": "forked", "adapter3": "isolated"}
VOCAB = 512
INVOCATION = [VOCAB // 2 + 3, VOCAB // 2 + 7]  # synthetic_alora_invocation_tokens of the tiny model


def token_prompt(length, seed):
    """Ordinary token ids (never the invocation tokens)."""
    return [10 + (i * 37 + seed * 101 + i * i * seed) % 240 for i in range(length)]


class KvSharingTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--allow-runtime-lora", "--max-lora-rank", "16"]
    SERVER_KWARGS = {"make_model_args": ["--alora"], "lora_modes": MODES}

    def complete(self, model, prompt, max_tokens=8):
        response = self.client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, logprobs=1,
                                                  **GREEDY)
        return response.choices[0].text, response.choices[0].logprobs.token_logprobs

    def test_models_show_each_mode(self):
        models = {model.id: model.model_extra for model in self.client.models.list().data}
        for name, mode in MODES.items():
            self.assertEqual(models[name]["kv_sharing"], mode, name)
        self.assertNotIn("kv_sharing", models["tiny"])

    def test_concurrent_requests_mixing_every_mode_match_solo_runs(self):
        shared = token_prompt(20, 1)
        jobs = []
        for round_index in range(3):
            tail = token_prompt(3 + round_index, 2 + round_index)
            jobs += [("tiny", shared + tail),
                     ("adapter0", shared + INVOCATION + tail),  # activated: base K/V before the invocation
                     ("adapter0", shared + tail),                # not invoked: the base model answers
                     ("adapter1", shared + tail),
                     ("adapter2", token_prompt(18 + round_index, 7 + round_index)),
                     ("adapter3", shared + tail)]

        async def run_all():
            client = openai.AsyncOpenAI(base_url=self.server.base_url + "/v1", api_key="unused", max_retries=0,
                                        timeout=120)

            async def one(model, prompt):
                response = await client.completions.create(model=model, prompt=prompt, max_tokens=8, logprobs=1,
                                                           **GREEDY)
                return response.choices[0].text, response.choices[0].logprobs.token_logprobs

            try:
                return await asyncio.gather(*(one(model, prompt) for model, prompt in jobs))
            finally:
                await client.close()

        together = asyncio.run(run_all())
        for (model, prompt), (text, logprobs) in zip(jobs, together):
            solo_text, solo_logprobs = self.complete(model, prompt)
            self.assertEqual(text, solo_text, model)
            for got, want in zip(logprobs, solo_logprobs):
                self.assertAlmostEqual(got, want, delta=1e-3, msg=model)
        # Not invoked, the activated adapter is the base model.
        self.assertEqual(self.complete("adapter0", shared + token_prompt(3, 2))[0],
                         self.complete("tiny", shared + token_prompt(3, 2))[0])

        samples = self.server.metrics()
        for mode in ["none", "activated", "base", "forked", "isolated"]:
            self.assertGreater(samples[f'loom_prefix_cache_queried_tokens_total{{mode="{mode}"}}'], 0, mode)
        # The activated requests found the shared context in the base namespace.
        self.assertGreater(samples['loom_prefix_cache_hit_tokens_total{mode="activated"}'], 0)
        self.assertGreater(samples['loom_kv_cache_bytes{tier="device",kind="residual"}'], 0)
        self.assertGreater(samples['loom_kv_cache_adapter_bytes{adapter="adapter2"}'], 0)
        self.assertEqual(samples['loom_kv_cache_adapter_bytes{adapter="adapter1"}'], 0)  # base mode owns nothing
        self.assertGreater(samples['loom_kv_cache_bytes_per_token{kind="base"}'],
                           samples['loom_kv_cache_bytes_per_token{kind="residual"}'])

    def test_runtime_load_with_kv_sharing(self):
        path = os.path.join(self.server.adapter_dir, "adapter3")
        status, _, body = self.server.request("POST", "/v1/load_lora_adapter",
                                              {"lora_name": "late_fork", "lora_path": path, "kv_sharing": "forked"})
        self.assertEqual(status, 200, body)
        status, _, body = self.server.request("POST", "/v1/load_lora_adapter",
                                              {"lora_name": "late_base", "lora_path": path, "kv_sharing": "base"})
        self.assertEqual(status, 200, body)
        models = {model.id: model.model_extra for model in self.client.models.list().data}
        self.assertEqual(models["late_fork"]["kv_sharing"], "forked")
        self.assertEqual(models["late_base"]["kv_sharing"], "base")
        # Forked alone is the isolated adapter (same math, other cache layout).
        prompt = token_prompt(15, 40)
        self.assertEqual(self.complete("late_fork", prompt)[0], self.complete("adapter3", prompt)[0])
        self.assertGreater(len(self.complete("late_base", prompt)[0]), 0)
        for name in ["late_fork", "late_base"]:
            status, _, body = self.server.request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
            self.assertEqual(status, 200, body)

    def test_bad_kv_sharing_is_400_naming_the_modes(self):
        path = os.path.join(self.server.adapter_dir, "adapter3")
        for bad in ["shared", "FORKED", 3]:
            status, _, body = self.server.request("POST", "/v1/load_lora_adapter",
                                                  {"lora_name": "bad", "lora_path": path, "kv_sharing": bad})
            self.assertEqual(status, 400, body)
            for mode in ["isolated", "activated", "base", "forked"]:
                self.assertIn(mode, body.decode())
        models = [model.id for model in self.client.models.list().data]
        self.assertNotIn("bad", models)


class DisabledKvSharingTest(loom_server.ServerTestCase):
    """`--disable-kv-sharing base`: a base adapter is refused at load (400 naming who refused), the server and
    every other adapter keep serving."""

    SERVER_ARGS = ["--allow-runtime-lora", "--disable-kv-sharing", "base"]
    SERVER_KWARGS = {"num_adapters": 2}

    def test_base_adapter_is_refused_at_load_and_nothing_else_changes(self):
        prompt = token_prompt(12, 7)
        before = self.client.completions.create(model="adapter0", prompt=prompt, max_tokens=6, **GREEDY)
        path = os.path.join(self.server.adapter_dir, "adapter1")
        status, _, body = self.server.request("POST", "/v1/load_lora_adapter",
                                              {"lora_name": "critic", "lora_path": path, "kv_sharing": "base"})
        self.assertEqual(status, 400, body)
        self.assertIn("adapter 'critic': kv_sharing 'base' is disabled on this server by --disable-kv-sharing",
                      body.decode())
        models = [model.id for model in self.client.models.list().data]
        self.assertNotIn("critic", models)
        status, _, body = self.server.request("POST", "/v1/load_lora_adapter",
                                              {"lora_name": "critic", "lora_path": path, "kv_sharing": "isolated"})
        self.assertEqual(status, 200, body)
        self.assertGreater(len(self.client.completions.create(model="critic", prompt=prompt, max_tokens=4,
                                                              **GREEDY).choices[0].text), 0)
        after = self.client.completions.create(model="adapter0", prompt=prompt, max_tokens=6, **GREEDY)
        self.assertEqual(after.choices[0].text, before.choices[0].text)


if __name__ == "__main__":
    unittest.main()
