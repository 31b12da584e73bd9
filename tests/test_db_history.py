"""apply_history_best with real kernels: the best stored config is built and computes the right answer; a shape
nothing was tuned at borrows the config of its nearest stored shape; records of another template version are never
applied, unversioned ones only where their config is in today's space."""
from __future__ import annotations

import contextvars
import json
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from db_helpers import database, db_url, measurement, other_threads  # noqa: F401 (fixtures)
from typer.testing import CliRunner

from db import Database, apply_history_best, export_log, similar_target_message
from db.matching import nearest_shapes
from search_space import Config, Target, conv2d, dense, fallback_config, get_space, host_target, matmul
from search_space.templates import gemm
from service.cli import app
from tuner.tune import borrowed_configs
from workers import MeasureInput, Outcome, build

WORKLOAD = matmul(24, 24, 24)


def fallback_text(workload, target) -> str:
    return (f"Cannot find config for target={target}, workload={workload.key}. "
            "A fallback configuration is used, which may bring great performance regression.")


def check_output(kernel) -> None:
    inputs = kernel.workload.random_inputs()
    np.testing.assert_allclose(kernel(*inputs), kernel.workload.reference(*inputs), atol=kernel.workload.tolerance)


def index_with(workload, target, start: int, **knobs) -> int:
    """The first config index from `start` on whose knobs have the given values."""
    space = get_space(workload, target)
    return next(i for i in range(start, space.size) if all(space.get(i)[k] == v for k, v in knobs.items()))


@pytest.fixture
def caught():
    with warnings.catch_warnings(record=True) as found:
        warnings.simplefilter("always")
        yield found


def messages(caught) -> list[str]:
    return [str(w.message) for w in caught]


def test_builds_with_the_measured_best(database, caught):
    target = host_target()
    for index, median in [(100, 3e-5), (2000, 1e-5), (30000, 2e-5)]:
        database.record(*measurement(WORKLOAD, target, index, median))
    database.record(*measurement(WORKLOAD, target, 5, 1e-8, Outcome.WRONG_ANSWER))
    with apply_history_best(database.url):
        kernel = build(WORKLOAD)
    assert kernel.config.index == 2000
    check_output(kernel)
    assert messages(caught) == []


def test_falls_back_with_one_exact_warning_per_workload(database, caught):
    other = matmul(16, 24, 8)
    target = host_target()
    with apply_history_best(database):
        kernels = [build(WORKLOAD), build(WORKLOAD, target), build(other), build(WORKLOAD)]
    assert messages(caught) == [fallback_text(WORKLOAD, target), fallback_text(other, target)]
    assert kernels[0].config == fallback_config(WORKLOAD, target)
    for kernel in kernels:
        check_output(kernel)


def test_most_similar_target_with_a_warning(database, caught):
    wanted, same_cpu = other_threads(1), other_threads(3)
    other_cpu = Target("llvm", "othercpu", ("avx", "avx2", "fma"), 1)
    serial = index_with(WORKLOAD, same_cpu, 0, parallel="none", vec=8)
    parallel = index_with(WORKLOAD, same_cpu, 0, parallel="m", vec=8)
    database.record(*measurement(WORKLOAD, same_cpu, parallel, 1e-6))  # fastest, but no such knob at 1 thread
    database.record(*measurement(WORKLOAD, same_cpu, serial, 2e-5))
    database.record(*measurement(WORKLOAD, other_cpu, 7, 1e-5))  # faster, on a less similar CPU
    with apply_history_best(database):
        kernel = build(WORKLOAD, wanted)
        build(WORKLOAD, wanted)
    assert kernel.config.to_dict() == get_space(WORKLOAD, same_cpu).get(serial).to_dict()
    check_output(kernel)
    assert messages(caught) == [similar_target_message(WORKLOAD, wanted, same_cpu)]


def test_a_one_thread_config_runs_on_more_threads_the_way_the_fallback_parallelises(database, caught):
    one, two = other_threads(1), other_threads(2)
    serial = get_space(WORKLOAD, one).get(index_with(WORKLOAD, one, 0, vec=8))
    database.record(*measurement(WORKLOAD, one, serial.index, 1e-6))
    with apply_history_best(database):
        kernel = build(WORKLOAD, two)
    assert kernel.config["parallel"] == fallback_config(WORKLOAD, two)["parallel"] != "none"
    others = lambda config: [knob for knob in config.values if knob[0] != "parallel"]
    assert others(kernel.config) == others(serial)
    check_output(kernel)
    assert messages(caught) == [similar_target_message(WORKLOAD, two, one)]


