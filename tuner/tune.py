"""`tune(workload, ...)`: the search loop. A tuner proposes, a pool measures, the database keeps
every result as it arrives, and a job interrupted at any point resumes from what it recorded.
`JobSearch` runs a job a step at a time, for the scheduler of a model's tasks (tuner/scheduler.py).
"""
from __future__ import annotations

import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from db import Database
from db.matching import fitted_ways, most_similar
from db.job_locks import Claim
from db.outage import unavailable, wait_until_reachable
from db.queries import applies, stored_targets
from db.queue import JobQueue
from search_space import Config, ConfigSpace, Target, Workload, get_space, seed_configs
from search_space.templates import relaid_knobs, template
from workers import MeasureInput, MeasureResult, best_curve, typical
from workers.pool import NoWorkerHost, Pool, make_pool
from workers.task import MeasureOptions, Task
from workers.untuned import untuned_config

from . import TUNERS, Tuner
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
    # start from the op's other shapes in the database: the best config of each measured first, and (xgb) a
    # base cost model of their measurements
    transfer: bool = True
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    # start from the database's other measurements of this workload on this target: none of their configs is
    # measured again, and the tuner (xgb's cost model) has observed them all before its first proposal
    known: bool = True

    def __post_init__(self):
        if self.tuner not in TUNERS:
            raise ValueError(f"unknown tuner {self.tuner!r}; tuners: {', '.join(TUNERS)}")
        if not 1 <= self.trials <= 100_000:
            raise ValueError(f"trials must be in 1..100000, got {self.trials}")


PHASES = ("measure", "tuner", "record")
# A job's last measurements measure its fastest configs again, so that the best stored config is one that runs
# fast, not one that was once timed in a quiet moment (db.queries.best_records takes a config's typical time).
FINALISTS = 3  # the fastest configs, by their typical time, measured again as one batch a round
AGAIN = 2  # measurements of a finalist beyond its first


