"""Who runs a job, on both backends: a claim takes the oldest job that no live process holds; a job
held by another process is neither claimed nor resumed by `tensortune tune`, and is taken over once
that process dies."""
import subprocess
import sys
import time

import pytest
from db_helpers import database, db_url, pg_schema  # noqa: F401 (fixtures)
from typer.testing import CliRunner

from db import Database
from db.queue import JobBusy, JobQueue
from search_space import Target, matmul
from service.cli import app

WORKLOAD, TARGET = matmul(32, 32, 32), Target.parse("llvm -threads=1")
HOLDER = """
import sys, time
from db import Database
from db.queue import JobQueue
from search_space import Target, matmul
claim = JobQueue(Database(sys.argv[1])).own(matmul(32, 32, 32), Target.parse("llvm -threads=1"), "random", 8)
print(claim.job_id, flush=True)
time.sleep(600)
"""


def claimed_within(queue: JobQueue, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        claim = queue.claim()
        if claim is not None:
            return claim
        time.sleep(0.1)
    return None


def test_a_job_held_by_a_live_process_is_its_own_until_the_process_dies(database, db_url):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, db_url], stdout=subprocess.PIPE, text=True)
    try:
        job_id = int(holder.stdout.readline())
        queue = JobQueue(database)
        assert database.job(job_id).status == "running"
        assert queue.claim() is None
        with pytest.raises(JobBusy, match=f"job {job_id} .* another process"):
            queue.own(WORKLOAD, TARGET, "random", 8)
        cli = CliRunner().invoke(app, ["tune", "matmul", "M=32", "N=32", "K=32", "--target", str(TARGET),
                                       "--trials", "8", "--tuner", "random", "--db", db_url])
        assert cli.exit_code == 1 and "being run by another process" in cli.output
    finally:
        holder.kill()
        holder.wait()
    claim = claimed_within(queue, 10)
    assert claim is not None and claim.job_id == job_id
    assert database.job(job_id).status == "running"
    claim.release()


def test_threads_of_one_process_never_share_a_job(database):
    first = database.create_job(WORKLOAD, TARGET, "random", 8)
    second = database.create_job(WORKLOAD, TARGET, "xgb", 8)
    one, other = JobQueue(database), JobQueue(database)
    claims = [one.claim(), other.claim()]
    assert [c.job_id for c in claims] == [first, second]
    assert one.claim() is None and other.claim() is None
    claims[0].release()  # as if its runner thread had died: the job is running, and nobody's
    again = other.claim()
    assert again.job_id == first
    again.release()
    claims[1].release()


def test_own_creates_a_held_job_then_resumes_it(database):
    queue = JobQueue(database)
    claim = queue.own(WORKLOAD, TARGET, "random", 8)
    assert database.job(claim.job_id).status == "running"
    assert queue.claim() is None
    with pytest.raises(JobBusy):
        queue.own(WORKLOAD, TARGET, "random", 8)
    claim.release()
    database.update_job(claim.job_id, "cancelled")  # Ctrl-C: the same command resumes it
    resumed = queue.own(WORKLOAD, TARGET, "random", 8)
    assert resumed.job_id == claim.job_id
    resumed.release()


def test_installations_in_other_schemas_of_one_postgresql_database_do_not_block_each_other():
    """Both have a job 1; advisory locks are per database, so their keys include the schema."""
    with pg_schema() as first_url, pg_schema() as second_url, Database(first_url) as first, \
            Database(second_url) as second:
        jobs = [db.create_job(WORKLOAD, TARGET, "random", 8) for db in (first, second)]
        assert jobs == [1, 1]
        held = JobQueue(first).claim()
        other = JobQueue(second).claim()
        assert held.job_id == 1 and other is not None and other.job_id == 1
        held.release()
        other.release()
