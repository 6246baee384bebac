"""Prefill/decode disaggregation (DualPath) against real processes: `loom
router` in front of `loom serve --role prefill` and `--role decode` engines on
one tiny model. Greedy outputs equal a single `--role both` server in every
sharing mode (1 PE + 1 DE and 2 PE + 1 DE); both KV loading paths (storage ->
PE, and storage -> DE -> PE) run and are counted in the router's and the
engines' metrics; a prefill engine killed with SIGKILL leaves the others
serving with the same outputs and every decode-engine block accounted for.
Every deployment shares a KV transfer secret (--kv-transfer-secret-file);
AuthenticationTest checks what engines refuse without it."""
import concurrent.futures
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

MODES = {"adapter0": "activated", "adapter1": "base", "adapter2": "forked", "adapter3": "isolated"}
VOCAB = 512
INVOCATION = [VOCAB // 2 + 3, VOCAB // 2 + 7]  # synthetic_alora_invocation_tokens of the tiny model
ENGINE_ARGS = ["--max-lora-rank", "16"]


SECRET = "a-test-secret-" + "0123456789abcdef" * 2


def kv_auth_header(secret, method, path, body=b"", when=None):
    """X-Loom-KV-Auth for one call (server/kv_auth.h's format, computed independently)."""
    when = int(time.time()) if when is None else when
    text = f"loom kv http 1\n{method}\n{path}\n{when}\n{hashlib.sha256(body).hexdigest()}"
    return {"X-Loom-KV-Auth": f"1 {when} " + hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()}


def token_prompt(length, seed):
    return [10 + (i * 37 + seed * 101 + i * i * seed) % 240 for i in range(length)]


class LoomRouter:
    """`loom router` over engine URLs; stop() ends it."""

    def __init__(self, prefill, decode, extra_args=()):
        self.port = loom_server.free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = [loom_server.loom_binary(), "router", "--port", str(self.port)]
        for server in prefill:
            args += ["--prefill", server.base_url]
        for server in decode:
            args += ["--decode", server.base_url]
        args += list(extra_args)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="loom-router-", suffix=".log", delete=False)
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        loom_server.wait_healthy(self.process, self.base_url, self.read_log, what="loom router")

    def read_log(self):
        self.log.flush()
        with open(self.log.name) as log:
            return log.read()

    def metrics(self):
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as response:
            return loom_server.parse_metrics(response.read())

    def client(self):
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self):
        returncode = loom_server.stop_process(self.process)
        self.log.close()
        os.unlink(self.log.name)
        return returncode


def complete(client, model, prompt, max_tokens=8, stream=False):
    if stream:
        chunks = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                           stream=True, extra_body={"ignore_eos": True})
        return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    response = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                         extra_body={"ignore_eos": True})
    return response.choices[0].text


def counter(samples, prefix, **labels):
    """Sum of the samples named `prefix` whose labels include `labels`."""
    total = 0.0
    for name, value in samples.items():
        base = name.split("{", 1)[0]
        if base != prefix:
            continue
        if all(f'{key}="{value_}"' in name for key, value_ in labels.items()):
            total += value
    return total


class Deployment(unittest.TestCase):
    """Engines sharing one model directory and one disk directory."""

    def setUp(self):
        self.disk = tempfile.mkdtemp(prefix="loom-dualpath-")
        self.secret_file = os.path.join(self.disk, "kv-secret")
        with open(self.secret_file, "w") as file:
            file.write(SECRET + "\n")
        self.servers = []
        self.routers = []
        self.model_dir = None

    def tearDown(self):
        for router in self.routers:
            router.stop()
        for server in self.servers:
            server.stop()
            server.cleanup()
        shutil.rmtree(self.disk, ignore_errors=True)

    def engine(self, role, extra=(), secret_file=None, same_device=False):
        args = [*ENGINE_ARGS, "--role", role, "--kv-transfer-secret-file", secret_file or self.secret_file, *extra]
        # On a GPU machine (bench/cuda/device_kv_check.sh): LOOM_TEST_DEVICE places the engines,
        # LOOM_TEST_DECODE_DEVICE the decode engines (another GPU) unless `same_device`; CI leaves both unset (CPU).
        decode_device = role == "decode" and not same_device
        device = os.environ.get("LOOM_TEST_DECODE_DEVICE" if decode_device else "LOOM_TEST_DEVICE") or \
            os.environ.get("LOOM_TEST_DEVICE")
        if device:
            args += ["--device", device, "--kv-cache-bytes", "1G"]  # several engines share a GPU
        kwargs = {"make_model_args": ["--alora"], "lora_modes": MODES}
        if self.model_dir:
            kwargs["model_dir"] = self.model_dir
        server = loom_server.LoomServer(args, **kwargs)
        self.model_dir = self.model_dir or server.model_dir
        self.servers.append(server)
        return server

    def router(self, prefill, decode, extra=()):
        router = LoomRouter(prefill, decode, ["--kv-transfer-secret-file", self.secret_file, *extra])
        self.routers.append(router)
        return router


