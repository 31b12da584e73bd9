"""The database goes away under running work (a PostgreSQL server of the test's own, stopped with
`pg_ctl stop -m fast` and started again; a connection cut; SQLite held by another writer): the work pauses
and goes on, nothing dies, and each config of a job is recorded exactly once. Waits on running work last
as long as records keep coming (tests/serve_helpers.wait_while_progressing), so a loaded machine only
slows them down; a wait for one state (the health check's answer) has a deadline of its own."""
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from db import Database
from db.outage import LockLost, unavailable
from db.queue import JobQueue
from search_space import Target, matmul
from tests.db_helpers import assert_searched_once, measurement, pg_schema
from tests.pg_server import postgres_server
from tests.serve_helpers import free_port, start, wait_for, wait_while_progressing
from tuner.tune import JobFailed, tune
from workers.pool import make_pool
from workers.task import MeasureOptions

CLI = [sys.executable, "-m", "service"]
TARGET = Target.parse("llvm -threads=1")
JOB = ["matmul", "M=32", "N=32", "K=32", "--trials", "24", "--tuner", "random", "--target", str(TARGET)]


@pytest.fixture(scope="module")
def server():
    with postgres_server() as started:
        yield started


@pytest.fixture
def url(server) -> str:
    """A fresh database on the test's server."""
    name = f"tt_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(server.url).set(database=name).render_as_string(False)


def records_while_up(database: Database, *job_ids: int) -> int:
    try:
        return sum(len(database.job_records(job_id)) for job_id in job_ids)
    except OperationalError:
        return 0


def all_done(database: Database, *job_ids: int) -> bool:
    return all(database.job(job_id).status == "done" for job_id in job_ids)


def status(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)


def assert_measured_once(database: Database, job_id: int, trials: int) -> None:
    records = database.job_records(job_id)
    assert database.job(job_id).status == "done", database.job(job_id)
    assert_searched_once(records, trials)


def restart(server, seconds: float) -> float:
    """Stop the server for `seconds` and start it again; returns when it was back (time.monotonic())."""
    server.stop()
    time.sleep(seconds)
    server.start()
    return time.monotonic()


