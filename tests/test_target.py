import subprocess
import sys

import pytest

from search_space import Target, TargetError, host_target


def test_llvm_is_the_host_with_all_its_cores():
    host = host_target()
    assert Target.parse("llvm") == host and host.threads >= 1 and host.model


@pytest.mark.parametrize("text", ["llvm -mcpu=znver4 -mattr=+avx2,+fma -threads=2", "llvm -mcpu=x86-64 -mattr= -threads=1",
                                  "cuda -device=NVIDIA_A100 -arch=sm_80"])
def test_target_strings_round_trip(text):
    assert str(Target.parse(text)) == text
    assert Target.parse(str(Target.parse(text))) == Target.parse(text)


@pytest.mark.parametrize("text, message", [("metal", "unknown target"), ("llvm -threads=0", "-threads must be"),
                                           ("llvm -opt=3", "bad target option")])
def test_bad_targets_are_named(text, message):
    with pytest.raises(TargetError, match=message):
        Target.parse(text)


@pytest.mark.parametrize("text, message", [
    ("llvm -mcpu=notacpu", r"^unknown CPU 'notacpu' for llvm; none of the \d+ LLVM knows is close \(this host's: "),
    ("llvm -mcpu=znver99", r"^unknown CPU 'znver99' for llvm; known and close: (\S+, )*znver4"),
    ("llvm -mattr=+avx2,+bogus", r"^unknown feature 'bogus' for llvm; none of the \d+ LLVM knows is close"),
    ("llvm -mattr=+avx512", r"^unknown feature 'avx512' for llvm; known and close: (\S+, )*avx512f")])
def test_a_cpu_or_feature_llvm_does_not_know_is_refused_with_the_close_ones(text, message):
    """LLVM ignores a name it does not know (and aborts the compile on a CPU's): tuning ran at 0.00x NumPy, its
    records labelled with the name."""
    with pytest.raises(TargetError, match=message):
        Target.parse(text, check_names=True)
    assert Target.parse(text).kind == "llvm"  # stored and imported targets may name another architecture's CPU


def test_a_cpu_and_features_llvm_knows_are_taken_though_this_host_has_them_not():
    other = next(cpu for cpu in ("znver3", "icelake-server") if cpu != host_target().model)
    parsed = Target.parse(f"llvm -mcpu={other} -mattr=+sse4.2,-avx512f", check_names=True)
    assert (parsed.model, parsed.features) == (other, ("sse4.2",))


def test_tune_for_a_cpu_llvm_does_not_know_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "service", "tune", "matmul", "M=8", "N=8", "K=8", "--target",
                           "llvm -mcpu=notacpu", "--trials", "1", "--db", str(tmp_path / "t.db")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == "" and not (tmp_path / "t.db").exists(), done.stderr
    assert done.stderr.startswith("error: unknown CPU 'notacpu' for llvm;"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_narrowing_a_feature_off_narrows_off_those_that_need_it():
    """As LLVM's -mattr=-avx does: on an AVX-512 host a target narrowed off AVX keeps no AVX-512 feature (it
    kept them, and `widen`'s peak was offered a target with no AVX)."""
    from search_space.target import without

    zen4 = {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512vnni"}
    assert without(zen4, {"avx"}) == set()
    assert without(zen4, {"avx512bw"}) == {"avx", "avx2", "fma", "avx512f", "avx512vl", "avx512dq", "avx512vnni"}
    assert without(zen4 | {"amx-tile", "amx-bf16", "amx-int8"}, {"amx-tile"}) == zen4
    assert without(zen4, {"avx512bf16"}) == zen4 - {"avx512bf16"}
    narrowed = Target.parse("llvm -mattr=-avx,-avx2,-fma")
    assert not {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"} & set(narrowed.features)
