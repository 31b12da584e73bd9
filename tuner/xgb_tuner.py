"""The model-based tuner: an XGBoost cost model proposes, simulated annealing searches over it.

After each observed batch the model is refit and the plan (the best predicted configs not yet
measured) re-ranked by it; every `research_every` trials the plan is searched anew, the annealing
walk going on from where it stopped (the first search lowers some 400 configs, a later one about 70;
a refit and a re-rank take milliseconds). A few percent of each batch is random (epsilon-greedy), so
the model keeps seeing what it does not predict well.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from search_space import Config, ConfigSpace, Target, Workload

from .base import Tuner
from .cost_model import CostModelOptions, XGBCostModel
from .sa import AnnealOptions, Annealer


@dataclass(frozen=True)
class XGBOptions:
    plan_size: int = 64  # configs the annealer returns per search
    epsilon: float = 0.05  # share of each batch drawn at random
    diversity: float = 0.0  # > 0: prefer plans that cover more distinct knob values
    # trials between searches of the model: replayed over 7 seeds, 8 reached 95% of the best in as few trials as
    # a search after every batch of 4 (dense 128x3072x768: 15 vs 20; 16 took 26), with half the searches
    research_every: int = 8
    model: CostModelOptions = field(default_factory=CostModelOptions)
    anneal: AnnealOptions = field(default_factory=AnnealOptions)


class XGBTuner(Tuner):
    def __init__(self, space: ConfigSpace, seed: int = 0, *, workload: Workload, target: Target,
                 options: XGBOptions = XGBOptions(), history: Sequence[tuple[np.ndarray, np.ndarray]] = ()):
        super().__init__(space, seed)
        self.options = options
        self.model = XGBCostModel(workload, target, space, options.model, seed)
        self.model.fit_history(history)
        self.measured: list[Config] = []
        self.gflops: list[float] = []
        self.plan: list[Config] = []
        self.annealer = Annealer(space, self.rng, options.anneal)
        self.since_search = 0  # trials observed since the plan was searched

    def update(self, configs, results) -> None:
        self.measured += configs
        self.gflops += [r.gflops for r in results]
        self.model.fit(self.measured, self.gflops)
        self.since_search += len(configs)
        self.plan = self._fresh(self.plan)
        if self.since_search >= self.options.research_every or not self.plan:
            self.plan = []
        else:
            scores = self.model.predict(self.plan)
            self.plan = [self.plan[i] for i in np.argsort(-scores, kind="stable")]

    def propose(self, n: int) -> list[Config]:
        if not self.model.trained:
            return self.space.sample(n, self.rng, exclude=self.visited)
        if len(self._fresh(self.plan)) < n:
            self._search()
        self.plan = self._fresh(self.plan)
        explore = sum(self.rng.random() < self.options.epsilon for _ in range(n))
        batch = self.plan[:n - explore]
        taken = self.visited | {c.index for c in batch}
        return batch + self.space.sample(n - len(batch), self.rng, exclude=taken)

    def _search(self) -> None:
        wanted = self.options.plan_size * (3 if self.options.diversity > 0 else 1)
        fastest = sorted(range(len(self.measured)), key=lambda i: -self.gflops[i])
        starts = [self.measured[i] for i in fastest[:self.options.anneal.chains // 8]]  # the walk begins at the best
        found = self.annealer.search(self.model.predict, wanted, self.visited, starts)
        self.since_search = 0
        self.plan = self._diverse(found) if self.options.diversity > 0 else found

    def _diverse(self, ranked: list[Config]) -> list[Config]:
        """Greedy pick by rank bonus + diversity × knob values not yet in the plan."""
        chosen, covered = [], set()
        pool = list(enumerate(ranked))
        while pool and len(chosen) < self.options.plan_size:
            gain = lambda item: -item[0] / len(ranked) + self.options.diversity * len(set(item[1].values) - covered)
            best = max(pool, key=gain)
            pool.remove(best)
            chosen.append(best[1])
            covered |= set(best[1].values)
        return chosen
