"""The REST API (DESIGN.md): jobs, best configs, workloads, workers, health; `create_app` builds it
over one database and, when given, starts and stops the job runner with the app."""
from __future__ import annotations

import hmac
import socket
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path as FilePath

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Path, Query
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from sqlalchemy import text

from db import Database, Job
from db.queue import JobQueue
from search_space import Workload, WorkloadError, format_program, host_target, lower
from search_space.workload import OPS

from .api_models import (MAX_TRIALS, JobDetail, JobIn, JobOut, OpOut, RecordOut, ReferenceOut, RunnerOut, WorkersOut,
                         WorkloadsOut, parse_target)
from .numpy_reference import NumpyReference
from .ray_nodes import ray_nodes
from .runner import Runner

JobId = Path(ge=1, le=2**31 - 1)
STATIC = FilePath(__file__).parent / "static"


def job_out(job: Job, progress: tuple[int, float] | None) -> dict:
    done, best = progress or (0, 0.0)
    return {"id": job.id, "workload": job.workload.key, "op": job.workload.op, "params": job.workload.p,
            "target": str(job.target), "tuner": job.tuner, "trials": job.trials, "status": job.status,
            "created_at": job.created_at, "started_at": job.started_at, "finished_at": job.finished_at,
            "error": job.error, "trials_done": done, "best_gflops": best or None}


def bearer(token: str | None):
    """A dependency refusing a request without `Authorization: Bearer <token>` (none when token is unset)."""
    scheme = HTTPBearer(auto_error=False)

    def check(credentials: HTTPAuthorizationCredentials | None = Depends(scheme)) -> None:
        if token and (credentials is None or not hmac.compare_digest(credentials.credentials.encode(), token.encode())):
            raise HTTPException(401, "a valid 'Authorization: Bearer <token>' header is required",
                                headers={"WWW-Authenticate": "Bearer"})
    return check


def create_app(database: Database, runner: Runner | None = None, token: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_):
        if runner:
            runner.start()
        yield
        if runner:
            runner.close()

    app = FastAPI(title="tensortune", version="0.1.0", lifespan=lifespan)
    queue = JobQueue(database)
    reference = NumpyReference()
    writer = [Depends(bearer(token))]

    def known(job_id: int) -> Job:
        try:
            return database.job(job_id)
        except KeyError:
            raise HTTPException(404, f"no job {job_id}") from None

    @app.post("/api/jobs", status_code=201, response_model=JobOut, dependencies=writer)
    def submit(request: JobIn):
        job_id = database.create_job(request.workload.workload(), request.target, request.tuner, request.trials)
        return job_out(database.job(job_id), None)

    @app.get("/api/jobs", response_model=list[JobOut])
    def jobs(limit: int = Query(100, ge=1, le=1000)):
        found = queue.jobs(limit)
        progress = queue.progress([job.id for job in found])
        return [job_out(job, progress.get(job.id)) for job in found]

    @app.get("/api/jobs/{job_id}", response_model=JobDetail, responses={404: {"description": "no such job"}})
    def job(job_id: int = JobId):
        found = known(job_id)
        records = database.job_records(job_id)
        gflops = [r.result.gflops for r in records]
        best = max(records, key=lambda r: r.result.gflops if r.result.ok else -1.0, default=None)
        best_ok = best if best is not None and best.result.ok else None
        return {**job_out(found, (len(records), max(gflops, default=0.0))),
                "curve": np.maximum.accumulate(gflops).tolist() if gflops else [],
                "candidates": [{"gflops": r.result.gflops, "outcome": r.result.outcome.value} for r in records],
                "outcomes": Counter(r.result.outcome.value for r in records),
                "best_config": {"index": best_ok.input.config.index, "knobs": best_ok.input.config.to_dict()}
                if best_ok else None,
                "best_program": format_program(lower(found.workload, found.target, best_ok.input.config))
                if best_ok else None}

    @app.get("/api/jobs/{job_id}/reference", response_model=ReferenceOut, responses={404: {"description": "no such job"}})
    def numpy_reference(job_id: int = JobId):
        """NumPy's GFLOPS on the job's workload with the target's threads: the dashboard's reference line."""
        found = known(job_id)
        threads = found.target.threads
        return {"workload": found.workload.key, "threads": threads,
                "numpy_gflops": reference.gflops(found.workload, threads)}

    @app.post("/api/jobs/{job_id}/cancel", response_model=JobOut, dependencies=writer,
              responses={404: {"description": "no such job"}, 409: {"description": "the job has finished"}})
    def cancel(job_id: int = JobId):
        known(job_id)
        found = queue.cancel(job_id)
        if found.status != "cancelled":
            raise HTTPException(409, f"job {job_id} is already {found.status}")
        return job_out(found, queue.progress([job_id]).get(job_id))

    @app.get("/api/best", response_model=RecordOut, responses={404: {"description": "nothing measured ok"}})
    def best(workload: str = Query(max_length=512, examples=["matmul(M=64,N=64,K=64,dtype=float32)"]),
             target: str = Query("llvm", max_length=256)):
        try:
            chosen, on = Workload.from_key(workload), parse_target(target)
        except (WorkloadError, ValueError) as error:
            raise HTTPException(422, str(error)) from None
        found = database.best(chosen, on)
        if not found:
            raise HTTPException(404, f"no config of {chosen.key} measured ok on {on}")
        record = found[0]
        return {"id": record.id, "job_id": record.job_id, "workload": chosen.key, "target": str(on),
                "config": {"index": record.input.config.index, "knobs": record.input.config.to_dict()},
                "gflops": record.result.gflops, "median_seconds": record.result.median,
                "samples": list(record.result.samples), "worker": record.result.worker, "host": record.result.host}

    @app.get("/api/workloads", response_model=WorkloadsOut)
    def workloads():
        ops = [OpOut(op=name, params=list(spec.dims), options=spec.options) for name, spec in OPS.items()]
        return {"ops": ops, "tuned": [{"workload": w.key, "target": str(t)} for w, t in database.pairs()]}

    @app.get("/api/workers", response_model=WorkersOut)
    def workers():
        slots = runner.slots if runner else []
        return {"host": socket.gethostname(), "cpu": host_target().model, "pool": runner.options.workers if runner else "",
                "runners": [RunnerOut(name=s.name, job_id=s.job_id, busy=s.job_id is not None, candidates=s.candidates)
                            for s in slots],
                "ray_nodes": ray_nodes()}

    @app.get("/healthz")
    def healthz():
        with database.read_engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return {"status": "ok", "database": str(database), "max_trials": MAX_TRIALS}

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index():
        return (STATIC / "index.html").read_text()

    return app
