"""Run a lowered GPU program on the CPU, to check a CUDA kernel's logic where there is no GPU.

Every thread of every block of a stage is a lane of NumPy arrays, and the lanes run each
statement in lockstep: loop variables bound to blockIdx / threadIdx are arrays over the
lanes, serial and unrolled loops run in Python, an `If` whose condition differs between lanes
runs each branch on the lanes that take it. Shared memory is one array per block, local
memory one per thread; scratch, shared and local memory start as NaN, so a read of anything
never written shows in the result.

The emulator also catches what lockstep execution would hide on a GPU: an access outside a
buffer's bounds (in any dimension), a barrier that only some threads reach, and a race on
shared memory (between two barriers, an element written by one thread and read or written by
another, in either order: the error names which).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from search_space.program import (GPU_INDICES, Affine, Barrier, Buffer, Const, If, Load, Loop, Op, Program, Stage,
                                  Store, Value, bound_chain, launch)

MAX_LANES = 1 << 17
NOBODY = np.iinfo(np.int64).max  # no thread has accessed the element since the last barrier
OPS = {"add": np.add, "mul": np.multiply, "fma": lambda a, b, c: a * b + c, "max": np.maximum, "tanh": np.tanh,
       "erf": special.erf}


class EmulationError(RuntimeError):
    """The kernel would misbehave on a GPU: an access out of bounds, a divergent barrier, a shared-memory race."""


@dataclass
class _Lanes:
    """The lanes a statement runs on, and the loop variables' values on them (ints where uniform)."""

    ids: np.ndarray  # lane = block * threads + thread
    env: dict

    def where(self, taken: np.ndarray) -> _Lanes:
        return _Lanes(self.ids[taken], {n: v[taken] if isinstance(v, np.ndarray) else v for n, v in self.env.items()})


