"""bfloat16 kernels: every config of the bfloat16 spaces computes what the float32 reference of the rounded inputs
does, on awkward shapes; each instruction family is chosen from the target's features and emits its instructions
on every host (assembly), and runs where the host has it."""
import copy
import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from torch import nn
from typer.testing import CliRunner

from db import Database, apply_history_best
from frontend import extract_tasks
from frontend.presets import in_dtype
from search_space import (NoTemplate, Target, Workload, WorkloadError, conv2d, dense, fallback_config,
                          get_space, lower)
from search_space.program import format_program
from service.api import create_app
from service.cli import app as cli
from tuner.tune import tune
from workers import build
from workers.build import generated_assembly
from workers.pool import make_pool
from workers.task import MeasureOptions
from tests.compile_helpers import compiled
from tests.isa_helpers import (HOST, PROPERTY, check, configs_using,
                               workloads, zen4)
from tests.test_cli_model import MODEL_FILE, refused, run
from tests.test_service_api import TOKEN, database, job_body, runner  # noqa: F401  (database: a fixture)
from tests.serve_helpers import job_in

AVX512_BF16 = zen4("avx512bf16")


@PROPERTY
@given(workloads("bfloat16", ("matmul", "dense", "batch_matmul", "conv2d")), st.integers(0, 2**31 - 1))
def test_every_config_of_a_bfloat16_space_computes_the_rounded_reference(workload, pick):
    """Odd k (the packing's zero pair), k-blocks summed in the float32 workspace, unpacked B, tails of every tile."""
    space = get_space(workload, HOST)
    check(workload, HOST, space.get(pick % space.size))


def test_partial_sums_wait_in_float32_not_in_the_bfloat16_output():
    """Twelve k-blocks of 64 summed through a bfloat16 output would round eleven times (errors many ulps wide);
    through the float32 workspace the result is the reference's to one ulp. The workspace is there only when
    there is more than one k-block."""
    workload = dense(8, 32, 768, dtype="bfloat16")
    space = get_space(workload, HOST)
    blocked = space.config(fallback_config(workload, HOST).to_dict() | {"tile_k": [-1, 64]})
    assert "packed   Cw[8, 32] float32" in format_program(lower(workload, HOST, blocked))
    check(workload, HOST, blocked)
    whole = space.config(blocked.to_dict() | {"tile_k": [-1, 768]})
    assert "Cw" not in format_program(lower(workload, HOST, whole))


def test_a_wrong_bfloat16_result_fails_the_check():
    workload = dense(16, 32, 64, dtype="bfloat16")
    inputs = workload.random_inputs()
    expected = workload.reference(*inputs)
    wrong = expected.copy()
    wrong.view(np.uint16)[3, 5] += 3  # three units in the last place
    assert workload.max_error(expected, expected) == 0 and workload.max_error(wrong, expected) > 1


@pytest.mark.parametrize("n", [33, 34, 39, 45])
def test_a_block_tail_narrower_than_the_pair_dot_takes_the_split_form(n):
    """Tails of 1, 2, 7 and 13 columns: vdpbf16ps where a whole 4/8/16-lane vector fits, FMAs on halves below."""
    workload = dense(5, n, 10, dtype="bfloat16")
    for config in configs_using(workload, AVX512_BF16, "avx512bf16"):
        assembly = generated_assembly(lower(workload, AVX512_BF16, config), AVX512_BF16)
        assert "vdpbf16ps" in assembly and "vfmadd" in assembly, config


def test_bfloat16_is_refused_where_no_template_computes_it():
    with pytest.raises(NoTemplate, match="computes in float32, not bfloat16"):
        get_space(dense(64, 64, 64, dtype="bfloat16"), Target.parse("cuda -arch=sm_90"))
    with pytest.raises(WorkloadError, match="unsupported dtype 'float16'; supported: float32, bfloat16, int8"):
        Workload.from_key("dense(M=4,N=4,K=4,dtype=float16)")
    assert Workload.from_key("dense(M=4,N=4,K=4,dtype=bfloat16)") == dense(4, 4, 4, dtype="bfloat16")


