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
