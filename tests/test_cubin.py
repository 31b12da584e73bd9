"""A cubin's declared usage (registers, static shared memory per kernel) read from its ELF agrees with ptxas' own
report, on every architecture this NVRTC compiles for, for the GPU template's kernels (split-k's second one too)."""
from __future__ import annotations

import re

import pytest
from cuda.bindings import nvrtc

from search_space import Target, batch_matmul, dense, fallback_config, get_space, lower, matmul
from search_space.gpu_device import KNOWN_CC
from workers.cuda_codegen import generate
from workers.nvrtc import compile_cuda

SM_90 = Target.parse("cuda -arch=sm_90")
ARCHES = sorted(set(KNOWN_CC) & set(nvrtc.nvrtcGetSupportedArchs()[1]))  # NVRTC 13 dropped those before sm_75


def ptxas_report(log: str) -> dict[str, tuple[int, int]]:
    """(registers, shared bytes) per kernel from ptxas' -v lines: "Compiling entry function 'gemm' for 'sm_90'",
    then "Used 57 registers, used 1 barriers, 17408 bytes smem"."""
    report, kernel = {}, None
    for line in log.splitlines():
        if match := re.search(r"Compiling entry function '(\w+)'", line):
            kernel = match.group(1)
        elif match := re.search(r"Used (\d+) registers", line):
            shared = re.search(r"(\d+) bytes smem", line)
            report[kernel] = (int(match.group(1)), int(shared.group(1)) if shared else 0)
    return report


@pytest.mark.parametrize("workload", [matmul(64, 96, 80), dense(7, 9, 3000, bias=True, epilogue="gelu"),
                                      batch_matmul(12, 128, 128, 64)])
def test_usage_from_the_cubin_is_what_ptxas_reports(workload):
    configs = [fallback_config(workload, SM_90), *get_space(workload, SM_90).sample(3, 1)]  # split-k: a 2nd kernel
    sources = [generate(lower(workload, SM_90, config)) for config in configs]
    for i, cc in enumerate(ARCHES):  # each architecture compiles one of the configs, each config several
        source = sources[i % len(sources)]
        cubin = compile_cuda(source.code, f"sm_{cc}")
        report = ptxas_report(cubin.log)
        if not report:
            pytest.skip("no ptxas report in the log (NVRTC 13 leaves it out of a second compile of the same code)")
        assert set(report) == {name for name, _ in source.kernels}
        assert {name: (u.registers, u.shared_bytes) for name, u in cubin.usage.items()} == report, cc


def test_a_second_compile_of_the_same_code_declares_the_same_usage():
    source = generate(lower(matmul(64, 96, 80), SM_90, fallback_config(matmul(64, 96, 80), SM_90)))
    first, again = (compile_cuda(source.code, "sm_90") for _ in range(2))
    assert first.usage == again.usage and first.usage["gemm"].registers > 0