class RouterOutputsTest(Deployment):
    def jobs(self):
        shared = token_prompt(22, 1)
        out = []
        for round_index in range(2):
            tail = token_prompt(3 + round_index, 2 + round_index)
            out += [("tiny", shared + tail),
                    ("adapter0", shared + INVOCATION + tail),
                    ("adapter1", shared + tail),
                    ("adapter2", token_prompt(19 + round_index, 7 + round_index)),
                    ("adapter3", shared + tail)]
        return out

    def check_same_as_one_engine(self, num_prefill):
        both = self.engine("both")
        prefill = [self.engine("prefill") for _ in range(num_prefill)]
        decode = [self.engine("decode")]
        router = self.router(prefill, decode)
        alone = openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0)
        routed = router.client()
        for model, prompt in self.jobs():
            with self.subTest(model=model, prompt=len(prompt)):
                expected = complete(alone, model, prompt)
                self.assertEqual(complete(routed, model, prompt), expected)
                self.assertEqual(complete(routed, model, prompt, stream=True), expected)
        # Chat too, rendered by the model's template on every engine alike.
        messages = [{"role": "user", "content": "the same words again and again " * 6}]
        expected = alone.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.0,
                                                 extra_body={"ignore_eos": True}).choices[0].message.content
        got = routed.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.0,
                                             extra_body={"ignore_eos": True}).choices[0].message.content
        self.assertEqual(got, expected)
        # The decode engine decoded from blocks it was sent, and never prefilled a whole prompt itself.
        samples = decode[0].metrics()
        self.assertGreater(counter(samples, "loom_kv_link_blocks_total", direction="received"), 0)
        self.assertGreater(samples.get("loom_prefix_cache_hit_tokens_total", 0), 0)
        sent = 0
        for engine in prefill:  # each prefill engine pushed blocks (or found the decode engine had them)
            samples = engine.metrics()
            sent += counter(samples, "loom_kv_link_blocks_total", direction="sent")
            self.assertGreater(counter(samples, "loom_kv_link_blocks_total", direction="sent") +
                               counter(samples, "loom_kv_link_blocks_total", direction="skipped"), 0)
        self.assertGreater(sent, 0)
        return router

    def test_one_prefill_one_decode_match_one_engine_in_every_mode(self):
        self.check_same_as_one_engine(1)

    def test_two_prefill_one_decode_match_one_engine_and_share_the_work(self):
        router = self.check_same_as_one_engine(2)
        samples = router.metrics()
        self.assertGreater(counter(samples, "loom_router_requests_total"), 0)


