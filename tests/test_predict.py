"""Predicted configs: from real measurements of an op's other shapes, a valid config of an unseen shape's space,
for every CPU op; from another target's records when this one has none; none from too few records; what
apply_history_best and the torch backend build a shape nobody tuned with."""
import json
import logging
import subprocess
import sys
import time
import warnings

import pytest

from db import Database, apply_history_best
from db.served import measured_here
from search_space import Target, batch_matmul, conv2d, dense, fallback_config, get_space, matmul
from tuner.predict import MIN_RECORDS, REUSE_SECONDS, predict_config, stored_prediction
from tuner.tune import tune
from workers import build
from workers.pool import make_pool
from workers.task import MeasureOptions

TARGET = Target.parse("llvm -threads=1")
FAST = MeasureOptions(repeat=2, min_repeat_ms=1.0)
TRIALS = 12  # per tuned shape: two shapes give more than MIN_RECORDS records

# per op: two shapes to tune, and an unseen one to predict for
OPS = {
    "dense": ([dense(16, 32, 32, bias=True), dense(24, 64, 32, bias=True)], dense(40, 48, 64, bias=True)),
    "matmul": ([matmul(16, 32, 32), matmul(32, 16, 48)], matmul(40, 24, 24)),
    "batch_matmul": ([batch_matmul(2, 16, 16, 16), batch_matmul(3, 8, 32, 16)], batch_matmul(4, 12, 20, 16)),
    "conv2d": ([conv2d(1, 4, 8, 8, 8, 3, 3, 1, 1), conv2d(1, 8, 6, 6, 4, 3, 3, 1, 1)], conv2d(1, 6, 7, 7, 6, 3, 3, 1, 1)),
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A database with every op's two shapes tuned for a few trials on TARGET."""
    database = Database(f"sqlite:///{tmp_path_factory.mktemp('predict')}/p.db")
    with make_pool("local") as pool:
        for shapes, _ in OPS.values():
            for workload in shapes:
                tune(workload, TARGET, TRIALS, "random", database, pool, batch=6, measure=FAST)
    yield database
    database.close()


@pytest.mark.parametrize("op", OPS)
def test_a_prediction_is_a_valid_config_of_an_unseen_shape(tuned, op):
    shapes, unseen = OPS[op]
    assert not tuned.best(unseen, TARGET)
    prediction = predict_config(tuned, unseen, TARGET)
    assert prediction is not None and prediction.targets == (TARGET,)
    assert prediction.shapes == len(shapes) and prediction.records == TRIALS * len(shapes)
    space = get_space(unseen, TARGET)
    assert space.get(prediction.config.index) == prediction.config  # a point of the unseen shape's own space
    assert predict_config(tuned, unseen, TARGET) == prediction  # deterministic: the same records, the same answer


def test_another_targets_records_predict_when_this_one_has_none(tuned):
    two_threads = Target.parse("llvm -threads=2")
    unseen = dense(40, 48, 64, bias=True)
    prediction = predict_config(tuned, unseen, two_threads)
    assert prediction is not None and prediction.targets == (TARGET,)
    assert get_space(unseen, two_threads).get(prediction.config.index) == prediction.config


def test_too_few_records_predict_nothing(tmp_path):
    with Database(f"sqlite:///{tmp_path}/few.db") as database, make_pool("local") as pool:
        tune(dense(16, 32, 32), TARGET, MIN_RECORDS - 4, "random", database, pool, batch=6, measure=FAST)
        assert predict_config(database, dense(24, 32, 32), TARGET) is None


def test_predict_command_prints_the_config_or_says_why_not(tuned, tmp_path):
    run = [sys.executable, "-m", "service", "predict", "dense", "M=40", "N=48", "K=64", "bias=true",
           "--target", str(TARGET), "--db", str(tuned.url)]
    printed = json.loads(subprocess.run(run + ["--json"], capture_output=True, text=True, check=True).stdout)
    space = get_space(dense(40, 48, 64, bias=True), TARGET)
    assert space.get(printed["config"]["index"]).to_dict() == printed["config"]["knobs"]
    assert printed["records"] == 2 * TRIALS and printed["trained_on"] == [str(TARGET)]
    refused = subprocess.run(run[:4] + ["conv2d", "N=1", "C=4", "H=9", "W=9", "K=4", "R=1", "S=1", "stride=1", "pad=0",
                                        "--db", f"sqlite:///{tmp_path}/none.db"],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "too few records of conv2d" in refused.stdout + refused.stderr


def test_apply_history_best_builds_an_untuned_shape_with_its_prediction_and_says_so(tuned):
    unseen = matmul(40, 24, 24)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with apply_history_best(tuned):
            built = [build(unseen, TARGET), build(unseen, TARGET)]
    assert built[0].config == built[1].config == predict_config(tuned, unseen, TARGET).config
    assert [str(w.message) for w in caught] == [
        f"No config measured for workload={unseen.key} on target={TARGET}; using the config "
        f"{predict_config(tuned, unseen, TARGET).describe()}."]
    with tuned.read_sessions() as session, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with apply_history_best(session):  # a bare session: nothing to train on, so the fallback
            assert build(unseen, TARGET).config == fallback_config(unseen, TARGET)
    assert "A fallback configuration is used" in str(caught[0].message)


def test_the_backend_runs_a_shape_with_no_tuned_neighbour_on_its_predicted_config(tuned, caplog):
    """A linear layer without bias has no tuned shape of its options to borrow from: the dense records of the
    shapes with bias predict its config, said in one line, and the model computes what eager does."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(48, 40, bias=False).eval()
    x = torch.randn(8, 48)
    caplog.set_level(logging.INFO, logger="tensortune.frontend")
    with torch.inference_mode():
        compiled = torch.compile(model, backend="tensortune", options={"db": str(tuned.url), "target": str(TARGET)})
        assert torch.allclose(compiled(x), model(x), atol=1e-4)
    unseen = dense(8, 40, 48)
    lines = [r.getMessage() for r in caplog.records if r.name == "tensortune.frontend" and "predicted" in r.getMessage()]
    assert lines == [f"tensortune: 1 kernels have no tuned shape of their op to borrow a config from and run predicted "
                     f"ones: {unseen.label} ({predict_config(tuned, unseen, TARGET).describe()})"]


def test_a_served_predicted_config_counts_as_one_to_tune():
    workload = dense(8, 40, 48)
    assert measured_here(workload, {"from_workload": workload.key, "predicted": None})
    assert not measured_here(workload, {"from_workload": workload.key, "predicted": "predicted by a cost model"})
    assert not measured_here(workload, {"from_workload": dense(9, 40, 48).key, "predicted": None})


def test_a_prediction_is_reused_for_a_while_then_made_anew(tuned, monkeypatch):
    """The service predicts at every fetch of an untuned workload: within REUSE_SECONDS it answers from before."""
    unseen = batch_matmul(4, 12, 20, 16)
    first = stored_prediction(tuned, unseen, TARGET)
    assert first is not None and stored_prediction(tuned, unseen, TARGET) is first
    later = time.monotonic() + REUSE_SECONDS + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    again = stored_prediction(tuned, unseen, TARGET)
    assert again is not first and again == first  # trained anew on the same records: the same answer
