"""Tuners (xgb, random, grid, ga), the XGBoost cost model, and the search loop."""
from .base import Tuner
from .ga_tuner import GAOptions, GATuner
from .grid_tuner import GridTuner
from .random_tuner import RandomTuner
from .xgb_tuner import XGBOptions, XGBTuner

TUNERS = {"xgb": XGBTuner, "random": RandomTuner, "grid": GridTuner, "ga": GATuner}

__all__ = ["GAOptions", "GATuner", "GridTuner", "RandomTuner", "TUNERS", "Tuner", "XGBOptions", "XGBTuner"]
