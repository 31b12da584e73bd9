"""Record the replay data sets of tests/data/: every config of a sub-space of each evaluation
workload, measured for real by the local pool on this machine.

    python -m bench.record_replay [--only NAME] [--out tests/data]

The sub-spaces keep two to four values of each knob that matters (register block, cache blocks,
k-block, vector width, unroll, loop order, parallel loop, packing): about two thousand points,
a few minutes each to measure exhaustively. The convolution's keeps every width of an output block
instead: 1,008 points, 189 s on a 2-core Zen 5. The weight-streaming `prefetch` knob of dense and conv2d stays
at 0, as the stored sets were measured before the knob was.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from search_space import Target, batch_matmul, conv2d, dense, get_space, matmul
from tuner.replay import ReplayData, knob_key
from workers import MeasureInput
from workers.pool import make_pool
from workers.task import MeasureOptions, Task

SPLITS = lambda registers, blocks: [[-1, b, r] for r in registers for b in blocks]
# A good and a bad value of every knob that matters (mirroring the whole space, where a random
# config is within 95% of the best known about 1% of the time), so the tuners' task keeps its
# real difficulty: few points near the best, found only by getting every knob right.
COMMON = {"tile_m": SPLITS((2, 6, 8, 12), (1, 16)), "tile_n": SPLITS((16, 32, 64), (1, 4)),
          "vec": [4, 16], "unroll_k": [1, 4], "order": [["mo", "no", "ko"], ["no", "ko", "mo"]],
          "inner_order": [["ni", "mi"]], "pack_b": [True, False]}
DATA_SETS = {
    "matmul512": (matmul(512, 512, 512), COMMON | {"tile_k": [[-1, 16], [-1, 256]], "parallel": ["none", "m"]}),
    "dense128x3072x768": (dense(128, 3072, 768), COMMON | {"tile_k": [[-1, 16], [-1, 256]],
                                                           "parallel": ["none", "n"], "prefetch": [0]}),
    "batch12x128x128x64": (batch_matmul(12, 128, 128, 64), COMMON | {"tile_k": [[-1, 16], [-1, 64]],
                                                                     "parallel": ["none", "b"]}),
    # ResNet's last 3×3 convolution: every width of an output block, which decides the edge micro-kernels a
    # config has (the blocks that reach into the padding left or right)
    "conv512x7x7": (conv2d(1, 512, 7, 7, 512, 3, 3, stride=1, pad=1, bias=True, epilogue="relu", layout="nhwc"),
                    {"tile_k": [[-1, 16], [-1, 32], [-1, 48]], "tile_ow": [[-1, w] for w in range(1, 8)],
                     "tile_c": [[-1, 4], [-1, 16], [-1, 64]], "vec": [16], "unroll_c": [1, 4],
                     "order": [["ko", "oh", "owo"], ["oh", "owo", "ko"]],
                     "reduce_order": [["co", "r", "s"], ["r", "s", "co"]], "parallel": ["k", "h"],
                     "write": ["channels"], "prefetch": [0]}),
}
OPTIONS = MeasureOptions(repeat=3, min_repeat_ms=10.0)


def record(name: str, out: Path, batch: int = 16) -> ReplayData:
    workload, allowed = DATA_SETS[name]
    target = Target.parse("llvm")
    data = ReplayData(workload, target, allowed, {})
    full = get_space(workload, target)  # measured as configs of the whole space: their indices are the real ones
    configs = [full.config(c.to_dict()) for c in data.space]
    start = time.perf_counter()
    with make_pool("local") as pool:
        for first in range(0, len(configs), batch):
            chunk = configs[first:first + batch]
            results = pool.measure([Task.of(MeasureInput(workload, target, c)) for c in chunk], OPTIONS)
            data.results.update({knob_key(c.to_dict()): r for c, r in zip(chunk, results)})
            print(f"{name}: {len(data.results)}/{len(configs)} measured, best {data.best_gflops:.1f} GFLOPS, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    data.save(out / f"replay_{name}.jsonl.gz")
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(DATA_SETS))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests" / "data")
    args = parser.parse_args()
    for name in [args.only] if args.only else DATA_SETS:
        data = record(name, args.out)
        outcomes = {}
        for r in data.results.values():
            outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
        print(json.dumps({"data_set": name, "configs": len(data.results), "best_gflops": round(data.best_gflops, 2),
                          "outcomes": outcomes}))


if __name__ == "__main__":
    main()
