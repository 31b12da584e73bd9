"""TVM MetaSchedule on the same workloads, for the comparison in the tuner issue: its best
GFLOPS after N trials as its own runner measured them. TVM is not a tensortune dependency;
run this in a separate environment:

    python3 -m venv /tmp/tvm && . /tmp/tvm/bin/activate
    pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 psutil cloudpickle tornado xgboost numpy
    python bench/metaschedule.py --trials 64          # (with apache-tvm-ffi 0.1.15 its JSON writer segfaults)
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

WORKLOADS = {"matmul(M=1024,N=1024,K=1024)": (1024, 1024, 1024, False),
             "dense(M=128,N=768,K=768)": (128, 768, 768, True)}


def tune(m: int, n: int, k: int, dense: bool, trials: int) -> dict:
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    a = te.placeholder((m, k), name="A")
    b = te.placeholder((n, k) if dense else (k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * (b[j, r] if dense else b[r, j]), axis=r), name="C")
    func = te.create_prim_func([a, b, c])
    target = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
                                "num-cores": len(os.sched_getaffinity(0))})
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        database = ms.tune_tir(func, target, work, max_trials_global=trials, num_trials_per_iter=32,
                               database="memory")
        seconds = time.perf_counter() - start
        best = database.get_top_k(database.commit_workload(tvm.IRModule({"main": func})), 1)[0]
    run_seconds = sorted(float(s) for s in best.run_secs)
    return {"trials": trials, "tuning_seconds": round(seconds, 1), "target": str(target),
            "gflops": round(2 * m * n * k / run_seconds[len(run_seconds) // 2] / 1e9, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    args = parser.parse_args()
    for name, shape in WORKLOADS.items():
        print(json.dumps({"metaschedule": name} | tune(*shape, args.trials)), flush=True)


if __name__ == "__main__":
    main()
