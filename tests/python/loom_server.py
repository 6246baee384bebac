"""Starts a real `loom serve` on a tiny random model for black-box tests.

LOOM_BINARY names the binary (CTest sets it); the model comes from
`loom make-model --arch llama --preset tiny --adapters 4`.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

SKIP_EXIT_CODE = 77  # CTest's SKIP_RETURN_CODE


def require_openai():
    try:
        import openai  # noqa: F401
    except ImportError:
        print("SKIPPED: the `openai` package is missing (pip install -r scripts/python-requirements.txt)")
        sys.exit(SKIP_EXIT_CODE)


def loom_binary():
    binary = os.environ.get("LOOM_BINARY")
    if not binary:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        binary = os.path.join(root, "build", "loom")
    if not os.path.exists(binary):
        raise RuntimeError(f"loom binary not found at {binary}; set LOOM_BINARY")
    return binary


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


MODEL_LABEL = 'model_name="tiny"'


def drop_model_label(sample):
    """'loom_x{model_name="tiny",a="b"}' -> 'loom_x{a="b"}', 'loom_x{model_name="tiny"}' -> 'loom_x';
    AssertionError for a sample without that label first."""
    name, brace, labels = sample.partition("{")
    if not brace or not labels.startswith(MODEL_LABEL) or labels[len(MODEL_LABEL)] not in ",}":
        raise AssertionError(f"{sample}: no {MODEL_LABEL} label first")
    rest = labels[len(MODEL_LABEL) + 1:]
    return name + ("{" + rest if rest else "")


def wait_healthy(process, base_url, read_log, what="loom serve", timeout=60.0):
    """Until GET base_url/health answers 200; RuntimeError with the log if the process exits or never does."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{read_log()}")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not become healthy:\n{read_log()}")


def stop_process(process):
    """SIGTERM, then SIGKILL after 30 s; returns the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def parse_metrics(body):
    """Prometheus samples as {'name{labels}': value}."""
    samples = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


class LoomServer:
    """A model directory plus a running server; stop() ends both."""

    def __init__(self, extra_args=(), num_adapters=4, make_model_args=(), lora_modes=None, model_dir=None):
        """lora_modes: {adapter name: KV sharing mode} appended as --lora NAME=PATH:MODE.
        model_dir: serve that model (another server's) instead of making one."""
        self.directory = tempfile.mkdtemp(prefix="loom-http-")
        self.model_dir = model_dir or os.path.join(self.directory, "model")
        if model_dir is None:
            subprocess.run([loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny", "--adapters",
                            str(num_adapters), *make_model_args, "--out", self.model_dir], check=True,
                           stdout=subprocess.DEVNULL)
        self.adapter_dir = os.path.join(self.model_dir, "adapters")
        self.adapter_names = sorted(os.listdir(self.adapter_dir))
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        args = [loom_binary(), "serve", "--model", self.model_dir, "--served-model-name", "tiny",
                "--port", str(self.port), "--threads", "1", "--block-size", "4"]
        for name in self.adapter_names:
            mode = (lora_modes or {}).get(name)
            args += ["--lora", f"{name}={os.path.join(self.adapter_dir, name)}" + (f":{mode}" if mode else "")]
        args += list(extra_args)
        self.log_path = os.path.join(self.directory, "server.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_healthy()

    def _wait_healthy(self, timeout=60.0):
        wait_healthy(self.process, self.base_url, self.read_log, timeout=timeout)

    def read_log(self):
        with open(self.log_path) as log:
            return log.read()

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, body bytes) of one plain HTTP request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def metrics(self):
        """Prometheus samples as {'name{labels}': value}, less the model_name
        label, which every sample must carry first (the served name, "tiny")."""
        _, _, body = self.request("GET", "/metrics")
        return {drop_model_label(name): value for name, value in parse_metrics(body).items()}

    def stop(self):
        """SIGTERM; returns the exit status."""
        returncode = stop_process(self.process)
        self.log.close()
        return returncode

    def cleanup(self):
        shutil.rmtree(self.directory, ignore_errors=True)


class ServerTestCase(unittest.TestCase):
    """One LoomServer per test class (SERVER_ARGS, SERVER_KWARGS), an `openai`
    client on it, and a check that SIGTERM at the end exits 0."""

    SERVER_ARGS = ()
    SERVER_KWARGS = {}

    @classmethod
    def setUpClass(cls):
        cls.server = LoomServer(list(cls.SERVER_ARGS), **cls.SERVER_KWARGS)
        cls.port = cls.server.port
        import openai  # after require_openai(): not every suite needs it
        cls.client = openai.OpenAI(base_url=cls.server.base_url + "/v1", api_key="unused", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        status = cls.server.stop()
        cls.server.cleanup()
        assert status == 0, f"loom serve exited with {status} on SIGTERM"
