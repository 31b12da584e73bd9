"""`tensortune serve` killed mid-job and started again, on SQLite and PostgreSQL: the job completes its
budget, nothing twice, nothing lost. Submitted, listed and cancelled with the CLI against the real server."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from db import Database
from db_helpers import assert_searched_once, db_url  # noqa: F401 (fixture)
from tests.serve_helpers import SERVE, free_port, start, wait_for

CLI = [sys.executable, "-m", "service"]


def test_a_killed_service_resumes_its_job_without_repeating_or_losing_a_measurement(db_url):
    url, port = db_url, free_port()
    env = {**os.environ, "TENSORTUNE_SERVER": f"http://127.0.0.1:{port}", "TENSORTUNE_TOKEN": "s3cret"}
    server = start(url, port, env)
    try:
        submitted = subprocess.run(CLI + ["submit", "matmul", "M=48", "N=48", "K=48", "--trials", "30", "--tuner",
                                          "random", "--target", "llvm -threads=1"], env=env, capture_output=True,
                                   text=True, check=True)
        job_id = int(submitted.stdout.strip())
        database = Database(url)
        wait_for(lambda: len(database.job_records(job_id)) >= 6, 60, "6 records")
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        before = len(database.job_records(job_id))
        assert 6 <= before < 30 and database.job(job_id).status == "running"
        server = start(url, port, env)
        wait_for(lambda: database.job(job_id).status in ("done", "failed"), 90, "the job to end")
        assert database.job(job_id).status == "done"
        assert_searched_once(database.job_records(job_id), 30)
        # a kernel job's service never imports PyTorch (its import held the job 4-6 s on a Zen 3)
        assert "libtorch" not in Path(f"/proc/{server.pid}/maps").read_text()
        listed = subprocess.run(CLI + ["jobs"], env={**env, "COLUMNS": "200"}, capture_output=True, text=True,
                                check=True).stdout
        assert "30/30" in listed and "done" in listed
        refused = subprocess.run(CLI + ["cancel", str(job_id)], env=env, capture_output=True, text=True)
        assert refused.returncode == 1 and "already done" in refused.stderr
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_serve_refuses_a_public_address_without_a_token(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k != "TENSORTUNE_TOKEN"}, "COLUMNS": "200"}
    refused = subprocess.run(SERVE + ["--host", "0.0.0.0", "--db", f"sqlite:///{tmp_path}/x.db"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "without TENSORTUNE_TOKEN" in refused.stderr
