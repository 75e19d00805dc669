"""Benchmarks users run on their own model and machine: `bench` (every way of decoding, timed
interleaved), forward-cost tables (time(w)/time(1)) and the roofline predictor."""

from .bench import BenchResult, BenchRow, Method, bench, parse_methods
from .forward_cost import CostRow, Shape, forward_cost_table, time_forwards

__all__ = ["BenchResult", "BenchRow", "CostRow", "Method", "Shape", "bench", "forward_cost_table", "parse_methods",
           "time_forwards"]
