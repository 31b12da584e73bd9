"""The local pool: candidates built, checked and timed in worker processes on this machine.

A candidate that hangs is killed at its timeout (`build_timeout`, `run_timeout`); one that
crashes its process with a fault signal is a `runtime_error` (a `compile_error` while
building); a process that vanishes otherwise (SIGKILL, the OOM killer) has its candidate
retried once on another process, then recorded `worker_lost`. Each dead process is replaced.
Workers run under an address-space limit, so a runaway allocation is a `MemoryError`
(`runtime_error`) in its own process, never the OOM killer's pick among the host's processes.
"""
from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import time
from collections import deque
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from typing import Sequence

from threadpoolctl import threadpool_limits

from search_space import Target, host_target
from search_space.target import lacked_features

from .host_lock import HostLock, default_path
from .pool import NoWorkerHost, PoolOptions, lacking
from .result import MeasureResult, Outcome
from .settle import settle
from .task import Built, Checked, MeasureOptions, Task, build_step, check_step, failed, time_step
from .timing import host_flush_buffer

FAULT_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
STARTED = "started"
STEPS = {"check": check_step, "run": time_step}  # what a worker does to the candidate it holds


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def serve(conn: Connection, host_lock: tuple[str, float] | None, memory_limit: int) -> None:
    """A worker process: build on ("build", task), bind the weights and check the result on ("check", options), time
    on ("run", options), stop on None; each step replies None where it leaves its candidate to the next, else the
    candidate's record. Each step first sends STARTED, once it holds the host lock (shared to build and check,
    exclusive to time) and, the first time, has set up what runs share; a step that ran the kernel lets the lock go
    only once its threads sleep (`settle`)."""
    # Ctrl-C, which a terminal sends to its whole foreground group, is the parent's to answer (it closes the
    # pool): ignored here, then unblocked (Worker starts this process with SIGINT blocked).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # One BLAS thread for good: the NumPy reference needs no more, and a BLAS pool (re)started
    # after a call keeps spinning and steals a core from the next kernel timed (first timings
    # of each worker were 1.75x slower on two cores).
    threadpool_limits(1, user_api="blas")
    # A runaway allocation fails here (MemoryError) instead of waking the OOM killer. The limit is on writable
    # data, not address space: CUDA reserves address space for the GPU's memory and the host's at its first call,
    # and under an address-space limit that fails as cudaErrorMemoryAllocation (seen on an H100 host).
    if memory_limit:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit, memory_limit))
    lock = HostLock(*host_lock) if host_lock else None
    conn.send("ready")
    held: Built | Checked | None = None  # the candidate the last step left for the next
    flush_buffer_ready = False
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the pool is gone
            return
        if message is None:
            return
        kind, payload = message
        with lock.held(exclusive=kind == "run") if lock else nullcontext((0.0, True)) as (waited, locked):
            extra = {}  # phases besides the step's own
            flushing = kind == "run" and payload.cache == "flush" and held.built.kernel.target.kind == "llvm"
            if flushing and not flush_buffer_ready:
                extra, flush_buffer_ready = fault_in_flush_buffer(), True
            conn.send(STARTED)  # the step's timeout runs from here, not from the wait for other pools
            reply = build_step(payload) if kind == "build" else STEPS[kind](held, payload)
            if kind != "build":  # it ran the kernel, whose threads still spin on cores another worker would time on
                extra["settle"] = settle()
        reply = with_wait(reply, waited, locked or kind != "run", extra)
        held = None if isinstance(reply, MeasureResult) else reply
        conn.send(reply if held is None else None)


def fault_in_flush_buffer() -> dict:
    """{"setup": seconds} to make the process's cache-flush buffer (HostTimedCall) and write it once, which faults
    in its pages, before the first flushed run's timeout starts: that first write takes many times a later one,
    seconds where the last-level cache is hundreds of MiB, and fresh workers' first runs overran 3 s run
    timeouts so on a loaded host. A MemoryError here is met again, and recorded, in time_step."""
    start = time.perf_counter()
    with suppress(MemoryError):
        host_flush_buffer()
    return {"setup": time.perf_counter() - start}


def with_wait(reply: Built | Checked | MeasureResult, waited: float, locked: bool,
              extra: dict) -> Built | Checked | MeasureResult:
    """The reply with the time spent waiting for the host lock added to its "wait" phase, and `extra`'s phases (the
    set-up's, the settling's) to theirs: a candidate's phases sum those of its steps."""
    phases = reply.phases | {phase: reply.phases.get(phase, 0.0) + seconds
                             for phase, seconds in ({"wait": waited} | extra).items()}
    if isinstance(reply, (Built, Checked)):
        reply.phases = phases
        return reply
    error = reply.error if locked or not reply.ok else f"timed without the host lock after waiting {waited:.0f} s"
    return replace(reply, phases=phases, error=error)