class LinkTest(Deployment):
    def test_a_second_turn_pushes_only_the_blocks_the_decode_engine_lacks(self):
        prefill, decode = self.engine("prefill"), self.engine("decode")
        client = self.router([prefill], [decode]).client()
        first = token_prompt(40, 11)
        complete(client, "tiny", first)
        before = prefill.metrics()
        sent_first = counter(before, "loom_kv_link_blocks_total", direction="sent")
        self.assertGreater(sent_first, 0)
        # The next turn repeats the first prompt: the decode engine caches those blocks
        # (its link's "have" counts them), so only the new ones cross.
        complete(client, "tiny", first + token_prompt(24, 12))
        after = prefill.metrics()
        self.assertEqual(counter(after, "loom_kv_link_blocks_total", direction="skipped") -
                         counter(before, "loom_kv_link_blocks_total", direction="skipped"), sent_first)
        self.assertGreater(counter(after, "loom_kv_link_blocks_total", direction="sent") - sent_first, 0)
        code, _, body = prefill.request("GET", "/loom/kv/status", headers=kv_auth_header(SECRET, "GET", "/loom/kv/status"))
        self.assertEqual(code, 200)
        status = json.loads(body)
        self.assertEqual(status["data_plane"], "tcp")  # no GPU: payloads inline on the link's TCP
        self.assertTrue(status["authenticated"])
        self.assertEqual(status["refused_connections"], 0)

    def test_nccl_without_a_gpu_is_a_clear_error_at_start(self):
        self.engine("both")  # makes the model
        result = subprocess.run([loom_server.loom_binary(), "serve", "--model", self.model_dir, "--role", "prefill",
                                 "--kv-transfer-backend", "nccl", "--port", "0"],
                                capture_output=True, text=True, timeout=120)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("--kv-transfer-backend nccl on --device cpu", result.stderr + result.stdout)


class AuthenticationTest(Deployment):
    def test_unsigned_calls_foreign_peers_and_other_secrets_are_refused(self):
        prefill, decode = self.engine("prefill"), self.engine("decode")
        other_file, other_secret = os.path.join(self.disk, "other-secret"), "another-secret-" + "f" * 32
        with open(other_file, "w") as file:
            file.write(other_secret)
        stranger = self.engine("decode", secret_file=other_file)
        status_path = "/loom/kv/status"
        self.assertEqual(prefill.request("GET", status_path)[0], 401)  # unsigned
        self.assertEqual(prefill.request("GET", status_path, headers=kv_auth_header("wrong-secret-0123456789", "GET",
                                                                                     status_path))[0], 401)
        stale = kv_auth_header(SECRET, "GET", status_path, when=int(time.time()) - 3600)
        self.assertEqual(prefill.request("GET", status_path, headers=stale)[0], 401)

        def status(engine):
            secret = other_secret if engine is stranger else SECRET
            code, _, body = engine.request("GET", status_path, headers=kv_auth_header(secret, "GET", status_path))
            self.assertEqual(code, 200, body)
            return json.loads(body)

        # Pushing a prompt's blocks: a peer outside the allowed list is refused (403), an engine with another
        # secret fails the link's handshake (502) and receives nothing.
        probe = json.dumps({"endpoint": "completions",
                            "request": {"model": "tiny", "prompt": token_prompt(40, 6), "max_tokens": 1}}).encode()
        code, _, body = prefill.request("POST", "/loom/kv/probe", raw=probe,
                                        headers=kv_auth_header(SECRET, "POST", "/loom/kv/probe", probe))
        self.assertEqual(code, 200, body)
        blocks = json.loads(body)["blocks"]

        def send(to):
            payload = json.dumps({"blocks": blocks, "to": to}).encode()
            code, _, body = prefill.request("POST", "/loom/kv/send", raw=payload,
                                            headers=kv_auth_header(SECRET, "POST", "/loom/kv/send", payload))
            return code, json.loads(body)

        code, body = send("10.20.30.40:5000")
        self.assertEqual(code, 403)
        self.assertEqual(body["error"]["code"], "kv_peer_not_allowed")
        code, body = send(status(stranger)["kv_transfer_address"])
        self.assertEqual(code, 502)
        self.assertIn("handshake failed", body["error"]["message"])
        # The stranger's connection thread counts its refusal after the sender already saw the closed link.
        deadline = time.time() + 10
        stranger_status = status(stranger)
        while stranger_status["refused_connections"] < 1 and time.time() < deadline:
            time.sleep(0.05)
            stranger_status = status(stranger)
        self.assertEqual(stranger_status["received_blocks"], 0)
        self.assertEqual(stranger_status["buffer_blocks"], 0)
        self.assertGreaterEqual(stranger_status["refused_connections"], 1)
        self.assertGreater(counter(stranger.metrics(), "loom_kv_link_rejected_total", what="connection"), 0)
        self.assertEqual(status(decode)["refused_connections"], 0)

    def test_a_link_off_loopback_without_a_secret_does_not_start(self):
        self.engine("both")  # makes the model
        result = subprocess.run([loom_server.loom_binary(), "serve", "--model", self.model_dir, "--role", "prefill",
                                 "--kv-transfer-host", "0.0.0.0", "--port", "0"],
                                capture_output=True, text=True, timeout=120)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("without a shared secret", result.stderr + result.stdout)


