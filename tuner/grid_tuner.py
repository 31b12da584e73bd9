"""Grid search: the space in index order (the last knob varies slowest)."""
from __future__ import annotations

from search_space import Config

from .base import Tuner


class GridTuner(Tuner):
    def __init__(self, space, seed: int = 0):
        super().__init__(space, seed)
        self._cursor = 0

    def propose(self, n: int) -> list[Config]:
        batch = []
        while len(batch) < n and self._cursor < self.space.size:
            if self._cursor not in self.visited:
                batch.append(self.space.get(self._cursor))
            self._cursor += 1
        return batch
