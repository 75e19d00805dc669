"""The `sbd` command: parsing and printing only; every command calls the library."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
