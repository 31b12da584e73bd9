"""Tuning records in SQL: models, sessions, best-config queries, apply_history_best, log interop."""
from .autotvm_log import ImportReport, LogError, decode, encode, export_log, import_log, pick_best
from .engine import resolve_url
from .history import HistoryBest, apply_history_best, similar_target_message
from .migrate import upgrade
from .opening import DatabaseOpenError
from .records import Record
from .served import ServedBest
from .store import Database, Job

__all__ = [
    "Database", "DatabaseOpenError", "HistoryBest", "ImportReport", "Job", "LogError", "Record", "ServedBest",
    "apply_history_best", "decode", "encode",
    "export_log", "import_log", "pick_best", "resolve_url", "similar_target_message", "upgrade",
]
