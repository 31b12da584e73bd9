"""Configs over HTTP: a client with only a `tensortune serve` URL builds with the service's best configs, opens no
database, keeps them in its cache file and builds from it when the service is gone; a compiled model asks for its
kernels' configs the same way. Real services on real SQLite databases; clients in processes of their own."""
import json
import logging
import os
import signal

import httpx
import torch
from torch import nn

from db import Database, HistoryBest, ServedBest
from db.history import similar_target_message
from search_space import Target, dense, fallback_config, get_space, matmul
from service.api import create_app
from tests.db_helpers import measurement, other_threads
from tests.serve_helpers import free_port, run_client, served_in_thread, start
from tests.test_db_history import index_with
from tests.test_frontend import built_configs, frontend_lines, recording_compile

TARGET = Target.parse("llvm -threads=1")
TUNED, UNTUNED = matmul(24, 24, 24), dense(40, 40, 40)  # no dense is stored: no shape to borrow from
NO_CLIENT_JOBS = ("--no-client-jobs",)  # nothing tuned behind the tests' backs


def serve(url: str) -> tuple[object, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TENSORTUNE_TOKEN"}
    return start(url, port, env, options=NO_CLIENT_JOBS), f"http://127.0.0.1:{port}"


def stop(server) -> None:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def test_a_client_builds_the_served_best_without_a_database_and_from_its_cache_once_the_service_is_gone(tmp_path):
    url, cache = f"sqlite:///{tmp_path}/served.db", tmp_path / "cache" / "configs.json"
    database = Database(url)
    space = get_space(TUNED, TARGET)
    best, worse = space.size // 3, space.size // 2
    database.record(*measurement(TUNED, TARGET, best, 1e-5))
    database.record(*measurement(TUNED, TARGET, worse, 3e-5))
    server, service = serve(url)
    try:
        served = run_client(service, cache, TARGET, [TUNED, UNTUNED])
        assert served["configs"] == [best, fallback_config(UNTUNED, TARGET).index]
        assert served["connections"] == 0
        assert [message for message in served["warnings"] if "Cannot find config" not in message] == []
        assert httpx.get(f"{service}/api/requests").json() == httpx.get(f"{service}/api/jobs").json() == []  # switched off
        kept = json.loads(cache.read_text())["services"][service][str(TARGET)]
        assert list(kept) == [TUNED.key] and kept[TUNED.key]["config"]["index"] == best  # "none" is not kept

        tuned_since = space.size // 4
        database.record(*measurement(UNTUNED, TARGET, tuned_since, 1e-6))
        assert run_client(service, cache, TARGET, [UNTUNED])["configs"] == [tuned_since]  # asked again, not cached
    finally:
        stop(server)

    offline = run_client(service, cache, TARGET, [TUNED, UNTUNED])
    assert offline["configs"] == [best, tuned_since] and offline["connections"] == 0
    assert len(offline["warnings"]) == 1 and offline["warnings"][0].startswith(f"tensortune: cannot get configs from "
                                                                               f"{service}")
    assert str(cache) in offline["warnings"][0]


def test_the_service_answers_as_apply_history_best_does(tmp_path):
    """A config measured only on a similar target (more threads), and a shape never tuned, which borrows its
    nearest stored shape's config: the client gets what the database's own context gives, and warns alike."""
    database = Database(tmp_path / "similar.db")
    similar = other_threads(3)
    serial = index_with(TUNED, similar, 0, parallel="none", vec=8)  # a config of the 1-thread space too
    near, wanted = dense(64, 48, 32, bias=True), dense(100, 48, 32, bias=True)
    database.record(*measurement(TUNED, similar, serial, 1e-5))
    database.record(*measurement(near, TARGET, 40, 1e-5))
    with served_in_thread(create_app(database, client_jobs=None)) as url:
        client = run_client(url, tmp_path / "cache.json", TARGET, [TUNED])
        served = ServedBest(url, tmp_path / "cache.json").query_nearest(wanted, TARGET)
    assert client["configs"] == [get_space(TUNED, TARGET).config(get_space(TUNED, similar).get(serial).to_dict()).index]
    assert client["warnings"] == [similar_target_message(TUNED, TARGET, similar)]
    assert served == HistoryBest(database.read_sessions).query_nearest(wanted, TARGET) and served.workload == near


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(32, 48), nn.Linear(48, 24)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def test_a_model_runs_on_served_configs_and_a_new_size_borrows_the_nearest(tmp_path, monkeypatch, caplog):
    """The backend's `db` is the service's URL: each layer runs its stored best, and a batch size never tuned
    (Dynamo traces it symbolic, so its kernels are built at run time) the config of the tuned one."""
    monkeypatch.setenv("TENSORTUNE_CACHE", str(tmp_path / "cache.json"))
    target = Target.parse("llvm")  # the backend's default
    first, second = dense(16, 48, 32, bias=True, epilogue="relu"), dense(16, 24, 48, bias=True)
    best = {workload: get_space(workload, target).size // 3 for workload in (first, second)}
    assert all(index != fallback_config(workload, target).index for workload, index in best.items())
    database = Database(f"sqlite:///{tmp_path}/model.db")
    for workload, index in best.items():
        database.record(*measurement(workload, target, index, 1e-6))
    torch.manual_seed(0)
    model = TwoLayers().eval()
    server, service = serve(database.url)
    try:
        compiled, graphs = recording_compile(model, service)
        with torch.inference_mode(), caplog.at_level(logging.INFO, logger="tensortune.frontend"):
            for rows in (16, 20):
                x = torch.randn(rows, 32)
                assert torch.allclose(compiled(x), model(x), atol=1e-4)
    finally:
        stop(server)
    assert built_configs(graphs[0]) == best
    borrowed = [line for line in frontend_lines(caplog) if "M=20" in line]
    assert len(borrowed) == 2 and all("the nearest tuned shape" in line for line in borrowed), borrowed
    assert json.loads((tmp_path / "cache.json").read_text())["services"][service][str(target)].keys() >= \
        {first.key, second.key}
