"""`tensortune tune-model` and `tensortune bench model` on a model file a user writes, and their refusals."""
import json
import subprocess
import sys

import pytest

from db import Database

CLI = [sys.executable, "-m", "service"]
MODEL_FILE = '''
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def tiny():
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(4, 16),)


def nothing():
    return torch.nn.Sequential(torch.nn.ReLU()), (torch.randn(3),)
'''


def run(*args, cwd):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**__import__("os").environ, "COLUMNS": "160"})


def test_tune_model_tunes_every_task_then_times_the_model(tmp_path):
    (tmp_path / "models.py").write_text(MODEL_FILE)
    db = f"sqlite:///{tmp_path}/model.db"
    tuned = run("tune-model", "models.py:tiny", "--trials", "12", "--tuner", "random", "--target", "llvm -threads=1",
                "--db", db, cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "12 trials over 2 tasks of models.py:tiny" in tuned.stdout
    assert "eager PyTorch" in tuned.stdout and "tensortune" in tuned.stdout and "Traceback" not in tuned.stderr
    database = Database(db)
    assert database.job(1).model == "models.py:tiny" and database.job(1).status == "done"
    jobs = database.children(1)
    assert len(jobs) == 2 and sum(len(database.job_records(job.id)) for job in jobs) == 12

    request = ("tune-model", "models.py:tiny", "--trials", "12", "--tuner", "random", "--target", "llvm -threads=1",
               "--db", db)
    shown = run(*request, cwd=tmp_path)  # as `tune` does, a finished job is shown and timed, not run again
    assert shown.returncode == 0, shown.stderr
    assert "model job 1 already tuned this" in shown.stderr and "eager PyTorch" in shown.stdout
    assert sum(len(database.job_records(job.id)) for job in jobs) == 12 and database.children(4) == []
    again = run(*request, "--again", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "12 trials over 2 tasks" in again.stdout and len(database.children(4)) == 2

    timed = run("bench", "model", "models.py:tiny", "--json", "--db", db, "--target", "llvm -threads=1", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.strip().splitlines()[-1])
    assert {"model", "threads", "eager_ms", "inductor_ms", "tensortune_ms", "max_error"} <= set(row)
    assert row["model"] == "models.py:tiny" and row["threads"] == 1 and row["max_error"] < 1e-4
    assert min(row["eager_ms"], row["inductor_ms"], row["tensortune_ms"]) > 0


def test_models_that_cannot_be_tuned_are_refused_in_one_line(tmp_path):
    (tmp_path / "models.py").write_text(MODEL_FILE)
    nothing = run("tune-model", "models.py:nothing", "--db", f"sqlite:///{tmp_path}/x.db", cwd=tmp_path)
    assert nothing.returncode == 1 and "has no dense, matmul, batch_matmul or conv2d" in nothing.stderr
    unknown = run("tune-model", "gpt-7", cwd=tmp_path)
    assert unknown.returncode == 2 and "presets are bert-layer, bert-base, resnet18" in unknown.stderr
    missing = run("bench", "model", "nowhere.py:make", cwd=tmp_path)
    assert missing.returncode == 2 and "nowhere.py: cannot get a model from make()" in missing.stderr
    for refused in (nothing, unknown, missing):
        assert "Traceback" not in refused.stderr


def test_bench_scheduler_compares_both_strategies_at_a_checkpoint(tmp_path):
    """Both strategies tune the model from scratch; each row is measured beside eager in the same run."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    compared = run("bench", "scheduler", "models.py:tiny", "--at", "8", "--tuner", "random", "--json", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    rows = [json.loads(line) for line in compared.stdout.splitlines()]
    assert [(r["strategy"], r["trials"]) for r in rows] == [("gradient", 8), ("round-robin", 8)]
    assert all(0 < r["estimated_ms"] < 1e3 and r["eager_ms"] > 0 and r["tensortune_ms"] > 0 for r in rows)
    # ms are rounded to 3 decimals, and this model runs in tens of microseconds
    assert all(r["speedup"] == pytest.approx(r["eager_ms"] / r["tensortune_ms"], rel=0.1) for r in rows)
