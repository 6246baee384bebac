"""/metrics as a vLLM user reads it, against a real `loom serve`: the counters a
request adds are there as soon as its response is (no polling), a client that
goes away (stream or whole body) ends as an abort and never as a success, and
the KV usage fraction exists only for the tiers the server has."""
import http.client
import json
import os
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
PROMPT = "a prompt whose blocks the second request finds in the prefix cache " * 3
REASONS = ["stop", "length", "abort", "error"]
DEVICE_USAGE = 'loom_kv_cache_usage_perc{tier="device",kind="base"}'


def ended(samples, reason):
    return samples[f'loom_request_success_total{{finished_reason="{reason}"}}']


class MetricsTest(loom_server.ServerTestCase):
    def assert_request_counted(self, before, after, usage, reason):
        """The counters one finished request adds, all of them already in `after`."""
        self.assertGreater(usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(after["loom_prefix_cache_hit_tokens_total"] - before["loom_prefix_cache_hit_tokens_total"],
                         usage.prompt_tokens_details.cached_tokens)
        self.assertEqual(after["loom_prefix_cache_queried_tokens_total"]
                         - before["loom_prefix_cache_queried_tokens_total"], usage.prompt_tokens)
        self.assertEqual(after["loom_prompt_tokens_total"] - before["loom_prompt_tokens_total"], usage.prompt_tokens)
        self.assertEqual(after["loom_generation_tokens_total"] - before["loom_generation_tokens_total"],
                         usage.completion_tokens)
        for name in ["loom_time_to_first_token_seconds_count", "loom_e2e_request_latency_seconds_count"]:
            self.assertEqual(after[name] - before[name], 1, name)
        for other in REASONS:
            self.assertEqual(ended(after, other) - ended(before, other), 1 if other == reason else 0, other)

    def test_counters_are_current_when_the_response_returns(self):
        self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, **GREEDY)  # fills the cache
        before = self.server.metrics()
        response = self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, **GREEDY)
        after = self.server.metrics()  # at once: no polling
        self.assertEqual(response.choices[0].finish_reason, "length")
        self.assert_request_counted(before, after, response.usage, "length")

        before = after
        chunks = list(self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, stream=True,
                                                     stream_options={"include_usage": True}, **GREEDY))
        after = self.server.metrics()
        self.assert_request_counted(before, after, chunks[-1].usage, "length")

        before = after
        response = self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, stop=[" "],
                                                  temperature=0.0, extra_body={"include_stop_str_in_output": True})
        after = self.server.metrics()
        self.assert_request_counted(before, after, response.usage, response.choices[0].finish_reason)

    def wait_for_abort(self, before):
        """The samples once one more request ended as an abort (the server
        notices a gone client at its next write or poll, after the close)."""
        deadline = time.time() + 20
        samples = self.server.metrics()
        while time.time() < deadline and ended(samples, "abort") == ended(before, "abort"):
            time.sleep(0.05)
            samples = self.server.metrics()
        return samples

    def assert_only_an_abort(self, before, after):
        self.assertEqual(ended(after, "abort") - ended(before, "abort"), 1)
        for reason in ["stop", "length", "error"]:
            self.assertEqual(ended(after, reason), ended(before, reason), reason)
        self.assertEqual(after["loom_num_requests_running"], 0)

    def long_request(self, stream):
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        body = {"model": "tiny", "prompt": "a long story", "max_tokens": 4000, "stream": stream, "ignore_eos": True,
                "temperature": 0.0}
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        return connection

    def test_stream_disconnect_is_an_abort_not_a_success(self):
        before = self.server.metrics()
        connection = self.long_request(stream=True)
        response = connection.getresponse()
        self.assertEqual(response.status, 200)
        self.assertEqual(response.read(6), b"data: ")  # one chunk: generation has started
        connection.sock.close()
        connection.close()
        self.assert_only_an_abort(before, self.wait_for_abort(before))

    def test_whole_body_client_gone_is_an_abort_not_a_success(self):
        before = self.server.metrics()
        connection = self.long_request(stream=False)
        deadline = time.time() + 20
        while time.time() < deadline and self.server.metrics()["loom_num_requests_running"] < 1:
            time.sleep(0.02)
        self.assertEqual(self.server.metrics()["loom_num_requests_running"], 1)
        connection.sock.close()  # before any response: the client went away
        connection.close()
        self.assert_only_an_abort(before, self.wait_for_abort(before))

    def test_usage_fraction_of_the_device_pool_only(self):
        samples = self.server.metrics()  # every sample carried model_name="tiny" (metrics() checks)
        self.assertGreaterEqual(samples[DEVICE_USAGE], 0.0)
        self.assertLessEqual(samples[DEVICE_USAGE], 1.0)
        self.assertEqual([name for name in samples if 'tier="host"' in name or 'tier="disk"' in name], [])
        self.assertNotIn('loom_kv_cache_usage_perc{tier="device",kind="residual"}', samples)  # no rCache pool

    def test_server_caches_are_reported_with_their_limits(self):
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        before = self.server.metrics()
        self.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}, **GREEDY)
        after = self.server.metrics()
        for cache in ["grammars", "chat_templates", "bpe_words"]:
            self.assertLessEqual(after[f'loom_cache_entries{{cache="{cache}"}}'],
                                 after[f'loom_cache_capacity{{cache="{cache}"}}'], cache)
            self.assertIn(f'loom_cache_evictions_total{{cache="{cache}"}}', after)
        self.assertEqual(after['loom_cache_entries{cache="grammars"}'],
                         before['loom_cache_entries{cache="grammars"}'] + 1)
        self.assertGreater(after['loom_cache_bytes{cache="grammars"}'], before['loom_cache_bytes{cache="grammars"}'])


class HostTierMetricsTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--host-kv-memory", "4M", "--log-stats-interval", "0.2"]

    def test_stats_lines_come_while_there_is_work(self):
        self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, **GREEDY)
        deadline = time.time() + 10
        while "Avg prompt throughput" not in self.server.read_log() and time.time() < deadline:
            time.sleep(0.1)
        line = next(line for line in self.server.read_log().splitlines() if "Avg prompt throughput" in line)
        for part in ["Avg generation throughput", "Running:", "Waiting:", "device KV cache usage",
                     "host KV cache usage", "Prefix cache hit rate"]:
            self.assertIn(part, line)
        # Idle: no more lines.
        time.sleep(0.5)
        count = self.server.read_log().count("Avg prompt throughput")
        time.sleep(0.6)
        self.assertEqual(self.server.read_log().count("Avg prompt throughput"), count)

    def test_host_tier_series_exist_with_one(self):
        self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, **GREEDY)
        samples = self.server.metrics()
        host_usage = samples['loom_kv_cache_usage_perc{tier="host",kind="base"}']
        self.assertGreaterEqual(host_usage, 0.0)
        self.assertLessEqual(host_usage, 1.0)
        self.assertIn('loom_kv_cache_bytes{tier="host",kind="base"}', samples)
        self.assertIn(DEVICE_USAGE, samples)
        self.assertEqual([name for name in samples if 'tier="disk"' in name], [])


class DashboardTest(loom_server.ServerTestCase):
    """docs/grafana-dashboard.json reads only metrics a server exports (here one with every optional part: a
    host tier, a disk tier and a KV link), and is what docs/grafana_dashboard.py writes."""
    SERVER_ARGS = ["--host-kv-memory", "4M", "--disk-kv-path", "@TMP@/kv", "--disk-kv-bytes", "64M",
                   "--role", "prefill"]

    @classmethod
    def setUpClass(cls):
        import tempfile
        cls.disk = tempfile.mkdtemp(prefix="loom-dash-")
        cls.SERVER_ARGS = [arg.replace("@TMP@", cls.disk) for arg in DashboardTest.SERVER_ARGS]
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        import shutil
        super().tearDownClass()
        shutil.rmtree(cls.disk, ignore_errors=True)

    def test_the_dashboard_reads_only_exported_metrics(self):
        import re
        import subprocess
        docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs")
        with open(os.path.join(docs, "grafana-dashboard.json")) as dashboard_file:
            committed = dashboard_file.read()
        written = subprocess.run([sys.executable, os.path.join(docs, "grafana_dashboard.py")], check=True,
                                 capture_output=True, text=True).stdout
        self.assertEqual(json.loads(committed), json.loads(written), "regenerate docs/grafana-dashboard.json")
        self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, **GREEDY)
        with urllib.request.urlopen(self.server.base_url + "/metrics") as response:
            exported = set(re.findall(r"^# TYPE (loom_[a-z0-9_]+) ", response.read().decode(), re.M))
        expressions = [target["expr"] for panel in json.loads(committed)["panels"] for target in panel["targets"]]
        used = {re.sub(r"_bucket$", "", name) for expr in expressions for name in re.findall(r"loom_[a-z0-9_]+", expr)}
        self.assertGreater(len(used), 20)
        self.assertEqual(sorted(used - exported), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
