"""Device-to-device KV across processes (docs/disaggregation.md "Device to
device") between CPU engines over the socket plane (--kv-device-plane): `loom
router` reserves blocks on the decode engine (/loom/kv/reserve), the prefill
engine streams the prompt's KV into them layer by layer while it prefills, the
decode engine decodes from them. Greedy outputs equal one `--role both`
engine's in every sharing mode, the device path is counted by the router and
both engines and nothing goes staged; with the plane off on one engine the
staged path serves and the fallback is counted; a prefill engine that
refuses the send after the reservation gets the reservation cancelled (the
router's request to the decode engine, sent beside the prefill, recomputes
at once, long before a 300 s deadline; counted as a fallback), and so does
one that fails the prefill (a stand-in PE answering 500: prefill_failed, no
other PE tried); tensor-parallel engines (TP=2 at both ends) stream rank to
rank and equal a TP=2 engine alone; a reservation
nobody fills ends at its deadline and the decode engine recomputes; POST
/loom/kv/reserve/cancel (signed; 404 for an unknown id) fails one at once;
the send / receive fields are refused unsigned, and on an engine without a
plane."""
import http.server
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

import test_disaggregation  # noqa: E402
from test_disaggregation import SECRET, Deployment, complete, counter, kv_auth_header, token_prompt  # noqa: E402

# The plane under test: socket between CPU engines (CI); cuda-ipc on a GPU machine (LOOM_TEST_DEVICE,
# bench/cuda/device_kv_check.sh), where `auto` resolves to it as well.
PLANE = os.environ.get("LOOM_TEST_DEVICE_PLANE", "socket")
SOCKET = ["--kv-device-plane", PLANE]


def signed_post(engine, path, body):
    raw = json.dumps(body).encode()
    code, _, reply = engine.request("POST", path, raw=raw, headers=kv_auth_header(SECRET, "POST", path, raw))
    return code, json.loads(reply)


