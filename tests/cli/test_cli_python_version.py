"""The client runs on the Python of a login node: 3.8 and later (vermin checks the source)."""

import ast
import subprocess
import sys
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "portal" / "cli"


def test_it_needs_no_python_newer_than_3_8():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vermin; sys.exit(vermin.main())",
            "--no-tips",
            "--violations",
            "-t=3.8-",
            str(CLI),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_keeps_annotations_unevaluated_in_every_module():
    # `str | None` and `list[str]` in a signature fail on 3.8 when evaluated; the future import
    # keeps them strings (vermin's default does not look at annotations).
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text())
        annotated = any(
            isinstance(node, ast.AnnAssign)
            or (isinstance(node, ast.FunctionDef) and (node.returns or _annotated_args(node)))
            for node in ast.walk(tree)
        )
        future = any(
            isinstance(node, ast.ImportFrom)
            and node.module == "__future__"
            and any(alias.name == "annotations" for alias in node.names)
            for node in tree.body
        )
        assert future or not annotated, f"{path.name}: add `from __future__ import annotations`"


def _annotated_args(node: ast.FunctionDef) -> bool:
    args = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
    return any(arg.annotation is not None for arg in args)


def test_it_declares_python_3_8_in_its_own_package():
    assert 'requires-python = ">=3.8"' in (CLI / "pyproject.toml").read_text()
