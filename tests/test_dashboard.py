"""The dashboard in a real headless Chromium (Debian's package, driven by Playwright) against a real
`tensortune serve`: the chart gains points while a job runs, and the page shows what the API says."""
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from db import Database
from db.client_requests import ClientJobs, ClientRequests
from search_space import Target, batch_matmul, conv2d, dense, matmul
from service.api import create_app
from tests.db_helpers import measurement
from tests.serve_helpers import free_port, served_in_thread, start

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TRIALS = 24


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing (apt-get install -y chromium; .ci/run does it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def server(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORTUNE_TOKEN", "RAY_ADDRESS")}
    process = start(f"sqlite:///{tmp_path}/dashboard.db", port, env)
    yield f"http://127.0.0.1:{port}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def points(page) -> int:
    return int(page.get_attribute("#chart", "data-points"))


def test_the_dashboard_charts_a_running_job_live_and_shows_its_result(browser, server, tmp_path):
    body = {"workload": {"op": "matmul", "params": {"M": 48, "N": 48, "K": 48}}, "target": "llvm -threads=1",
            "trials": TRIALS, "tuner": "random"}
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(server)  # before the job: on a busy host a job submitted first could finish before the page's first look
    # every count of points the chart shows, as the page sets it (a look from here could miss one on a busy host)
    page.evaluate("""() => { const chart = document.querySelector('#chart'); window.shown = [];
        new MutationObserver(() => window.shown.push(Number(chart.dataset.points)))
            .observe(chart, {attributes: true, attributeFilter: ['data-points']}); }""")
    job_id = httpx.post(f"{server}/api/jobs", json=body).raise_for_status().json()["id"]
    page.wait_for_function("document.querySelector('#job-status').textContent === 'done'", timeout=120_000)
    shown = page.evaluate("window.shown")
    job = httpx.get(f"{server}/api/jobs/{job_id}").json()
    # it grew with no reload: the chart showed the job part-way, then whole
    assert any(0 < count < TRIALS for count in shown) and shown[-1] == TRIALS, \
        (shown, job["status"], job["trials_done"])
    page.wait_for_function("document.querySelector('#numpy-gflops').textContent !== '…'", timeout=30_000)
    assert points(page) == TRIALS and job["trials_done"] == TRIALS
    assert page.text_content("#job-id") == str(job_id)
    assert page.text_content("#best-gflops") == f"{job['best_gflops']:.1f}" and job["best_gflops"] > 0
    assert float(page.text_content("#numpy-gflops")) > 0
    assert "for " in page.text_content("#loop-nest") and page.text_content("#loop-nest") == job["best_program"]
    assert re.search(r"ok: \d+", page.text_content("#outcomes"))
    assert page.locator("#chart canvas").count() == 1
    assert f"{TRIALS}/{TRIALS}" in page.text_content(f"#jobs tr[data-id='{job_id}']")
    assert all(url.startswith(server) for url in requested)  # works offline: no CDN, nothing external
    runner = page.locator("#workers tbody tr").first.text_content()
    assert "idle" in runner and runner.endswith(str(TRIALS))

    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000


def test_the_jobs_table_shows_whole_labels_and_reasons_with_the_keys_in_titles(browser, tmp_path):
    database = Database(tmp_path / "jobs.db")
    workload = conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, bias=True, residual=True, epilogue="relu")
    target = Target.parse("llvm -mcpu=rocketlake -threads=2")
    job = database.create_job(workload, target, "xgb", 64)
    reason = ("RuntimeError: a deliberately long reason that a table would cut mid-word if it could " * 2).strip()
    database.update_job(job, "failed", reason)
    with served_in_thread(create_app(database)) as url:
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        page.goto(url)
        page.wait_for_selector(f"#jobs tr[data-id='{job}']")
        row = page.text_content(f"#jobs tr[data-id='{job}']")
        titles = page.eval_on_selector_all(f"#jobs tr[data-id='{job}'] td", "cells => cells.map(c => c.title)")
    assert workload.label in row and target.label in row and reason in row
    assert workload.key in titles and str(target) in titles


def test_the_dashboard_opens_on_the_running_job_not_the_newest(browser, tmp_path):
    """The newest job is often one queued behind the running one; the states are set in the database, and
    no runner changes them while the page loads."""
    database = Database(tmp_path / "jobs.db")
    target = Target.parse("llvm -threads=1")
    workloads = [matmul(size, size, size) for size in (16, 32, 48)]
    finished, running, queued = (database.create_job(workload, target, "random", 8) for workload in workloads)
    database.update_job(finished, "done")
    database.update_job(running, "running")
    with served_in_thread(create_app(database)) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(url)
        page.wait_for_function("document.querySelector('#job-id').textContent !== ''", timeout=30_000)
        assert page.locator("#jobs tbody tr").count() == 3
        assert page.text_content("#job-id") == str(running) and page.text_content("#job-status") == "running"
        assert page.text_content("#job-workload").startswith(workloads[1].key)
        assert page.get_attribute(f"#jobs tr[data-id='{running}']", "class") == "selected"


def test_a_model_jobs_chart_counts_trials_in_whole_numbers(browser, tmp_path, monkeypatch):
    """Three trials across a wide chart: uPlot's own ticks would fall every 0.1 or 0.5 of a trial."""
    from frontend.presets import PRESETS
    from service.runner import preset_tasks
    from tests.test_service_models import MODEL, tiny_mlp

    monkeypatch.setitem(PRESETS, MODEL, tiny_mlp)
    database = Database(tmp_path / "models.db")
    target = Target.parse("llvm -threads=1")
    job = database.create_model_job(MODEL, [task.workload for task in preset_tasks(MODEL)], target, "random", 3)
    first, second = database.children(job)
    for index, task in enumerate((first, second, first)):
        database.record(*measurement(task.workload, target, index, 1e-5), job_id=task.id)
    with served_in_thread(create_app(database)) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(url)
        page.wait_for_function("document.querySelector('#chart').dataset.points === '3'", timeout=30_000)
        ticks = page.evaluate("chart.axes[0]._values")  # the x axis's labels as uPlot drew them
    assert ticks and all(re.fullmatch(r"\d+", tick) for tick in ticks), ticks
    assert {"1", "2", "3"} <= set(ticks), ticks


def test_the_dashboard_lists_what_clients_asked_for_with_its_job(browser, tmp_path):
    """Two clients reported one workload: one row, asked twice, with the job queued for it."""
    database = Database(tmp_path / "requests.db")
    workload, target = matmul(40, 40, 40), Target.parse("llvm -threads=1")
    requests = ClientRequests(database)
    requests.ask(workload, target, ClientJobs())
    job = requests.ask(workload, target, ClientJobs()).job_id
    with served_in_thread(create_app(database)) as url:
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(url)
        page.wait_for_selector("#requests tbody tr")
        cells = page.eval_on_selector_all("#requests tbody tr td", "cells => cells.map(c => c.textContent)")
        titles = page.eval_on_selector_all("#requests tbody tr td", "cells => cells.map(c => c.title)")
        rows = page.locator("#requests tbody tr").count()
    assert rows == 1 and job is not None
    assert [cells[0], cells[1], cells[2], cells[4], cells[5]] == [workload.label, target.label, "2", str(job), "queued"]
    assert titles[:2] == [workload.key, str(target)]


def test_a_job_on_a_host_target_fits_the_page_its_heading_broken_after_commas(browser, tmp_path):
    """A host's target (its features after -mattr, one token) and attention's strided keys: the heading and the
    tasks table stay inside the page at a laptop's width, the target read whole in the heading."""
    database = Database(tmp_path / "jobs.db")
    target = Target.parse("llvm -mcpu=znver4 -mattr=" + ",".join(f"+{name}" for name in (
        "avx", "avx2", "avx512bf16", "avx512bw", "avx512dq", "avx512f", "avx512vl", "avx512vnni", "fma")) + " -threads=2")
    tasks = [batch_matmul(12, 128, 128, 64, a_strides="64:2304:1", b_strides="64:1:2304"),
             dense(128, 3072, 768, bias=True, epilogue="gelu_erf")]
    job = database.create_model_job("bert-layer", tasks, target, "xgb", 60)
    with served_in_thread(create_app(database)) as url:
        page = browser.new_page(viewport={"width": 900, "height": 1000})
        page.goto(url)
        page.wait_for_function(f"document.querySelector('#job-id').textContent === '{job}'", timeout=30_000)
        page.wait_for_selector("#tasks tbody tr")
        heading = page.text_content("#job h2")
        overflows = page.evaluate("""['#job h2', '#job'].map(s => document.querySelector(s))
                                     .map(e => e.scrollWidth - e.clientWidth)""")
    assert str(target) in heading
    assert overflows == [0, 0], overflows
