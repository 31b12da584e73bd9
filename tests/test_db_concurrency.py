"""Several writer processes at once, each committing record by record: every row arrives exactly once.

The writers all open the same brand-new database at the same moment, so they also race to
migrate it and to insert the shared workload and target rows.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from db_helpers import db_url  # noqa: F401 (fixture)
from serve_helpers import wait_for
from sqlalchemy import select

from db import Database
from db.models import JobRow, MeasurementRow
from search_space import host_target, matmul

WRITERS, RECORDS = 4, 60
REPO = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from db import Database
    from search_space import get_space, host_target, matmul
    from workers import MeasureInput, MeasureResult, Outcome

    url, writer, count, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    Path(f"{go}.{writer}").touch()  # ready: imports done, waiting at the gate
    deadline = time.monotonic() + 60
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit("the gate never opened")
        time.sleep(0.002)
    workload, target = matmul(16, 16, 16), host_target()
    space = get_space(workload, target)
    with Database(url) as database:
        job = database.create_job(workload, target, "random", count)
        for n in range(count):
            now = time.time()
            result = MeasureResult(Outcome.OK, (1e-6 * (n + 1),), 0.01, workload.flops, f"w{writer}", "host", now, now)
            database.record(MeasureInput(workload, target, space.get(writer * 1000 + n)), result, job_id=job)
            time.sleep(0.005)  # as a tuning job paces its records: on a loaded 2-core host, unpaced writers ran in turn
    print(job)
""")


def test_concurrent_writer_processes_store_every_row_once(db_url, tmp_path):
    go = tmp_path / "go"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, db_url, str(w), str(RECORDS), str(go)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(WRITERS)]
    wait_for(lambda: all(Path(f"{go}.{w}").exists() for w in range(WRITERS)), 60, "the writers at the gate")
    go.touch()
    jobs = {}
    for number, writer in enumerate(writers):
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        jobs[int(out)] = f"w{number}"

    with Database(db_url) as database, database.sessions() as session:
        rows = session.execute(select(MeasurementRow.worker, MeasurementRow.config_index, MeasurementRow.job_id)
                               .order_by(MeasurementRow.id)).all()
        job_ids = session.scalars(select(JobRow.id)).all()
    expected = sorted((f"w{w}", w * 1000 + n) for w in range(WRITERS) for n in range(RECORDS))
    assert sorted((worker, index) for worker, index, _ in rows) == expected
    assert all(jobs[job_id] == worker for worker, _, job_id in rows)
    assert sorted(job_ids) == sorted(jobs)
    switches = sum(a[0] != b[0] for a, b in zip(rows, rows[1:]))
    assert switches > WRITERS, "the writers ran one after another, not at once"


def test_a_migration_committed_between_the_reads_of_a_new_database_is_not_taken_for_foreign_tables(db_url,
                                                                                                   monkeypatch):
    """Another process migrates the new database just after this one read its revision (none yet): its
    tables then stand beside a revision, and this one opens the database instead of refusing it."""
    from sqlalchemy import create_engine

    from db import migrate

    read_revision = migrate.current_revision

    def another_process_migrates_right_after(connection):
        revision = read_revision(connection)
        monkeypatch.setattr(migrate, "current_revision", read_revision)  # once
        engine = create_engine(db_url)
        try:
            with engine.begin() as other:
                migrate._lock_schema(other)
                if read_revision(other) is None:
                    migrate.command.upgrade(migrate.alembic_config(other), "head")
        finally:
            engine.dispose()
        return revision

    monkeypatch.setattr(migrate, "current_revision", another_process_migrates_right_after)
    with Database(db_url) as database:
        job = database.create_job(matmul(16, 16, 16), host_target(), "random", 1)
        assert database.job(job).status == "queued"
