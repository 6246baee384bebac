"""Robustness suite of `loom serve` (issue 12): the real binary on a tiny random
model, driven with raw sockets wherever a client library would refuse to send
the bad thing. Every class of the issue has a case:

- invalid UTF-8 in paths, header values and every string body field;
- JSON nested 100k deep in bodies and in an adapter's adapter_config.json;
- out-of-range numbers and wrong types for every field of every route
  (400 with `param` naming the field);
- header floods (431), chunked bodies over --max-request-bytes (413), a lying
  Content-Length, a form-encoded body (400, not 413), 404 / 405;
- 1000 idle and 200 trickling connections while a small completion is served;
  the connection cap, header and keep-alive deadlines;
- SIGTERM / SIGINT with a streaming and a non-streaming request in flight, a
  second signal, a port in use, a non-streaming client that disconnects, a
  `base` adapter refused by --disable-kv-sharing.

After every case on a shared server: the process is alive, /health answers
200, a fixed greedy request returns the text it returned at the start, and no
KV block is in use once idle. A case that kills the server is reported as
failed and the server is restarted, so each case is judged on its own.

Loops are bounded in count and time; everything talks to 127.0.0.1 only.
LOOM_BINARY picks the binary (see loom_server.py): running this file against
an older binary lists what it fails. Flags that binary lacks are left out of
its command lines (and the cases that need them fail or are skipped).
"""
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

HOST = "127.0.0.1"
DEEP = 100_000
PROMPT = "The quick brown fox"
GREEDY_BODY = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
# Text of an exception or of an allocator/STL leaking into a response.
LEAK_MARKERS = ("exception_what", "json.exception", "nlohmann", "std::", "basic_string", "what()",
                "terminate called", "bad_alloc", "stoi", "stoll")
# A request that keeps the tiny model busy for tens of seconds (well beyond any deadline used here).
LONG = {"model": "tiny", "prompt": "hi", "n": 8, "max_tokens": 4000, "ignore_eos": True, "temperature": 0}


# ----------------------------------------------------------------------------- flags of the binary under test

_HELP = None


def serve_help():
    global _HELP
    if _HELP is None:
        result = subprocess.run([loom_server.loom_binary(), "serve", "--help"], capture_output=True, text=True,
                                timeout=60)
        _HELP = result.stdout + result.stderr
    return _HELP


def supports(flag):
    return re.search(re.escape(flag) + r"\b", serve_help()) is not None


def flags(*pairs):
    """[flag, value, ...] for the flags this binary knows ("--x", "1" pairs, or "--flag", None)."""
    args = []
    for flag, value in pairs:
        if supports(flag):
            args += [flag] + ([] if value is None else [str(value)])
    return args


# ----------------------------------------------------------------------------- raw HTTP

class RawResponse:
    def __init__(self, status, reason, headers, body):
        self.status, self.reason, self.headers, self.body = status, reason, headers, body

    def header(self, name):
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def __repr__(self):
        return f"<{self.status} {self.reason} {self.headers} {self.body[:400]!r}>"


