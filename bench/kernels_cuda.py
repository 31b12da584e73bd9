"""`tensortune bench kernels --target cuda`: the best config found per shape beside CuPy's matmul (cuBLAS),
both timed in this run on this GPU the same way (CUDA events, L2 flushed before each call).

The search is bench.kernels' (fallback and the template's seeds, a random third, greedy one-knob descent); the
final figures come from alternating rounds of ours and cuBLAS. Needs only NumPy, llvmlite, CuPy and the project's
search_space, workers and bench packages.
"""
from __future__ import annotations

import json
import time

from search_space import Target, Workload, batch_matmul, dense, matmul
from search_space.gpu_device import host_gpu
from workers.cuda_measure import CudaTimedCall, cublas_call, cuda_head_to_head

from .kernels import search

SHAPES = [
    matmul(1024, 1024, 1024), matmul(4096, 4096, 4096),
    dense(128, 768, 768), dense(128, 3072, 768), dense(128, 768, 3072),
    batch_matmul(12, 128, 128, 64),
]
MIN_REPEAT_MS = {True: 5.0, False: 20.0}  # by --quick


def bench_shape(workload: Workload, target: Target, trials: int, seed: int, quick: bool) -> dict:
    start = time.perf_counter()
    best, tried = search(workload, target, trials, seed, MIN_REPEAT_MS[quick])
    inputs = workload.random_inputs()
    calls = {"tensortune": CudaTimedCall(best.kernel, inputs), "cublas": cublas_call(workload, inputs)}
    seconds = cuda_head_to_head(calls, rounds=3 if quick else 7, min_repeat_ms=MIN_REPEAT_MS[quick])
    gflops = {name: workload.flops / s / 1e9 for name, s in seconds.items()}
    return {"workload": workload.key, "target": str(target), "gflops": round(gflops["tensortune"], 1),
            "cublas_gflops": round(gflops["cublas"], 1), "ratio": round(gflops["tensortune"] / gflops["cublas"], 3),
            "config": {"index": best.config.index, "knobs": best.config.to_dict()},
            "compile_ms": round(best.kernel.compile_seconds * 1e3, 1), "candidates": tried,
            "search_seconds": round(time.perf_counter() - start, 1)}


def run(quick: bool = False, json_lines: bool = False, trials: int | None = None, only: str | None = None,
        seed: int = 0, target: str = "cuda") -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    target_ = Target.parse(target)
    console = Console(stderr=json_lines)
    console.print(f"{host_gpu()}; target {target_}")
    rows = []
    for workload in [w for w in SHAPES if not only or only in w.key]:
        row = bench_shape(workload, target_, trials or (10 if quick else 60), seed, quick)
        rows.append(row)
        if json_lines:
            print(json.dumps(row), flush=True)
        else:
            console.print(f"{workload.key}: {row['gflops']:.0f} GFLOPS, cuBLAS {row['cublas_gflops']:.0f}, "
                          f"ratio {row['ratio']}")
    if not json_lines:
        table = Table(title=f"tensortune CUDA kernels vs cuBLAS (same run, {target_})")
        for column in ("workload", "GFLOPS", "cuBLAS", "ratio", "config", "candidates"):
            table.add_column(column)
        for r in rows:
            table.add_row(r["workload"], f"{r['gflops']:.0f}", f"{r['cublas_gflops']:.0f}", f"{r['ratio']:.2f}",
                          str(r["config"]["index"]), str(r["candidates"]))
        Console().print(table)
    return rows
