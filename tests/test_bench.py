"""The benchmarks' output formats (their figures are read in bench/, never asserted here)."""
import json
import mmap
import statistics
import threading
from collections import Counter

import numpy as np
import pytest

from typer.testing import CliRunner

from bench import startup
from bench.kernels import bench_shape
from search_space import Target, Workload, matmul
from service.cli import app
from tests.test_cli_model import MODEL_FILE
from workers import openblas

FIELDS = {"workload", "threads", "gflops", "numpy_gflops", "torch_gflops", "ratio", "peak_fraction", "config",
          "launch_us"}


def test_bench_kernels_json_lines():
    result = CliRunner().invoke(app, ["bench", "kernels", "--quick", "--json", "--trials", "2", "--only", "batch_matmul(B=12,M=128,N=128"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert {row["threads"] for row in rows} >= {1}
    for row in rows:
        assert FIELDS <= set(row)
        assert row["workload"] == "batch_matmul(B=12,M=128,N=128,K=64,dtype=float32)"
        assert row["gflops"] > 0 and row["numpy_gflops"] > 0 and row["peak_gflops"] > 0
        assert_figures_come_from_the_rounds(row)
        assert set(row["config"]["knobs"]) >= {"tile_m", "tile_n", "vec", "parallel", "pack_b"}
    note = openblas.forced_note()  # where the environment forced NumPy's kernel (tests/test_openblas.py), it says so
    said = " ".join(result.output.split())
    assert " ".join(note.split()) in said if note else "which the environment forces" not in said


def assert_figures_come_from_the_rounds(row: dict) -> None:
    """Each way's GFLOPS is from the median of its samples (one a round); the ratio to the faster reference and the
    fraction of the peak are the medians of the rounds' ratios, with their quartiles (each figure to 3 places, the
    samples to 6 of a ms)."""
    samples = {way: np.array(values) for way, values in row["samples_ms"].items()}
    rounds = {len(values) for values in samples.values()}
    assert rounds == {3}, rounds  # --quick
    flops = Workload.from_key(row["workload"]).flops
    median = np.median(samples["tensortune"])
    # to 2 places, from samples given to 6 places of a ms (of a 10 µs sample, 5e-5 of its value)
    assert abs(row["gflops"] - flops / median / 1e6) <= 0.005 + flops / median / 1e6 * 5e-7 / median + 1e-9

    def assert_quartiles(key: str, ratios: np.ndarray, rtol: float = 1e-4) -> None:
        stated = [row[f"{key}_spread"][0], row[key], row[f"{key}_spread"][1]]
        assert np.allclose(stated, np.percentile(ratios, (25, 50, 75)), rtol=rtol, atol=6e-4), (key, stated, ratios)

    faster = np.min([samples[way] for way in ("numpy", "torch") if way in samples], axis=0)
    assert_quartiles("ratio", faster / samples["tensortune"])
    # the peak's flops from its GFLOPS, to 2 places: a peak slowed to a few GFLOPS by the other test process is off
    peak_flops = row["peak_gflops"] * 1e6 * np.median(samples["peak"])
    assert_quartiles("peak_fraction", samples["peak"] / samples["tensortune"] * flops / peak_flops,
                     1e-4 + 0.005 / row["peak_gflops"])
    assert row["ratio_spread"][0] <= row["ratio"] <= row["ratio_spread"][1]


def test_a_rows_peak_is_timed_in_the_rounds_of_its_kernel():
    """A shared host's neighbours slow timings in phases of seconds: the row's peak is the family's peak kernel timed
    head to head with the row's kernels, not the figure measured at the run's start (here an absurd 1 GFLOPS)."""
    row = bench_shape(matmul(64, 64, 64), Target.parse("llvm -threads=1"), 2, 0, True, {"fma": 1.0})
    assert row["family"] == "fma" and row["peak_gflops"] > 10
    # its fraction from the same rounds (not "below 1": a 64³ product ran at 1.16 of a peak timed beside the other
    # test process)
    assert_figures_come_from_the_rounds(row)
    assert bench_shape(matmul(64, 64, 64), Target.parse("llvm -threads=1"), 2, 0, True)["peak_gflops"] is None

def test_bench_kernels_in_bfloat16_against_pytorchs_bfloat16():
    """NumPy has no bfloat16 worth timing: PyTorch's is the reference, and each row's peak is that of the instruction
    family its config uses."""
    result = CliRunner().invoke(app, ["bench", "kernels", "--quick", "--json", "--trials", "2", "--dtype", "bfloat16",
                                      "--only", "dense(M=128,N=768,K=768"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert rows and {row["workload"] for row in rows} == {"dense(M=128,N=768,K=768,dtype=bfloat16)"}
    for row in rows:
        assert row["numpy_gflops"] is None and row["torch_gflops"] > 0 and row["family"] == row["config"]["knobs"]["isa"]
        assert set(row["samples_ms"]) == {"tensortune", "torch", "peak"}
        assert_figures_come_from_the_rounds(row)
    refused = CliRunner().invoke(app, ["bench", "kernels", "--dtype", "int4"])
    assert refused.exit_code == 2 and "unknown dtype 'int4'; known: float32, bfloat16, int8" in refused.output


def test_bench_kernels_on_a_narrowed_target_keeps_to_its_features():
    """`--target 'llvm -mattr=-...'` narrows the host at both thread counts: here to bfloat16's families for any CPU,
    on any host, each row held to the FMA's peak (the widened copies' too); a feature LLVM does not know ends the
    command in one line."""
    narrowed = "llvm -mattr=-avx512bf16,-amx-tile"
    result = CliRunner().invoke(app, ["bench", "kernels", "--quick", "--json", "--trials", "2", "--dtype", "bfloat16",
                                      "--only", "dense(M=128,N=768,K=768", "--target", narrowed])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert rows and {row["family"] for row in rows} <= {"fma", "fma-f32"}
    # the FMA's peak kernel timed in each row's rounds (its fraction from them, not a bound: a 2-thread peak timed
    # beside the other test process is slowed as much as the kernel or not at all)
    for row in rows:
        assert row["peak_gflops"] > 0 and row["peak_fraction"] > 0
        assert_figures_come_from_the_rounds(row)
    assert not any("avx512bf16" in row["target"] or "amx-tile" in row["target"] for row in rows)
    refused = CliRunner().invoke(app, ["bench", "kernels", "--target", "llvm -mattr=-avx513f"])
    assert refused.exit_code == 1 and "unknown feature 'avx513f'" in refused.output


def test_bench_kernels_table_keeps_whole_workload_labels_at_80_columns(capsys, monkeypatch):
    """The table once cut every workload to `matmul(M=5…` at 80 columns; the rows are its own shapes, the
    figures as wide as they come."""
    from bench.kernels import SHAPES, print_table

    monkeypatch.setenv("COLUMNS", "80")
    print_table([{"workload": shape.key, "threads": threads, "target": f"llvm -threads={threads}", "gflops": 1234.5,
                  "numpy_gflops": 1234.5, "torch_gflops": 1234.5, "ratio": 1.0, "ratio_spread": [0.95, 1.05],
                  "peak_fraction": 0.99,
                  "config": {"index": 12345678}} for threads in (1, 2) for shape in SHAPES])
    shown = capsys.readouterr().out
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    tokens = Counter(token for shape in SHAPES for token in shape.label.split())
    assert Counter(shown.split()) >= Counter({token: 2 * count for token, count in tokens.items()}), shown


def test_bench_workers_spread_alternates_pool_process_and_fma():
    from bench.workers import spread
    from workers import PoolOptions, make_pool

    pool = make_pool("local", PoolOptions(workers=1))
    try:
        row = spread(pool, rounds=2, settle_seconds=0.0)
    finally:
        pool.close()
    for side in ("pool", "in_process", "fma"):
        medians = row["median_us"][side]
        assert len(medians) == 2 and min(medians) > 0
        assert row[side]["spread"] == pytest.approx(max(medians) / min(medians) - 1)
        assert row[side]["median_over_fastest"] == pytest.approx(statistics.median(medians) / min(medians) - 1)
    assert min(row["fma_gflops"]) > 1


def test_bench_noise_traces_each_kernel_and_finds_slow_phases():
    """The tile products' trace only where the host has AMX (a CPU without it faults on them)."""
    import numpy as np

    from bench.noise import summary, trace
    from search_space import host_target
    values = trace(0.1)
    amx = {"amx-tile", "amx-bf16"} <= set(host_target().features)
    assert set(values) == {"gemm", "fma"} | ({"amx"} if amx else set())
    assert all(len(v) >= 1 and v.min() > 0 for v in values.values())
    line = summary(np.array([1.0, 1.0, 1.2, 1.3, 1.0, 1.5]))
    assert "slow (>10%) 50% of the time, in 2 phase(s) of 1-2 measurements" in line


def test_bench_frame_stack_finds_the_thrash_plainly_and_not_through_the_runner():
    """Page faults are counts, not timings: at the caller depth where a plain graph call maps a chunk for each call it
    makes, the runner's maps one (its own entry's frame), once the runner's greenlet is made (CI's Zen 1 counted 27
    faults in the runner's first five calls, 22 of them that making), and those of this thread alone."""
    from bench.frame_stack import CALLS, measure
    from frontend.frame_stack import THRASHES
    if not THRASHES:
        pytest.skip("this Python keeps a spare chunk (3.13+): nothing thrashes")
    stop = threading.Event()

    def faulting():  # another thread mapping fresh pages all along, as in CI's run of the whole suite
        while not stop.is_set():
            with mmap.mmap(-1, 64 * mmap.PAGESIZE) as pages:
                pages[::mmap.PAGESIZE] = bytes(64)  # a byte a page: 64 faults

    neighbour = threading.Thread(target=faulting)
    neighbour.start()
    try:
        row = measure(rounds=1, repeat=5)
    finally:
        stop.set()
        neighbour.join()
    assert row["plain"]["faults"] >= CALLS and row["runner"]["faults"] < CALLS / 10
    assert row["plain"]["us"] > 0 and row["runner"]["us"] > 0


def test_bench_kernels_search_measures_the_templates_seeds_first():
    """With a budget of the fallback and the seeds, those are what the search measures, as the tuner's first batch."""
    from bench.kernels import search
    from search_space import Target, dense, fallback_config, seed_configs

    workload, target = dense(16, 64, 64), Target.parse("llvm -threads=1")
    first = {c.index for c in [fallback_config(workload, target), *seed_configs(workload, target)]}
    best, tried = search(workload, target, trials=len(first), seed=0, min_repeat_ms=1.0)
    assert tried == len(first) and best.config.index in first


def test_bench_startup_loads_every_kernel_from_the_cache_at_the_second_start(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "models.py").write_text(MODEL_FILE)
    startup.main([f"{tmp_path}/models.py:tiny", "--db", f"sqlite:///{tmp_path}/empty.db", "--rounds", "1"])
    table = capsys.readouterr().out
    assert "(2 kernels, 0 loaded)" in table and "(2 kernels, 2 loaded)" in table and "as fast" in table