def connect(port, timeout=10.0):
    sock = socket.create_connection((HOST, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv(sock, deadline):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("no response in time")
    sock.settimeout(remaining)
    return sock.recv(65536)


class ChunkDecoder:
    """Incremental Transfer-Encoding: chunked decoder."""

    def __init__(self):
        self.pending, self.payload, self.done = b"", bytearray(), False

    def feed(self, data):
        self.pending += data
        while not self.done:
            end = self.pending.find(b"\r\n")
            if end < 0:
                return
            size = int(self.pending[:end].split(b";")[0] or b"0", 16)
            if size == 0:
                self.done = True
                return
            if len(self.pending) < end + 2 + size + 2:
                return
            self.payload += self.pending[end + 2:end + 2 + size]
            self.pending = self.pending[end + 2 + size + 2:]


def read_response(sock, timeout=30.0, on_data=None):
    """One HTTP response from `sock` (None if it closed before a byte came);
    on_data(new body bytes) after every read of the body."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = _recv(sock, deadline)
        if not chunk:
            if not data:
                return None
            raise AssertionError(f"connection closed inside the response head: {data[:300]!r}")
        data += chunk
    head, _, chunk = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line]
    response = RawResponse(status, parts[2] if len(parts) > 2 else "", headers, b"")
    decoder = ChunkDecoder() if (response.header("Transfer-Encoding") or "").lower() == "chunked" else None
    length = response.header("Content-Length")
    body = bytearray()
    while True:
        if decoder:
            decoder.feed(chunk)
        else:
            body += chunk
        if on_data and chunk:
            on_data(chunk)
        if decoder and decoder.done:
            response.body = bytes(decoder.payload)
            return response
        if not decoder and length is not None and len(body) >= int(length):
            response.body = bytes(body[:int(length)])
            return response
        chunk = _recv(sock, deadline)
        if not chunk:
            if decoder:
                response.body = bytes(decoder.payload)
                response.reason += " (closed before the last chunk)"
                return response
            if length is not None:
                raise AssertionError(f"connection closed after {len(body)} of {length} body bytes")
            response.body = bytes(body)
            return response


def exchange(port, payload, timeout=30.0):
    """Sends `payload` (from a thread, so that a server answering early is
    read while we still send) and reads one response; None if the server
    closed without a byte."""
    sock = connect(port, timeout)

    def send():
        try:
            sock.sendall(payload)
        except OSError:
            pass  # the server answered and closed early: what is read decides

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return read_response(sock, timeout)
    except ConnectionResetError:
        return None
    finally:
        sender.join(5)
        sock.close()


def request_bytes(method, path, body=b"", headers=(), content_type="application/json"):
    """An HTTP/1.1 request with Connection: close; path and header values may be bytes."""
    path = path if isinstance(path, bytes) else path.encode()
    lines = [method.encode() + b" " + path + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    if content_type:
        lines.append(b"Content-Type: " + content_type.encode())
    if body or method in ("POST", "PUT"):
        lines.append(b"Content-Length: " + str(len(body)).encode())
    for name, value in headers:
        lines.append((name if isinstance(name, bytes) else name.encode()) + b": " +
                     (value if isinstance(value, bytes) else value.encode()))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


# ----------------------------------------------------------------------------- JSON bodies with raw parts

class Raw:
    """A value written into the JSON text as is (1e999, invalid UTF-8 ...)."""

    def __init__(self, text):
        self.text = text if isinstance(text, bytes) else text.encode()


def encode_body(value):
    """json.dumps, with every Raw substituted byte for byte."""
    raws = []

    def walk(item):
        if isinstance(item, Raw):
            raws.append(item.text)
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(item, dict):
            return {walk(key) if isinstance(key, Raw) else key: walk(val) for key, val in item.items()}
        if isinstance(item, list):
            return [walk(val) for val in item]
        return item

    text = json.dumps(walk(value)).encode()
    for index, raw in enumerate(raws):
        text = text.replace(f'"@@RAW{index}@@"'.encode(), raw)
    return text


def set_path(body, path, value):
    """A deep copy of `body` with the field at `path` ("a.b[0].c") set; value DELETE removes it."""
    body = json.loads(json.dumps(body))
    keys = [int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", path)]
    target = body
    for key in keys[:-1]:
        target = target[key]
    if value is DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return body


DELETE = object()
# Invalid UTF-8 of several kinds: a lone continuation/0xFF, a truncated 3-byte
# sequence, an overlong '/', an encoded surrogate.
BAD_UTF8 = [b"\xff\xfe", b"ab\xe2\x82", b"\xc0\xaf", b"\xed\xa0\x80x"]


def bad_utf8_string(index):
    return Raw(b'"' + BAD_UTF8[index % len(BAD_UTF8)] + b'"')


# ----------------------------------------------------------------------------- servers

def raise_open_file_limit(wanted=8192):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def metrics_of(base_url):
    import urllib.request
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def kv_in_use(samples):
    return samples.get('loom_kv_cache_blocks{state="in_use"}', float("nan"))


def running(samples):
    return samples.get("loom_num_requests_running", float("nan"))


class ServerCase(unittest.TestCase):
    """A shared server per class; invariants checked after every case; a
    server a case killed is restarted before the next one."""

    SERVER_ARGS = []
    NUM_ADAPTERS = 1

    @classmethod
    def start_server(cls):
        cls.server = loom_server.LoomServer(
            flags(("--kv-cache-bytes", 64_000_000)) + cls.SERVER_ARGS, num_adapters=cls.NUM_ADAPTERS)
        cls.port = cls.server.port

    @classmethod
    def setUpClass(cls):
        raise_open_file_limit()
        cls.start_server()
        cls.greedy_text = None
        cls.greedy_text = cls.greedy()

    @classmethod
    def tearDownClass(cls):
        status = cls.server.stop()
        cls.server.cleanup()
        assert status == 0, f"loom serve exited with {status} on SIGTERM"

    @classmethod
    def greedy(cls):
        status, _, body = cls.server.request("POST", "/v1/completions", GREEDY_BODY)
        assert status == 200, (status, body)
        return json.loads(body)["choices"][0]["text"]

    def setUp(self):
        if self.server.process.poll() is not None:  # killed by an earlier case: judged there
            print(f"note: restarting the server (it exited with {self.server.process.returncode})", flush=True)
            self.server.stop()
            self.server.cleanup()
            type(self).start_server()

    def tearDown(self):
        self.assert_server_healthy()

    def assert_server_healthy(self, idle_timeout=5.0):
        code = self.server.process.poll()
        if code is not None:
            log = self.server.read_log()
            self.fail(f"the server died (exit {code}); log tail:\n{log[-3000:]}")
        status, _, body = self.server.request("GET", "/health")
        self.assertEqual(status, 200, body)
        self.assertEqual(self.greedy(), self.greedy_text, "the fixed greedy request changed its text")
        deadline = time.monotonic() + idle_timeout
        while True:
            samples = metrics_of(self.server.base_url)
            if kv_in_use(samples) == 0 and running(samples) == 0:
                return
            if time.monotonic() > deadline:
                self.fail(f"not idle after the case: {kv_in_use(samples)} KV blocks in use, "
                          f"{running(samples)} requests running")
            time.sleep(0.1)

    # ------------------------------------------------------------------ helpers

    def send(self, method, path, body=b"", headers=(), content_type="application/json", timeout=30.0):
        if not isinstance(body, bytes):
            body = encode_body(body)
        response = exchange(self.port, request_bytes(method, path, body, headers, content_type), timeout)
        self.assertIsNotNone(response, f"{method} {path!r}: connection closed without a response")
        return response

    def assert_clean(self, response, what):
        """No internal exception text anywhere in the response."""
        text = (repr(response.headers) + response.body.decode("utf-8", "replace")).lower()
        for marker in LEAK_MARKERS:
            self.assertNotIn(marker, text, f"{what}: internal text {marker!r} in {response!r}")

    def assert_error(self, response, what, status=None, param=None, statuses=None):
        """A JSON OpenAI-style error with `status` (or one of `statuses`, or any 4xx), and `param` if given."""
        self.assert_clean(response, what)
        if status is not None:
            self.assertEqual(response.status, status, f"{what}: {response!r}")
        elif statuses is not None:
            self.assertIn(response.status, statuses, f"{what}: {response!r}")
        else:
            self.assertTrue(400 <= response.status < 500, f"{what}: {response!r}")
        try:
            error = json.loads(response.body.decode("utf-8"))["error"]
        except (ValueError, KeyError, TypeError) as exc:
            self.fail(f"{what}: the error body is not OpenAI-style JSON ({exc}): {response!r}")
        self.assertIsInstance(error.get("message"), str, f"{what}: {response!r}")
        if param is not None:
            self.assertEqual(error.get("param"), param, f"{what}: param of {response!r}")
        return error


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
            ("presence_penalty", [1, "x", E999, []], None),
            ("frequency_penalty", [1, "x", E999, []], None),
            ("repetition_penalty", [2, "x", []], None),
            ("logit_bias", [{"1": 5}, "x", [1], E999], None),
            ("best_of", [2, -1, "x", BIG, E999], None),
            ("workflow", [1, [], {}, "bad id", "", "x" * 300, E999], None),
            ("fixed_prefix_tokens", [-1, BIG, "x", E999, 1.5, []], None),
        ]
        completions = common + [
            ("prompt", [E999, -1, BIG, {}, [], None, True, [[]]], None),
            ("prompt", [[-1], [BIG], [512], [E999], [1.5]], "prompt[0]"),  # token ids are named by index
            ("prompt", [[[1], 5], ["a", 5], ["a", {}]], "prompt[1]"),
            ("logprobs", [E999, -1, 21, BIG, "x", [], {}, True], None),
            ("echo", [True, "x", 1], None),
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
            ("tools", [[{"type": "function"}], "x", 1], None),
            ("response_format", ["x", 1, []], None),
            ("response_format", [{"type": 1}, {"type": "json_object"}, {}, {"type": E999}], "response_format.type"),
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
        while running(metrics_of(self.server.base_url)) < 1:
            self.assertLess(time.monotonic(), deadline, "the long request never started")
            time.sleep(0.05)
        samples = metrics_of(self.server.base_url)
        self.assertGreater(kv_in_use(samples), 0)
        sock.close()
        closed = time.monotonic()
        while True:
            samples = metrics_of(self.server.base_url)
            if running(samples) == 0 and kv_in_use(samples) == 0:
                break
            self.assertLess(time.monotonic() - closed, 3.0,
                            f"the request went on after its client left: {running(samples)} running, "
                            f"{kv_in_use(samples)} KV blocks in use")
            time.sleep(0.05)
        print(f"\nnon-streaming disconnect: freed {time.monotonic() - closed:.2f} s after close", flush=True)


# ============================================================================= connection cap and deadlines

class ConnectionLimitsTest(ServerCase):
    SERVER_ARGS = flags(("--max-connections", 32), ("--header-timeout", 2), ("--keep-alive-timeout", 1))

    def test_flags_exist(self):
        for flag in ("--max-connections", "--header-timeout", "--keep-alive-timeout", "--max-header-bytes",
                     "--max-header-count", "--shutdown-timeout"):
            self.assertTrue(supports(flag), f"loom serve has no {flag}")

    def test_connection_cap_answers_503(self):
        self.assertTrue(supports("--max-connections"), "no --max-connections")
        socks = [connect(self.port) for _ in range(40)]
        try:
            refused = 0
            time.sleep(0.5)
            for sock in socks:
                try:
                    response = read_response(sock, timeout=0.1)
                except (TimeoutError, socket.timeout):
                    continue
                except ConnectionResetError:
                    response = None
                if response is not None:
                    self.assert_error(response, "over the cap", status=503)
                    refused += 1
            self.assertGreaterEqual(refused, 8, "connections beyond --max-connections 32 were not answered 503")
        finally:
            for sock in socks:
                sock.close()
        time.sleep(0.2)

    def test_header_deadline_answers_408(self):
        sock = connect(self.port)
        started = time.monotonic()
        try:
            text = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 100
            result = []

            def reader():
                try:
                    result.append(read_response(sock, timeout=8))
                except Exception as exc:  # noqa: BLE001 - reported below
                    result.append(exc)

            thread = threading.Thread(target=reader, daemon=True)
            thread.start()
            for byte in text:  # one byte per 0.25 s: never completes within 2 s
                if not thread.is_alive():
                    break
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.25)
            thread.join(8)
            self.assertTrue(result, "no answer to a trickling request head")
            response = result[0]
            if isinstance(response, Exception):
                self.fail(f"trickling request head: {response!r}")
            self.assertIsNotNone(response, "dropped without a 408")
            self.assert_error(response, "header deadline", status=408)
            self.assertLess(time.monotonic() - started, 6.0)
        finally:
            sock.close()

    def test_idle_keep_alive_connection_is_closed(self):
        sock = connect(self.port)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            response = read_response(sock, timeout=10)
            self.assertEqual(response.status, 200)
            sock.settimeout(5.0)
            started = time.monotonic()
            try:
                data = sock.recv(100)
            except (TimeoutError, socket.timeout):
                self.fail("an idle keep-alive connection stayed open 5 s (--keep-alive-timeout 1)")
            except ConnectionResetError:
                data = b""
            self.assertEqual(data, b"")
            self.assertLess(time.monotonic() - started, 4.0)
        finally:
            sock.close()

    def test_port_in_use_is_refused(self):
        args = [loom_server.loom_binary(), "serve", "--model", self.server.model_dir, "--port", str(self.port),
                "--threads", "1"] + flags(("--kv-cache-bytes", 16_000_000))
        started = time.monotonic()
        try:
            result = subprocess.run(args, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired as exc:
            self.fail(f"a second loom serve on port {self.port} kept running: {exc.stdout!r} {exc.stderr!r}")
        output = result.stdout + result.stderr
        self.assertNotEqual(result.returncode, 0, output)
        self.assertIn(str(self.port), output)
        self.assertIn("in use", output.lower())
        print(f"\nport in use: exit {result.returncode} after {time.monotonic() - started:.2f} s", flush=True)


# ============================================================================= signals

def start_stream(port, body):
    """A streaming completion read by a thread: returns (state dict, thread)."""
    state = {"response": None, "error": None, "first_data": threading.Event()}
    sock = connect(port, timeout=60)
    sock.sendall(request_bytes("POST", "/v1/completions", encode_body({**body, "stream": True})))

    def on_data(chunk):
        if b"data:" in chunk:
            state["first_data"].set()

    def run():
        try:
            state["response"] = read_response(sock, timeout=90, on_data=on_data)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            state["error"] = exc
        finally:
            sock.close()
            state["first_data"].set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return state, thread


def start_whole(port, body):
    state = {"response": None, "error": None}
    sock = connect(port, timeout=60)
    sock.sendall(request_bytes("POST", "/v1/completions", encode_body(body)))

    def run():
        try:
            state["response"] = read_response(sock, timeout=90)
        except Exception as exc:  # noqa: BLE001
            state["error"] = exc
        finally:
            sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return state, thread


def sse_events(body):
    return [line[len(b"data: "):] for line in body.split(b"\n") if line.startswith(b"data: ")]


def refused_now(port):
    try:
        socket.create_connection((HOST, port), timeout=0.5).close()
        return False
    except OSError:
        return True


class ShutdownTest(unittest.TestCase):
    """Each case starts its own server and signals it."""

    def start(self, *extra):
        server = loom_server.LoomServer(flags(("--kv-cache-bytes", 96_000_000)) + list(extra), num_adapters=1)
        self.addCleanup(server.cleanup)
        self.addCleanup(server.stop)
        return server

    def wait_running(self, server, count, timeout=20):
        deadline = time.monotonic() + timeout
        while running(metrics_of(server.base_url)) < count:
            self.assertLess(time.monotonic(), deadline, f"{count} requests never ran together")
            time.sleep(0.05)

    def signal_and_watch(self, server, signum):
        """Sends `signum`; returns whether a new connection was refused while the process still ran."""
        server.process.send_signal(signum)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and server.process.poll() is None:
            if refused_now(server.port):
                return server.process.poll() is None
            time.sleep(0.05)
        return False

    def wait_exit(self, server, timeout):
        try:
            return server.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"loom serve still running {timeout} s after the signal:\n{server.read_log()[-2000:]}")

    def test_sigterm_ends_requests_in_flight_explicitly(self):
        server = self.start(*flags(("--shutdown-timeout", 2)))
        stream, stream_thread = start_stream(server.port, LONG)
        whole, whole_thread = start_whole(server.port, LONG)
        self.assertTrue(stream["first_data"].wait(20), "the stream never started")
        self.wait_running(server, 2 * LONG["n"])
        refused = self.signal_and_watch(server, signal.SIGTERM)
        code = self.wait_exit(server, 20)
        stream_thread.join(10)
        whole_thread.join(10)
        self.assertEqual(code, 0, server.read_log()[-2000:])
        self.assertTrue(refused, "new connections were still accepted after SIGTERM")
        self.assertIsNone(stream["error"], stream)
        self.assertIsNotNone(stream["response"], stream)
        events = sse_events(stream["response"].body)
        self.assertEqual(events[-1], b"[DONE]", events[-3:])
        self.assertIn("error", json.loads(events[-2]), events[-3:])
        self.assertIsNone(whole["error"], whole)
        response = whole["response"]
        self.assertIsNotNone(response, "the non-streaming request got no response")
        self.assertEqual(response.status, 503, response)
        self.assertEqual(json.loads(response.body)["error"]["code"], "server_shutting_down", response)

    def test_sigint_lets_requests_in_flight_finish(self):
        server = self.start(*flags(("--shutdown-timeout", 60)))
        body = {**LONG, "n": 4, "max_tokens": 3000}  # seconds of work: still running when the signal comes
        stream, stream_thread = start_stream(server.port, body)
        whole, whole_thread = start_whole(server.port, body)
        self.assertTrue(stream["first_data"].wait(20), "the stream never started")
        self.wait_running(server, 2 * body["n"])
        refused = self.signal_and_watch(server, signal.SIGINT)
        code = self.wait_exit(server, 90)
        stream_thread.join(10)
        whole_thread.join(10)
        self.assertEqual(code, 0, server.read_log()[-2000:])
        self.assertTrue(refused, "new connections were still accepted after SIGINT")
        self.assertIsNone(stream["error"], stream)
        events = sse_events(stream["response"].body)
        self.assertEqual(events[-1], b"[DONE]", events[-3:])
        chunks = [json.loads(event) for event in events[:-1]]
        self.assertFalse([chunk for chunk in chunks if "error" in chunk], "a stream that had time got an error")
        finished = [choice for chunk in chunks for choice in chunk.get("choices", []) if choice.get("finish_reason")]
        self.assertEqual(len(finished), body["n"], finished)
        self.assertEqual({choice["finish_reason"] for choice in finished}, {"length"})
        self.assertIsNone(whole["error"], whole)
        self.assertEqual(whole["response"].status, 200, whole["response"])
        usage = json.loads(whole["response"].body)["usage"]
        self.assertEqual(usage["completion_tokens"], body["n"] * body["max_tokens"])

    def test_second_signal_exits_at_once(self):
        server = self.start(*flags(("--shutdown-timeout", 60)))
        whole, _ = start_whole(server.port, LONG)
        self.wait_running(server, LONG["n"])
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        self.assertIsNone(server.process.poll(), "the first signal should drain, not exit")
        server.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = self.wait_exit(server, 5)
        print(f"\nsecond signal: exit {code} after {time.monotonic() - started:.2f} s", flush=True)
        self.assertNotEqual(code, 0, "a second signal is an abort, not a drained exit")


# ============================================================================= adapter capabilities

class DisabledKvSharingTest(ServerCase):
    SERVER_ARGS = ["--allow-runtime-lora", "--disable-kv-sharing", "base"]

    @classmethod
    def setUpClass(cls):
        if not supports("--disable-kv-sharing"):
            raise unittest.SkipTest("loom serve has no --disable-kv-sharing")
        super().setUpClass()

    def test_base_adapter_refused_at_start(self):
        adapter = os.path.join(self.server.adapter_dir, "adapter0")
        args = [loom_server.loom_binary(), "serve", "--model", self.server.model_dir, "--port", "0",
                "--threads", "1", "--kv-cache-bytes", "16000000", "--disable-kv-sharing", "base",
                "--lora", f"x={adapter}:base"]
        try:
            result = subprocess.run(args, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            self.fail("loom serve started with a base adapter under --disable-kv-sharing base")
        output = result.stdout + result.stderr
        self.assertNotEqual(result.returncode, 0, output)
        self.assertIn("base", output)
        self.assertIn("disable-kv-sharing", output)

    def test_base_adapter_refused_at_runtime_load(self):
        adapter = os.path.join(self.server.adapter_dir, "adapter0")
        response = self.send("POST", "/v1/load_lora_adapter",
                             {"lora_name": "rt-base", "lora_path": adapter, "kv_sharing": "base"})
        self.assert_error(response, "base adapter", status=400)
        self.assertIn("disable-kv-sharing", json.loads(response.body)["error"]["message"])
        status, _, body = self.server.request("GET", "/v1/models")
        self.assertNotIn("rt-base", [model["id"] for model in json.loads(body)["data"]])


if __name__ == "__main__":
    unittest.main(verbosity=2)