def local_cpu_problem(target: Target) -> str:
    """Why this host cannot time code for `target`'s CPU ("" when it can): another model's code would be timed on
    this one and stored under that model's name, code of a vector feature this CPU lacks cannot run here, and a
    kernel for more threads than the host has cores would be timed with its threads taking turns and stored as if
    each had a core."""
    host = host_target()
    return cpu_problem(target, host.model, host.threads, host.features) if target.kind == "llvm" else ""


def cpu_problem(target: Target, model: str, cores: int, features: tuple[str, ...]) -> str:
    """Why a host of CPU `model` with `cores` and vector `features` cannot time code for the llvm `target` ("" when
    it can)."""
    if target.model != model:
        return f"this host's CPU is {model}, not {target.model}"
    if lacked := lacked_features(target, features):
        return f"this host's CPU lacks {lacked}, which the target asks for"
    if target.threads > cores:
        return f"this host has {cores} cores, not the {target.threads} the target's threads need"
    return ""


class Worker:
    def __init__(self, context, *settings):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, *settings), daemon=True, name="tensortune-worker")
        # the child inherits this thread's signal mask: a Ctrl-C while it starts up waits until serve ignores it
        # (multiprocessing's resource tracker unblocks SIGINT when it starts, at the first spawn: so it starts first)
        resource_tracker.ensure_running()
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        child.close()
        self.ready = False

    def await_ready(self, timeout: float) -> bool:
        """Wait until the process has imported everything, so its start-up overlaps no timing run."""
        try:
            self.ready = self.ready or (self.conn.poll(timeout) and self.conn.recv() == "ready")
        except (EOFError, OSError):
            self.ready = False
        return self.ready

    def send(self, message, start_timeout: float) -> bool:
        """False if the process died or never came up."""
        try:
            if self.await_ready(start_timeout):
                self.conn.send(message)
                return True
        except OSError:
            pass
        return False

    @property
    def name(self) -> str:
        return f"pid-{self.process.pid}"

    def death(self) -> int | None:
        """The fault signal that killed the process, or None if it was lost another way."""
        self.process.join(1.0)
        code = self.process.exitcode
        return -code if code is not None and -code in FAULT_SIGNALS else None

    def stop(self) -> None:
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join()
        self.conn.close()


@dataclass
class Batch:
    """The candidates of one `measure` call, their results so far, and (index, attempt) still to run."""

    tasks: list[Task]
    results: list[MeasureResult | None]
    queue: deque


