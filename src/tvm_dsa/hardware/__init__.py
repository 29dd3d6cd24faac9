"""Hardware model, presets and target tags."""

from tvm_dsa.hardware.model import LIMITS, MME, Energy, Hardware, HardwareError, check_plausible, min_lb_bytes
from tvm_dsa.hardware.registry import DEFAULT, from_target, get, load_file, make_target, names, register

__all__ = [
    "LIMITS", "MME", "Energy", "Hardware", "HardwareError", "check_plausible", "min_lb_bytes",
    "DEFAULT", "from_target", "get", "load_file", "make_target", "names", "register",
]
