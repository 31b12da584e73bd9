"""The job runner: threads that claim queued jobs from the database and tune them on a pool.

Each thread owns its measurement pool, so jobs on different threads never share worker
processes. A job the service stops for shutdown goes back to the queue (it resumes from its
records); a job the user cancels stops after its batch in flight and stays `cancelled`. A job whose
target no worker host of the pool serves goes back to the queue too (service/host_waits.py): until a Ray node
of its GPU architecture or CPU model joins, or, on the local pool, a CPU model other than this host's until a
service on such a host takes it.

A model job is tuned by its tasks' scheduler (tuner/scheduler.py). The service tunes presets only
(frontend/presets.py; never a file a request names), their tasks extracted here with PyTorch, which
is imported only then: the service starts, and runs single jobs, without it.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from db import Database, Job
from db.job_locks import Claim
from db.outage import Backoff, unavailable, wait_until_reachable
from db.queue import JobQueue
from workers.pool import NoWorkerHost
from workers.task import MeasureOptions

from .host_waits import HOST_BACKOFF, HostWaits
from .measurers import default_workers, make_measurer

if TYPE_CHECKING:
    from tuner.scheduler import TasksProgress, TuningTask

log = logging.getLogger("tensortune.runner")
_EXTRACTING = threading.Lock()  # torch.compile traces one model at a time


class ModelsNeedTorch(RuntimeError):
    """This service has no PyTorch, so it can neither extract nor tune a model's tasks."""

    def __init__(self):
        super().__init__('model jobs need PyTorch where the service runs: pip install -e ".[torch]"')


class UnknownPreset(ValueError):
    """A model job names no preset, or one this service cannot build (an hf- preset without transformers)."""