class LocalPool:
    def __init__(self, options: PoolOptions = PoolOptions()):
        self.options = options
        self._context = multiprocessing.get_context("spawn")
        count = options.workers or len(os.sched_getaffinity(0))
        lock = (options.host_lock or default_path(), options.host_lock_wait) if options.exclusive_timing else None
        memory = options.memory_limit if options.memory_limit is not None else physical_memory() // count
        self._settings = (lock, memory)
        self._workers = [Worker(self._context, *self._settings) for _ in range(count)]

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def measure(self, tasks: Sequence[Task], options: MeasureOptions = MeasureOptions()) -> list[MeasureResult]:
        batch = Batch(list(tasks), [None] * len(tasks), deque((index, 0) for index in range(len(tasks))))
        while batch.queue:
            wave = [batch.queue.popleft() for _ in range(min(len(self._workers), len(batch.queue)))]
            self._wave(batch, dict(enumerate(wave)), options)
        return batch.results

    def require_host(self, target: Target) -> None:
        """This host is the pool's only one, and no other joins: a CPU model other than its own, or more threads than
        its cores, raises NoWorkerHost (the job waits for a service on such a host to take it); a GPU it lacks is
        refused before a job is made (service/api.py, `tensortune tune`), or fails its candidates saying why."""
        if local_cpu_problem(target):
            host = host_target()
            raise NoWorkerHost(target, f"llvm {host.model}, {host.threads} cores (this one)", "local",
                               lacking(target, [(host.model, host.features)]))

    def _wave(self, batch: Batch, slots: dict, options: MeasureOptions) -> None:
        """Build one candidate per worker in parallel, check them in parallel (nothing is timed: a BERT dense
        candidate's check, its weights bound in 28 copies, took 0.09-0.10 s on an Intel host, beside 0.14 s of timing
        that then began with an untimed round of 28 calls), then time them (one at a time if exclusive)."""
        built = self._step(batch, slots, slots, "build", lambda index: batch.tasks[index])
        checked = self._step(batch, slots, built, "check", lambda index: options)
        walls = {slot: built[slot] + wall for slot, wall in checked.items()}
        groups = [{slot: wall} for slot, wall in walls.items()] if self.options.exclusive_timing else [walls]
        for group in groups:
            self._run(batch, slots, group, options)

    def _step(self, batch: Batch, slots: dict, ready, step: str, payload) -> dict:
        """Send each worker of `ready` (slots) `step` with `payload(its candidate's index)`, all at once: {slot: wall
        seconds} of those whose candidate goes on to the next step."""
        pending = {}
        for slot in ready:
            if self._workers[slot].await_ready(self.options.start_timeout):
                pending[slot] = time.perf_counter()  # before sending: the worker may start at once
            if not self._workers[slot].send((step, payload(slots[slot][0])), self.options.start_timeout):
                pending.pop(slot, None)
                self._lost(batch, slots, slot, step)
        return self._collect(batch, slots, pending, step)

    def _run(self, batch: Batch, slots: dict, walls: dict, options: MeasureOptions) -> None:
        pending = {}
        for slot in walls:
            pending[slot] = time.perf_counter()
            self._workers[slot].send(("run", options), self.options.start_timeout)
        for slot, (result, wall) in self._collect(batch, slots, pending, "run").items():
            index, attempt = slots[slot]
            bookkeeping = walls[slot] + wall - sum(result.phases.values())
            result = replace(result, phases=result.phases | {"dispatch": bookkeeping})
            batch.results[index] = replace(result, error="retried once after its worker was lost") if attempt else result

    def _collect(self, batch: Batch, slots: dict, pending: dict, step: str) -> dict:
        """Replies in arrival order: {slot: wall seconds} of built or checked candidates, {slot: (result, wall)} of
        runs.
        A step's timeout runs from its STARTED; before that it may wait `host_lock_wait` for other pools, then
        set its process up (serve) as long as a start-up may take."""
        timeout = self.options.build_timeout if step == "build" else self.options.run_timeout
        before_start = self.options.host_lock_wait + self.options.start_timeout
        started, done = {}, {}
        window = lambda slot: (started[slot], timeout) if slot in started else (pending[slot], before_start)
        deadline = lambda slot: sum(window(slot))
        connections = {self._workers[slot].conn: slot for slot in pending}
        while connections:
            soonest = min(deadline(slot) for slot in connections.values())
            for conn in wait(list(connections), max(0.0, soonest - time.perf_counter())):
                slot = connections[conn]
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    del connections[conn]
                    self._lost(batch, slots, slot, step)
                    continue
                if reply == STARTED:
                    started[slot] = time.perf_counter()
                    continue
                del connections[conn]
                wall = time.perf_counter() - pending[slot]
                if step == "run":
                    done[slot] = (reply, wall)
                elif reply is None:
                    done[slot] = wall
                else:
                    batch.results[slots[slot][0]] = reply
            for conn, slot in list(connections.items()):
                if deadline(slot) <= time.perf_counter():
                    del connections[conn]
                    self._timeout(batch, slots, slot, step, *window(slot))
        return done

    def _timeout(self, batch: Batch, slots: dict, slot: int, step: str, began: float, limit: float) -> None:
        """The step's record, from `began` (the perf_counter() of its STARTED, else of its dispatch) to now."""
        outcome = Outcome.BUILD_TIMEOUT if step == "build" else Outcome.RUN_TIMEOUT
        began_at = time.time() - (time.perf_counter() - began)
        batch.results[slots[slot][0]] = failed(outcome, f"{step} exceeded {limit:g} s; worker replaced", began_at,
                                               worker=self._workers[slot].name)
        self._replace(slot)

    def _lost(self, batch: Batch, slots: dict, slot: int, step: str) -> None:
        index, attempt = slots[slot]
        fault, worker = self._workers[slot].death(), self._workers[slot].name
        self._replace(slot)
        if fault is not None:
            outcome = Outcome.COMPILE_ERROR if step == "build" else Outcome.RUNTIME_ERROR
            batch.results[index] = failed(outcome, f"worker crashed with {signal.Signals(fault).name} in {step}",
                                          time.time(), worker=worker)
        elif attempt == 0:
            batch.queue.append((index, 1))
        else:
            batch.results[index] = failed(Outcome.WORKER_LOST, f"worker lost in {step} twice", time.time(), worker=worker)

    def _replace(self, slot: int) -> None:
        self._workers[slot].stop()
        self._workers[slot] = Worker(self._context, *self._settings)
        self._workers[slot].await_ready(self.options.start_timeout)

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
        for worker in self._workers:
            worker.process.join(2.0)
            worker.stop()

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
