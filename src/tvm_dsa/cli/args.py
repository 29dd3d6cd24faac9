"""Argument checks the ``tvm-dsa`` commands share: each turns a bad value into one clear line."""

from __future__ import annotations

import argparse

from tvm_dsa.hardware import Hardware
from tvm_dsa.harness import InputError
from tvm_dsa.show.plots import check_path


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def check_plot_path(path: str) -> None:
    """A plot can be written to ``path`` (its suffix names a format matplotlib writes), else InputError."""
    try:
        check_path(path)
    except ValueError as err:
        raise InputError(str(err)) from None


def check_mesh(target: str, hw: Hardware, what: str) -> None:
    """An InputError where ``what`` (SET's schedule or search) needs a mesh of tiles and the chip of
    ``target``, ``hw``, has none."""
    if hw.interconnect != "mesh":
        raise InputError(f"{what} runs on a mesh of tiles; {target} has a {hw.interconnect} "
                         "(the SET presets: tvm-dsa hw)")