def preset_tasks(name: str | None) -> tuple[TuningTask, ...]:
    """The tuning tasks of preset `name`, extracted once per process (seconds each): submitting a model job,
    running it and showing its tasks' weights all need them."""
    if importlib.util.find_spec("torch") is None:
        raise ModelsNeedTorch()
    from frontend.presets import PRESETS

    if name not in PRESETS:
        raise UnknownPreset(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    with _EXTRACTING:
        return _extracted_tasks(name)


def runnable_models() -> tuple[str, ...] | None:
    """The model jobs this service can run: its presets now (a registry others may extend); None (all, to fail
    them saying why) without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    from frontend.presets import PRESETS

    return tuple(PRESETS)


@functools.cache
def _extracted_tasks(name: str) -> tuple[TuningTask, ...]:
    from frontend import extract_tasks
    from frontend.presets import PRESETS, ModelError

    try:
        return tuple(extract_tasks(*PRESETS[name]()))
    except ModelError as error:
        raise UnknownPreset(str(error)) from None


@dataclass(frozen=True)
class RunnerOptions:
    threads: int = 1  # jobs run at once; SQLite keeps one runner process, any number of threads
    workers: str = field(default_factory=default_workers)
    poll_seconds: float = 0.5  # how often an idle thread looks at the queue
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    host_backoff: Backoff = HOST_BACKOFF  # how often a job waiting for a worker host looks for one


@dataclass
class Slot:
    """What one runner thread is doing (GET /api/workers shows it)."""

    name: str
    job_id: int | None = None
    candidates: int = 0  # measured by this thread since the service started
    pool: object = None  # the thread's measurement pool, made at its first job


class Runner:
    def __init__(self, database: Database, options: RunnerOptions = RunnerOptions()):
        self.database = database
        self.options = options
        self.queue = JobQueue(database)
        self.slots = [Slot(f"runner-{n}") for n in range(options.threads)]
        self.waits = HostWaits(options.host_backoff)
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for slot in self.slots:
            thread = threading.Thread(target=self._serve, args=(slot,), name=slot.name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self, timeout: float | None = None) -> None:
        """Stop claiming; running jobs stop after their batch in flight and go back to the queue."""
        self._closing.set()
        for thread in self._threads:
            thread.join(timeout)

    def _serve(self, slot: Slot) -> None:
        """Claim and run jobs until closed. A database outage pauses the thread until the database is back;
        no error ends it."""
        while not self._closing.is_set():
            try:
                if not self._next(slot):
                    self._closing.wait(self.options.poll_seconds)
            except Exception as error:
                reason = unavailable(error)
                if reason is None:  # a bug of ours: said, and the thread goes on
                    log.exception("%s: unexpected error", slot.name)
                    self._closing.wait(self.options.poll_seconds)
                else:
                    wait_until_reachable(self.database.ping, reason, slot.name, stop=self._closing)
        if slot.pool is not None:
            slot.pool.close()

    def _next(self, slot: Slot) -> bool:
        """Claim the oldest job and run it; False when there was none. An error fails the job (with a fresh
        pool for the next); an outage hands it back to whoever claims it next, which resumes it from its
        records; so does a pool with no worker host for its target, the job waiting until one joins."""
        from tuner.tune import JobFailed, failure_reason  # here: the CLI imports this module, and tuner is slow

        self._look_for_hosts(slot)
        models = runnable_models() if self.queue.model_jobs_active() else ()
        claim = self.queue.claim(models, self.waits.job_ids())
        if claim is None:
            return False
        try:
            slot.pool = slot.pool or make_measurer(self.options.workers)
            self._run(slot, claim)
        except NoWorkerHost as error:
            self._move(claim, "queued", waiting=error.awaited)
            self.waits.add(claim.job_id, error.target)
            log.warning("%s: job %d waits for %s to join: %s", slot.name, claim.job_id, error.awaited, error)
        except Exception as error:
            if unavailable(error):
                log.warning("%s: job %d paused by the database; it resumes from its records", slot.name, claim.job_id)
                raise
            if not isinstance(error, JobFailed):  # failed outside the search loop
                error = JobFailed(claim.job_id, failure_reason(error))
                self._move(claim, "failed", error.reason)
            log.error("%s", error)
            if slot.pool is not None:
                slot.pool.close()
            slot.pool = None
        finally:
            claim.release()
            slot.job_id = None
        return True

    def _look_for_hosts(self, slot: Slot) -> None:
        """Look, where due, for the hosts of the jobs put back to wait: a job whose host has joined may be claimed
        again; one no longer queued (cancelled, or taken by another service) is forgotten."""
        for wait in self.waits.due():
            if self.database.job(wait.job_id).status == "queued":
                slot.pool = slot.pool or make_measurer(self.options.workers)
                try:
                    slot.pool.require_host(wait.target)
                except NoWorkerHost:
                    continue
            self.waits.forget(wait.job_id)

    def _run(self, slot: Slot, claim: Claim) -> None:
        job = self.database.job(claim.job_id)
        slot.pool.require_host(job.target)
        slot.job_id = job.id
        shutdown = []

        def stop() -> bool:
            if self._closing.is_set():
                shutdown.append(True)
                return True
            return self.database.job(job.id).status == "cancelled"

        tasks = self.database.children(job.id)
        if tasks:
            self._tune_model(slot, claim, job, tasks, stop)
        else:
            self._tune(slot, claim, job, stop)
        if shutdown:
            self._move(claim, "queued")

    def _tune(self, slot: Slot, claim: Claim, job: Job, stop: Callable[[], bool]) -> None:
        from tuner.tune import tune

        def counted(*_) -> None:
            slot.candidates += 1

        tune(job.workload, job.target, job.trials, job.tuner, self.database, slot.pool, measure=self.options.measure,
             on_result=counted, job=claim, stop=stop)

    def _tune_model(self, slot: Slot, claim: Claim, job: Job, tasks: list[Job], stop: Callable[[], bool]) -> None:
        """Spend the model job's budget over its tasks, resuming what their jobs measured."""
        from tuner.scheduler import tune_tasks

        tuning = preset_tasks(job.model)
        if {task.workload for task in tuning} != {task.workload for task in tasks}:
            raise ValueError(f"the tasks of preset {job.model} are no longer those of model job {job.id}; "
                             "submit it again")
        measured: int | None = None

        def counted(progress: TasksProgress) -> None:
            nonlocal measured
            if measured is not None:  # the first report counts what earlier runs measured
                slot.candidates += progress.trials - measured
            measured = progress.trials

        tune_tasks(tuning, job.target, job.trials, self.database, job.tuner, slot.pool, measure=self.options.measure,
                   on_progress=counted, stop=stop, name=job.model, job=claim)

    def _move(self, claim: Claim, status: str, reason: str = "", waiting: str = "") -> None:
        """Move a claimed job to `status`, a model job with its tasks' jobs."""
        database = self.database.fenced(claim)
        for task in database.children(claim.job_id):
            database.update_job(task.id, status, reason, waiting=waiting)
        database.update_job(claim.job_id, status, reason, waiting=waiting)
