"""The REST API (docs/architecture.md): jobs, best configs, workloads, workers, health; `create_app` builds it
over one database and, when given, starts and stops the job runner with the app."""
from __future__ import annotations

import hmac
import math
import socket
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path as FilePath

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError

from db import Database, HistoryBest, Job, Record
from db.client_requests import ClientJobs, ClientRequest, ClientRequests
from db.history import StoredConfig
from db.outage import unavailable
from db.queries import applies
from db.queue import JobQueue
from search_space import (NoTemplate, Target, Workload, WorkloadError, format_program, get_space, host_target, lower,
                          template_version)
from search_space.workload import OPS
from tuner.allocation import TaskHistory, model_latency
from workers import best_so_far

from .api_models import (MAX_BATCH, MAX_TRIALS, ClientRequestIn, ClientRequestOut, JobDetail, JobIn, JobOut, OpOut,
                         RecordOut, ReferenceOut, RunnerOut, ServedConfigsOut, WorkersOut, WorkloadsOut, parse_target)
from .numpy_reference import NumpyReference
from .ray_nodes import ray_nodes
from .runner import ModelsNeedTorch, Runner, UnknownPreset, preset_tasks

JobId = Path(ge=1, le=2**31 - 1)
STATIC = FilePath(__file__).parent / "static"


def job_out(job: Job, progress: tuple[int, float] | None) -> dict:
    done, best = progress or (0, 0.0)
    return {"id": job.id, "workload": job.workload.key, "op": job.workload.op, "params": job.workload.p,
            "workload_label": job.workload.label, "target": str(job.target), "target_label": job.target.label,
            "tuner": job.tuner, "trials": job.trials, "status": job.status,
            "created_at": job.created_at, "started_at": job.started_at, "finished_at": job.finished_at,
            "error": job.error, "trials_done": done, "best_gflops": None if job.model else (best or None),
            "model": job.model, "parent_id": job.parent_id, "waiting": job.waiting}


def measured_out(records: list[Record]) -> dict:
    return {"candidates": [{"gflops": r.result.gflops, "outcome": r.result.outcome.value} for r in records],
            "outcomes": Counter(r.result.outcome.value for r in records)}


def best_records(records: list[Record]) -> list[Record | None]:
    """After each of a job's records, its best config by then at its typical time (`workers.best_so_far`), as the
    stored best is ranked: a finalist timed fast by luck falls back at the trial that measured it again."""
    return [None if at is None else records[at] for at in best_so_far([(r.input, r.result) for r in records])]


def single_detail(job: Job, records: list[Record]) -> dict:
    """A single job's curve of best GFLOPS, its candidates and its best config so far."""
    bests = best_records(records)
    best_ok = bests[-1] if bests else None
    return {**job_out(job, (len(records), best_ok.result.gflops if best_ok else 0.0)), **measured_out(records),
            "curve": [best.result.gflops if best else 0.0 for best in bests],
            "best_config": {"index": best_ok.input.config.index, "knobs": best_ok.input.config.to_dict()}
            if best_ok else None,
            # a stale record's config may no longer lower: its program is today's template's no more
            "best_program": format_program(lower(job.workload, job.target, best_ok.input.config))
            if best_ok and applies(best_ok) else None}


def model_detail(job: Job, tasks: list[Job], records: dict[int, list[Record]]) -> dict:
    """A model job's tasks and its estimated latency after each trial, over every task's candidates in the
    order they were measured."""
    known = preset_weights(job.model)
    weights = [known.get(task.workload) for task in tasks]
    bests = {task.id: best_records(records[task.id]) for task in tasks}
    measured = sorted((record for task in tasks for record in records[task.id]), key=lambda record: record.id)
    after = {record.id: best for task in tasks for record, best in zip(records[task.id], bests[task.id])}
    curve = latency_curve(tasks, weights, measured, after) if None not in weights else []
    return {**job_out(job, (len(measured), 0.0)), **measured_out(measured), "curve": [], "best_config": None,
            "best_program": None, "latency_curve": curve, "latency_ms": curve[-1] if curve else None,
            "tasks": [task_out(task, weight, records[task.id], bests[task.id])
                      for task, weight in zip(tasks, weights)]}


