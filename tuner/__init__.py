"""Tuners (xgb, random, grid, ga), the XGBoost cost model, and the search loop."""
from .base import Tuner
from .ga_tuner import GAOptions, GATuner
from .grid_tuner import GridTuner
from .random_tuner import RandomTuner
from .xgb_tuner import XGBOptions, XGBTuner

TUNERS = {"xgb": XGBTuner, "random": RandomTuner, "grid": GridTuner, "ga": GATuner}

from . import predict  # noqa: E402  registers predicted configs with db's apply_history_best (it needs TUNERS)

__all__ = ["GAOptions", "GATuner", "GridTuner", "RandomTuner", "TUNERS", "Tuner", "XGBOptions", "XGBTuner"]