def test_contexts_nest_inner_first(database, db_url, tmp_path, caught):
    target, second = host_target(), matmul(16, 16, 16)
    database.record(*measurement(WORKLOAD, target, 111, 1e-5))
    database.record(*measurement(second, target, 222, 1e-5))
    with Database(f"sqlite:///{tmp_path / 'inner.db'}") as inner:
        inner.record(*measurement(WORKLOAD, target, 333, 1e-5))
        export_log(inner, tmp_path / "inner.log")
    with apply_history_best(db_url):
        with apply_history_best(tmp_path / "inner.log"):
            assert build(WORKLOAD).config.index == 333
            assert build(second).config.index == 222
        assert build(WORKLOAD).config.index == 111
    assert messages(caught) == []


def test_session_source(database):
    database.record(*measurement(WORKLOAD, host_target(), 4444, 1e-5))
    with database.sessions() as session, apply_history_best(session):
        assert build(WORKLOAD).config.index == 4444


def test_threads_share_one_context_and_keep_their_own(database, db_url, tmp_path):
    target = host_target()
    database.record(*measurement(WORKLOAD, target, 555, 1e-5))
    with Database(f"sqlite:///{tmp_path / 'b.db'}") as other:
        other.record(*measurement(WORKLOAD, target, 666, 1e-5))
    start = threading.Barrier(4)

    def build_in(source) -> int:
        with apply_history_best(source):
            start.wait()
            return build(WORKLOAD).config.index

    with ThreadPoolExecutor(4) as pool:
        own = list(pool.map(build_in, [db_url, tmp_path / "b.db"] * 2))
    assert own == [555, 666, 555, 666]

    with apply_history_best(db_url):
        context = contextvars.copy_context()
        with ThreadPoolExecutor(4) as pool:
            shared = list(pool.map(lambda _: context.copy().run(lambda: build(WORKLOAD).config.index), range(4)))
    assert shared == [555] * 4


def test_a_shape_never_tuned_borrows_from_the_nearest_stored_shape_of_its_op(database, caught):
    """Dense M=100 is nearest to M=64 (log ratio 0.44, against 0.94 for M=256). The stored M=100 with a relu
    (another option), a matmul of M=100 (another op) and the M=96 of another target are no candidates."""
    target, wanted = host_target(), dense(100, 48, 32, bias=True)
    near, far = dense(64, 48, 32, bias=True), dense(256, 48, 32, bias=True)
    index = {near: index_with(near, target, 40, tile_m=(-1, 4, 8)), far: 70}
    database.record(*measurement(near, target, index[near], 2e-5))
    database.record(*measurement(far, target, index[far], 1e-5))
    database.record(*measurement(dense(100, 48, 32, bias=True, epilogue="relu"), target, 5, 1e-6))
    database.record(*measurement(matmul(100, 48, 32), target, 6, 1e-6))
    database.record(*measurement(dense(96, 48, 32, bias=True), other_threads(target.threads + 1), 7, 1e-6))
    with apply_history_best(database) as history:
        found = history.query_nearest(wanted, target)
        assert history.query(wanted, target) is None  # borrowing answers query_nearest only
    assert found.workload == near
    assert found.config == get_space(wanted, target).config(get_space(near, target).get(index[near]).to_dict())
    check_output(build(wanted, target, found.config))
    assert messages(caught) == []


def test_a_borrowed_config_whose_tiles_do_not_fit_takes_the_nearest_that_does(database):
    """M=512's 64 × 8 row tile is too tall for M=16 (blocks stay under twice the rows): the nearest tile of M=16's
    space is taken, the other knobs as stored."""
    target, wanted, stored = host_target(), dense(16, 48, 32), dense(512, 48, 32)
    index = index_with(stored, target, 0, tile_m=(-1, 64, 8), order=("mo", "ko", "no"), unroll_k=2)
    database.record(*measurement(stored, target, index, 1e-5))
    with apply_history_best(database) as history:
        found = history.query_nearest(wanted, target)
    knobs, borrowed = get_space(stored, target).get(index).to_dict(), found.config.to_dict()
    assert found.workload == stored and borrowed["tile_m"] != knobs["tile_m"]
    assert {name: value for name, value in borrowed.items() if name != "tile_m"} == \
           {name: value for name, value in knobs.items() if name != "tile_m"}
    check_output(build(wanted, target, found.config))


