"""Named chips: the shipped presets and user registrations, each with its TVM target tag
(``tvm_dsa.tags``: ``dsa/<name>``, whose ``model`` names the chip looked up here). ``dsa`` alone
means the default preset, ``stcp920``. Where a target is named, a hardware file may be too
(``chip``, ``tag``): its chip is registered.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from tvm_dsa import tags
from tvm_dsa.hardware.model import Hardware, HardwareError, check_plausible
from tvm_dsa.tags import DEFAULT

_REGISTRY: dict[str, Hardware] = {}


def load_file(path: str | Path) -> Hardware:
    """Read a hardware description from a ``.toml`` or ``.json`` file; validate it and check that it is
    plausible (``check_plausible``)."""
    path = Path(path)
    if not path.is_file():
        raise HardwareError(f"hardware file {str(path)!r} does not exist")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise HardwareError(f"hardware file {str(path)!r} is not valid {path.suffix[1:] or 'toml'}: {err}") from None
    source = f"hardware file {str(path)!r}"
    return check_plausible(Hardware.from_dict(data, source=source), source)


def _chips() -> dict[str, Hardware]:
    """The registry, the shipped presets loaded on first use (their tags are registered at
    ``import tvm``: ``tvm_dsa.tags``)."""
    if not _REGISTRY:
        for name in tags.preset_names():
            path = tags.PRESETS / f"{name}.toml"
            hw = Hardware.from_dict(tomllib.loads(path.read_text()), source=f"preset {path.name}")
            if hw.name != name:
                raise HardwareError(f"preset {path.name} describes chip {hw.name!r}: a preset file is named as its chip")
            _REGISTRY[name] = hw
    return _REGISTRY


def register(hw: Hardware | dict | str | Path, *, override: bool = False) -> Hardware:
    """Register a chip (object, dict, or file) and its target tag ``dsa/<name>``. A dict or a file is
    checked for plausibility too (``check_plausible``); an object is taken as built."""
    if isinstance(hw, (str, Path)):
        hw = load_file(hw)
    elif isinstance(hw, dict):
        hw = check_plausible(Hardware.from_dict(hw))
    elif not isinstance(hw, Hardware):
        raise HardwareError(f"cannot register {type(hw).__name__}: expected Hardware, dict or file path")
    chips = _chips()
    if hw.name in chips and chips[hw.name] != hw and not override:
        raise HardwareError(f"a different chip named {hw.name!r} is already registered: give yours another "
                            "name (or, from Python, pass override=True)")
    chips[hw.name] = hw
    tags.register(hw.name)
    return hw


def names() -> list[str]:
    return sorted(_chips())


def _key(name: str) -> str:
    """The registry's key for ``name``: ``dsa`` is the default chip, a ``dsa/`` prefix is dropped."""
    return (name[4:] if name.startswith("dsa/") else ("" if name == "dsa" else name)) or DEFAULT


def get(name: str) -> Hardware:
    """The chip called ``name`` (``dsa/`` prefix allowed); a clear error for unknown names."""
    if _key(name) not in _chips():
        raise HardwareError(f"unknown DSA preset {name!r}; known: {', '.join(names())}")
    return _REGISTRY[_key(name)]


def is_file(target: str) -> bool:
    """Whether ``target`` names a hardware file rather than a registered chip: it ends in ``.toml``
    or ``.json``, or it is an existing file and no chip is so called."""
    return target.endswith((".toml", ".json")) or (Path(target).is_file() and _key(target) not in _chips())


def chip(target: str) -> Hardware:
    """The chip ``target`` names: a registered one (``dsa``, ``dsa/<name>``, ``<name>``), or the one a
    hardware file describes, registered here (``register``) so that its tag names it from then on."""
    return register(target) if is_file(target) else get(target)


def tag(target: str) -> str:
    """The TVM target tag, ``dsa/<name>``, of the chip ``target`` names (``chip``)."""
    return f"dsa/{chip(target).name}"


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
    """``tvm.target.Target`` for ``dsa``, ``dsa/<chip>`` or a hardware file (``chip``), with a clear
    error for unknown chips."""
    import tvm

    return tvm.target.Target(tag(name))
