"""The docs' commands run: every `gpu-portal ...` line in README.md and docs/ parses with the
CLI's own parser, and every `curl` path resolves against the portal's URL conf."""

import re
import shlex
from pathlib import Path

import pytest
from django.urls import Resolver404, resolve

from portal.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "docs/examples").glob("*")]
)
# `gpu-portal` then a word: not `gpu-portal-cli`, `gpu-portal/`, `gpu-portal[ldap]` or `gpu-portal:`.
GPU_PORTAL = re.compile(r"(?<![\w/.-])gpu-portal(?= [a-z-])")
INLINE = re.compile(r"`(gpu-portal [^`]*)`")
CURL = re.compile(r"(?<![\w-])curl\s")
API_PATH = re.compile(
    r"(?:https?://[^/\s\"']+|(?:localhost|127\.0\.0\.1)(?::\d+)?)?(/api/[^\s\"'?]*)"
)
# Placeholders a doc may write in a path: {id}, <id>, :id.
PLACEHOLDER = re.compile(r"\{[^}/]*\}|<[^>/]*>|:[a-z_]+")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(number, line) with shell continuations (a trailing backslash) joined onto the first."""
    lines, start, pending = [], 1, ""
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    return lines


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """What a reader would type: lines inside fenced blocks of a page (every line of an example
    file, whose usage sits in its docstring), and inline spans that start with gpu-portal."""
    text = path.read_text()
    if path.suffix != ".md":
        return _logical_lines(text)
    found, fenced = [], False
    for number, line in _logical_lines(text):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            found.append((number, line))
        else:
            found += [(number, span) for span in INLINE.findall(line)]
    return found


def _commands(words_after: str) -> str:
    """A command's own text: up to a pipe, a closing `)`, `;`, `&&` or a comment."""
    return re.split(r"\s(?:\||;|&&|#)\s|\)(?:\s|$)", words_after)[0]


def gpu_portal_lines() -> list[tuple[str, list[str]]]:
    """(where, the words after gpu-portal) for every gpu-portal command in the docs."""
    found = []
    for path in DOCS:
        for number, line in _code_lines(path):
            for match in GPU_PORTAL.finditer(line):
                text = _commands(line[match.end() :])
                words = shlex.split(text, comments=True)
                found.append(
                    (f"{path.relative_to(ROOT)}:{number}: gpu-portal {text.strip()}", words)
                )
    return found


def curl_paths() -> list[tuple[str, str]]:
    """(where, the /api/... path) for every curl command in the docs."""
    found = []
    for path in DOCS:
        for number, line in _code_lines(path):
            for match in CURL.finditer(line):
                for api_path in API_PATH.findall(_commands(line[match.end() :])):
                    found.append((f"{path.relative_to(ROOT)}:{number}", api_path))
    return found


def test_it_finds_the_docs_commands():
    # A collector that found nothing would pass every check below.
    where = {line.split(":")[0] for line, _ in gpu_portal_lines()}
    assert {"README.md", "docs/cli.md", "docs/examples/rendezvous.py"} <= where
    assert len(gpu_portal_lines()) > 20
    assert {where.split(":")[0] for where, _ in curl_paths()} >= {"README.md"}


@pytest.mark.parametrize(("where", "words"), gpu_portal_lines(), ids=lambda v: str(v)[:60])
def test_it_parses_every_gpu_portal_line_of_the_docs(where, words, capsys):
    parser = build_parser()
    if len(words) == 1 and not words[0].startswith("-"):
        # `gpu-portal show` in a sentence names a command: it must be one.
        choices = next(a for a in parser._actions if a.dest == "name").choices
        assert words[0] in choices, where
        return
    try:
        parser.parse_args(words)
    except SystemExit as exc:
        assert exc.code == 0, f"{where}\n{capsys.readouterr().err}"


@pytest.mark.parametrize(("where", "path"), curl_paths())
def test_it_resolves_every_curl_path_of_the_docs(where, path):
    concrete = PLACEHOLDER.sub("42", path)
    try:
        resolve(concrete)
    except Resolver404:
        pytest.fail(f"{where}: {path} is no URL of the portal")
