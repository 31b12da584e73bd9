"""`untuned_config(workload, target)`: the config an op runs with no record, in the instruction family that runs
fastest on this CPU.

The template's fallback takes the last family its space offers (the one a target feature names), a static choice
that CPUs disagree on: AVX-512 BF16's pair dot runs at twice the FMA's rate on a Zen 4 and at half it on an Intel
Xeon without AMX, where the fallback of BERT's bfloat16 dense shapes ran 1.40-1.53x faster widened into FMAs
(`fma-f32`). So where the space offers several families and the target is this CPU's, each family's peak kernel
(workers.peak) is timed once a process, on one thread, holding the host's timing lock as the pools do, and another
family replaces the template's choice only where its rate is CLEAR times higher, so that the host's noise does not
flip the choice from one process to the next."""
from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Mapping, Sequence

from search_space import Config, Target, Workload, fallback_config, get_space, host_target

from .host_lock import HostLock, default_path

CLEAR = 1.3  # how much faster another family's peak must be to replace the template's choice
SAMPLES, SAMPLE_MS = 3, 10.0  # a peak kernel's samples for the ranking: enough for rates that differ by CLEAR
LOCK_WAIT = 10.0  # seconds to wait for another pool's timing on this host, then measure anyway


def untuned_config(workload: Workload, target: Target | str = "llvm") -> Config:
    """The template's fallback, in `ranked_family` of its space's families where the target runs here."""
    target = Target.parse(target)
    config = fallback_config(workload, target)
    space = get_space(workload, target)
    if "isa" not in space.knobs or len(space.knobs["isa"].candidates) < 2 or not runs_here(target):
        return config
    rates = family_rates(replace(target, threads=1), workload.dtype)
    family = ranked_family(config["isa"], space.knobs["isa"].candidates, rates)
    return config if family == config["isa"] else fallback_config(workload, target, isa=family)


def runs_here(target: Target) -> bool:
    """Whether the target is this CPU, with no vector feature it lacks: its peak kernels can be timed here."""
    host = host_target()
    return target.kind == "llvm" and target.model == host.model and set(target.features) <= set(host.features)


def ranked_family(chosen: str, candidates: Sequence[str], rates: Mapping[str, float]) -> str:
    """`chosen`, unless a candidate's rate (that of the instruction it runs as, workers.peak.RUNS_AS) is over CLEAR
    times its: then the fastest candidate, the later of equals (families running as one instruction share a rate;
    the later is the template's preference)."""
    from .peak import RUNS_AS

    rate = lambda family: rates.get(RUNS_AS.get(family, family))
    ranked = [family for family in candidates if rate(family) is not None]
    if rate(chosen) is None or not ranked:
        return chosen
    fastest = max(ranked, key=lambda family: (rate(family), candidates.index(family)))
    return fastest if rate(fastest) > CLEAR * rate(chosen) else chosen


@cache
def family_rates(target: Target, dtype: str) -> dict[str, float]:
    """GFLOPS (or GOPS) of the peak kernel of each family a kernel of `dtype` may use on the target."""
    from .peak import family_peak_calls, peak_rate

    calls = family_peak_calls(target, dtype)
    with HostLock(default_path(), LOCK_WAIT).held(exclusive=True):
        return {family: peak_rate(*call, SAMPLES, SAMPLE_MS) for family, call in calls.items()}
