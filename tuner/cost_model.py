"""The XGBoost cost model: ranks configs of a workload by predicted throughput.

Trained on (features, GFLOPS / best GFLOPS so far), failures labelled 0, with a pairwise
ranking objective: the search needs the order of candidates, not their speed. XGBoost's own
early stopping on NDCG@k keeps each refit cheap. A model trained on other shapes of the same
op (transfer learning) serves as the base margin the per-workload model corrects.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from search_space import Config, ConfigSpace, Target, Workload, get_space, lower
from search_space.features import FEATURE_KINDS, itervar_features, knob_features

ITERVAR_CACHE = 1 << 14  # programs' features kept, 1.2 KB each


@dataclass(frozen=True)
class CostModelOptions:
    # itervar: features of the lowered loop nest (comparable across shapes, so transfer works);
    # knob: the knob values (cheaper, but tied to one space). itervar is the default for transfer.
    feature: str = "itervar"
    max_rounds: int = 300
    early_stopping: int = 25
    max_depth: int = 6
    eta: float = 0.3
    ndcg_at: int = 32

    def __post_init__(self):
        if self.feature not in FEATURE_KINDS:
            raise ValueError(f"unknown feature kind {self.feature!r}; kinds: {', '.join(FEATURE_KINDS)}")


def features(workload: Workload, target: Target, space: ConfigSpace, config: Config, kind: str) -> np.ndarray:
    if kind == "knob":
        return knob_features(space, config)
    return _itervar(workload, target, config.values)  # by value: `space` may be a restriction, with indices of its own


@lru_cache(maxsize=ITERVAR_CACHE)
def _itervar(workload: Workload, target: Target, values: tuple) -> np.ndarray:
    """Read-only, shared by every model of the process: tuners of one workload (the seeds of `bench tuner`, a job
    resumed), and a model's tasks, each of which features the others' records as its transfer history."""
    program = lower(workload, target, get_space(workload, target).config(dict(values)))
    x = itervar_features(program, workload.flops, target.threads)
    x.flags.writeable = False
    return x


class XGBCostModel:
    def __init__(self, workload: Workload, target: Target, space: ConfigSpace,
                 options: CostModelOptions = CostModelOptions(), seed: int = 0):
        self.workload, self.target, self.space, self.options, self.seed = workload, target, space, options, seed
        self.booster = None
        self.base = None  # trained on other workloads (transfer)

    def matrix(self, configs: Sequence[Config]) -> np.ndarray:
        return np.stack([features(self.workload, self.target, self.space, c, self.options.feature) for c in configs])

    def _params(self) -> dict:
        # one thread: on a small, busy machine OpenMP threads of XGBoost fight the builds and
        # each other (measured: 0.17 s vs 7.9 s per fit of 256 rows on 2 loaded cores)
        return {"objective": "rank:pairwise", "eval_metric": f"ndcg@{self.options.ndcg_at}", "ndcg_exp_gain": False,
                "max_depth": self.options.max_depth, "eta": self.options.eta, "nthread": 1, "seed": self.seed,
                "verbosity": 0, "tree_method": "hist", "max_bin": 64}

    def _train(self, x: np.ndarray, labels: np.ndarray, groups: list[int], base_margin=None):
        import xgboost as xgb

        data = xgb.DMatrix(x, label=labels)
        data.set_group(groups)
        if base_margin is not None:
            data.set_base_margin(base_margin)
        return xgb.train(self._params(), data, num_boost_round=self.options.max_rounds, evals=[(data, "train")],
                         early_stopping_rounds=self.options.early_stopping, verbose_eval=False)

    def fit(self, configs: Sequence[Config], gflops: Sequence[float]) -> None:
        """Refit on every measurement of this workload so far."""
        labels = np.asarray(gflops, dtype=np.float64)
        if len(configs) < 2 or labels.max() <= 0:
            return
        x = self.matrix(configs)
        self.booster = self._train(x, labels / labels.max(), [len(configs)], self._base_margin(x))

    def fit_history(self, history: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Train the base model on other workloads: (feature matrix, GFLOPS) per workload, ranked within each."""
        usable = [(x, y / y.max()) for x, y in history if len(y) >= 2 and y.max() > 0]
        if usable and self.options.feature == "itervar":
            self.base = self._train(np.concatenate([x for x, _ in usable]), np.concatenate([y for _, y in usable]),
                                    [len(y) for _, y in usable])

    def _base_margin(self, x: np.ndarray):
        if self.base is None:
            return None
        import xgboost as xgb

        return self.base.predict(xgb.DMatrix(x), output_margin=True)

    @property
    def trained(self) -> bool:
        return self.booster is not None or self.base is not None

    def predict(self, configs: Sequence[Config]) -> np.ndarray:
        """Higher is faster; comparable only within one call's ranking."""
        import xgboost as xgb

        x = self.matrix(configs)
        if self.booster is None:
            return self._base_margin(x) if self.base is not None else np.zeros(len(configs))
        data = xgb.DMatrix(x)
        margin = self._base_margin(x)
        if margin is not None:
            data.set_base_margin(margin)
        return self.booster.predict(data, iteration_range=(0, self.booster.best_iteration + 1))
