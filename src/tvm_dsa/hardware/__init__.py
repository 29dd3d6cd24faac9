"""Hardware model, presets and target tags."""

from tvm_dsa.hardware.model import LIMITS, MME, Energy, Hardware, HardwareError, check_plausible, min_lb_bytes
from tvm_dsa.hardware.registry import (
    DEFAULT, chip, from_target, get, is_file, load_file, make_target, names, register, tag
)

__all__ = [
    "LIMITS", "MME", "Energy", "Hardware", "HardwareError", "check_plausible", "min_lb_bytes",
    "DEFAULT", "chip", "from_target", "get", "is_file", "load_file", "make_target", "names", "register", "tag",
]
