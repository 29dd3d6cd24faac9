"""The docs' examples run, and the reference parts of the docs match the code they describe.

Per page, its ```python blocks run in order in one namespace and each ``$ tvm-dsa ...`` line of
its ```console blocks runs the command in-process (exit code 0), in a temporary directory.
"""

import dataclasses
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tvm_dsa import hardware
from tvm_dsa.cli import main
from tvm_dsa.isa.reference import BEGIN, END, reference

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _blocks(page: str, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall((DOCS / page).read_text()) if kind == lang]


@pytest.mark.parametrize("page", ["getting-started.md", "isa.md", "new-chip.md", "tools.md"])
def test_examples_run(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = [(kind, body) for kind, body in BLOCK.findall((DOCS / page).read_text()) if kind in ("python", "console")]
    assert blocks, f"{page} has no examples"
    namespace: dict = {}
    for kind, body in blocks:
        if kind == "python":
            exec(compile(body, f"{page} example", "exec"), namespace)  # noqa: S102 - the docs' own code
            continue
        for line in body.splitlines():
            if line.startswith("$ tvm-dsa "):
                assert main(shlex.split(line)[2:]) == 0, line
    capsys.readouterr()


def test_isa_reference_is_generated_from_the_isa():
    text = (DOCS / "isa.md").read_text()
    assert BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END == reference()


def test_hardware_format_names_every_field_and_its_example_is_the_preset():
    text = (DOCS / "hardware-format.md").read_text()
    for cls in (hardware.Hardware, hardware.MME, hardware.Energy):
        for f in dataclasses.fields(cls):
            assert f"`{f.name}`" in text, f"docs/hardware-format.md does not describe {cls.__name__}.{f.name}"
    (example,) = _blocks("hardware-format.md", "toml")
    assert hardware.Hardware.from_dict(tomllib.loads(example)) == hardware.get("stcp920")


def test_hardware_format_states_the_plausible_bounds():
    """Each bound of ``hardware.LIMITS`` is in the table of "Plausible values", on its field's row."""
    section = (DOCS / "hardware-format.md").read_text().split("## Plausible values", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `") or line.startswith("| the")]
    for name, limit in hardware.LIMITS.items():
        key = "[energy]" if name.startswith("energy.") else f"`{name}`"
        (bound,) = [bound for what, bound in rows if key in what.split(" (")[0]]
        assert bound.strip().startswith(f"{limit:,}"), (name, bound)
    assert f"at least {hardware.model.MIN_CLOCK_HZ:,.0f}" in section
