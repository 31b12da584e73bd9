"""`apply_history_best`: inside it, `workers.build(workload, target)` uses the best stored config.

The context answers `query(workload, target)` for search_space's dispatch stack: the best
`ok` record on exactly this target, else on the most similar stored target of the same kind
(with a warning naming it), else None, and search_space falls back to the template's default
with the warning docs/architecture.md quotes, once per workload (this context carries the `warned` set). Only
records of today's template version are read, and unversioned ones whose config is in today's space
(queries.best_records); a record whose config does not fit the space being built (another vector
width) is skipped for the next best. Each (workload, target) is looked up once per context.

With no record of the workload on any target, a config is predicted where a predictor is registered: tuner/predict.py
registers its cost model (trained on the records of the op's other shapes) when the tuner package is imported, as
the CLI, the service and the torch backend do; db itself knows no tuner. The prediction is said in one line.

`query_nearest` answers for a shape nothing was tuned at (a sequence length the model meets at run time): the
best config of the nearest stored shape of the same op and options, fitted into this shape's space (for GEMMs
the tiles of another M usually fit as they are), and which shape that was, so the caller can say so.
"""
from __future__ import annotations

import threading
import warnings
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Iterable, Iterator, Union

from sqlalchemy.orm import Session

from search_space import Config, ConfigSpace, FallbackWarned, NoTemplate, Target, Workload
from search_space import dispatch_context, fallback_config, get_space
from search_space.templates import relaid_knobs

from .autotvm_log import import_log
from .engine import is_url
from .matching import fit_config, most_similar, nearest_shapes, parallel_ways
from .queries import best_records, stored_targets, stored_workloads
from .records import Record, in_space
from .store import Database

if TYPE_CHECKING:
    from .served import ServedBest

CANDIDATES = 16  # best records tried per target before moving to the next target
SQLITE_HEADER = b"SQLite format 3\x00"

Source = Union[None, str, Path, Database, Session, Iterable[Union[str, Path]]]


def similar_target_message(workload: Workload, target: Target, used: Target) -> str:
    return (f"No config measured on target={target} for workload={workload.key}; "
            f"using the best config measured on the most similar target={used}.")


def _first_fitting(space: ConfigSpace, records: list[Record]) -> Config | None:
    return next(filter(None, (in_space(space, record.input.config) for record in records)), None)


def _spread(space: ConfigSpace, config: Config, workload: Workload, there: Target, here: Target) -> Config:
    """A config measured on one thread `there`, run on the more threads `here` the way the template's fallback
    parallelises the workload: kept serial, it would leave every core but one idle."""
    if parallel_ways(space, there, here) == [None]:
        return config
    return fit_config(space, config, parallel=fallback_config(workload, here)["parallel"]) or config


@dataclass(frozen=True)
class StoredConfig:
    """A config to build with, and the stored workload it was measured on: the one asked about, or its nearest
    stored shape; and the stored target it was measured on where not the one asked about (the most similar). A
    predicted config was measured nowhere: `predicted` says what predicted it."""

    config: Config
    workload: Workload
    target: Target | None = None
    predicted: str = ""


# (database, workload, target) → a predicted StoredConfig, or None: what tuner/predict.py registers
Predictor = Callable[[Database, Workload, Target], Union[StoredConfig, None]]
_PREDICTORS: list[Predictor] = []


def register_predictor(predictor: Predictor) -> None:
    """Let contexts over a database predict configs for workloads it has no record of (the last one registered)."""
    _PREDICTORS[:] = [predictor]


def predicted_message(workload: Workload, target: Target, found: StoredConfig) -> str:
    return f"No config measured for workload={workload.key} on target={target}; using the config {found.predicted}."


