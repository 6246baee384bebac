"""Robustness of `loom serve`: SIGTERM / SIGINT with a streaming and
a non-streaming request in flight (drained, or ended explicitly past
--shutdown-timeout; exit 0; new connections refused), and a second signal that
exits at once. Each case starts its own server.
"""
import json
import signal
import socket
import subprocess
import threading
import time
import unittest

import loom_server
from robustness_util import (
    HOST, LONG, connect, encode_body, flags, read_response, request_bytes, running)




def start_request(port, body, stream):
    """A completion read by a thread: returns (state, thread); state has
    "response" or "error", and "first_data" is set at the first SSE event."""
    state = {"response": None, "error": None, "first_data": threading.Event()}
    sock = connect(port, timeout=60)
    sock.sendall(request_bytes("POST", "/v1/completions", encode_body({**body, "stream": stream})))

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
        while running(server.metrics()) < count:
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

    def signal_with_requests_in_flight(self, server, body, signum, exit_timeout):
        """Starts a streaming and a non-streaming `body`, sends `signum` once both
        run; returns (exit code, whether new connections were refused while it
        drained, the stream's state, the non-streaming request's state)."""
        stream, stream_thread = start_request(server.port, body, stream=True)
        whole, whole_thread = start_request(server.port, body, stream=False)
        self.assertTrue(stream["first_data"].wait(20), "the stream never started")
        self.wait_running(server, 2 * body["n"])
        refused = self.signal_and_watch(server, signum)
        code = self.wait_exit(server, exit_timeout)
        stream_thread.join(10)
        whole_thread.join(10)
        return code, refused, stream, whole

    def test_sigterm_ends_requests_in_flight_explicitly(self):
        server = self.start(*flags(("--shutdown-timeout", 2)))
        code, refused, stream, whole = self.signal_with_requests_in_flight(server, LONG, signal.SIGTERM, 20)
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
        code, refused, stream, whole = self.signal_with_requests_in_flight(server, body, signal.SIGINT, 90)
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
        start_request(server.port, LONG, stream=False)
        self.wait_running(server, LONG["n"])
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        self.assertIsNone(server.process.poll(), "the first signal should drain, not exit")
        server.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = self.wait_exit(server, 5)
        print(f"\nsecond signal: exit {code} after {time.monotonic() - started:.2f} s", flush=True)
        self.assertNotEqual(code, 0, "a second signal is an abort, not a drained exit")


if __name__ == "__main__":
    unittest.main(verbosity=2)
