"""The tuner contract on real measurements of a small workload: fresh proposals, never a repeat."""
import random

import numpy as np
import pytest
from db_helpers import database, db_url, measurement  # noqa: F401 (fixtures)

from search_space import Target, get_space, matmul
from tuner import TUNERS, GridTuner
from tuner.sa import AnnealOptions, Annealer
from workers import MeasureInput
from workers.pool import make_pool
from workers.task import MeasureOptions, Task

WORKLOAD, TARGET = matmul(48, 40, 32), Target.parse("llvm -threads=1")
FAST = MeasureOptions(repeat=2, min_repeat_ms=1.0)


@pytest.fixture(scope="module")
def pool():
    with make_pool("local") as local:
        yield local


def make(name, space, seed=0):
    extra = {"workload": WORKLOAD, "target": TARGET} if name == "xgb" else {}
    return TUNERS[name](space, seed, **extra)


@pytest.mark.parametrize("name", sorted(TUNERS))
def test_tuners_never_propose_a_config_twice(name, pool):
    space = get_space(WORKLOAD, TARGET)
    tuner = make(name, space)
    proposed, gflops = [], []
    for _ in range(4):
        batch = tuner.propose(8)
        assert len(batch) == 8 and not {c.index for c in batch} & {c.index for c in proposed}
        results = pool.measure([Task.of(MeasureInput(WORKLOAD, TARGET, c)) for c in batch], FAST)
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        tuner.observe(batch, results)
        proposed += batch
        gflops += [r.gflops for r in results]
    assert tuner.best is not None and tuner.best[1].gflops == max(gflops) > 0
    assert len(tuner.visited) == 32


def test_grid_walks_the_space_in_index_order():
    space = get_space(WORKLOAD, TARGET)
    tuner = GridTuner(space)
    assert [c.index for c in tuner.propose(5)] == [0, 1, 2, 3, 4]


def test_anneal_finds_the_best_unseen_points_of_a_score():
    space = get_space(matmul(256, 256, 256), TARGET)
    target_config = space.get(space.size // 3)
    wanted = np.array([v for _, v in target_config.values], dtype=object)

    def score(configs):  # knobs equal to the target config's, counted
        return np.array([float(sum(a == b for a, b in zip([v for _, v in c.values], wanted))) for c in configs])

    exclude = {target_config.index}
    annealer = Annealer(space, random.Random(0), AnnealOptions(chains=16, steps=60))
    found = annealer.search(score, 10, exclude)
    assert len(found) == 10 and target_config.index not in {c.index for c in found}
    scores = score(found)
    assert list(scores) == sorted(scores, reverse=True)
    assert scores[0] >= len(wanted) - 1  # one knob away from the excluded optimum


def test_a_later_search_walks_few_new_points_and_recalls_every_point_scored_before():
    """Scoring a point lowers it (the cost of a search): a search after the first walks a few greedy steps from
    the best points, and the best under the new model may be one the walk passed long before."""
    space = get_space(matmul(256, 256, 256), TARGET)
    options = AnnealOptions(chains=16, steps=40, refine_chains=4, refine_steps=5)
    annealer = Annealer(space, random.Random(0), options)
    scored: list[int] = []
    knobs = lambda c: sum(len(str(v)) % 7 for _, v in c.values)  # any fixed score

    def first(configs):
        scored.extend(c.index for c in configs)
        return np.array([float(knobs(c)) for c in configs])

    start = space.get(space.size // 5)
    annealer.search(first, 10, set(), starts=[start])
    walked = set(scored)
    assert scored[0] == start.index and len(walked) > 16 * 10  # the walk began at the known good point
    favourite = sorted(walked)[len(walked) // 2]  # a point of the first walk, nothing special then
    scored.clear()

    def second(configs):
        scored.extend(c.index for c in configs)
        return np.array([1e9 if c.index == favourite else float(knobs(c)) for c in configs])

    found = annealer.search(second, 10, set())
    assert found[0].index == favourite
    new_points = set(scored) - walked
    assert len(new_points) <= options.refine_chains * options.refine_steps


def test_the_points_kept_for_re_scoring_are_the_most_recent_up_to_the_cap():
    space = get_space(matmul(256, 256, 256), TARGET)
    annealer = Annealer(space, random.Random(0), AnnealOptions(chains=8, steps=10, remembered=30))
    annealer.search(lambda configs: np.zeros(len(configs)), 5, set())
    assert len(annealer.scored) == 30
    annealer.search(lambda configs: np.zeros(len(configs)), 5, set())
    assert len(annealer.scored) == 30


def test_an_unknown_feature_kind_is_refused_when_the_options_are_made():
    from tuner.cost_model import CostModelOptions
    with pytest.raises(ValueError, match="unknown feature kind 'ast'; kinds: itervar, knob"):
        CostModelOptions(feature="ast")


def test_xgb_refits_after_every_batch_but_searches_only_every_research_every_trials(pool):
    """A search lowers thousands of configs; between searches the plan is re-ranked by the refit model."""
    from tuner.xgb_tuner import XGBOptions, XGBTuner

    tuner = XGBTuner(get_space(WORKLOAD, TARGET), 0, workload=WORKLOAD, target=TARGET,
                     options=XGBOptions(research_every=8, epsilon=0.0))
    searches, fits = [], []
    search, fit = tuner._search, tuner.model.fit
    tuner._search = lambda: searches.append(len(tuner.measured)) or search()
    tuner.model.fit = lambda *args: fits.append(len(args[0])) or fit(*args)
    for _ in range(6):
        batch = tuner.propose(4)
        tuner.observe(batch, pool.measure([Task.of(MeasureInput(WORKLOAD, TARGET, c)) for c in batch], FAST))
    assert fits == [4, 8, 12, 16, 20, 24]
    assert searches == [4, 12, 20]  # the first model's search, then one per 8 trials


def test_transfer_learns_only_from_the_other_shapes_measured_on_the_target_being_tuned(database):
    """Speeds measured with another thread count, on another CPU or on a GPU rank configs differently: the xgb
    tuner's base model starts from the op's other shapes as measured on this very target, and only those."""
    from tuner.cost_model import features
    from tuner.tune import history

    shape = matmul(32, 32, 32)
    here = [measurement(shape, TARGET, index, median) for index, median in [(3, 2e-5), (40, 1e-5), (500, 4e-5)]]
    elsewhere = [(shape, Target.parse("llvm -threads=2")), (shape, Target("llvm", "othercpu", TARGET.features, 1)),
                 (shape, Target.parse("cuda -arch=sm_90")), (matmul(16, 16, 16), Target.parse("llvm -threads=2"))]
    for pair in here:
        database.record(*pair)
    for workload, target in elsewhere:
        for index in (3, 7):
            database.record(*measurement(workload, target, index, 1e-6))
    past = history(database, WORKLOAD, TARGET)
    assert [len(gflops) for _, gflops in past] == [len(here)]
    (rows, gflops), = past
    expected = {result.gflops: features(shape, TARGET, get_space(shape, TARGET), measured.config, "itervar")
                for measured, result in here}
    assert sorted(gflops) == sorted(expected)
    for row, speed in zip(rows, gflops):
        np.testing.assert_array_equal(row, expected[speed])
