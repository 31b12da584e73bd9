"""The docker-compose topology without containers: PostgreSQL on 127.0.0.1, a Ray head and a worker
node started with `ray start`, and `tensortune serve` pointed at both. A job submitted over HTTP must
land its measurements in PostgreSQL, made on the worker node: the head offers no CPU (as in the
compose file's `ray-head`, which only drives), so every candidate has to travel there.

The Ray token is passed through the environment, as docker-compose.yml does, so the test also checks
that nodes and the service agree on it without ~/.ray/auth_token."""
import json
import os
import secrets
import subprocess
import sys

import httpx

from db import Database
from db_helpers import pg_schema
from ray_helpers import forget_cluster, free_port, start_head, start_node, stop, wait_for

TRIALS = 8


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
        started = [start_head(env, ray_port, "--num-cpus=0")]
        try:
            started.append(start_node(env, f"--address={address}", "--num-cpus=1", '--resources={"worker_cpu": 1}'))
            node = wait_for(lambda: worker_node_id(address, env), 60, "the worker node")
            started.append(subprocess.Popen([sys.executable, "-m", "service", "serve", "--db", url, "--port",
                                             str(http_port), "--workers", address], env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True))
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
            assert [r.result.error for r in records if not r.result.ok] == []  # every candidate measured
            assert {r.result.worker.split("/")[0] for r in records} == {f"ray-{node[:8]}"}
        finally:
            for process in reversed(started):
                stop(process)
            forget_cluster(ray_port)
