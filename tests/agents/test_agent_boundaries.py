"""The agent's boundaries: no Django on GPU nodes, pynvml behind exactly one module."""

import re
import subprocess
import sys
from pathlib import Path

AGENTS = Path(__file__).resolve().parents[2] / "agents"


def test_it_imports_no_django():
    modules = sorted(p.stem for p in AGENTS.glob("*.py") if p.stem != "__main__")
    code = (
        "import sys\n"
        + "".join(f"import agents.{m}\n" for m in modules if m != "__init__")
        + "import agents.__main__\n"
        + "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=AGENTS.parent, check=True
    )
    assert result.stdout.strip() == "[]"
    assert len(modules) > 5  # the glob found the package


def test_it_imports_pynvml_only_in_agents_nvml():
    importers = sorted(
        p.name
        for p in AGENTS.rglob("*.py")
        if re.search(r"^\s*(import pynvml|from pynvml)", p.read_text(), re.MULTILINE)
    )
    assert importers == ["nvml.py"]


def test_it_installs_the_agent_alone_without_django(tmp_path):
    """agents/pyproject.toml packages the agent by itself for GPU nodes."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    # Build from a copy so the build leaves nothing in the source tree.
    agents_dir = tmp_path / "src" / "agents"
    shutil.copytree(
        Path(__file__).resolve().parents[2] / "agents",
        agents_dir,
        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
    )
    target = tmp_path / "site"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(agents_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    installed = sorted(p.name for p in (target / "agents").glob("*.py"))
    assert "agent.py" in installed and "nvml.py" in installed and "protocol.py" in installed
    metadata = next(target.glob("gpu_portal_agent-*.dist-info")) / "METADATA"
    requires = [
        line for line in metadata.read_text().splitlines() if line.startswith("Requires-Dist")
    ]
    assert requires and not any("django" in line.lower() for line in requires)
