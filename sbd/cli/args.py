"""Command-line values: argparse types for single values, and options generated from a config dataclass
(field name `a_b` → `--a-b`, help and choices from the field's metadata) so that a setting is declared,
documented and validated in one place."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is between 1 and 65535, got {value}")
    return value


def gamma_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (inf allowed), got {text!r}")
    return value


def int_list(text: str, minimum: int = 1) -> list[int]:
    """`1,4,8` -> [1, 4, 8]; every entry an integer >= minimum (SBDError otherwise)."""
    from ..errors import SBDError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SBDError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < minimum for v in values):
        raise SBDError(f"{text!r}: give integers >= {minimum}, e.g. {'1,4' if minimum else '0,256'}")
    return values


def positive_list(text: str) -> list[int]:
    """`1,4,8` -> [1, 4, 8]; every entry an integer >= 1."""
    return int_list(text, 1)


def count_list(text: str) -> list[int]:
    """`0,256,1024` -> [0, 256, 1024]; every entry an integer >= 0."""
    return int_list(text, 0)


def add_config_options(parser: argparse.ArgumentParser, cls) -> None:
    """One option per field of the dataclass `cls`; a bool field defaulting to True becomes `--no-NAME`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        kind = hints[f.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = args[0] if typing.get_origin(kind) is typing.Union else kind
        name = f.name.replace("_", "-")
        helptext = meta.get("help", "")
        if kind is bool:
            if f.default:
                parser.add_argument(f"--no-{name}", dest=f.name, action="store_false", help=f"do not {helptext}")
            else:
                parser.add_argument(f"--{name}", dest=f.name, action="store_true", help=helptext)
            continue
        kw = {"dest": f.name, "type": kind, "help": helptext}
        if "choices" in meta:
            kw["choices"] = list(meta["choices"])
        if meta.get("required"):
            kw["required"] = True
        else:
            kw["default"] = f.default
            if f.default is not None and "(default" not in helptext:
                kw["help"] = f"{helptext} (default: {f.default})"
        parser.add_argument(f"--{name}", **kw)


def config_from_args(cls, namespace: argparse.Namespace):
    """The dataclass `cls` built from the parsed options (its own checks then run)."""
    return cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)})


WEIGHTS_HELP = ("the base model's linear layers: auto (the default) as stored, held on a CPU in int4/int8 where "
                "that is exact: a GGUF's Q4_1 and Q8_0 tensors, the same numbers in a quarter to a sixth of the "
                "bytes; float: as stored, all float; int8 or int4: quantized weight-only in groups of 32 (the "
                "output layer int8; int8 on a CPU only), which changes the weights and some answers, while "
                "sbd-verify stays exactly NTP's tokens of those weights")


def add_weights_option(p) -> None:
    p.add_argument("--weights", choices=["auto", "float", "int8", "int4"], default="auto", help=WEIGHTS_HELP)


def weights_arg(args) -> bool | str:
    """--weights as `sbd.load` takes it."""
    weights = getattr(args, "weights", "auto")
    return True if weights == "auto" else weights
