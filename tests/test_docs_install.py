"""Every `pip install` and `make TARGET` line in README.md, docs/*.md and launch/README.md works
as written from a checkout: in code blocks (continuations joined, comments read too) and in
inline code.

Nothing is installed and nothing is fetched. An install of this checkout (`.`, `-e .`, a
bert_jax wheel built from it) names only extras pyproject.toml declares; bert-jax itself is never
asked of the index (it is not on PyPI); another package is a valid requirement, and where
pyproject.toml constrains the same package the line's version satisfies that constraint. A make
target exists: `make -n TARGET` (prints the recipe, runs nothing) succeeds. README's Install
section names every extra. That pip resolves each line is checked by running it in a fresh
environment, by hand (docs/development.md says when).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from tests.test_docs_commands import PAGES, REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    PYPROJECT = tomllib.load(f)["project"]
EXTRAS = set(PYPROJECT["optional-dependencies"])
# Every constraint pyproject.toml puts on a package, by canonical name.
CONSTRAINTS: dict[str, list[Requirement]] = {}
for spec in PYPROJECT["dependencies"] + sum(PYPROJECT["optional-dependencies"].values(), []):
    requirement = Requirement(spec)
    CONSTRAINTS.setdefault(canonicalize_name(requirement.name), []).append(requirement)
THIS = canonicalize_name(PYPROJECT["name"])

# pip install options that take a value (the next word, or after '=').
VALUED = {"-r", "--requirement", "-c", "--constraint", "-t", "--target", "-i", "--index-url"}
VALUED |= {"--extra-index-url", "-f", "--find-links", "--prefix", "--root", "--platform"}
VALUED |= {"--python-version", "--implementation", "--abi", "--no-binary", "--only-binary"}
VALUED |= {"--src", "--upgrade-strategy", "--progress-bar", "--config-settings", "-C"}
PIP = re.compile(r"(?:^|(?<=[\s;&|(`]))((?:\S*/)?(?:pip3?|python3? -m pip) install\s+\S.*)")
MAKE = re.compile(r"^(?:\$ )?make(?: +\w[\w-]*(?:=\S+)?)+ *(?:#.*)?$")  # no options
INLINE = re.compile(r"`([^`\n]+)`")


@dataclasses.dataclass(frozen=True)
class Line:
    page: str
    number: int
    text: str  # the command, from `pip`/`make` on

    def __str__(self) -> str:
        return f"{self.page}:{self.number}: {self.text}"


def _snippets(page: str):
    """(line number, text) of each code-block line (continuations joined) and each inline code
    span, in code-block lines (comments) as in prose."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    in_block, joined, start = False, "", 0
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            for span in INLINE.findall(line):
                yield number, span
            continue
        if not joined:
            start = number
        joined += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        text, joined = joined.strip(), ""
        text = text.removeprefix("RUN ")  # a Dockerfile's
        yield start, text
        for span in INLINE.findall(text):
            yield start, span


def _lines() -> tuple[list[Line], list[Line]]:
    installs, makes = [], []
    for page in [*PAGES, "launch/README.md"]:
        for number, text in _snippets(page):
            if "`" not in text:  # a span's own text, or a line without spans
                match = PIP.search(text)
                if match:
                    installs.append(Line(page, number, match.group(1)))
            if MAKE.match(text):
                makes.append(Line(page, number, text.removeprefix("$ ")))
    return installs, makes


INSTALLS, MAKES = _lines()