@contextmanager
def timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    """Add the wall time of the block to `seconds[phase]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] += time.perf_counter() - start


def time_split(seconds: dict[str, float]) -> str:
    """One line: where a run's time went, the tuner's share of it first."""
    total = sum(seconds.values())
    share = seconds["tuner"] / total if total else 0.0
    return (f"tuner {seconds['tuner']:.1f} s ({share:.0%} of {total:.1f} s), measuring {seconds['measure']:.1f} s, "
            f"writing records {seconds['record']:.1f} s")


@dataclass
class TuneResult:
    job_id: int
    measured: list[tuple[MeasureInput, MeasureResult]]  # this job's, resumed ones first
    resumed: int  # how many were loaded from the database rather than measured now
    known: int = 0  # other jobs' measurements of the workload on the target the search started from
    # wall seconds of this run by who spent them: the pool measuring, the tuner (model fits, searches, the
    # transfer history), the database writing records
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def best(self) -> tuple[MeasureInput, MeasureResult] | None:
        """The config fastest at its typical time (`by_typical_time`), as that measurement."""
        ranked = by_typical_time(self.measured)
        return ranked[0][0] if ranked else None

    @property
    def curve(self) -> list[float]:
        """Best GFLOPS after each trial, each config at its typical time by then (`workers.best_so_far`)."""
        return best_curve(self.measured)


def history(database: Database, workload: Workload, target: Target, limit: int = 512, others: bool = True
            ) -> list[tuple]:
    """(feature matrix, GFLOPS) per shape of the op on this target (with `others`, those other than the
    workload's own), for the xgb tuner's base model."""
    found = []
    for other, records in database.op_records(workload.op, target, exclude=workload if others else None).items():
        space = get_space(other, target)
        records = random.Random(0).sample(records, min(limit, len(records)))
        x = np.stack([features(other, target, space, r.input.config, "itervar") for r in records])
        found.append((x, np.array([r.result.gflops for r in records])))
    return found


BORROWED = 8  # other shapes whose best config a new job measures first, the nearest in size first
PROVEN = 16  # measurements of a shape (four batches) after which a job borrows its best without measuring the seeds


def fitted_bests(database: Database, workload: Workload, space: ConfigSpace, target: Target,
                 shapes: Iterable[tuple[Workload, Target]], limit: int | None = None) -> list[Config]:
    """The best stored config of each (shape, stored target) that fits into the workload's `space` on `target`,
    fitted (a config of another target with its vectors scaled to this one's, a 1-thread one in each parallel way, a
    shape laid out otherwise's relaid), each once, in order; the first `limit` of them."""
    found: dict[int, Config] = {}
    for shape, stored in shapes:
        for best in database.best(shape, stored):
            for fitted in fitted_from(space, workload, target, shape, stored, best.input.config):
                found.setdefault(fitted.index, fitted)
        if limit is not None and len(found) >= limit:
            break
    return list(found.values())[:limit]


def fitted_from(space: ConfigSpace, workload: Workload, target: Target, shape: Workload, stored: Target,
                config: Config) -> list[Config]:
    """A config of `shape` measured on `stored`, in the workload's `space` on `target`: its vectors scaled to this
    target's, a 1-thread one in each parallel way, a shape laid out otherwise's relaid (db.matching.fitted_ways)."""
    splits = getattr(template(shape, target), "VECTOR_SPLITS", ())
    vectors = None if str(stored) == str(target) else (stored, target, splits)
    relaid = lambda knobs: relaid_knobs(knobs, shape, workload, target)  # noqa: E731
    return fitted_ways(space, config, stored, target, vectors, relaid)


def borrowed_configs(database: Database, workload: Workload, target: Target, space: ConfigSpace) -> list[Config]:
    """The best stored config of each other shape of the op with the same options and dtype on the target (up to
    BORROWED, the nearest in size first), fitted into `space`: what a new shape (another sequence length) measures
    before its tuner's own proposals, so that its first configs are the ones known to be good."""
    nearest = database.nearest_shapes(workload, target)[:BORROWED]
    return fitted_bests(database, workload, space, target, ((other, target) for other in nearest))


def transplanted_configs(database: Database, workload: Workload, target: Target, space: ConfigSpace) -> list[Config]:
    """For a target that knows nothing of the op: the best stored configs of the workload and of its nearest shapes
    on the other targets of its kind, the most similar first (db.matching.similarity), their vectors scaled to this
    target's; up to BORROWED."""
    with database.read_sessions() as session:
        stored = stored_targets(session, target.kind)
    shapes = ((shape, other) for other in most_similar(target, stored)
              for shape in [workload] + database.nearest_shapes(workload, other)[:BORROWED])
    return fitted_bests(database, workload, space, target, shapes, BORROWED)


def by_typical_time(measured: Sequence[tuple[MeasureInput, MeasureResult]]
                    ) -> list[tuple[tuple[MeasureInput, MeasureResult], int]]:
    """Each config with an `ok` measurement, as its typical one (`workers.typical`, the upper median) and how many it
    has, fastest first; the earlier measurement wins a tie."""
    runs: dict[int, list[tuple[int, MeasureInput, MeasureResult]]] = {}
    for order, (measure_input, result) in enumerate(measured):
        if result.ok:
            runs.setdefault(measure_input.config.index, []).append((order, measure_input, result))
    typical_runs = [(typical(found, lambda run: (run[2].median, run[0])), len(found)) for found in runs.values()]
    return [((run[1], run[2]), count) for run, count in sorted(typical_runs, key=lambda t: (t[0][2].median, t[0][0]))]


def confirmations(trials: int, tasks: int = 1) -> int:
    """Measurements a job keeps of its budget, per task, for its finalists: FINALISTS · AGAIN, never more than an
    eighth of the budget, and none where that is less than one more of each finalist (ResNet-18's 16 tasks in 400
    trials keep 3 each: their finalists measured once more; a budget under 24 trials a task keeps none)."""
    kept = min(FINALISTS * AGAIN, trials // (8 * tasks))
    return kept if kept >= FINALISTS else 0


class Borrowing:
    """A tuner whose proposals start with `first` and those `offer`ed since (each once, those it has not seen),
    then go on as its own."""

    def __init__(self, tuner: Tuner, first: Sequence[Config]):
        self.tuner, self.first = tuner, []
        self.offer(first)

    def offer(self, configs: Sequence[Config]) -> None:
        """Propose `configs` after those queued already, each that is neither measured nor queued."""
        queued = {config.index for config in self.first} | self.tuner.visited
        self.first += [config for config in {c.index: c for c in configs}.values() if config.index not in queued]

    def propose(self, n: int) -> list[Config]:
        taken, self.first = self.first[:n], self.first[n:]
        if len(taken) == n:
            return taken
        chosen = {config.index for config in taken}
        return taken + [config for config in self.tuner.propose(n - len(taken)) if config.index not in chosen]

    def observe(self, configs: Sequence[Config], results: Sequence[MeasureResult]) -> None:
        self.tuner.observe(configs, results)

    def has_next(self) -> bool:
        return self.tuner.has_next()


def make_tuner(workload: Workload, target: Target, options: TuneOptions, past: Sequence[tuple] = (),
               space: ConfigSpace | None = None):
    """The tuner the options name, over `space` (default: the workload's whole space); an xgb tuner
    starts from a base model of `past` (see `history`)."""
    space = space or get_space(workload, target)
    if options.tuner != "xgb":
        return TUNERS[options.tuner](space, options.seed)
    return TUNERS["xgb"](space, options.seed, workload=workload, target=target,
                         options=XGBOptions(model=CostModelOptions()), history=past)


class JobFailed(RuntimeError):
    """A job ended by an error; the job is `failed` in the database with `reason`, its one-line account."""

    def __init__(self, job_id: int, reason: str):
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id, self.reason = job_id, reason


def failure_reason(error: BaseException) -> str:
    """What ended a job, on one line: the error's kind and the first line of its message."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


def tune(workload: Workload, target: Target | str = "llvm", trials: int = 64, tuner: str = "xgb",
         db: Database | str | None = None, pool: Pool | str = "local", *, batch: int = 4,
         early_stopping: int | None = None, seed: int = 0, transfer: bool = True,
         measure: MeasureOptions = MeasureOptions(), known: bool = True,
         on_result: Callable[[MeasureInput, MeasureResult], None] | None = None,
         job: Claim | None = None, stop: Callable[[], bool] = lambda: False,
         on_wait: Callable[[str], None] | None = None,
         on_start: Callable[[TuneResult], None] | None = None) -> TuneResult:
    """Tune until `trials` configs of the job are measured (or early stopping ends it).

    Running the same request again resumes an unfinished job: it reloads what the job measured,
    refits the model on it, and measures nothing twice; with `known`, a job also starts from the workload's
    other records on the target, measuring none of their configs again. It raises `db.queue.JobBusy` while
    another live process runs that job. `job` is a job the caller has claimed (the service's runner does);
    `stop()` is asked between batches and ends the job `cancelled`. An error ends the job `failed` and
    raises JobFailed. A workload with no template for the target raises NoTemplate before any job exists; a pool
    with no worker host for the target raises NoWorkerHost, the job resumable (service/host_waits.py waits).
    `on_start` hears of the job once it is this caller's and its records are loaded (what it resumes from: the
    job's id, its resumed results and their best), before anything is measured.

    A database outage raises, unless `on_wait` is given: then tune() waits for the database, telling
    `on_wait` why, and resumes the job from its records (what was measured but not yet written is
    measured again, so each config is recorded once)."""
    options = TuneOptions(trials, tuner, batch, early_stopping, seed, transfer, measure, known)
    target = Target.parse(target)
    get_space(workload, target)
    database = db if isinstance(db, Database) else Database(db)
    while True:
        try:
            claim = job or JobQueue(database).own(workload, target, options.tuner, options.trials)
            try:
                return run_job(claim.job_id, workload, target, options, database.fenced(claim), pool, on_result, stop,
                               on_start)
            finally:
                if job is None:
                    claim.release()
        except Exception as error:
            reason = unavailable(error)
            if reason is None or on_wait is None or job is not None:
                raise
            wait_until_reachable(database.ping, reason, "tuning", on_wait)


def run_job(job_id: int, workload: Workload, target: Target, options: TuneOptions, database: Database, pool: Pool | str,
            on_result: Callable[[MeasureInput, MeasureResult], None] | None, stop: Callable[[], bool],
            on_start: Callable[[TuneResult], None] | None = None) -> TuneResult:
    """Run a job held by the caller, writing through `database` (fenced by the job's lock)."""
    with ending_on_error(job_id, lambda status, reason: database.update_job(job_id, status, reason)):
        database.update_job(job_id, "running")
        job = JobSearch(job_id, workload, target, options, database, on_result)
        if on_start:
            on_start(job.result)
        with measuring(pool) as measurer:
            stopped = job.step(measurer, options.trials - confirmations(options.trials), stop)
            stopped = stopped or job.confirm(measurer, options.trials, stop)
    database.finish_job(job_id, "cancelled" if stopped else "done")
    return job.result


@contextmanager
def ending_on_error(job_id: int, end: Callable[[str, str], None]) -> Iterator[None]:
    """Hand an error's end of job `job_id` to `end(status, reason)`: an interrupt cancels it (its records are
    kept, it stays resumable); any other error fails it and raises JobFailed; a database outage, through which
    nothing can be written, and a pool with no worker host for the target yet (NoWorkerHost: a Ray cluster's GPU
    node may join later) raise as they are, the job left for whoever waits for them to resume from its records."""
    try:
        yield
    except KeyboardInterrupt as error:
        end("cancelled", failure_reason(error))
        raise
    except Exception as error:
        if unavailable(error) or isinstance(error, NoWorkerHost):
            raise
        reason = failure_reason(error)
        end("failed", reason)
        raise JobFailed(job_id, reason) from error


@contextmanager
def measuring(pool: Pool | str) -> Iterator[Pool]:
    """The pool given, or one made from its name and closed afterwards."""
    if not isinstance(pool, str):
        yield pool
        return
    made = make_pool(pool)
    try:
        yield made
    finally:
        made.close()


class JobSearch:
    """One job's search, measured a few trials at a time (`step`), keeping its tuner between steps. It starts
    from the job's records (and, with `options.known`, the workload's other records on the target); its tuner
    is built at the first step, from them and, with `options.transfer`, from the op's other shapes in the
    database: their best configs are measured first, then the template's fallback (so a tuned config is never
    worse than none), and xgb's cost model starts from their measurements (so a model's task tuned later,
    another sequence length of a layer, learns from the tasks measured before it). Where no other shape of the
    op is known on the target, the fallback is followed by the best configs of other targets, scaled to this
    one's vectors (`transplanted_configs`). The template's seeds, the register blocks an analytic model of the
    target picks (search_space.seed_configs), come next unless a shape it borrows from has been searched (PROVEN
    measurements): so a first batch on a new CPU is already good, and a model's later tasks do not start from
    the other tasks' first guesses only (on an Intel AVX-512 host, bert-layer's 768x768 dense, which borrowed
    the others' fallbacks and then followed xgb, ended at 152 GFLOPS in 32 trials; measuring the seeds, at 199 in 24)."""

    def __init__(self, job_id: int, workload: Workload, target: Target, options: TuneOptions, database: Database,
                 on_result: Callable[[MeasureInput, MeasureResult], None] | None = None):
        self.workload, self.target, self.options, self.database, self.on_result = (
            workload, target, options, database, on_result)
        done = [(r.input, r.result) for r in database.job_records(job_id) if applies(r)]  # none of another version
        known = database.known_records(workload, target, job_id) if options.known else []
        self.known = [(r.input, r.result) for r in known]
        self.result = TuneResult(job_id, done, len(done), len(known))
        self.tuner: Tuner | None = None
        self.search: Borrowing | None = None  # the tuner, proposing the other shapes' best configs first

    def _built_search(self) -> Borrowing:
        if self.search is None:
            transfer = self.options.transfer
            xgb_transfer = transfer and self.options.tuner == "xgb"
            past = history(self.database, self.workload, self.target) if xgb_transfer else []
            self.tuner = make_tuner(self.workload, self.target, self.options, past)
            seen = self.known + self.result.measured
            if seen:
                self.tuner.observe([i.config for i, _ in seen], [r for _, r in seen])
            space = self.tuner.space
            borrowed = borrowed_configs(self.database, self.workload, self.target, space) if transfer else []
            default = untuned_config(self.workload, self.target)  # never tune to worse than not tuning
            new_here = transfer and not borrowed and not seen  # nothing of the op known on this target
            unproven = transfer and not seen and not (borrowed and self._proven_shape())
            seeds = ((transplanted_configs(self.database, self.workload, self.target, space) if new_here else [])
                     + (seed_configs(self.workload, self.target) if unproven else []))
            self.search = Borrowing(self.tuner, borrowed + [default] + seeds)
        return self.search

    def _proven_shape(self) -> bool:
        """Whether a shape this job borrows from has been searched (PROVEN measurements on the target)."""
        nearest = self.database.nearest_shapes(self.workload, self.target)[:BORROWED]
        return any(self.database.count(shape, self.target) >= PROVEN for shape in nearest)

    def offer(self, configs: Sequence[Config]) -> None:
        """Measure `configs` (of this job's space: the other tasks' bests) ahead of the tuner's own proposals, each
        that the job has not measured."""
        with timed(self.result.seconds, "tuner"):
            self._built_search().offer(configs)

    def _record(self, measure_input: MeasureInput, measured: MeasureResult) -> None:
        self.database.record(measure_input, measured, self.result.job_id)
        if self.on_result:
            self.on_result(measure_input, measured)

    def step(self, pool: Pool, trials: int, stop: Callable[[], bool] = lambda: False) -> bool:
        """Measure until the job holds `trials` results (see `search_loop`); whether `stop()` ended it."""
        options = replace(self.options, trials=trials)
        with timed(self.result.seconds, "tuner"):
            search = self._built_search()
        return search_loop(search, pool, self.workload, self.target, options, self.result.measured,
                           self._record, stop, self.result.seconds)

    def confirm(self, pool: Pool, trials: int, stop: Callable[[], bool] = lambda: False) -> bool:
        """Measure the FINALISTS configs fastest at their typical time again, those with fewer than 1 + AGAIN
        measurements (this job's and the others' it started from), a batch a round, until they all have them or
        the job holds `trials` results: a finalist that was timed fast by luck falls back, and the config behind
        it is measured again in its place. Returns whether `stop()` (asked before each round) ended it."""
        while (left := trials - len(self.result.measured)) > 0:
            finalists = [measured[0].config for measured, count in
                         by_typical_time(self.known + self.result.measured)[:FINALISTS] if count <= AGAIN][:left]
            if not finalists:
                return False
            if stop():
                return True
            inputs = [MeasureInput(self.workload, self.target, config) for config in finalists]
            with timed(self.result.seconds, "measure"):
                results = pool.measure([Task.of(i) for i in inputs], self.options.measure)
            for measure_input, result in zip(inputs, results):
                with timed(self.result.seconds, "record"):
                    self._record(measure_input, result)
                self.result.measured.append((measure_input, result))
        return False


def search_loop(search, pool, workload: Workload, target: Target, options: TuneOptions,
                measured: list[tuple[MeasureInput, MeasureResult]],
                sink: Callable[[MeasureInput, MeasureResult], None] = lambda i, r: None,
                stop: Callable[[], bool] = lambda: False, seconds: dict[str, float] | None = None) -> bool:
    """Propose, measure, hand each result to `sink` (the database) before the tuner sees the batch;
    until `measured` holds options.trials results, the space is exhausted, early stopping, or `stop()`
    (asked before each batch, so the batch in flight is always finished and recorded). Each phase's wall
    time is added to `seconds` (see TuneResult.seconds). Returns whether `stop()` ended it."""
    seconds = dict.fromkeys(PHASES, 0.0) if seconds is None else seconds
    since_best, best = 0, max((r.gflops for _, r in measured), default=0.0)
    while len(measured) < options.trials and search.has_next():
        if options.early_stopping and since_best >= options.early_stopping:
            return False
        if stop():
            return True
        with timed(seconds, "tuner"):
            configs = search.propose(min(options.batch, options.trials - len(measured)))
        if not configs:
            return False
        inputs = [MeasureInput(workload, target, c) for c in configs]
        with timed(seconds, "measure"):
            results = pool.measure([Task.of(i) for i in inputs], options.measure)
        for measure_input, result in zip(inputs, results):
            with timed(seconds, "record"):
                sink(measure_input, result)
            measured.append((measure_input, result))
            since_best = 0 if result.gflops > best else since_best + 1
            best = max(best, result.gflops)
        with timed(seconds, "tuner"):
            search.observe(configs, results)
    return False
