"""Start a real `tensortune serve` on a free loopback port, for the tests that drive it over HTTP."""
import socket
import subprocess
import sys
import time

import httpx

SERVE = [sys.executable, "-m", "service", "serve", "--workers", "local"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, seconds: float, what: str):
    """`check()`'s first true value, asked every 0.1 s; fails the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


def start(url: str, port: int, env: dict, log=subprocess.DEVNULL) -> subprocess.Popen:
    """The server in its own session (kill it with os.killpg), once /healthz answers; its output to `log`."""
    server = subprocess.Popen(SERVE + ["--db", url, "--port", str(port)], env=env, start_new_session=True,
                              stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz").raise_for_status()
            return server
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("tensortune serve did not come up")
