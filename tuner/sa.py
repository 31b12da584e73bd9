"""Simulated annealing over a cost model, one walk spread over a tuning job's searches.

Many chains walk one-knob neighbours, accepting worse points with a probability that cools to
zero; the answer is the best unseen points. Scoring a new point means lowering it to a program
(about half a millisecond), so the walk is not started over: the first search anneals from hot
to cold; a later one re-scores every point scored so far under the refit model (one cheap batch
prediction) and walks on, greedily and for a few steps, from the best of them. The answer draws
on the whole walk, not on its last steps only.
"""
from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from search_space import Config, ConfigSpace


@dataclass(frozen=True)
class AnnealOptions:
    # Replayed over 9 seeds on the recorded data sets (`tensortune bench tuner --seeds 9`), these reached 95% of the
    # best in 5, 14 and 6 median trials, as a 64-chain, 80-step walk restarted at every search did (5, 18, 6), for
    # a tenth of the configs lowered; bert-layer and resnet18 tuned live as fast (their models timed alike).
    chains: int = 32
    steps: int = 12  # the first search: hot to cold
    refine_chains: int = 16  # a later search: greedy steps from the best points scored so far
    refine_steps: int = 6
    early_stop: int = 15  # steps without a change to the top set
    temperature: tuple[float, float] = (1.0, 0.0)
    remembered: int = 20_000  # points kept for re-scoring, the most recent


class Annealer:
    """One tuning job's walk over its space: the points scored so far, kept for the next search."""

    def __init__(self, space: ConfigSpace, rng: random.Random, options: AnnealOptions = AnnealOptions()):
        self.space, self.rng, self.options = space, rng, options
        self.scored: dict[int, Config] = {}  # every point scored so far, oldest first

    def search(self, score: Callable[[Sequence[Config]], np.ndarray], count: int, exclude: set[int],
               starts: Sequence[Config] = ()) -> list[Config]:
        """The `count` best-scoring configs not in `exclude`, best first. The first search's chains start at
        `starts` (known good points), the rest at random."""
        options, top = self.options, _Top(count, exclude)
        remembered = list(self.scored.values())
        if remembered:
            values = score(remembered)
            top.offer(remembered, values)
            best = np.argsort(-values, kind="stable")[:options.refine_chains]
            points, scores = [remembered[i] for i in best], values[best]
            steps, hot, cold = options.refine_steps, 0.0, 0.0
        else:
            points = list(starts[:options.chains])
            points += self.space.sample(options.chains - len(points), self.rng)
            scores = score(points)
            self._remember(points)
            top.offer(points, scores)
            (hot, cold), steps = options.temperature, options.steps
        quiet = 0
        for step in range(steps):
            temperature = hot + (cold - hot) * step / max(1, steps - 1)
            moves = [self.space.random_neighbour(p, self.rng) for p in points]
            move_scores = score(moves)
            self._remember(moves)
            for i, (old, new) in enumerate(zip(scores, move_scores)):
                if new > old or (temperature > 0 and self.rng.random() < math.exp((new - old) / temperature)):
                    points[i], scores[i] = moves[i], new
            quiet = 0 if top.offer(moves, move_scores) else quiet + 1
            if quiet >= options.early_stop:
                break
        return [self.space.get(index) for index in top.best()]

    def _remember(self, configs: Sequence[Config]) -> None:
        for config in configs:
            self.scored.pop(config.index, None)
            self.scored[config.index] = config
        while len(self.scored) > self.options.remembered:
            del self.scored[next(iter(self.scored))]


class _Top:
    """The `count` highest-scoring distinct configs offered, none of `exclude`."""

    def __init__(self, count: int, exclude: set[int]):
        self.count, self.exclude = count, exclude
        self.heap: list[tuple[float, int]] = []  # min-heap of (score, index)
        self.members: set[int] = set()

    def offer(self, configs: Sequence[Config], values) -> bool:
        """Whether the top set changed."""
        changed = False
        for config, value in zip(configs, values):
            if config.index in self.exclude or config.index in self.members:
                continue
            if len(self.heap) < self.count:
                heapq.heappush(self.heap, (float(value), config.index))
            elif value > self.heap[0][0]:
                self.members.discard(heapq.heapreplace(self.heap, (float(value), config.index))[1])
            else:
                continue
            self.members.add(config.index)
            changed = True
        return changed

    def best(self) -> list[int]:
        return [index for _, index in sorted(self.heap, reverse=True)]
