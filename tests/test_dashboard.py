"""The dashboard in a real headless Chromium (Debian's package, driven by Playwright) against a real
`tensortune serve`: the chart gains points while a job runs, and the page shows what the API says."""
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.serve_helpers import free_port, start

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
    job_id = httpx.post(f"{server}/api/jobs", json=body).raise_for_status().json()["id"]
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    requested = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(server)
    page.wait_for_function("Number(document.querySelector('#chart').dataset.points) > 0", timeout=60_000)
    first = points(page)
    page.wait_for_function(f"Number(document.querySelector('#chart').dataset.points) > {first}", timeout=60_000)
    assert first < points(page) <= TRIALS  # it grew with no reload

    page.wait_for_function("document.querySelector('#job-status').textContent === 'done'", timeout=120_000)
    page.wait_for_function("document.querySelector('#numpy-gflops').textContent !== '…'", timeout=30_000)
    job = httpx.get(f"{server}/api/jobs/{job_id}").json()
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
