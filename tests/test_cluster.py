"""The docker-compose topology without containers: PostgreSQL on 127.0.0.1, a Ray head and a worker
node started with `ray start`, and `tensortune serve` pointed at both. A job submitted over HTTP must
land its measurements in PostgreSQL, made on the worker node: the head offers no CPU (as in the
compose file's `ray-head`, which only drives), so every candidate has to travel there.

The Ray token is passed through the environment, as docker-compose.yml does, so the test also checks
that nodes and the service agree on it without ~/.ray/auth_token."""
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import httpx

from db import Database
from db_helpers import pg_schema

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
TRIALS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def worker_node_id(address: str, env: dict) -> str | None:
    """The id of the node advertising `worker_cpu` once it has joined, asked by a short-lived driver
    (a driver in this process would tie the rest of the suite to this cluster)."""
    script = ("import json, ray; ray.init(address=%r, logging_level='error'); "
              "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive'] and 'worker_cpu' in n['Resources']]))")
    found = subprocess.run([sys.executable, "-c", script % address], env=env, capture_output=True, text=True,
                           check=True, timeout=60)
    ids = json.loads(found.stdout.strip().splitlines()[-1])
    return ids[0] if ids else None


def finished(base: str, job_id: int) -> str | None:
    status = httpx.get(f"{base}/api/jobs/{job_id}").json()["status"]
    return status if status in ("done", "failed", "cancelled") else None


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


def healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def test_a_job_over_http_is_measured_on_the_worker_node_and_stored_in_postgresql():
    with pg_schema() as url:
        ray_port, http_port = free_port(), free_port()
        address, base = f"127.0.0.1:{ray_port}", f"http://127.0.0.1:{http_port}"
        env = os.environ | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
                            "TENSORTUNE_TOKEN": "cluster-secret"}
        env.pop("RAY_ADDRESS", None)
        quiet = dict(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        # `--block` keeps each node in one process group of ours: stopping it stops exactly that node
        started = [subprocess.Popen([RAY, "start", "--head", "--block", f"--port={ray_port}", "--num-cpus=0",
                                     "--include-dashboard=false", "--disable-usage-stats"], **quiet)]
        try:
            wait_for(lambda: listening(ray_port), 60, "the Ray head")
            started.append(subprocess.Popen([RAY, "start", "--block", f"--address={address}", "--num-cpus=1",
                                             '--resources={"worker_cpu": 1}', "--disable-usage-stats"], **quiet))
            node = wait_for(lambda: worker_node_id(address, env), 60, "the worker node")
            started.append(subprocess.Popen([sys.executable, "-m", "service", "serve", "--db", url,
                                             "--port", str(http_port), "--workers", address], **quiet))
            wait_for(lambda: healthy(base), 60, "tensortune serve")
            job = httpx.post(f"{base}/api/jobs", headers={"Authorization": "Bearer cluster-secret"}, json={
                "workload": {"op": "matmul", "params": {"M": 48, "N": 48, "K": 48}},
                "target": "llvm -threads=1", "trials": TRIALS, "tuner": "random"})
            assert job.status_code == 201, job.text
            job_id = job.json()["id"]
            status = wait_for(lambda: finished(base, job_id), 60, "the job")
            assert status == "done", httpx.get(f"{base}/api/jobs/{job_id}").json()
            with Database(url) as database:
                records = database.job_records(job_id)
            assert len(records) == TRIALS
            assert sum(r.result.ok for r in records) >= 1
            assert {r.result.worker.split("/")[0] for r in records} == {f"ray-{node[:8]}"}
        finally:
            for process in reversed(started):
                stop(process)
            current = "/tmp/ray/ray_current_cluster"  # our head wrote NODE_IP:PORT; a later ray.init() would follow it
            if os.path.exists(current) and open(current).read().strip().endswith(f":{ray_port}"):
                os.remove(current)
