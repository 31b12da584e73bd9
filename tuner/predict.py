"""Predicted configs: for a workload never measured on a target, the config the cost model ranks first, unmeasured.

The model is the xgb tuner's base model (tuner/cost_model.py) trained on the stored records of the op's other
shapes on this target; with none, on those of every stored target of the same kind (its loop-nest features say
what a config does, whichever CPU ran it, and the ranking objective compares configs only within one shape on one
target). Simulated annealing over the model searches the space from the configs worth trying anyway: the nearest
shapes' best ones (fitted) and the template's fallback, which stay in the running. What the model cannot tell
apart, it does not pretend to: with fewer than MIN_RECORDS records there is no prediction.

Importing it (the tuner package does) registers `stored_prediction` with db.history, so that
`apply_history_best` and the torch backend build a workload that has no record with its predicted config.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from db import Database
from db.history import StoredConfig, register_predictor
from db.matching import most_similar
from db.queries import stored_targets
from search_space import Config, Target, Workload, fallback_config, get_space

from .cost_model import CostModelOptions, XGBCostModel
from .sa import AnnealOptions, anneal
from .tune import borrowed_configs, history

MIN_RECORDS = 16  # fewer measurements of the op than this rank nothing worth trusting over the fallback
# a quicker search than the tuner's: a prediction is asked for at build time, and ranks one config, not a plan
SEARCH = AnnealOptions(chains=32, steps=40, early_stop=8)


@dataclass(frozen=True)
class Prediction:
    """The config predicted fastest, and what the model that ranked it learned from."""

    config: Config
    records: int  # measurements the model was trained on
    shapes: int  # other shapes of the op they measured
    targets: tuple[Target, ...]  # the targets they were measured on

    def describe(self) -> str:
        on = ", ".join(map(str, self.targets))
        return f"predicted by a cost model trained on {self.records} records of {self.shapes} other shapes on {on}"


def training_history(database: Database, workload: Workload, target: Target) -> tuple[list, tuple[Target, ...]]:
    """(history as tuner.tune.history gives it, the targets it comes from): this target's records of the op's
    other shapes, else every other stored target's of the same kind (the workload's own shape included)."""
    own = history(database, workload, target)
    if own:
        return own, (target,)
    with database.read_sessions() as session:
        stored = stored_targets(session, target.kind)
    found, targets = [], []
    for other in most_similar(target, stored):
        if part := history(database, workload, other, others=False):
            found += part
            targets.append(other)
    return found, tuple(targets)


def predict_config(database: Database, workload: Workload, target: Target | str, seed: int = 0) -> Prediction | None:
    """The config the op's stored records rank first for `workload` on `target`, or None with too few of them."""
    target = Target.parse(target)
    past, targets = training_history(database, workload, target)
    records = sum(len(gflops) for _, gflops in past)
    if records < MIN_RECORDS:
        return None
    space = get_space(workload, target)
    model = XGBCostModel(workload, target, space, CostModelOptions(), seed)
    model.fit_history(past)
    if not model.trained:
        return None
    known = borrowed_configs(database, workload, target, space) + [fallback_config(workload, target)]
    plan, _ = anneal(space, model.predict, 8, set(), known, random.Random(seed), SEARCH)
    candidates = list({config.index: config for config in plan + known}.values())
    best = candidates[int(np.argmax(model.predict(candidates)))]
    return Prediction(best, records, len(past), targets)


def stored_prediction(database: Database, workload: Workload, target: Target) -> StoredConfig | None:
    """`predict_config` as db.history's contexts answer: the config, for this workload, saying what predicted it."""
    prediction = predict_config(database, workload, target)
    return StoredConfig(prediction.config, workload, predicted=prediction.describe()) if prediction else None


register_predictor(stored_prediction)