class HistoryBest(FallbackWarned):
    """A dispatch context that answers from stored records; safe to query from several threads."""

    def __init__(self, records: Database | Callable[[], ContextManager[Session]]):
        """`records`: a Database, or a factory of sessions (no predictions then: a predictor trains on a Database)."""
        super().__init__()
        self._database = records if isinstance(records, Database) else None
        self._sessions = records.read_sessions if isinstance(records, Database) else records
        self._answers: dict[tuple[str, str], StoredConfig | None] = {}
        self._nearest: dict[tuple[str, str], StoredConfig | None] = {}
        self._predicted: dict[tuple[str, str], StoredConfig | None] = {}
        self._lock = threading.Lock()

    def _once(self, answers: dict, lookup: Callable, workload: Workload, target: Target):
        """`lookup(workload, target)`, asked once per context."""
        key = (workload.key, str(target))
        with self._lock:
            if key not in answers:
                answers[key] = lookup(workload, target)
            return answers[key]

    def query(self, workload: Workload, target: Target) -> Config | None:
        found = self._once(self._answers, self._lookup, workload, target)
        if found is None:
            found = self._once(self._predicted, self._predict, workload, target)
            if found is not None and self.first_time((str(target), workload.key)):
                warnings.warn(predicted_message(workload, target, found), stacklevel=4)
        return found.config if found is not None else None

    def _lookup(self, workload: Workload, target: Target) -> StoredConfig | None:
        try:
            space = get_space(workload, target)
        except NoTemplate:
            return None
        with self._sessions() as session:
            found = _first_fitting(space, best_records(session, workload, target, CANDIDATES))
            if found is not None:
                return StoredConfig(found, workload)
            for other in most_similar(target, stored_targets(session, target.kind)):
                found = _first_fitting(space, best_records(session, workload, other, CANDIDATES))
                if found is not None:
                    warnings.warn(similar_target_message(workload, target, other), stacklevel=5)
                    return StoredConfig(_spread(space, found, workload, other, target), workload, other)
        return None

    def query_nearest(self, workload: Workload, target: Target) -> StoredConfig | None:
        """The workload's stored config; else the best config of the nearest other shape of the op stored on exactly
        this target (same dtype and options, nearest by `matching.size_distance`), fitted into this workload's
        space, which costs a query where a prediction trains a model; else a predicted one (said by the caller,
        who knows how many more it meets)."""
        for answers, lookup in ((self._answers, self._lookup), (self._nearest, self._borrow),
                                (self._predicted, self._predict)):
            found = self._once(answers, lookup, workload, target)
            if found is not None:
                return found
        return None

    def query_nearest_many(self, workloads: Iterable[Workload], target: Target) -> dict[Workload, StoredConfig | None]:
        """`query_nearest` of each workload (a served context, db/served.py, asks its service once for them all)."""
        return {workload: self.query_nearest(workload, target) for workload in workloads}

    def _predict(self, workload: Workload, target: Target) -> StoredConfig | None:
        if not _PREDICTORS or self._database is None:
            return None
        try:
            return _PREDICTORS[0](self._database, workload, target)
        except NoTemplate:
            return None

    def _borrow(self, workload: Workload, target: Target) -> StoredConfig | None:
        try:
            space = get_space(workload, target)
        except NoTemplate:
            return None
        with self._sessions() as session:
            for other in nearest_shapes(workload, stored_workloads(session, workload.op, target)):
                relaid = lambda knobs, other=other: relaid_knobs(knobs, other, workload, target)
                for record in best_records(session, other, target, CANDIDATES):
                    config = fit_config(space, record.input.config, relaid=relaid)
                    if config is not None:
                        return StoredConfig(config, other)
        return None


def _is_database(source: str | Path) -> bool:
    if is_url(str(source)):
        return True
    path = Path(source)
    if not path.is_file():
        return False
    with path.open("rb") as file:
        return file.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def _open(source: Source, stack: ExitStack) -> Database | Callable[[], ContextManager[Session]]:
    """The database of a source (a Session: a factory of it); databases this opens are closed when the stack
    unwinds."""
    if isinstance(source, Session):
        return lambda: nullcontext(source)
    if isinstance(source, Database):
        return source
    if source is None or (isinstance(source, (str, Path)) and _is_database(source)):
        return stack.enter_context(Database(source))
    logs = [source] if isinstance(source, (str, Path)) else list(source)
    database = stack.enter_context(Database("sqlite://"))
    for log in logs:
        report = import_log(database, log)
        for line, message in report.rejected:
            warnings.warn(f"{log}:{line}: skipped a malformed record: {message}", stacklevel=4)
    return database


@contextmanager
def apply_history_best(source: Source = None, cache: str | Path | None = None) -> Iterator[HistoryBest | ServedBest]:
    """Build with the best stored configs of `source`: a database URL or SQLite file, a `Database`,
    a SQLAlchemy `Session`, one or more AutoTVM-style log files (default: the default database), or the URL of a
    running `tensortune serve` (http://host:port), which needs no database here: its answers are kept in the
    `cache` file for when it cannot be reached (db/served.py)."""
    from .served import ServedBest, is_served  # here: served.py builds on this module

    with ExitStack() as stack:
        context = ServedBest(source, cache) if is_served(source) else HistoryBest(_open(source, stack))
        with dispatch_context(context):
            yield context
