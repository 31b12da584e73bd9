"""The Ray nodes of the cluster this service's Ray pool joined, for GET /api/workers; none without one."""
from __future__ import annotations

import sys


def ray_nodes() -> list[dict]:
    ray = sys.modules.get("ray")  # imported only by a Ray pool; importing it here would cost seconds
    if ray is None or not ray.is_initialized():
        return []
    return [{"host": node["NodeManagerHostname"], "address": node["NodeManagerAddress"], "alive": node["Alive"],
             "cpus": node["Resources"].get("CPU", 0), "gpus": node["Resources"].get("GPU", 0)}
            for node in ray.nodes()]
