"""Compiled kernels' machine code kept on disk, by their LLVM IR and the machine it was compiled for.

A process that builds a kernel some process built before (a model compiled again at its next start, a service
restarted) loads the object LLVM made then, instead of optimising and compiling the same IR again: LLVM is most of
a build (a 256-channel 3×3 convolution over 14×14: 0.56 s of LLVM after 0.11 s of making its IR, and 0.6 ms to load
its 19 KB object). The key is a digest of the IR text, the CPU model and feature string LLVM was given, and LLVM's
and llvmlite's versions, so a changed code generator or another machine misses rather than loads stale code. Each
file holds its object's digest, so a torn or damaged file is a miss, never code loaded. Tuning builds each
candidate once and does not write here (workers.task); models and `apply_history_best` do.

`TENSORTUNE_OBJECT_CACHE` names the directory (by default `objects` in `$XDG_CACHE_HOME/tensortune`, else in
`~/.cache/tensortune`), or `off`. The files read least recently go once the directory holds more than `LIMIT_BYTES`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from contextlib import suppress
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

ENV = "TENSORTUNE_OBJECT_CACHE"
LIMIT_BYTES = 256 << 20
# changed with what a file holds or its key covers, and with how workers.llvm_jit compiles beyond the key's parts
FORMAT = b"tensortune object cache 1"
DIGEST = hashlib.sha256().digest_size
log = logging.getLogger("tensortune")


class ObjectCache:
    def __init__(self, directory: Path, limit: int = LIMIT_BYTES):
        self.directory, self.limit = directory, limit

    @staticmethod
    def key(ir_text: str, cpu: str, features: str) -> str:
        digest = hashlib.sha256(FORMAT)
        for part in (llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)), cpu, features, ir_text):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.o"

    def get(self, key: str) -> bytes | None:
        """The object stored under `key`, or None (none, or a damaged one, which is removed); a hit counts as a use."""
        path = self._path(key)
        try:
            stored = path.read_bytes()
        except OSError:
            return None
        data = stored[DIGEST:]
        if stored[:DIGEST] != hashlib.sha256(data).digest():
            path.unlink(missing_ok=True)
            return None
        with suppress(OSError):
            os.utime(path)
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store atomically (a reader sees the old file or the whole new one), then prune; a cache that cannot be
        written is said once and otherwise ignored: the kernel is built all the same."""
        written = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.directory, suffix=".tmp", delete=False) as file:
                written = file.name
                file.write(hashlib.sha256(data).digest() + data)
            os.replace(written, self._path(key))
            self._prune()
        except OSError as error:
            if written:
                Path(written).unlink(missing_ok=True)
            _unwritable(str(self.directory), str(error))

    def _prune(self) -> None:
        """Remove the files read least recently until the rest fit in `limit`."""
        files = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(".o"):
                with suppress(FileNotFoundError):  # another process's pruning took it
                    stat = entry.stat()
                    files.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.limit:
                break
            Path(path).unlink(missing_ok=True)
            total -= size


_SAID: set[str] = set()  # the directories said to be unwritable: once each, whatever the error (a temporary name in it)


def _unwritable(directory: str, error: str) -> None:
    if directory in _SAID:
        return
    _SAID.add(directory)
    log.warning(f"tensortune: kernels' machine code is not cached, as {directory} cannot be written ({error}); "
                f"set {ENV} to a writable directory, or to off")


def object_cache() -> ObjectCache | None:
    """The cache `TENSORTUNE_OBJECT_CACHE` names, None where it says off."""
    setting = os.environ.get(ENV, "")
    if setting == "off":
        return None
    if setting:
        return ObjectCache(Path(setting))
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return ObjectCache(Path(base) / "tensortune" / "objects")