def test_the_service_pauses_through_a_database_restart_and_finishes_its_job(server, url, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    service = start(url, port, dict(os.environ), log.open("w"))
    try:
        job_id = httpx.post(f"http://127.0.0.1:{port}/api/jobs", json={
            "workload": {"op": "matmul", "params": {"M": 32, "N": 32, "K": 32}}, "target": str(TARGET),
            "trials": 32, "tuner": "random"}).json()["id"]
        database = Database(url)
        recorded = lambda: records_while_up(database, job_id)
        wait_while_progressing(lambda: recorded() >= 8, recorded, "8 records")
        server.stop()
        down = wait_for(lambda: status(port, "/healthz").status_code == 503 and status(port, "/healthz"), 60,
                        "/healthz to answer 503")
        assert "unavailable" in down.json()["detail"]
        listed = status(port, "/api/jobs")
        assert listed.status_code == 503 and "the database is unavailable" in listed.json()["detail"]
        assert status(port, f"/api/jobs/{job_id}").status_code == 503
        time.sleep(3)
        before = records_while_up(database, job_id)  # 0: the server is down
        server.start()
        back = time.monotonic()
        wait_for(lambda: status(port, "/healthz").status_code == 200, 60, "/healthz to answer 200 again")
        paused = recorded()
        wait_for(lambda: recorded() > paused, 60, "the job to go on")
        print(f"runner resumed measuring {time.monotonic() - back:.1f} s after the database came back")
        wait_while_progressing(lambda: all_done(database, job_id), recorded, "the job to finish")
        assert before == 0 and service.poll() is None
        assert_measured_once(database, job_id, 32)
        assert status(port, "/api/workers").json()["runners"][0]["busy"] is False
        said = log.read_text()
        assert f"job {job_id} paused by the database" in said and "runner-0 waits, next try in" in said
        assert "database reachable again after" in said and "Traceback" not in said
    finally:
        os.killpg(service.pid, signal.SIGKILL)
        service.wait()


def test_two_services_restarted_under_them_never_run_a_job_twice(server, url):
    ports = [free_port(), free_port()]
    services = [start(url, port, dict(os.environ)) for port in ports]
    try:
        jobs = [httpx.post(f"http://127.0.0.1:{ports[n % 2]}/api/jobs", json={
            "workload": {"op": "matmul", "params": {"M": 24 + 8 * n, "N": 32, "K": 32}}, "target": str(TARGET),
            "trials": 24, "tuner": "random"}).json()["id"] for n in range(3)]
        database = Database(url)
        recorded = lambda: records_while_up(database, *jobs)
        wait_while_progressing(lambda: recorded() >= 8, recorded, "8 records")
        restart(server, 2)
        wait_while_progressing(lambda: all_done(database, *jobs), recorded, "every job to finish")
        for job in jobs:
            assert_measured_once(database, job, 24)
        assert all(service.poll() is None for service in services)
        assert all(status(port, "/healthz").status_code == 200 for port in ports)
    finally:
        for service in services:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait()


def test_tensortune_tune_waits_for_the_database_with_a_message(server, url, tmp_path):
    """Its output goes to files, so the test can wait on the records while the command runs."""
    Database(url).close()  # the schema, so the test can count records from the start
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        tuning = subprocess.Popen(CLI + ["tune", *JOB, "--db", url], stdout=out, stderr=err, text=True,
                                  env={**os.environ, "COLUMNS": "200"})
    database = Database(url)
    recorded = lambda: records_while_up(database, 1)
    try:
        wait_while_progressing(lambda: recorded() >= 4, recorded, "4 records")
        restart(server, 3)
        wait_while_progressing(lambda: tuning.poll() is not None, recorded, "tensortune tune to end")
    finally:
        tuning.kill()
        tuning.wait()
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert tuning.returncode == 0, err
    assert "database unavailable" in err and "Traceback" not in err
    assert "job 1: 24 trials" in out
    assert_measured_once(database, 1, 24)


def test_a_holder_whose_lock_went_with_its_connection_writes_nothing():
    """The lock's connection is cut (pg_terminate_backend) while its database stays up; another process
    claims the job; the old holder's writes, fenced by that connection, all fail, the first and the later."""
    with pg_schema() as url:
        database = Database(url)
        workload = matmul(16, 16, 16)
        job_id = database.create_job(workload, TARGET, "random", 8)
        old = JobQueue(database).claim()
        fenced = database.fenced(old)
        backend = old.connection.scalar(text("SELECT pg_backend_pid()"))
        with database.engine.connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
            admin.commit()
        new = JobQueue(Database(url)).claim()
        assert new is not None and new.job_id == job_id
        with pytest.raises(OperationalError) as cut:
            fenced.record(*measurement(workload, TARGET, 3, 1e-4), job_id)
        assert unavailable(cut.value)
        with pytest.raises(LockLost):  # SQLAlchemy would have reconnected, without the lock
            fenced.record(*measurement(workload, TARGET, 4, 1e-4), job_id)
        old.release()  # no error: the lock is already gone
        assert database.job_records(job_id) == [] and JobQueue(database).claim() is None  # still the new holder's
        new.release()
        database.close()


def test_sqlite_held_by_another_writer_is_waited_for(tmp_path):
    """Another connection holds SQLite's write lock for 3 s in the middle of a batch: the next record waits
    for it, and the job ends done."""
    path = tmp_path / "busy.db"
    database = Database(f"sqlite:///{path}")
    arrivals = []

    def hold_the_write_lock(seconds: float) -> None:
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")

        def release():
            time.sleep(seconds)
            other.execute("COMMIT")
            other.close()
        threading.Thread(target=release).start()

    def arrived(*_):
        arrivals.append(time.monotonic())
        if len(arrivals) == 2:
            hold_the_write_lock(3.0)

    with make_pool("local") as pool:
        result = tune(matmul(16, 16, 16), TARGET, 8, "random", database, pool, batch=4,
                      measure=MeasureOptions(repeat=2, min_repeat_ms=1.0), on_result=arrived)
    assert arrivals[2] - arrivals[1] >= 2.9  # the third record waited for the other writer
    assert_measured_once(database, result.job_id, 8)


class BrokenPool:
    """A pool whose measuring fails outright, as a lost cluster does."""

    def measure(self, tasks, options):
        raise RuntimeError("the cluster went away\n(and this second line is no part of the reason)")


def test_an_error_fails_the_job_with_one_line(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    with pytest.raises(JobFailed) as failed:
        tune(matmul(16, 16, 16), TARGET, 8, "random", database, BrokenPool())
    job = database.job(failed.value.job_id)
    assert job.status == "failed" and job.error == "RuntimeError: the cluster went away"
    assert str(failed.value) == f"job {job.id} failed: RuntimeError: the cluster went away"


def test_tune_refuses_a_workload_with_no_template_before_making_a_job(tmp_path):
    db = f"sqlite:///{tmp_path}/t.db"
    conv = ["conv2d", "N=1", "C=8", "H=8", "W=8", "K=8", "R=3", "S=3", "stride=1", "pad=1"]
    refused = subprocess.run(CLI + ["tune", *conv, "--target", "cuda -arch=sm_90", "--db", db],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: no schedule template for conv2d on cuda; templates exist for matmul on llvm")
    assert JobQueue(Database(db)).jobs() == []
