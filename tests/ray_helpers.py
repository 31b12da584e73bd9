"""Shared by the tests that run real Ray clusters on this machine: nodes started with `ray start --block`
in their own process group, so that stopping one stops exactly that node (`ray stop` would stop every
Ray node here, the developer's too)."""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from typing import Iterator, Sequence

from tests.serve_helpers import free_port, wait_for

RAY = os.path.join(os.path.dirname(sys.executable), "ray")



def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_node(env: dict, *args: str) -> subprocess.Popen:
    """`ray start --block ARGS` with its output discarded. Stopped, it goes at once: Ray would otherwise drain
    a node that holds an actor (a pool's agent) for 30 s before its processes stop."""
    return subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args],
                            env=env | {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def start_head(env: dict, port: int, *args: str) -> subprocess.Popen:
    head = start_node(env, "--head", f"--port={port}", "--include-dashboard=false", *args)
    wait_for(lambda: listening(port), 60, "the Ray head")
    return head


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the leader (`ray start --block` stops its node's processes with it), then SIGKILL to
    whatever of its process group lingers, busy machine or not."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def forget_cluster(port: int) -> None:
    """Our head wrote NODE_IP:PORT to Ray's current-cluster file; a later ray.init() would follow it."""
    current = "/tmp/ray/ray_current_cluster"
    if os.path.exists(current) and open(current).read().strip().endswith(f":{port}"):
        os.remove(current)


def alive_nodes() -> int:
    import ray

    return len([node for node in ray.nodes() if node["Alive"]])


@contextlib.contextmanager
def two_node_cluster(env: dict, head: Sequence[str], second: Sequence[str]) -> Iterator[str]:
    """A head started with the options `head` and a node with `second`, this process's driver connected to them;
    yields the head's address, and stops exactly these two nodes after."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # nodes and driver must agree; read when ray is imported
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(16))  # a fresh machine has no ~/.ray/auth_token
    import ray  # a core dependency: missing, the tests fail rather than skip

    port = free_port()
    address = f"127.0.0.1:{port}"
    env = env | {name: os.environ[name] for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    nodes = [start_head(env, port, *head)]
    try:
        nodes.append(start_node(env, f"--address={address}", *second))
        ray.init(address=address, logging_level="warning")
        wait_for(lambda: alive_nodes() == 2, 60, "two Ray nodes")
        yield address
        ray.shutdown()
    finally:
        for node in reversed(nodes):
            stop(node)
        forget_cluster(port)
