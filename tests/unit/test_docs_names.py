"""What the docs name exists, and the figures a benchmark owns live where the benchmark is named.

A reader acts on what a page names: a command, a flag, a file, a section.  Each test reads the
pages an operator reads (README, SECURITY, ``docs/``, the chart's README, NOTES.txt and
values.yaml; not the CHANGELOG, which names what was) and fails, naming page and line, on:

- ``nodelock <command>`` (also ``kubectl nodelock``, ``.venv/bin/nodelock``, and ``a|b``
  alternatives) in code whose command or subcommand the CLI does not have, or a ``--flag``
  after it that the command does not take;
- ``python -m <module>`` whose module does not exist, or a ``--flag`` after it that the module's
  source never mentions;
- a repository path, in code or prose (its first part is a top-level entry of the repository:
  ``deploy/…``, ``bench/…``), or a relative link, that does not exist;
- a section cited as ``page.md#anchor`` or ``page.md, "Heading"`` that the page does not have;
- a benchmark's figure (a p50/p99 in ms or s, pods/s) outside ``docs/performance.md`` and the
  dated records (decisions, CHANGELOG): copies drift; link to performance.md instead.  Targets
  and alert thresholds ("p99 <= 1.5 s", "p99 above about 1 s") are not figures;
- a table in ``docs/performance.md`` with no command (``python -m bench.…`` or ``make demo``)
  and no measurement date (YYYY-MM-DD) in its section.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodelock import cli

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "deploy" / "helm" / "nodelock"


def pages() -> list[Path]:
    found = [REPO_ROOT / "README.md", REPO_ROOT / "SECURITY.md"]
    found += sorted((REPO_ROOT / "docs").rglob("*.md"))
    found += [CHART / "README.md", CHART / "templates" / "NOTES.txt", CHART / "values.yaml"]
    return [p for p in found if p.exists()]


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@dataclass(frozen=True)
class Code:
    """A piece of code on a page: an inline span or one line of a fenced block."""

    line: int
    text: str


FENCE = re.compile(r"^\s*(```|~~~)")


def code_pieces(text: str, *, whole_lines: bool = False) -> Iterator[Code]:
    """Inline code spans and fenced lines; with ``whole_lines``, every line (YAML comments,
    NOTES.txt, where nothing is marked as code)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or whole_lines or line.startswith("    "):
            yield Code(number, line)
            continue
        for span in re.findall(r"`([^`]+)`", line):
            yield Code(number, span)


def _command_tree() -> dict[str, argparse.ArgumentParser]:
    """Every command by its words after ``nodelock`` ("" for the root, "locks break")."""
    root = cli.build_parser({})
    tree = {}
    for parser in cli._parsers(root):
        tree[parser.prog.removeprefix("nodelock").strip()] = parser
    return tree


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


# ``nodelock`` where a command starts: the start of a code span or line (after a prompt, ``sudo``,
# variables or a comment sign), after ``kubectl``, a path, ``:``, ``;``, ``(``, ``&&`` or a pipe.
INVOCATION = re.compile(
    r"(?:^\s*(?:#\s*)?(?:\$\s+)?(?:sudo\s+)?(?:[A-Z_]+=\S*\s+)*|[:;(]\s*|&&\s*|\|\s*"
    r"|kubectl\s+|/bin/)nodelock[ \t]+(?=\S)"
)
STOP = re.compile(r"[;&()]|\|\s|\s#|\s\S*nodelock\s")


def command_problems(text: str, whole_lines: bool = False) -> Iterator[tuple[int, str]]:
    tree = _command_tree()
    top = {c for c in tree if c and " " not in c}
    for piece in code_pieces(text, whole_lines=whole_lines):
        for match in INVOCATION.finditer(piece.text):
            rest = STOP.split(piece.text[match.end() :])[0]
            words = rest.split()
            if not words or not re.fullmatch(r"[a-z][\w|-]*", words[0]):
                continue
            names = words[0].split("|")
            for name in names:
                if name not in top:
                    yield piece.line, f"`nodelock {name}`: no such command"
            if len(names) != 1 or names[0] not in top:
                continue
            command = names[0]
            words = words[1:]
            children = {c.split(" ", 1)[1] for c in tree if c.startswith(command + " ")}
            if children and words and re.fullmatch(r"[a-z][\w-]*", words[0]):
                if words[0] in children:
                    command = f"{command} {words[0]}"
                    words = words[1:]
                elif not re.fullmatch(r"[\w.-]*\d[\w.-]*", words[0]):
                    yield piece.line, f"`nodelock {command} {words[0]}`: no such subcommand"
            known = _flags(tree[command]) | _flags(tree[""])
            for sub, parser in tree.items():
                if sub.startswith(command + " ") or command.startswith(sub + " "):
                    known |= _flags(parser)
            for word in words:
                flag = word.split("=", 1)[0]
                if re.fullmatch(r"--?[a-z][\w-]*", flag) and flag not in known:
                    yield piece.line, f"`nodelock {command} {flag}`: no such flag"


