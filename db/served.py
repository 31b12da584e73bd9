"""Best configs from a running `tensortune serve`: `apply_history_best("http://host:8000")` and the torch backend's
`db` option, for a client that has no database (this path opens no SQL engine).

The context asks the service's `GET /api/best/batch` once per workload and target, a model's workloads in one
request, and answers as HistoryBest does (the service runs HistoryBest over its database): the best config of the
workload on this target or the most similar one, else, for `query_nearest`, the nearest stored shape's. Answers
with a config go to a cache file (db/served_cache.py): a client that cannot reach the service answers from it,
saying so in one warning, and asks again after RETRY_SECONDS.

A workload the service has no config of its own for (the client builds the fallback, or another shape's config)
is reported with `POST /api/requests`, once per process, so that the service queues a job tuning it
(db/client_requests.py); the next process that asks gets its config. The reports carry $TENSORTUNE_TOKEN, as
every POST to a service that has one must.
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from pathlib import Path
from typing import Iterable

import httpx

from search_space import Config, FallbackWarned, Target, Workload, get_space, template_version

from .history import StoredConfig, predicted_message, similar_target_message
from .served_cache import ServedCache, cache_path

TIMEOUT = httpx.Timeout(10.0, connect=3.0)
RETRY_SECONDS = 60.0  # how long a context that could not reach its service answers from the cache alone
BATCH = 64  # workloads per request: a URL of a few kilobytes

# What this process has reported, (service, target, workload): once per process, not per context, so that a
# program opening a context per inference does not ask the service again each time.
_REPORTED: set[tuple[str, str, str]] = set()
_REPORTING = threading.Lock()


def is_served(source) -> bool:
    return isinstance(source, str) and source.startswith(("http://", "https://"))


def _reason(error: Exception) -> str:
    """An HTTP error as the service gives its reason (`detail`), else as httpx says it."""
    if isinstance(error, httpx.HTTPStatusError):
        try:
            return f"{error.response.status_code} {error.response.json()['detail']}"
        except (ValueError, KeyError, TypeError):
            return f"{error.response.status_code} {error.response.text[:200]}"
    return str(error) or type(error).__name__


def _stored(workload: Workload, target: Target, answer: dict | None) -> StoredConfig | None:
    """An answer as a config of this client's space; None when there is none, or it is for a template of another
    version than this client's, or it does not fit."""
    if answer is None or answer.get("config") is None:
        return None
    try:
        if answer.get("template_version") not in (None, template_version(workload, target)):
            return None
        config = get_space(workload, target).from_json(answer["config"])
        used = Target.parse(answer["from_target"]) if answer.get("from_target") else None
        return StoredConfig(config, Workload.from_key(answer["from_workload"]), used, answer.get("predicted") or "")
    except (LookupError, TypeError, ValueError):
        return None


def measured_here(workload: Workload, answer: dict | None) -> bool:
    """Whether the service answered with a config measured for this very workload (not borrowed or predicted)."""
    return bool(answer) and answer.get("from_workload") == workload.key and not answer.get("predicted")


class ServedBest(FallbackWarned):
    """A dispatch context answering from a tensortune service; safe to query from several threads."""

    def __init__(self, url: str, cache: str | Path | None = None):
        super().__init__()
        self.url = url.rstrip("/")
        self.cache = ServedCache(cache_path(cache), self.url)
        self._answers: dict[tuple[str, str], StoredConfig | None] = {}
        self._offline_until = 0.0
        self._said: set[str] = set()  # the kinds of trouble warned about, once each per context
        self._lock = threading.Lock()

    def query(self, workload: Workload, target: Target) -> Config | None:
        found = self.query_nearest(workload, target)
        if found is None or found.workload != workload:
            return None
        if found.predicted and self.first_time((str(target), workload.key)):
            warnings.warn(predicted_message(workload, target, found), stacklevel=4)
        return found.config

    def query_nearest(self, workload: Workload, target: Target) -> StoredConfig | None:
        return self.query_nearest_many([workload], target)[workload]

    def query_nearest_many(self, workloads: Iterable[Workload], target: Target) -> dict[Workload, StoredConfig | None]:
        """HistoryBest.query_nearest of each workload, those not asked before fetched in one request."""
        workloads = list(dict.fromkeys(workloads))
        with self._lock:
            new = [workload for workload in workloads if (workload.key, str(target)) not in self._answers]
            for start in range(0, len(new), BATCH):
                self._fetch(new[start:start + BATCH], target)
            return {workload: self._answers[(workload.key, str(target))] for workload in workloads}

    def _fetch(self, workloads: list[Workload], target: Target) -> None:
        answers = self._ask(workloads, target)
        if answers is None:
            answers = self.cache.answers(str(target))
        else:
            self.cache.keep(str(target), {workload.key: answers.get(workload.key) for workload in workloads})
            self._report([workload for workload in workloads if not measured_here(workload, answers.get(workload.key))],
                         target)
        for workload in workloads:
            found = _stored(workload, target, answers.get(workload.key))
            if found is not None and found.target is not None and found.workload == workload:
                warnings.warn(similar_target_message(workload, target, found.target), stacklevel=6)
            self._answers[(workload.key, str(target))] = found

    def _ask(self, workloads: list[Workload], target: Target) -> dict[str, dict] | None:
        """The service's answers by workload key; None, said once, when it cannot be reached (or fails)."""
        if time.monotonic() < self._offline_until:
            return None
        params = {"target": str(target), "workload": [workload.key for workload in workloads]}
        try:
            response = httpx.get(f"{self.url}/api/best/batch", params=params, timeout=TIMEOUT)
            response.raise_for_status()
            return {answer["workload"]: answer for answer in response.json()["configs"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            self._offline_until = time.monotonic() + RETRY_SECONDS
            self._warn_once("offline", f"tensortune: cannot get configs from {self.url} ({_reason(error)}); using "
                                       f"those cached in {self.cache.path}")
            return None

    def _report(self, workloads: list[Workload], target: Target) -> None:
        """Ask the service to tune each workload it has no config of its own for, once per process."""
        token = os.environ.get("TENSORTUNE_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for workload in workloads:
            with _REPORTING:
                if (self.url, str(target), workload.key) in _REPORTED:
                    continue
                _REPORTED.add((self.url, str(target), workload.key))
            try:
                response = httpx.post(f"{self.url}/api/requests", headers=headers, timeout=TIMEOUT,
                                      json={"workload": workload.key, "target": str(target)})
                if response.status_code != 403:  # 403: the service queues no jobs for clients, as its owner chose
                    response.raise_for_status()
            except httpx.HTTPError as error:
                self._warn_once("report", f"tensortune: could not ask {self.url} to tune {workload.key} "
                                          f"({_reason(error)})")

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            warnings.warn(message, stacklevel=7)
