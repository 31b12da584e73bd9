"""The object cache: a kernel built again, here or in another process, loads the machine code LLVM made of the same
IR for this machine, and computes what the kernel compiled afresh computes; a damaged file, another machine or an
unwritable directory never loads wrong code or fails a build; tuning's candidates are not stored."""
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from search_space import conv2d, dense, get_space, host_target
from workers import Task, build
from workers.object_cache import ENV, ObjectCache, object_cache
from workers.task import build_step
from tests.compile_helpers import compiled

CONV = conv2d(1, 16, 9, 9, 32, 3, 3, 1, 1, bias=True, epilogue="relu")  # edge rows and columns: several micro-kernels


def objects(directory: Path) -> dict[str, float]:
    return {path.name: path.stat().st_mtime for path in directory.glob("*.o")}


def computed(kernel, inputs) -> np.ndarray:
    out = kernel(*inputs)
    assert CONV.max_error(out, CONV.reference(*inputs)) <= 1
    return out


def test_a_kernel_built_again_loads_its_machine_code_and_computes_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    inputs = CONV.random_inputs()
    first = build(CONV)
    assert not first.compiled.from_cache and len(objects(tmp_path)) == 1
    again = build(CONV)
    assert again.compiled.from_cache
    assert np.array_equal(computed(first, inputs), computed(again, inputs))
    assert len(objects(tmp_path)) == 1
    other = build(CONV, config=get_space(CONV, host_target()).sample(1, 3)[0])  # other IR: another object
    assert not other.compiled.from_cache and len(objects(tmp_path)) == 2
    computed(other, inputs)


def test_another_process_loads_what_one_stored(tmp_path):
    """The point of it: a model's next start. A fresh process builds the kernel from the stored object."""
    script = ("import json, sys; from search_space import Workload; from workers import build; "
              "k = build(Workload.from_key(sys.argv[1])); x = k.workload.random_inputs(); "
              "print(json.dumps([k.compiled.from_cache, float(k.workload.max_error(k(*x), k.workload.reference(*x)))]))")
    env = os.environ | {ENV: str(tmp_path)}
    run = lambda: json.loads(subprocess.run([sys.executable, "-c", script, CONV.key], env=env, check=True,
                                            capture_output=True, text=True).stdout)
    assert run()[0] is False
    cached, error = run()
    assert cached is True and error <= 1


def test_another_machine_or_other_ir_is_another_key():
    key = ObjectCache.key("define void @f() { ret void }", "znver4", "+avx2,+avx512f")
    assert key == ObjectCache.key("define void @f() { ret void }", "znver4", "+avx2,+avx512f")
    assert len({key, ObjectCache.key("define void @g() { ret void }", "znver4", "+avx2,+avx512f"),
                ObjectCache.key("define void @f() { ret void }", "sapphirerapids", "+avx2,+avx512f"),
                ObjectCache.key("define void @f() { ret void }", "znver4", "+avx2,-avx512f")}) == 4


def test_a_damaged_or_torn_file_is_compiled_again_never_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    inputs = CONV.random_inputs()
    expected = computed(build(CONV), inputs)
    (path,) = tmp_path.glob("*.o")
    stored = path.read_bytes()
    for damaged in (stored[:len(stored) // 2], stored[:40] + bytes(len(stored) - 40)):
        path.write_bytes(damaged)
        kernel = build(CONV)
        assert not kernel.compiled.from_cache
        assert np.array_equal(computed(kernel, inputs), expected)
        assert path.read_bytes() == stored  # stored whole again
    assert build(CONV).compiled.from_cache


def test_off_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert object_cache() is None
    assert not build(CONV).compiled.from_cache and not build(CONV).compiled.from_cache
    assert not list(tmp_path.rglob("*.o"))


def test_without_a_setting_it_is_the_users_cache_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert object_cache().directory == tmp_path / "xdg" / "tensortune" / "objects"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert object_cache().directory == tmp_path / ".cache" / "tensortune" / "objects"


def test_an_unwritable_directory_builds_all_the_same_and_says_so_once(tmp_path, monkeypatch, caplog):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(ENV, str(tmp_path / "a-file" / "cache"))  # under a file: cannot be made, even by root
    inputs = CONV.random_inputs()
    with caplog.at_level(logging.WARNING, logger="tensortune"):
        computed(build(CONV), inputs)
        computed(build(CONV, config=get_space(CONV, host_target()).sample(1, 3)[0]), inputs)
    said = [record.message for record in caplog.records if "not cached" in record.message]
    assert len(said) == 1 and str(tmp_path / "a-file" / "cache") in said[0] and ENV in said[0]


def test_the_files_read_least_recently_go_past_the_limit(tmp_path):
    data = bytes(range(256)) * 4
    cache = ObjectCache(tmp_path, limit=3 * (len(data) + 32))
    for key in "abc":
        cache.put(key, data)
    past = time.time() - 100
    for age, key in enumerate("abc"):
        os.utime(tmp_path / f"{key}.o", (past + age, past + age))
    assert cache.get("a") == data  # read: now the most recent
    cache.put("d", data)
    assert sorted(objects(tmp_path)) == ["a.o", "c.o", "d.o"]
    assert cache.get("b") is None


def test_tunings_candidates_are_not_stored(tmp_path, monkeypatch):
    """Each candidate is built once: storing them would only push out the kernels that models load."""
    monkeypatch.setenv(ENV, str(tmp_path))
    workload = dense(16, 32, 24)
    fallback = build(workload).config  # its object stored
    stored = objects(tmp_path)
    for config in (get_space(workload, host_target()).get(0), fallback):
        built = build_step(Task(workload.key, str(host_target()), config.to_json()))
        assert not built.kernel.compiled.from_cache
    assert objects(tmp_path) == stored


def test_a_model_compiled_again_loads_its_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "objects"))
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 24)
    db = f"sqlite:///{tmp_path}/empty.db"
    with torch.no_grad():
        expected = compiled(model, db)(x)
        stored = objects(tmp_path / "objects")
        assert len(stored) >= 2  # each dense, and any kernel beside them
        time.sleep(0.01)
        assert torch.equal(compiled(model, db)(x), expected)
    again = objects(tmp_path / "objects")
    assert again.keys() == stored.keys() and all(again[name] > stored[name] for name in stored)
