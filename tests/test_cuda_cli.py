"""The GPU path from the outside: `show --target cuda` and `--source`, the one-line refusals where no GPU can
measure, and which Ray agents a cuda candidate may go to."""
from __future__ import annotations

import re
import subprocess
import sys

import llvmlite.binding as llvm
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from db import Database
from search_space import Target
from search_space.gpu_device import local_gpu_problem
from service.api import create_app
from service.cli import app
from service.runner import Runner, RunnerOptions
from workers.nvrtc import compile_cuda
from workers.pool import lacking
from workers.pool_ray import Agent

NO_GPU = local_gpu_problem("sm_90")
MATMUL = ["matmul", "M=64", "N=48", "K=40"]


def show(*args: str):
    result = CliRunner().invoke(app, ["show", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_show_prints_the_gpu_loop_nest():
    out = show(*MATMUL, "--target", "cuda -arch=sm_90")
    assert "blockIdx.y for by in range(1):" in out and "threadIdx.x for ty in range(" in out and "barrier()" in out
    assert "# shared   As[" in out


def test_show_source_prints_cuda_c_alone_and_it_compiles():
    code = show("dense", "M=8", "N=24", "K=16", "bias=true", "epilogue=gelu", "--target", "cuda -arch=sm_80", "--source")
    assert code.startswith('extern "C" __global__ void __launch_bounds__(') and code.rstrip().endswith("}")
    assert set(compile_cuda(code, "sm_80").usage) == {"gemm"}


def test_show_source_prints_llvm_ir_alone_for_llvm():
    module = llvm.parse_assembly(show(*MATMUL, "--target", "llvm -threads=1", "--source"))
    module.verify()
    assert {f.name for f in module.functions} >= {"compute"}


@pytest.mark.skipif(not NO_GPU, reason="this host has a GPU")
def test_tune_for_cuda_without_a_gpu_is_one_line(tmp_path):
    for target in ("cuda", "cuda -arch=sm_90"):
        done = subprocess.run([sys.executable, "-m", "service", "tune", *MATMUL, "--target", target,
                               "--db", str(tmp_path / "t.db")], capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr.startswith("error: no CUDA GPU on this host") and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(bool(NO_GPU), reason=f"needs a CUDA GPU: {NO_GPU}")
def test_tune_for_cuda_times_its_best_beside_cublas_on_the_gpu(tmp_path):
    done = subprocess.run([sys.executable, "-m", "service", "tune", "matmul", "M=512", "N=512", "K=512", "--target",
                           "cuda", "--trials", "8", "--db", str(tmp_path / "t.db")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    timed = next(line for line in done.stdout.splitlines() if "timed now" in line)
    ours, theirs = (float(figure) for figure in re.findall(r"([\d.]+) GFLOPS", timed))
    assert "alternately with cuBLAS's" in timed and ours > 0.05 * theirs, timed  # not NumPy's, not copies timed


@pytest.mark.skipif(not NO_GPU, reason="this host has a GPU")
def test_the_service_refuses_a_cuda_job_its_local_pool_cannot_measure(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/api.db")
    client = TestClient(create_app(database, Runner(database, RunnerOptions(workers="local"))))
    job = {"workload": {"op": "matmul", "params": {"M": 64, "N": 64, "K": 64}}, "trials": 4}
    refused = client.post("/api/jobs", json=job | {"target": "cuda -arch=sm_90"})
    assert refused.status_code == 422 and "no CUDA GPU on this host" in refused.json()["detail"]
    assert client.post("/api/jobs", json=job | {"target": "cuda"}).status_code == 422
    assert client.post("/api/jobs", json=job | {"target": "llvm -threads=1"}).status_code == 201


def test_cuda_candidates_go_only_to_agents_with_a_gpu_of_the_target():
    h100 = Agent(None, "cuda", "NVIDIA H100 80GB HBM3", "node-1", "sm_90")
    a100 = Agent(None, "cuda", "NVIDIA A100-SXM4-40GB", "node-2", "sm_80")
    blind = Agent(None, "cuda", "", "node-3", "")  # a GPU resource where CuPy sees no GPU
    cpu = Agent(None, "llvm", "znver3", "node-1", cores=2, features=("avx", "avx2", "fma"))
    for target, serving in [("cuda -arch=sm_90", [h100]), ("cuda -device=NVIDIA_H100_80GB_HBM3 -arch=sm_90", [h100]),
                            ("cuda -device=NVIDIA_H200 -arch=sm_90", []), ("cuda -arch=sm_80", [a100]),
                            ("llvm -mcpu=znver3 -mattr=+avx2 -threads=2", [cpu]),
                            ("llvm -mcpu=znver3 -mattr=+avx2 -threads=4", []),  # more threads than its cores
                            ("llvm -mcpu=znver3 -mattr=+avx2,+avx512f -threads=2", [])]:  # a feature it lacks
        assert [a for a in (h100, a100, blind, cpu) if a.serves(Target.parse(target))] == serving
    # what a job no agent serves waits for: the features its model's hosts lack, none where no host is of its model
    cpus = [(a.model, a.features) for a in (h100, cpu) if a.kind == "llvm"]
    assert [lacking(Target.parse(target), cpus) for target in (
        "llvm -mcpu=znver3 -mattr=+avx2,+avx512f,+avx512bw -threads=2", "llvm -mcpu=znver4 -mattr=+avx512f -threads=2",
        "cuda -arch=sm_90")] == ["avx512bw, avx512f", "", ""]
