"""The tuner contract: `propose(n)` configs to measure, `observe` what they measured.

Every tuner keeps the set of configs it has seen, so none is proposed twice in a job, and
resumes by observing the measurements a job already has.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Sequence

from search_space import Config, ConfigSpace
from workers import MeasureResult


class Tuner(ABC):
    def __init__(self, space: ConfigSpace, seed: int = 0):
        self.space = space
        self.rng = random.Random(seed)
        self.visited: set[int] = set()
        self.best: tuple[Config, MeasureResult] | None = None

    @abstractmethod
    def propose(self, n: int) -> list[Config]:
        """Up to n configs, none proposed or observed before."""

    def observe(self, configs: Sequence[Config], results: Sequence[MeasureResult]) -> None:
        for config, result in zip(configs, results):
            self.visited.add(config.index)
            if result.ok and (self.best is None or result.gflops > self.best[1].gflops):
                self.best = (config, result)
        self.update(configs, results)

    def update(self, configs: Sequence[Config], results: Sequence[MeasureResult]) -> None:
        """What a tuner learns from a batch (nothing, for the model-free ones)."""

    def has_next(self) -> bool:
        return len(self.visited) < self.space.size

    def _fresh(self, configs) -> list[Config]:
        """Drop visited configs and repeats, keeping order."""
        seen, fresh = set(self.visited), []
        for config in configs:
            if config.index not in seen:
                seen.add(config.index)
                fresh.append(config)
        return fresh
