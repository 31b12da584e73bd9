"""The cold-cache protocol's flush, in bytes: the call counts are tests/test_measure_pools.py's."""
import os

import numpy as np

from workers import MeasureOptions
from workers.task import HostTimedCall
from workers.timing import cache_flusher, last_level_cache_bytes


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_flush_before_a_timed_call_writes_twice_the_last_level_cache():
    """A flush of just the last-level cache's size leaves part of the kernel's data in it (caches do not evict in
    strict LRU order). The flush buffer is made at a process's first flushed sample, zeroed pages the kernel maps
    only when written, so the memory this process gains over that sample is what the flush wrote."""
    timed = HostTimedCall(lambda: None, np.zeros(1))
    cache_flusher.cache_clear()
    before = resident_bytes()
    timed.samples(MeasureOptions(repeat=1))
    written, wanted = resident_bytes() - before, 2 * last_level_cache_bytes()
    assert wanted <= written < wanted + (16 << 20), (written, wanted)
