"""Start a real `tensortune serve` on a free loopback port, for the tests that drive it over HTTP; run a client of
it in a process of its own."""
import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpx

SERVE = [sys.executable, "-m", "service", "serve", "--workers", "local"]
# A client with only the service's URL: builds each workload under apply_history_best(URL), and says which config
# each kernel runs, what was warned, and how many SQL connections it opened.
CLIENT = """
import json, sys, warnings
from sqlalchemy import event
from sqlalchemy.pool import Pool
from db import apply_history_best
from search_space import Workload
from workers import build

connections = []
event.listen(Pool, "connect", lambda *_: connections.append(1))
url, cache, target, *keys = sys.argv[1:]
with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter("always")
    with apply_history_best(url, cache=cache):
        configs = [build(Workload.from_key(key), target).config.index for key in keys]
print(json.dumps({"configs": configs, "warnings": [str(w.message) for w in warned], "connections": len(connections)}))
"""


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


def wait_while_progressing(check, progress, what: str, stall: float = 60.0):
    """`check()`'s first true value, asked every 0.1 s for as long as `progress()` (e.g. a count of records) has
    changed in the last `stall` seconds: work that goes on slowly on a loaded machine is waited for, and
    work that stopped fails the test `stall` seconds after its last step."""
    last, moved = progress(), time.monotonic()
    while not (value := check()):
        now = progress()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError(f"no progress for {stall} s (still at {last}) waiting for {what}")
        time.sleep(0.1)
    return value


def job_when(client, job_id: int, check, what: str, seconds: float = 60) -> dict:
    """The job as `GET /api/jobs/{id}` shows it, once `check(job)` holds; `client` is a TestClient or httpx.Client."""
    return wait_for(lambda: check(job := client.get(f"/api/jobs/{job_id}").json()) and job, seconds,
                    f"job {job_id} to be {what}")


def job_in(client, job_id: int, statuses: tuple, seconds: float = 60) -> dict:
    return job_when(client, job_id, lambda job: job["status"] in statuses, " or ".join(statuses), seconds)


def measured(client, job_id: int, trials: int) -> dict:
    return job_when(client, job_id, lambda job: job["trials_done"] >= trials, f"past {trials} trials")


def cancel_running_and_queued(client, running_body: dict, queued_body: dict) -> tuple[int, int, dict]:
    """Submit a long job and a queued one, cancel both once the first has measured a batch, and wait for its
    batch in flight: (the running job's id, the queued one's, the running job as it ended)."""
    running = client.post("/api/jobs", json=running_body).json()["id"]
    queued = client.post("/api/jobs", json=queued_body).json()["id"]
    measured(client, running, 4)
    assert client.post(f"/api/jobs/{queued}/cancel").json()["status"] == "cancelled"
    assert client.post(f"/api/jobs/{running}/cancel").json()["status"] == "cancelled"
    runners_idle(client)  # the batch in flight finishes; the runner takes nothing after it
    return running, queued, client.get(f"/api/jobs/{running}").json()


def runners_idle(client, seconds: float = 60) -> None:
    """Wait until no runner thread holds a job: a cancelled job's batch in flight is finished and recorded."""
    wait_for(lambda: not any(r["busy"] for r in client.get("/api/workers").json()["runners"]), seconds,
             "the runners to be idle")


def start(url: str, port: int, env: dict, log=subprocess.DEVNULL, options: tuple = ()) -> subprocess.Popen:
    """The server in its own session (kill it with os.killpg), once /healthz answers; its output to `log`;
    `options`: more of serve's."""
    server = subprocess.Popen(SERVE + ["--db", url, "--port", str(port), *options], env=env, start_new_session=True,
                              stdout=log, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz").raise_for_status()
            return server
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("tensortune serve did not come up")


@contextmanager
def served_in_thread(app) -> Iterator[str]:
    """`app` under uvicorn on a thread of this process (which sees the test's registrations and database),
    for a browser or the CLI; yields its URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "uvicorn to start")
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(30)


def run_client(url: str, cache, target, workloads: list, env: dict | None = None) -> dict:
    """CLIENT in a fresh process: {"configs": [index per workload], "warnings": [...], "connections": n}."""
    done = subprocess.run([sys.executable, "-c", CLIENT, url, str(cache), str(target), *(w.key for w in workloads)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
