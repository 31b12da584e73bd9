"""A model's start: `torch.compile(model, backend="tensortune")` and its first call, in a fresh process, with the
object cache (workers.object_cache) empty, as at a model's first start on a machine, and then holding what that
start stored, as at every later one; rounds alternate the two, each in processes of its own.

    python -m bench.startup resnet18 --channels-last --db tensortune.db [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

from workers.object_cache import ENV


def first_call(spec: str, channels_last: bool, db: str | None) -> dict:
    """In this process: seconds to compile the model and make its first call, of them the kernels' builds, and how
    many kernels were built and how many of them loaded from the cache."""
    import torch

    import frontend.shapes
    from frontend.presets import in_channels_last, load_model_at

    builds, cached = [], []
    build = frontend.shapes.build

    def timed(*args, **kwargs):
        start = time.perf_counter()
        kernel = build(*args, **kwargs)
        builds.append(time.perf_counter() - start)
        cached.append(kernel.compiled.from_cache)
        return kernel

    frontend.shapes.build = timed
    model, at = load_model_at(spec)
    model, at = in_channels_last(model, at) if channels_last else (model, at)
    inputs = at[None]
    start = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, backend="tensortune", options={"db": db} if db else {})(*inputs)
    return {"first_call": time.perf_counter() - start, "builds": sum(builds), "kernels": len(builds),
            "cached": sum(cached)}


def run(spec: str, channels_last: bool, db: str | None, cache: str) -> dict:
    """`first_call` in a fresh process whose object cache is `cache`."""
    command = [sys.executable, "-m", "bench.startup", spec, "--child"] + (["--channels-last"] if channels_last else [])
    command += ["--db", db] if db else []
    done = subprocess.run(command, env=os.environ | {ENV: cache}, check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def built(start: dict) -> str:
    return f"{start['builds']:.2f} ({start['kernels']} kernels, {start['cached']} loaded)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--db")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(first_call(args.model, args.channels_last, args.db)))
        return
    table = Table(title=f"{args.model}{' --channels-last' if args.channels_last else ''}: compile and first call, "
                        "fresh processes, seconds")
    for column in ("round", "empty cache", "its builds", "cache holding them", "its builds", "empty / holding"):
        table.add_column(column, justify="right")
    ratios = []
    for round_ in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="tensortune-objects-") as cache:
            cold = run(args.model, args.channels_last, args.db, cache)
            warm = run(args.model, args.channels_last, args.db, cache)
        ratios.append(cold["first_call"] / warm["first_call"])
        table.add_row(str(round_), f"{cold['first_call']:.2f}", built(cold), f"{warm['first_call']:.2f}", built(warm),
                      f"{ratios[-1]:.2f}x")
    Console().print(table)
    print(f"median: the start with the kernels cached {statistics.median(ratios):.2f}x as fast")


if __name__ == "__main__":
    main()
