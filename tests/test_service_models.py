"""Model jobs in the service: submitted over HTTP (and with `tensortune submit --model`), run by a real
runner on a real local pool over their tasks, cancelled, requeued and taken over, shown by the dashboard.

The model is a tiny MLP registered as a preset for these tests only (bert-layer takes minutes), so the
service runs in-process: FastAPI's TestClient, or uvicorn on a thread where a browser must reach it."""
import sys

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn
from typer.testing import CliRunner

from db import Database
from db.queue import JobQueue
from frontend.presets import PRESETS
from service.api import create_app
from service.cli import app as cli
from service.runner import Runner, RunnerOptions, preset_tasks
from tests.db_helpers import database, db_url  # noqa: F401 (fixtures)
from tests.serve_helpers import cancel_running_and_queued, job_in, measured, served_in_thread
from tests.test_dashboard import browser  # noqa: F401 (fixture)
from workers.task import MeasureOptions

FAST = MeasureOptions(repeat=2, min_repeat_ms=1.0)
TOKEN = {"Authorization": "Bearer s3cret"}
MODEL = "tiny-mlp"
NO_TORCH = 'model jobs need PyTorch where the service runs: pip install -e ".[torch]"'


def tiny_mlp() -> tuple[nn.Module, tuple]:
    """Two dense tasks: 16→32 with relu, 32→8."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval(), (torch.randn(4, 16),)


@pytest.fixture(autouse=True)
def tiny_preset(monkeypatch):
    monkeypatch.setitem(PRESETS, MODEL, tiny_mlp)


def model_body(trials: int, name: str = MODEL) -> dict:
    return {"model": {"name": name}, "target": "llvm -threads=1", "trials": trials, "tuner": "random"}


def runner(database: Database) -> Runner:
    return Runner(database, RunnerOptions(workers="local", poll_seconds=0.1, measure=FAST))


def configs_per_task(database: Database, model_job: int) -> list[list[int]]:
    return [[r.input.config.index for r in database.job_records(task.id)] for task in database.children(model_job)]


def test_a_model_job_runs_to_done_over_its_tasks_with_its_latency_curve(database):
    with TestClient(create_app(database, runner(database), token="s3cret")) as client:
        created = client.post("/api/jobs", json=model_body(16), headers=TOKEN)
        assert created.status_code == 201
        assert (created.json()["status"], created.json()["model"], created.json()["trials"]) == ("queued", MODEL, 16)
        job = job_in(client, created.json()["id"], ("done", "failed"))
        tasks = database.children(job["id"])
        listed = client.get("/api/jobs").json()
        task_job = client.get(f"/api/jobs/{tasks[0].id}").json()
        refused = client.post(f"/api/jobs/{tasks[0].id}/cancel", headers=TOKEN)
        workers = client.get("/api/workers").json()
    assert job["status"] == "done" and job["trials_done"] == 16 and job["best_gflops"] is None
    assert [(t["job_id"], t["workload"], t["weight"]) for t in job["tasks"]] == [
        (task.id, task.workload.key, 1) for task in tasks] and len(tasks) == 2
    assert sum(t["trials_done"] for t in job["tasks"]) == sum(task.trials for task in tasks) == 16
    assert {task.status for task in tasks} == {"done"} and sum(job["outcomes"].values()) == 16
    assert len(job["latency_curve"]) == 16 and job["latency_ms"] == job["latency_curve"][-1] > 0
    assert job["latency_ms"] == pytest.approx(1e3 * sum(t["best_seconds"] for t in job["tasks"]))
    assert [(j["id"], j["model"], j["trials_done"]) for j in listed] == [(job["id"], MODEL, 16)]
    assert task_job["parent_id"] == job["id"] and task_job["trials_done"] == job["tasks"][0]["trials_done"]
    assert refused.status_code == 409 and f"task of model job {job['id']}" in refused.text
    assert workers["runners"][0]["candidates"] == 16


def test_the_queue_claims_a_model_job_never_its_tasks_jobs(database):
    workloads = [task.workload for task in preset_tasks(MODEL)]
    model_job = database.create_model_job(MODEL, workloads, "llvm -threads=1", "random", 8)
    queue = JobQueue(database)
    claim = queue.claim()
    assert claim.job_id == model_job and queue.claim() is None
    claim.release()
    assert [job.id for job in queue.jobs()] == [model_job]


def test_cancel_stops_a_running_model_job_and_its_tasks_and_a_queued_one(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/models.db")
    with TestClient(create_app(database, runner(database))) as client:
        running, queued, done = cancel_running_and_queued(client, model_body(400), model_body(8))
    assert done["status"] == "cancelled" and 4 <= done["trials_done"] < 400
    assert sum(map(len, configs_per_task(database, running))) == done["trials_done"]
    assert {task.status for task in database.children(running)} == {"cancelled"}
    assert {task.status for task in database.children(queued)} == {"cancelled"}
    assert configs_per_task(database, queued) == [[], []]


def test_a_stopped_service_requeues_its_model_job_and_a_later_one_takes_it_over(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/models.db")
    with TestClient(create_app(database, runner(database))) as client:
        job_id = client.post("/api/jobs", json=model_body(24)).json()["id"]
        measured(client, job_id, 4)
    before = sum(map(len, configs_per_task(database, job_id)))
    assert database.job(job_id).status == "queued" and 4 <= before < 24
    assert {task.status for task in database.children(job_id)} == {"queued"}
    database.update_job(job_id, "running")  # as a killed service leaves it: running, its lock gone
    with TestClient(create_app(database, runner(database))) as client:
        job = job_in(client, job_id, ("done", "failed"))
    assert job["status"] == "done" and job["trials_done"] == 24 and len(job["latency_curve"]) == 24
    for configs in configs_per_task(database, job_id):
        assert len(configs) == len(set(configs))  # resumed: nothing measured twice


@pytest.mark.parametrize("body, status, message", [
    (model_body(8, "gpt-5"), 422, "unknown model preset 'gpt-5'; presets: bert-layer, bert-base, resnet18, hf-bert-base, hf-gpt2, tiny-mlp"),
    (model_body(8) | {"workload": {"op": "matmul", "params": {"M": 8, "N": 8, "K": 8}}}, 422, "exactly one"),
    ({"target": "llvm", "trials": 8}, 422, "exactly one"),
    (model_body(8, "x" * 129), 422, "at most 128 characters"),
    (model_body(8) | {"target": "cuda"}, 422, "no CUDA GPU on this host"),
])
def test_bad_model_requests_get_precise_errors(tmp_path, body, status, message):
    client = TestClient(create_app(Database(f"sqlite:///{tmp_path}/models.db")))
    response = client.post("/api/jobs", json=body)
    assert response.status_code == status and message in response.text

def test_a_hugging_face_preset_without_transformers_is_refused_saying_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what `import transformers` meets where it is absent
    client = TestClient(create_app(Database(f"sqlite:///{tmp_path}/models.db")))
    response = client.post("/api/jobs", json=model_body(8, "hf-gpt2"))
    assert response.status_code == 422
    assert response.json()["detail"] == 'hf-gpt2 needs Hugging Face transformers: pip install -e ".[hf]"'



def test_without_pytorch_a_model_job_is_refused_and_a_queued_one_fails_with_one_line(tmp_path, monkeypatch):
    database = Database(f"sqlite:///{tmp_path}/models.db")
    workloads = [task.workload for task in preset_tasks(MODEL)]
    queued = database.create_model_job(MODEL, workloads, "llvm -threads=1", "random", 8)
    monkeypatch.setitem(sys.modules, "torch", None)  # what importlib sees where torch is not installed
    with TestClient(create_app(database, runner(database))) as client:
        refused = client.post("/api/jobs", json=model_body(8))
        job = job_in(client, queued, ("failed", "done"))
    assert (refused.status_code, refused.json()["detail"]) == (501, NO_TORCH)
    assert job["error"] == f"ModelsNeedTorch: {NO_TORCH}"
    assert {task.status for task in database.children(queued)} == {"failed"}


@pytest.mark.parametrize("words", [["matmul", "M=8", "N=8", "K=8", "--model", MODEL], []])
def test_submit_takes_a_workload_or_a_model(words):
    result = CliRunner().invoke(cli, ["submit", *words, "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "exactly one of the two" in result.output


@pytest.fixture
def served(tmp_path):
    """The service on a thread of this process (where the tiny preset exists), for a browser and the CLI."""
    database = Database(f"sqlite:///{tmp_path}/models.db")
    with served_in_thread(create_app(database, runner(database))) as url:
        yield url


def test_the_dashboard_shows_a_model_job_submitted_with_the_cli(browser, served):
    submitted = CliRunner().invoke(cli, ["submit", "--model", MODEL, "--trials", "24", "--tuner", "random",
                                         "--target", "llvm -threads=1", "--server", served])
    assert submitted.exit_code == 0, submitted.output
    job_id = int(submitted.stdout.strip())
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    page.goto(served)
    page.wait_for_function("document.querySelector('#job-status').textContent === 'done'", timeout=60_000)
    page.wait_for_function("document.querySelector('#chart').dataset.points === '24'", timeout=10_000)
    job = httpx.get(f"{served}/api/jobs/{job_id}").json()
    assert page.text_content("#job-workload").startswith(f"model {MODEL} on ")
    assert float(page.text_content("#latency-ms")) == pytest.approx(job["latency_ms"], rel=1e-2)
    assert page.locator("#tasks tbody tr").count() == 2 and page.locator("#chart canvas").count() == 1
    assert page.is_visible("#tasks") and not page.is_visible("#loop-nest") and not page.is_visible("#numpy-gflops")
    assert f"model {MODEL}" in page.text_content(f"#jobs tr[data-id='{job_id}']")
    listed = CliRunner().invoke(cli, ["jobs", "--server", served], env={"COLUMNS": "200"})
    assert f"model {MODEL}" in listed.stdout and "24/24" in listed.stdout
