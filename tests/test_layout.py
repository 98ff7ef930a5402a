"""The package's shape, read from its source: no import circles, only the command line on top,
library files short enough to read (or saying at their top why not)."""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bert_jax")
MAX_LINES = 475  # "about 450" lines; a longer file states why at its top
LONG_FILE_MARK = "Why this file is long:"


def _modules() -> dict[str, str]:
    """Module name -> file path for every module of the package."""
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def _imports(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules that `module` imports, at its top or inside a function."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                name = f"{base}.{alias.name}"
                targets.add(name if name in modules else base)
    return {t for t in targets if t in modules and t != module}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _by_folder(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with each subpackage (`bert_jax.data`, `bert_jax.convert`, ...) as one node."""

    def node(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(node(module), set()).update(
            node(t) for t in targets if node(t) != node(module)
        )
    return folded


def test_the_import_graph_has_no_circle():
    graph = _graph()
    assert _circles(graph) == []
    assert _circles(_by_folder(graph)) == [], "a subpackage and a module import each other"


def test_only_the_command_line_imports_the_command_line():
    def is_cli(name: str) -> bool:
        return name == "bert_jax.cli" or name.startswith("bert_jax.cli.")

    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if not is_cli(module)
        for target in targets
        if is_cli(target)
    )
    assert upward == []


def test_library_files_are_short_or_say_why():
    long_files = []
    for module, path in sorted(_modules().items()):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.count("\n")
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_LINES and LONG_FILE_MARK not in docstring:
            long_files.append(f"{module}: {lines} lines")
    assert long_files == [], f"over {MAX_LINES} lines without '{LONG_FILE_MARK}' at the top"


@pytest.mark.parametrize(
    "graph, circles",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [["a", "b", "c"]]),
    ],
)
def test_circle_finder(graph, circles):
    assert _circles(graph) == circles


def _readme_layout(page: str = os.path.join("docs", "architecture.md")) -> list[str]:
    """The entries of a page's `bert_jax/` block (the manual's Architecture page by default), in
    their order."""
    with open(os.path.join(os.path.dirname(ROOT), page), encoding="utf-8") as f:
        text = f.read()
    block = text.split("\nbert_jax/", 1)[1].split("\nconfigs/", 1)[0].split("\n```", 1)[0]
    return re.findall(r"^  (\w+)(?:\.py|/)", block, flags=re.MULTILINE)


def test_the_readme_layout_lists_every_module_in_import_order():
    listed = _readme_layout()

    def entry(module: str) -> str:
        return module.split(".")[1]

    modules = {entry(m) for m in _modules() if m != "bert_jax"}
    assert sorted(listed) == sorted(modules), "docs/architecture.md's block and bert_jax/ differ"
    position = {name: i for i, name in enumerate(listed)}
    later = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module != "bert_jax"
        for target in targets
        if position[entry(target)] > position[entry(module)]
    )
    assert later == [], "docs/architecture.md lists an entry before one it imports"


def test_the_readme_house_lists_every_package_in_import_order():
    """README's short picture of the house: every package of bert_jax/, in the manual's order."""
    packages = [entry for entry in _readme_layout() if os.path.isdir(os.path.join(ROOT, entry))]
    assert _readme_layout("README.md") == packages
