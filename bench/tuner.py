"""`tensortune bench tuner`: the tuners compared on the replay data sets of tests/data/ (every config
of a sub-space, measured for real on this machine by `python -m bench.record_replay`), over
several seeds each: median trials to reach 95% of the best known config, best GFLOPS after 32,
64 and 128 trials, the cost model's ranking quality on held-out measurements, and a PNG plot.
"""
from __future__ import annotations

import json
import random
import statistics
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from tuner.cost_model import XGBCostModel
from tuner.plot import plot_tuners
from tuner.replay import ReplayData, knob_key, replay_curve, trials_to_reach

DATA_DIR = Path(__file__).resolve().parent.parent / "tests" / "data"
TUNERS = ("xgb", "random", "ga")
CHECKPOINTS = (32, 64, 128)


def load_data_sets() -> dict[str, ReplayData]:
    paths = sorted(DATA_DIR.glob("replay_*.jsonl.gz"))
    if not paths:
        raise FileNotFoundError(f"no replay data in {DATA_DIR}: run python -m bench.record_replay")
    return {p.name.removeprefix("replay_").removesuffix(".jsonl.gz"): ReplayData.load(p) for p in paths}


def median_trials(curves: list[list[float]], level: float) -> float:
    """Median over runs of the trials needed to reach `level`; a run that never does counts as infinite."""
    return statistics.median(trials_to_reach(c, level) or float("inf") for c in curves)


def ranks(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values)).astype(float)


def model_quality(data: ReplayData, seed: int = 0, share: float = 0.1) -> dict:
    """Train the cost model on half the recorded configs, rank the other half: Spearman's rho
    and the recall of the true top `share` in the predicted top `share`."""
    space = data.space
    configs = list(space)
    random.Random(seed).shuffle(configs)
    train, test = configs[: len(configs) // 2], configs[len(configs) // 2:]
    lookup = lambda c: data.results[knob_key(c.to_dict())].gflops
    model = XGBCostModel(data.workload, data.target, space, seed=seed)
    model.fit(train, [lookup(c) for c in train])
    predicted, actual = model.predict(test), np.array([lookup(c) for c in test])
    k = max(1, int(len(test) * share))
    top_true, top_predicted = set(np.argsort(-actual)[:k]), set(np.argsort(-predicted)[:k])
    rho = float(np.corrcoef(ranks(predicted), ranks(actual))[0, 1])
    return {"spearman": round(rho, 3), f"top{int(share * 100)}pct_recall": round(len(top_true & top_predicted) / k, 3)}


def evaluate(name: str, data: ReplayData, seeds: int, trials: int, batch: int) -> tuple[dict, dict]:
    best = data.best_gflops
    curves = {t: [replay_curve(data, t, seed, trials, batch) for seed in range(seeds)] for t in TUNERS}
    row = {"data_set": name, "workload": data.workload.key, "space": data.space.size, "best_known_gflops": round(best, 2),
           "seeds": seeds}
    for tuner, runs in curves.items():
        row[tuner] = {"median_trials_to_95pct": median_trials(runs, 0.95 * best)} | {
            f"best_after_{n}": round(statistics.median(r[min(n, len(r)) - 1] for r in runs), 2) for n in CHECKPOINTS}
    row["model"] = model_quality(data)
    return row, curves


def live(workload=None, seeds: int = 3, trials: int = 64) -> dict:
    """The same comparison live, on the local pool: xgb and random with a few seeds each, transfer
    off; the level is 95% of the best any run found."""
    from search_space import Target, dense
    from tuner.tune import tune

    workload = workload or dense(128, 3072, 768)
    curves: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for tuner in ("xgb", "random"):
            for seed in range(seeds):
                database = f"sqlite:///{folder}/{tuner}{seed}.db"
                result = tune(workload, Target.parse("llvm"), trials, tuner, database, seed=seed, transfer=False)
                curves.setdefault(tuner, []).append(result.curve)
    best = max(c[-1] for runs in curves.values() for c in runs)
    row = {"live": workload.key, "seeds": seeds, "trials": trials, "best_found_gflops": round(best, 2)} | {
        tuner: {"median_trials_to_95pct": median_trials(runs, 0.95 * best),
                "per_seed": [trials_to_reach(c, 0.95 * best) for c in runs]} for tuner, runs in curves.items()}
    print(json.dumps(row), flush=True)
    return row


def run(json_lines: bool = False, seeds: int = 9, trials: int = 160, batch: int = 4,
        plot_dir: Path = Path(".")) -> list[dict]:
    console = Console(stderr=json_lines)
    rows = []
    for name, data in load_data_sets().items():
        row, curves = evaluate(name, data, seeds, trials, batch)
        row["plot"] = str(plot_tuners(curves, f"{data.workload.key} (replay, {seeds} seeds)",
                                      plot_dir / f"tuners_{name}.png", data.best_gflops))
        rows.append(row)
        if json_lines:
            print(json.dumps(row), flush=True)
    if not json_lines:
        table = Table(title="tuners on recorded measurements: median trials to 95% of best known (best after 64)")
        for column in ("data set", "space", "best known", *TUNERS, "model ρ", "top-10% recall"):
            table.add_column(column)
        for r in rows:
            cells = [f"{r[t]['median_trials_to_95pct']} ({r[t]['best_after_64']:.0f})" for t in TUNERS]
            table.add_row(r["data_set"], str(r["space"]), f"{r['best_known_gflops']:.0f}", *cells,
                          str(r["model"]["spearman"]), str(r["model"]["top10pct_recall"]))
        console.print(table)
    return rows