class FailingPrefillEngine:
    """A stand-in PE that reports the socket plane and probes like one, then fails every prefill with a 500
    (a PE that breaks after the router reserved blocks on the DE). `prefills` counts the failed calls."""

    def __init__(self):
        engine = self
        self.prefills = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, code, body):
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                if self.path == "/loom/kv/status":
                    return self.answer(200, {
                        "role": "prefill", "kv_transfer_address": "127.0.0.1:9", "block_size": 4,
                        "bytes_per_block": 1024, "num_requests": 0, "queued_read_bytes": 0, "has_storage": False,
                        "device_kv": {"plane": "socket", "host": "stand-in", "device": "cpu",
                                      "address": "127.0.0.1:9", "same_host_only": False}})
                return self.answer(200, {"status": "ok"} if self.path == "/health" else {"object": "list", "data": []})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/loom/kv/probe":
                    blocks = len(body["request"]["prompt"]) // 4
                    return self.answer(200, {"prompt_tokens": len(body["request"]["prompt"]),
                                             "blocks": ["%032x" % i for i in range(blocks)],
                                             "block_bytes": [1024] * blocks, "bytes_per_block": 1024,
                                             "in_buffer": 0, "in_storage": 0})
                engine.prefills += 1
                return self.answer(500, {"error": {"message": "the stand-in prefill engine fails", "type": "server_error"}})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class DevicePathTest(Deployment):
    jobs = test_disaggregation.RouterOutputsTest.jobs  # the same requests as the staged path's test

    def test_outputs_equal_one_engine_in_every_mode_and_the_device_path_is_counted(self):
        both = self.engine("both")
        prefill = self.engine("prefill", SOCKET)
        decode = self.engine("decode", ["--kv-device-plane", "auto"])  # auto: socket on a CPU engine, cuda-ipc on a GPU
        router = self.router([prefill], [decode])
        alone = openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0)
        routed = router.client()
        code, _, body = decode.request("GET", "/loom/kv/status", headers=kv_auth_header(SECRET, "GET", "/loom/kv/status"))
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(body)["device_kv"]["plane"], PLANE)
        requests = 0
        for model, prompt in self.jobs():
            with self.subTest(model=model, prompt=len(prompt)):
                expected = complete(alone, model, prompt)
                self.assertEqual(complete(routed, model, prompt), expected)
                self.assertEqual(complete(routed, model, prompt, stream=True), expected)
                requests += 2
        messages = [{"role": "user", "content": "the same words again and again " * 6}]
        expected = alone.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.0,
                                                 extra_body={"ignore_eos": True}).choices[0].message.content
        got = routed.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.0,
                                             extra_body={"ignore_eos": True}).choices[0].message.content
        self.assertEqual(got, expected)
        requests += 1

        samples = router.metrics()
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="device"), requests)
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="staged"), 0)
        self.assertEqual(counter(samples, "loom_router_kv_path_fallbacks_total"), 0)
        decoded = decode.metrics()
        self.assertEqual(counter(decoded, "loom_kv_device_transfers_total", direction="received", outcome="ok"),
                         requests)
        self.assertEqual(counter(decoded, "loom_kv_device_transfers_total", direction="received", outcome="failed"), 0)
        self.assertGreater(counter(decoded, "loom_kv_device_received_blocks_total"), 0)
        self.assertEqual(counter(decoded, "loom_kv_link_blocks_total", direction="received"), 0)  # nothing staged
        self.assertGreater(decoded.get("loom_prefix_cache_hit_tokens_total", 0), 0)
        prefilled = prefill.metrics()
        self.assertEqual(counter(prefilled, "loom_kv_device_transfers_total", direction="sent", outcome="ok"), requests)
        self.assertEqual(counter(prefilled, "loom_kv_link_blocks_total", direction="sent"), 0)

    def test_tensor_parallel_engines_stream_rank_to_rank(self):
        """TP=2 engines at both ends (each rank's KV into the peer's same rank; on a GPU machine every engine's
        two ranks on LOOM_TEST_DEVICE and the next GPU): outputs equal a TP=2 engine alone, on the device path."""
        tp = ["--tensor-parallel-size", "2"]
        both = self.engine("both", tp)
        prefill = self.engine("prefill", [*tp, *SOCKET])
        decode = self.engine("decode", [*tp, *SOCKET], same_device=True)
        router = self.router([prefill], [decode])
        alone = openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0)
        requests = 0
        for model, prompt in self.jobs()[:6]:
            with self.subTest(model=model, prompt=len(prompt)):
                self.assertEqual(complete(router.client(), model, prompt), complete(alone, model, prompt))
                requests += 1
        samples = router.metrics()
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="device"), requests)
        self.assertEqual(counter(samples, "loom_router_kv_path_fallbacks_total"), 0)
        decoded = decode.metrics()
        self.assertEqual(counter(decoded, "loom_kv_device_transfers_total", direction="received", outcome="ok"),
                         requests)
        self.assertGreater(counter(decoded, "loom_kv_device_received_blocks_total"), 0)

    def test_with_the_plane_off_on_one_engine_the_staged_path_serves_and_the_fallback_is_counted(self):
        both = self.engine("both")
        prefill = self.engine("prefill", SOCKET)
        decode = self.engine("decode")  # --kv-device-plane none, the default
        router = self.router([prefill], [decode])
        alone = openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0)
        prompts = [token_prompt(30, seed) for seed in (5, 6)]
        for prompt in prompts:
            self.assertEqual(complete(router.client(), "tiny", prompt), complete(alone, "tiny", prompt))
        samples = router.metrics()
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="staged"), len(prompts))
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="device"), 0)
        self.assertEqual(counter(samples, "loom_router_kv_path_fallbacks_total", reason="decode_no_plane"), len(prompts))
        self.assertGreater(counter(decode.metrics(), "loom_kv_link_blocks_total", direction="received"), 0)


    def test_a_prefill_engine_refusing_the_send_cancels_the_reservation_and_the_decode_engine_recomputes(self):
        both = self.engine("both")
        # The PE may send only to a port nobody uses: it refuses every send into the DE's plane (403).
        prefill = self.engine("prefill", [*SOCKET, "--kv-transfer-peers", "127.0.0.1:1"])
        decode = self.engine("decode", SOCKET)
        router = self.router([prefill], [decode], ["--device-kv-timeout", "300"])
        alone = openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0)
        # Each prompt new to the DE (one it held already would need no transfer: nothing to cancel).
        for seed, stream in ((11, False), (12, True), (13, False), (14, True)):
            prompt = token_prompt(30, seed)
            expected = complete(alone, "tiny", prompt)
            started = time.time()
            self.assertEqual(complete(router.client(), "tiny", prompt, stream=stream), expected)
            self.assertLess(time.time() - started, 60)  # not the 300 s deadline
        requests = 4
        samples = router.metrics()
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="recompute"), requests)
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="device"), 0)
        self.assertEqual(counter(samples, "loom_router_kv_path_fallbacks_total", reason="prefill_refused_send"),
                         requests)
        self.assertEqual(counter(samples, "loom_router_engine_failures_total"), 0)  # the PE is fine
        decoded = decode.metrics()
        self.assertEqual(counter(decoded, "loom_kv_device_transfers_total", direction="received",
                                 outcome="cancelled"), requests)
        self.assertEqual(counter(decoded, "loom_kv_device_transfers_total", direction="received", outcome="failed"), 0)
        self.assertEqual(counter(decoded, "loom_kv_device_transfers_total", direction="received", outcome="ok"), 0)


    def test_a_prefill_engine_failing_after_the_reservation_cancels_it_and_the_decode_engine_recomputes(self):
        both = self.engine("both")
        decode = self.engine("decode", SOCKET)
        failing = FailingPrefillEngine()
        self.addCleanup(failing.stop)
        router = self.router([failing], [decode], ["--device-kv-timeout", "300"])
        alone = openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0)
        prompt = token_prompt(30, 21)
        started = time.time()
        self.assertEqual(complete(router.client(), "tiny", prompt), complete(alone, "tiny", prompt))
        self.assertLess(time.time() - started, 60)  # not the 300 s deadline
        self.assertEqual(failing.prefills, 1)  # no retry: the DE's request was committed to the transfer
        samples = router.metrics()
        self.assertEqual(counter(samples, "loom_router_kv_path_total", path="recompute"), 1)
        self.assertEqual(counter(samples, "loom_router_kv_path_fallbacks_total", reason="prefill_failed"), 1)
        self.assertEqual(counter(samples, "loom_router_engine_failures_total"), 1)  # the PE, marked failed
        self.assertEqual(counter(decode.metrics(), "loom_kv_device_transfers_total", direction="received",
                                 outcome="cancelled"), 1)


