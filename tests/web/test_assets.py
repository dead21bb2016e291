"""The portal serves every asset itself: no CDN, plotly.js from the plotly package."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = re.compile(r"""(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}""", re.IGNORECASE)
# XML namespace names are identifiers, not addresses anything is fetched from.
NAMESPACE = re.compile(r'xmlns(?::\w+)?="[^"]*"')


def _asset_files():
    for folder in ("templates", "static"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in {".html", ".css", ".js", ".svg"}:
                yield path


def test_it_references_no_external_url_in_templates_or_static():
    found = []
    for path in _asset_files():
        text = NAMESPACE.sub("", path.read_text())
        found += [f"{path.relative_to(ROOT)}: {m}" for m in EXTERNAL.findall(text)]
    assert found == []


@pytest.mark.django_db
def test_it_serves_plotly_from_the_python_package(client, user):
    client.force_login(user)
    response = client.get("/static/vendor/plotly/plotly.min.js")
    assert response.status_code == 200
    head = b"".join(response.streaming_content)[:2000]
    assert b"plotly.js" in head


def test_it_finds_only_plotly_min_js_in_the_package():
    from portal.web.staticfinders import PlotlyFinder

    assert [path for path, _ in PlotlyFinder().list([])] == ["plotly.min.js"]
    assert PlotlyFinder().find("vendor/plotly/datasets/iris.csv") is None
