"""Argument checks the ``tvm-dsa`` commands share: each turns a bad value into one clear line."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager, nullcontext

from tvm_dsa.dse import InProcess, ray_available, ray_engine
from tvm_dsa.hardware import Hardware
from tvm_dsa.harness import InputError
from tvm_dsa.show.plots import check_path


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def model_title(name: str, tiny: bool, model) -> str:
    """A model as titles name it: ``name``, whether tiny, and its batch (its first input's leading
    dimension, as built: ``--batch`` or the model's default)."""
    dims = model.graph.input[0].type.tensor_type.shape.dim if model.graph.input else ()
    batch = (dims[0].dim_value or dims[0].dim_param) if dims else 1
    return f"{name}{' (tiny)' if tiny else ''}, batch {batch}"


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


def add_ray_args(p: argparse.ArgumentParser, what: str) -> None:
    """``--address``, ``--workers`` and ``--in-process``: where ``what`` (e.g. "trials") runs."""
    p.add_argument("--address", help="a Ray cluster's address (default RAY_ADDRESS; else a local Ray)")
    p.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1,
                   help=f"CPUs of the local Ray, {what} at once (default: this machine's cores)")
    p.add_argument("--in-process", action="store_true", help=f"run the {what} in this process, not on Ray")


def engine(args, command: str):
    """A context giving the ``dse`` engine ``args`` ask for (``add_ray_args``): an ``OnRay`` on the
    cluster at ``--address`` / ``RAY_ADDRESS`` or a local Ray, else an ``InProcess`` saying why
    (``--in-process``, Ray not installed). Bad options raise here; entering it says on stderr
    which Ray it starts or joins."""
    if args.address and (args.in_process or not ray_available()):
        raise InputError("--address runs on a Ray cluster: " + (
            "not with --in-process" if args.in_process else "Ray is not installed (pip install 'tvm-dsa[dse]')"))
    if args.in_process or not ray_available():
        return nullcontext(InProcess("--in-process") if args.in_process else InProcess())
    return _on_ray(args.address, args.workers, command)


@contextmanager
def _on_ray(address: str | None, workers: int, command: str):
    where = address or os.environ.get("RAY_ADDRESS")
    say(f"{command}: connecting to the Ray cluster at {where}" if where else
        f"{command}: starting a local Ray of {workers} CPUs")
    with ray_engine(address, workers) as on_ray:
        yield on_ray


def say(line: str) -> None:
    """A line of progress on stderr, at once."""
    print(line, file=sys.stderr, flush=True)
