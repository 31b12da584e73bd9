"""Predicted configs: for a workload never measured on a target, the config the cost model ranks first, unmeasured.

The model is the xgb tuner's base model (tuner/cost_model.py) trained on the stored records of the op's other
shapes on this target; with none, on those of every stored target of the same kind (its loop-nest features say
what a config does, whichever CPU ran it, and the ranking objective compares configs only within one shape on one
target). It ranks the configs that measurements vouch for: the best config of each nearest shape on those targets
(and of the workload itself on other targets), fitted into this workload's space, and the template's fallback.
Not the whole space: annealing over a model of other shapes finds the configs it overrates (`bench predict` on
BERT's and ResNet-18's layers, each held out, Zen 4: 0.86x the tuned best's speed searching the space, 0.99x
ranking these; the fallback 0.96x). With fewer than MIN_RECORDS records, or nothing to rank but the fallback,
there is no prediction.

Importing it (the tuner package does) registers `stored_prediction` with db.history, so that
`apply_history_best` and the torch backend build a workload that has no record with its predicted config.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from db import Database
from db.history import StoredConfig, register_predictor
from db.matching import most_similar, size_distance
from db.queries import stored_targets, stored_workloads
from search_space import Config, Target, Workload, fallback_config, get_space

from .cost_model import CostModelOptions, XGBCostModel
from .tune import BORROWED, fitted_bests, history

MIN_RECORDS = 16  # fewer measurements of the op than this rank nothing worth trusting over the fallback
REUSE_SECONDS = 300.0
_ANSWERED: dict[tuple[str, str, str], tuple[float, StoredConfig | None]] = {}  # (db, workload, target) → (when, answer)


@dataclass(frozen=True)
class Prediction:
    """The config predicted fastest, and what the model that ranked it learned from."""

    config: Config
    records: int  # measurements the model was trained on
    shapes: int  # other shapes of the op they measured
    targets: tuple[Target, ...]  # the targets they were measured on
    ranked: int  # the measured configs (and the fallback) it was chosen from

    def describe(self) -> str:
        on = ", ".join(map(str, self.targets))
        return (f"predicted by a cost model trained on {self.records} records of {self.shapes} other shapes on {on}, "
                f"the first of {self.ranked} configs measured on them or the fallback")


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


def vouched_configs(database: Database, workload: Workload, target: Target, trained_on: tuple[Target, ...]
                    ) -> list[Config]:
    """The measured best configs of the op's shapes nearest the workload on the targets `trained_on` (its own among
    them, and those of other options: a config of dense with bias fits dense without), fitted into its space on
    `target`, then the template's fallback; each once."""
    shapes = []
    for other in trained_on:
        with database.read_sessions() as session:
            stored = stored_workloads(session, workload.op, other)
        nearest = sorted(stored, key=lambda shape: size_distance(workload, shape))[:BORROWED]
        shapes += [(shape, other) for shape in nearest]
    found = fitted_bests(database, workload, get_space(workload, target), target, shapes)
    fallback = fallback_config(workload, target)
    return found + ([fallback] if fallback.index not in {config.index for config in found} else [])


def predict_config(database: Database, workload: Workload, target: Target | str, seed: int = 0) -> Prediction | None:
    """The config a model of the op's stored records ranks first among `vouched_configs` for `workload` on
    `target`; None with too few records, or none but the fallback to rank."""
    target = Target.parse(target)
    past, targets = training_history(database, workload, target)
    records = sum(len(gflops) for _, gflops in past)
    if records < MIN_RECORDS:
        return None
    space = get_space(workload, target)
    model = XGBCostModel(workload, target, space, CostModelOptions(), seed)
    model.fit_history(past)
    candidates = vouched_configs(database, workload, target, targets)
    if not model.trained or len(candidates) < 2:
        return None
    best = candidates[int(np.argmax(model.predict(candidates)))]
    return Prediction(best, records, len(past), targets, len(candidates))


def stored_prediction(database: Database, workload: Workload, target: Target) -> StoredConfig | None:
    """`predict_config` as db.history's contexts answer: the config, for this workload, saying what predicted it.
    An answer is reused for REUSE_SECONDS: the service asks for every fetch of a workload nobody tuned yet, and each
    answer trains a model (about a second) on records that change slowly."""
    key = (str(database.url), workload.key, str(target))
    answered = _ANSWERED.get(key)
    if answered is not None and time.monotonic() - answered[0] < REUSE_SECONDS:
        return answered[1]
    prediction = predict_config(database, workload, target)
    found = StoredConfig(prediction.config, workload, predicted=prediction.describe()) if prediction else None
    _ANSWERED[key] = (time.monotonic(), found)
    return found


register_predictor(stored_prediction)
