"""Tuning curves as PNG files: people read a curve faster than a table."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

TITLE_WIDTH = 72  # characters of a title line: what the figure holds, centred over the axes, at matplotlib's size


def _save(draw: Callable, title: str, xlabel: str, ylabel: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    draw(axes)
    # a workload's key has no spaces to break at (a convolution's runs past the figure): lines end after a comma
    axes.set(xlabel=xlabel, ylabel=ylabel, title=textwrap.fill(re.sub(r",(?=\S)", ", ", title), TITLE_WIDTH))
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return Path(path)


def plot_tuners(curves: dict[str, list[list[float]]], title: str, path: Path, best_known: float | None = None) -> Path:
    """Best GFLOPS so far against trials: per tuner the median over seeds and the band from min to max."""
    def draw(axes):
        for name, runs in curves.items():
            length = min(len(run) for run in runs)
            values = np.array([run[:length] for run in runs])
            trials = np.arange(1, length + 1)
            axes.plot(trials, np.median(values, axis=0), label=f"{name} (median of {len(runs)} seeds)")
            axes.fill_between(trials, values.min(axis=0), values.max(axis=0), alpha=0.2)
        if best_known:
            axes.axhline(best_known, color="grey", linestyle=":", label="best known")
            axes.axhline(0.95 * best_known, color="grey", linestyle="--", linewidth=0.8, label="95% of best known")

    return _save(draw, title, "trials", "best GFLOPS so far", path)


def plot_job(gflops: Sequence[float], failed: Sequence[bool], best: Sequence[float], title: str, path: Path,
             reference: float | None = None) -> Path:
    """Every measured candidate of a job (failures marked at 0) with the best-so-far line (`TuneResult.curve`)."""
    values, failed = np.asarray(gflops, dtype=float), np.asarray(failed, dtype=bool)
    trials = np.arange(1, len(values) + 1)

    def draw(axes):
        axes.scatter(trials[~failed], values[~failed], s=10, label="measured")
        if failed.any():
            axes.scatter(trials[failed], np.zeros(failed.sum()), s=14, marker="x", color="red", label="failed")
        axes.plot(trials, best, color="black", label="best so far")
        if reference:
            axes.axhline(reference, color="grey", linestyle="--", label="NumPy")

    return _save(draw, title, "trial", "GFLOPS", path)
