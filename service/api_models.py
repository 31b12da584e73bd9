"""The REST API's request and response bodies. Requests validate through the same constructors as
the CLI (`Workload.make`, `Target.parse`), so a bad request gets their precise message in a 422."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, Field, model_validator

from search_space import NoTemplate, Target, TargetError, Workload, WorkloadError, get_space

TunerName = Literal["xgb", "random", "grid", "ga"]
MAX_TRIALS = 100_000
MAX_BATCH = 64  # workloads per GET /api/best/batch


def parse_target(text: str) -> Target:
    try:
        return Target.parse(text, check_names=True)
    except TargetError as error:
        raise ValueError(str(error)) from None


def check_tunable(workload: Workload, target: str) -> None:
    """A workload nothing could tune is refused when asked for, not failed later."""
    try:
        get_space(workload, target)
    except NoTemplate as error:
        raise ValueError(str(error)) from None


# A target a job is made for, in its full form (the host's CPU filled in), its names checked.
TargetIn = Annotated[str, Field(max_length=256, examples=["llvm -threads=1"]),
                     AfterValidator(lambda text: str(parse_target(text)))]


class WorkloadIn(BaseModel):
    op: str = Field(max_length=64, examples=["matmul"])
    params: dict[str, Union[bool, int, str]] = Field(max_length=16, examples=[{"M": 64, "N": 64, "K": 64}])

    def workload(self) -> Workload:
        return Workload.make(self.op, **self.params)

    @model_validator(mode="after")
    def _valid(self) -> WorkloadIn:
        try:
            self.workload()
        except (WorkloadError, TypeError) as error:  # TypeError: a parameter named like make's own (op)
            raise ValueError(str(error)) from None
        return self


class ModelIn(BaseModel):
    name: str = Field(min_length=1, max_length=128, examples=["bert-layer"],
                      description="a preset: bert-layer, bert-base, resnet18, hf-bert-base or hf-gpt2")


class JobIn(BaseModel):
    workload: Optional[WorkloadIn] = None
    model: Optional[ModelIn] = Field(None, description="a model tuned as a whole: one job per task, one budget")
    target: TargetIn = "llvm"
    trials: int = Field(64, ge=1, le=MAX_TRIALS, description="the budget; a model job's, over all its tasks")
    tuner: TunerName = "xgb"

    @model_validator(mode="after")
    def _tunable(self) -> JobIn:
        """One thing to tune; a workload nothing could tune is refused now, not failed later (a model's tasks
        are checked when its job is made, service/api.py)."""
        if (self.workload is None) == (self.model is None):
            raise ValueError("a job tunes a workload or a model: give exactly one of the two")
        if self.workload is not None:
            check_tunable(self.workload.workload(), self.target)
        return self


class JobOut(BaseModel):
    id: int
    workload: str
    op: str
    params: dict[str, Union[bool, int, str]]
    workload_label: str = Field(description="the workload key for narrow tables: spaced, dtype left out if float32")
    target: str
    target_label: str = Field(description="the target in short, e.g. 'znver3 · 2 threads'")
    tuner: str
    trials: int
    status: str
    created_at: datetime
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    error: str
    trials_done: int = Field(description="candidates measured so far; a model job's over all its tasks")
    best_gflops: Optional[float] = Field(description="GFLOPS of the best config so far, at its typical time (the "
                                                     "upper median of its measurements); null before any ok candidate, "
                                                     "and for a model job (its tasks' are in its detail)")
    model: Optional[str] = Field(None, description="a model job's name; its workload is its first task's")
    parent_id: Optional[int] = Field(None, description="the model job of a task's job (listed in that job's tasks)")
    waiting: str = Field("", description="what a queued job waits for, e.g. 'a GPU worker (sm_90)': no worker "
                                          "host of its Ray cluster serves its target yet, and one may join; empty "
                                          "otherwise")


class CandidateOut(BaseModel):
    gflops: float
    outcome: str


class TaskOut(BaseModel):
    job_id: int
    workload: str
    weight: Optional[int] = Field(description="runs per forward pass; null where the preset cannot be extracted")
    trials_done: int
    best_gflops: Optional[float] = Field(description="null before any ok candidate")
    best_seconds: Optional[float] = Field(description="median seconds of the fastest ok candidate")


class JobDetail(JobOut):
    curve: list[float] = Field(description="best GFLOPS after each trial, each config at its typical time by then "
                                           "(empty for a model job)")
    candidates: list[CandidateOut] = Field(description="every measured candidate, in trial order")
    outcomes: dict[str, int] = Field(description="candidates per measurement outcome")
    best_config: Optional[dict] = Field(description="{index, knobs} of the best config so far")
    best_program: Optional[str] = Field(description="the best config's lowered loop nest")
    tasks: list[TaskOut] = Field([], description="a model job's tasks, most weighted work first")
    latency_curve: list[Optional[float]] = Field(
        [], description="a model job's estimated latency in ms (Σ weight × best seconds) after each trial; "
                        "null until each of its tasks has an ok candidate, empty when its tasks' weights are unknown")
    latency_ms: Optional[float] = Field(None, description="a model job's estimated latency now")


class ReferenceOut(BaseModel):
    workload: str
    threads: int
    numpy_gflops: float = Field(description="NumPy's GFLOPS on this workload, measured once by this service")


class RecordOut(BaseModel):
    id: int
    job_id: Optional[int]
    workload: str
    target: str
    config: dict
    gflops: float
    median_seconds: Optional[float]
    samples: list[float]
    worker: str
    host: str


class OpOut(BaseModel):
    op: str
    params: list[str]
    options: dict[str, Union[bool, int, str]]


class WorkloadsOut(BaseModel):
    ops: list[OpOut]
    tuned: list[dict[str, str]] = Field(description="{workload, target} pairs with measurements")


class RunnerOut(BaseModel):
    name: str
    job_id: Optional[int]
    busy: bool
    candidates: int


class RayNodeOut(BaseModel):
    host: str
    address: str
    alive: bool
    cpus: float
    gpus: float


class WorkersOut(BaseModel):
    host: str
    cpu: str
    pool: str
    runners: list[RunnerOut]
    ray_nodes: list[RayNodeOut] = Field(description="the Ray cluster's nodes when a Ray pool is active")


class ServedConfigOut(BaseModel):
    workload: str
    config: Optional[dict] = Field(description="{index, knobs} to build with, fitted to this workload's space; null "
                                               "when neither it nor another shape of its op has one stored")
    from_workload: Optional[str] = Field(description="the workload it was measured on: this one, or the nearest "
                                                     "stored shape of its op (same options) it is borrowed from")
    from_target: Optional[str] = Field(description="the stored target it was measured on when not the one asked: "
                                                   "the most similar one")
    predicted: Optional[str] = Field(None, description="set when the config was measured nowhere: what predicted "
                                                       "it (a cost model over the op's other shapes' records)")
    template_version: Optional[int] = Field(None, description="the version of the template the config is for: a "
                                                              "client with another version ignores it")


class ServedConfigsOut(BaseModel):
    target: str
    configs: list[ServedConfigOut] = Field(description="one per workload asked, in the order asked")


class ClientRequestIn(BaseModel):
    workload: str = Field(max_length=512, examples=["matmul(M=64,N=64,K=64,dtype=float32)"])
    target: TargetIn

    def parsed(self) -> Workload:
        return Workload.from_key(self.workload)

    @model_validator(mode="after")
    def _tunable(self) -> ClientRequestIn:
        try:
            workload = self.parsed()
        except WorkloadError as error:
            raise ValueError(str(error)) from None
        check_tunable(workload, self.target)
        return self


class ClientRequestOut(BaseModel):
    workload: str
    workload_label: str
    target: str
    target_label: str
    first_asked: datetime
    last_asked: datetime
    times_asked: int = Field(description="reports of clients that built it without a config of its own")
    job_id: Optional[int] = Field(description="the job tuning it: the one a request queued, or one queued, running "
                                              "or done already; null while the cap on queued client jobs is reached")
    job_status: Optional[str]