def preset_weights(model: str | None) -> dict[Workload, int]:
    """Each task's weight, from the preset's tasks; none where they cannot be extracted (no PyTorch here, or
    a model job `tensortune tune-model` made of a file)."""
    try:
        return {task.workload: task.weight for task in preset_tasks(model)}
    except (ModelsNeedTorch, UnknownPreset):
        return {}


def task_out(task: Job, weight: int | None, records: list[Record], bests: list[Record | None]) -> dict:
    best = bests[-1] if bests else None
    return {"job_id": task.id, "workload": task.workload.key, "weight": weight, "trials_done": len(records),
            "best_gflops": best.result.gflops if best else None, "best_seconds": best.result.median if best else None}


def latency_curve(tasks: list[Job], weights: list[int], measured: list[Record],
                  after: dict[int, Record | None]) -> list[float | None]:
    """The model's estimated latency in ms after each of `measured` (its tasks' records, in measurement
    order): allocation.model_latency over each task's best seconds by then (`after` a record: its task's best
    record by then, `best_records`; the latest best of a task's history is all the estimate reads); None until
    each task has an ok record."""
    position = {task.id: i for i, task in enumerate(tasks)}
    best = [math.inf] * len(tasks)
    curve: list[float | None] = []
    for record in measured:
        if after[record.id]:
            best[position[record.job_id]] = after[record.id].result.median
        latency = model_latency([TaskHistory(task.workload.op, task.workload.flops, weight, (seconds,))
                                 for task, weight, seconds in zip(tasks, weights, best)])
        curve.append(latency * 1e3 if math.isfinite(latency) else None)
    return curve


def create_model_job(database: Database, request: JobIn) -> int:
    """A queued model job and its tasks' jobs. The preset's tasks are extracted now, so that a model nothing
    could tune is refused (422), as is one where no model can be tuned (501: no PyTorch)."""
    try:
        tasks = preset_tasks(request.model.name)
        for task in tasks:
            get_space(task.workload, request.target)
    except (UnknownPreset, NoTemplate) as error:
        raise HTTPException(422, str(error)) from None
    except ModelsNeedTorch as error:
        raise HTTPException(501, str(error)) from None
    return database.create_model_job(request.model.name, [task.workload for task in tasks], request.target,
                                     request.tuner, request.trials)


def refuse_unmeasurable(target: str, runner: Runner | None) -> None:
    """422 for a cuda job that this service's local pool could never measure: its host has no such GPU. (On a Ray
    cluster a GPU node may join later; a service without a runner leaves measuring to another process.)"""
    parsed = Target.parse(target)
    if parsed.kind == "cuda" and runner is not None and runner.options.workers == "local":
        from search_space.gpu_device import local_gpu_problem

        if problem := local_gpu_problem(parsed.arch):
            raise HTTPException(422, f"this service measures on its own host, and {problem}")


def bearer(token: str | None):
    """A dependency refusing a request without `Authorization: Bearer <token>` (none when token is unset)."""
    scheme = HTTPBearer(auto_error=False)

    def check(credentials: HTTPAuthorizationCredentials | None = Depends(scheme)) -> None:
        if token and (credentials is None or not hmac.compare_digest(credentials.credentials.encode(), token.encode())):
            raise HTTPException(401, "a valid 'Authorization: Bearer <token>' header is required",
                                headers={"WWW-Authenticate": "Bearer"})
    return check


def served_out(workload: Workload, target: Target, found: StoredConfig | None) -> dict:
    if found is None:
        return {"workload": workload.key, "config": None, "from_workload": None, "from_target": None,
                "predicted": None, "template_version": None}
    return {"workload": workload.key, "config": {"index": found.config.index, "knobs": found.config.to_dict()},
            "from_workload": found.workload.key, "from_target": str(found.target) if found.target else None,
            "predicted": found.predicted or None, "template_version": template_version(workload, target)}


def request_out(request: ClientRequest) -> dict:
    return {"workload": request.workload.key, "workload_label": request.workload.label,
            "target": str(request.target), "target_label": request.target.label, "first_asked": request.first_asked,
            "last_asked": request.last_asked, "times_asked": request.times_asked, "job_id": request.job_id,
            "job_status": request.job_status}