def test_a_bfloat16_tuning_is_stored_under_its_key_and_applied(tmp_path):
    """Tuned like any workload: records under the bfloat16 key, and apply_history_best builds the best of them
    (the float32 workload of the same shape finds none)."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    workload, target = dense(32, 64, 96, bias=True, dtype="bfloat16"), Target.parse("llvm -threads=1")
    with make_pool("local") as pool:
        result = tune(workload, target, 8, "xgb", database, pool, batch=4, measure=MeasureOptions(2, 1.0))
    assert len(result.measured) == 8 and all(r.ok for _, r in result.measured), [r.error for _, r in result.measured]
    best_index = result.best[0].config.index
    with apply_history_best(f"sqlite:///{tmp_path}/t.db"):
        assert build(workload, target).config.index == best_index
        float32 = dense(32, 64, 96, bias=True)
        with pytest.warns(UserWarning, match="Cannot find config"):
            assert build(float32, target).config.index == fallback_config(float32, target).index


def tiny_bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                     vocab_size=100)
    return transformers.BertModel(config).eval(), (torch.randint(0, 100, (1, 16)),)


def test_a_model_cast_to_bfloat16_runs_on_bfloat16_kernels_as_close_to_float32_as_eager(tmp_path):
    """BERT cast by model.to(torch.bfloat16): every linear (Q, K and V fused), both attention products and the
    pooler are bfloat16 tasks; compiled, its output is no further from the float32 model's than eager bfloat16's."""
    wide, inputs = tiny_bert()
    model, _ = in_dtype(copy.deepcopy(wide), {None: inputs}, "bfloat16")
    tasks = [task.workload for task in extract_tasks(model, inputs)]
    assert {(w.op, w.dtype) for w in tasks} == {("dense", "bfloat16"), ("batch_matmul", "bfloat16")}
    assert dense(16, 192, 64, bias=True, dtype="bfloat16") in tasks and len(tasks) == 7
    with torch.inference_mode():
        reference = wide(*inputs).last_hidden_state
        eager = model(*inputs).last_hidden_state
        ours = compiled(model, f"sqlite:///{tmp_path}/empty.db")(*inputs).last_hidden_state
    assert ours.dtype == torch.bfloat16
    error = lambda out: float((out.float() - reference).abs().max())
    assert error(ours) <= 1.5 * error(eager) and error(ours) < 0.1, (error(ours), error(eager))


def test_a_bfloat16_convolution_folds_its_batch_norm_in_float32(tmp_path):
    torch.manual_seed(0)
    norm = nn.BatchNorm2d(8)
    norm.running_mean.uniform_(-1, 1), norm.running_var.uniform_(0.5, 2)
    wide = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm, nn.ReLU()).eval()
    x = torch.randn(1, 3, 12, 12)
    model = copy.deepcopy(wide).to(torch.bfloat16)
    assert [task.workload for task in extract_tasks(model, (x.bfloat16(),))] == [
        conv2d(1, 3, 12, 12, 8, 3, 3, 1, 1, bias=True, epilogue="relu", dtype="bfloat16")]
    with torch.inference_mode():
        reference, eager = wide(x), model(x.bfloat16())
        ours = compiled(model, f"sqlite:///{tmp_path}/empty.db")(x.bfloat16())
    error = lambda out: float((out.float() - reference).abs().max())
    assert ours.dtype == torch.bfloat16 and error(ours) <= 1.5 * error(eager), (error(ours), error(eager))


def test_tune_model_and_bench_model_in_bfloat16(tmp_path, monkeypatch):
    """`--dtype bfloat16`: the model's bfloat16 tasks tuned as a job of their own; bench model times every way in
    bfloat16 and says how far eager's and tensortune's outputs are from the float32 model's."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    db = f"sqlite:///{tmp_path}/t.db"
    tuned = run("tune-model", "models.py:tiny", "--trials", "8", "--tuner", "random", "--dtype", "bfloat16", "--target",
                "llvm -threads=1", "--db", db, "--rounds", "1", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "8 trials over 2 tasks of models.py:tiny --dtype bfloat16" in tuned.stdout
    database = Database(db)
    assert {job.workload for job in database.children(1)} == {
        dense(4, 32, 16, bias=True, epilogue="relu", dtype="bfloat16"), dense(4, 8, 32, bias=True, dtype="bfloat16")}
    assert database.job(1).model == "models.py:tiny --dtype bfloat16"
    timed = run("bench", "model", "models.py:tiny", "--json", "--no-inductor", "--dtype", "bfloat16", "--db", db,
                "--target", "llvm -threads=1", "--rounds", "1", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.strip().splitlines()[-1])
    assert row["dtype"] == "bfloat16" and row["tensortune_ms"] > 0
    assert 0 < row["tensortune_float32_error"] <= 1.5 * row["eager_float32_error"], row
    no = refused("bench", "model", "models.py:tiny", "--dtype", "float16", cwd=tmp_path, monkeypatch=monkeypatch)
    assert no.exit_code == 2 and "--dtype float16: unknown dtype for a model; known: float32, bfloat16, int8" in no.output


@pytest.mark.parametrize("graph", ["inductor", "eager"])
def test_a_float32_model_under_autocast_runs_on_bfloat16_kernels(graph, tmp_path):
    """Under torch.autocast("cpu", dtype=torch.bfloat16) linear layers compute in bfloat16 from float32 weights and
    activations: tensortune's kernels too, the weights bound rounded, the activations cast at each call; the result
    is what eager autocast gives, in its dtype."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.inference_mode():
        assert [task.workload for task in extract_tasks(model, (x,))] == [
            dense(4, 32, 16, bias=True, epilogue="relu", dtype="bfloat16"), dense(4, 8, 32, bias=True, dtype="bfloat16")]
        expected = model(x)
        ours = compiled(model, f"sqlite:///{tmp_path}/e.db", graph)(x)
    assert ours.dtype == expected.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), expected.float(), atol=1e-2), (ours - expected).abs().max()


def test_a_bfloat16_job_over_http_and_from_the_tune_command(database, tmp_path):
    """The service takes dtype as a parameter and draws its reference line from NumPy's float32 on the shape; `tune`
    ends beside PyTorch's bfloat16."""
    with TestClient(create_app(database, runner(database), token="s3cret")) as client:
        created = client.post("/api/jobs", json=job_body(4, M=16, N=16, K=16, dtype="bfloat16"), headers=TOKEN)
        job = job_in(client, created.json()["id"], ("done", "failed"))
        assert job["status"] == "done" and job["workload"] == "matmul(M=16,N=16,K=16,dtype=bfloat16)"
        assert client.get(f"/api/jobs/{job['id']}/reference").json()["numpy_gflops"] > 0
    tuned = CliRunner().invoke(cli, ["tune", "dense", "M=16", "N=32", "K=48", "dtype=bfloat16", "--trials", "4", "--tuner",
                                     "random", "--target", "llvm -threads=1", "--db", f"sqlite:///{tmp_path}/t.db"])
    assert tuned.exit_code == 0, tuned.output
    assert "alternately with PyTorch bfloat16's" in tuned.output
