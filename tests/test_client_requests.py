"""Fallbacks become jobs: a workload clients build without a config is reported to the service, which queues one
job for it (whoever asks, however often; at most a cap of them waiting; none when switched off), runs it, and
the clients' next fetch builds its config. Real services and databases."""
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import httpx
from db_helpers import database, db_url  # noqa: F401 (fixtures: SQLite and PostgreSQL)
from fastapi.testclient import TestClient

from db import Database, apply_history_best
from db.client_requests import ClientJobs, ClientRequests
from search_space import Target, dense, fallback_config, matmul
from service.api import create_app
from tests.serve_helpers import free_port, job_in, run_client, served_in_thread, start
from tests.test_db_history import fallback_text
from workers import build

TARGET = Target.parse("llvm -threads=1")
TOKEN = {"Authorization": "Bearer s3cret"}


def ask(client, workload, headers=TOKEN):
    return client.post("/api/requests", json={"workload": workload.key, "target": str(TARGET)}, headers=headers)


def test_a_fallback_met_by_two_clients_is_one_job_that_runs_and_the_next_client_builds_its_config(tmp_path):
    url, port, workload = f"sqlite:///{tmp_path}/requests.db", free_port(), matmul(32, 32, 32)
    env = {**os.environ, "TENSORTUNE_TOKEN": "s3cret"}
    server = start(url, port, env, options=("--client-trials", "4"))
    service = f"http://127.0.0.1:{port}"
    try:
        # at once: one after the other, the second may start after the job is done (4 trials) and build its config
        with ThreadPoolExecutor(2) as pool:
            clients = list(pool.map(lambda i: run_client(service, tmp_path / f"cache{i}.json", TARGET, [workload], env),
                                    range(2)))
        for client in clients:
            assert client["configs"] == [fallback_config(workload, TARGET).index]
            assert client["warnings"] == [fallback_text(workload, TARGET)]  # reported without a word
        with httpx.Client(base_url=service) as api:
            [job] = api.get("/api/jobs").json()
            assert (job["workload"], job["target"], job["tuner"], job["trials"]) == (workload.key, str(TARGET), "xgb", 4)
            [request] = api.get("/api/requests").json()
            assert (request["workload"], request["times_asked"], request["job_id"]) == (workload.key, 2, job["id"])
            assert job_in(api, job["id"], ("done", "failed"), 300)["status"] == "done"
        with Database(url) as database:
            best = database.best(workload, TARGET)[0].input.config.index
        tuned = run_client(service, tmp_path / "cache0.json", TARGET, [workload], env)
        assert tuned["configs"] == [best] and tuned["warnings"] == []
        assert httpx.get(f"{service}/api/requests").json()[0]["times_asked"] == 2  # tuned: not asked again
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_one_job_per_pair_whoever_asks_at_most_the_cap_waiting_and_only_with_the_token(database):
    client = TestClient(create_app(database, token="s3cret", client_jobs=ClientJobs(trials=8, cap=2)))
    first, second, third, submitted = (matmul(size, 16, 16) for size in (8, 16, 24, 32))
    assert ask(client, first, {}).status_code == 401 and ask(client, first, {"Authorization": "Bearer x"}).status_code == 401
    assert client.get("/api/requests").json() == [] and client.get("/api/jobs").json() == []

    asked = [ask(client, first).json(), ask(client, first).json(), ask(client, second).json(), ask(client, third).json()]
    assert [answer["times_asked"] for answer in asked] == [1, 2, 1, 1]
    assert asked[0]["job_id"] == asked[1]["job_id"] != asked[2]["job_id"] and asked[3]["job_id"] is None  # the cap
    jobs = client.get("/api/jobs").json()
    assert sorted(job["id"] for job in jobs) == sorted([asked[0]["job_id"], asked[2]["job_id"]])
    assert {(job["tuner"], job["trials"], job["status"]) for job in jobs} == {("xgb", 8, "queued")}

    client.post(f"/api/jobs/{asked[0]['job_id']}/cancel", headers=TOKEN)
    again = ask(client, third).json()
    assert again["times_asked"] == 2 and again["job_status"] == "queued"  # room again under the cap
    database.update_job(asked[2]["job_id"], "done")
    assert ask(client, second).json()["job_id"] == asked[2]["job_id"]  # done: tuned already, nothing queued

    body = {"workload": {"op": "matmul", "params": submitted.p}, "target": str(TARGET), "trials": 16, "tuner": "random"}
    users = client.post("/api/jobs", json=body, headers=TOKEN).json()["id"]
    assert ask(client, submitted).json()["job_id"] == users  # a user's job of the pair serves the clients too
    assert len(client.get("/api/jobs").json()) == 4
    listed = client.get("/api/requests").json()
    assert [request["workload"] for request in listed] == [submitted.key, second.key, third.key, first.key]
    assert [request["job_status"] for request in listed] == ["queued", "done", "queued", "cancelled"]


def test_switched_off_a_request_queues_and_records_nothing(database):
    client = TestClient(create_app(database, client_jobs=None))
    refused = ask(client, dense(16, 16, 16))
    assert refused.status_code == 403 and "--no-client-jobs" in refused.json()["detail"]
    assert client.get("/api/requests").json() == [] and client.get("/api/jobs").json() == []
    assert ask(client, matmul(8, 8, 8)).status_code == 403


def test_asks_at_once_queue_one_job(database):
    """Eight asks at the same moment: from two services sharing a PostgreSQL database, which take the pair's row
    in turn; from one service's threads on SQLite (one service per SQLite file)."""
    postgres = database.engine.dialect.name == "postgresql"
    together, workload = threading.Barrier(8), matmul(48, 16, 16)
    with Database(database.url) if postgres else nullcontext(database) as other:
        services = [ClientRequests(database), ClientRequests(other)]

        def asked(n: int) -> int | None:
            together.wait()
            return services[n % 2].ask(workload, TARGET, ClientJobs()).job_id

        with ThreadPoolExecutor(8) as pool:
            jobs = set(pool.map(asked, range(8)))
    [request] = services[0].requests()
    assert len(jobs) == 1 and None not in jobs and request.times_asked == 8 and request.job_id in jobs


def test_a_process_reports_a_workload_once_whatever_its_contexts(tmp_path):
    """A program that opens a context per inference asks the service once, not at each."""
    database, workload = Database(tmp_path / "once.db"), matmul(56, 16, 16)
    with served_in_thread(create_app(database)) as url:
        for _ in range(3):
            with apply_history_best(url, cache=tmp_path / "cache.json"):
                build(workload, TARGET)
    [request] = ClientRequests(database).requests()
    assert (request.workload, request.times_asked, request.job_status) == (workload, 1, "queued")
