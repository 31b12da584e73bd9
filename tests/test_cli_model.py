"""`tensortune tune-model` and `tensortune bench model` on a model file a user writes, whatever its forward returns
(a tensor, tuples, lists, dicts, a Hugging Face ModelOutput), and their refusals."""
import contextlib
import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bench.allocator import allocator
from bench.profile import FORWARDS, ROUNDS, against_pytorch, mkl_packed, onednn_packed, print_profile, torch_op
from db import Database
from search_space import Workload, batch_matmul, conv2d, dense, host_target, matmul
from service.cli import app
from workers.torch_arrays import numpy_array

MODEL_FILE = '''
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def tiny():
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(4, 16),)


def sized(seq_len=8):
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(1, seq_len, 16),)


def nothing():
    return torch.nn.Sequential(torch.nn.ReLU()), (torch.randn(3),)
'''


STRUCTURED_FILE = '''
import torch


class Heads(torch.nn.Module):
    def __init__(self, named):
        super().__init__()
        self.named, self.up, self.down = named, torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        hidden = torch.relu(self.up(x))
        if self.named:
            return {"hidden": hidden, "out": [self.down(hidden)], "steps": 2}
        return hidden, (self.down(hidden), None)


def pair():
    torch.manual_seed(0)
    return Heads(named=False).eval(), (torch.randn(4, 16),)


def named():
    torch.manual_seed(0)
    return Heads(named=True).eval(), (torch.randn(4, 16),)
'''
BERT_FILE = '''
import torch
from transformers import BertConfig, BertModel


def bert():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)
    return BertModel(config).eval(), (torch.randint(0, 100, (1, 8)),)
'''


def run(*args, cwd) -> subprocess.CompletedProcess:
    """The CLI run in this process, in `cwd`, as `python -m service ARGS` runs it (a process of its own would spend
    seconds importing PyTorch): its exit code and what it printed to stdout and to stderr. An exception other than
    the command's exit is raised, as the process would have printed its traceback."""
    with contextlib.chdir(cwd):
        result = CliRunner(env={"COLUMNS": "160"}).invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def refused(*args, cwd, monkeypatch):
    """A command that ends before compiling anything, run in this process (a new one costs seconds of imports)."""
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(app, list(args))


