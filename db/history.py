"""`apply_history_best`: inside it, `workers.build(workload, target)` uses the best stored config.

The context answers `query(workload, target)` for search_space's dispatch stack: the best
`ok` record on exactly this target, else on the most similar stored target of the same kind
(with a warning naming it), else None, and search_space falls back to the template's default
with the warning docs/architecture.md quotes, once per workload (this context carries the `warned` set). A record
whose config does not fit the space being built (another template version, another vector
width) is skipped for the next best. Each (workload, target) is looked up once per context.

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
from typing import Callable, ContextManager, Iterable, Iterator, Union

from sqlalchemy.orm import Session

from search_space import Config, ConfigSpace, FallbackWarned, InvalidConfig, NoTemplate, Target, Workload
from search_space import dispatch_context, get_space

from .autotvm_log import import_log
from .engine import is_url
from .matching import fit_config, most_similar, nearest_shapes
from .queries import best_records, stored_targets, stored_workloads
from .records import Record, config_to_dict
from .store import Database

CANDIDATES = 16  # best records tried per target before moving to the next target
SQLITE_HEADER = b"SQLite format 3\x00"

Source = Union[None, str, Path, Database, Session, Iterable[Union[str, Path]]]


def similar_target_message(workload: Workload, target: Target, used: Target) -> str:
    return (f"No config measured on target={target} for workload={workload.key}; "
            f"using the best config measured on the most similar target={used}.")


def _first_fitting(space: ConfigSpace, records: list[Record]) -> Config | None:
    for record in records:
        try:
            return space.from_json(config_to_dict(record.input.config))
        except InvalidConfig:
            continue
    return None


@dataclass(frozen=True)
class StoredConfig:
    """A config to build with, and the stored workload it was measured on: the one asked about, or its nearest
    stored shape."""

    config: Config
    workload: Workload


class HistoryBest(FallbackWarned):
    """A dispatch context that answers from stored records; safe to query from several threads."""

    def __init__(self, sessions: Callable[[], ContextManager[Session]]):
        super().__init__()
        self._sessions = sessions
        self._answers: dict[tuple[str, str], Config | None] = {}
        self._nearest: dict[tuple[str, str], StoredConfig | None] = {}
        self._lock = threading.Lock()

    def _once(self, answers: dict, lookup: Callable, workload: Workload, target: Target):
        """`lookup(workload, target)`, asked once per context."""
        key = (workload.key, str(target))
        with self._lock:
            if key not in answers:
                answers[key] = lookup(workload, target)
            return answers[key]

    def query(self, workload: Workload, target: Target) -> Config | None:
        return self._once(self._answers, self._lookup, workload, target)

    def _lookup(self, workload: Workload, target: Target) -> Config | None:
        try:
            space = get_space(workload, target)
        except NoTemplate:
            return None
        with self._sessions() as session:
            found = _first_fitting(space, best_records(session, workload, target, CANDIDATES))
            if found is not None:
                return found
            for other in most_similar(target, stored_targets(session, target.kind)):
                found = _first_fitting(space, best_records(session, workload, other, CANDIDATES))
                if found is not None:
                    warnings.warn(similar_target_message(workload, target, other), stacklevel=5)
                    return found
        return None

    def query_nearest(self, workload: Workload, target: Target) -> StoredConfig | None:
        """`query`'s answer; else the best config of the nearest other shape of the op stored on exactly this
        target (same dtype and options, nearest by `matching.size_distance`), fitted into this workload's space."""
        config = self.query(workload, target)
        if config is not None:
            return StoredConfig(config, workload)
        return self._once(self._nearest, self._borrow, workload, target)

    def _borrow(self, workload: Workload, target: Target) -> StoredConfig | None:
        try:
            space = get_space(workload, target)
        except NoTemplate:
            return None
        with self._sessions() as session:
            for other in nearest_shapes(workload, stored_workloads(session, workload.op, target)):
                for record in best_records(session, other, target, CANDIDATES):
                    config = fit_config(space, record.input.config)
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


def _open(source: Source, stack: ExitStack) -> Callable[[], ContextManager[Session]]:
    """Session factory for a source; databases this opens are closed when the stack unwinds."""
    if isinstance(source, Session):
        return lambda: nullcontext(source)
    if isinstance(source, Database):
        return source.read_sessions
    if source is None or (isinstance(source, (str, Path)) and _is_database(source)):
        return stack.enter_context(Database(source)).read_sessions
    logs = [source] if isinstance(source, (str, Path)) else list(source)
    database = stack.enter_context(Database("sqlite://"))
    for log in logs:
        report = import_log(database, log)
        for line, message in report.rejected:
            warnings.warn(f"{log}:{line}: skipped a malformed record: {message}", stacklevel=4)
    return database.read_sessions


@contextmanager
def apply_history_best(source: Source = None) -> Iterator[HistoryBest]:
    """Build with the best stored configs of `source`: a database URL or SQLite file, a `Database`,
    a SQLAlchemy `Session`, or one or more AutoTVM-style log files (default: the default database)."""
    with ExitStack() as stack:
        context = HistoryBest(_open(source, stack))
        with dispatch_context(context):
            yield context
