"""`tensortune bench predict`: how good a predicted config is on shapes the model never saw measured.

Each tuned workload of the database is held out in turn: `tuner.predict.predict_config` never trains on the records
of the workload it predicts for (on its own target), so every prediction is one for an unseen shape, from the
records of the op's other shapes. Its kernel, the tuned best's and the template fallback's are then timed head to
head, weights bound and caches warm, and the predicted and fallback speeds printed against the tuned best's.
"""
from __future__ import annotations

import json

import numpy as np
from rich.console import Console
from rich.table import Table

from db import Database
from search_space import Target, Workload
from tuner.predict import predict_config
from workers import build
from workers.reference import head_to_head, inference_call
from workers.untuned import untuned_config


def tuned_workloads(database: Database, target: Target) -> list[Workload]:
    """The workloads with an `ok` record on exactly this target, in the order first stored."""
    return [workload for workload, stored in database.pairs() if str(stored) == str(target) and database.best(workload, target)]


def compare(database: Database, workload: Workload, target: Target) -> dict | None:
    """Predicted, tuned and fallback configs of one workload timed head to head; None without a prediction."""
    prediction = predict_config(database, workload, target)
    if prediction is None:
        return None
    configs = {"tuned": database.best(workload, target)[0].input.config, "predicted": prediction.config,
               "fallback": untuned_config(workload, target)}
    inputs = workload.random_inputs()
    calls = {name: inference_call(build(workload, target, config), inputs)[0] for name, config in configs.items()}
    seconds = head_to_head(calls, target.threads, rounds=3)
    gflops = {name: workload.flops / value / 1e9 for name, value in seconds.items()}
    return {"workload": workload.key, "target": str(target), "records": prediction.records, "shapes": prediction.shapes,
            **{f"{name}_gflops": round(value, 1) for name, value in gflops.items()},
            "predicted_vs_tuned": round(gflops["predicted"] / gflops["tuned"], 3),
            "fallback_vs_tuned": round(gflops["fallback"] / gflops["tuned"], 3),
            "same_as_tuned": configs["predicted"].index == configs["tuned"].index}


def run(db: str | None, target: str, only: str | None, json_lines: bool) -> list[dict]:
    target_ = Target.parse(target)
    with Database(db) as database:
        workloads = [w for w in tuned_workloads(database, target_) if only is None or only in w.key]
        rows = [row for workload in workloads if (row := compare(database, workload, target_)) is not None]
    if json_lines:
        for row in rows:
            print(json.dumps(row))
    else:
        print_table(rows, target_, len(workloads))
    return rows


def print_table(rows: list[dict], target: Target, tuned: int) -> None:
    table = Table(title=f"predicted configs on {target}, each workload held out of its own prediction: GFLOPS "
                        "timed head to head, as a share of the tuned best's", title_justify="left")
    for column in ("workload", "records", "tuned", "predicted", "× tuned", "fallback", "× tuned "):
        table.add_column(column)
    for row in rows:
        table.add_row(Workload.from_key(row["workload"]).label, str(row["records"]), f"{row['tuned_gflops']:.1f}",
                      f"{row['predicted_gflops']:.1f}", f"{row['predicted_vs_tuned']:.2f}",
                      f"{row['fallback_gflops']:.1f}", f"{row['fallback_vs_tuned']:.2f}")
    Console().print(table)
    if rows:
        mean = lambda key: float(np.exp(np.mean(np.log([row[key] for row in rows]))))  # noqa: E731
        print(f"geometric mean over {len(rows)} workloads: predicted {mean('predicted_vs_tuned'):.2f}× the tuned best, "
              f"fallback {mean('fallback_vs_tuned'):.2f}×")
    if len(rows) < tuned:
        print(f"{tuned - len(rows)} tuned workloads had too few records of their op's other shapes to predict from")
