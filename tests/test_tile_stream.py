"""bench.tile_stream: the 2 × 2-tile step loop it times is a real product in every placement (on an AMX host), compiles
to one tile load per tile product (on any host, as a Sapphire Rapids' assembly), refuses shapes it cannot tile and
targets without AMX, and prints its table, the template's own kernel last."""
import re
import warnings

import numpy as np
import pytest

from bench import tile_stream
from bench.tile_stream import PLACEMENTS, STEP, operands, stream_call, stream_module
from db import Database
from search_space import Target, dense, fallback_config, get_space
from workers.llvm_jit import emit_assembly
from tests.db_helpers import measurement
from tests.test_amx import SAPPHIRE, on_amx_host


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_each_step_loads_a_tile_for_each_product_it_runs(placement):
    assembly = emit_assembly(stream_module("bfloat16", 128, 768, 768, placement), SAPPHIRE)
    loads, products = (len(re.findall(rf"\b{name}\b", assembly)) for name in ("tileloadd", "tdpbf16ps"))
    assert loads >= 4 and loads % 4 == 0
    assert products == (0 if placement == "loads" else loads)


def test_shapes_it_cannot_tile_are_refused():
    with pytest.raises(ValueError, match="multiples of 32 and K of 32: got 100 × 768 × 768"):
        stream_call("bfloat16", 100, 768, 768, "stream")
    with pytest.raises(ValueError, match="K of 64"):
        stream_call("int8", 128, 768, 96, "stream")


def test_main_exits_with_the_reason_it_cannot_run(monkeypatch):
    """A shape it cannot tile (or, on a host without AMX, the host itself): a message, not a traceback or a fault."""
    monkeypatch.setattr("sys.argv", ["tile_stream", "100", "768", "768"])
    with pytest.raises(SystemExit, match="^(tile_stream needs M and N multiples|bench.tile_stream times AMX)"):
        tile_stream.main()


@pytest.mark.parametrize("dtype, missing", [("bfloat16", "amx-bf16, amx-tile"), ("int8", "amx-int8, amx-tile")])
def test_a_target_without_amx_is_refused_before_anything_compiles(dtype, missing):
    """As on a host without AMX: the tile instructions would not compile, and would fault if run."""
    with pytest.raises(ValueError, match=f"times AMX's tile products, and .* has no {missing}$"):
        stream_call(dtype, 128, 768, 768, "stream", target="llvm -mattr=-amx-tile -threads=1")


@on_amx_host
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("shape", [(32, 64, 128), (64, 96, 256)])
def test_every_placement_computes_its_product(dtype, shape):
    """stream: A · B; in L1: the first step's product once per step; loads: the zero tiles it started from."""
    m, n, k = shape
    a, b, _ = operands(m, n, k, dtype)
    depth = STEP * (2 if dtype == "bfloat16" else 4)
    wanted = {"stream": a.astype(np.float64) @ b.astype(np.float64),
              "in L1": k // depth * (a[:, :depth].astype(np.float64) @ b[:depth].astype(np.float64)),
              "loads": np.zeros((m, n))}
    for placement, want in wanted.items():
        call, c = stream_call(dtype, m, n, k, placement)
        call()
        np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-3)


@on_amx_host
@pytest.mark.parametrize("stored", [False, True])
def test_main_prints_each_way_beside_the_peak(stored, monkeypatch, capsys, tmp_path):
    """The four ways, then the template's kernel: the database's best config of the shape, else the fallback."""
    workload, target = dense(64, 64, 128, dtype="bfloat16"), Target.parse("llvm -threads=1")
    space = get_space(workload, target)
    config = space.nearest(dict(fallback_config(workload, target).values) | {"tile_m": (-1, 1, 64)}) if stored else \
        fallback_config(workload, target)
    monkeypatch.setenv("TENSORTUNE_DB", str(tmp_path / "records.db"))
    with Database() as database:
        if stored:
            database.record(*measurement(workload, target, config.index, 1e-5))
    monkeypatch.setattr(tile_stream, "ROUNDS", 2)
    monkeypatch.setattr("sys.argv", ["tile_stream", "64", "64", "128"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tile_stream.main()
    assert any("fallback configuration" in str(w.message) for w in caught) != stored
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("amx-bf16, C[64 × 64] = A[64 × 128] · B in 2 × 2 tiles, one thread")
    rows = [re.fullmatch(r"  (.+?) +(\d+) \((\d+)-(\d+)\) +(\d+)% of the peak(.*)", line) for line in lines[1:]]
    assert [row.group(1) for row in rows] == ["the tile products alone (peak)", "2 × 2 tiles, operands in L1",
                                              "2 × 2 tiles, streaming", "the stream's loads alone",
                                              "the template's dense kernel"]
    assert all(0 < int(row.group(3)) <= int(row.group(2)) <= int(row.group(4)) for row in rows)
    assert rows[0].group(5) == "100"
    origin = "the best stored" if stored else "the fallback: none stored"
    assert [row.group(6) for row in rows] == [""] * 4 + [f": config {config.index}, {origin}"]
