"""Tuners, the XGBoost cost model, and the search loop."""
