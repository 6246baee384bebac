"""Black-box tests of `loom serve` with the real `openai` client: completions,
chat, streaming, models, adapters by name, logprobs, stop sequences, runtime
adapters, bad inputs, concurrency across adapters and disconnects."""
import asyncio
import http.client
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


class OpenAiApiTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--allow-runtime-lora", "--max-request-bytes", "65536", "--max-context-tokens", "4096"]

    def complete(self, model="tiny", prompt=PROMPT, max_tokens=12, **kwargs):
        return self.client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                              **{**GREEDY, **kwargs})

    def stream_text(self, **kwargs):
        stream = self.client.completions.create(stream=True, **{**GREEDY, **kwargs})
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    def test_models_list_base_and_adapters(self):
        models = {model.id: model for model in self.client.models.list().data}
        self.assertIn("tiny", models)
        for name in self.server.adapter_names:
            self.assertIn(name, models)
            self.assertEqual(models[name].model_extra["parent"], "tiny")

    def test_completion_shape_and_usage(self):
        response = self.complete()
        self.assertEqual(response.object, "text_completion")
        self.assertTrue(response.id.startswith("cmpl-"))
        self.assertEqual(response.model, "tiny")
        choice = response.choices[0]
        self.assertEqual(choice.finish_reason, "length")
        self.assertGreater(len(choice.text), 0)
        self.assertEqual(response.usage.completion_tokens, 12)
        self.assertEqual(response.usage.total_tokens, response.usage.prompt_tokens + 12)

    def test_streaming_equals_non_streaming(self):
        for model in ["tiny", self.server.adapter_names[1]]:
            whole = self.complete(model=model).choices[0].text
            self.assertEqual(self.stream_text(model=model, prompt=PROMPT, max_tokens=12), whole)

    def test_adapters_change_output(self):
        texts = {name: self.complete(model=name, max_tokens=16).choices[0].text
                 for name in ["tiny"] + self.server.adapter_names}
        self.assertGreater(len(set(texts.values())), 1, texts)

    def test_token_id_prompt(self):
        response = self.complete(prompt=[5, 6, 7, 8], max_tokens=4)
        self.assertEqual(response.usage.prompt_tokens, 4)
        self.assertEqual(response.usage.completion_tokens, 4)

    def test_chat_and_chat_stream(self):
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
        response = self.client.chat.completions.create(model=self.server.adapter_names[0], messages=messages,
                                                       max_completion_tokens=10, **GREEDY)
        self.assertEqual(response.object, "chat.completion")
        self.assertEqual(response.choices[0].message.role, "assistant")
        self.assertEqual(response.usage.completion_tokens, 10)
        chunks = list(self.client.chat.completions.create(
            model=self.server.adapter_names[0], messages=messages, max_completion_tokens=10, stream=True,
            stream_options={"include_usage": True}, **GREEDY))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 10)
        self.assertEqual(chunks[-2].choices[0].finish_reason, "length")
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        self.assertEqual(text, response.choices[0].message.content)

    def test_logprobs(self):
        response = self.complete(max_tokens=5, logprobs=2)
        logprobs = response.choices[0].logprobs
        self.assertEqual(len(logprobs.tokens), 5)
        self.assertEqual(len(logprobs.token_logprobs), 5)
        self.assertEqual("".join(logprobs.tokens), response.choices[0].text)
        for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
            self.assertLessEqual(logprob, 0.0)
            self.assertIn(token, top)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(max(top.values()), logprob, places=4)
        chat = self.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4, logprobs=True, top_logprobs=3, **GREEDY)
        content = chat.choices[0].logprobs.content
        self.assertEqual(len(content), 4)
        for item in content:
            self.assertEqual(len(item.top_logprobs), 3)
            self.assertAlmostEqual(item.top_logprobs[0].logprob, item.logprob, places=4)
            self.assertEqual(bytes(item.bytes).decode("utf-8", "replace"), item.token)

    def test_stop_sequences(self):
        full = self.complete(max_tokens=24).choices[0].text
        stop = full[len(full) // 2:len(full) // 2 + 2]
        self.assertTrue(stop.strip(), f"degenerate stop from {full!r}")
        expected = full[:full.index(stop)]
        response = self.complete(max_tokens=24, stop=[stop])
        self.assertEqual(response.choices[0].text, expected)
        self.assertEqual(response.choices[0].finish_reason, "stop")
        self.assertEqual(self.stream_text(model="tiny", prompt=PROMPT, max_tokens=24, stop=stop), expected)

    def test_logit_bias_and_penalties(self):
        plain = self.complete(max_tokens=6, logprobs=1).choices[0].logprobs.tokens
        forced = self.complete(max_tokens=6, logprobs=1, logit_bias={"300": 100}).choices[0].logprobs
        self.assertEqual(len(set(forced.tokens)), 1, forced.tokens)  # token 300 every time
        self.assertNotEqual(forced.tokens, plain)
        self.assertLess(forced.token_logprobs[0], max(forced.top_logprobs[0].values()) + 1e-6)  # raw logprobs
        both = self.complete(max_tokens=8, presence_penalty=1.5, frequency_penalty=0.5, extra_body={
            "repetition_penalty": 1.3, "min_p": 0.05, "ignore_eos": True})
        self.assertEqual(both.usage.completion_tokens, 8)

    def test_presence_and_frequency_penalties_follow_their_definition(self):
        # Logprobs are the raw model's; greedy under penalties must take, at every
        # step, the best of logprob - frequency * count - presence * (count > 0)
        # over the output so far (vLLM's definition), and some step must differ
        # from the raw argmax. Tokens come back as "token_id:<id>" to count them.
        top, presence, frequency = 20, 1.5, 0.7
        choice = self.complete(max_tokens=64, logprobs=top, presence_penalty=presence, frequency_penalty=frequency,
                               extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}).choices[0]
        logprobs = choice.logprobs
        self.assertTrue(all(t.startswith("token_id:") for t in logprobs.tokens), logprobs.tokens[:3])
        counts, changed = {}, False
        for chosen, alternatives in zip(logprobs.tokens, logprobs.top_logprobs):
            def penalised(token):
                count = counts.get(token, 0)
                return alternatives[token] - frequency * count - (presence if count else 0.0)
            best = max(penalised(token) for token in alternatives)
            self.assertGreaterEqual(penalised(chosen), best - 1e-4, (chosen, alternatives, counts))
            # No token outside the top list can beat it: their raw logprobs are below all of these.
            self.assertGreaterEqual(penalised(chosen), sorted(alternatives.values())[-top] - 1e-4)
            changed = changed or chosen != max(alternatives, key=alternatives.get)
            counts[chosen] = counts.get(chosen, 0) + 1
        self.assertTrue(changed, ("the penalties never changed a choice", logprobs.tokens))
        plain = self.complete(max_tokens=64, logprobs=1, extra_body={"ignore_eos": True,
                                                                     "return_tokens_as_token_ids": True})
        self.assertNotEqual(plain.choices[0].logprobs.tokens, logprobs.tokens)

    def test_echo_and_include_stop_str(self):
        full = self.complete(max_tokens=24).choices[0].text
        echoed = self.complete(max_tokens=24, echo=True).choices[0].text
        self.assertEqual(echoed, PROMPT + full)
        self.assertEqual(self.stream_text(model="tiny", prompt=PROMPT, max_tokens=24, echo=True), PROMPT + full)
        by_ids = self.client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=2, echo=True, **GREEDY)
        self.assertGreater(len(by_ids.choices[0].text), len(self.complete(prompt=[5, 6, 7], max_tokens=2)
                                                            .choices[0].text))
        stop = full[len(full) // 2:len(full) // 2 + 2]
        expected = full[:full.index(stop)]
        kept = self.complete(max_tokens=24, stop=[stop],
                             extra_body={"include_stop_str_in_output": True, "ignore_eos": True})
        self.assertEqual(kept.choices[0].text, expected + stop)
        self.assertEqual(kept.choices[0].finish_reason, "stop")

    def test_seeded_sampling_repeats(self):
        kwargs = {"temperature": 1.0, "seed": 1234, "max_tokens": 12}
        first = self.client.completions.create(model="tiny", prompt=PROMPT, **kwargs).choices[0].text
        second = self.client.completions.create(model="tiny", prompt=PROMPT, **kwargs).choices[0].text
        self.assertEqual(first, second)

    def test_runtime_load_and_unload(self):
        name = self.server.adapter_names[2]
        path = os.path.join(self.server.adapter_dir, name)
        status, _, body = self.server.request("POST", "/v1/load_lora_adapter",
                                              {"lora_name": "runtime", "lora_path": path})
        self.assertEqual(status, 200, body)
        self.assertIn("runtime", [model.id for model in self.client.models.list().data])
        self.assertEqual(self.complete(model="runtime").choices[0].text, self.complete(model=name).choices[0].text)
        status, _, _ = self.server.request("POST", "/v1/load_lora_adapter",
                                           {"lora_name": "runtime", "lora_path": path})
        self.assertEqual(status, 400)
        status, _, _ = self.server.request("POST", "/v1/unload_lora_adapter", {"lora_name": "runtime"})
        self.assertEqual(status, 200)
        with self.assertRaises(openai.NotFoundError):
            self.complete(model="runtime")
        status, _, _ = self.server.request("POST", "/v1/unload_lora_adapter", {"lora_name": "runtime"})
        self.assertEqual(status, 404)
        status, _, _ = self.server.request("POST", "/v1/load_lora_adapter",
                                           {"lora_name": "broken", "lora_path": self.server.directory})
        self.assertEqual(status, 400)

    def test_bad_inputs_get_status_and_server_keeps_serving(self):
        chat = "/v1/chat/completions"
        cases = [
            ("/v1/completions", None, b"{not json", 400),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": "many"}, None, 400),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "temperature": "hot"}, None, 400),
            ("/v1/completions", {"model": "tiny", "prompt": 12}, None, 400),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 0}, None, 400),
            ("/v1/completions", {"model": "no-such-model", "prompt": "x"}, None, 404),
            ("/v1/completions", {"model": "tiny", "prompt": "x" * 70000}, None, 413),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 100000}, None, 400),
            ("/v1/completions", {"model": "tiny", "prompt": [1] * 4000, "max_tokens": 100}, None, 400),
            (chat, {"model": "tiny", "messages": []}, None, 400),
            (chat, {"model": "tiny", "messages": [{"role": "user"}], "logprobs": "yes"}, None, 400),
            (chat, {"model": "tiny", "messages": [{"content": "no role"}]}, None, 400),
        ]
        for path, body, raw, status in cases:
            with self.subTest(path=path, body=str(body)[:80]):
                got, _, response = self.server.request("POST", path, body, raw=raw)
                self.assertEqual(got, status, response[:300])
                error = json.loads(response)["error"]
                self.assertIsInstance(error["message"], str)
                self.assertIn("type", error)
                self.assertEqual(self.complete(max_tokens=2).usage.completion_tokens, 2)
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
        with self.assertRaises(openai.NotFoundError):
            self.complete(model="ghost")

    def test_concurrent_streams_across_adapters_match_solo_runs(self):
        models = ["tiny"] + self.server.adapter_names
        prompts = ["Once upon a time", "def main():", "The capital of", "1, 2, 3,"]
        jobs = [(models[i % len(models)], prompts[(i // len(models)) % len(prompts)]) for i in range(64)]
        solo = {job: self.complete(model=job[0], prompt=job[1], max_tokens=10).choices[0].text for job in set(jobs)}

        async def run_all():
            client = openai.AsyncOpenAI(base_url=self.server.base_url + "/v1", api_key="unused", max_retries=0,
                                        timeout=120)

            async def one(model, prompt):
                stream = await client.completions.create(model=model, prompt=prompt, max_tokens=10, stream=True,
                                                         **GREEDY)
                return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

            try:
                return await asyncio.gather(*(one(model, prompt) for model, prompt in jobs))
            finally:
                await client.close()

        texts = asyncio.run(run_all())
        for job, text in zip(jobs, texts):
            self.assertEqual(text, solo[job], job)

    def test_disconnect_mid_stream_frees_kv(self):
        in_use = 'loom_kv_cache_blocks{state="in_use"}'
        generated = "loom_generation_tokens_total"
        before = self.server.metrics()[in_use]
        generated_before = self.server.metrics()[generated]
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        body = {"model": self.server.adapter_names[3], "prompt": "a long story", "max_tokens": 4000, "stream": True,
                "ignore_eos": True, "temperature": 0.0}
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        self.assertEqual(response.status, 200)
        self.assertEqual(response.read(6), b"data: ")  # generation has started
        self.assertGreater(self.server.metrics()[in_use], before)
        connection.sock.close()
        connection.close()
        deadline = time.time() + 20
        while time.time() < deadline and self.server.metrics()[in_use] != before:
            time.sleep(0.1)
        samples = self.server.metrics()
        self.assertEqual(samples[in_use], before)
        self.assertLess(samples[generated] - generated_before, 4000)  # cancelled, not run to the end
        self.assertEqual(self.complete(max_tokens=2).usage.completion_tokens, 2)

    def test_metrics_and_health(self):
        self.complete(max_tokens=3)
        status, headers, body = self.server.request("GET", "/health")
        self.assertEqual(status, 200)
        samples = self.server.metrics()
        for name in ["loom_num_requests_running", "loom_num_requests_waiting",
                     "loom_prefix_cache_queried_tokens_total", "loom_prefix_cache_hit_tokens_total",
                     'loom_kv_cache_bytes{tier="device",kind="base"}', "loom_time_to_first_token_seconds_count"]:
            self.assertIn(name, samples)
        self.assertGreater(samples["loom_time_to_first_token_seconds_count"], 0)
        self.assertGreater(samples['loom_time_to_first_token_seconds_bucket{le="+Inf"}'], 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