class DeviceRoutesTest(Deployment):
    def test_an_unfilled_reservation_ends_at_its_deadline_and_the_decode_engine_recomputes(self):
        both = self.engine("both")
        prefill, decode = self.engine("prefill", SOCKET), self.engine("decode", SOCKET)
        plain = self.engine("decode")
        prompt = token_prompt(30, 9)
        expected = complete(openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0),
                            "tiny", prompt)
        request = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
        status = json.loads(prefill.request("GET", "/loom/kv/status",
                                            headers=kv_auth_header(SECRET, "GET", "/loom/kv/status"))[2])
        reserve = {"endpoint": "completions", "request": request, "peer": status["device_kv"]["address"],
                   "timeout_seconds": 1.0}
        code, reservation = signed_post(decode, "/loom/kv/reserve", reserve)
        self.assertEqual(code, 200, reservation)
        self.assertEqual(reservation["num_blocks"], 30 // 4)
        self.assertEqual(len(reservation["main_blocks"]), 30 // 4)
        # Nobody sends: the request waits for the deadline, then recomputes with the same output.
        started = time.time()
        code, answer = signed_post(decode, "/v1/completions",
                                   {**request, "loom_device_kv": {"receive": reservation["transfer_id"]}})
        self.assertEqual(code, 200, answer)
        self.assertEqual(answer["choices"][0]["text"], expected)
        self.assertGreaterEqual(time.time() - started, 0.9)
        self.assertEqual(counter(decode.metrics(), "loom_kv_device_transfers_total", direction="received",
                                 outcome="failed"), 1)

        # A cancelled reservation: the request recomputes at once, not at the (long) deadline.
        other = {**request, "prompt": token_prompt(30, 10)}  # not held by the DE yet: a transfer to wait for
        other_expected = complete(openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0),
                                  "tiny", other["prompt"])
        code, long_lived = signed_post(decode, "/loom/kv/reserve",
                                       {**reserve, "request": other, "timeout_seconds": 300.0})
        self.assertEqual(code, 200, long_lived)
        code, body = signed_post(decode, "/loom/kv/reserve/cancel", {"transfer_id": long_lived["transfer_id"],
                                                                     "reason": "the test's prefill failed"})
        self.assertEqual((code, body), (200, {"transfer_id": long_lived["transfer_id"], "state": "cancelled"}))
        code, body = signed_post(decode, "/loom/kv/reserve/cancel", {"transfer_id": long_lived["transfer_id"]})
        self.assertEqual((code, body["state"]), (200, "settled"))  # already failed: nothing changes
        started = time.time()
        code, answer = signed_post(decode, "/v1/completions",
                                   {**other, "loom_device_kv": {"receive": long_lived["transfer_id"]}})
        self.assertEqual(code, 200, answer)
        self.assertEqual(answer["choices"][0]["text"], other_expected)
        self.assertLess(time.time() - started, 60)
        self.assertEqual(counter(decode.metrics(), "loom_kv_device_transfers_total", direction="received",
                                 outcome="failed"), 1)  # the deadline's, above
        self.assertEqual(counter(decode.metrics(), "loom_kv_device_transfers_total", direction="received",
                                 outcome="cancelled"), 1)
        # The cancel route: signed only (401), unknown ids 404, malformed 400, none on an engine without a plane.
        cancel = json.dumps({"transfer_id": long_lived["transfer_id"]}).encode()
        code, _, body = decode.request("POST", "/loom/kv/reserve/cancel", raw=cancel)
        self.assertEqual(code, 401, body)
        code, body = signed_post(decode, "/loom/kv/reserve/cancel", {"transfer_id": "0123456789abcdef"})
        self.assertEqual((code, body["error"]["code"]), (404, "device_kv_unknown_transfer"))
        code, body = signed_post(decode, "/loom/kv/reserve/cancel", {"transfer_id": "xyz"})
        self.assertEqual((code, body["error"]["param"]), (400, "transfer_id"))
        code, body = signed_post(plain, "/loom/kv/reserve/cancel", {"transfer_id": "0123456789abcdef"})
        self.assertEqual((code, body["error"]["code"]), (400, "device_kv_unavailable"))
        # The engine still serves after all that.
        code, answer = signed_post(decode, "/v1/completions", request)
        self.assertEqual((code, answer["choices"][0]["text"]), (200, expected))

        # Unsigned, the fields are refused; an engine without a plane refuses them and /loom/kv/reserve.
        raw = json.dumps({**request, "loom_device_kv": {"receive": reservation["transfer_id"]}}).encode()
        code, _, body = decode.request("POST", "/v1/completions", raw=raw)
        self.assertEqual(code, 401, body)
        code, body = signed_post(plain, "/v1/completions", {**request, "loom_device_kv": {"receive": "00" * 8}})
        self.assertEqual((code, body["error"]["code"]), (400, "device_kv_unavailable"))
        code, body = signed_post(plain, "/loom/kv/reserve", reserve)
        self.assertEqual((code, body["error"]["code"]), (400, "device_kv_unavailable"))
        # A send to a peer outside --kv-transfer-peers is refused before anything is queued.
        send = {"peer": "10.9.8.7:4000", "transfer_id": "00" * 8, "main_blocks": [1], "first_block": 0}
        code, body = signed_post(prefill, "/v1/completions", {**request, "loom_device_kv": {"send": send}})
        self.assertEqual((code, body["error"]["code"]), (403, "kv_peer_not_allowed"))
        code, body = signed_post(decode, "/v1/completions", {**request, "loom_device_kv": {"receive": "xyz"}})
        self.assertEqual((code, body["error"]["param"]), (400, "loom_device_kv.receive"))


if __name__ == "__main__":
    unittest.main()
