"""The cold-cache protocols' memory: the flush's bytes and kernel, the rotation's copies of the weights (the call
counts are tests/test_measure_pools.py's)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from search_space import Target, dense, fallback_config, matmul
from workers import build, compile_program
from workers.build import generated_code
from workers.flush import flush_program
from workers.reference import MAX_COPIES, WeightCopies, inference_calls

REPO = Path(__file__).resolve().parents[1]

# In a fresh process: whatever this one allocated and freed before (a flush buffer of an earlier test, say) could
# hand the new buffer pages already resident, and hide what it writes.
FLUSHED = '''
import os
import numpy as np
from search_space import Target
from workers import MeasureOptions, compile_program
from workers.flush import flush_program
from workers.task import HostTimedCall
from workers.timing import last_level_cache_bytes

def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

target = Target.parse("llvm")
timed = HostTimedCall([lambda: None], np.zeros(1), target, [])
compile_program(flush_program(target.threads, 1, 16), target)  # LLVM's own memory, before the count
before = resident_bytes()
timed.samples(MeasureOptions(repeat=1, cache="flush"))
print(resident_bytes() - before, 2 * last_level_cache_bytes())
'''


def test_the_flush_before_a_timed_call_writes_twice_the_last_level_cache():
    """A flush of just the last-level cache's size leaves part of the kernel's data in it (caches do not evict in
    strict LRU order). The flush buffer is made at a process's first flushed sample, zeroed pages the kernel maps
    only when written, so the memory the process gains over that sample is what the flush wrote."""
    done = subprocess.run([sys.executable, "-c", FLUSHED], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    written, wanted = map(int, done.stdout.split())
    assert wanted <= written < wanted + (16 << 20), (written, wanted)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_flush_writes_every_float_of_its_buffer_on_the_targets_threads(threads):
    """The flush is a kernel whose parallel loop runs through libgomp, as the timed kernels' loops do (so their
    threads are awake when the timed call starts, as in a model); each call adds one to every float it owns."""
    target = Target.parse(f"llvm -threads={threads}")
    program = flush_program(threads, rows=5, width=target.vector_bits // 32)
    assert ("GOMP_parallel" in generated_code(program, target)) == (threads > 1)
    (function,), compiled = compile_program(program, target)
    lines = np.zeros(program.buffers[0].shape, np.float32)
    for calls in (1, 2):
        function(lines.ctypes.data)
        assert (lines == calls).all()


def test_the_rotation_binds_copies_of_the_weights_enough_to_fill_its_bytes_each_computing_the_result():
    workload = dense(8, 64, 32, bias=True)  # W and bias: 8448 bytes
    kernel = build(workload, "llvm", fallback_config(workload, Target.parse("llvm")))
    inputs = workload.random_inputs()
    calls, out = inference_calls(kernel, inputs, 3 * 8448 + 1)
    assert len(calls) == 4
    for call in calls:
        out[...] = 0
        call()
        assert workload.max_error(out, workload.reference(*inputs)) <= 1
    assert len(inference_calls(kernel, inputs, 1 << 40)[0]) == MAX_COPIES
    assert len(inference_calls(kernel, inputs)[0]) == 1
    assert len(inference_calls(build(matmul(8, 8, 8), "llvm"), matmul(8, 8, 8).random_inputs(), 1 << 20)[0]) == 1


def test_a_rotation_copies_the_weights_once_for_a_run_of_candidates_on_them():
    """Each candidate of a workload is timed on the same weights (a worker makes its inputs once): the copies the
    first candidate's rotation made serve the next, more made only where more are wanted; other weights (another
    workload's), even of the same values, get copies of their own."""
    weights = {"W": np.arange(6.0).reshape(2, 3), "bias": np.ones(2)}
    copies = WeightCopies()
    first = copies.of(weights, 3)
    assert len(first) == 3 and sum(c is weights for c in first) == 1
    made = [c for c in first if c is not weights]
    assert all(c["W"] is not weights["W"] and np.array_equal(c["W"], weights["W"]) for c in made)
    again = copies.of(dict(weights), 4)
    assert len(again) == 4 and all(any(c["W"] is m["W"] for c in again) for m in made)
    extra = [c for c in again if c["W"] is not weights["W"] and all(c["W"] is not m["W"] for m in made)]
    assert len(extra) == 1 and np.array_equal(extra[0]["W"], weights["W"])
    fewer = copies.of(weights, 2)
    assert len(fewer) == 2 and {id(c["bias"]) for c in fewer} <= {id(c["bias"]) for c in again}
    other = {"W": weights["W"] + 1, "bias": weights["bias"]}
    fresh = copies.of(other, 3)
    assert all(np.array_equal(c["W"], other["W"]) and all(c["W"] is not m["W"] for m in made) for c in fresh)


