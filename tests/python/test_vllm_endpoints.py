"""vLLM's extra endpoints and response fields against a real `loom serve`:
/ping, /version, /v1/models/{id}, /tokenize and /detokenize (prompt and chat
forms), GET /v1/workflows, usage.prompt_tokens_details.cached_tokens (the
request's prefix-cache hits) and system_fingerprint."""
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog " * 6


class VllmEndpointsTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--max-context-tokens", "2048"]
    SERVER_KWARGS = {"num_adapters": 1}

    def post(self, path, body):
        status, _, raw = self.server.request("POST", path, body)
        return status, json.loads(raw) if raw else None

    def test_ping_and_version(self):
        for method in ("GET", "POST"):
            status, _, _ = self.server.request(method, "/ping")
            self.assertEqual(status, 200, method)
        self.assertEqual(self.server.request("PUT", "/ping")[0], 405)
        status, _, raw = self.server.request("GET", "/version")
        self.assertEqual(status, 200)
        self.assertRegex(json.loads(raw)["version"], r"^\d+\.\d+\.\d+")

    def test_models_by_id(self):
        adapter = self.server.adapter_names[0]
        base = self.client.models.retrieve("tiny")
        self.assertEqual((base.id, base.object), ("tiny", "model"))
        model = self.client.models.retrieve(adapter)
        self.assertEqual(model.id, adapter)
        self.assertEqual(model.model_extra["parent"], "tiny")
        listed = {m.id: m.model_dump() for m in self.client.models.list().data}
        self.assertEqual(listed[adapter], model.model_dump())
        with self.assertRaises(openai.NotFoundError) as raised:
            self.client.models.retrieve("no-such-model")
        self.assertEqual(raised.exception.body["code"], "model_not_found")

    def test_tokenize_agrees_with_the_completion_routes(self):
        status, body = self.post("/tokenize", {"model": "tiny", "prompt": TEXT, "return_token_strs": True})
        self.assertEqual(status, 200)
        self.assertEqual(body["count"], len(body["tokens"]))
        self.assertEqual(body["max_model_len"], 2048)
        self.assertEqual(len(body["token_strs"]), body["count"])
        completion = self.client.completions.create(model="tiny", prompt=TEXT, max_tokens=1)
        self.assertEqual(completion.usage.prompt_tokens, body["count"])
        plain = self.post("/tokenize", {"prompt": TEXT, "add_special_tokens": False})[1]
        self.assertEqual(plain["tokens"], body["tokens"][body["count"] - plain["count"]:])  # less the BOS
        self.assertIsNone(plain["token_strs"])
        status, text = self.post("/detokenize", {"model": "tiny", "tokens": plain["tokens"]})
        self.assertEqual((status, text["prompt"]), (200, TEXT))
        # The chat form renders as the chat route does.
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]
        status, chat = self.post("/tokenize", {"messages": messages})
        self.assertEqual(status, 200)
        answer = self.client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
        self.assertEqual(answer.usage.prompt_tokens, chat["count"])
        no_prompt = self.post("/tokenize", {"messages": messages, "add_generation_prompt": False})[1]
        self.assertLess(no_prompt["count"], chat["count"])
        self.assertEqual(no_prompt["tokens"], chat["tokens"][:no_prompt["count"]])

    def test_tokenize_errors_name_the_field(self):
        cases = [
            ("/tokenize", {}, 400, "prompt"),
            ("/tokenize", {"prompt": 3}, 400, "prompt"),
            ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
            ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
            ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
            ("/detokenize", {"tokens": [1, 2, 10 ** 9]}, 400, "tokens[2]"),
            ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ]
        for path, body, status, param in cases:
            got, error = self.post(path, body)
            self.assertEqual((got, error["error"]["param"]), (status, param), (path, body))
        self.assertEqual(self.server.request("GET", "/tokenize")[0], 405)
        self.assertEqual(self.server.request("POST", "/tokenize", raw=b"{nope")[0], 400)
        self.assertEqual(self.post("/tokenize", {"prompt": "still serving"})[0], 200)

    def test_cached_tokens_are_the_requests_prefix_hits(self):
        prompt = "cached tokens " + TEXT * 2
        first = self.client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)
        before = self.server.metrics().get("loom_prefix_cache_hit_tokens_total", 0.0)
        second = self.client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        cached = second.usage.prompt_tokens_details.cached_tokens
        # Every full block but the one holding the last prompt token (--block-size 4).
        self.assertEqual(cached, (second.usage.prompt_tokens - 1) // 4 * 4)
        after = self.server.metrics().get("loom_prefix_cache_hit_tokens_total", 0.0)  # current with the response
        self.assertEqual(after - before, cached)
        # Streams report it too, and both carry one system_fingerprint.
        chunks = list(self.client.completions.create(model="tiny", prompt=prompt, max_tokens=2, stream=True,
                                                     stream_options={"include_usage": True}))
        self.assertEqual(chunks[-1].usage.prompt_tokens_details.cached_tokens, cached)
        fingerprints = {first.system_fingerprint, second.system_fingerprint} | {c.system_fingerprint for c in chunks}
        self.assertEqual(len(fingerprints), 1)
        self.assertTrue(fingerprints.pop().startswith("fp_"))

    def test_request_log_lines_for_200_and_400(self):
        completion = self.client.completions.create(model="tiny", prompt="log me", max_tokens=2)
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model="tiny", prompt="log me", max_tokens=-1)
        deadline = time.time() + 5
        while time.time() < deadline:
            log = self.server.read_log()
            if f"request {completion.id} " in log and "param=max_tokens" in log:
                break
            time.sleep(0.05)
        line = next(line for line in log.splitlines() if f"request {completion.id} " in line)
        self.assertIn("status=200", line)
        self.assertIn(f"prompt={completion.usage.prompt_tokens} ", line)
        self.assertIn("output=2 ", line)
        refused = next(line for line in log.splitlines() if "param=max_tokens" in line)
        self.assertIn("POST /v1/completions status=400", refused)

    def test_workflows_list(self):
        status, _, raw = self.server.request("GET", "/v1/workflows")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(raw)["object"], "list")
        spec = {"agents": [{"name": "planner"}, {"name": "coder", "after": ["planner"]}]}
        self.assertEqual(self.server.request("PUT", "/v1/workflows/wf-list", spec)[0], 200)
        data = json.loads(self.server.request("GET", "/v1/workflows")[2])["data"]
        listed = {item["id"]: item for item in data}
        self.assertIn("wf-list", listed)
        self.assertEqual(listed["wf-list"], json.loads(self.server.request("GET", "/v1/workflows/wf-list")[2]))
        self.assertEqual(self.server.request("DELETE", "/v1/workflows/wf-list")[0], 200)
        data = json.loads(self.server.request("GET", "/v1/workflows")[2])["data"]
        self.assertNotIn("wf-list", {item["id"] for item in data})


