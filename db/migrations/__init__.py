"""Alembic migrations of the tensortune schema (a package so that installs ship it)."""
