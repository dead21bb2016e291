"""The client's boundaries: no Django, relative imports only, installable on its own."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "portal" / "cli"


def _copy(tmp_path: Path) -> Path:
    """The client as `pip install ./portal/cli` names it, away from the repository."""
    target = tmp_path / "src" / "gpu_portal_cli"
    shutil.copytree(
        CLI, target, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    )
    return target


def test_it_imports_no_django_and_nothing_of_the_portal(tmp_path):
    sources = {p.name: p.read_text() for p in CLI.glob("*.py")}
    absolute = [
        name
        for name, text in sources.items()
        if re.search(r"^\s*(from|import)\s+(portal|django|rest_framework|scheduler|agents)\b",
                     text, re.MULTILINE)
    ]  # fmt: skip
    assert absolute == []
    modules = sorted(name[:-3] for name in sources if name not in ("__init__.py", "__main__.py"))
    assert len(modules) >= 4  # the glob found the package
    code = (
        "import sys\n"
        + "".join(f"import gpu_portal_cli.{m}\n" for m in modules)
        + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'portal')))"
    )
    _copy(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path / "src",
        check=True,
    )
    assert result.stdout.strip() == "[]"


def test_it_installs_alone_with_its_command_and_no_dependencies(tmp_path):
    source = _copy(tmp_path)
    target = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    installed = sorted(p.name for p in (target / "gpu_portal_cli").glob("*.py"))
    assert {"main.py", "client.py", "commands.py", "config.py", "output.py"} <= set(installed)
    metadata = next(target.glob("gpu_portal_cli-*.dist-info"))
    assert not [
        line for line in (metadata / "METADATA").read_text().splitlines()
        if line.startswith("Requires-Dist")
    ]  # fmt: skip
    assert "gpu-portal = gpu_portal_cli.main:main" in (metadata / "entry_points.txt").read_text()
    version = subprocess.run(
        [sys.executable, "-c", "import sys; from gpu_portal_cli.main import main; "
         "sys.exit(main(['--version']))"],
        capture_output=True,
        text=True,
        cwd=target,
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.strip() == "gpu-portal 0.1.0"
