import itertools
import json
import random

import pytest

from search_space import ConfigSpace, InvalidConfig, Knob, Target, batch_matmul, dense, get_space, matmul

HOST = Target.parse("llvm")


def small_space():
    knobs = [Knob("a", "knob", (1, 2, 3)), Knob("b", "knob", (1, 2, 4, 8)), Knob("c", "annotate", ("x", "y"))]
    return ConfigSpace(knobs, [(("a", "b"), lambda a, b: a * b <= 8)])


def test_len_counts_exactly_the_valid_points():
    space = small_space()
    valid = [(a, b, c) for a, b, c in itertools.product((1, 2, 3), (1, 2, 4, 8), ("x", "y")) if a * b <= 8]
    assert len(space) == len(valid)
    assert sorted((c["a"], c["b"], c["c"]) for c in space) == sorted(valid)


def test_the_valid_tuples_come_in_the_order_of_the_filtered_product():
    """The space is built a knob at a time, the knobs of the largest rule first; its indices are still those of the
    product of the knobs in declared order, filtered: a record's index means the same config."""
    knobs = [Knob("a", "knob", (1, 2, 3, 4)), Knob("b", "knob", (4, 2, 1)), Knob("c", "knob", ("x", "y", "z")),
             Knob("d", "knob", (True, False)), Knob("e", "knob", (0, 1))]
    rules = [(("a", "b"), lambda a, b: a * b <= 8), (("c", "b", "d"), lambda c, b, d: c != "x" or d or b > 1),
             (("e", "c"), lambda e, c: e == 0 or c == "z")]  # b, c and d are chosen first, then a, then e
    space = ConfigSpace(knobs, rules)
    product = [dict(zip("abcde", v)) for v in itertools.product(*(k.candidates for k in knobs))]
    valid = [v for v in product if all(rule(*(v[n] for n in names)) for names, rule in rules)]
    assert [config.to_dict() for config in space] == valid and len(valid) < len(product)


def test_a_rule_is_asked_once_for_each_combination_of_its_knobs():
    """(c, d) is checked after a, b and c are chosen (the larger rule's knobs first): among the partial tuples its
    combinations repeat, and it is asked once for each of the 10 × 10, not once for each of the 100 (a, b, c)
    tuples times 10 values of d."""
    asked = []
    knobs = [Knob(name, "knob", tuple(range(10))) for name in "abcd"]
    rules = [(("a", "b", "c"), lambda a, b, c: a + b + c < 100),
             (("c", "d"), lambda c, d: asked.append((c, d)) or c != d)]
    space = ConfigSpace(knobs, rules)
    assert len(asked) == len(set(asked)) == 100 and len(space) == 10_000 * 9 // 10


def test_get_and_index_of_are_inverse():
    space = get_space(dense(128, 768, 768), HOST)
    for index in random.Random(0).sample(range(space.size), 200) + [0, space.size - 1]:
        config = space.get(index)
        assert space.index_of(config.to_dict()) == index


def test_nearest_chooses_constrained_knobs_jointly_earlier_knobs_first():
    """a=3 wanted with b=8 violates a·b ≤ 8: a is kept (it comes first) and b takes the closest value that fits it
    (2, a log ratio of 1.39 from 8, where 4 would not fit); c, alone in its digit, is matched as it is; a value that
    is no candidate (a=5) takes the nearest that is (3)."""
    space = small_space()
    assert space.nearest({"a": 3, "b": 8, "c": "y"}).to_dict() == {"a": 3, "b": 2, "c": "y"}
    assert space.nearest({"a": 5, "b": 1, "c": "x"}).to_dict() == {"a": 3, "b": 1, "c": "x"}
    assert space.nearest({"a": 1, "b": 8, "c": "x"}).to_dict() == {"a": 1, "b": 8, "c": "x"}


def test_nearest_reads_knobs_as_json_gives_them():
    """A config's knobs as `to_dict` (and JSON) give them, lists for split tuples: the nearest config is itself, not
    one whose splits were all as far from a list as could be."""
    space = get_space(dense(128, 768, 768), HOST)
    for index in random.Random(1).sample(range(space.size), 20):
        config = space.get(index)
        assert space.nearest(config.to_dict()) == config
        assert space.nearest(json.loads(json.dumps(config.to_dict()))) == config


