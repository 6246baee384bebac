"""Robustness of `loom serve` against bad input, on one shared
server checked after every case (robustness_util.ServerCase):

- invalid UTF-8 in paths, header values and every string body field;
- JSON nested 100k deep in bodies and in an adapter's adapter_config.json;
- out-of-range numbers and wrong types for every field of every route
  (400 with `param` naming the field);
- header floods (431), chunked bodies over --max-request-bytes (413), a lying
  Content-Length, a form-encoded body (400, not 413), 404 / 405;
- 1000 idle and 200 trickling connections while a small completion is served;
- a non-streaming client that disconnects.

The connection cap, deadlines, a port in use and adapter capabilities are in
test_robustness_limits.py; signals in test_robustness_shutdown.py. Loops are
bounded in count and time; everything talks to 127.0.0.1 only.
"""
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import unittest

from robustness_util import (
    DEEP, DELETE, LONG, Raw, ServerCase, bad_utf8_string, connect, encode_body, exchange, flags, kv_in_use, raise_open_file_limit, read_response, request_bytes, running, set_path)


# ============================================================================= the shared server's cases

COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
WORKFLOW = {"agents": [{"name": "a"}, {"name": "b", "after": ["a"], "join": "all"}]}
PROGRESS = {"running": ["a"], "steps_to_execution": {"b": 1}}
E999 = Raw("1e999")
BIG = 2 ** 70
LIMIT = 1 << 20  # --max-request-bytes of the shared server: the 100k-deep bodies fit, the over-limit ones do not


