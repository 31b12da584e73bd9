"""`tune_tasks(tasks, ...)`: one trial budget spent over a model's tuning tasks, batch by batch, on the task
whose next trials most cut the model's estimated latency (tuner/allocation.py picks it).

Each task is an ordinary tuning job, so `tensortune best` and `apply_history_best` serve its records; its
jobs hang under a model job (`jobs.parent_id`), whose `trials` is the whole budget. A model job is
identified by its name, target, tuner, budget and the set of its tasks' workloads: running the same
request again resumes it, each task's search re-observing what its job recorded, and spends only what is
left of the budget.
"""
from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from db import Database
from db.job_locks import Claim
from db.queue import JobQueue
from search_space import Config, Target, Workload, get_space
from search_space.templates import template
from workers.pool import Pool
from workers.task import MeasureOptions

from .allocation import STRATEGIES, TaskHistory, batch_size, model_latency, next_task
from .tune import JobSearch, TuneOptions, TuneResult, confirmations, ending_on_error, fitted_from, measuring


@dataclass(frozen=True)
class TuningTask:
    """A model's tuning task: a workload, how many times one forward pass runs it, the module paths that
    produce it."""

    workload: Workload
    weight: int = 1
    paths: tuple[str, ...] = ()

    def __post_init__(self):
        if self.weight < 1:
            raise ValueError(f"a task's weight is how often a forward pass runs it, at least 1; got {self.weight}")


@dataclass(frozen=True)
class TaskProgress:
    workload: str  # the workload's key
    weight: int
    trials: int  # measured so far, resumed ones included
    best_gflops: float  # 0 before the first ok measurement
    best_seconds: float | None  # None before the first ok measurement


@dataclass(frozen=True)
class TasksProgress:
    """Where a `tune_tasks` run stands, after a batch."""

    tasks: tuple[TaskProgress, ...]
    trials: int  # spent in all, resumed ones included
    budget: int
    latency: float  # the model's estimated seconds (allocation.model_latency); inf until every task has measured ok


@dataclass
class TasksResult:
    job_id: int  # the model job
    tasks: list[TuneResult]  # per task, in the order given: its job, what it measured, its best
    curve: list[float]  # the model's estimated seconds after each batch of this run
    wall: float = 0.0  # seconds the run's schedule took

    @property
    def trials(self) -> int:
        """Spent in all, resumed ones included."""
        return sum(len(task.measured) for task in self.tasks)

    @property
    def seconds(self) -> dict[str, float]:
        """TuneResult.seconds of the whole run: the tasks' measuring and record writing, and as the tuner's
        everything else the schedule spent (the tasks' models and searches, and choosing the next task)."""
        spent = {phase: sum(task.seconds[phase] for task in self.tasks) for phase in ("measure", "record")}
        return {"measure": spent["measure"], "tuner": max(0.0, self.wall - sum(spent.values())), "record": spent["record"]}


