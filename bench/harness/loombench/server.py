"""Launching `loom serve` for one configuration: free port, wait for /health,
SIGTERM (then SIGKILL) afterwards. The server's output goes to a log file."""
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import List, Optional


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerError(RuntimeError):
    pass


class LaunchedServer:
    """`loom serve ARGS --host 127.0.0.1 --port P` until stop()."""

    def __init__(self, loom_binary: str, serve_args: List[str], log_path: str, startup_timeout_s: float = 300.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [loom_binary, "serve", *serve_args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process: Optional[subprocess.Popen] = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_healthy(startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def log_tail(self, num_lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(log.readlines()[-num_lines:])
        except OSError:
            return ""

    def _wait_healthy(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"loom serve exited with status {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        raise ServerError(f"loom serve was not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> Optional[int]:
        """Ends the server (its whole process group); returns its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
        status = self.process.returncode
        self.process = None
        return status
