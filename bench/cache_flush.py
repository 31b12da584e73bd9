"""`python -m bench.cache_flush [MODEL] [--trials N] [--seq-len L]`: how tuning should find the CPU's caches at each
timed call.

The model is tuned from an empty database under one budget with each of workers.task's cache protocols: each
call on another copy of the weights, its activations written again just before (`rotate`, the default), after a
flush of twice the last-level cache (`flush`), and warm; then eager PyTorch and the model compiled with each
database's best configs are timed in alternating rounds in one run.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from workers.task import CACHE_PROTOCOLS, MeasureOptions
from workers.reference import head_to_head

PROTOCOLS = {name: MeasureOptions(cache=name) for name in CACHE_PROTOCOLS}


def run(model_name: str, trials: int, rounds: int = 9, seq_len: int | None = None) -> dict:
    import torch

    from frontend import extract_tasks
    from frontend.presets import load_model
    from tuner.scheduler import tune_tasks

    model, inputs = load_model(model_name, seq_len)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as folder:
        urls = {name: f"sqlite:///{Path(folder) / name}.db" for name in PROTOCOLS}
        estimated = {}
        for name, options in PROTOCOLS.items():
            result = tune_tasks(extract_tasks(model, inputs), "llvm", trials, urls[name], name=model_name,
                                measure=options)
            estimated[name] = result.curve[-1] * 1e3
        runs = {"eager": model} | {name: torch.compile(model, backend="tensortune", options={"db": url})
                                   for name, url in urls.items()}
        with torch.inference_mode():
            for run_ in runs.values():
                run_(*inputs)  # compiles, and warms up
            seconds = head_to_head({name: (lambda run_=run_: run_(*inputs)) for name, run_ in runs.items()},
                                   threads, rounds=rounds, min_repeat_ms=200)
    return {"model": model_name, "seq_len": seq_len, "trials": trials, "threads": threads,
            "estimated_ms": {name: round(ms, 3) for name, ms in estimated.items()},
            "measured_ms": {name: round(s * 1e3, 3) for name, s in seconds.items()},
            "speedup": {name: round(seconds["eager"] / s, 3) for name, s in seconds.items() if name != "eager"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="bert-layer")
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seq-len", type=int, help="the sequence length to make the model at")
    args = parser.parse_args()
    print(json.dumps(run(args.model, args.trials, seq_len=args.seq_len)))


if __name__ == "__main__":
    main()
