"""`measure(inputs)`: one `MeasureResult` per candidate, each built, checked and timed in a pool."""
from __future__ import annotations

from typing import Sequence

from .pool import Pool, make_pool
from .result import MeasureInput, MeasureResult
from .task import MeasureOptions, Task


def measure(inputs: Sequence[MeasureInput], options: MeasureOptions = MeasureOptions(),
            pool: Pool | None = None) -> list[MeasureResult]:
    """Measure candidates in `pool`, or in a local pool started (and stopped) for this call."""
    tasks = [Task.of(measure_input) for measure_input in inputs]
    if pool is not None:
        return pool.measure(tasks, options)
    own = make_pool("local")
    try:
        return own.measure(tasks, options)
    finally:
        own.close()
