"""`tensortune predict` and `tensortune bench predict`: configs for workloads nobody tuned, from the records of
the op's other shapes (tuner/predict.py), and how close they come to tuning.

`register(app, bench_app)` adds them to the CLI apps of service/cli.py, which calls it once at its end.
"""
from __future__ import annotations

import json
from typing import List, Optional

import typer

from .cli_args import (DB_OPTION, OP_ARGUMENT, TARGET_OPTION, check_timed_here, fail, open_database, parse_target,
                       parse_workload)


def predict(op: str = OP_ARGUMENT,
            params: List[str] = typer.Argument(..., help="NAME=VALUE parameters, e.g. M=77 N=768 K=768"),
            target: str = TARGET_OPTION,
            db: Optional[str] = DB_OPTION,
            as_json: bool = typer.Option(False, "--json", help="print one JSON object")):
    """Print the config a cost model trained on the stored records of the op's other shapes ranks first for this
    workload, without measuring anything."""
    from tuner.predict import predict_config

    workload, target_ = parse_workload(op, params), parse_target(target)
    with open_database(db) as database:
        prediction = predict_config(database, workload, target_)
        where = str(database)
    if prediction is None:
        fail(f"too few records of {workload.op} on {target_} (or on any {target_.kind} target) in {where} to predict "
             f"a config for {workload.key}: tune a few shapes of it first")
    knobs = prediction.config.to_dict()
    if as_json:
        print(json.dumps({"workload": workload.key, "target": str(target_),
                          "config": {"index": prediction.config.index, "knobs": knobs},
                          "records": prediction.records, "shapes": prediction.shapes,
                          "trained_on": [str(each) for each in prediction.targets]}))
        return
    print(f"{workload.key} on {target_}")
    print(f"  predicted config {prediction.config.index}: " + ", ".join(f"{k}={v}" for k, v in knobs.items()))
    print(f"  {prediction.describe()}; not measured")


def bench_predict(db: Optional[str] = DB_OPTION,
                  target: str = TARGET_OPTION,
                  only: Optional[str] = typer.Option(None, "--only", help="the workloads whose key contains this"),
                  json_lines: bool = typer.Option(False, "--json", help="one JSON object per workload")):
    """Each tuned workload held out of its own prediction: the predicted config's speed beside the tuned best's
    and the template fallback's, timed head to head."""
    from bench.predict import run

    target_ = parse_target(target)
    check_timed_here(target_)
    run(db, str(target_), only, json_lines)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    app.command("predict")(predict)
    bench_app.command("predict")(bench_predict)
