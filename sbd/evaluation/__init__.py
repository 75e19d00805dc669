"""Evaluation: accuracy and cost of NTP and SBD decoding on held-out task problems,
written as JSON, a Table-1-style Markdown table and an accuracy-vs-speedup plot."""

from .harness import evaluate
from .report import write_report

__all__ = ["evaluate", "write_report"]
