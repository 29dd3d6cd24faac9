"""The chips' TVM target tags. TVM 0.27 cannot add target kinds from Python, so a chip is a tag
``dsa/<name>`` of the llvm kind with ``keys`` holding "dsa" and ``model`` = the chip's name;
``dsa`` alone is the default chip. ``import tvm`` registers the shipped presets' tags from their
file names (each preset file is named as its chip) before any chip is loaded
(``tvm_dsa.hardware`` holds the chips)."""

from __future__ import annotations

from pathlib import Path

DEFAULT = "stcp920"
PRESETS = Path(__file__).resolve().parent / "hardware" / "presets"


def preset_names() -> list[str]:
    """The shipped presets' chips, by their files' names."""
    return sorted(path.stem for path in PRESETS.glob("*.toml"))


def register(name: str) -> None:
    """The tag ``dsa/<name>`` (and ``dsa`` for the default chip); the same again is no error."""
    from tvm.target import register_tag

    config = {"kind": "llvm", "keys": ["dsa", "cpu"], "model": name}
    register_tag(f"dsa/{name}", config, override=True)
    if name == DEFAULT:
        register_tag("dsa", config, override=True)