def test_tune_model_tunes_every_task_then_times_the_model(tmp_path):
    (tmp_path / "models.py").write_text(MODEL_FILE)
    db = f"sqlite:///{tmp_path}/model.db"
    tuned = run("tune-model", "models.py:tiny", "--trials", "12", "--tuner", "random", "--target", "llvm -threads=1",
                "--db", db, "--rounds", "1", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "12 trials over 2 tasks of models.py:tiny" in tuned.stdout
    assert re.search(r"^time: tuner [\d.]+ s \(\d+% of [\d.]+ s\), measuring [\d.]+ s, writing records [\d.]+ s$",
                     tuned.stdout, re.M), tuned.stdout
    assert "Traceback" not in tuned.stderr
    assert re.search(r"^eager PyTorch [\d.]+ ms, tensortune [\d.]+ ms, measured together in this run: [\d.]+x, the "
                     r"median of the rounds' ratios \(1 rounds, their middle half [\d.]+-[\d.]+\); max difference",
                     tuned.stdout, re.M), tuned.stdout
    database = Database(db)
    assert database.job(1).model == "models.py:tiny" and database.job(1).status == "done"
    jobs = database.children(1)
    assert len(jobs) == 2 and sum(len(database.job_records(job.id)) for job in jobs) == 12

    request = ("tune-model", "models.py:tiny", "--trials", "12", "--tuner", "random", "--target", "llvm -threads=1",
               "--db", db, "--rounds", "1")
    again = run(*request, "--again", cwd=tmp_path)  # without --again, shown rather than run (as for --seq-lens below)
    assert again.returncode == 0, again.stderr
    assert "12 trials over 2 tasks" in again.stdout and len(database.children(4)) == 2

    timed = run("bench", "model", "models.py:tiny", "--json", "--db", db, "--target", "llvm -threads=1", "--rounds", "3",
                cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.strip().splitlines()[-1])
    ways = ("eager", "inductor", "inductor_max_autotune", "tensortune")
    assert {"model", "threads", "max_error", *(f"{way}_ms" for way in ways)} <= set(row)
    assert row["model"] == "models.py:tiny" and row["threads"] == 1 and row["rounds"] == 3 and row["max_error"] < 1e-4
    assert min(row[f"{way}_ms"] for way in ways) > 0
    # a sample of each way a round: its median the figure, the median of the rounds' ratios its speedup
    samples = {way: np.array(row["samples_ms"][way]) for way in ways}
    assert set(row["samples_ms"]) == set(ways) and all(len(values) == 3 for values in samples.values())
    quartiles = lambda ratios: pytest.approx(np.percentile(ratios, (25, 50, 75)), abs=6e-4)  # rounded to 3 places
    for way in ways:
        assert row[f"{way}_ms"] == pytest.approx(np.median(samples[way]), abs=2e-3)
        low, high = row[f"{way}_speedup_spread"]
        assert [low, row[f"{way}_speedup"], high] == quartiles(samples["eager"] / samples[way])
    low, high = row["tensortune_vs_inductor_spread"]
    assert [low, row["tensortune_vs_inductor"], high] == quartiles(samples[row["fastest_inductor"]] /
                                                                   samples["tensortune"])
    assert set(row["compile_seconds"]) == {"inductor", "inductor_max_autotune", "tensortune"}
    table = run("bench", "model", "models.py:tiny", "--db", db, "--target", "llvm -threads=1", "--rounds", "3",
                "--no-max-autotune", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert re.search(r"\d\.\d\dx \(\d\.\d\d-\d\.\d\d\)", table.stdout), table.stdout  # speedup (its middle half)


def test_a_transformers_bert_returning_a_model_output_is_tuned_then_timed(tmp_path):
    """A BertModel from its config, random weights (the `[hf]` extra; nothing is downloaded): its forward returns a
    BaseModelOutputWithPoolingAndCrossAttentions, which the final timing subtracted as if it were a tensor, a
    traceback after the tuning was stored."""
    pytest.importorskip("transformers")
    (tmp_path / "hf.py").write_text(BERT_FILE)
    db = f"sqlite:///{tmp_path}/hf.db"
    tuned = run("tune-model", "hf.py:bert", "--trials", "8", "--tuner", "random", "--target", "llvm -threads=1",
                "--db", db, "--rounds", "1", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "Traceback" not in tuned.stderr and "eager PyTorch" in tuned.stdout
    assert float(tuned.stdout.split("max difference ")[-1]) < 1e-4
    database = Database(db)
    tasks = database.children(1)  # its dense layers: 8 trials are too few for a batch of 4 each
    assert len(tasks) >= 3 and all(database.job_records(task.id) for task in tasks)

    timed = run("bench", "model", "hf.py:bert", "--json", "--no-inductor", "--db", db, "--target", "llvm -threads=1",
                "--rounds", "1", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.strip().splitlines()[-1])
    assert row["model"] == "hf.py:bert" and row["max_error"] < 1e-4 and row["tensortune_ms"] > 0


def test_bench_model_times_models_returning_tuples_and_dicts(tmp_path):
    (tmp_path / "heads.py").write_text(STRUCTURED_FILE)
    timed = run("bench", "model", "heads.py:pair", "heads.py:named", "--json", "--no-inductor", "--target",
                "llvm -threads=1", "--db", f"sqlite:///{tmp_path}/heads.db", "--rounds", "2", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    rows = [json.loads(line) for line in timed.stdout.strip().splitlines()[-2:]]
    assert [row["model"] for row in rows] == ["heads.py:pair", "heads.py:named"]
    assert {row["rounds"] for row in rows} == {2}
    assert all(row["max_error"] < 1e-4 and row["tensortune_ms"] > 0 for row in rows)


CONV_FILE = '''
import torch
from torch import nn


def cnn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(128, 10))
    return model.eval(), (torch.randn(1, 3, 16, 16),)
'''


def test_channels_last_tunes_and_times_the_model_laid_channels_last(tmp_path):
    """--channels-last: the model and its image in channels_last, so its lone convolution (which reads its input as
    it lies) is tuned and run in the nhwc layout; a job of its own, and the bench row says which."""
    (tmp_path / "cnn.py").write_text(CONV_FILE)
    db, target = f"sqlite:///{tmp_path}/cnn.db", "llvm -threads=1"
    tuned = run("tune-model", "cnn.py:cnn", "--channels-last", "--trials", "4", "--tuner", "random", "--target", target,
                "--db", db, "--rounds", "1", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "4 trials over 2 tasks of cnn.py:cnn --channels-last" in tuned.stdout
    database = Database(db)
    assert [job.workload.p["layout"] for job in database.children(1) if job.workload.op == "conv2d"] == ["nhwc"]
    timed = run("bench", "model", "cnn.py:cnn", "--channels-last", "--json", "--no-inductor", "--rounds", "1",
                "--target", target, "--db", db, cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.strip().splitlines()[-1])
    assert row["model"] == "cnn.py:cnn --channels-last" and row["max_error"] < 1e-4 and row["tensortune_ms"] > 0


def test_the_error_is_the_largest_over_every_tensor_of_the_output():
    torch = pytest.importorskip("torch")
    from bench.model import max_difference

    @dataclasses.dataclass
    class Output:
        logits: torch.Tensor
        extra: tuple

    zeros, ones = torch.zeros(3), torch.ones(2)
    expected = {"a": zeros, "b": [Output(ones, (zeros, None, 7))]}
    assert max_difference(expected, expected) == 0.0
    assert max_difference({"a": zeros + 0.5, "b": [Output(ones, (zeros - 2, None, 7))]}, expected) == 2.0
    assert max_difference((zeros, ones * 3), (zeros, ones)) == 2.0


def test_models_that_cannot_be_tuned_are_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODEL_FILE)
    nothing = refused("tune-model", "models.py:nothing", "--db", f"sqlite:///{tmp_path}/x.db", cwd=tmp_path,
                      monkeypatch=monkeypatch)
    assert nothing.exit_code == 1 and "has no dense, matmul, batch_matmul or conv2d" in nothing.stderr
    unknown = refused("tune-model", "gpt-7", cwd=tmp_path, monkeypatch=monkeypatch)
    assert unknown.exit_code == 2 and "presets are bert-layer, bert-base, resnet18" in unknown.stderr
    missing = refused("bench", "model", "nowhere.py:make", cwd=tmp_path, monkeypatch=monkeypatch)
    assert missing.exit_code == 2 and "nowhere.py: cannot get a model from make()" in missing.stderr
    no_rounds = refused("bench", "model", "models.py:tiny", "--rounds", "0", cwd=tmp_path, monkeypatch=monkeypatch)
    assert no_rounds.exit_code == 2 and "--rounds" in no_rounds.stderr
    no_closing_rounds = refused("tune-model", "models.py:tiny", "--rounds", "0", cwd=tmp_path, monkeypatch=monkeypatch)
    assert no_closing_rounds.exit_code == 2 and "--rounds" in no_closing_rounds.stderr
    other_cpu = next(cpu for cpu in ("znver3", "icelake-server") if cpu != host_target().model)
    foreign = refused("tune-model", "models.py:tiny", "--target", f"llvm -mcpu={other_cpu} -threads=1", "--db",
                      f"sqlite:///{tmp_path}/f.db", cwd=tmp_path, monkeypatch=monkeypatch)
    assert foreign.exit_code == 1 and f"this host's CPU is {host_target().model}, not {other_cpu}" in foreign.stderr
    crowded = refused("tune-model", "models.py:tiny", "--target", f"llvm -threads={host_target().threads + 1}",
                      "--db", f"sqlite:///{tmp_path}/c.db", cwd=tmp_path, monkeypatch=monkeypatch)
    assert crowded.exit_code == 1 and f"this host has {host_target().threads} cores" in crowded.stderr
    for each in (nothing, unknown, missing, no_rounds, no_closing_rounds, foreign, crowded):
        assert each.exception is None or isinstance(each.exception, SystemExit), each.exception


@pytest.mark.parametrize("command", [("bench", "model", "models.py:tiny", "--db", "sqlite:///b.db"), ("bench", "kernels"),
                                     ("bench", "predict", "--db", "sqlite:///b.db")], ids=["model", "kernels", "predict"])
def test_benchmarks_time_only_code_this_host_runs(command, tmp_path, monkeypatch):
    """A benchmark's figures are this host's: for another CPU model's target, or more threads than its cores, they
    would be stored and read under a name they are not of. Refused in one line, before anything is timed."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    host = host_target()
    other_cpu = next(cpu for cpu in ("znver3", "icelake-server") if cpu != host.model)
    for target, problem in [(f"llvm -mcpu={other_cpu} -threads=1", f"this host's CPU is {host.model}, not {other_cpu}"),
                            (f"llvm -threads={host.threads + 1}", f"this host has {host.threads} cores")]:
        result = refused(*command, "--target", target, cwd=tmp_path, monkeypatch=monkeypatch)
        assert result.exit_code == 1 and problem in result.stderr and "a benchmark times" in result.stderr, result.stderr


def test_bench_scheduler_compares_both_strategies_at_a_checkpoint(tmp_path):
    """Both strategies tune the model from scratch; each row is measured beside eager in the same run."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    compared = run("bench", "scheduler", "models.py:tiny", "--at", "8", "--tuner", "random", "--json", "--rounds", "3",
                   cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    rows = [json.loads(line) for line in compared.stdout.splitlines()]
    assert [(r["strategy"], r["trials"]) for r in rows] == [("gradient", 8), ("round-robin", 8)]
    assert all(len(r["samples_ms"][way]) == 3 for r in rows for way in ("eager", "tensortune"))
    assert all(0 < r["estimated_ms"] < 1e3 and r["eager_ms"] > 0 and r["tensortune_ms"] > 0 for r in rows)
    # each speedup is the median of the rounds' ratios (bench model's)
    ratios = [np.median(np.divide(r["samples_ms"]["eager"], r["samples_ms"]["tensortune"])) for r in rows]
    assert all(r["speedup"] == pytest.approx(ratio, abs=6e-4) for r, ratio in zip(rows, ratios))  # rounded to 3 places


def test_tune_model_tunes_every_sequence_length_under_one_budget(tmp_path):
    """The tasks of both lengths are one model job's (the lengths, a set, name it), each measured, and the model is
    timed at each length; the same lengths in another order are the same job, shown rather than run again."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    db = f"sqlite:///{tmp_path}/lengths.db"
    request = ("tune-model", "models.py:sized", "--trials", "16", "--tuner", "random", "--target", "llvm -threads=1",
               "--db", db, "--rounds", "1")
    tuned = run(*request, "--seq-lens", "16,8", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "16 trials over 4 tasks of models.py:sized --seq-lens 8,16" in tuned.stdout
    database = Database(db)
    assert database.job(1).model == "models.py:sized --seq-lens 8,16" and database.job(1).status == "done"
    jobs = database.children(1)  # up and down, at each length
    assert sorted(job.workload.p["M"] for job in jobs) == [8, 8, 16, 16]
    assert all(database.job_records(job.id) for job in jobs)
    lines = [line for line in tuned.stdout.splitlines() if "eager PyTorch" in line]
    assert [line.split(":")[0] for line in lines] == ["seq_len 8", "seq_len 16"]
    assert all(float(line.split("max difference ")[-1]) < 1e-4 for line in lines)

    shown = run(*request, "--seq-lens", "8,16,8", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "model job 1 already tuned this" in shown.stderr and shown.stdout.count("eager PyTorch") == 2


def test_sequence_lengths_need_a_function_that_takes_seq_len(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODEL_FILE)
    fixed = refused("tune-model", "models.py:tiny", "--seq-lens", "8,16", "--db", f"sqlite:///{tmp_path}/x.db",
                    cwd=tmp_path, monkeypatch=monkeypatch)
    assert fixed.exit_code == 2 and fixed.stderr.count("\n") == 1, fixed.stderr
    assert "models.py: tiny() takes no seq_len" in fixed.stderr and "def tiny(seq_len=128)" in fixed.stderr
    preset = refused("bench", "model", "resnet18", "--seq-lens", "32", cwd=tmp_path, monkeypatch=monkeypatch)
    assert preset.exit_code == 2 and "resnet18 takes no seq_len" in preset.stderr
    garbled = refused("bench", "model", "models.py:sized", "--seq-lens", "8,x", cwd=tmp_path, monkeypatch=monkeypatch)
    assert garbled.exit_code == 2 and "--seq-lens 8,x: give positive whole numbers" in garbled.stderr
    assert all(each.exception is None or isinstance(each.exception, SystemExit) for each in (fixed, preset, garbled))


def test_bench_model_times_every_way_at_every_length(tmp_path):
    (tmp_path / "models.py").write_text(MODEL_FILE)
    timed = run("bench", "model", "models.py:sized", "--seq-lens", "8,16", "--no-max-autotune", "--json", "--target",
                "llvm -threads=1", "--db", f"sqlite:///{tmp_path}/b.db", "--rounds", "1", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    rows = [json.loads(line) for line in timed.stdout.splitlines() if line.startswith("{")]
    assert [(row["model"], row["seq_len"]) for row in rows] == [("models.py:sized", 8), ("models.py:sized", 16)]
    for row in rows:
        assert min(row["eager_ms"], row["inductor_ms"], row["tensortune_ms"]) > 0 and row["max_error"] < 1e-4
        assert "inductor_max_autotune_ms" not in row and row["fastest_inductor"] == "inductor"
        # ms are rounded to 3 decimals, and this model runs in tens of microseconds
        assert row["tensortune_vs_inductor"] == pytest.approx(row["inductor_ms"] / row["tensortune_ms"], rel=0.1)
        assert set(row["compile_seconds"]) == {"inductor", "tensortune"}
        assert row["allocator"] == allocator()
    assert f"allocator: {allocator()}" in timed.stderr


def test_the_profile_sets_the_kernel_against_pytorch_within_each_round():
    """A slow phase over the kernel's sample in one round and over both ways in another: each way's median would
    have the kernel lose; the rounds' pairs have it win by 1.2 ms a call, 1.4x."""
    samples = {"tensortune": [3.0e-3, 5.5e-3, 6.0e-3], "torch": [4.2e-3, 4.3e-3, 8.4e-3]}
    assert np.median(samples["tensortune"]) > np.median(samples["torch"])
    assert against_pytorch(samples, weight=2) == {"loss_ms": -2.4, "speedup_alone": 1.4}


def test_bench_model_profile_puts_each_tuned_op_beside_pytorchs_and_the_rest_outside(tmp_path, monkeypatch, capsys):
    """Tiny's two tasks, each per call in the model (with the backend's work before it) and alone beside PyTorch's
    and oneDNN's, sorted by loss; what they leave of each way's model time is outside them, the backend's work part
    of tensortune's; the table says the same."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    db, target = f"sqlite:///{tmp_path}/p.db", "llvm -threads=1"
    tuned = run("tune-model", "models.py:tiny", "--trials", "4", "--tuner", "random", "--target", target, "--db", db,
                cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    words = ("bench", "model", "models.py:tiny", "--profile", "--no-inductor", "--target", target, "--db", db,
             "--rounds", "1")
    timed = run(*words, "--json", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.splitlines()[-1])
    ops = row["profile"]
    assert [op["workload"] for op in sorted(ops, key=lambda op: op["workload"])] == [
        "dense(M=4,N=32,K=16,bias=true,epilogue=relu,dtype=float32)", "dense(M=4,N=8,K=32,bias=true,dtype=float32)"]
    assert [op["loss_ms"] for op in ops] == sorted((op["loss_ms"] for op in ops), reverse=True)
    for op in ops:
        assert op["weight"] == 1 and min(op["in_model_us"], op["glue_us"], op["tensortune_us"], op["torch_us"]) > 0
        # both from the rounds' pairs, an odd number of them: the median difference is a loss where the median ratio
        # is a speedup; the medians' difference may differ (17 µs against 20 on a busy Zen 1)
        assert op["speedup_alone"] > 0 and ROUNDS % 2 == 1
        assert op["loss_ms"] == 0 or op["speedup_alone"] == 1 or (op["loss_ms"] < 0) == (op["speedup_alone"] > 1)
        assert op["onednn_us"] > 0  # dense beside oneDNN's packed linear too, as max-autotune runs it
        best = Database(db).best(Workload.from_key(op["workload"]), target)[0]  # and beside what tuning measured
        assert op["tuned_us"] == round(best.result.median * 1e6, 1) > 0
        assert op["mkl_us"] > 0 if torch.backends.mkl.is_available() else op["mkl_us"] is None  # and MKL's GEMM
        # the kernel's speedup over each, from the rounds' pairs as over PyTorch
        assert op["speedup_vs_onednn"] > 0 and (op["speedup_vs_mkl"] is None) == (op["mkl_us"] is None)
    # tensortune's outside: each profiled forward less its kernels (the same forwards), the median of those
    forwards = np.array(row["outside_ms"]["tensortune_forwards"])
    assert len(forwards) == FORWARDS and (forwards[:, 0] > forwards[:, 1]).all() and (forwards[:, 1] > 0).all()
    assert row["outside_ms"]["tensortune"] == pytest.approx(np.median(forwards[:, 0] - forwards[:, 1]), abs=6e-4)
    assert row["outside_ms"]["tensortune_forward"] == pytest.approx(np.median(forwards[:, 0]), abs=6e-4)
    # eager's: its forwards timed in the ops' rounds (the median of each op's) less its operators timed alone there
    assert all(op["eager_forward_ms"] > 0 for op in ops)
    eager = row["outside_ms"]["eager_forward"]
    assert eager == pytest.approx(np.median([op["eager_forward_ms"] for op in ops]), abs=6e-4)
    assert row["outside_ms"]["eager"] == pytest.approx(eager - sum(op["torch_us"] for op in ops) / 1e3, abs=2e-3)
    glue = row["outside_ms"]["tensortune_glue"]
    assert glue == pytest.approx(sum(op["glue_us"] for op in ops) / 1e3, abs=2e-3) and 0 < glue < row["tensortune_ms"]
    monkeypatch.setenv("COLUMNS", "250")  # a line a row, both packed columns beside
    print_profile(row)  # the table `bench model --profile` prints without --json
    table = capsys.readouterr().out
    assert "dense M=4 N=32 K=16 bias=true epilogue=relu" in table and "MKL packed µs" in table
    assert all(f"{op['onednn_us']:.1f} ({op['speedup_vs_onednn']:.2f}x)" in table for op in ops)
    outside = row["outside_ms"]
    said = f"outside the tuned ops: tensortune {outside['tensortune']:.2f} ms of {outside['tensortune_forward']:.2f}"
    assert said in table and f"eager {outside['eager']:.2f} ms of {outside['eager_forward']:.2f}" in table
    assert "glue µs" in table and f"of it {glue:.2f} ms the backend's Python work before each kernel" in table
    assert "as tuned µs" in table and all(f"{op['tuned_us']:.1f}" in table for op in ops)
    # the kernel in the model over the kernel alone, warm and as tuning times it (weights rotated, activations
    # written again): the medians of the rounds' ratios (all timed in each round)
    assert "model / alone" in table and "model / rotated" in table
    for op in ops:
        for way, us in (("alone", "tensortune_us"), ("rotated", "rotated_us")):
            assert op[us] > 0 and 0.25 < op[f"in_model_vs_{way}"] / (op["in_model_us"] / op[us]) < 4
            assert f"{op[f'in_model_vs_{way}']:.2f}" in table and f"{op[us]:.1f}" in table
    # each op's operations at the FMA peak, timed in its rounds, and the fraction of it its kernel reaches
    for op in ops:
        assert op["peak_family"] == "fma" and 0 < op["peak_us"] < op["tensortune_us"] and 0 < op["peak_fraction"] < 1
        assert "of peak" in table and f"{op['peak_fraction']:.0%}" in table
    # the forward were they all at the peak, the rest as it is: eager's time over it bounds the speedup
    ceiling = row["ceiling"]
    assert ceiling["kernels_ms"] == pytest.approx(sum(op["peak_us"] for op in ops) / 1e3, abs=2e-3)
    assert ceiling["forward_ms"] == pytest.approx(ceiling["kernels_ms"] + outside["tensortune"], abs=2e-3)
    # rounded to 3 places: a ratio under 0.25 is off by more than 2e-3 of itself (0.183 for 0.18343)
    assert ceiling["speedup"] == pytest.approx(row["eager_ms"] / ceiling["forward_ms"], rel=2e-3, abs=6e-4)
    assert f"a {ceiling['forward_ms']:.2f} ms forward: {ceiling['speedup']:.2f}x eager, the most that" in table


@pytest.mark.parametrize("workload", [
    dense(5, 24, 16, bias=True, epilogue="gelu"), dense(3, 8, 16).in_dtype("bfloat16"),
    conv2d(1, 16, 9, 9, 24, 3, 3, 2, 1, bias=True, residual=True, epilogue="relu"),  # a basic block's second
    conv2d(2, 3, 11, 8, 8, 7, 7, 2, 3), conv2d(1, 8, 6, 6, 16, 1, 1, 2, 0, bias=True, epilogue="gelu_erf"),
    conv2d(1, 8, 6, 6, 16, 3, 3, 1, 1, residual=True).in_dtype("bfloat16"),
], ids=lambda workload: workload.key)
def test_the_onednn_column_times_the_op_itself(workload):
    """The packed oneDNN call beside a dense or conv2d op (what max-autotune with freezing runs) computes the
    workload's reference: its fused bias, residual and epilogue, a convolution's channels-last output read back.
    In bfloat16 on a CPU where oneDNN has no bf16 path (a Zen 3) there is no such call."""
    inputs = workload.random_inputs()
    call = onednn_packed(workload, inputs)
    if workload.dtype == "bfloat16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert call is None
        return
    result = numpy_array(call().contiguous())
    assert workload.max_error(result, workload.reference(*inputs)) <= 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_an_nhwc_convolutions_pytorch_references_read_its_channels_last_activations(dtype):
    """PyTorch's eager convolution, oneDNN's packed one and the quantized one, given an nhwc workload's [N, H, W, C]
    arrays (as NCHW-shaped channels_last views, as PyTorch holds them), compute what they compute from the NCHW
    workload's arrays of the same values."""
    last, first = (conv2d(1, 16, 9, 10, 24, 3, 3, 1, 1, bias=True, residual=True, epilogue="relu", dtype=dtype,
                          layout=layout) for layout in ("nhwc", "nchw"))
    inputs = last.random_inputs()
    nchw = [a.transpose(0, 3, 1, 2).copy() if name in ("data", "residual") else a
            for (name, _), a in zip(last.operand_shapes(), inputs)]
    ways = lambda workload, arrays: [torch_op(workload, arrays, 1), onednn_packed(workload, arrays)]
    for ours, theirs in zip(ways(last, inputs), ways(first, nchw)):
        if theirs is not None:
            got, expected = ours(), theirs()
            assert got.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(got, expected)


def test_no_onednn_column_for_products_it_has_no_packed_op_for():
    for workload in (batch_matmul(2, 8, 8, 8), dense(4, 8, 16).in_dtype("int8")):
        assert onednn_packed(workload, workload.random_inputs()) is None


@pytest.mark.parametrize("workload", [dense(5, 24, 16, bias=True, epilogue="gelu"), dense(3, 8, 16),
                                      dense(7, 40, 33, bias=True, epilogue="gelu_erf")], ids=lambda w: w.key)
def test_the_mkl_column_times_a_float32_dense_itself(workload):
    """MKL's packed GEMM beside a float32 dense (max-autotune's other choice for it) computes the workload's
    reference, bias and epilogue included; a PyTorch without MKL has no such column."""
    inputs = workload.random_inputs()
    call = mkl_packed(workload, inputs)
    if not torch.backends.mkl.is_available():
        assert call is None
        return
    assert workload.max_error(numpy_array(call()), workload.reference(*inputs)) <= 1


def test_no_mkl_column_but_for_a_float32_dense():
    for workload in (batch_matmul(2, 8, 8, 8), matmul(4, 8, 16), dense(4, 8, 16).in_dtype("bfloat16"),
                     dense(4, 8, 16).in_dtype("int8"), conv2d(1, 8, 6, 6, 16, 3, 3, 1, 1)):
        assert mkl_packed(workload, workload.random_inputs()) is None


def test_the_allocator_is_the_preloaded_malloc_else_glibcs_with_its_settings():
    jemalloc = "7f2a1c000000-7f2a1c0a3000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
    assert allocator(jemalloc, {"MALLOC_ARENA_MAX": "2"}) == "jemalloc"
    libc = "7f2a1d000000-7f2a1d1b0000 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
    assert allocator(libc, {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_ARENA_MAX": "2", "HOME": "/root"}) == (
        "glibc malloc (MALLOC_MMAP_THRESHOLD_=1048576, MALLOC_ARENA_MAX=2)")
    assert allocator(libc, {}) == "glibc malloc, its defaults"


def test_presets_are_made_at_any_sequence_length():
    pytest.importorskip("transformers")
    from frontend.presets import load_model

    _, (hidden,) = load_model("bert-layer", seq_len=32)
    assert hidden.shape == (1, 32, 768)
    bert, (ids, mask) = load_model("hf-bert-base", seq_len=16)
    assert ids.shape == mask.shape == (1, 16) and not bert.training and bert.config.hidden_size == 768
    gpt2, (tokens,) = load_model("hf-gpt2")
    assert tokens.shape == (1, 128) and not gpt2.training and gpt2.config.n_layer == 12
    again, _ = load_model("hf-gpt2", seq_len=8)  # seeded: the same random weights each time
    assert all((a == b).all() for a, b in zip(gpt2.state_dict().values(), again.state_dict().values()))


def test_hugging_face_presets_without_transformers_say_how_to_get_it(monkeypatch):
    pytest.importorskip("torch")
    from frontend.presets import ModelError, load_model

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    for preset in ("hf-bert-base", "hf-gpt2"):
        with pytest.raises(ModelError, match=rf'^{preset} needs Hugging Face transformers: pip install -e ".\[hf\]"$'):
            load_model(preset)
