"""The REST API's request and response bodies. Requests validate through the same constructors as
the CLI (`Workload.make`, `Target.parse`), so a bad request gets their precise message in a 422."""
from __future__ import annotations

from datetime import datetime
from typing import Literal, Optional, Union

from pydantic import BaseModel, Field, field_validator, model_validator

from search_space import Target, TargetError, Workload, WorkloadError

TunerName = Literal["xgb", "random", "grid", "ga"]
MAX_TRIALS = 100_000


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


class JobIn(BaseModel):
    workload: WorkloadIn
    target: str = Field("llvm", max_length=256, examples=["llvm -threads=1"])
    trials: int = Field(64, ge=1, le=MAX_TRIALS)
    tuner: TunerName = "xgb"

    @field_validator("target")
    @classmethod
    def _target(cls, text: str) -> str:
        return str(parse_target(text))


def parse_target(text: str) -> Target:
    try:
        return Target.parse(text)
    except TargetError as error:
        raise ValueError(str(error)) from None


class JobOut(BaseModel):
    id: int
    workload: str
    op: str
    params: dict[str, Union[bool, int, str]]
    target: str
    tuner: str
    trials: int
    status: str
    created_at: datetime
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    error: str
    trials_done: int
    best_gflops: Optional[float] = Field(description="best GFLOPS measured so far; null before any ok candidate")


class CandidateOut(BaseModel):
    gflops: float
    outcome: str


class JobDetail(JobOut):
    curve: list[float] = Field(description="best GFLOPS after each trial")
    candidates: list[CandidateOut] = Field(description="every measured candidate, in trial order")
    outcomes: dict[str, int] = Field(description="candidates per measurement outcome")
    best_config: Optional[dict] = Field(description="{index, knobs} of the best config so far")
    best_program: Optional[str] = Field(description="the best config's lowered loop nest")


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