MODULE = re.compile(r"python3?(?:\.\d+)? -m ([a-z_][\w.]*)([^`;&|#]*)")


def module_problems(text: str) -> Iterator[tuple[int, str]]:
    for piece in code_pieces(text):
        for match in MODULE.finditer(piece.text):
            name = match.group(1)
            if name.split(".")[0] in {"pip", "venv", "pytest", "http", "json", "cProfile"}:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                yield piece.line, f"`python -m {name}`: no such module"
                continue
            origin = Path(spec.origin)
            if origin.name == "__init__.py" and (origin.parent / "__main__.py").exists():
                origin = origin.parent / "__main__.py"
            source = origin.read_text()
            package = name.split(".")[0]
            for imported in re.findall(rf"^from ({package}\.\w+) import", source, re.MULTILINE):
                found = importlib.util.find_spec(imported)
                if found is not None and found.origin is not None:
                    source += Path(found.origin).read_text()
            for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", match.group(2)):
                if f'"{flag}"' not in source:
                    yield piece.line, f"`python -m {name} {flag}`: no such flag"


def _top_level() -> set[str]:
    return {p.name for p in REPO_ROOT.iterdir() if not p.name.startswith(".")} - {
        "build",
        "dist",
    }


PATH = re.compile(r"(?<![\w./~$-])([A-Za-z0-9_-]+(?:/[A-Za-z0-9_.*-]+)+/?)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


# Written by commands, never committed (.gitignore): named as where a command writes.
OUTPUT_DIRS = ("bench/results/",)


def _exists(path: str) -> bool:
    path = path.rstrip("/")
    if path.endswith("-"):  # "docs/decisions/0003-…"
        path += "*"
    if "*" in path:
        return any(REPO_ROOT.glob(path))
    return (REPO_ROOT / path).exists()


def path_problems(page: Path, text: str) -> Iterator[tuple[int, str]]:
    top = _top_level()
    for piece in code_pieces(text, whole_lines=True):  # prose too: "kept by deploy/x.py"
        for match in PATH.finditer(piece.text):
            path = match.group(1).rstrip(".,:")
            if path.split("/")[0] not in top or "<" in path or path.startswith(OUTPUT_DIRS):
                continue
            if "kubectl" in piece.text and path.startswith("deploy/nodelock"):
                continue  # kubectl's deploy/NAME
            if not _exists(path):
                yield piece.line, f"`{path}`: no such file or directory"
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = target.split("#", 1)[0]
            if file and not (page.parent / file).exists():
                yield number, f"link to {file}: no such file"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: Path) -> tuple[set[str], set[str]]:
    """A page's headings (numbering stripped) and their anchors, explicit ``id``s included."""
    text = path.read_text()
    found = set()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.+?)\s*#*$", line)):
            found.add(" ".join(m.group(1).split()))
    names = {re.sub(r"^[\d.]+\s+", "", h) for h in found} | found
    anchors = {slug(h) for h in found} | set(re.findall(r"<a id=\"([^\"]+)\"", text))
    return names, anchors


CITED = re.compile(r"([\w./-]+\.md)`?\]?(?:\([^)]*\))?\)?,? \(?\"([^\"]+)\"")


def _page(page: Path, name: str) -> Path | None:
    for base in (page.parent, REPO_ROOT, REPO_ROOT / "docs"):
        if (base / name).is_file():
            return base / name
    return None


