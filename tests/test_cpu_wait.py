"""A job for a CPU model that no worker host has (or for more threads than its cores) waits, queued and saying for
which, rather than being measured on another CPU and stored under a model it never ran on: here with the service's
local pool, whose one host is this machine (a service on a host of that model, sharing the database, may take the
job); `tune` on local workers refuses it in one line, and so it does a target asking for a vector feature this CPU
lacks, whose kernels `build` refuses to compile."""
import subprocess
import sys

import pytest

from fastapi.testclient import TestClient

from db import Database
from db.outage import Backoff
from search_space import Target, fallback_config, host_target, lower, matmul
from service.api import create_app
from service.runner import Runner, RunnerOptions
from tests.serve_helpers import job_in, job_when
from workers import CompileError, build
from workers.build import generated_assembly
from workers.task import MeasureOptions

WORKLOAD = matmul(32, 32, 32)
# a vector feature this CPU lacks (an Intel Xeon with AMX lacks none of these)
LACKED = next((f for f in ("avx512f", "avx512bf16", "amx-tile", "amx-int8") if f not in host_target().features), "")
WIDER = f"llvm -mattr={','.join(f'+{f}' for f in host_target().features + (LACKED,))} -threads=1" if LACKED else ""
JOB = {"workload": {"op": "matmul", "params": {"M": 32, "N": 32, "K": 32}}, "trials": 4, "tuner": "random"}


def test_a_job_for_a_cpu_model_or_more_cores_than_the_host_has_waits_while_one_for_this_host_runs(tmp_path):
    other_cpu = next(cpu for cpu in ("znver3", "icelake-server") if cpu != host_target().model)
    foreign = Target.parse(f"llvm -mcpu={other_cpu} -threads=1")
    wide = Target.parse(f"llvm -threads={host_target().threads + 1}")  # this CPU, more threads than it has cores
    database = Database(f"sqlite:///{tmp_path}/wait.db")
    options = RunnerOptions(workers="local", poll_seconds=0.1, host_backoff=Backoff(first=0.2, most=0.5),
                            measure=MeasureOptions(repeat=2, min_repeat_ms=1.0))
    with TestClient(create_app(database, Runner(database, options))) as client:
        waiting = client.post("/api/jobs", json=JOB | {"target": str(foreign)}).json()["id"]
        crowded = client.post("/api/jobs", json=JOB | {"target": str(wide)}).json()["id"]
        lacking = client.post("/api/jobs", json=JOB | {"target": WIDER}).json()["id"] if LACKED else None
        running = client.post("/api/jobs", json=JOB | {"target": "llvm -threads=1"}).json()["id"]
        waited = lambda job: job["waiting"] or job["status"] in ("done", "failed")
        seen = job_when(client, waiting, waited, "waiting, or ended")
        seen_crowded = job_when(client, crowded, waited, "waiting, or ended")
        if LACKED:  # this model, a vector feature it lacks: the feature is what the job waits for
            seen_lacking = job_when(client, lacking, waited, "waiting, or ended")
            assert (seen_lacking["status"], seen_lacking["waiting"]) == (
                "queued", f"a CPU worker ({host_target().model} with {LACKED})")
        done = job_in(client, running, ("done", "failed"))
        after = client.get(f"/api/jobs/{waiting}").json()
    assert (seen["status"], seen["waiting"]) == ("queued", f"a CPU worker ({other_cpu})")
    assert (seen_crowded["status"], seen_crowded["waiting"]) == ("queued",
                                                                 f"a CPU worker ({wide.model}, {wide.threads} cores)")
    assert (done["status"], done["trials_done"]) == ("done", 4)  # the waiting job holds up no other
    assert (after["status"], after["waiting"], after["trials_done"]) == ("queued", f"a CPU worker ({other_cpu})", 0)
    assert database.job_records(waiting) == database.job_records(crowded) == []
    assert database.best(WORKLOAD, foreign) == database.best(WORKLOAD, wide) == []


def test_tune_for_another_cpu_model_or_more_threads_than_cores_on_local_workers_is_one_line_and_stores_nothing(
        tmp_path):
    """A local pool would time the other model's code on this CPU and store it under that model's name, or a kernel
    for more threads than this host has cores with its threads taking turns, stored as if each had a core; a target
    of a vector feature this CPU lacks, the same."""
    host = host_target()
    other_cpu = next(cpu for cpu in ("znver3", "icelake-server") if cpu != host.model)
    more = host.threads + 1
    wider = [(WIDER, f"this host's CPU lacks {LACKED}, which the target asks for")] if LACKED else []
    for target, problem in wider + [
            (f"llvm -mcpu={other_cpu} -threads=1", f"this host's CPU is {host.model}, not {other_cpu}"),
            (f"llvm -threads={more}", f"this host has {host.threads} cores, not the {more} the target's threads need")]:
        done = subprocess.run([sys.executable, "-m", "service", "tune", "matmul", "M=8", "N=8", "K=8", "--trials", "1",
                               "--target", target, "--db", str(tmp_path / "t.db")], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr == (f"error: {problem}; a llvm target is measured on its own kind of CPU: run this on "
                               f"such a host, or with --workers pointing at a Ray cluster that has one\n")
        assert not (tmp_path / "t.db").exists()


@pytest.mark.skipif(not LACKED, reason="this CPU has every x86 vector feature a target may ask for")
def test_a_kernel_for_a_vector_feature_this_cpu_lacks_is_refused_saying_which_not_compiled():
    """Compiled, its instructions of that feature would abort the process in LLVM (a conv2d's int8 dot for a Zen 4
    on a Zen 3) or fault when called; its code is still printed for reading."""
    target = Target.parse(WIDER)
    with pytest.raises(CompileError, match=f"asks for {LACKED}, which this host's CPU lacks: its code can be printed"):
        build(WORKLOAD, target)
    assert "vfmadd" in generated_assembly(lower(WORKLOAD, target, fallback_config(WORKLOAD, target)), target)
    assert build(WORKLOAD, "llvm -threads=1")(*WORKLOAD.random_inputs()).shape == (32, 32)