def _words(line: Line) -> list[str]:
    """The install command's words, up to the shell's next separator or comment."""
    lexer = shlex.shlex(line.text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if word and set(word) <= set(";&|"):
            break
        words.append(word)
    return words[words.index("install") + 1 :]


def requirements(line: Line) -> list[tuple[str, bool]]:
    """(requirement, editable) of each thing the line installs."""
    found, words = [], iter(_words(line))
    for word in words:
        if word in ("-e", "--editable"):
            found.append((next(words), True))
        elif word in VALUED:
            next(words)
        elif not word.startswith("-"):
            found.append((word, False))
    return found


def _extras(text: str) -> set[str]:
    match = re.search(r"\[([^\]]*)\]$", text)
    return {e.strip() for e in match.group(1).split(",")} if match else set()


def check(line: Line) -> list[str]:
    """What is wrong with one install line; empty when it works from a checkout."""
    wanted = requirements(line)
    if not wanted:
        return ["installs nothing"]
    problems = []
    for text, editable in wanted:
        path = re.sub(r"\[[^\]]*\]$", "", text)  # without its extras
        if path.startswith((".", "/", "$(")) or "/" in path or path.endswith((".whl", ".tar.gz")):
            ours = path in (".", "./") or re.search(r"bert_jax-[^/]*\.whl\)?$", path)
            if not ours:
                problems.append(f"{text}: a path that is not this checkout nor its wheel")
            unknown = _extras(text) - EXTRAS
            if unknown:
                problems.append(f"{text}: no extra {sorted(unknown)} in pyproject.toml")
            continue
        if editable:
            problems.append(f"-e {text}: an editable install of something not a path")
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement as err:
            problems.append(f"{text}: not a requirement ({err})")
            continue
        name = canonicalize_name(requirement.name)
        if name == THIS:
            problems.append(
                f"{text}: bert-jax is not on the package index; from a checkout: "
                f"pip install -e '.[{','.join(sorted(requirement.extras)) or 'EXTRA'}]'"
            )
            continue
        for constraint in CONSTRAINTS.get(name, []):
            pins = [s.version for s in requirement.specifier if s.operator == "=="]
            if not pins and constraint.specifier:
                problems.append(f"{text}: pyproject.toml has {constraint}; pin a version in it")
            for version in pins:
                if not constraint.specifier.contains(version, prereleases=True):
                    problems.append(f"{text}: outside pyproject.toml's {constraint}")
    return problems


def test_the_pages_have_install_and_make_lines():
    """The collector finds what the pages are known to hold (it would pass on nothing if it
    missed them): the README's extras and the make targets users are pointed at."""
    texts = {line.text for line in INSTALLS}
    for extra in ("tpu", "splitters", "beam"):
        assert any(f".[{extra}]" in text for text in texts), extra
    targets = {line.text.split()[1] for line in MAKES}
    assert {"demo", "test", "docs", "test-tpu", "test-beam", "bench"} <= targets, targets


@pytest.mark.parametrize("line", INSTALLS, ids=str)
def test_an_install_line_works_from_a_checkout(line):
    assert check(line) == [], str(line)


def test_the_checks_catch_what_fails_as_written():
    def problems(text: str) -> list[str]:
        return check(Line("page.md", 1, text))

    assert problems("pip install -e '.[tpu]'") == []
    assert problems("pip install -e .") == []
    assert problems('pip install --no-cache-dir "$(ls /tmp/bert_jax-*.whl)[beam]"') == []
    assert problems("pip install tensorboard  # not a dependency") == []
    assert problems("pip install 'apache-beam[gcp]==2.77.0'") == []
    assert "not on the package index" in problems("pip install 'bert-jax[beam]'")[0]
    assert "no extra ['gpu']" in problems(".venv/bin/pip install -e '.[gpu]'")[0]
    assert (
        "outside pyproject.toml's apache-beam==2.77.0"
        in problems("pip install 'apache-beam[gcp]==2.76.0'")[0]
    )
    assert "pin a version" in problems("pip install apache-beam")[0]
    assert "not this checkout" in problems("pip install -e ../other")[0]


@pytest.mark.parametrize("line", MAKES, ids=str)
def test_a_make_line_names_a_target(line):
    argv = shlex.split(line.text, comments=True)
    done = subprocess.run(
        ["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{line}: {done.stderr.strip()}"


def test_the_readme_install_section_names_every_extra():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    for extra in EXTRAS:
        assert f"`{extra}`" in section, f"README's Install section does not name the {extra} extra"
