"""The package keeps its layers (docs/architecture.md): the import-linter contracts of pyproject.toml
hold (every import counts, those inside functions too), and no module imports another's private
name."""

import ast
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "tvm_dsa"


def test_import_contracts_hold():
    lint = shutil.which("lint-imports")
    assert lint, "import-linter is a test extra: pip install -e '.[test]'"
    done = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml")], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_private_name_is_imported_across_modules():
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tvm_dsa"):
                found += [f"{path.relative_to(SRC)}:{node.lineno} {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert not found