def tune_tasks(tasks: Sequence[TuningTask], target: Target | str = "llvm", trials: int = 256,
               db: Database | str | None = None, tuner: str = "xgb", pool: Pool | str = "local", *, batch: int = 4,
               seed: int = 0, measure: MeasureOptions = MeasureOptions(),
               on_progress: Callable[[TasksProgress], None] | None = None, stop: Callable[[], bool] = lambda: False,
               strategy: str = "gradient", name: str | None = None, job: Claim | None = None) -> TasksResult:
    """Measure `trials` configs in all over `tasks` (one per distinct workload; the first stands for the
    model in job listings), `batch` at a time (less where the budget is too small for a batch per task:
    allocation.batch_size), on the task `strategy` picks (allocation.next_task), through one pool;
    `on_progress` hears where the run stands before the first batch and after each.

    The model job `name` (may be None) of exactly this request is resumed if unfinished, else created with
    one job per task; JobBusy while another live process runs it. `job` is a model job of these tasks the
    caller has claimed (the service's runner does), run instead. `stop()` is asked between batches and
    ends the model job and its tasks' jobs `cancelled`, resumable. An error ends them `failed` and raises
    JobFailed; a database outage or a pool with no worker host for the target (NoWorkerHost) raises as it is,
    the jobs resumable. A task whose space runs out leaves the rest of the budget to the others; when every
    space is exhausted the run ends early."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; strategies: {', '.join(STRATEGIES)}")
    if not tasks or len({task.workload for task in tasks}) < len(tasks):
        raise ValueError("tune_tasks needs at least one task, and one task per workload (add up their weights)")
    if name is not None and not 1 <= len(name) <= 128:
        raise ValueError(f"a model job's name has 1 to 128 characters, got {len(name)}")
    options = TuneOptions(trials, tuner, batch, seed=seed, measure=measure)
    target = Target.parse(target)
    for task in tasks:
        get_space(task.workload, target)  # NoTemplate before any job exists
    database = db if isinstance(db, Database) else Database(db)
    claim = job or JobQueue(database).own_model(name, [task.workload for task in tasks], target, tuner, trials)
    try:
        return run_model_job(claim.job_id, tasks, target, options, database.fenced(claim), pool, strategy,
                             on_progress, stop)
    finally:
        if job is None:
            claim.release()


def run_model_job(job_id: int, tasks: Sequence[TuningTask], target: Target, options: TuneOptions, database: Database,
                  pool: Pool | str, strategy: str, on_progress: Callable[[TasksProgress], None] | None,
                  stop: Callable[[], bool]) -> TasksResult:
    """Run a model job held by the caller, writing through `database` (fenced by the model job's lock). Its
    tasks' jobs end as it does, each given its share of the budget as its `trials`."""
    searches: list[JobSearch] = []

    def end(status: str, reason: str = "") -> None:
        for search in searches:
            database.update_job(search.result.job_id, status, reason, trials=len(search.result.measured))
        database.update_job(job_id, status, reason)

    with ending_on_error(job_id, end):
        jobs = {job.workload.key: job.id for job in database.children(job_id)}
        for job in [job_id, *jobs.values()]:
            database.update_job(job, "running")
        searches += [JobSearch(jobs[task.workload.key], task.workload, target, options, database) for task in tasks]
        with measuring(pool) as measurer:
            start = time.perf_counter()
            curve, stopped = schedule(tasks, searches, measurer, options, strategy, on_progress or (lambda _: None),
                                      stop)
            wall = time.perf_counter() - start
        end("cancelled" if stopped else "done")
    return TasksResult(job_id, [search.result for search in searches], curve, wall)


def schedule(tasks: Sequence[TuningTask], searches: Sequence[JobSearch], pool: Pool, options: TuneOptions,
             strategy: str, on_progress: Callable[[TasksProgress], None],
             stop: Callable[[], bool]) -> tuple[list[float], bool]:
    """Give batches to the tasks `strategy` picks until the budget is spent, every space is exhausted, or
    `stop()` (asked before each batch), then measure each task's finalists again with what the budget kept for
    them (`confirmations`, JobSearch.confirm); returns the estimated latency after each batch and whether `stop()`
    ended it. A step that measured fewer than asked found its task's space exhausted."""
    rng, exhausted, curve = random.Random(options.seed), set(), []
    on_progress(progress(tasks, searches, exhausted, options.trials))
    kept = confirmations(options.trials, len(tasks))  # each task's, for its finalists (JobSearch.confirm)
    while (left := options.trials - kept * len(tasks) - sum(len(s.result.measured) for s in searches)) > 0:
        known = histories(tasks, searches, exhausted)
        chosen = next_task(known, strategy, options.batch, rng)
        if chosen is None:
            break
        if stop():
            return curve, True
        measured, asked = len(searches[chosen].result.measured), batch_size(known, options.batch, left)
        searches[chosen].offer(siblings_bests(searches[chosen], searches))
        searches[chosen].step(pool, measured + asked)
        if len(searches[chosen].result.measured) < measured + asked:
            exhausted.add(chosen)
        now = progress(tasks, searches, exhausted, options.trials)
        curve.append(now.latency)
        on_progress(now)
    if not kept:
        return curve, False
    for search in searches:
        left = options.trials - sum(len(s.result.measured) for s in searches)
        if search.confirm(pool, len(search.result.measured) + min(kept, left), stop):
            return curve, True
    on_progress(progress(tasks, searches, exhausted, options.trials))
    return curve, False


def siblings_bests(search: JobSearch, searches: Sequence[JobSearch]) -> list[Config]:
    """The best config so far of each other task of the same op and dtype, fitted into `search`'s space: what a
    task measures next, where it has not. Borrowing at a job's start takes only the stored bests of shapes with the
    same options, and only those found before it: in a bert-layer tuned on a Zen 3 (300 trials, 2 threads) the FFN
    up projection's best (its GELU epilogue another option) was never measured by QKV's or the 768² dense's tasks,
    and timed in alternating rounds it ran 6-8% faster on their shapes than their own bests. (Whole runs there, with
    and without this, ended with kernels as fast, -0.6% to +0.2% in three pairs: which config a task keeps was
    decided more by the host's noise than by what it was offered.)"""
    space, here = get_space(search.workload, search.target), search.workload
    found = []
    for other in searches:
        best, there = other.result.best, other.workload
        if other is not search and best is not None and (there.op, there.dtype) == (here.op, here.dtype):
            found += fitted_from(space, here, search.target, there, search.target, best[0].config)
    return found


def histories(tasks: Sequence[TuningTask], searches: Sequence[JobSearch], exhausted: set[int]) -> list[TaskHistory]:
    """What the allocation sees of each task."""
    return [TaskHistory(family(task.workload, search.target), task.workload.flops, task.weight,
                        best_seconds(search.result), i in exhausted)
            for i, (task, search) in enumerate(zip(tasks, searches))]


def family(workload: Workload, target: Target) -> str:
    """Which tasks reach comparable throughput: those lowered by one template in one dtype. Dense, matmul and
    batch_matmul are one GEMM template: compared with their own op only, BERT's attention products had as peers
    only each other, all slow alike after their few trials (91 to 152 GFLOPS on an Intel AVX-512 host, where the
    dense layers beside them ran at 207), so none looked as if it had room to gain."""
    return f"{template(workload, target).__name__.rsplit('.', 1)[-1]} {workload.dtype}"


def best_seconds(result: TuneResult) -> tuple[float, ...]:
    """The best median seconds after each trial of a job; inf until its first ok measurement."""
    return tuple(itertools.accumulate((r.median if r.ok else math.inf for _, r in result.measured), min))


def progress(tasks: Sequence[TuningTask], searches: Sequence[JobSearch], exhausted: set[int],
             budget: int) -> TasksProgress:
    known = histories(tasks, searches, exhausted)
    rows = tuple(TaskProgress(task.workload.key, task.weight, h.trials,
                              search.result.best[1].gflops if search.result.best else 0.0,
                              h.seconds if math.isfinite(h.seconds) else None)
                 for task, search, h in zip(tasks, searches, known))
    return TasksProgress(rows, sum(h.trials for h in known), budget, model_latency(known))