def test_each_timed_call_reads_the_copy_that_all_the_others_were_touched_after():
    """No untimed round before a timing: every touch of the weights' copies goes round them in one order (binding
    packs them in it, a timing times them in it, the check and the waking call take the copy touched last), so a
    timed call's copy has had every other copy touched since it was last, as a model's layers evict a layer's
    weights, over any run of candidates, timings of 2, 3 or 7 calls over 5 copies, and a first candidate whose copies
    were just made from the weights (which copying read last)."""
    from workers.task import HostTimedCall, MeasureOptions

    weights, copies, touched = {"W": np.zeros(4)}, WeightCopies(), []
    for made in copies.of(weights, 5)[:-1]:  # each copy made by reading W: W last of all
        touched += [id(weights["W"]), id(made["W"])]
    timed_ids = []
    for repeat, packs in ((3, False), (7, True), (3, True), (3, False), (7, False), (2, True)):
        sets = copies.of(weights, 5)
        if packs:  # binding packs each, in the order given; a config that does not reads the copies themselves
            touched += [id(s["W"]) for s in sets]
        calls = [lambda s=s: touched.append(id(s["W"])) for s in sets]
        timed = HostTimedCall(calls, np.zeros(1), target=None, activations=[], copies=copies)
        timed.output()
        before = len(touched)
        timed.samples(MeasureOptions(repeat=repeat))
        assert len(touched) == before + 1 + repeat  # one waking call, then the timed ones: no round
        timed_ids += [(len(touched) - repeat + i, touched[-repeat + i]) for i in range(repeat)]
    for at, copy in timed_ids:
        last = max(i for i in range(at) if touched[i] == copy)
        assert len(set(touched[last + 1:at])) == 4, (at, touched[last + 1:at])


def test_a_rotation_cycles_through_twice_the_last_level_cache_and_256_mib_at_most(monkeypatch):
    """On a Zen's 32 MiB L3, 64 MiB of weight copies; on an Intel host whose L3 reads 480 MiB, 256 MiB, not 960
    (64 copies of a BERT dense's 9.4 MB weights packed for every candidate)."""
    import workers.timing as timing

    for cache, rotated in ((32 << 20, 64 << 20), (480 << 20, 256 << 20)):
        monkeypatch.setattr(timing, "last_level_cache_bytes", lambda cache=cache: cache)
        assert timing.rotation_bytes() == rotated


@pytest.mark.parametrize("weight_bytes", [0, 1 << 20])
def test_the_timed_calls_check_their_arrays_once_not_at_every_call(monkeypatch, weight_bytes):
    """A timing is of the kernel as the torch backend calls it (its addresses, unchecked): checking a call's NumPy
    arrays took 9-20 µs more a call, a tenth of BERT's attention product. Wrong arrays are still refused, up front."""
    import workers.kernel as kernel_module
    from workers.kernel import KernelArgumentError

    checked = []
    check_array = kernel_module.check_array
    monkeypatch.setattr(kernel_module, "check_array", lambda *args: checked.append(args[1].name) or check_array(*args))
    workload = dense(8, 64, 32, bias=True)
    kernel = build(workload, "llvm", fallback_config(workload, Target.parse("llvm")))
    inputs = workload.random_inputs()
    calls, out = inference_calls(kernel, inputs, weight_bytes)
    assert sorted(set(checked)) == ["W", "X", "Y", "bias"]
    checked.clear()
    for call in calls * 3:
        out[...] = 0
        call()
        assert workload.max_error(out, workload.reference(*inputs)) <= 1
    assert checked == []
    with pytest.raises(KernelArgumentError, match="X"):
        inference_calls(kernel, (inputs[0][:4],) + tuple(inputs[1:]))