class _Races:
    """Which threads read and wrote each element of a shared buffer since the last barrier (lowest and highest
    lane id: one thread alone when they are equal)."""

    def __init__(self, size: int):
        self.read = (np.full(size, NOBODY), np.full(size, -1))
        self.written = (np.full(size, NOBODY), np.full(size, -1))

    def clear(self) -> None:
        for low, high in (self.read, self.written):
            low.fill(NOBODY)
            high.fill(-1)

    @staticmethod
    def _others(seen, address, lanes) -> np.ndarray:
        low, high = seen[0][address], seen[1][address]
        return (high >= 0) & ((low != lanes) | (high != lanes))

    @staticmethod
    def _record(seen, address, lanes) -> None:
        np.minimum.at(seen[0], address, lanes)
        np.maximum.at(seen[1], address, lanes)

    def on_read(self, address: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        """Lanes reading an element another thread wrote since the last barrier (read-after-write)."""
        racing = self._others(self.written, address, lanes)
        self._record(self.read, address, lanes)
        return racing

    def on_write(self, address: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lanes writing an element another thread read (write-after-read), and lanes writing one another thread
        wrote (write-after-write), since the last barrier or in this same store."""
        after_read = self._others(self.read, address, lanes)
        after_write = self._others(self.written, address, lanes)
        self._record(self.written, address, lanes)
        return after_read, after_write | (self.written[0][address] != self.written[1][address])


class _StageRun:
    """One launch of a stage: all its lanes, their shared and local memory, and the global buffers."""

    def __init__(self, program: Program, stage: Stage, memory: dict[str, np.ndarray]):
        shape = launch(stage)
        blocks, self.threads = math.prod(shape.grid), shape.block
        if blocks * self.threads > MAX_LANES:
            raise ValueError(f"stage {stage.name}: {blocks} blocks x {self.threads} threads are too many to emulate")
        self.stage, self.memory = stage, memory
        lanes = np.arange(blocks * self.threads)
        block = lanes // self.threads
        gx, gy, _ = shape.grid
        self.index = {"threadIdx.x": lanes % self.threads, "blockIdx.x": block % gx,
                      "blockIdx.y": block // gx % gy, "blockIdx.z": block // (gx * gy)}
        for buffer in program.scope("shared"):
            memory[buffer.name] = np.full(blocks * buffer.size, np.nan, np.float32)
        for buffer in program.scope("local"):
            memory[buffer.name] = np.full(blocks * self.threads * buffer.size, np.nan, np.float32)
        self.races = {b.name: _Races(blocks * b.size) for b in program.scope("shared")}
        self.all = _Lanes(lanes, {})

    def run(self) -> None:
        self.stmts(self.stage.body, self.all)

    def stmts(self, stmts, lanes: _Lanes) -> None:
        for stmt in stmts:
            if isinstance(stmt, Loop) and stmt.kind in GPU_INDICES:
                self.bound(stmt, lanes)
            elif isinstance(stmt, Loop):
                for i in range(stmt.extent):
                    self.stmts(stmt.body, _Lanes(lanes.ids, lanes.env | {stmt.var: i}))
            elif isinstance(stmt, If):
                self.branch(stmt, lanes)
            elif isinstance(stmt, Barrier):
                self.barrier(lanes)
            elif isinstance(stmt, Store):
                self.store(stmt, lanes)
            else:
                raise EmulationError(f"the GPU emulator cannot run {type(stmt).__name__}")

    def bound(self, loop: Loop, lanes: _Lanes) -> None:
        chain, stride, env = bound_chain(loop), 1, dict(lanes.env)
        index = self.index[loop.kind][lanes.ids]
        for inner in reversed(chain):
            env[inner.var] = index // stride % inner.extent
            stride *= inner.extent
        self.stmts(chain[-1].body, _Lanes(lanes.ids, env))

    def branch(self, stmt: If, lanes: _Lanes) -> None:
        lhs = self.affine(stmt.lhs, lanes)
        taken = lhs < stmt.rhs if stmt.op == "<" else lhs == stmt.rhs
        if not isinstance(taken, np.ndarray):
            self.stmts(stmt.then if taken else stmt.orelse, lanes)
            return
        for body, where in ((stmt.then, taken), (stmt.orelse, ~taken)):
            if body and where.any():
                self.stmts(body, lanes.where(where))

    def barrier(self, lanes: _Lanes) -> None:
        if len(lanes.ids) != len(self.all.ids):
            raise EmulationError(f"stage {self.stage.name}: a barrier reached by {len(lanes.ids)} of "
                                 f"{len(self.all.ids)} threads (a barrier in divergent code hangs or corrupts)")
        for races in self.races.values():
            races.clear()

    @staticmethod
    def affine(expr: Affine, lanes: _Lanes):
        total = expr.const
        for name, coeff in expr.terms:
            total = total + coeff * lanes.env[name]
        return total

    def address(self, buffer: Buffer, index: tuple[Affine, ...], lanes: _Lanes) -> np.ndarray:
        """Each lane's element of the buffer's memory, after checking every dimension's bounds."""
        flat = 0
        for dim, (expr, extent) in enumerate(zip(index, buffer.shape)):
            value = np.broadcast_to(self.affine(expr, lanes), lanes.ids.shape)
            outside = (value < 0) | (value >= extent)
            if outside.any():
                lane = lanes.ids[outside][0]
                raise EmulationError(f"stage {self.stage.name}: {buffer.name} index {dim} is {value[outside][0]} "
                                     f"(extent {extent}) in block {lane // self.threads}, thread {lane % self.threads}")
            flat = flat * extent + value
        if buffer.scope == "shared":
            return lanes.ids // self.threads * buffer.size + flat
        if buffer.scope == "local":
            return lanes.ids * buffer.size + flat
        return np.asarray(flat)

    def race(self, buffer: Buffer, racing: np.ndarray, lanes: _Lanes, what: str, hazard: str) -> None:
        if racing.any():
            lane = lanes.ids[racing][0]
            raise EmulationError(f"stage {self.stage.name}: shared-memory race on {buffer.name}: thread "
                                 f"{lane % self.threads} of block {lane // self.threads} {what} since the last "
                                 f"barrier ({hazard})")

    def load(self, load: Load, lanes: _Lanes) -> np.ndarray:
        address = self.address(load.buffer, load.index, lanes)
        if load.buffer.scope == "shared":
            self.race(load.buffer, self.races[load.buffer.name].on_read(address, lanes.ids), lanes,
                      "reads an element another thread wrote", "read-after-write")
        return self.memory[load.buffer.name][address]

    def store(self, store: Store, lanes: _Lanes) -> None:
        value = np.broadcast_to(self.value(store.value, lanes), lanes.ids.shape)
        address = self.address(store.buffer, store.index, lanes)
        if store.buffer.scope == "shared":
            after_read, after_write = self.races[store.buffer.name].on_write(address, lanes.ids)
            self.race(store.buffer, after_read, lanes, "writes an element another thread read", "write-after-read")
            self.race(store.buffer, after_write, lanes, "writes an element another thread wrote", "write-after-write")
        self.memory[store.buffer.name][address] = value

    def value(self, value: Value, lanes: _Lanes):
        if isinstance(value, Load):
            return self.load(value, lanes)
        if isinstance(value, Const):
            return np.float32(value.value)
        if isinstance(value, Op):
            return OPS[value.name](*(self.value(arg, lanes) for arg in value.args)).astype(np.float32, copy=False)
        raise EmulationError(f"the GPU emulator cannot evaluate {value!r}")


def emulate(program: Program, *inputs: np.ndarray) -> np.ndarray:
    """The program's output for these inputs (in the program's input order), computed stage by stage."""
    memory = {b.name: np.ascontiguousarray(a, np.float32).ravel() for b, a in zip(program.scope("input"), inputs)}
    output = program.scope("output")[0]
    for buffer in program.scope("output", "packed"):
        memory[buffer.name] = np.full(buffer.size, np.nan, np.float32)
    for stage in program.stages:
        _StageRun(program, stage, memory).run()
    return memory[output.name].reshape(output.shape)
