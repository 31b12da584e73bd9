"""The job runner: threads that claim queued jobs from the database and tune them on a pool.

Each thread owns its measurement pool, so jobs on different threads never share worker
processes. A job the service stops for shutdown goes back to the queue (it resumes from its
records); a job the user cancels stops after its batch in flight and stays `cancelled`.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from db import Database
from db.queue import JobQueue
from workers.task import MeasureOptions

log = logging.getLogger("tensortune.runner")


def default_workers() -> str:
    """Ray when RAY_ADDRESS names a cluster, else this machine's cores."""
    return "ray" if os.environ.get("RAY_ADDRESS") else "local"


def make_measurer(workers: str):
    """`local`, `ray` (RAY_ADDRESS or a local cluster) or a Ray cluster address."""
    from workers.pool import RayPoolOptions, make_pool

    if workers == "local":
        return make_pool("local")
    return make_pool("ray", RayPoolOptions(address=None if workers == "ray" else workers))


@dataclass(frozen=True)
class RunnerOptions:
    threads: int = 1  # jobs run at once; SQLite keeps one runner process, any number of threads
    workers: str = field(default_factory=default_workers)
    poll_seconds: float = 0.5  # how often an idle thread looks at the queue
    measure: MeasureOptions = field(default_factory=MeasureOptions)


@dataclass
class Slot:
    """What one runner thread is doing (GET /api/workers shows it)."""

    name: str
    job_id: int | None = None
    candidates: int = 0  # measured by this thread since the service started


class Runner:
    def __init__(self, database: Database, options: RunnerOptions = RunnerOptions()):
        self.database = database
        self.options = options
        self.queue = JobQueue(database)
        self.slots = [Slot(f"runner-{n}") for n in range(options.threads)]
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
        pool = None
        try:
            while not self._closing.is_set():
                claim = self.queue.claim()
                if claim is None:
                    self._closing.wait(self.options.poll_seconds)
                    continue
                try:
                    pool = pool or make_measurer(self.options.workers)
                    self._run(slot, claim.job_id, pool)
                except Exception as error:  # the job is failed with its error; a fresh pool for the next
                    log.exception("job %d failed", claim.job_id)
                    if self.database.job(claim.job_id).status == "running":  # failed before tune started
                        self.database.update_job(claim.job_id, "failed", f"{type(error).__name__}: {error}")
                    if pool is not None:
                        pool.close()
                    pool = None
                finally:
                    claim.release()
                    slot.job_id = None
        finally:
            if pool is not None:
                pool.close()

    def _run(self, slot: Slot, job_id: int, pool) -> None:
        from tuner.tune import tune

        job = self.database.job(job_id)
        slot.job_id = job_id
        shutdown = []

        def stop() -> bool:
            if self._closing.is_set():
                shutdown.append(True)
                return True
            return self.database.job(job_id).status == "cancelled"

        def counted(*_) -> None:
            slot.candidates += 1

        tune(job.workload, job.target, job.trials, job.tuner, self.database, pool, measure=self.options.measure,
             on_result=counted, job=job_id, stop=stop)
        if shutdown:
            self.database.update_job(job_id, "queued")