@pytest.mark.parametrize("write, swapped", [("rows", "channels"), ("channels", "rows")])
def test_a_convolution_borrows_the_same_shape_laid_out_otherwise_its_write_back_swapped(database, write, swapped):
    """A convolution tuned NCHW serves the same one run channels last (a graph of convolutions runs them so) before
    another-sized one of its own layout would: the same space, but the write-back that stored contiguous rows
    becomes the one that stores contiguous channel vectors, and the other way round."""
    target = host_target()
    stored = conv2d(1, 16, 12, 12, 32, 3, 3, 1, 1, bias=True)
    wanted, other = (conv2d(1, 16, 12, w, 32, 3, 3, 1, 1, bias=True, layout="nhwc") for w in (12, 14))
    index = index_with(stored, target, 0, write=write)
    database.record(*measurement(stored, target, index, 1e-5))
    database.record(*measurement(other, target, 3, 1e-6))
    with apply_history_best(database) as history:
        found = history.query_nearest(wanted, target)
    knobs = get_space(stored, target).get(index).to_dict()
    assert found.workload == stored and found.config.to_dict() == knobs | {"write": swapped}
    check_output(build(wanted, target, found.config))
    # a tuning job of `wanted` measures it first among the configs it borrows
    assert borrowed_configs(database, wanted, target, get_space(wanted, target))[0] == found.config
    as_near = conv2d(1, 16, 12, 14, 32, 3, 3, 1, 1, bias=True)  # as near as `other`, laid out otherwise: after it
    assert nearest_shapes(wanted, [as_near, other, stored]) == [stored, other, as_near]


def test_the_shape_itself_when_stored_and_none_when_its_op_never_was(database):
    target, wanted = host_target(), dense(100, 48, 32, bias=True)
    database.record(*measurement(wanted, target, 123, 1e-5))
    database.record(*measurement(dense(64, 48, 32, bias=True), target, 456, 1e-6))
    with apply_history_best(database) as history:
        found = history.query_nearest(wanted, target)
        assert found.workload == wanted and found.config.index == 123
        assert history.query_nearest(matmul(100, 48, 32), target) is None


def test_a_template_version_change_makes_old_records_ignored(database, db_url, caught, monkeypatch):
    """After gemm's VERSION is bumped, its records are stale: builds fall back, `best` says to tune again, the
    job that measured them no longer counts as done, and a record of the new version is applied."""
    target = host_target()
    job = database.create_job(WORKLOAD, target, "random", 2, "done")
    for index, median in [(100, 3e-5), (2000, 1e-5)]:
        database.record(*measurement(WORKLOAD, target, index, median), job_id=job)
    assert database.done_job(WORKLOAD, target, "random", 2).id == job
    monkeypatch.setattr(gemm, "VERSION", gemm.VERSION + 1)
    assert database.done_job(WORKLOAD, target, "random", 2) is None  # the same request tunes anew, not shows it
    with apply_history_best(database):
        assert build(WORKLOAD).config == fallback_config(WORKLOAD, target)
    assert messages(caught) == [fallback_text(WORKLOAD, target)]
    shown = CliRunner().invoke(app, ["best", "matmul", "M=24", "N=24", "K=24", "--db", db_url])
    assert shown.exit_code == 1
    assert (f"2 record(s) of {WORKLOAD.key} on target {target}, all from template version {gemm.VERSION - 1} "
            f"(today's is {gemm.VERSION}): tune again") in " ".join(shown.stderr.split())
    database.record(*measurement(WORKLOAD, target, 30000, 2e-5))
    with apply_history_best(database):
        assert build(WORKLOAD).config.index == 30000


def autotvm_line(workload, target, config: Config, median: float) -> str:
    """A line as AutoTVM writes it: no template version."""
    return json.dumps({"input": [str(target), workload.op, [workload.p[d] for d in workload.spec.dims], {}],
                       "config": {"index": config.index, "code_hash": None,
                                  "entity": [[name, "ot", value] for name, value in config.to_dict().items()]},
                       "result": [[median] * 3, 0, 1.0, 1700000000.0], "version": 0.2})


def test_unversioned_records_apply_where_their_config_is_in_todays_space(database, tmp_path, monkeypatch):
    """An AutoTVM log's configs are applied whatever today's version, as long as today's space has them; a
    faster unversioned record whose knobs today's space has not is passed over."""
    target = host_target()
    config = get_space(WORKLOAD, target).get(2000)
    (tmp_path / "autotvm.log").write_text(autotvm_line(WORKLOAD, target, config, 2e-5) + "\n")
    with apply_history_best(tmp_path / "autotvm.log"):
        assert build(WORKLOAD).config == config
    monkeypatch.setattr(gemm, "VERSION", gemm.VERSION + 1)
    untemplated = Config(7, tuple((name, 99 if name == "unroll_k" else value) for name, value in config.values))
    database.record_many([(*measurement(WORKLOAD, target, 2000, 2e-5), None),
                          (MeasureInput(WORKLOAD, target, untemplated), measurement(WORKLOAD, target, 7, 1e-7)[1],
                           None)])
    with apply_history_best(database):
        kernel = build(WORKLOAD)
    assert kernel.config == config
    check_output(kernel)
