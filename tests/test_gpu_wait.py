"""A job whose target no host of the Ray cluster serves yet waits for one, queued and saying what for, rather
than fails: on a real local cluster whose head offers no CPUs and whose one GPU node (`--num-gpus=1` on a
host where CuPy sees none, so its agent reports no GPU) serves no cuda target; a CPU node joins in one test.
Each wait has a deadline of its own step; a job's run is waited for as long as its trials go on being measured."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from db import Database
from db.outage import Backoff
from search_space import Target, matmul
from service.api import create_app
from service.runner import Runner, RunnerOptions
from tests.ray_helpers import alive_nodes, start_node, stop, two_node_cluster, wait_for
from tests.serve_helpers import job_when, served_in_thread, wait_while_progressing
from tests.test_dashboard import browser  # noqa: F401 (a fixture)
from workers.task import MeasureOptions

CUDA_JOB = {"workload": {"op": "matmul", "params": {"M": 64, "N": 64, "K": 64}}, "target": "cuda -arch=sm_90",
            "trials": 4, "tuner": "random"}
CPU_JOB = CUDA_JOB | {"target": "llvm -threads=1"}
LOOKS = Backoff(first=0.2, most=0.5)  # how often a waiting job looks for its host here
FIRST_LOOK = 120  # seconds for a runner's first look for a host: its pool starts an agent per node (60 s at most)


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster(dict(os.environ), ["--num-cpus=0"], ["--num-cpus=0", "--num-gpus=1"]) as address:
        yield address


def job_once(client, job_id: int, check, what: str) -> dict:
    """The job once `check(job)` holds, waited for while its trials go on; the first may follow an agent's start
    on a node that just joined."""
    get = lambda: client.get(f"/api/jobs/{job_id}").json()
    return wait_while_progressing(lambda: check(job := get()) and job, lambda: get()["trials_done"], what, FIRST_LOOK)


def runner(database: Database, cluster: str) -> Runner:
    return Runner(database, RunnerOptions(workers=cluster, poll_seconds=0.1, host_backoff=LOOKS,
                                          measure=MeasureOptions(repeat=2, min_repeat_ms=1.0)))


def test_a_cuda_job_waits_queued_for_a_gpu_worker_says_so_and_is_cancelled(cluster, browser,  # noqa: F811
                                                                             tmp_path, caplog):
    """The API and the dashboard say what the job waits for, through several looks for its host; the runner logs
    it once; a cancel ends the wait."""
    database = Database(f"sqlite:///{tmp_path}/wait.db")
    with served_in_thread(create_app(database, runner(database, cluster))) as url, \
            httpx.Client(base_url=url) as client, caplog.at_level(logging.WARNING, "tensortune.runner"):
        created = client.post("/api/jobs", json=CUDA_JOB)
        assert created.status_code == 201 and created.json()["waiting"] == ""
        job_id = created.json()["id"]
        job = job_when(client, job_id, lambda job: job["waiting"], "waiting", FIRST_LOOK)
        assert (job["status"], job["waiting"], job["error"]) == ("queued", "a GPU worker (sm_90)", "")
        page = browser.new_page()
        page.goto(url)
        row = page.wait_for_selector(f"#jobs tr[data-id='{job_id}'] .waiting")
        assert row.text_content() == "waiting for a GPU worker (sm_90)"
        page.wait_for_function("document.querySelector('#job-waiting').textContent.length > 0")
        assert page.text_content("#job-waiting") == "waiting for a GPU worker (sm_90)"
        time.sleep(2.0)  # several looks for a host, each finding none
        job = client.get(f"/api/jobs/{job_id}").json()
        assert (job["status"], job["waiting"], job["trials_done"]) == ("queued", "a GPU worker (sm_90)", 0)
        assert [job["waiting"] for job in client.get("/api/jobs").json()] == ["a GPU worker (sm_90)"]
        said = [record.getMessage() for record in caplog.records if "waits for" in record.getMessage()]
        assert said == [f"runner-0: job {job_id} waits for a GPU worker (sm_90) to join: no Ray worker host for "
                        "target 'cuda -arch=sm_90'; hosts: cuda (no GPU seen)"]
        cancelled = client.post(f"/api/jobs/{job_id}/cancel").json()
        assert (cancelled["status"], cancelled["waiting"]) == ("cancelled", "")


def test_a_waiting_job_survives_a_restart_and_runs_when_its_host_joins_without_holding_up_others(cluster, tmp_path):
    """One runner thread: a cuda job waits, a CPU job waits behind it (the head offers no CPU) through a service
    restart, then runs to done once a CPU node joins, while the cuda job goes on waiting."""
    database = Database(f"sqlite:///{tmp_path}/restart.db")
    with TestClient(create_app(database, runner(database, cluster))) as client:
        gpu_job = client.post("/api/jobs", json=CUDA_JOB).json()["id"]
        cpu_job = client.post("/api/jobs", json=CPU_JOB).json()["id"]
        job = job_when(client, cpu_job, lambda job: job["waiting"], "waiting", FIRST_LOOK)
        assert job["status"] == "queued" and job["waiting"].startswith("a CPU worker (")
    assert database.job(cpu_job).waiting == job["waiting"]  # the service stopped; the job waits in the database
    node = start_node(dict(os.environ), f"--address={cluster}", "--num-cpus=1")
    try:
        wait_for(lambda: alive_nodes() == 3, 60, "the CPU node")
        with TestClient(create_app(database, runner(database, cluster))) as client:
            done = job_once(client, cpu_job, lambda job: job["status"] in ("done", "failed"), "the CPU job to end")
            assert (done["status"], done["trials_done"], done["waiting"]) == ("done", 4, "")
            waiting = client.get(f"/api/jobs/{gpu_job}").json()
            assert (waiting["status"], waiting["waiting"]) == ("queued", "a GPU worker (sm_90)")
    finally:
        stop(node)


def test_a_job_whose_host_leaves_mid_run_waits_again_with_its_records(cluster, tmp_path):
    """The CPU node measuring a job is stopped: the job goes back to the queue, waiting, its records kept."""
    database = Database(f"sqlite:///{tmp_path}/leaves.db")
    node = start_node(dict(os.environ), f"--address={cluster}", "--num-cpus=1")
    try:
        wait_for(lambda: alive_nodes() == 3, 60, "the CPU node")
        with TestClient(create_app(database, runner(database, cluster))) as client:
            job_id = client.post("/api/jobs", json=CPU_JOB | {"trials": 400}).json()["id"]
            measured = job_once(client, job_id, lambda job: job["trials_done"] >= 4, "4 trials")["trials_done"]
            stop(node)
            job = job_when(client, job_id, lambda job: job["waiting"], "waiting")
            assert job["status"] == "queued" and job["waiting"].startswith("a CPU worker (") and job["error"] == ""
            assert measured <= job["trials_done"] == len(database.job_records(job_id)) < 400
            assert client.post(f"/api/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    finally:
        stop(node)


def test_tune_waits_for_a_gpu_worker_in_its_progress_display_until_ctrl_c(cluster, tmp_path):
    """`tensortune tune --target cuda --workers ADDRESS` with no GPU node: a line says what it waits for; Ctrl-C
    ends it, the job cancelled and resumable (the same command takes it up again)."""
    command = [sys.executable, "-m", "service", "tune", "matmul", "M=64", "N=64", "K=64", "--target",
               "cuda -arch=sm_90", "--trials", "4", "--tuner", "random", "--workers", cluster,
               "--db", f"{tmp_path}/cli.db"]
    tune = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(line) for line in tune.stdout], daemon=True).start()
    try:
        wait_for(lambda: any(line.startswith("tuning ") for line in lines), 120, "tune to connect and start its job")
        said = wait_for(lambda: next((line for line in lines if "waiting for" in line), None), 120, "the waiting line")
        tune.send_signal(signal.SIGINT)
        wait_for(lambda: any("run the same command again to resume" in line for line in lines), 60, "the interruption")
        tune.wait(60)  # then it disconnects from Ray
    finally:
        tune.kill()
    assert said.strip() == ("no Ray worker host for target 'cuda -arch=sm_90'; hosts: cuda (no GPU seen): waiting for "
                            "a GPU worker (sm_90) to join (Ctrl-C stops; the same command resumes)")
    assert tune.returncode == 130, "".join(lines)
    database = Database(f"sqlite:///{tmp_path}/cli.db")
    job = database.unfinished_job(matmul(64, 64, 64), Target.parse("cuda -arch=sm_90"), "random", 4)
    assert (job.id, job.status, job.waiting) == (1, "cancelled", "")
