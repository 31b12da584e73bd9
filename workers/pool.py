"""The measurement pool interface, its typed options, and the one table that names the pools.

A pool takes a batch of candidates and returns one `MeasureResult` per candidate, in order,
whatever the candidates do to the processes that run them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from search_space import Target
from search_space.target import lacked_features

from .result import MeasureResult
from .task import MeasureOptions, Task


@dataclass(frozen=True)
class PoolOptions:
    """How a host's cores are shared. With `exclusive_timing`, a batch's builds run in parallel on
    `workers` processes, then their checks against NumPy in parallel, then the checked candidates are
    timed one at a time while nothing else runs, on this host, of this pool or any other that uses the
    same `host_lock` file; without it every worker times as soon as it has checked (faster, noisier
    numbers)."""

    workers: int = 0  # worker processes per host; 0: one per core this process may use
    exclusive_timing: bool = True
    build_timeout: float = 20.0  # seconds per candidate, from dispatch to built
    run_timeout: float = 20.0  # seconds per candidate for its check, and again for its timing
    start_timeout: float = 60.0  # seconds for a new worker process to import and report ready
    host_lock: str | None = None  # the file every pool on a host locks; None: host_lock.default_path() there
    host_lock_wait: float = 60.0  # seconds a step waits for other pools; then it runs and its record says so
    memory_limit: int | None = None  # bytes of writable data per worker; None: the host's RAM / workers; 0: none


@dataclass(frozen=True)
class RayPoolOptions(PoolOptions):
    """A Ray cluster: one agent actor per host, each running a local pool on its host's cores."""

    address: str | None = None  # None: RAY_ADDRESS, else a local cluster started on first use
    gpu_resource: str = "GPU"  # the resource a cuda host advertises (tests use a fake one)
    max_restarts: int = 3  # per agent actor
    watchdog_slack: float = 30.0  # seconds beyond the batch's timeouts before an agent counts as stuck


def lacking(target: Target, hosts: Iterable[tuple[str, tuple[str, ...]]]) -> str:
    """The vector features an llvm target asks for that no CPU host of its model has, of `hosts` as (model,
    features) ("" where none is of its model: the model is what a job waits for)."""
    same = [set(features) for model, features in hosts if model == target.model]
    return lacked_features(target, set().union(*same)) if target.kind == "llvm" and same else ""


class NoWorkerHost(LookupError):
    """No host of the pool measures `target` now. On a Ray cluster one may join later (a GPU node started
    after the service), and a service on such a host may share the job queue, so a job waits for it
    (service/host_waits.py) rather than fails."""

    def __init__(self, target: Target, hosts: str, pool: str = "Ray", lacking: str = ""):
        super().__init__(f"no {pool} worker host for target {str(target)!r}; hosts: {hosts}")
        # `lacking`: the vector features the target asks for that the pool's hosts of its model lack
        self.target, self.lacking = target, lacking

    @property
    def awaited(self) -> str:
        """The host a job of the target waits for, e.g. 'a GPU worker (sm_90)', 'a CPU worker (znver3 with
        avx512f)'."""
        if self.target.kind == "cuda":
            return f"a GPU worker ({', '.join(part for part in (self.target.arch, self.target.model) if part)})"
        features = f" with {self.lacking}" if self.lacking else ""
        cores = f", {self.target.threads} cores" if self.target.threads > 1 else ""
        return f"a CPU worker ({self.target.model}{features}{cores})"


class Pool(Protocol):
    def measure(self, tasks: Sequence[Task], options: MeasureOptions) -> list[MeasureResult]: ...

    def require_host(self, target: Target) -> None:
        """Raise NoWorkerHost unless a host of the pool, as it is now, measures `target`."""

    def close(self) -> None: ...


def make_pool(kind: str = "local", options: PoolOptions | None = None) -> Pool:
    """`local` (worker processes on this machine) or `ray` (agent actors on a Ray cluster)."""
    if kind == "local":
        from .pool_local import LocalPool
        return LocalPool(options or PoolOptions())
    if kind == "ray":
        from .pool_ray import RayPool
        return RayPool(options or RayPoolOptions())
    raise ValueError(f"unknown pool {kind!r}; pools: local, ray")
