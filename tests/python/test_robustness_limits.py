"""Robustness of `loom serve`: the connection cap, the header and
keep-alive deadlines, a second server on a port in use, the waiting queue's
all-or-nothing admission of a fan-out, and a `base` adapter
refused by --disable-kv-sharing (robustness_util.ServerCase checks the server
after every case).
"""
import json
import os
import socket
import subprocess
import threading
import time
import unittest

import loom_server
from robustness_util import (
    ServerCase, connect, flags, read_response, supports)


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




# ============================================================================= adapter capabilities

class WaitingQueueLimitTest(ServerCase):
    """A request's sequences (prompts x n) are queued all or none: a fan-out
    refused at --max-waiting-requests leaves nothing behind it."""
    LIMIT = 16
    SERVER_ARGS = flags(("--max-waiting-requests", LIMIT))

    def fan_out(self, num_prompts, n):
        return self.send("POST", "/v1/completions", {
            "model": "tiny", "prompt": [f"fan out {i}" for i in range(num_prompts)], "n": n,
            "max_tokens": 4, "temperature": 1.0, "seed": 1})

    def test_refused_fan_out_then_small_request(self):
        for attempt in range(10):
            refused = self.fan_out(4, 8)  # 32 sequences, twice the limit
            error = self.assert_error(refused, "fan-out over the queue limit", status=503)
            self.assertIn("none was queued", error["message"])
            self.assertEqual(self.server.metrics().get("loom_num_requests_waiting"), 0,
                             f"attempt {attempt}: sequences of the refused fan-out were left waiting")
            small = self.send("POST", "/v1/completions", {"model": "tiny", "prompt": "small", "max_tokens": 2})
            self.assertEqual(small.status, 200, f"attempt {attempt}: {small!r}")

    def test_fan_out_at_the_limit_is_served(self):
        response = self.fan_out(2, 8)
        self.assertEqual(response.status, 200, response)
        choices = json.loads(response.body)["choices"]
        self.assertEqual(sorted(choice["index"] for choice in choices), list(range(self.LIMIT)))


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