def heading_problems(page: Path, text: str) -> Iterator[tuple[int, str]]:
    joined = text.replace("\n", " \n")
    for number, line in enumerate(joined.split("\n"), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or "#" not in target:
                continue
            file, anchor = target.split("#", 1)
            where = (page.parent / file) if file else page
            if where.is_file() and where.suffix == ".md" and anchor not in headings(where)[1]:
                yield number, f"{file or page.name}#{anchor}: no such heading"
    plain = text
    if page.suffix != ".md":  # YAML and template comments: the text after each comment sign
        plain = re.sub(r"^\s*(#|\{\{-?\s*/\*)\s?", "", text, flags=re.MULTILINE)
    flat = " ".join(plain.split())
    for match in CITED.finditer(flat):
        where = _page(page, match.group(1))
        if where is None:
            continue
        title = " ".join(match.group(2).split())
        names = headings(where)[0]
        if title not in names and not any(n.startswith(title + ":") for n in names):
            at = text[: text.find(match.group(2).split()[0])].count("\n") + 1
            yield at, f'{match.group(1)}, "{title}": no such heading'


FIGURE = re.compile(
    r"\bp(?:50|99)\b(?P<between>[^.;\n]{0,30}?)\d[\d.,]*(?:-\d[\d.,]*)?\s?(?:ms|s)\b"
    r"|\b\d[\d.]*(?:-\d[\d.]*)? pods/s\b"
)
NOT_A_FIGURE = re.compile(r"<=|≤|<|>|\b(within|above|below|over|under|near)\b|target")
FIGURES_MAY_LIVE = {"docs/performance.md"}


def figure_problems(page: Path, text: str) -> Iterator[tuple[int, str]]:
    if _rel(page) in FIGURES_MAY_LIVE or "decisions" in page.parts:
        return
    for number, line in enumerate(text.splitlines(), 1):
        for match in FIGURE.finditer(line):
            if NOT_A_FIGURE.search(match.group("between") or ""):
                continue
            yield number, f"benchmark figure {match.group(0)!r}: link to docs/performance.md"


def _report(page: Path, problems: Iterator[tuple[int, str]]) -> list[str]:
    return [f"{_rel(page)}:{line}: {what}" for line, what in problems]


@pytest.mark.parametrize("page", pages(), ids=_rel)
def test_commands_and_flags_named_exist(page: Path) -> None:
    text = page.read_text()
    whole = page.suffix in {".yaml", ".txt"}
    found = _report(page, command_problems(text, whole_lines=whole))
    found += _report(page, module_problems(text))
    assert found == []


@pytest.mark.parametrize("page", pages(), ids=_rel)
def test_paths_named_exist(page: Path) -> None:
    assert _report(page, path_problems(page, page.read_text())) == []


@pytest.mark.parametrize("page", pages(), ids=_rel)
def test_sections_named_exist(page: Path) -> None:
    assert _report(page, heading_problems(page, page.read_text())) == []


@pytest.mark.parametrize("page", [p for p in pages() if p.suffix == ".md"], ids=_rel)
def test_benchmark_figures_live_in_performance_md(page: Path) -> None:
    assert _report(page, figure_problems(page, page.read_text())) == []


def test_every_performance_table_names_its_command_and_date() -> None:
    text = (REPO_ROOT / "docs" / "performance.md").read_text()
    sections = re.split(r"^##+ ", text, flags=re.MULTILINE)[1:]
    tables = 0
    bad = []
    for section in sections:
        if not re.search(r"^\|", section, flags=re.MULTILINE):
            continue
        tables += 1
        title = section.splitlines()[0]
        if not re.search(r"python -m bench\.\w+|make demo|nodelock demo", section):
            bad.append(f"{title}: no command")
        if not re.search(r"\b20\d\d-\d\d-\d\d\b", section):
            bad.append(f"{title}: no date measured")
    assert tables >= 4
    assert bad == []
    # 250 lines held eight benchmarks; bench.scale (issue 50) added one section of 26 lines,
    # then 36 for its burst with and without nodelock (the figure that says whose cost grows),
    # then 30 for 100,000 pods and the watches at size (churn, plugin watches, two replicas)
    assert len(text.splitlines()) < 350, "docs/performance.md: one current table per benchmark"


# The checks themselves, on the kinds of mistake they exist for.


def test_the_checks_catch_what_they_are_for() -> None:
    assert list(command_problems("run `nodelock verify` on the node"))
    assert list(command_problems("```\nnodelock extender|deviceplugin|locks\n```"))
    assert list(command_problems("`nodelock devcluster up --no-such-flag`"))
    assert list(command_problems("`nodelock devcluster start`"))
    assert not list(command_problems("`nodelock devcluster up --nodes 4` and `nodelock audit`"))
    assert not list(command_problems("`kubectl nodelock locks -o json`"))
    assert list(module_problems("`python -m bench.nothing_here`"))
    assert list(module_problems("`python -m bench.handoff --no-such-flag`"))
    assert not list(module_problems("`python -m bench.handoff --rounds 3`"))
    page = REPO_ROOT / "docs" / "x.md"
    assert list(path_problems(page, "kept in step by `deploy/render.py`"))
    assert not list(path_problems(page, "`deploy/helm/nodelock/values.yaml`, `pkg/kubelet/x.go`"))
    assert list(heading_problems(page, 'see (docs/install.md, "No Such Heading Here")'))
    assert list(heading_problems(page, "[the lock](performance.md#no-such-anchor)"))
    assert not list(
        heading_problems(page, "[the lock](performance.md#the-lock-python--m-benchlockd_requests)")
    )
    assert list(figure_problems(page, "the demo measures p50 about 2 s, p99 about 5 s"))
    assert not list(figure_problems(page, "target: p99 <= 1.5 s; alert when p99 above about 1 s"))
