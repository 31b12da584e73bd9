"""Replay: a pool that answers measurements from recorded real ones, as Kernel Tuner's simulation
mode does, so tuners can be compared on many seeds in seconds, honestly (every answer was once
measured on this machine). A data set covers a sub-space exhaustively, so any config a tuner
proposes in that sub-space has an answer.
"""
from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from search_space import ConfigSpace, Target, Workload, get_space
from workers import MeasureResult, Outcome
from workers.task import MeasureOptions, Task


def knob_key(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True)


@dataclass
class ReplayData:
    workload: Workload
    target: Target
    allowed: dict[str, list]  # the sub-space: knob → the values it keeps (JSON form)
    results: dict[str, MeasureResult]  # by knob values (JSON, sorted keys)

    @property
    def space(self) -> ConfigSpace:
        frozen = {name: tuple(tuple(v) if isinstance(v, list) else v for v in values)
                  for name, values in self.allowed.items()}
        return get_space(self.workload, self.target).restrict(frozen)

    @property
    def best_gflops(self) -> float:
        return max(r.gflops for r in self.results.values())

    def save(self, path: Path) -> None:
        with gzip.open(path, "wt") as out:
            out.write(json.dumps({"workload": self.workload.key, "target": str(self.target),
                                  "allowed": self.allowed}) + "\n")
            for knobs, r in self.results.items():
                out.write(json.dumps({"knobs": json.loads(knobs), "outcome": r.outcome.value, "samples": r.samples,
                                      "flops": r.flops, "compile_seconds": round(r.compile_seconds, 4)}) + "\n")

    @classmethod
    def load(cls, path: Path) -> ReplayData:
        with gzip.open(path, "rt") as lines:
            header = json.loads(next(lines))
            results = {}
            for line in lines:
                row = json.loads(line)
                results[knob_key(row["knobs"])] = MeasureResult(
                    Outcome(row["outcome"]), tuple(row["samples"]), row["compile_seconds"], row["flops"],
                    worker="replay", host="replay")
        return cls(Workload.from_key(header["workload"]), Target.parse(header["target"]), header["allowed"], results)


class ReplayPool:
    """A measurement pool over a `ReplayData`: same interface as the local and Ray pools."""

    def __init__(self, data: ReplayData):
        self.data = data

    def measure(self, tasks: Sequence[Task], options: MeasureOptions = MeasureOptions()) -> list[MeasureResult]:
        answers = []
        for task in tasks:
            knobs = json.loads(task.config)["knobs"]
            if knob_key(knobs) not in self.data.results:
                raise KeyError(f"config {knobs} is not in the replay data of {self.data.workload.key}")
            answers.append(self.data.results[knob_key(knobs)])
        return answers

    def close(self) -> None:
        pass


def replay_curve(data: ReplayData, tuner: str, seed: int, trials: int, batch: int = 4,
                 past: Sequence[tuple] = (), until: float = math.inf) -> list[float]:
    """Best GFLOPS after each trial of one tuner run against the recorded measurements
    (an xgb tuner starting from a base model of `past`, when given), ending early with the batch that reaches
    `until` GFLOPS: all that the trials to reach it need."""
    from .tune import TuneOptions, make_tuner, search_loop

    options = TuneOptions(trials=min(trials, data.space.size), tuner=tuner, batch=batch, seed=seed)
    search = make_tuner(data.workload, data.target, options, past, data.space)
    measured: list = []
    reached = lambda: any(result.gflops >= until for _, result in measured[-batch:])  # asked after each batch
    search_loop(search, ReplayPool(data), data.workload, data.target, options, measured, stop=reached)
    best, curve = 0.0, []
    for _, result in measured:
        best = max(best, result.gflops)
        curve.append(best)
    return curve


def trials_to_reach(curve: list[float], level: float) -> int | None:
    """The first trial (1-based) whose best-so-far reaches `level`, None if never."""
    return next((i + 1 for i, value in enumerate(curve) if value >= level), None)
