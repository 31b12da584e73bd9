"""bfloat16 kernels: every config of the bfloat16 spaces computes what the float32 reference of the rounded inputs
does, on awkward shapes; each instruction family is chosen from the target's features and emits its instructions
on every host (assembly), and runs where the host has it."""
import copy
import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch import nn
from typer.testing import CliRunner

from bench.peak import peak_call, peak_program
from db import Database, apply_history_best
from frontend import extract_tasks
from frontend.presets import in_dtype
from search_space import (NoTemplate, Target, Workload, WorkloadError, batch_matmul, conv2d, dense, fallback_config,
                          get_space, host_target, lower, matmul)
from search_space.program import format_program
from search_space.templates.gemm import isas
from service.api import create_app
from service.cli import app as cli
from tuner.tune import tune
from workers import build
from workers.build import generated_assembly
from workers.llvm_codegen import CodegenError, generate
from workers.pool import make_pool
from workers.task import MeasureOptions
from tests.test_cli_model import MODEL_FILE, refused, run
from tests.test_service_api import TOKEN, database, job_body, runner  # noqa: F401  (database: a fixture)
from tests.serve_helpers import job_in

HOST = Target.parse("llvm -threads=2")
# a Zen 4 with every feature the bfloat16 templates may use: compiled to assembly on any host, never run here
AVX512_BF16 = Target.parse("llvm -mcpu=znver4 -mattr=+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512bf16 "
                           "-threads=1")
HAS_BF16 = "avx512bf16" in host_target().features
SIZES = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 32, 64, 97]), st.integers(1, 200))
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@st.composite
def workloads(draw):
    op = draw(st.sampled_from(["matmul", "dense", "batch_matmul", "conv2d"]))
    m, n, k = draw(SIZES), draw(SIZES), draw(SIZES)
    if op == "matmul":
        return matmul(m, n, k, dtype="bfloat16")
    if op == "dense":
        return dense(m, n, k, bias=draw(st.booleans()), epilogue=draw(st.sampled_from(["none", "relu", "gelu"])),
                     dtype="bfloat16")
    if op == "conv2d":
        return conv2d(1, draw(st.sampled_from([1, 3, 8, 17])), 9, 7, draw(st.sampled_from([1, 8, 17])), 3, 3,
                      draw(st.integers(1, 2)), 1, bias=True, residual=draw(st.booleans()), epilogue="relu",
                      dtype="bfloat16")
    return batch_matmul(draw(st.integers(1, 3)), min(m, 64), min(n, 64), min(k, 64), dtype="bfloat16")


def check(workload: Workload, target: Target, config) -> None:
    inputs = workload.random_inputs(seed=3)
    out = build(workload, target, config)(*inputs)
    assert out.dtype == np.dtype("bfloat16") and out.shape == workload.output_shape
    error = workload.max_error(out, workload.reference(*inputs))
    assert error <= 1, (workload.key, config, error)


@PROPERTY
@given(workloads(), st.integers(0, 2**31 - 1))
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


def test_the_pair_dot_family_is_offered_only_where_the_target_has_it():
    workload = dense(64, 768, 768, dtype="bfloat16")
    assert isas(AVX512_BF16) == ("fma", "avx512bf16")
    assert fallback_config(workload, AVX512_BF16)["isa"] == "avx512bf16"
    narrowed = Target.parse(str(AVX512_BF16).replace(",+avx512bf16", ""))
    assert get_space(workload, narrowed).knobs["isa"].candidates == ("fma",)
    assert "avx512bf16" not in Target.parse("llvm -mattr=-avx512bf16").features  # the host, narrowed
    assert get_space(workload, Target.parse("llvm -mattr=-avx512bf16")).knobs["isa"].candidates == ("fma",)
    assert "isa" not in get_space(dense(64, 768, 768), AVX512_BF16).knobs  # float32 spaces are as they were


def test_each_family_emits_its_instructions_on_any_host():
    """The fallback on an AVX-512 BF16 target multiplies by vdpbf16ps; the fma family by FMAs on widened halves."""
    workload = dense(64, 768, 768, dtype="bfloat16")
    pair_dot = fallback_config(workload, AVX512_BF16)
    assembly = generated_assembly(lower(workload, AVX512_BF16, pair_dot), AVX512_BF16)
    assert sum("vdpbf16ps" in line and "zmm" in line for line in assembly.splitlines()) >= 32
    widened = get_space(workload, AVX512_BF16).config(pair_dot.to_dict() | {"isa": "fma"})
    assembly = generated_assembly(lower(workload, AVX512_BF16, widened), AVX512_BF16)
    assert "vdpbf16ps" not in assembly and sum("vfmadd" in line for line in assembly.splitlines()) >= 64
    odd = batch_matmul(3, 17, 40, 31, dtype="bfloat16")  # narrower vectors (AVX-512 VL's 128 and 256 bits) too
    configs = pair_dot_configs(odd, AVX512_BF16)
    assert {config["vec"] for config in configs} == {4, 8, 16}
    assert all("vdpbf16ps" in generated_assembly(lower(odd, AVX512_BF16, config), AVX512_BF16) for config in configs)


