"""Dispatch: which config `workers.build(config=None)` uses, decided by the active contexts.

Contexts nest as a stack held in a `contextvars.ContextVar`, so they are explicit, nest
(innermost asked first), and are safe across threads and async tasks. `db.apply_history_best`
pushes a context that answers from the database; with no answer, the template's fallback
config is used and a warning is given once per workload.
"""
from __future__ import annotations

import contextvars
import threading
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

from .space import Config
from .target import Target
from .templates import fallback_config
from .workload import Workload


class DispatchContext(Protocol):
    def query(self, workload: Workload, target: Target) -> Config | None:
        """The config to build with, or None to ask the next context outward."""


_STACK: contextvars.ContextVar[tuple] = contextvars.ContextVar("tensortune_dispatch", default=())


class FallbackWarned:
    """Remembers which workloads have been warned about, so each warns once per context."""

    def __init__(self):
        self.warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def first_time(self, key: tuple[str, str]) -> bool:
        """True exactly once per key, even when threads ask at the same moment."""
        with self._lock:
            fresh = key not in self.warned
            self.warned.add(key)
            return fresh


@contextmanager
def dispatch_context(context: DispatchContext) -> Iterator[DispatchContext]:
    token = _STACK.set(_STACK.get() + (context,))
    try:
        yield context
    finally:
        _STACK.reset(token)


def fallback_message(workload: Workload, target: Target) -> str:
    return (f"Cannot find config for target={target}, workload={workload.key}. "
            "A fallback configuration is used, which may bring great performance regression.")


def current_config(workload: Workload, target: Target,
                   fallback: Callable[[Workload, Target], Config] = fallback_config) -> Config:
    """Ask the contexts, innermost first; else `fallback` (the template's, or workers.untuned's measured choice of
    it), warning once per workload per outermost context."""
    stack = _STACK.get()
    for context in reversed(stack):
        config = context.query(workload, target)
        if config is not None:
            return config
    if stack:
        first_time = getattr(stack[0], "first_time", None)
        if first_time is None or first_time((str(target), workload.key)):
            warnings.warn(fallback_message(workload, target), stacklevel=3)
    return fallback(workload, target)
