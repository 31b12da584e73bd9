"""The Ray pool: one agent actor per host of a Ray cluster, each running a local pool on its host.

Hosts advertise what they are through Ray resources: every node with a CPU gets a CPU agent,
which reports its CPU model and cores, and `llvm` candidates go only to agents of the candidate's
CPU model with a core for each of its threads; a node with the GPU resource (`num_gpus=1`, or a
named resource in tests) gets a GPU agent, which reports its GPU's name and architecture as CuPy
sees them, and `cuda` candidates go only to agents of the candidate's architecture (and device,
when the target names one). A batch that
holds a candidate no agent serves raises NoWorkerHost: the job waits for such a node to join, which the pool
sees at its next batch or `require_host`. Agents restart on failure (`max_restarts`); the candidates of a
lost agent are retried once on another agent of their kind, then recorded `worker_lost`. A
watchdog kills (and so restarts) an agent that overruns its batch's timeouts.

A worker host joins a cluster with
    pip install tensortune
    ray start --address=HEAD:PORT            # add --num-gpus=1 on a GPU host
and the head is started with `ray start --head --port=PORT`; drivers set RAY_ADDRESS or pass
`RayPoolOptions(address=...)`. Without either, the pool starts a one-node cluster on first use.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Sequence

from search_space import Target, host_target
from search_space.gpu_device import NoGpu, host_gpu

from .pool import NoWorkerHost, PoolOptions, RayPoolOptions, lacking
from .pool_local import LocalPool, cpu_problem
from .result import MeasureResult, Outcome
from .task import MeasureOptions, Task, failed

RESTART_POLL_SECONDS = 0.25


class HostAgent:
    """Lives on one node: measures batches there with a local pool of `workers` processes.

    The actor is threaded so that `describe` answers during a long batch; a lock keeps batches
    (and so the host's build/timing policy) one at a time."""

    def __init__(self, options: PoolOptions, workers: int, kind: str = "llvm"):
        import ray
        self.node, self.kind = ray.get_runtime_context().get_node_id(), kind
        self.pool = LocalPool(replace(options, workers=workers))
        self.lock = threading.Lock()

    def describe(self) -> tuple[str, str, int, str, int, tuple[str, ...]]:
        """(node, model, pid, arch, cores, features): the CPU model, the cores this process may use (not the node's
        `CPU` resource, a scheduling count) and its vector features, or the GPU's name and architecture ("" where
        CuPy sees none)."""
        if self.kind == "llvm":
            host = host_target()
            return self.node, host.model, os.getpid(), "", host.threads, host.features
        try:
            gpu = host_gpu()
        except NoGpu:
            return self.node, "", os.getpid(), "", 0, ()
        return self.node, gpu.name, os.getpid(), gpu.arch, 0, ()

    def measure(self, tasks: Sequence[Task], options: MeasureOptions) -> list[MeasureResult]:
        with self.lock:
            results = self.pool.measure(tasks, options)
        return [replace(r, worker=f"ray-{self.node[:8]}/{r.worker}") for r in results]


@dataclass
class Agent:
    handle: object
    kind: str  # llvm or cuda
    model: str
    node: str
    arch: str = ""  # cuda: the GPU's sm_XY
    cores: int = 0  # llvm: the cores its host's kernels may run on
    features: tuple[str, ...] = ()  # llvm: its CPU's vector features

    def serves(self, target: Target) -> bool:
        if target.kind != self.kind:
            return False
        if target.kind == "cuda":
            return bool(self.arch) and self.arch == target.arch and (not target.model or target.model == self.model)
        return not cpu_problem(target, self.model, self.cores, self.features)

    @property
    def label(self) -> str:
        """How a NoWorkerHost's list of hosts names it: `llvm znver4, 2 cores`, `cuda NVIDIA H100 sm_90`."""
        if self.kind == "llvm":
            return f"llvm {self.model}, {self.cores} cores"
        return f"cuda {self.model or '(no GPU seen)'} {self.arch}".rstrip()


class RayPool:
    def __init__(self, options: RayPoolOptions = RayPoolOptions()):
        import ray
        self.options = options
        if not ray.is_initialized():
            # "local": a new one-node cluster, never a stale one found through /tmp/ray/ray_current_cluster
            ray.init(address=options.address or os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False,
                     logging_level="warning")
        self.agents: list[Agent] = []
        self._follow_cluster()

    def _follow_cluster(self) -> None:
        """Agents for the nodes that joined since the last batch, none for those that left: a host
        joins a running service with `ray start --address=...` alone."""
        import ray
        alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        self.agents = [a for a in self.agents if a.node in alive]
        known = {a.node for a in self.agents}
        self.agents += self._start_agents([n for node, n in alive.items() if node not in known])

    def _start_agents(self, nodes: list[dict]) -> list[Agent]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(HostAgent)
        started = []
        for node in nodes:
            resources, pin = node["Resources"], NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            placement = dict(scheduling_strategy=pin, max_restarts=self.options.max_restarts, max_concurrency=2)
            if resources.get("CPU", 0) >= 1:
                started.append(("llvm", remote.options(num_cpus=1, **placement).remote(self.options, int(resources["CPU"]))))
            if resources.get(self.options.gpu_resource, 0) >= 1:
                gpu = {"num_gpus": 1} if self.options.gpu_resource == "GPU" else {"resources": {self.options.gpu_resource: 1}}
                started.append(("cuda", remote.options(num_cpus=0, **gpu, **placement).remote(self.options, 1, "cuda")))
        described = ray.get([handle.describe.remote() for _, handle in started], timeout=self.options.start_timeout)
        return [Agent(handle, kind, model, node, arch, cores, features)
                for (kind, handle), (node, model, _, arch, cores, features) in zip(started, described)]

    @property
    def pids(self) -> list[int]:
        """Process ids of the CPU agents (tests kill them)."""
        import ray
        return [d[2] for d in ray.get([a.handle.describe.remote() for a in self.agents if a.kind == "llvm"])]

    def _route(self, task: Task) -> list[Agent]:
        return self._serving(Target.parse(task.target))

    def _serving(self, target: Target) -> list[Agent]:
        found = [a for a in self.agents if a.serves(target)]
        if not found:
            hosts = ", ".join(a.label for a in self.agents) or "none"
            cpus = [(a.model, a.features) for a in self.agents if a.kind == "llvm"]
            raise NoWorkerHost(target, hosts, lacking=lacking(target, cpus))
        return found

    def require_host(self, target: Target) -> None:
        """Raise NoWorkerHost unless a node of the cluster as it is now (joined since the last batch or not)
        measures `target`."""
        self._follow_cluster()
        self._serving(target)

    def measure(self, tasks: Sequence[Task], options: MeasureOptions = MeasureOptions()) -> list[MeasureResult]:
        """Split the batch over the agents of each candidate's route, wait with a watchdog, retry lost agents' work once."""
        import ray
        from ray.exceptions import ActorUnavailableError, ActorUnschedulableError, GetTimeoutError, RayActorError

        lost = (RayActorError, ActorUnavailableError, GetTimeoutError, ActorUnschedulableError)  # the last: its node left
        self._follow_cluster()
        results: list[MeasureResult | None] = [None] * len(tasks)
        restarting = int(self.options.watchdog_slack / RESTART_POLL_SECONDS)  # calls an agent may refuse while it restarts
        groups: dict[tuple, list[int]] = {}
        for index, task in enumerate(tasks):
            groups.setdefault(tuple(id(a) for a in self._route(task)), []).append(index)
        calls = {}
        for indices in groups.values():
            agents = self._route(tasks[indices[0]])
            for offset, agent in enumerate(agents):
                if indices[offset::len(agents)]:
                    self._submit(calls, agent, indices[offset::len(agents)], 0, tasks, options)
        while calls:
            deadline = min(call[3] for call in calls.values())
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                agent, indices, attempt, _ = calls.pop(ref)
                try:
                    for index, result in zip(indices, ray.get(ref)):
                        results[index] = replace(result, error=result.error or "retried once after its worker was lost") \
                            if attempt else result
                except lost as error:
                    if attempt and isinstance(error, ActorUnavailableError) and restarting > 0:
                        restarting -= 1  # the retry met an agent Ray is still restarting: again, a bit later
                        time.sleep(RESTART_POLL_SECONDS)
                        self._submit(calls, agent, indices, attempt, tasks, options)
                    else:
                        self._retry(calls, agent, indices, attempt, tasks, options, results, error)
            for ref, (agent, indices, attempt, due) in list(calls.items()):
                if due <= time.monotonic():  # the watchdog: a stuck agent is killed, and Ray restarts it
                    ray.kill(agent.handle, no_restart=False)
                    calls[ref] = (agent, indices, attempt, time.monotonic() + self.options.watchdog_slack)
        return results

    def _submit(self, calls: dict, agent: Agent, indices: list[int], attempt: int, tasks, options) -> None:
        per_task = self.options.build_timeout + self.options.run_timeout
        waits = self.options.host_lock_wait if self.options.exclusive_timing else 0.0  # other pools on its host
        due = time.monotonic() + len(indices) * per_task + waits + self.options.watchdog_slack
        calls[agent.handle.measure.remote([tasks[i] for i in indices], options)] = (agent, indices, attempt, due)

    def _retry(self, calls, agent, indices, attempt, tasks, options, results, error) -> None:
        if attempt:
            for index in indices:
                results[index] = failed(Outcome.WORKER_LOST, f"Ray agent lost twice: {type(error).__name__}",
                                        time.time(), worker=f"ray-{agent.node[:8]}")
            return
        others = [a for a in self._route(tasks[indices[0]]) if a is not agent] or [agent]
        self._submit(calls, others[0], indices, 1, tasks, options)

    def close(self) -> None:
        import ray
        for agent in self.agents:
            ray.kill(agent.handle)
