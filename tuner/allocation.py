"""Which task of a model gets the next batch of trials: pure functions of the tasks' histories, so that a
strategy can be tested, and compared, on made-up latency curves without measuring anything.

"gradient" is Ansor's task scheduler (Zheng et al., OSDI'20, section 6), simplified: the model's latency is
L = Σ weight_i × seconds_i, so the task to tune next is the one whose next trials are expected to cut
weight_i × seconds_i the most. "round-robin" gives the tasks batches in turn, the baseline it is measured
against. Both first give every task one batch (the warm-up), since nothing is known of a task before it; on a
small budget the warm-up's batches shrink so that each task gets one (batch_size).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

STRATEGIES = ("gradient", "round-robin")
ALPHA = 0.2  # weight of the observed rate of improvement against the optimistic one (Ansor's α)
BETA = 2.0  # a task is expected to reach at least 1/β of the throughput of its best similar task (Ansor's β)
WINDOW = 3  # batches over which the observed rate is taken (Ansor's backward window Δt)
SIMILAR_FLOPS = 4.0  # tasks of one family within this factor of FLOPs reach comparable throughput
EPSILON = 0.05  # share of picks made at random: no task starves on a gain estimated too low


@dataclass(frozen=True)
class TaskHistory:
    """What the scheduler knows of a task: its family and FLOPs (which tasks are similar: the scheduler names the
    template and dtype a task is lowered by), its weight (runs per forward pass), its best seconds after each of
    its trials (inf until its first ok measurement), and whether its search space has nothing left to measure."""

    family: str
    flops: int
    weight: int
    best: tuple[float, ...] = ()
    exhausted: bool = False

    @property
    def trials(self) -> int:
        return len(self.best)

    @property
    def seconds(self) -> float:
        return self.best[-1] if self.best else math.inf


def estimated_seconds(histories: Sequence[TaskHistory]) -> list[float]:
    """Each task's best seconds, as the allocation weighs them; one with no ok measurement yet is taken to run at
    the slowest throughput of the tasks measured (finite, so that a task nothing of which ever works does not
    take the whole budget); inf while no task has an ok measurement."""
    known = [h.flops / h.seconds for h in histories if math.isfinite(h.seconds)]
    slowest = min(known, default=0.0)
    return [h.seconds if math.isfinite(h.seconds) else (h.flops / slowest if slowest else math.inf)
            for h in histories]


def model_latency(histories: Sequence[TaskHistory]) -> float:
    """The model's estimated latency in seconds: Σ weight × best seconds, inf (unknown) until every task has an
    ok measurement. A task not measured yet is not guessed at: guessed at the slowest throughput measured so
    far, it was too optimistic, and the estimate rose as the tasks were measured; with every task's best
    known, the estimate only falls, as each best does."""
    return sum(h.weight * h.seconds for h in histories)


def observed_rate(best: Sequence[float], span: int) -> float:
    """Seconds per trial by which the best fell over the last `span` trials (counted from the first ok
    trial when that is later); 0 with fewer than two trials to compare."""
    first = next((i for i, seconds in enumerate(best) if math.isfinite(seconds)), len(best))
    then, now = max(len(best) - 1 - span, first), len(best) - 1
    return (best[then] - best[now]) / (now - then) if then < now else 0.0


def gains(histories: Sequence[TaskHistory], batch: int) -> list[float]:
    """Per task, the expected cut of the model's latency per trial spent on it next (Ansor's gradient,
    sign flipped): weight × (α × the rate observed over the last WINDOW batches + (1 − α) × an optimistic
    rate). The optimistic rate is the larger of seconds / trials (the best keeps falling as fast as it has
    on average since the first trial) and, spread over one batch, the gap to 1/β of the throughput of the
    best similar task (same family, FLOPs within SIMILAR_FLOPS×): a task far slower than shapes like it has
    the most room. A task whose latency is not known at all gains inf."""
    seconds = estimated_seconds(histories)
    found = []
    for h, now in zip(histories, seconds):
        if not math.isfinite(now):
            found.append(math.inf)
            continue
        peers = [p.flops / s for p, s in zip(histories, seconds) if p.family == h.family and math.isfinite(s)
                 and max(p.flops, h.flops) <= SIMILAR_FLOPS * min(p.flops, h.flops)]
        reachable = BETA * h.flops / max(peers)
        optimistic = max(now / max(h.trials, 1), (now - reachable) / batch)
        found.append(h.weight * (ALPHA * observed_rate(h.best, WINDOW * batch) + (1 - ALPHA) * optimistic))
    return found


def batch_size(histories: Sequence[TaskHistory], batch: int, left: int) -> int:
    """How many trials the next batch measures: `batch`, never more than the `left` of the budget; during the
    warm-up, no more than an even share of the whole budget per task (at least one), nor of what is left per
    open task not tried yet (a job resumed from an older run), so that a budget too small for a full batch
    per task still measures every task (72 trials in batches of 4 left 6 of ResNet-50's 24 tasks unmeasured)
    and what it leaves over goes to the strategy."""
    untried = sum(1 for h in histories if not h.trials and not h.exhausted)
    if not untried:
        return min(batch, left)
    budget = left + sum(h.trials for h in histories)
    return max(1, min(batch, budget // len(histories), left // untried))


def next_task(histories: Sequence[TaskHistory], strategy: str, batch: int, rng: random.Random) -> int | None:
    """The index of the task to give the next batch, None when every task's space is exhausted: first each
    untried task in order (the warm-up); then under "round-robin" the task with the fewest trials (the
    first of those), under "gradient" one at random with probability EPSILON, else the largest gain (on a
    tie, the task with fewer trials)."""
    open_tasks = [i for i, h in enumerate(histories) if not h.exhausted]
    untried = [i for i in open_tasks if not histories[i].trials]
    if not open_tasks or untried:
        return untried[0] if untried else None
    if strategy == "round-robin":
        return min(open_tasks, key=lambda i: histories[i].trials)
    if rng.random() < EPSILON:
        return rng.choice(open_tasks)
    gain = gains(histories, batch)
    return max(open_tasks, key=lambda i: (gain[i], -histories[i].trials))
