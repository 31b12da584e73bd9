"""`tensortune bench scheduler`: the task scheduler's gradient against a round-robin split of the same budget,
each tuning a model from an empty database: the estimated model latency (Σ weight × best latency) at each
checkpoint, and the model measured with the best configs as they stood there, eager PyTorch alongside.
"""
from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tuner.allocation import STRATEGIES
from tuner.scheduler import tune_tasks

from .model import ROUNDS, measure_model


def snapshot(database: Path, copy: Path) -> None:
    """The SQLite file as it stands now (its WAL included), for measuring the model with later."""
    with sqlite3.connect(database) as source, sqlite3.connect(copy) as target:
        source.backup(target)


def tune_with_checkpoints(name: str, model, inputs, strategy: str, checkpoints: list[int], folder: Path,
                          tuner: str) -> dict:
    """Tune with `strategy` up to the last checkpoint; the estimated latency and a copy of the database at each."""
    from frontend import extract_tasks

    database, estimated = folder / f"{strategy}.db", {}

    def on_progress(progress) -> None:
        for checkpoint in checkpoints:
            if progress.trials >= checkpoint and checkpoint not in estimated:
                estimated[checkpoint] = progress.latency
                snapshot(database, folder / f"{strategy}-{checkpoint}.db")

    tune_tasks(extract_tasks(model, inputs), "llvm", checkpoints[-1], f"sqlite:///{database}", tuner,
               strategy=strategy, name=name, on_progress=on_progress)
    return estimated


def run(model_name: str, model, inputs: tuple, checkpoints: tuple[int, ...] = (100, 300),
        json_lines: bool = False, tuner: str = "xgb", rounds: int = ROUNDS) -> list[dict]:
    """Both strategies on `model` (as frontend.presets.load_model gives it), compared at each checkpoint, each
    timed beside eager in `rounds` alternating rounds."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        estimates = {s: tune_with_checkpoints(model_name, model, inputs, s, list(checkpoints), Path(folder), tuner)
                     for s in STRATEGIES}
        for strategy, estimated in estimates.items():
            for checkpoint in checkpoints:
                measured = measure_model(model_name, model, inputs, f"sqlite:///{folder}/{strategy}-{checkpoint}.db",
                                         rounds=rounds, inductor=False)
                rows.append({"model": model_name, "strategy": strategy, "trials": checkpoint,
                             "estimated_ms": round(estimated[checkpoint] * 1e3, 3), "eager_ms": measured["eager_ms"],
                             "tensortune_ms": measured["tensortune_ms"], "speedup": measured["tensortune_speedup"],
                             "samples_ms": measured["samples_ms"]})
                if json_lines:
                    print(json.dumps(rows[-1]), flush=True)
    if not json_lines:
        table = Table(title=f"{model_name}: task scheduler strategies, same budget (measured: same run as eager)")
        for column in ("strategy", "trials", "estimated ms", "eager ms", "tensortune ms", "speedup"):
            table.add_column(column)
        for r in rows:
            table.add_row(r["strategy"], str(r["trials"]), f"{r['estimated_ms']:.2f}", f"{r['eager_ms']:.2f}",
                          f"{r['tensortune_ms']:.2f}", f"{r['speedup']:.2f}x")
        Console().print(table)
    return rows
