"""Tidy metrics computed from a run's frames."""

from simulator.metrics.summary import add_latency_columns, slo_met, summarize, weighted_percentiles

__all__ = ["add_latency_columns", "slo_met", "summarize", "weighted_percentiles"]