class LoadingPathsTest(Deployment):
    def test_both_paths_load_from_storage_and_are_counted(self):
        disk = ["--disk-kv-path", self.disk, "--disk-kv-bytes", "256M", "--kv-cache-bytes", "2M"]
        writer = self.engine("both", ["--host-kv-memory", "4M", *disk])
        prefill = self.engine("prefill", disk)
        decode = self.engine("decode", disk)
        by_prefill = self.router([prefill], [decode], ["--path-policy", "prefill"])
        by_decode = self.router([prefill], [decode], ["--path-policy", "decode"])
        writer_client = openai.OpenAI(base_url=writer.base_url + "/v1", api_key="unused", max_retries=0)
        prompts = [token_prompt(61, seed) for seed in (3, 4)]
        expected = [complete(writer_client, "tiny", prompt) for prompt in prompts]
        time.sleep(1.0)  # the writer's write-through lands on disk

        # storage -> PE: the prefill engine reads the prompt's blocks from its storage tier.
        before = prefill.metrics()
        self.assertEqual(complete(by_prefill.client(), "tiny", prompts[0]), expected[0])
        after = prefill.metrics()
        self.assertGreater(after["loom_disk_kv_loaded_tokens_total"], before["loom_disk_kv_loaded_tokens_total"])
        self.assertEqual(counter(by_prefill.metrics(), "loom_router_requests_total", path="prefill"), 1)

        # storage -> DE -> PE: the decode engine reads them and sends them to the prefill engine.
        before_decode = decode.metrics()
        self.assertEqual(complete(by_decode.client(), "tiny", prompts[1]), expected[1])
        after_decode = decode.metrics()
        self.assertGreater(after_decode["loom_kv_link_storage_read_bytes_total"],
                           before_decode["loom_kv_link_storage_read_bytes_total"])
        self.assertEqual(counter(by_decode.metrics(), "loom_router_requests_total", path="decode"), 1)
        self.assertGreater(counter(prefill.metrics(), "loom_kv_link_blocks_total", direction="received"), 0)


class FailureTest(Deployment):
    def test_a_prefill_engine_killed_mid_run_leaves_the_rest_serving(self):
        prefill = [self.engine("prefill"), self.engine("prefill")]
        decode = self.engine("decode")
        both = self.engine("both")
        router = self.router(prefill, [decode], ["--retry-seconds", "60"])
        alone = openai.OpenAI(base_url=both.base_url + "/v1", api_key="unused", max_retries=0)
        prompts = [token_prompt(40 + i, 20 + i) for i in range(12)]
        expected = [complete(alone, "tiny", prompt, max_tokens=6) for prompt in prompts]
        client = router.client()

        def run(index):
            if index == 3:
                prefill[0].process.send_signal(signal.SIGKILL)
            return complete(client, "tiny", prompts[index], max_tokens=6)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(run, range(len(prompts))))
        self.assertEqual(results, expected)
        # Afterwards the survivors still serve, and the decode engine holds no block for a finished request.
        self.assertEqual(complete(client, "tiny", prompts[0], max_tokens=6), expected[0])
        deadline = time.time() + 10
        while time.time() < deadline:
            samples = decode.metrics()
            if counter(samples, "loom_kv_cache_blocks", state="in_use") == 0:
                break
            time.sleep(0.1)
        self.assertEqual(counter(samples, "loom_kv_cache_blocks", state="in_use"), 0)
        self.assertEqual(prefill[1].process.poll(), None)
        self.assertEqual(decode.process.poll(), None)


if __name__ == "__main__":
    unittest.main()
