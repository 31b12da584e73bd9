"""Random search: distinct configs drawn uniformly from the space."""
from __future__ import annotations

from search_space import Config

from .base import Tuner


class RandomTuner(Tuner):
    def propose(self, n: int) -> list[Config]:
        return self.space.sample(n, self.rng, exclude=self.visited)
