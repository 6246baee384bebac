"""`loom serve --api-key`: /v1/* need the Bearer key (401 like vLLM), /health
and /metrics do not; runtime adapter routes are absent without
--allow-runtime-lora; SIGTERM exits 0."""
import http.client
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402


class ApiKeyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = loom_server.LoomServer(["--api-key", "sekrit", "--shutdown-timeout", "0"], num_adapters=1)

    @classmethod
    def tearDownClass(cls):
        cls.server.cleanup()

    def test_key_required_on_v1(self):
        url = self.server.base_url + "/v1"
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        status, _, _ = self.server.request("GET", "/v1/models")
        self.assertEqual(status, 401)
        client = openai.OpenAI(base_url=url, api_key="sekrit", max_retries=0)
        response = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
        self.assertEqual(response.usage.completion_tokens, 3)
        self.assertEqual(self.server.request("GET", "/health")[0], 200)
        self.assertEqual(self.server.request("GET", "/metrics")[0], 200)

    def test_runtime_lora_routes_absent_by_default(self):
        status, _, _ = self.server.request("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"},
                                           headers={"Authorization": "Bearer sekrit"})
        self.assertEqual(status, 404)

    def test_zz_sigterm_with_stream_in_flight_exits_zero(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 4000, "stream": True, "ignore_eos": True}
        connection.request("POST", "/v1/completions", json.dumps(body),
                           {"Content-Type": "application/json", "Authorization": "Bearer sekrit"})
        response = connection.getresponse()
        self.assertEqual(response.read(6), b"data: ")
        self.assertEqual(self.server.stop(), 0)
        rest = response.read()  # --shutdown-timeout 0: the stream is ended explicitly at once, not cut
        self.assertIn(b'"code":"server_shutting_down"', rest[-400:])
        self.assertTrue(rest.endswith(b"data: [DONE]\n\n"), rest[-200:])
        connection.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
