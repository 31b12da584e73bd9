"""`tune(workload, ...)`: the search loop. A tuner proposes, a pool measures, the database keeps
every result as it arrives, and a job interrupted at any point resumes from what it recorded.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from db import Database
from db.queue import JobQueue
from search_space import ConfigSpace, Target, Workload, get_space
from workers import MeasureInput, MeasureResult
from workers.pool import Pool, make_pool
from workers.task import MeasureOptions, Task

from . import TUNERS
from .cost_model import CostModelOptions, features
from .xgb_tuner import XGBOptions


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 64
    tuner: str = "xgb"
    # candidates proposed and measured together: small batches let the model learn from every few
    # measurements (replay: xgb reached 95% of the best in ~2x fewer trials with 4 than with 8),
    # and 4 keep the two build slots of a 2-core host busy twice
    batch: int = 4
    early_stopping: int | None = None  # stop after this many trials without a better config
    seed: int = 0
    transfer: bool = True  # xgb: start from a model of the op's other shapes in the database
    measure: MeasureOptions = field(default_factory=MeasureOptions)

    def __post_init__(self):
        if self.tuner not in TUNERS:
            raise ValueError(f"unknown tuner {self.tuner!r}; tuners: {', '.join(TUNERS)}")
        if not 1 <= self.trials <= 100_000:
            raise ValueError(f"trials must be in 1..100000, got {self.trials}")


@dataclass
class TuneResult:
    job_id: int
    measured: list[tuple[MeasureInput, MeasureResult]]  # this job's, resumed ones first
    resumed: int  # how many were loaded from the database rather than measured now

    @property
    def best(self) -> tuple[MeasureInput, MeasureResult] | None:
        ok = [(i, r) for i, r in self.measured if r.ok]
        return max(ok, key=lambda pair: pair[1].gflops) if ok else None

    @property
    def curve(self) -> list[float]:
        """Best GFLOPS after each trial."""
        return [float(x) for x in np.maximum.accumulate([r.gflops for _, r in self.measured])] if self.measured else []


def history(database: Database, workload: Workload, target: Target, limit: int = 512) -> list[tuple]:
    """(feature matrix, GFLOPS) per other shape of the op on this target, for the xgb tuner's base model."""
    found = []
    for other, records in database.op_records(workload.op, target, exclude=workload).items():
        space = get_space(other, target)
        records = random.Random(0).sample(records, min(limit, len(records)))
        x = np.stack([features(other, target, space, r.input.config, "itervar") for r in records])
        found.append((x, np.array([r.result.gflops for r in records])))
    return found


def make_tuner(workload: Workload, target: Target, options: TuneOptions, past: Sequence[tuple] = (),
               space: ConfigSpace | None = None):
    """The tuner the options name, over `space` (default: the workload's whole space); an xgb tuner
    starts from a base model of `past` (see `history`)."""
    space = space or get_space(workload, target)
    if options.tuner != "xgb":
        return TUNERS[options.tuner](space, options.seed)
    return TUNERS["xgb"](space, options.seed, workload=workload, target=target,
                         options=XGBOptions(model=CostModelOptions()), history=past)


def tune(workload: Workload, target: Target | str = "llvm", trials: int = 64, tuner: str = "xgb",
         db: Database | str | None = None, pool: Pool | str = "local", *, batch: int = 4,
         early_stopping: int | None = None, seed: int = 0, transfer: bool = True,
         measure: MeasureOptions = MeasureOptions(),
         on_result: Callable[[MeasureInput, MeasureResult], None] | None = None,
         job: int | None = None, stop: Callable[[], bool] = lambda: False) -> TuneResult:
    """Tune until `trials` configs of the job are measured (or early stopping ends it).

    Running the same request again resumes an unfinished job: it reloads what the job measured,
    refits the model on it, and measures nothing twice; it raises `db.queue.JobBusy` while another live
    process runs that job. `job` names a job the caller has claimed (the service's runner does);
    `stop()` is asked between batches and ends the job `cancelled`."""
    options = TuneOptions(trials, tuner, batch, early_stopping, seed, transfer, measure)
    target = Target.parse(target)
    database = db if isinstance(db, Database) else Database(db)
    claim = None if job is not None else JobQueue(database).own(workload, target, options.tuner, options.trials)
    try:
        return run_job(job if claim is None else claim.job_id, workload, target, options, database, pool, on_result, stop)
    finally:
        if claim is not None:
            claim.release()


def run_job(job_id: int, workload: Workload, target: Target, options: TuneOptions, database: Database, pool: Pool | str,
            on_result: Callable[[MeasureInput, MeasureResult], None] | None, stop: Callable[[], bool]) -> TuneResult:
    database.update_job(job_id, "running")
    past = history(database, workload, target) if options.tuner == "xgb" and options.transfer else []
    search = make_tuner(workload, target, options, past)
    done = [(r.input, r.result) for r in database.job_records(job_id)]
    if done:
        search.observe([i.config for i, _ in done], [r for _, r in done])
    result = TuneResult(job_id, list(done), len(done))
    own_pool = isinstance(pool, str)
    measurer = make_pool(pool) if own_pool else pool
    def sink(measure_input: MeasureInput, measured: MeasureResult) -> None:
        database.record(measure_input, measured, job_id)
        if on_result:
            on_result(measure_input, measured)

    try:
        stopped = search_loop(search, measurer, workload, target, options, result.measured, sink, stop)
    except BaseException as error:  # Ctrl-C included: the job stays resumable, its records are kept
        database.update_job(job_id, "cancelled" if isinstance(error, KeyboardInterrupt) else "failed",
                            f"{type(error).__name__}: {error}")
        raise
    finally:
        if own_pool:
            measurer.close()
    database.finish_job(job_id, "cancelled" if stopped else "done")
    return result


def search_loop(search, pool, workload: Workload, target: Target, options: TuneOptions,
                measured: list[tuple[MeasureInput, MeasureResult]],
                sink: Callable[[MeasureInput, MeasureResult], None] = lambda i, r: None,
                stop: Callable[[], bool] = lambda: False) -> bool:
    """Propose, measure, hand each result to `sink` (the database) before the tuner sees the batch;
    until `measured` holds options.trials results, the space is exhausted, early stopping, or `stop()`
    (asked before each batch, so the batch in flight is always finished and recorded).
    Returns whether `stop()` ended it."""
    since_best, best = 0, max((r.gflops for _, r in measured), default=0.0)
    while len(measured) < options.trials and search.has_next():
        if options.early_stopping and since_best >= options.early_stopping:
            return False
        if stop():
            return True
        configs = search.propose(min(options.batch, options.trials - len(measured)))
        if not configs:
            return False
        inputs = [MeasureInput(workload, target, c) for c in configs]
        results = pool.measure([Task.of(i) for i in inputs], options.measure)
        for measure_input, result in zip(inputs, results):
            sink(measure_input, result)
            measured.append((measure_input, result))
            since_best = 0 if result.gflops > best else since_best + 1
            best = max(best, result.gflops)
        search.observe(configs, results)
    return False
