"""Simulated annealing over a cost model: many chains walk one-knob neighbours, accepting worse
points with a probability that cools to zero, and the best unseen points found are the answer.
Chains persist between calls, so each batch continues the last one's walk."""
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
    chains: int = 64
    steps: int = 80
    early_stop: int = 15  # steps without a change to the top set
    temperature: tuple[float, float] = (1.0, 0.0)


def anneal(space: ConfigSpace, score: Callable[[Sequence[Config]], np.ndarray], count: int, exclude: set[int],
           starts: list[Config], rng: random.Random, options: AnnealOptions = AnnealOptions()
           ) -> tuple[list[Config], list[Config]]:
    """(the `count` best-scoring configs not in `exclude`, best first; the chains' final points)."""
    points = list(starts[:options.chains])
    points += space.sample(options.chains - len(points), rng)
    scores = score(points)
    top: list[tuple[float, int]] = []  # min-heap of (score, index)
    in_top: set[int] = set()

    def offer(configs, values):
        changed = False
        for config, value in zip(configs, values):
            if config.index in exclude or config.index in in_top:
                continue
            if len(top) < count:
                heapq.heappush(top, (float(value), config.index))
            elif value > top[0][0]:
                in_top.discard(heapq.heapreplace(top, (float(value), config.index))[1])
            else:
                continue
            in_top.add(config.index)
            changed = True
        return changed

    offer(points, scores)
    hot, cold = options.temperature
    quiet = 0
    for step in range(options.steps):
        temperature = hot + (cold - hot) * step / max(1, options.steps - 1)
        moves = [space.random_neighbour(p, rng) for p in points]
        move_scores = score(moves)
        for i, (old, new) in enumerate(zip(scores, move_scores)):
            if new > old or (temperature > 0 and rng.random() < math.exp((new - old) / temperature)):
                points[i], scores[i] = moves[i], new
        quiet = 0 if offer(moves, move_scores) else quiet + 1
        if quiet >= options.early_stop:
            break
    best = sorted(top, reverse=True)
    return [space.get(index) for _, index in best], points
