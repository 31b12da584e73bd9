"""Which measurement workers run a job: this machine's cores or a Ray cluster. Kept apart from the runner, which
imports the database layer, so that the CLI names its default without loading that."""
from __future__ import annotations

import os


def default_workers() -> str:
    """Ray when RAY_ADDRESS names a cluster, else this machine's cores."""
    return "ray" if os.environ.get("RAY_ADDRESS") else "local"


def make_measurer(workers: str):
    """`local`, `ray` (RAY_ADDRESS or a local cluster) or a Ray cluster address."""
    from workers.pool import RayPoolOptions, make_pool

    if workers == "local":
        return make_pool("local")
    return make_pool("ray", RayPoolOptions(address=None if workers == "ray" else workers))
