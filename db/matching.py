"""Which stored target is most like the one being built for, when nothing was measured on it exactly.

A config measured on a CPU of the same model (another thread count) or with the same vector
features, or on a GPU of the same compute capability, is the next best thing to one measured here.
"""
from __future__ import annotations

import math

from search_space import Target


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
