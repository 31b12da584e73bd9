"""A PostgreSQL server of the test's own (Debian's initdb + pg_ctl in a temporary directory, on a free port),
which the test may stop and start under a running service. Run as the `postgres` user when the tests run
as root, since PostgreSQL refuses to run as root. Without the binaries the test skips, except under CI."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from typing import Iterator

import pytest

from tests.serve_helpers import free_port


def binaries() -> str | None:
    """The folder holding initdb and pg_ctl (Debian keeps them off PATH), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or list(filter(None, [shutil.which("initdb")]))
    return os.path.dirname(found[-1]) if found else None


class PostgresServer:
    def __init__(self, folder: str, port: int, bindir: str):
        self.data, self.port, self.bindir = os.path.join(folder, "data"), port, bindir
        self.log = os.path.join(folder, "server.log")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *args: str) -> None:
        command = [os.path.join(self.bindir, args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {os.path.dirname(self.data)} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "start", "-w", "-D", self.data, "-l", self.log, "-o", options)

    def stop(self) -> None:
        """`pg_ctl stop -m fast`: every connection is terminated, as an operator's restart does."""
        self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", self.data)


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A started server, stopped and deleted afterwards."""
    bindir = binaries()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("initdb not found: install Debian's postgresql package")
        pytest.skip("initdb not found: install Debian's postgresql package")
    folder = tempfile.mkdtemp(prefix="tensortune-pg-")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    server = PostgresServer(folder, free_port(), bindir)
    try:
        server._run("initdb", "-D", server.data, "-U", "postgres", "--auth=trust", "--no-sync")
        server.start()
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(folder, ignore_errors=True)
