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
