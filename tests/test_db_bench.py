"""bench/db_best runs end to end on a small table (the million-row figures are in the issue's note)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from db_helpers import db_url  # noqa: F401 (fixture)


def test_db_best_bench_fills_and_times(db_url):
    done = subprocess.run([sys.executable, "-m", "bench.db_best", "--db", db_url, "--rows", "2000", "--queries", "40"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "filled 2,000 rows" in done.stdout and "2,000 measurements, 40 lookups each" in done.stdout
    assert "Database.best" in done.stdout and "the SQL query alone" in done.stdout
