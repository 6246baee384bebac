"""Shared pieces of the robustness suite of `loom serve` (the cases
are in test_robustness*.py): raw HTTP over sockets (a client library would
refuse to send the bad things), JSON bodies with raw bytes spliced in, the
flags of the binary under test, and ServerCase, whose shared server is checked
after every case: the process is alive, /health answers 200, a fixed greedy
request returns the text it returned at the start, and no KV block is in use
once idle. A case that kills the server is reported as failed and the server
is restarted, so each case is judged on its own.

LOOM_BINARY picks the binary (see loom_server.py): running the suite against an
older binary lists what it fails. Flags that binary lacks are left out of its
command lines (and the cases that need them fail or are skipped).
"""
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time

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


def kv_in_use(samples):
    return samples.get('loom_kv_cache_blocks{state="in_use"}', float("nan"))


def running(samples):
    return samples.get("loom_num_requests_running", float("nan"))


class ServerCase(loom_server.ServerTestCase):
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
            samples = self.server.metrics()
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