class RobustnessTest(ServerCase):
    SERVER_ARGS = (["--allow-runtime-lora", "--eviction-policy", "workflow", "--max-request-bytes", str(LIMIT)] +
                   flags(("--body-timeout", 2)))
    NUM_ADAPTERS = 2

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.lora_body = {"lora_name": "rt-lora", "lora_path": os.path.join(cls.server.adapter_dir, "adapter1")}

    # ------------------------------------------------------------------ invalid UTF-8

    def test_invalid_utf8_in_paths(self):
        cases = [
            (b"GET", b"/%FF"), (b"GET", b"/\xff"), (b"GET", b"/v1/models%FF"), (b"GET", b"/\xc0\xaf"),
            (b"POST", b"/v1/completions\xff\xfe"), (b"POST", b"/v1/chat/%ED%A0%80"),
            (b"GET", b"/v1/workflows/%FF%FE"), (b"GET", b"/v1/workflows/\xff"), (b"PUT", b"/v1/workflows/a%C0%AF"),
        ]
        for method, path in cases:
            with self.subTest(path=path):
                body = encode_body(COMPLETION) if method != b"GET" else b""
                response = self.send(method.decode(), path, body)
                self.assert_error(response, f"{method!r} {path!r}")

    def test_invalid_utf8_in_header_values(self):
        # Bytes 0x80-0xFF are legal in header values (obs-text), so an unused
        # header may be ignored (200); what may never happen is a 5xx or a leak.
        for index, (name, value) in enumerate([("X-Junk", b"\xff\xfe"), ("User-Agent", b"\xc3\x28"),
                                               ("Authorization", b"Bearer \xff\xfe"), ("Accept", b"\xed\xa0\x80"),
                                               ("X-Request-Id", b"\xc0\xaf" * 100)]):
            with self.subTest(header=name):
                response = self.send("POST", "/v1/completions", COMPLETION, headers=[(name, value)])
                self.assertLess(response.status, 500, response)
                self.assert_clean(response, name)
                json.loads(response.body)
        response = self.send("POST", "/v1/completions", COMPLETION, content_type="application/json\xff")
        self.assertLess(response.status, 500, response)
        self.assert_clean(response, "content-type")
        # A header *name* with such bytes is malformed HTTP.
        response = self.send("GET", "/health", headers=[(b"X-\xff\xfe", b"1")])
        self.assert_error(response, "header name", status=400)

    def test_invalid_utf8_in_every_body_field(self):
        chat_parts = set_path(CHAT, "messages[0].content", [{"type": "text", "text": "x"}])
        load = self.lora_body
        cases = [
            ("POST", "/v1/completions", COMPLETION, ["model", "prompt", "stop", "workflow", "agent", "user"]),
            ("POST", "/v1/completions", {**COMPLETION, "prompt": ["a", "b"], "stop": ["x", "y"]},
             ["prompt[1]", "stop[0]"]),
            ("POST", "/v1/chat/completions", {**CHAT, "response_format": {"type": "text"}},
             ["model", "messages[0].content", "messages[0].role", "messages[0].name", "stop", "workflow", "agent",
              "response_format.type"]),
            ("POST", "/v1/chat/completions", chat_parts, ["messages[0].content[0].text", "messages[0].content[0].type"]),
            ("POST", "/v1/load_lora_adapter", {**load, "kv_sharing": "isolated"},
             ["lora_name", "lora_path", "kv_sharing"]),
            ("POST", "/v1/unload_lora_adapter", {"lora_name": "nope"}, ["lora_name"]),
            ("PUT", "/v1/workflows/rb-utf8", WORKFLOW, ["agents[0].name", "agents[1].after[0]", "agents[1].join"]),
            ("POST", "/v1/workflows/rb-utf8/progress", PROGRESS, ["running[0]"]),
        ]
        index = 0
        for method, path, base, fields in cases:
            for field in fields:
                index += 1
                with self.subTest(path=path, field=field):
                    response = self.send(method, path, set_path(base, field, bad_utf8_string(index)))
                    self.assert_error(response, f"{path} {field}", status=400, param=field)
        # Invalid UTF-8 in a key.
        for path, base in [("/v1/completions", COMPLETION), ("/v1/workflows/rb-utf8/progress", PROGRESS)]:
            with self.subTest(path=path, field="a key"):
                body = encode_body(base)[:-1] + b', "k\xff": 1}'
                self.assert_error(self.send("POST", path, body), f"{path} key", status=400)
        body = encode_body({"running": [], "steps_to_execution": {Raw(b'"b\xff"'): 1}})
        self.assert_error(self.send("POST", "/v1/workflows/rb-utf8/progress", body), "steps key", status=400)

    # ------------------------------------------------------------------ deep nesting

    def test_deep_nesting_in_bodies(self):
        arrays = b"[" * DEEP + b"]" * DEEP
        objects = b'{"a":' * DEEP + b"1" + b"}" * DEEP
        cases = [
            ("POST", "/v1/completions", b'{"model":"tiny","prompt":' + arrays + b"}"),
            ("POST", "/v1/completions", b'{"model":"tiny","prompt":"hi","stop":' + objects + b"}"),
            ("POST", "/v1/completions", arrays),
            ("POST", "/v1/completions", b"[" * DEEP),
            ("POST", "/v1/chat/completions", b'{"model":"tiny","messages":' + arrays + b"}"),
            ("POST", "/v1/chat/completions", objects),
            ("POST", "/v1/load_lora_adapter", b'{"lora_name":"deep","lora_path":' + arrays + b"}"),
            ("POST", "/v1/load_lora_adapter", b'{"lora_name":"deep","lora_path":"/x","x":' + objects + b"}"),
            ("POST", "/v1/unload_lora_adapter", b'{"lora_name":' + arrays + b"}"),
            ("PUT", "/v1/workflows/rb-deep", b'{"agents":' + arrays + b"}"),
            ("PUT", "/v1/workflows/rb-deep", objects),
            ("POST", "/v1/workflows/rb-deep/progress", b'{"running":' + arrays + b"}"),
        ]
        for method, path, body in cases:
            with self.subTest(path=path, start=body[:30]):
                self.assertLess(len(body), LIMIT)
                self.assert_error(self.send(method, path, body), f"{path} deep", status=400)

    def test_deep_adapter_config_is_refused_at_load(self):
        directory = tempfile.mkdtemp(prefix="loom-deep-adapter-")
        try:
            source = os.path.join(self.server.adapter_dir, "adapter1")
            for name in os.listdir(source):
                shutil.copy(os.path.join(source, name), directory)
            with open(os.path.join(source, "adapter_config.json")) as file:
                config = json.load(file)
            text = json.dumps(config)[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}"
            with open(os.path.join(directory, "adapter_config.json"), "w") as file:
                file.write(text)
            response = self.send("POST", "/v1/load_lora_adapter", {"lora_name": "deep", "lora_path": directory})
            self.assert_error(response, "deep adapter_config.json", status=400)
            status, _, body = self.server.request("GET", "/v1/models")
            self.assertEqual(status, 200)
            self.assertNotIn("deep", [model["id"] for model in json.loads(body)["data"]])
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    # ------------------------------------------------------------------ numbers and types

    def check_field_table(self, method, path, base, table, status=400):
        """table: [(field, [values], param or None = field)]."""
        for field, values, param in table:
            for value in values:
                with self.subTest(path=path, field=field, value=value.text if isinstance(value, Raw) else value):
                    body = set_path(base, field, value)
                    response = self.send(method, path, body)
                    shown = value.text if isinstance(value, Raw) else repr(value)[:60]
                    self.assert_error(response, f"{path} {field}={shown}", status=status, param=param or field)

    def test_numbers_and_types_completions(self):
        common = [
            ("model", [1, -1, [], {}, E999, True], None),
            ("n", [E999, -1, 0, BIG, "x", [], {}, 17, 1.5, True], None),
            ("max_tokens", [E999, -1, 0, BIG, "x", [], {}, 1.5, 2 ** 31], None),
            ("temperature", [E999, Raw("-1e999"), -1, 2.5, BIG, "x", [], {}, True], None),
            ("top_p", [E999, -1, 0, 1.5, BIG, "x", [], {}], None),
            ("top_k", [E999, -2, BIG, "x", [], {}, 1.5], None),
            ("seed", [E999, BIG, -BIG, "x", [], {}, 1.5], None),
            ("stream", ["x", 1, [], {}], None),
            ("stream_options", ["x", 1, {"include_usage": True}], None),
            ("stop", [1, -1, {}, E999, ["a"] * 17, "x" * 1025], None),
            ("stop", [[1], [[]], [E999], [None]], "stop[0]"),
            ("stop_token_ids", ["x", {}, 1, E999], None),
            ("stop_token_ids", [[-1], [BIG], ["x"], [512], [1.5], [E999]], "stop_token_ids[0]"),
            ("ignore_eos", ["x", 1, [], {}], None),
            ("priority", [BIG, 2 ** 31, -2 ** 31 - 1, "x", [], {}, E999, 1.5], None),
            ("min_tokens", [-1, "x", [], BIG, E999, 3], None),
            ("presence_penalty", [3, -2.5, "x", E999, []], None),
            ("frequency_penalty", [3, "x", E999, []], None),
            ("repetition_penalty", [0, -1, E999, "x", []], None),
            ("min_p", [-0.1, 1.5, "x", E999, []], None),
            ("logit_bias", ["x", [1], E999], None),
            ("logit_bias", [{"1": 101}, {"1": "x"}, {"1": -1000}], "logit_bias.1"),
            ("logit_bias", [{"x": 1}], "logit_bias.x"),
            ("best_of", [2, -1, "x", BIG, E999], None),
            ("workflow", [1, [], {}, "bad id", "", "x" * 300, E999], None),
            ("fixed_prefix_tokens", [-1, BIG, "x", E999, 1.5, []], None),
        ]
        completions = common + [
            ("prompt", [E999, -1, BIG, {}, [], None, True, [[]]], None),
            ("prompt", [[-1], [BIG], [512], [E999], [1.5]], "prompt[0]"),  # token ids are named by index
            ("prompt", [[[1], 5], ["a", 5], ["a", {}]], "prompt[1]"),
            ("logprobs", [E999, -1, 21, BIG, "x", [], {}, True], None),
            ("echo", ["x", 1], None),
            ("suffix", ["x", 1], None),
        ]
        self.check_field_table("POST", "/v1/completions", COMPLETION, completions)
        self.check_field_table("POST", "/v1/completions",
                               {**COMPLETION, "stream": True, "stream_options": {"include_usage": True}},
                               [("stream_options", ["x", 1, []], None),
                                ("stream_options.include_usage", ["x", 1, []], None)])
        self.check_field_table("POST", "/v1/completions", {**COMPLETION, "workflow": "rb-w"},
                               [("agent", [1, [], {}, "", E999], None)])
        chat = common + [
            ("messages", [1, "x", {}, [], None, E999], None),
            ("messages", [[1], ["x"], [[]]], "messages[0]"),
            ("messages[0].role", [1, "bad", None, [], E999], None),
            ("messages[0].content", [1, {}, E999, True], None),
            # Content parts are named down to the part and its field.
            ("messages[0].content", [[1], ["x"]], "messages[0].content[0]"),
            ("messages[0].content", [[{"type": 1, "text": "a"}], [{"type": "image_url"}], [{"text": "a"}]],
             "messages[0].content[0].type"),
            ("messages[0].content", [[{"type": "text", "text": 1}], [{"type": "text"}]],
             "messages[0].content[0].text"),
            ("logprobs", ["x", 1, [], E999], None),
            ("max_completion_tokens", [-1, 0, "x", BIG, E999, []], None),
            ("tools", ["x", 1, {}], None),
            ("tools", [[1], ["x"]], "tools[0]"),
            ("tools", [[{"type": "function"}], [{"type": "function", "function": 1}]], "tools[0].function"),
            ("tools", [[{"type": "code"}], [{"function": {"name": "f"}}]], "tools[0].type"),
            ("tool_choice", ["x", 1, True], None),
            ("tools", [[{"type": "function", "function": {"name": 1}}],
                       [{"type": "function", "function": {"name": ""}}]], "tools[0].function.name"),
            ("tools", [[{"type": "function", "function": {"name": "f", "parameters": "x"}}]],
             "tools[0].function.parameters"),
            ("chat_template", [1, [], {}, "", "{% if %}", E999], None),
            ("chat_template_kwargs", ["x", 1, [], E999, {"messages": 1}], None),
            ("add_generation_prompt", ["x", 1, []], None),
            ("continue_final_message", ["x", 1, [], True], None),  # True: needs a final assistant message
            ("documents", ["x", 1, {}], None),
            ("documents", [[1], ["x"]], "documents[0]"),
            ("response_format", ["x", 1, []], None),
            ("response_format", [{"type": 1}, {"type": "xml"}, {}, {"type": E999}], "response_format.type"),
        ]
        self.check_field_table("POST", "/v1/chat/completions", CHAT, chat)
        self.check_field_table("POST", "/v1/chat/completions", {**CHAT, "logprobs": True},
                               [("top_logprobs", [-1, 21, "x", BIG, E999, []], None)])
        self.check_field_table("POST", "/v1/chat/completions", CHAT, [("top_logprobs", [2], None)])
        # An unknown model name is 404 model_not_found, naming `model`.
        for path, base in [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]:
            self.assert_error(self.send("POST", path, {**base, "model": "nope"}), "unknown model", status=404,
                              param="model")

    def test_numbers_and_types_lora_routes(self):
        load = self.lora_body
        self.check_field_table("POST", "/v1/load_lora_adapter", load, [
            ("lora_name", [1, [], {}, None, E999, True, DELETE, "adapter0"], None),
            ("lora_path", [1, [], {}, None, E999, DELETE], None),
            ("kv_sharing", ["x", 1, [], {}, E999, "FORKED"], None),
        ])
        self.check_field_table("POST", "/v1/unload_lora_adapter", {"lora_name": "adapter0"}, [
            ("lora_name", [1, [], {}, None, E999, DELETE], None),
        ])
        self.assert_error(self.send("POST", "/v1/unload_lora_adapter", {"lora_name": "nope"}), "unload unknown",
                          status=404, param="lora_name")
        for body in [b"", b"[]", b"1", b"null", b'"x"', b"{", b"{}}"]:
            with self.subTest(body=body):
                self.assert_error(self.send("POST", "/v1/load_lora_adapter", body), f"load body {body!r}",
                                  status=400)

    def test_numbers_and_types_workflow_routes(self):
        path = "/v1/workflows/rb-types"
        self.check_field_table("PUT", path, WORKFLOW, [
            ("agents", ["x", 1, {}, None, E999, DELETE, [{"name": f"a{i}"} for i in range(257)]], None),
            ("agents[0]", ["x", 1, []], None),
            ("agents[0].name", [1, "", None, [], E999, "a\u0001"], None),
            ("agents[1].after", ["x", 1, {}], None),
            ("agents[1].after", [[1], [E999], [""]], "agents[1].after[0]"),
            ("agents[1].after", [["a", "a"]], "agents[1].after[1]"),
            ("agents[1].join", ["x", 1, [], E999], None),
            ("bogus", [1], None),
        ])
        status, _, body = self.server.request("PUT", path, WORKFLOW)
        self.assertEqual(status, 200, body)
        self.check_field_table("POST", path + "/progress", PROGRESS, [
            ("running", ["x", 1, {}, E999], None),
            ("running", [[1], [""], [E999]], "running[0]"),
            ("steps_to_execution", ["x", 1, []], None),
            ("steps_to_execution.b", [-1, BIG, "x", E999, 1.5, []], None),
        ])
        for bad_id in ["bad%20id", "x" * 300, "a%00b"]:
            with self.subTest(id=bad_id):
                self.assert_error(self.send("PUT", "/v1/workflows/" + bad_id, WORKFLOW), f"id {bad_id}",
                                  status=400, param="id")
        self.assert_error(self.send("GET", "/v1/workflows/rb-unknown"), "unknown workflow", status=404)
        status, _, body = self.server.request("DELETE", path)
        self.assertEqual(status, 200, body)

    # ------------------------------------------------------------------ HTTP-level limits

    def test_header_floods(self):
        flood = [(f"X-Flood-{i}", "v") for i in range(10_000)]
        response = exchange(self.port, request_bytes("GET", "/health", headers=flood), timeout=30)
        self.assertIsNotNone(response, "10k header lines: closed without a response")
        self.assert_error(response, "10k header lines", status=431)
        response = exchange(self.port, request_bytes("GET", "/health", headers=[("X-Big", "a" * 1_000_000)]),
                            timeout=30)
        self.assertIsNotNone(response, "1 MB header: closed without a response")
        self.assert_error(response, "1 MB header", status=431)
        # 100 lines are fine (default --max-header-count 128).
        response = self.send("GET", "/health", headers=[(f"X-Few-{i}", "v") for i in range(100)])
        self.assertEqual(response.status, 200, response)

    def chunked(self, path, body, chunk_size):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + chunk_size]), body[i:i + chunk_size])
                          for i in range(0, len(body), chunk_size))
        return exchange(self.port, head + chunks + b"0\r\n\r\n", timeout=30)

    def test_chunked_bodies_over_the_limit(self):
        small = encode_body(COMPLETION)
        response = self.chunked("/v1/completions", small, 7)
        self.assertIsNotNone(response)
        self.assertEqual(response.status, 200, response)  # chunked bodies are read at all
        big = encode_body({**COMPLETION, "pad": "x" * (LIMIT + 100_000)})
        for chunk_size in (4096, len(big)):
            with self.subTest(chunk_size=chunk_size):
                response = self.chunked("/v1/completions", big, chunk_size)
                self.assertIsNotNone(response, "closed without a response")
                self.assert_error(response, "chunked over the limit", status=413)
        response = exchange(self.port, request_bytes("POST", "/v1/completions", big), timeout=30)
        self.assertIsNotNone(response)
        self.assert_error(response, "Content-Length over the limit", status=413)

    def test_form_encoded_body_is_400_not_413(self):
        body = b"a=" + b"b" * 20_000
        response = self.send("POST", "/v1/completions", body, content_type="application/x-www-form-urlencoded")
        self.assert_error(response, "form body", status=400)

    def test_lying_content_length(self):
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n" + encode_body(COMPLETION)[:20])
        # The client closes mid-body.
        for _ in range(20):
            sock = connect(self.port)
            sock.sendall(head)
            sock.close()
        # The client stalls mid-body: others are served meanwhile, and the
        # staller is answered 408 or dropped (--body-timeout 2 here).
        stalled = [connect(self.port) for _ in range(20)]
        for sock in stalled:
            sock.sendall(head)
        started = time.monotonic()
        status, _, body = self.server.request("POST", "/v1/completions", COMPLETION)
        self.assertEqual(status, 200, body)
        self.assertLess(time.monotonic() - started, 5.0, "a good request waited behind stalled bodies")
        try:
            for sock in stalled:
                try:
                    response = read_response(sock, timeout=10)
                except ConnectionResetError:
                    response = None
                if response is not None:
                    self.assert_error(response, "stalled body", status=408)
            self.assertLess(time.monotonic() - started, 12.0)
        except TimeoutError:
            self.fail("a client stalled mid-body was neither answered nor dropped within 10 s")
        finally:
            for sock in stalled:
                sock.close()

    def test_unknown_paths_and_wrong_methods(self):
        for path in ["/nope", "/v1/nope", "/v1/completions/extra", "/%3Cscript%3Ealert(1)%3C/script%3E",
                     "/v1/workflows/", "/" + "a" * 4000]:
            with self.subTest(path=path[:40]):
                response = self.send("GET", path)
                self.assert_error(response, path, status=404)
                self.assertTrue(response.header("Content-Type").startswith("application/json"), response)
        for method, path, allowed in [("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"),
                                      ("DELETE", "/health", "GET"), ("POST", "/v1/models", "GET"),
                                      ("POST", "/metrics", "GET"), ("GET", "/v1/load_lora_adapter", "POST"),
                                      ("PATCH", "/v1/workflows/rb-x", "PUT"),
                                      ("GET", "/v1/workflows/rb-x/progress", "POST")]:
            with self.subTest(method=method, path=path):
                response = self.send(method, path)
                self.assert_error(response, f"{method} {path}", status=405)
                self.assertIn(allowed, response.header("Allow") or "", response)
        response = self.send("BREW", "/health")
        self.assertIn(response.status, (400, 405, 501), response)
        self.assert_clean(response, "BREW")

    # ------------------------------------------------------------------ slow clients

    def small_completion_latency(self):
        started = time.monotonic()
        status, _, body = self.server.request("POST", "/v1/completions",
                                              {"model": "tiny", "prompt": "hi", "max_tokens": 4, "temperature": 0})
        elapsed = time.monotonic() - started
        self.assertEqual(status, 200, body)
        return elapsed

    def test_idle_and_trickling_connections(self):
        self.assertGreaterEqual(raise_open_file_limit(), 1400, "RLIMIT_NOFILE too small for 1200 connections")
        baseline = statistics.median(self.small_completion_latency() for _ in range(5))
        idle, tricklers = [], []
        stop = threading.Event()
        line = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" * 20
        try:
            for _ in range(1000):
                idle.append(connect(self.port))
            for _ in range(200):
                tricklers.append(connect(self.port))

            def trickle():
                position = 0
                while not stop.is_set() and position < len(line):
                    for sock in tricklers:
                        try:
                            sock.send(line[position:position + 1])
                        except OSError:
                            pass
                    position += 1
                    stop.wait(1.0)

            thread = threading.Thread(target=trickle, daemon=True)
            thread.start()
            time.sleep(2.0)
            loaded = [self.small_completion_latency() for _ in range(5)]
        finally:
            stop.set()
            for sock in idle + tricklers:
                sock.close()
        print(f"\nsmall completion with 1000 idle + 200 trickling connections: median {statistics.median(loaded) * 1000:.1f} ms"
              f" (max {max(loaded) * 1000:.1f} ms) vs {baseline * 1000:.1f} ms idle", flush=True)
        self.assertLess(statistics.median(loaded), baseline + 2.0)

    # ------------------------------------------------------------------ disconnects

    def test_non_streaming_disconnect_frees_kv(self):
        sock = connect(self.port)
        sock.sendall(request_bytes("POST", "/v1/completions", encode_body(LONG)))
        deadline = time.monotonic() + 10
        while running(self.server.metrics()) < 1:
            self.assertLess(time.monotonic(), deadline, "the long request never started")
            time.sleep(0.05)
        samples = self.server.metrics()
        self.assertGreater(kv_in_use(samples), 0)
        sock.close()
        closed = time.monotonic()
        while True:
            samples = self.server.metrics()
            if running(samples) == 0 and kv_in_use(samples) == 0:
                break
            self.assertLess(time.monotonic() - closed, 3.0,
                            f"the request went on after its client left: {running(samples)} running, "
                            f"{kv_in_use(samples)} KV blocks in use")
            time.sleep(0.05)
        print(f"\nnon-streaming disconnect: freed {time.monotonic() - closed:.2f} s after close", flush=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
