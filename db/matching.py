"""Which stored target, or stored shape, is most like the one being built for, when nothing was measured on
it exactly.

A config measured on a CPU of the same model (another thread count) or with the same vector
features, or on a GPU of the same compute capability, is the next best thing to one measured here. A config
of another shape of the same op and options (another sequence length) is the next best thing to one tuned
for this shape: its tiles still fit, or the nearest ones that do. So is a config of the same shape laid out
otherwise (a convolution tuned NCHW, run channels last): its space is the same.
"""
from __future__ import annotations

import math
from typing import Callable

from search_space import Config, ConfigSpace, InvalidConfig, Target, Workload


def similarity(wanted: Target, stored: Target) -> tuple:
    """Larger is more alike; compared only between targets of the same kind."""
    if wanted.kind == "cuda":
        return (stored.arch == wanted.arch, stored.model == wanted.model, -abs(_arch(stored) - _arch(wanted)))
    shared = len(set(stored.features) & set(wanted.features))
    either = len(set(stored.features) | set(wanted.features)) or 1
    return (stored.model == wanted.model, shared / either, -abs(math.log2(stored.threads / wanted.threads)))


def _arch(target: Target) -> int:
    digits = "".join(c for c in target.arch if c.isdigit())
    return int(digits) if digits else 0


def most_similar(wanted: Target, stored: list[Target]) -> list[Target]:
    """The stored targets of the same kind, other than `wanted` itself, most similar first."""
    others = [t for t in stored if t.kind == wanted.kind and str(t) != str(wanted)]
    return sorted(others, key=lambda t: similarity(wanted, t), reverse=True)


LAID = ("layout",)  # options that say how the activations lie, not what is computed


def same_options(wanted: Workload, stored: Workload) -> bool:
    """Whether two workloads are shapes of one operator: same op, dtype and non-size options (bias, epilogue...),
    conv2d's layout aside."""
    options = [option for option in wanted.spec.options if option not in LAID]
    return (stored.op, stored.dtype) == (wanted.op, wanted.dtype) and all(stored.p[o] == wanted.p[o] for o in options)


def laid_otherwise(wanted: Workload, stored: Workload) -> bool:
    """Whether `stored` is laid out otherwise than `wanted` (its activations in another layout)."""
    return any(stored.p[option] != wanted.p[option] for option in LAID if option in wanted.spec.options)


def size_distance(wanted: Workload, stored: Workload) -> float:
    """How far apart two shapes of one op are: the sum of their sizes' log ratios (sizes + 1, as a pad may be 0)."""
    return sum(abs(math.log((wanted.p[d] + 1) / (stored.p[d] + 1))) for d in wanted.spec.dims)


def nearest_shapes(wanted: Workload, stored: list[Workload]) -> list[Workload]:
    """The other shapes of `wanted`'s op and options among `stored`, nearest first (of two as near, the one laid
    out as `wanted` is)."""
    shapes = [other for other in stored if other != wanted and same_options(wanted, other)]
    return sorted(shapes, key=lambda other: (size_distance(wanted, other), laid_otherwise(wanted, other)))


def fit_config(space: ConfigSpace, config: Config, vectors: tuple[Target, Target, tuple[str, ...]] | None = None,
               parallel: str | None = None, relaid: Callable[[dict], dict] = lambda knobs: knobs) -> Config | None:
    """Another shape's config in `space`: the config with the same knob values where they are valid here, else
    the nearest valid one; None when its knobs are another template's. Another target's: with `vectors` (that
    target, this one, the template's VECTOR_SPLITS), its vectors made this target's first (`on_vectors_of`); with
    `parallel`, run that way (`parallel_ways`); a shape laid out otherwise's, its knobs `relaid` for this one."""
    knobs = relaid(dict(config.values)) | ({"parallel": parallel} if parallel is not None else {})
    if set(knobs) != set(space.knobs):
        return None
    if vectors is not None and "vec" in knobs:
        knobs = on_vectors_of(knobs, *vectors)
    try:
        return space.config(knobs)  # by values: an index is its own space's
    except InvalidConfig:
        return space.nearest(knobs)


def fitted_ways(space: ConfigSpace, config: Config, there: Target, here: Target,
                vectors: tuple[Target, Target, tuple[str, ...]] | None = None,
                relaid: Callable[[dict], dict] = lambda knobs: knobs) -> list[Config]:
    """A config of target `there` in `space`, on target `here`: fitted (`fit_config`), in each of its parallel ways."""
    fitted = (fit_config(space, config, vectors, way, relaid) for way in parallel_ways(space, there, here))
    return [config for config in fitted if config is not None]


def parallel_ways(space: ConfigSpace, there: Target, here: Target) -> list[str | None]:
    """How a CPU config measured on one thread `there` is tried on the more threads `here`: each way the space
    parallelises it, since kept serial it would leave every core but one idle (the 1-thread best of a 1024³ matmul
    on a 2-core Zen 4: 100.6 GFLOPS on one thread; parallel over m, a median 183 at two over four interleaved
    rounds, NumPy's 180); [None], as it is, otherwise."""
    if there.kind != "llvm" or there.threads > 1 or here.threads == 1 or "parallel" not in space.knobs:
        return [None]
    return [way for way in space.knobs["parallel"].candidates if way != "none"]


def on_vectors_of(knobs: dict, there: Target, here: Target, splits: tuple[str, ...]) -> dict:
    """Knob values of a CPU config measured `there`, scaled to the vectors `here`: `vec` at the same rank from the
    widest (an AVX-512 config's 16 lanes become AVX2's 8, its 8 lanes 4), and the register tiles counted in
    vectors (the innermost factor of each split in `splits`) keeping their number of vectors."""
    lanes = max(1, knobs["vec"] * here.vector_bits // there.vector_bits)
    scaled = dict(knobs, vec=lanes)
    for name in splits:
        *outer, inner = knobs[name]
        scaled[name] = (*outer, max(1, inner * lanes // knobs["vec"]))
    return scaled