class VllmServeFlagsTest(unittest.TestCase):
    """--seed makes unseeded sampling repeat across runs; several --served-model-name; names never collide."""

    def sample(self, server, model="tiny"):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        return [client.completions.create(model=model, prompt=TEXT, max_tokens=12, temperature=1.0,
                                          extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)]

    def test_seed_aliases_and_name_collisions(self):
        args = ["--allow-runtime-lora", "--served-model-name", "tiny-alias"]
        servers = [loom_server.LoomServer(args + ["--seed", seed] + extra, num_adapters=1)
                   for seed, extra in (("5", []), ("5", []), ("6", ["--disable-log-requests"]))]
        try:
            first, again, other = [self.sample(server) for server in servers]
            self.assertEqual(first, again)  # the same requests in the same order: the same draws
            self.assertNotEqual(first[0], first[1])  # each request its own seed
            self.assertNotEqual(first, other)
            server = servers[0]
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
            self.assertIn("tiny-alias", {m.id for m in client.models.list().data})
            self.assertEqual(client.completions.create(model="tiny-alias", prompt="x", max_tokens=1).model,
                             "tiny-alias")
            adapter_path = os.path.join(server.adapter_dir, server.adapter_names[0])
            quiet = servers[2]  # --disable-log-requests: no request lines
            quiet_client = openai.OpenAI(base_url=quiet.base_url + "/v1", api_key="unused", max_retries=0)
            quiet_client.completions.create(model="tiny", prompt="x", max_tokens=1)
            self.assertNotIn("request cmpl-", quiet.read_log())
            for name, expected in (("tiny-alias", "base model"), (server.adapter_names[0], "already")):
                status, _, raw = server.request("POST", "/v1/load_lora_adapter",
                                                {"lora_name": name, "lora_path": adapter_path})
                self.assertEqual(status, 400, name)
                self.assertIn(expected, json.loads(raw)["error"]["message"])
        finally:
            for server in servers:
                self.assertEqual(server.stop(), 0)
                server.cleanup()


if __name__ == "__main__":
    unittest.main()
