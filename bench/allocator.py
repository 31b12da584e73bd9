"""Which malloc the process's tensors come from. `bench model` times eager PyTorch and Inductor beside tensortune in
one process; they allocate large intermediates afresh at each call, and glibc's malloc maps and faults in each one
that its threshold sends to mmap. On a Zen 4 (2 threads, two processes), bert-layer's eager forward went from 19.4
and 16.1 ms with glibc's defaults to 15.5 and 15.8 once large blocks no longer went to mmap (`M_MMAP_THRESHOLD`),
Inductor's from 15.5 and 16.3 to 14.1 and 14.5, tensortune's from 11.17 and 11.31 to 10.97 and 11.25. The allocator is
part of what a model timing means, so the bench names it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

PRELOADABLE = ("jemalloc", "tcmalloc", "mimalloc")  # mallocs a deployment loads with LD_PRELOAD
GLIBC_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_ARENA_MAX")


def allocator(maps: str | None = None, environ: Mapping[str, str] = os.environ) -> str:
    """The preloaded malloc where the process's memory map (`maps`: /proc/self/maps by default) shows one, else
    glibc's, with the environment's settings of it."""
    if maps is None:
        maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    loaded = [name for name in PRELOADABLE if f"/lib{name}" in maps]
    if loaded:
        return loaded[0]
    settings = ", ".join(f"{name}={environ[name]}" for name in GLIBC_SETTINGS if name in environ)
    return f"glibc malloc ({settings})" if settings else "glibc malloc, its defaults"
