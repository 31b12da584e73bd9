"""Why a database URL cannot be opened, in one line a user can act on: a file that cannot be created, a
directory that does not exist, a server that does not answer or refuses us, a file or schema that is not
tensortune's, a schema newer than this version. Every command that takes `--db` prints it and exits 1; a command
that writes says so, in one line too, of a database it may only read (`write_refusal`)."""
from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError


class DatabaseOpenError(RuntimeError):
    """A URL that names no database tensortune can open; the message names the URL and says why."""


def _opening(url: str, why: str) -> DatabaseOpenError:
    return DatabaseOpenError(f"cannot open {_shown(url)}: {why}")


def _shown(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def sqlite_file(url: str | URL) -> Path | None:
    """The file of a SQLite URL (or of its URI form, `sqlite:///file:PATH?mode=ro&uri=true`); None for in-memory
    SQLite and for servers."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if parsed.query.get("uri") == "true" and parsed.database.startswith("file:"):
        return Path(parsed.database.removeprefix("file:").removeprefix("//"))
    return Path(parsed.database)


def check_file(url: str) -> None:
    """SQLite says only "unable to open database file"; the file system says which of its reasons it is."""
    path = sqlite_file(url)
    if path is None or path.is_file():
        return
    if path.exists() and not path.is_file():  # asked again: another process may have created it meanwhile
        raise _opening(url, f"{path} is not a file")
    folder = path.parent
    if not folder.exists():
        raise _opening(url, f"no such directory {folder}")
    if not folder.is_dir():
        raise _opening(url, f"{folder} is not a directory")
    try:  # created empty, as SQLite would: an empty file is a new database
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError as error:
        raise _opening(url, f"cannot create {path}: {error.strerror}") from None


def open_error(url: str, error: BaseException) -> DatabaseOpenError:
    """The one-line form of an error raised while connecting to or migrating `url`."""
    if isinstance(error, DatabaseOpenError):
        return error
    if isinstance(error, NoSuchModuleError):  # an ArgumentError too
        return _opening(url, f"no SQLAlchemy dialect for {make_url(url).drivername!r}")
    if isinstance(error, ArgumentError):
        return _opening(url, "not a database URL (a file path, or e.g. postgresql+psycopg://user@host/db)")
    if isinstance(error, ImportError):
        return _opening(url, f"its database driver is not installed ({error})")
    if isinstance(error, DBAPIError) and error.orig is not None:
        return _opening(url, _driver_reason(url, error.orig))
    return _opening(url, f"{type(error).__name__}: {error}")


READ_ONLY = "attempt to write a readonly database"  # SQLite's words for a write it may not make


def write_refusal(url: str, error: BaseException) -> str | None:
    """One line for a write that the database refused because we may only read it (SQLite: the file's or its
    directory's permissions, a read-only file system, `mode=ro`); None for any other error."""
    if isinstance(error, DBAPIError) and READ_ONLY in str(error.orig):
        return f"cannot write {_shown(url)}: {_read_only(url)}"
    return None


def _read_only(url: str) -> str:
    if make_url(url).query.get("mode") == "ro":
        return f"{sqlite_file(url)} is opened read-only (mode=ro)"
    return f"{sqlite_file(url)} is read-only to this user (see its permissions, and its directory's)"


def _driver_reason(url: str, error: BaseException) -> str:
    text = " ".join(str(error).split())
    if READ_ONLY in text:
        return _read_only(url)
    if "file is not a database" in text:
        return f"{sqlite_file(url)} is not a SQLite database"
    if "unable to open database file" in text:
        return f"cannot create or open {sqlite_file(url)}"
    if "Connection refused" in text or "timeout expired" in text or "could not translate host" in text:
        return "the server is not reachable (" + text.split("failed:")[-1].split(" Is the server")[0].strip() + ")"
    return text.split("FATAL:")[-1].strip()  # the server's own reason: authentication, no such database, ...
