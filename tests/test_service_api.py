"""The REST API over a real runner and a real local pool, on SQLite and PostgreSQL."""
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from db import Database
from search_space import Target, Workload, matmul, template_version
from service.api import create_app
from service.cli import app as cli
from service.runner import Runner, RunnerOptions
from tests.db_helpers import BACKENDS, assert_searched_once, measurement, pg_schema
from tests.serve_helpers import cancel_running_and_queued, job_in, measured, served_in_thread
from workers.task import MeasureOptions

FAST = MeasureOptions(repeat=2, min_repeat_ms=1.0)
TOKEN = {"Authorization": "Bearer s3cret"}


def job_body(trials: int = 8, **params) -> dict:
    return {"workload": {"op": "matmul", "params": params or {"M": 16, "N": 16, "K": 16}},
            "target": "llvm -threads=1", "trials": trials, "tuner": "random"}


@pytest.fixture(params=BACKENDS)
def database(request, tmp_path):
    if request.param == "sqlite":
        yield Database(f"sqlite:///{tmp_path}/api.db")
        return
    with pg_schema() as url:
        database = Database(url)
        yield database
        database.close()


def runner(database: Database) -> Runner:
    return Runner(database, RunnerOptions(workers="local", poll_seconds=0.1, measure=FAST))


def test_a_job_submitted_over_http_runs_to_done_with_its_measurements(database):
    with TestClient(create_app(database, runner(database), token="s3cret")) as client:
        created = client.post("/api/jobs", json=job_body(), headers=TOKEN)
        # as it is when answered: the runner, polling every 0.1 s, may have claimed it already
        assert created.status_code == 201 and created.json()["status"] in ("queued", "running")
        job = job_in(client, created.json()["id"], ("done", "failed"))
        stored = [r.result.gflops for r in database.job_records(job["id"])]
        assert job["status"] == "done" and job["trials_done"] == 8
        assert job["curve"] == [max(stored[:n + 1]) for n in range(8)] and job["best_gflops"] == job["curve"][-1] > 0
        assert sum(job["outcomes"].values()) == 8 and job["best_config"]["knobs"]
        assert [c["gflops"] for c in job["candidates"]] == [r.result.gflops for r in database.job_records(job["id"])]
        assert "for " in job["best_program"]
        reference = client.get(f"/api/jobs/{job['id']}/reference").json()
        assert reference["numpy_gflops"] > 0 and reference["threads"] == 1 and reference["workload"] == job["workload"]
        assert len(database.job_records(job["id"])) == 8
        best = client.get("/api/best", params={"workload": job["workload"], "target": job["target"]}).json()
        assert best["gflops"] == job["best_gflops"] and best["job_id"] == job["id"]
        listed = client.get("/api/jobs").json()
        assert [(j["id"], j["trials_done"]) for j in listed] == [(job["id"], 8)]
        workers = client.get("/api/workers").json()
        assert workers["runners"][0]["candidates"] == 8 and workers["ray_nodes"] == []


def test_a_job_that_cannot_run_fails_with_a_one_line_reason_and_the_runner_goes_on(database):
    """A job the API would refuse now (no template for cuda), queued by an older version: the runner fails
    it with one line and runs the next job."""
    conv = Workload.make("conv2d", N=1, C=8, H=8, W=8, K=8, R=3, S=3, stride=1, pad=1)
    doomed = database.create_job(conv, Target.parse("cuda -arch=sm_90"), "random", 4)
    with TestClient(create_app(database, runner(database))) as client:
        fine = client.post("/api/jobs", json=job_body(trials=4)).json()["id"]
        assert job_in(client, fine, ("done", "failed"))["status"] == "done"
        failed = client.get(f"/api/jobs/{doomed}").json()
    assert failed["status"] == "failed" and failed["trials_done"] == 0
    assert failed["error"].startswith("NoTemplate: no schedule template for conv2d on cuda") and "\n" not in failed["error"]


