"""One module per schema revision, oldest first (Alembic reads them by path)."""
