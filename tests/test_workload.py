import numpy as np
import pytest

from search_space import Workload, WorkloadError, batch_matmul, dense, matmul


def test_keys_follow_the_design_card():
    assert matmul(512, 512, 512).key == "matmul(M=512,N=512,K=512,dtype=float32)"
    assert dense(128, 3072, 768, bias=True, epilogue="gelu").key == \
        "dense(M=128,N=3072,K=768,bias=true,epilogue=gelu,dtype=float32)"
    assert dense(128, 768, 768).key == "dense(M=128,N=768,K=768,dtype=float32)"
    assert batch_matmul(12, 128, 128, 64).key == "batch_matmul(B=12,M=128,N=128,K=64,dtype=float32)"


@pytest.mark.parametrize("workload", [
    matmul(3, 5, 7), dense(4, 6, 8, bias=True, epilogue="relu"), batch_matmul(2, 3, 4, 5),
    batch_matmul(12, 128, 128, 64, a_strides="64:2304:1", b_strides="64:1:2304")])
def test_key_round_trips(workload):
    assert Workload.from_key(workload.key) == workload
    assert Workload.from_key(workload.key).key == workload.key


@pytest.mark.parametrize("make, message", [
    (lambda: Workload.make("conv3d", M=1), "unknown op 'conv3d'"),
    (lambda: matmul(0, 4, 4), "parameter M=0 is out of range"),
    (lambda: matmul(4, -1, 4), "parameter N=-1 is out of range"),
    (lambda: matmul(4, 4, 1 << 20), "parameter K=1048576 is out of range"),
    (lambda: matmul(4.5, 4, 4), "parameter M must be an integer"),
    (lambda: Workload.make("matmul", M=4, N=4), "missing parameter(s) K"),
    (lambda: Workload.make("matmul", M=4, N=4, K=4, Q=1), "unknown parameter(s) Q"),
    (lambda: matmul(4, 4, 4, dtype="float16"), "unsupported dtype 'float16'"),
    (lambda: dense(4, 4, 4, epilogue="tanh"), "unknown epilogue 'tanh'"),
    (lambda: matmul(65536, 65536, 1), "more than"),
    (lambda: Workload.from_key("matmul[M=1]"), "not a workload key"),
    (lambda: batch_matmul(2, 3, 4, 5, a_strides="5:1"), "a_strides='5:1' is not 3 non-negative integers joined by ':' "
                                                        "(the element strides of A (2, 3, 5), e.g. 15:5:1)"),
    (lambda: batch_matmul(2, 3, 4, 5, b_strides="-1:4:1"), "b_strides='-1:4:1' is not 3 non-negative integers"),
    (lambda: batch_matmul(2, 3, 4, 5, b_strides="9:x:1"), "b_strides='9:x:1' is not 3"),
    (lambda: batch_matmul(2, 3, 4, 5, a_strides=f"{1 << 28}:5:1"), "a_strides=268435456:5:1 spans more than"),
])
def test_bad_workloads_say_what_is_wrong(make, message):
    with pytest.raises(WorkloadError, match=None) as error:
        make()
    assert message in str(error.value)



@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_random_inputs_start_on_cache_lines(dtype):
    """As PyTorch's tensors do: an AMX tile whose rows straddle cache lines loads about three times slower, so a
    kernel timed on NumPy's own arrays (16 bytes apart) would be ranked on a cost no model's inputs give it."""
    workload = dense(37, 50, 70, bias=True, dtype=dtype)
    drawn = [workload.random_inputs(seed) for seed in range(8)]
    assert [a.ctypes.data % 64 for arrays in drawn for a in arrays] == [0] * sum(map(len, drawn))
    assert all(np.array_equal(a, b) for a, b in zip(drawn[3], workload.random_inputs(3)))  # the same values as before

def test_batch_matmul_reads_views_through_the_strides_its_key_gives():
    """Attention's q, kᵀ and v are views of one activation's heads: the key says how each lies, the inputs drawn
    for it are such views (of a storage of their own, on a cache line), and strides that are the contiguous layout,
    a size of 1's stride aside, are no option at all."""
    workload = batch_matmul(12, 128, 128, 64, a_strides="64:2304:1", b_strides="64:1:2304")
    assert workload.key == "batch_matmul(B=12,M=128,N=128,K=64,a_strides=64:2304:1,b_strides=64:1:2304,dtype=float32)"
    assert (workload.operand_strides("A"), workload.operand_strides("B")) == ((64, 2304, 1), (64, 1, 2304))
    a, b = workload.random_inputs()
    assert (a.strides, b.strides) == ((256, 9216, 4), (256, 4, 9216))
    assert a.ctypes.data % 64 == 0 and b.ctypes.data % 64 == 0
    np.testing.assert_allclose(workload.reference(a, b), np.ascontiguousarray(a) @ np.ascontiguousarray(b), rtol=1e-6)
    assert batch_matmul(2, 3, 4, 5, a_strides="15:5:1", b_strides="20:4:1") == batch_matmul(2, 3, 4, 5)
    assert batch_matmul(1, 3, 4, 5, a_strides="7:5:1").key == "batch_matmul(B=1,M=3,N=4,K=5,dtype=float32)"
    assert batch_matmul(2, 3, 4, 5).operand_strides("A") is None


def test_flops_inputs_and_reference():
    w = dense(3, 4, 5, bias=True, epilogue="relu")
    x, weight, bias = w.random_inputs(seed=1)
    assert [a.shape for a in (x, weight, bias)] == [(3, 5), (4, 5), (4,)]
    assert all(a.dtype == np.float32 for a in (x, weight, bias))
    np.testing.assert_allclose(w.reference(x, weight, bias), np.maximum(x @ weight.T + bias, 0), rtol=1e-6)
    assert w.flops == 2 * 3 * 4 * 5
    assert batch_matmul(2, 3, 4, 5).flops == 2 * 2 * 3 * 4 * 5
    assert w.max_error(w.reference(x, weight, bias) + 10 * w.tolerance, w.reference(x, weight, bias)) > 1