def test_index_beyond_int64():
    knobs = [Knob(f"k{i}", "knob", tuple(range(10))) for i in range(25)]
    space = ConfigSpace(knobs)
    assert space.size == 10 ** 25 > 2 ** 63
    index = 10 ** 25 - 12345
    config = space.get(index)
    assert space.index_of(config.to_dict()) == index
    assert len({c.index for c in space.sample(50, 1)}) == 50


def test_sampling_is_distinct_and_honours_exclusions():
    space = small_space()
    every = space.sample(len(space), 3)
    assert len({c.index for c in every}) == len(space)
    some = space.sample(5, 4, exclude={0, 1, 2})
    assert len(some) == 5 and not {c.index for c in some} & {0, 1, 2}


def test_a_stratified_space_draws_its_small_alternative_as_often_as_its_large_one():
    """A family knob whose one value has 30 configs and the other 3000: drawn evenly, each within uniformly; once the
    small one is drawn out, the draws go on over what is left."""
    knobs = [Knob("family", "annotate", ("small", "large")), Knob("size", "knob", tuple(range(1000))),
             Knob("order", "knob", (0, 1, 2))]
    constraints = [(("family", "size"), lambda family, size: family == "large" or size < 10)]
    space, plain = ConfigSpace(knobs, constraints, "family"), ConfigSpace(knobs, constraints)
    small = lambda configs: sum(config["family"] == "small" for config in configs)
    assert 12 <= small(space.sample(40, 0)) <= 28 and small(plain.sample(40, 0)) <= 3  # uniform: 1 draw in 100
    every_small = {c.index for c in space if c["family"] == "small"}
    rest = space.sample(100, 2, exclude=every_small)
    assert len(rest) == 100 and small(rest) == 0


def test_neighbours_differ_in_exactly_one_knob():
    space = get_space(matmul(256, 256, 256), HOST)
    config = space.get(12345)
    neighbours = space.neighbours(config)
    assert neighbours
    for n in neighbours:
        differing = [k for k in space.knobs if n[k] != config[k]]
        assert len(differing) == 1
        assert space.index_of(n.to_dict()) == n.index


def test_json_round_trip():
    space = get_space(batch_matmul(12, 128, 128, 64), HOST)
    config = space.get(4242)
    text = config.to_json()
    assert space.from_json(text) == config
    assert space.from_json(json.loads(text)) == config


def test_foreign_configs_are_rejected_with_reasons():
    space = get_space(matmul(64, 64, 64), HOST)
    values = space.get(0).to_dict()
    with pytest.raises(InvalidConfig, match="vec=3 is not a candidate"):
        space.index_of(values | {"vec": 3})
    with pytest.raises(InvalidConfig, match="missing"):
        space.index_of({k: v for k, v in values.items() if k != "vec"})
    with pytest.raises(InvalidConfig, match="out of range"):
        space.get(space.size)
    with pytest.raises(InvalidConfig, match="does not match"):
        space.from_json({"index": 1, "knobs": values})


def test_register_blocks_fit_the_register_file():
    space = get_space(matmul(1024, 1024, 1024), HOST)
    for config in space.sample(500, 0):
        mr, nr, vec = config["tile_m"][2], config["tile_n"][2], config["vec"]
        assert nr % vec == 0
        assert mr * (nr // vec) + nr // vec + 1 <= HOST.vector_registers


def test_prime_sizes_still_have_real_choices():
    space = get_space(matmul(127, 127, 127), HOST)
    assert len({c[2] for c in space.knobs["tile_m"].candidates}) > 5
    assert len(space.knobs["tile_k"].candidates) > 2


def test_one_thread_targets_offer_no_parallel_loop():
    space = get_space(matmul(256, 256, 256), Target.parse("llvm -threads=1"))
    assert space.knobs["parallel"].candidates == ("none",)
