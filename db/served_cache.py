"""The file in which a client of `tensortune serve` keeps the service's answers, to build with when it cannot
reach the service (db/served.py).

One JSON file: `{"format": 1, "services": {URL: {TARGET: {WORKLOAD KEY: answer}}}}`, an answer being what
`GET /api/best/batch` gives for a workload (`config`, `from_workload`, `from_target`). Only answers with a config are
kept: an answer of none is no answer for good, and a later process asks again. The file is replaced whole
(written beside it, then renamed), so a reader never sees half of it; two processes writing at once may lose one
of their updates, which the next fetch puts back.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

CACHE_ENV = "TENSORTUNE_CACHE"
FORMAT = 1


def cache_path(given: str | Path | None = None) -> Path:
    """The file given, else $TENSORTUNE_CACHE, else served-configs.json in $XDG_CACHE_HOME/tensortune (by
    default ~/.cache/tensortune)."""
    if given or os.environ.get(CACHE_ENV):
        return Path(given or os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensortune" / "served-configs.json"


class ServedCache:
    """The answers of one service in the cache file."""

    def __init__(self, path: Path, service: str):
        self.path, self.service = path, service
        self._said_unwritable = False

    def answers(self, target: str) -> dict[str, dict]:
        """The kept answers for `target`, by workload key; none when the file is missing or unreadable."""
        return self._read().get("services", {}).get(self.service, {}).get(target, {})

    def keep(self, target: str, answers: dict[str, dict | None]) -> None:
        """Keep the answers with a config and forget those of the workloads that now have none; a file that cannot
        be written is said once, and the client goes on without it."""
        data = self._read() or {"format": FORMAT}
        kept = data.setdefault("services", {}).setdefault(self.service, {}).setdefault(target, {})
        before = dict(kept)
        for key, answer in answers.items():
            if answer is not None and answer.get("config") is not None:
                kept[key] = answer
            else:
                kept.pop(key, None)
        if kept != before:
            self._write(data)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) and data.get("format") == FORMAT else {}

    def _write(self, data: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=self.path.name, suffix=".tmp",
                                             delete=False) as file:
                json.dump(data, file, indent=1)
            os.replace(file.name, self.path)
        except OSError as error:
            if not self._said_unwritable:
                self._said_unwritable = True
                warnings.warn(f"tensortune: cannot write the cache file {self.path} ({error}); served configs will "
                              "not be at hand when the service cannot be reached", stacklevel=2)
