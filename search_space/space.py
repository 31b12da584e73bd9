"""ConfigSpace: the knobs of a schedule template and every valid combination of their values.

Knobs are declared the way AutoTVM's `define_split` / `define_reorder` / `define_annotate` /
`define_knob` declare them. Cross-knob constraints (a register block must fit the register
file) are applied exactly: constrained knobs form one mixed-radix digit whose values are
the valid tuples, so `len` counts only valid points, `get` never returns an invalid one,
and indices are plain Python ints (spaces beyond 2**63 work).

A space may name a knob as its strata: one that chooses among alternatives of very different sizes
(the GEMM's instruction families: millions of vector register blocks, thousands of AMX tile blocks).
Random draws then pick its value first, evenly, so that the small alternative is drawn as often as
the large one, instead of once in a thousand.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from operator import getitem, itemgetter
from typing import Callable, Iterator


class InvalidConfig(ValueError):
    """A config that does not belong to the space, or that lowering rejects."""


@dataclass(frozen=True)
class Knob:
    name: str
    kind: str  # split | reorder | annotate | knob
    candidates: tuple

    def __post_init__(self):
        if not self.candidates:
            raise ValueError(f"knob {self.name} has no candidates")


@dataclass(frozen=True)
class Config:
    """One point of a space: a value per knob. Frozen, hashable, and replayable from JSON."""

    index: int
    values: tuple[tuple[str, object], ...]

    def __getitem__(self, name: str):
        return dict(self.values)[name]

    def to_dict(self) -> dict:
        return {name: list(v) if isinstance(v, tuple) else v for name, v in self.values}

    def to_json(self) -> str:
        return json.dumps({"index": self.index, "knobs": self.to_dict()}, separators=(",", ":"))

    def __str__(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in self.to_dict().items())


@dataclass(frozen=True)
class _Digit:
    """One mixed-radix digit: a single knob, or a group of constrained knobs with their valid tuples."""

    names: tuple[str, ...]
    values: tuple[tuple, ...]


class ConfigSpace:
    """The product of knob digits; position 0 is the least significant digit."""

    def __init__(self, knobs: list[Knob], constraints: list[tuple[tuple[str, ...], Callable[..., bool]]] = (),
                 strata: str | None = None):
        self.knobs = {k.name: k for k in knobs}
        if len(self.knobs) != len(knobs):
            raise ValueError("duplicate knob names")
        self._constraints = list(constraints)
        self._digits = self._make_digits(knobs, self._constraints)
        self._position = [{v: i for i, v in enumerate(digit.values)} for digit in self._digits]
        self.strata = strata
        # the digit holding the strata knob, and its positions for each value of that knob
        self._strata_digit, self._stratum_positions = -1, {}
        for d, digit in enumerate(self._digits if strata else ()):
            if strata in digit.names:
                self._strata_digit, at = d, digit.names.index(strata)
                for position, value in enumerate(digit.values):
                    self._stratum_positions.setdefault(value[at], []).append(position)

    def _make_digits(self, knobs, constraints) -> list[_Digit]:
        groups = [{k.name} for k in knobs]
        for names, _ in constraints:
            merged = set(names).union(*[g for g in groups if g & set(names)])
            groups = [g for g in groups if not g & set(names)] + [merged]
        order = [k.name for k in knobs]
        digits = []
        for group in sorted(groups, key=lambda g: min(order.index(n) for n in g)):
            names = tuple(n for n in order if n in group)
            values = self._valid_tuples(names, [(ns, rule) for ns, rule in constraints if set(ns) <= group])
            if not values:
                raise ValueError(f"constraints leave no valid value for knobs {', '.join(names)}")
            digits.append(_Digit(names, values))
        return digits

    def _valid_tuples(self, names: tuple[str, ...], rules: list) -> tuple[tuple, ...]:
        """The tuples of the knobs `names` that every rule allows, in the order of their product (the first name
        most significant). Built a knob at a time, each rule checked once its knobs are all chosen, the knobs of
        the rules of most knobs first (they prune the largest products), and asked once for each combination of
        its knobs' values that occurs, not once a tuple. A bf16 GEMM's space on an AMX target (dense 128×3072×768:
        191 thousand valid tuples of seven knobs) took 3.4 s as a filtered product, its rule checked on 1.5
        million tuples; built a knob at a time, 0.54 s on a Zen 5; its rules asked once a combination, 0.35 s."""
        chosen: list[str] = []
        for ns, _ in sorted(rules, key=lambda rule: -len(rule[0])):
            chosen += [n for n in names if n in ns and n not in chosen]
        chosen += [n for n in names if n not in chosen]
        candidates = [self.knobs[n].candidates for n in chosen]
        partial = [()]  # positions among the candidates of the knobs chosen so far
        for depth, name in enumerate(chosen, 1):
            partial = [p + (c,) for p in partial for c in range(len(candidates[depth - 1]))]
            for ns, rule in rules:
                if name in ns and set(ns) <= set(chosen[:depth]):
                    at = [chosen.index(n) for n in ns]
                    pick = _picker(at)
                    allowed = {key for key in set(map(pick, partial))
                               if rule(*map(getitem, [candidates[i] for i in at], key))}
                    partial = [v for v in partial if pick(v) in allowed]
        at = [chosen.index(n) for n in names]
        ordered = [candidates[i] for i in at]
        return tuple(tuple(map(getitem, ordered, v)) for v in sorted(map(_picker(at), partial)))

    def restrict(self, allowed: dict[str, tuple]) -> ConfigSpace:
        """The sub-space whose named knobs keep only the `allowed` values (same constraints): small
        enough to measure exhaustively, as replay data sets are. Its indices are its own."""
        unknown = set(allowed) - set(self.knobs)
        if unknown:
            raise InvalidConfig(f"no knob(s) {', '.join(sorted(unknown))} in this space")
        knobs = [Knob(k.name, k.kind, tuple(c for c in k.candidates if k.name not in allowed or c in allowed[k.name]))
                 for k in self.knobs.values()]
        return ConfigSpace(knobs, self._constraints, self.strata)

    def __len__(self) -> int:  # may exceed sys.maxsize; use `size` then
        return self.size

    @property
    def size(self) -> int:
        return math.prod(len(d.values) for d in self._digits)

    def get(self, index: int) -> Config:
        if not 0 <= index < self.size:
            raise InvalidConfig(f"config index {index} out of range 0..{self.size - 1}")
        values, rest = {}, index
        for digit in self._digits:
            rest, position = divmod(rest, len(digit.values))
            values.update(zip(digit.names, digit.values[position]))
        return Config(index, tuple((name, values[name]) for name in self.knobs))

    def index_of(self, values: dict) -> int:
        """The inverse of `get`: knob values → index; InvalidConfig names the offending knob."""
        missing = set(self.knobs) - set(values)
        extra = set(values) - set(self.knobs)
        if missing or extra:
            raise InvalidConfig(f"config knobs differ from the space: missing {sorted(missing)}, unknown {sorted(extra)}")
        index, scale = 0, 1
        for digit, position in zip(self._digits, self._position):
            value = tuple(_freeze(values[name]) for name in digit.names)
            if value not in position:
                bad = [n for n, v in zip(digit.names, value) if v not in self.knobs[n].candidates]
                reason = f"knob {bad[0]}={value[digit.names.index(bad[0])]} is not a candidate" if bad else \
                    f"knobs {', '.join(digit.names)}={value} violate a constraint"
                raise InvalidConfig(reason)
            index += position[value] * scale
            scale *= len(digit.values)
        return index

    def config(self, values: dict) -> Config:
        return self.get(self.index_of(values))

    def nearest(self, wanted: dict, distance: Callable[[object, object], tuple] | None = None) -> Config:
        """The valid config closest to `wanted` (by `knob_distance` unless told); constrained knobs are chosen
        jointly, earlier knobs first. Knobs may come as JSON gives them (lists for tuples), as `index_of` takes them."""
        distance, wanted = distance or knob_distance, {name: _freeze(value) for name, value in wanted.items()}
        index, scale = 0, 1
        for digit, position in zip(self._digits, self._position):
            values = digit.values
            for i, name in enumerate(digit.names):  # each knob keeps the closest of the tuples the ones before kept
                far = {x: distance(x, wanted[name]) for x in {v[i] for v in values}}
                closest = min(far.values())
                values = [v for v in values if far[v[i]] == closest]
            index += position[values[0]] * scale
            scale *= len(digit.values)
        return self.get(index)

    def from_json(self, text: str | dict) -> Config:
        data = json.loads(text) if isinstance(text, str) else text
        config = self.config(data["knobs"])
        if "index" in data and data["index"] != config.index:
            raise InvalidConfig(f"config index {data['index']} does not match its knobs (index {config.index})")
        return config

    def sample(self, n: int, rng: random.Random | int | None = None, exclude: set[int] = frozenset()) -> list[Config]:
        """Up to n distinct configs, none of whose index is in `exclude`: drawn uniformly, or stratified (the
        strata knob's value drawn evenly, then uniformly within it) while its values have configs left to draw."""
        rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        n = min(n, self.size - len(exclude))
        if self.size <= 4 * (n + len(exclude)):
            pool = [i for i in range(self.size) if i not in exclude]
            return [self.get(i) for i in rng.sample(pool, n)]
        chosen: dict[int, None] = {}
        stratified = 100 * n if self._stratum_positions else 0  # draws before a nearly drawn-out stratum ends them
        while len(chosen) < n:
            index = self._stratified_index(rng) if stratified > 0 else rng.randrange(self.size)
            stratified -= 1
            if index not in exclude:
                chosen[index] = None
        return [self.get(i) for i in chosen]

    def _stratified_index(self, rng: random.Random) -> int:
        """A config of a value of the strata knob drawn evenly, uniform among that value's configs."""
        positions = self._stratum_positions[rng.choice(list(self._stratum_positions))]
        index, scale = 0, 1
        for d, digit in enumerate(self._digits):
            index += (rng.choice(positions) if d == self._strata_digit else rng.randrange(len(digit.values))) * scale
            scale *= len(digit.values)
        return index

    def neighbours(self, config: Config) -> list[Config]:
        """Every valid config that differs from `config` in exactly one knob."""
        current = dict(config.values)
        found = []
        for name, knob in self.knobs.items():
            for value in knob.candidates:
                if value == current[name]:
                    continue
                try:
                    found.append(self.get(self.index_of(current | {name: value})))
                except InvalidConfig:
                    pass
        return found

    def random_neighbour(self, config: Config, rng: random.Random, attempts: int = 16) -> Config:
        """A random valid config one knob away (the config itself when none is found in `attempts` draws)."""
        current = dict(config.values)
        names = [n for n, k in self.knobs.items() if len(k.candidates) > 1]
        for _ in range(attempts if names else 0):
            name = rng.choice(names)
            value = rng.choice(self.knobs[name].candidates)
            if value == current[name]:
                continue
            try:
                return self.get(self.index_of(current | {name: value}))
            except InvalidConfig:
                continue
        return config

    def __iter__(self) -> Iterator[Config]:
        return (self.get(i) for i in range(self.size))

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k.name}({k.kind}, {len(k.candidates)})" for k in self.knobs.values())
        return f"ConfigSpace(size={self.size}: {knobs})"


def _picker(positions: list[int]) -> Callable[[tuple], tuple]:
    """The items of a tuple at `positions`, as a tuple (itemgetter gives one item bare)."""
    return itemgetter(*positions) if len(positions) > 1 else lambda v, i=positions[0]: (v[i],)


def _freeze(value):
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def knob_distance(candidate, wanted) -> tuple:
    """How far a knob value is from the wanted one: log ratio for sizes (a split's innermost factor first,
    so the register tile counts before the block; a size of 0, none, is as far from any other as can be, and so is
    a choice that is no size, such as AMX's "shared" prefetch against k steps), 0 or 1 for anything else."""
    if isinstance(wanted, tuple) and all(isinstance(x, int) for x in wanted):
        return tuple(abs(math.log(abs(a) / abs(b))) for a, b in reversed(list(zip(candidate, wanted))))
    if isinstance(wanted, int) and not isinstance(wanted, bool):
        sized = candidate and wanted and isinstance(candidate, int)
        return (abs(math.log(candidate / wanted)) if sized else 0.0 if candidate == wanted else math.inf,)
    return (0.0 if candidate == wanted else 1.0,)