def test_cancel_stops_a_running_job_and_a_queued_one(database):
    with TestClient(create_app(database, runner(database))) as client:
        running, queued, done = cancel_running_and_queued(client, job_body(trials=400, M=32, N=32, K=32), job_body())
        assert done["status"] == "cancelled" and 4 <= done["trials_done"] < 400
        assert done["trials_done"] == len(database.job_records(running))
        assert client.get(f"/api/jobs/{queued}").json()["trials_done"] == 0
        assert client.post("/api/jobs/999/cancel").status_code == 404


def test_a_stopped_service_requeues_its_job_and_a_later_one_resumes_it(database):
    """Shutdown mid-job hands the job back to the queue (not cancelled); the next service finishes its budget
    from its records, its search measuring no config twice."""
    with TestClient(create_app(database, runner(database))) as client:
        job_id = client.post("/api/jobs", json=job_body(trials=24)).json()["id"]
        measured(client, job_id, 4)
    before = len(database.job_records(job_id))
    assert database.job(job_id).status == "queued" and 4 <= before < 24
    with TestClient(create_app(database, runner(database))) as client:
        job = job_in(client, job_id, ("done", "failed"))
    assert job["status"] == "done"
    assert_searched_once(database.job_records(job_id), 24)


@pytest.mark.parametrize("body, message", [
    ({"workload": {"op": "conv9", "params": {"M": 1}}}, "unknown op 'conv9'"),
    ({"workload": {"op": "matmul", "params": {"M": 8, "N": 8}}}, "missing parameter(s) K"),
    ({"workload": {"op": "matmul", "params": {"M": 8, "N": -8, "K": 8}}}, "N=-8 is out of range"),
    ({"workload": {"op": "matmul", "params": {"M": 65536, "N": 65536, "K": 8}}}, "more than"),
    ({"workload": {"op": "matmul", "params": {"M": 8, "N": 8, "K": 8}}, "trials": 0}, "greater than or equal to 1"),
    ({"workload": {"op": "matmul", "params": {"M": 8, "N": 8, "K": 8}}, "trials": 10**6}, "less than or equal"),
    ({"workload": {"op": "matmul", "params": {"M": 8, "N": 8, "K": 8}}, "target": "opencl"}, "unknown target"),
    ({"workload": {"op": "matmul", "params": {"M": 8, "N": 8, "K": 8}}, "tuner": "bayes"}, "'xgb', 'random'"),
    ({"workload": {"op": "conv2d", "params": dict(N=1, C=8, H=8, W=8, K=8, R=3, S=3, stride=1, pad=1)},
      "target": "cuda -arch=sm_90"}, "no schedule template for conv2d on cuda"),
    ({"workload": {"op": "matmul", "params": {"M": 8, "N": 8, "K": 8}}, "target": "cuda"}, "no CUDA GPU on this host"),
])
def test_bad_requests_get_precise_422s(tmp_path, body, message):
    client = TestClient(create_app(Database(f"sqlite:///{tmp_path}/api.db")))
    response = client.post("/api/jobs", json=body)
    assert response.status_code == 422 and message in response.text


def test_writes_need_the_token_when_one_is_set(tmp_path):
    """Every POST the app has, with no token, a wrong one or the right one in the wrong form, is a 401 that
    changes nothing; the right token cancels."""
    service = create_app(Database(f"sqlite:///{tmp_path}/api.db"), token="s3cret")
    client = TestClient(service)
    job = client.post("/api/jobs", json=job_body(), headers=TOKEN).json()["id"]
    posts = [route for route in service.routes if "POST" in getattr(route, "methods", ())]
    assert {route.path for route in posts} >= {"/api/jobs", "/api/jobs/{job_id}/cancel"}
    refused = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret2"},
               {"Authorization": "Bearer s3cre"}, {"Authorization": "s3cret"}, {"Authorization": "Basic s3cret"}]
    for route in posts:
        path = route.path.format(**{name: job for name in route.param_convertors})
        for headers in refused:
            assert client.post(path, json=job_body(), headers=headers).status_code == 401, (path, headers)
    assert [(j["id"], j["status"]) for j in client.get("/api/jobs").json()] == [(job, "queued")]  # reads stay open
    assert client.post(f"/api/jobs/{job}/cancel", headers=TOKEN).json()["status"] == "cancelled"
    assert client.get(f"/api/jobs/{job}").json()["status"] == "cancelled"


