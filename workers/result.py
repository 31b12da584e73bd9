"""What one measurement of a candidate produced: its outcome, every timing sample, and where and when."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Sequence, TypeVar

from search_space import Config, Target, Workload


class Outcome(str, Enum):
    """The eight outcomes of a measured candidate (docs/architecture.md)."""

    OK = "ok"
    INVALID_CONFIG = "invalid_config"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    WRONG_ANSWER = "wrong_answer"
    BUILD_TIMEOUT = "build_timeout"
    RUN_TIMEOUT = "run_timeout"
    WORKER_LOST = "worker_lost"


@dataclass(frozen=True)
class MeasureInput:
    workload: Workload
    target: Target
    config: Config


@dataclass(frozen=True)
class MeasureResult:
    outcome: Outcome
    samples: tuple[float, ...] = ()  # seconds per call, one per timing sample
    compile_seconds: float = 0.0
    flops: int = 0
    worker: str = ""
    host: str = ""
    started_at: float = 0.0  # Unix time
    finished_at: float = 0.0
    error: str = ""
    phases: dict = field(default_factory=dict)  # seconds spent per phase (build, check, time, ...)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None

    @property
    def gflops(self) -> float:
        """Throughput from the median sample; 0 for any failure."""
        return self.flops / self.median / 1e9 if self.ok and self.samples else 0.0


Measured = TypeVar("Measured")


def typical(measurements: Sequence[Measured], seconds: Callable[[Measured], object]) -> Measured:
    """The upper median of one config's measurements by `seconds`: the time it is taken to run at. On a shared host
    one measurement can come out fast by luck, and the fastest of a search's many is the luckiest, so the slower of
    two counts, the middle of three."""
    return sorted(measurements, key=seconds)[len(measurements) // 2]


def best_so_far(measured: Sequence[tuple[MeasureInput, MeasureResult]]) -> list[int | None]:
    """After each of a job's measurements, in order, where in `measured` its best config by then is, at its typical
    time (as the stored best is ranked: a finalist timed fast by luck falls back when measured again); None before
    an ok one."""
    runs: dict[int, list[int]] = {}
    typical_runs: dict[int, int] = {}
    bests: list[int | None] = []
    best = None
    gflops = lambda at: measured[at][1].gflops  # noqa: E731
    for at, (measure_input, result) in enumerate(measured):
        if result.ok:
            index = measure_input.config.index
            runs.setdefault(index, []).append(at)
            typical_runs[index] = typical(runs[index], lambda run: (measured[run][1].median, run))
            if best is None or measured[best][0].config.index == index:  # the best may have fallen back: see all
                best = max(typical_runs.values(), key=gflops)
            elif gflops(typical_runs[index]) > gflops(best):
                best = typical_runs[index]
        bests.append(best)
    return bests


def best_curve(measured: Sequence[tuple[MeasureInput, MeasureResult]]) -> list[float]:
    """A job's best GFLOPS after each of its measurements (`best_so_far`), 0 before an ok one."""
    return [0.0 if at is None else measured[at][1].gflops for at in best_so_far(measured)]
