"""Features of a lowered program for the cost model, in a fixed-length vector.

`itervar` features (the default) describe the loop nest around the program's hottest
statement, the way AutoTVM's itervar features do: per loop, from the innermost outward,
its extent, kind and the iteration products above and below it, and per buffer accessed
there the stride, the bytes touched and the reuse at that level; plus whole-program facts
(FLOPs, the share of work in peeled tails, packed bytes, parallel width, how far ahead its
nearest prefetch reaches, in bytes, and the share of the target's threads its parallel loop keeps
busy). Everything but the two shares is log-scaled, and measured in the program,
not in knob values, so a model trained on one shape of an op says something about another:
that is what transfer learning needs.
`knob` features are the config's knob values themselves: cheap and exact within one space,
meaningless across spaces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .program import LOOP_KINDS, TILE_STEP, Call, If, Loop, Prefetch, Program, Store, loads, walk
from .space import Config, ConfigSpace
from .thread_balance import busy_share

MAX_LOOPS = 12  # loop slots kept around the hottest statement, innermost first
MAX_BUFFERS = 4  # buffer slots: the stored buffer, then loads in order of appearance
LOOP_FEATURES = 3 + len(LOOP_KINDS)
BUFFER_FEATURES = 3


@dataclass(frozen=True)
class _Site:
    """A statement with the loops around it (call-site loops included) and how often it runs."""

    store: Store
    loops: tuple[Loop, ...]
    weight: int  # executions per program run


def _sites(stmts, loops=(), weight=1):
    for stmt in stmts:
        if isinstance(stmt, Store):
            yield _Site(stmt, loops, weight)
        elif isinstance(stmt, Loop):
            yield from _sites(stmt.body, loops + (stmt,), weight * stmt.extent)
        # both branches counted whole: weighing each by the iterations that take it (a convolution's edge rows) ranked
        # one task's configs better alone, but transferred worse from a ResNet's other convolutions (the xgb tuner
        # reached 95% of the best 512x7x7 config in 21-33 replayed trials instead of 4-9, in two of three histories)
        elif isinstance(stmt, If):
            yield from _sites(stmt.then + stmt.orelse, loops, weight)
        elif isinstance(stmt, Call):
            yield from _sites(stmt.body, loops, weight)


def _log(x: float) -> float:
    return math.log2(1.0 + abs(x))


def _busy_threads(program: Program, threads: int) -> float:
    """The share of `threads` the program's busiest parallel loop keeps working, split as the code generator splits
    it (`busy_share`), a peeled last iteration weighed by its own work; 1 / threads where no loop is parallel."""
    work = lambda stmts: sum(site.weight for site in _sites(stmts))
    loops = [stmt for stage in program.stages for stmt, _, _ in walk(stage.body)
             if isinstance(stmt, Loop) and stmt.kind == "parallel"]
    if threads == 1 or not loops:
        return 1.0 / threads
    loop = max(loops, key=lambda loop: work((loop,)))
    (tail,) = loop.body if len(loop.body) == 1 and isinstance(loop.body[0], If) else (None,)
    works = [work(tail.then)] * (loop.extent - 1) + [work(tail.orelse)] if tail else [1.0] * loop.extent
    return busy_share(works, threads)


def _lead(stmt) -> int:
    """Bytes past what is being read that `stmt` prefetches (0: none): a Prefetch's lead; a tile nest's `ahead` k
    steps of its packed operand's rows, or, prefetching a share of what follows its block, the block's bytes."""
    if isinstance(stmt, Prefetch):
        return stmt.lead * stmt.buffer.itemsize
    if not (isinstance(stmt, Loop) and (stmt.ahead or stmt.share)):
        return 0
    row = max((load.buffer.flat(load.index).coeff(stmt.var) * load.buffer.itemsize for site in _sites(stmt.body)
               for load in loads(site.store.value) if load.buffer.scope == "packed"), default=0)
    return row * (stmt.ahead * TILE_STEP if stmt.ahead else stmt.extent)


def itervar_features(program: Program, flops: int, threads: int = 1) -> np.ndarray:
    sites = [s for stage in program.stages for s in _sites(stage.body)]
    hot = max(sites, key=lambda s: s.weight)
    total = sum(s.weight for s in sites)
    # peeled tail copies of the hot statement store to the same buffer: the work they hold
    same = [s for s in sites if s.store.buffer == hot.store.buffer and type(s.store.value) is type(hot.store.value)]
    tail_share = 1.0 - hot.weight / max(1, sum(s.weight for s in same))

    accesses = [(hot.store.buffer, hot.store.index)] + [(ld.buffer, ld.index) for ld in loads(hot.store.value)]
    unique = list(dict.fromkeys((b, i) for b, i in accesses))[:MAX_BUFFERS]
    loops = hot.loops[::-1][:MAX_LOOPS]  # innermost first
    rows = []
    below = 1
    offsets = [(dict(buffer.flat(index).terms), buffer.itemsize) for buffer, index in unique]  # loop var → stride
    for depth, loop in enumerate(loops):
        above = hot.weight // (below * loop.extent) if below * loop.extent else 1
        row = [_log(loop.extent), _log(above), _log(below)] + [float(loop.kind == k) for k in LOOP_KINDS]
        inner, iterations = loops[:depth + 1], below * loop.extent
        for strides, itemsize in offsets:
            touched = math.prod(l.extent for l in inner if strides.get(l.var))
            row += [_log(strides.get(loop.var, 0) * itemsize), _log(touched * itemsize), _log(iterations / max(1, touched))]
        row += [0.0] * BUFFER_FEATURES * (MAX_BUFFERS - len(unique))
        rows.append(row)
        below *= loop.extent
    width = LOOP_FEATURES + BUFFER_FEATURES * MAX_BUFFERS
    rows += [[0.0] * width] * (MAX_LOOPS - len(rows))
    parallel = [l.extent for s in sites for l in s.loops if l.kind == "parallel"]
    packed = sum(b.size * b.itemsize for b in program.scope("packed"))
    registers = sum(b.size for b in program.scope("register"))
    lead = min(filter(None, (_lead(s) for stage in program.stages for s, _, _ in walk(stage.body))), default=0)
    overall = [_log(flops), _log(total), tail_share, _log(packed), _log(registers), _log(max(parallel, default=1)),
               _log(lead), _busy_threads(program, threads)]
    return np.asarray([x for row in rows for x in row] + overall, dtype=np.float32)


def knob_features(space: ConfigSpace, config: Config) -> np.ndarray:
    """Knob values as numbers: split factors log-scaled, other choices as their position among the candidates."""
    values = []
    for name, knob in space.knobs.items():
        value = config[name]
        if knob.kind == "split":
            values += [_log(f) for f in value[1:]]
        else:
            values.append(float(knob.candidates.index(value)))
    return np.asarray(values, dtype=np.float32)


FEATURE_KINDS = ("itervar", "knob")