def create_app(database: Database, runner: Runner | None = None, token: str | None = None,
               client_jobs: ClientJobs | None = ClientJobs()) -> FastAPI:
    """The app; `client_jobs` is what a client's POST /api/requests queues, None to queue nothing for clients."""
    @asynccontextmanager
    async def lifespan(_):
        if runner:
            runner.start()
        yield
        if runner:
            runner.close()

    app = FastAPI(title="tensortune", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(DBAPIError)
    async def database_away(_: Request, error: DBAPIError):
        """An outage is a 503 that says so (the request may be repeated); any other database error is ours."""
        reason = unavailable(error)
        if reason is None:
            raise error
        return JSONResponse({"detail": f"the database is unavailable, try again shortly: {reason}"}, status_code=503,
                            headers={"Retry-After": "5"})
    queue = JobQueue(database)
    requests = ClientRequests(database)
    reference = NumpyReference()
    writer = [Depends(bearer(token))]

    def known(job_id: int) -> Job:
        try:
            return database.job(job_id)
        except KeyError:
            raise HTTPException(404, f"no job {job_id}") from None

    @app.post("/api/jobs", status_code=201, response_model=JobOut, dependencies=writer,
              responses={501: {"description": "a model job, and this service has no PyTorch"}})
    def submit(request: JobIn):
        refuse_unmeasurable(request.target, runner)
        if request.model is not None:
            job_id = create_model_job(database, request)
        else:
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
        tasks = database.children(job_id)
        if tasks:
            return model_detail(found, tasks, {task.id: database.job_records(task.id) for task in tasks})
        return single_detail(found, database.job_records(job_id))

    @app.get("/api/jobs/{job_id}/reference", response_model=ReferenceOut, responses={404: {"description": "no such job"}})
    def numpy_reference(job_id: int = JobId):
        """NumPy's GFLOPS on the job's workload with the target's threads: the dashboard's reference line."""
        found = known(job_id)
        threads = found.target.threads
        return {"workload": found.workload.key, "threads": threads,
                "numpy_gflops": reference.gflops(found.workload, threads)}

    @app.post("/api/jobs/{job_id}/cancel", response_model=JobOut, dependencies=writer,
              responses={404: {"description": "no such job"},
                         409: {"description": "the job has finished, or is a model job's task"}})
    def cancel(job_id: int = JobId):
        """Cancel a job; a model job with its tasks' jobs."""
        if (parent := known(job_id).parent_id) is not None:
            raise HTTPException(409, f"job {job_id} is a task of model job {parent}: cancel that one")
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

    @app.get("/api/best/batch", response_model=ServedConfigsOut)
    def best_batch(workload: list[str] = Query(min_length=1, max_length=MAX_BATCH,
                                               examples=[["matmul(M=64,N=64,K=64,dtype=float32)"]]),
                   target: str = Query(max_length=256, examples=["llvm -mcpu=znver3 -mattr=+avx2 -threads=8"])):
        """The config each workload builds with, as `apply_history_best` would choose it from this database: its
        best on this target or the most similar one, else its nearest stored shape's (db.HistoryBest). A client of
        the service (db/served.py) sends its target in full, and no name is checked: it may be another host's CPU."""
        try:
            chosen, on = [Workload.from_key(key) for key in workload], Target.parse(target)
        except (WorkloadError, ValueError) as error:
            raise HTTPException(422, str(error)) from None
        found = HistoryBest(database).query_nearest_many(chosen, on)
        return {"target": str(on), "configs": [served_out(one, on, found[one]) for one in chosen]}

    @app.post("/api/requests", status_code=202, response_model=ClientRequestOut, dependencies=writer,
              responses={403: {"description": "this service queues no jobs for clients (--no-client-jobs)"}})
    def ask(request: ClientRequestIn):
        """A client built this workload without a stored config of its own: queue one job tuning it, unless one is
        queued, running or done (db/client_requests.py)."""
        if client_jobs is None:
            raise HTTPException(403, "this service queues no jobs for clients (it runs with --no-client-jobs)")
        refuse_unmeasurable(request.target, runner)
        return request_out(requests.ask(request.parsed(), Target.parse(request.target), client_jobs))

    @app.get("/api/requests", response_model=list[ClientRequestOut])
    def client_requests(limit: int = Query(100, ge=1, le=1000)):
        """What clients asked to have tuned, the most recently asked first."""
        return [request_out(request) for request in requests.requests(limit)]

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

    @app.get("/healthz", responses={503: {"description": "the database is unavailable; the reason says why"}})
    def healthz():
        database.ping()
        return {"status": "ok", "database": str(database), "max_trials": MAX_TRIALS}

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index():
        return (STATIC / "index.html").read_text()

    return app
