"""Genetic search: each generation is bred from the last one plus the elites (the best configs
measured so far, which thus never die out), parents drawn in proportion to their GFLOPS,
uniform crossover knob by knob and per-knob mutation. Children that break a constraint are
redrawn; a generation that cannot be filled is topped up at random."""
from __future__ import annotations

from dataclasses import dataclass

from search_space import Config, InvalidConfig

from .base import Tuner


@dataclass(frozen=True)
class GAOptions:
    population: int = 32
    elites: int = 4
    mutation: float = 0.1  # chance per knob
    attempts: int = 20  # tries per child before giving up on breeding it


class GATuner(Tuner):
    def __init__(self, space, seed: int = 0, options: GAOptions = GAOptions()):
        super().__init__(space, seed)
        self.options = options
        self.fitness: dict[int, float] = {}
        self.generation: list[int] = []

    def update(self, configs, results) -> None:
        for config, result in zip(configs, results):
            self.fitness[config.index] = result.gflops
        self.generation = (self.generation + [c.index for c in configs])[-self.options.population:]

    def propose(self, n: int) -> list[Config]:
        elites = sorted(self.fitness, key=self.fitness.get, reverse=True)[:self.options.elites]
        pool = dict.fromkeys(elites + self.generation)
        parents = [self.space.get(i) for i in pool if self.fitness[i] > 0]
        children: list[Config] = []
        if len(parents) >= 2:
            weights = [self.fitness[p.index] for p in parents]
            for _ in range(n * self.options.attempts):
                if len(children) >= n:
                    break
                mother, father = self.rng.choices(parents, weights, k=2)
                child = self._breed(mother, father)
                if child is not None:
                    children = self._fresh(children + [child])
        return children + self.space.sample(n - len(children), self.rng, exclude=self.visited | {c.index for c in children})

    def _breed(self, mother: Config, father: Config) -> Config | None:
        genes = {}
        for name, knob in self.space.knobs.items():
            genes[name] = (mother if self.rng.random() < 0.5 else father)[name]
            if self.rng.random() < self.options.mutation:
                genes[name] = self.rng.choice(knob.candidates)
        try:
            return self.space.config(genes)
        except InvalidConfig:
            return None
