"""The dashboard's NumPy reference line: NumPy's GFLOPS on a workload's shape (in float32: NumPy has no fast
bfloat16), measured once per workload and thread count in the service process and cached, since timing it costs
about a second."""
from __future__ import annotations

import threading

from search_space import Workload


class NumpyReference:
    def __init__(self):
        self._gflops: dict[tuple[str, int], float] = {}
        self._measuring = threading.Lock()  # one timing at a time: two at once would halve each other

    def gflops(self, workload: Workload, threads: int) -> float:
        from workers.reference import head_to_head, reference_calls

        key = (workload.key, threads)
        with self._measuring:
            if key not in self._gflops:
                wide = workload.in_dtype("float32")
                calls = reference_calls(wide, threads, wide.random_inputs(), pytorch=False)
                seconds = head_to_head({"numpy": calls["numpy"]}, threads, rounds=3)["numpy"]
                self._gflops[key] = workload.flops / seconds / 1e9
            return self._gflops[key]