def test_the_cli_says_why_a_cancel_is_refused_in_one_line(tmp_path):
    """The server's reason as the CLI's other errors give theirs, not an HTTP status code."""
    database = Database(f"sqlite:///{tmp_path}/api.db")
    done = database.create_job(matmul(16, 16, 16), "llvm -threads=1", "random", 8)
    database.update_job(done, "done")
    with served_in_thread(create_app(database)) as url:
        unknown = CliRunner().invoke(cli, ["cancel", "999", "--server", url])
        finished = CliRunner().invoke(cli, ["cancel", str(done), "--server", url])
    assert (unknown.exit_code, unknown.output) == (1, "error: no job 999\n")
    assert (finished.exit_code, finished.output) == (1, f"error: job {done} is already done\n")


def test_unknown_ids_and_missing_best_are_404(tmp_path):
    client = TestClient(create_app(Database(f"sqlite:///{tmp_path}/api.db")))
    assert client.get("/api/jobs/12").status_code == 404
    assert client.get("/api/best", params={"workload": "matmul(M=8,N=8,K=8,dtype=float32)"}).status_code == 404
    assert client.get("/api/best", params={"workload": "nonsense"}).status_code == 422
    assert client.get("/healthz").json()["status"] == "ok"
    assert [op["op"] for op in client.get("/api/workloads").json()["ops"]] == ["matmul", "dense", "batch_matmul", "conv2d"]


def test_a_job_shows_its_best_config_at_its_typical_time_as_the_stored_best_does(database):
    """Config 5 came out fastest once, by luck, and slower both times it was measured again: the job's detail, its
    row in the list and /api/best all take config 7, and its curve falls back at the trial that showed it."""
    workload, target = matmul(16, 16, 16), Target.parse("llvm -threads=1")
    job = database.create_job(workload, target, "random", 4, "done")
    for index, median in ((5, 1e-6), (7, 2e-6), (5, 3e-6), (5, 2.5e-6)):
        database.record(*measurement(workload, target, index, median), job_id=job)
    with TestClient(create_app(database)) as client:
        detail = client.get(f"/api/jobs/{job}").json()
        (listed,) = client.get("/api/jobs").json()
        best = client.get("/api/best", params={"workload": workload.key, "target": str(target)}).json()
    gflops = [workload.flops / median / 1e9 for median in (1e-6, 1e-6, 2e-6, 2e-6)]
    assert detail["curve"] == pytest.approx(gflops) and detail["best_config"]["index"] == 7
    assert detail["best_gflops"] == listed["best_gflops"] == best["gflops"] == pytest.approx(gflops[-1])


def test_a_job_whose_best_record_is_of_another_template_version_shows_its_config_but_no_program(tmp_path):
    """After a template's version changes, an old job's best config may no longer lower: the job detail still
    answers, with the config as measured and no program."""
    database = Database(f"sqlite:///{tmp_path}/api.db")
    workload, target = matmul(16, 16, 16), Target.parse("llvm -threads=1")
    job = database.create_job(workload, target, "random", 2, "done")
    stale = template_version(workload, target) - 1
    database.record_many([(*measurement(workload, target, 5, 1e-6), stale),
                          (*measurement(workload, target, 7, 2e-6), None)], job_id=job)  # unversioned: fits today
    with TestClient(create_app(database)) as client:
        detail = client.get(f"/api/jobs/{job}").json()
    assert detail["best_config"]["index"] == 5 and detail["best_program"] is None
    database.record(*measurement(workload, target, 9, 1e-7), job_id=job)  # today's, and faster
    with TestClient(create_app(database)) as client:
        detail = client.get(f"/api/jobs/{job}").json()
    assert detail["best_config"]["index"] == 9 and "range(" in detail["best_program"]
