"""Named chips: the shipped presets, user registrations, and their TVM target tags.

TVM 0.27 cannot add target kinds from Python, so a chip is a tag ``dsa/<name>`` of the llvm kind
with ``keys`` containing "dsa" and ``model`` = the chip name; the hardware parameters live here and
are looked up by that ``model``. ``dsa`` alone means the default preset, ``stcp920``.
"""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path

from tvm_dsa.hardware.model import Hardware, HardwareError

DEFAULT = "stcp920"
_REGISTRY: dict[str, Hardware] = {}


def load_file(path: str | Path) -> Hardware:
    """Read a hardware description from a ``.toml`` or ``.json`` file and validate it."""
    path = Path(path)
    if not path.is_file():
        raise HardwareError(f"hardware file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise HardwareError(f"hardware file {str(path)!r} is not valid {path.suffix[1:] or 'toml'}: {err}") from None
    return Hardware.from_dict(data, source=f"hardware file {str(path)!r}")


def _load_presets() -> None:
    for entry in resources.files(__package__).joinpath("presets").iterdir():
        if entry.name.endswith(".toml"):
            hw = Hardware.from_dict(tomllib.loads(entry.read_text()), source=f"preset {entry.name}")
            _REGISTRY[hw.name] = hw


def register(hw: Hardware | dict | str | Path, *, override: bool = False) -> Hardware:
    """Register a chip (object, dict, or file) and its target tag ``dsa/<name>``."""
    if isinstance(hw, (str, Path)):
        hw = load_file(hw)
    elif isinstance(hw, dict):
        hw = Hardware.from_dict(hw)
    elif not isinstance(hw, Hardware):
        raise HardwareError(f"cannot register {type(hw).__name__}: expected Hardware, dict or file path")
    if hw.name in _REGISTRY and _REGISTRY[hw.name] != hw and not override:
        raise HardwareError(f"a different chip named {hw.name!r} is already registered; pass override=True")
    _REGISTRY[hw.name] = hw
    _register_tag(hw.name)
    return hw


def _register_tag(name: str) -> None:
    from tvm.target import register_tag

    # override: the same config again (init() called twice, a preset re-registered) is no error
    register_tag(f"dsa/{name}", {"kind": "llvm", "keys": ["dsa", "cpu"], "model": name}, override=True)
    if name == DEFAULT:
        register_tag("dsa", {"kind": "llvm", "keys": ["dsa", "cpu"], "model": name}, override=True)


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Hardware:
    """The chip called ``name`` (``dsa/`` prefix allowed); a clear error for unknown names."""
    key = name[4:] if name.startswith("dsa/") else ("" if name == "dsa" else name)
    key = key or DEFAULT
    if key not in _REGISTRY:
        raise HardwareError(f"unknown DSA preset {name!r}; known: {', '.join(names())}")
    return _REGISTRY[key]


def from_target(target=None) -> Hardware:
    """The chip a TVM target designates (the current target when none is given)."""
    import tvm

    if target is None:
        target = tvm.target.Target.current(allow_none=True)
        if target is None:
            raise HardwareError("no target in scope: compile with target='dsa/<chip>'")
    if isinstance(target, str):
        target = make_target(target)
    if "dsa" not in list(target.keys):
        raise HardwareError(f"target {target} is not a DSA target (its keys lack 'dsa'); use target='dsa/<chip>'")
    return get(str(target.attrs.get("model", DEFAULT)))


def make_target(name: str):
    """``tvm.target.Target`` for ``dsa``/``dsa/<chip>``, with a clear error for unknown chips."""
    import tvm

    get(name)  # raises with the known names
    return tvm.target.Target(name)


def init() -> None:
    """Load the shipped presets and register their tags (idempotent)."""
    if not _REGISTRY:
        _load_presets()
    for name in list(_REGISTRY):
        _register_tag(name)
