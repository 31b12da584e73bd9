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
