"""The README, every page under docs/ and the chart's README say only what is there.

For README.md, each docs/*.md (pages added later included) and helm/geoingest/README.md:
- every relative link and image resolves to a file of the repository, and its `#anchor` to a
  heading of the page it names (GitHub's slugs);
- every `geoingest ...` line of a fenced block parses with the command's own argparse parser (parsed,
  never run; placeholders such as `T` or `X.json` are arguments like any other); a `geoingest ...`
  in inline code, often a synopsis (`[--dry-run]`, `a|b`), names a subcommand and options that exist;
- every `make <target>` shown is a target of the Makefile;
- every `helm install|upgrade|template` shown names the chart, and each `--set` a key of its values.yaml;
- every repository path named in inline code (`streaming/...py`, `app/...`, `schemas/...`, `bench/...`,
  `helm/...`, ...) or in a fenced block exists;
- every page under docs/ is linked from the README.
And the README's file map is the tree of app/ and streaming/. Each check is also run on a page
broken on purpose, so that it is seen to fail. The command lines of some pages also run (tests/app/test_cli.py),
and the DuckDB SQL of docs/reading.md (tests/streaming/read/test_readers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from app.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "helm" / "geoingest" / "README.md"]


# -- reading a page -----------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
REPO_PATH = re.compile(r"(?<![\w/.~$-])(?:app|streaming|schemas|bench|helm|tests|docs|dashboards)/[\w./-]*")
REPO_PATH_SPAN = re.compile(r"(?:app|streaming|schemas|bench|helm|tests|docs|dashboards)/[\w./-]*")


def fenced_blocks(text: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """The page without its fenced blocks (their lines kept blank, so that headings inside them,
    such as a TOML comment, are not headings)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def inline_code(text: str) -> list[str]:
    return [m.group(2).strip() for m in INLINE_CODE.finditer(prose(text))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as shown, lower case, without punctuation but
    hyphens and underscores, spaces as hyphens."""
    shown = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    shown = re.sub(r"[`*]", "", shown)
    return re.sub(r"[^\w\- ]", "", shown.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(prose(text)):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


# -- the checks ---------------------------------------------------------------------------------


def link_problems(page: Path, text: str, root: Path) -> list[str]:
    problems = []
    body = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), prose(text))
    for m in LINK.finditer(body):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        file = (page.parent / path_part).resolve() if path_part else page
        if not file.exists():
            problems.append(f"{page.name}: link {target!r}: no file {path_part}")
            continue
        if root.resolve() not in (file, *file.parents):
            problems.append(f"{page.name}: link {target!r} leaves the repository")
            continue
        if anchor:
            if file.suffix != ".md" or file.is_dir():
                problems.append(f"{page.name}: link {target!r}: an anchor into a file that is no page")
            elif anchor not in anchors(file.read_text()):
                problems.append(f"{page.name}: link {target!r}: {file.name} has no heading #{anchor}")
    return problems


def _argv(line: str) -> list[str] | None:
    """The arguments of a `geoingest` command line (after a prompt, `.venv/bin/`, variables), or None."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and (words[0] == "$" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
        words = words[1:]
    if words and words[0].rsplit("/", 1)[-1] == "geoingest":
        return words[1:]
    return None


def _lines(block: str) -> list[str]:
    """A block's lines, with backslash continuations joined."""
    return block.replace("\\\n", " ").splitlines()


def geoingest_lines(page: Path) -> list[list[str]]:
    """The arguments of every `geoingest` command line in the page's fenced blocks, in order."""
    lines = [line for block in fenced_blocks(page.read_text()) for line in _lines(block)]
    return [argv for argv in map(_argv, lines) if argv is not None]


def parse_problem(argv: list[str]) -> str | None:
    """Why the command's parser refuses argv, or None."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            _parser().parse_args(argv)
        except SystemExit as stop:
            if stop.code not in (0, None):  # --help exits 0
                return err.getvalue().strip().splitlines()[-1]
    return None


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def synopsis_problem(span: str) -> str | None:
    """An inline `geoingest ...`: its subcommand, action and every --option must exist."""
    words = span.split()
    commands = _subparsers(_parser())
    if len(words) < 2 or not re.fullmatch(r"[a-z-]+", words[1]):
        return None  # `geoingest` alone, `geoingest <command> --help`
    sub = commands.get(words[1])
    if sub is None:
        return f"no command {words[1]!r}"
    options = {o for a in sub._actions for o in a.option_strings} | {"--config"}
    positional = [a for a in sub._actions if not a.option_strings and a.choices]
    if positional and len(words) > 2 and re.fullmatch(r"[a-z|\\]+", words[2]):
        for action in words[2].replace("\\", "").split("|"):
            if action not in positional[0].choices:
                return f"{words[1]}: no action {action!r}"
    for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", span):
        if option not in options:
            return f"{words[1]}: no option {option}"
    return None


def command_problems(page: Path, text: str) -> list[str]:
    problems = []
    for block in fenced_blocks(text):
        for line in _lines(block):
            argv = _argv(line)
            if argv is not None and (why := parse_problem(argv)):
                problems.append(f"{page.name}: `{line.strip()}`: {why}")
    for span in inline_code(text):
        words = span.split()
        if words and words[0].rsplit("/", 1)[-1] == "geoingest" and (why := synopsis_problem(span)):
            problems.append(f"{page.name}: `{span}`: {why}")
    return problems


def make_targets(makefile: Path) -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile.read_text(), re.MULTILINE))


def make_problems(page: Path, text: str, root: Path) -> list[str]:
    targets = make_targets(root / "Makefile")
    shown = [w for block in fenced_blocks(text) for line in _lines(block) for w in [line.split("#")[0].split()]]
    shown += [span.split() for span in inline_code(text)]
    problems = []
    for words in shown:
        if len(words) >= 2 and words[0] == "make":
            for target in words[1:]:
                if "=" in target or target.startswith("-"):
                    continue
                if target not in targets:
                    problems.append(f"{page.name}: `make {target}`: no such target in the Makefile")
    return problems


def helm_problems(page: Path, text: str, root: Path) -> list[str]:
    """`helm install|upgrade|template ... --set key.path=value`: the chart exists and its values.yaml
    has every key set."""
    problems = []
    for block in fenced_blocks(text):
        for line in _lines(block):
            words = line.split("#")[0].split()
            if len(words) < 3 or words[0] != "helm" or words[1] not in ("install", "upgrade", "template"):
                continue
            charts = [w for w in words[2:] if (root / w / "Chart.yaml").exists()]
            if not charts:
                problems.append(f"{page.name}: `{line.strip()}`: names no chart of the repository")
                continue
            values = yaml.safe_load((root / charts[0] / "values.yaml").read_text())
            for key in (words[i + 1].split("=")[0] for i, w in enumerate(words[:-1]) if w == "--set"):
                node = values
                for part in key.split("."):
                    if not isinstance(node, dict) or part not in node:
                        problems.append(f"{page.name}: `--set {key}`: no such value in {charts[0]}/values.yaml")
                        break
                    node = node[part]
    return problems


def path_problems(page: Path, text: str, root: Path) -> list[str]:
    named = [span for span in inline_code(text) if REPO_PATH_SPAN.fullmatch(span)]
    named += [m.group(0) for block in fenced_blocks(text) for m in REPO_PATH.finditer(block)]
    return [
        f"{page.name}: `{path}` does not exist"
        for path in dict.fromkeys(p.rstrip(".") for p in named)
        if not (root / path).exists()
    ]


def orphan_problems(root: Path) -> list[str]:
    readme = root / "README.md"
    body = prose(readme.read_text())
    linked = {(readme.parent / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(body)}
    return [
        f"README.md does not link docs/{page.name}"
        for page in sorted((root / "docs").glob("*.md"))
        if page.resolve() not in linked
    ]


def problems(page: Path, root: Path = ROOT) -> list[str]:
    text = page.read_text()
    return [
        *link_problems(page, text, root),
        *command_problems(page, text),
        *make_problems(page, text, root),
        *helm_problems(page, text, root),
        *path_problems(page, text, root),
    ]


# -- the repository's pages ---------------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_says_only_what_is_there(page: Path) -> None:
    assert problems(page) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    assert orphan_problems(ROOT) == []


def test_the_readme_shows_commands_that_are_checked() -> None:
    # The check must see something: the README's own geoingest lines and make targets.
    text = README.read_text()
    lines = [line for block in fenced_blocks(text) for line in _lines(block)]
    assert sum(_argv(line) is not None for line in lines) >= 2
    assert {"demo", "test", "demo-lakehouse"} <= {
        w for line in lines for w in line.split()[1:2] if line.startswith("make")
    }


# -- the file map --------------------------------------------------------------------------------


def file_map(text: str) -> set[str]:
    """The files the README's "Layout of the code" block names: one line per folder or group of
    files, indented two spaces a level, names then two spaces and what they hold."""
    section = text[text.index("## Layout of the code") :]
    block = fenced_blocks(section)[0]
    named: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        names = re.split(r" {2,}", line.strip(), maxsplit=1)[0].split()
        folders = folders[:depth]
        for name in names:
            path = "".join(folders) + name
            named.add(path.rstrip("/"))
            if name.endswith("/"):
                folders.append(name)
    return named


def test_the_readme_file_map_is_the_tree() -> None:
    named = file_map(README.read_text())
    tree = {
        str(p.relative_to(ROOT))
        for top in ("app", "streaming")
        for p in (ROOT / top).rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    missing = sorted(tree - named)
    assert not missing, f"the README's file map leaves out {missing}"
    gone = sorted(p for p in named if not (ROOT / p).exists())
    assert not gone, f"the README's file map names what is not there: {gone}"


# -- the checks fail ----------------------------------------------------------------------------

BROKEN = """# A page

## Its `first` section

Fine: [a section](#its-first-section), [the other page](other.md#whats-there), ![a picture](pic.png),
[a site](https://example.com/x), `geoingest table maintain --table T [--compact] [--dry-run]`,
`make test`, `streaming/contract.py`, a placeholder in a path: `bench/results/<name>.json`.

Broken: [no file](missing.md), [no heading](other.md#nowhere), [no heading here](#nowhere),
`geoingest table maintain --compactt`, `geoingest tables describe`, `make tset`, `streaming/nowhere.py`.

```
geoingest query --table T --bbox 1,2,3,4 --format count
.venv/bin/geoingest run --until-idle --contrat x.json
GEOINGEST_X=1 geoingest table describe --table T --limit 3
make demo
make bench-all
helm install geo helm/geoingest --set image.repository=r \\
  --set config.bootstrap_server=k:9092
  -> the pass                                        streaming/gone/task.py
```

```toml
# "a TOML comment": not a heading
```
"""


def test_the_checks_find_what_is_broken(tmp_path: Path) -> None:
    # A repository of its own: the Makefile, one module, two pages and a picture.
    (tmp_path / "Makefile").write_text((ROOT / "Makefile").read_text())
    (tmp_path / "streaming").mkdir()
    (tmp_path / "streaming" / "contract.py").write_text("")
    (tmp_path / "helm" / "geoingest").mkdir(parents=True)
    (tmp_path / "helm" / "geoingest" / "Chart.yaml").write_text("name: geoingest\n")
    (tmp_path / "helm" / "geoingest" / "values.yaml").write_text(
        "image:\n  repository: x\nconfig:\n  bootstrap_servers: y\n"
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "other.md").write_text("# What's there\n")
    (docs / "pic.png").write_bytes(b"")
    page = docs / "page.md"
    page.write_text(BROKEN)
    found = problems(page, tmp_path)
    expected = [
        "link 'missing.md': no file missing.md",
        "link 'other.md#nowhere': other.md has no heading #nowhere",
        "link '#nowhere': page.md has no heading #nowhere",
        "`geoingest table maintain --compactt`: table: no option --compactt",
        "`geoingest tables describe`: no command 'tables'",
        "`.venv/bin/geoingest run --until-idle --contrat x.json`: geoingest: error: unrecognized arguments: --contrat x.json",
        "`GEOINGEST_X=1 geoingest table describe --table T --limit 3`: geoingest: error: unrecognized arguments: --limit 3",
        "`make tset`: no such target in the Makefile",
        "`make bench-all`: no such target in the Makefile",
        "`--set config.bootstrap_server`: no such value in helm/geoingest/values.yaml",
        "`streaming/nowhere.py` does not exist",
        "`streaming/gone/task.py` does not exist",
    ]
    assert sorted(found) == sorted(f"page.md: {e}" for e in expected)


def test_an_orphan_page_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[one](docs/one.md)\n")
    (tmp_path / "docs" / "one.md").write_text("# One\n")
    (tmp_path / "docs" / "two.md").write_text("# Two\n")
    assert orphan_problems(tmp_path) == ["README.md does not link docs/two.md"]


def test_slugs_follow_github() -> None:
    assert slug("Table contracts (`schemas/`)") == "table-contracts-schemas"
    assert slug("Changing a table's contract") == "changing-a-tables-contract"
    assert slug("Upsert tables: one current row per feature") == "upsert-tables-one-current-row-per-feature"
    assert slug("The `geoingest` command") == "the-geoingest-command"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_file_map_reader_sees_a_missing_file() -> None:
    text = "## Layout of the code\n\n```\napp/   shell\n  cli.py settings.py   x\n  local/   y\n    demo.py   z\n```\n"
    assert file_map(text) == {"app", "app/cli.py", "app/settings.py", "app/local", "app/local/demo.py"}
