"""`tensortune bench transfer`: does a model of other shapes help? Two other dense shapes are tuned
for real into a fresh database, then xgb tunes the third (on its replay data set) with and
without a base model trained on them; printed: median trials to reach 95% of the best known."""
from __future__ import annotations

import json
import tempfile

from db import Database
from search_space import dense
from tuner.replay import replay_curve
from tuner.tune import history, tune

from .tuner import load_data_sets, median_trials

OTHER_SHAPES = (dense(128, 768, 768), dense(128, 768, 3072))
DATA_SET = "dense128x3072x768"


def run(trials: int = 64, seeds: int = 9, budget: int = 120) -> dict:
    data = load_data_sets()[DATA_SET]
    with tempfile.TemporaryDirectory() as folder:
        database = Database(f"sqlite:///{folder}/history.db")
        for shape in OTHER_SHAPES:
            tune(shape, data.target, trials, "random", database)
        past = history(database, data.workload, data.target)
    level = 0.95 * data.best_gflops
    curves = {name: [replay_curve(data, "xgb", seed, budget, past=p) for seed in range(seeds)]
              for name, p in (("without_history", ()), ("with_history", past))}
    row = {"workload": data.workload.key, "history": [w.key for w in OTHER_SHAPES], "history_trials": trials,
           "seeds": seeds} | {f"{name}_median_trials_to_95pct": median_trials(c, level) for name, c in curves.items()}
    print(json.dumps(row))
    return row