def test_the_pair_dot_needs_the_feature_and_says_so():
    workload = dense(64, 768, 768, dtype="bfloat16")
    program = lower(workload, AVX512_BF16, fallback_config(workload, AVX512_BF16))
    with pytest.raises(CodegenError, match="dot2_bf16 on 16 lanes needs avx512bf16"):
        generate(program, 1, ("avx", "avx2", "fma", "avx512f"))


@pytest.mark.parametrize("n", [33, 34, 39, 45])
def test_a_block_tail_narrower_than_the_pair_dot_takes_the_split_form(n):
    """Tails of 1, 2, 7 and 13 columns: vdpbf16ps where a whole 4/8/16-lane vector fits, FMAs on halves below."""
    workload = dense(5, n, 10, dtype="bfloat16")
    for config in pair_dot_configs(workload, AVX512_BF16):
        assembly = generated_assembly(lower(workload, AVX512_BF16, config), AVX512_BF16)
        assert "vdpbf16ps" in assembly and "vfmadd" in assembly, config


@pytest.mark.skipif(not HAS_BF16, reason="the host has no AVX-512 BF16: the pair dot is checked as assembly only")
@pytest.mark.parametrize("workload", [dense(33, 100, 77, bias=True, epilogue="gelu", dtype="bfloat16"),
                                      batch_matmul(3, 17, 40, 31, dtype="bfloat16"), matmul(64, 64, 768, dtype="bfloat16")])
def test_the_pair_dot_family_computes_the_rounded_reference(workload):
    target = Target.parse("llvm -threads=1")
    for config in pair_dot_configs(workload, target):
        check(workload, target, config)


def pair_dot_configs(workload: Workload, target: Target, count: int = 6) -> list:
    """Random configs of the space that use the pair dot."""
    space = get_space(workload, target)
    drawn = (space.get(int(index)) for index in np.random.default_rng(0).integers(0, space.size, 10_000))
    found = [config for config in drawn if config["isa"] == "avx512bf16"][:count]
    assert len(found) == count
    return found


def test_the_peak_of_each_family_is_measured_with_its_instruction():
    assert "vdpbf16ps" in generated_assembly(peak_program(1, 16, "avx512bf16"), AVX512_BF16)
    call, flops = peak_call(Target.parse("llvm -threads=1"))
    call()
    assert flops > 0
    if HAS_BF16:
        call, bf16_flops = peak_call(Target.parse("llvm -threads=1"), "avx512bf16")
        call()
        assert bf16_flops == 2 * flops


def test_bfloat16_is_refused_where_no_template_computes_it():
    with pytest.raises(NoTemplate, match="computes in float32, not bfloat16"):
        get_space(dense(64, 64, 64, dtype="bfloat16"), Target.parse("cuda -arch=sm_90"))
    with pytest.raises(WorkloadError, match="unsupported dtype 'float16'; supported: float32, bfloat16"):
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


def compiled(model, db: str):
    torch._dynamo.reset()
    return torch.compile(model, backend="tensortune", options={"db": db})


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
                "llvm -threads=1", "--db", db, cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "8 trials over 2 tasks of models.py:tiny --dtype bfloat16" in tuned.stdout
    database = Database(db)
    assert {job.workload for job in database.children(1)} == {
        dense(4, 32, 16, bias=True, epilogue="relu", dtype="bfloat16"), dense(4, 8, 32, bias=True, dtype="bfloat16")}
    assert database.job(1).model == "models.py:tiny --dtype bfloat16"
    timed = run("bench", "model", "models.py:tiny", "--json", "--no-inductor", "--dtype", "bfloat16", "--db", db,
                "--target", "llvm -threads=1", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.strip().splitlines()[-1])
    assert row["dtype"] == "bfloat16" and row["tensortune_ms"] > 0
    assert 0 < row["tensortune_float32_error"] <= 1.5 * row["eager_float32_error"], row
    no = refused("bench", "model", "models.py:tiny", "--dtype", "float16", cwd=tmp_path, monkeypatch=monkeypatch)
    assert no.exit_code == 2 and "--dtype float16: unknown dtype; known: float32, bfloat16" in no.output


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
        torch._dynamo.reset()
        ours = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/e.db", "graph": graph})(x)
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
