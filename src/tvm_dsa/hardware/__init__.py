"""Hardware model, presets and target tags."""

from .model import MME, Energy, Hardware, HardwareError, min_lb_bytes
from .registry import DEFAULT, from_target, get, init, load_file, make_target, names, register

__all__ = [
    "MME", "Energy", "Hardware", "HardwareError", "min_lb_bytes",
    "DEFAULT", "from_target", "get", "init", "load_file", "make_target", "names", "register",
]
