"""Tuning records in SQL: models, sessions, best-config queries, apply_history_best, log interop."""
