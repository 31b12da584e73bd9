"""Tuning records in SQL: models, sessions, best-config queries, apply_history_best, log interop."""
from .engine import resolve_url
from .migrate import upgrade
from .records import Record
from .store import Database, Job

__all__ = ["Database", "Job", "Record", "resolve_url", "upgrade"]
