"""No docstring or comment in bert_jax/ points at what is gone (issue 72, item 4).

Three spellings are pointers:
- a dotted name in backticks whose first part is a bert_jax module or package
  (``manifest.BEFORE_RECORDED``, `events.EVENTS`, ``bert_jax.data.layout``): some module or
  package of that name holds the rest (a submodule, a name its top level defines or imports,
  or a member of one of its classes: `trainer.abstract_state` for an object of trainer.py's
  class; what follows that name is not followed);
- a dotted name in backticks whose first part is no module but whose second is a distinctive
  name (with an underscore or a capital) that a bert_jax module defines
  (``prepare.prepare_cached``: `prepare_cached` is cached.py's now): a pointer at something that
  moved, named by its old module;
- a file name (`records/manifest.py`, `stage.py`): a file of the repository ends with it.
What cannot be told from a variable by its spelling is left out: a module name that is also the
usual name of a variable or a config section (`settings.packing`, `model.vocab_size`) is a pointer
only where the rest is a constant or a submodule (`settings.DERIVED`); a module's import alias
(`files.check_replaceable` for runtime/outputs.py, imported `as files`) is that module; `self.x`
and other libraries' names are never pointers; a few files of other projects are named on
purpose (`EXTERNAL_FILES`)."""

from __future__ import annotations

import ast
import functools
import io
import os
import pathlib
import re
import tokenize

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "bert_jax"
# Files of other projects that docstrings name on purpose: google-research/bert's scripts (the
# reference this code follows), a file of JAX's source, and a config a user would write.
EXTERNAL_FILES = {
    "create_pretraining_data.py",
    "run_pretraining.py",
    "modeling.py",
    "extract_features.py",
    "jax/_src/pallas/mosaic/tpu_info.py",
    "my_run.py",
}
# Module names that are also the usual names of a variable, a config section or a parameter
# tree's root: `settings.x`, `config.model.x`, `model.type` (a tokenizer file's key),
# `data.train`, `bert.pooler` (a checkpoint's parameters).
VARIABLE_LIKE = frozenset({"settings", "config", "model", "data", "bert"})
# First parts that are never a bert_jax module: an object's own attributes, and other libraries
# (`safetensors.numpy.save_file`, `transformers.BertForPreTraining`).
NOT_MODULES = frozenset(
    {"self", "cls", "np", "jnp", "jax", "tf", "torch", "flax", "nn", "os"}
    | {"transformers", "safetensors"}
)
# A dotted name ending in a file's extension is a file: FILE checks it.
EXTENSIONS = frozenset({"py", "json", "jsonl", "md", "txt", "yaml", "yml", "gz", "csv", "npz"})
DOTTED = re.compile(r"`{1,2}([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
FILE = re.compile(r"(?<![\w.-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_]\w*\.py)\b")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def _source(module: str) -> str:
    return MODULES[module].read_text(encoding="utf-8")


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_source(module))


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _statements(body: list[ast.stmt], into_definitions: bool = True):
    """Every statement of `body` and of the blocks inside it (`if`, `try`, `with`, loops; the
    bodies of functions and classes too unless `into_definitions` is False): far fewer nodes
    than `ast.walk`, which visits every expression."""
    for node in body:
        yield node
        if isinstance(node, _DEFINITIONS) and not into_definitions:
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield from _statements(block, into_definitions)


@functools.cache
def _top_names(module: str) -> frozenset[str]:
    """What a module's top level defines or imports (inside `if` / `try` too)."""
    names = set()
    for node in _statements(_tree(module).body, into_definitions=False):
        if isinstance(node, _DEFINITIONS):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def aliases(tree: ast.Module) -> dict[str, str]:
    """alias -> the bert_jax module a module imports under it (`import outputs as files`)."""
    found = {}
    for node in _statements(tree.body):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_jax"):
            for alias in node.names:
                if alias.asname and f"{node.module}.{alias.name}" in MODULES:
                    found[alias.asname] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            found |= {a.asname: a.name for a in node.names if a.asname and a.name in MODULES}
    return found


def _distinctive(name: str) -> bool:
    """A name no variable is likely to share: with an inner underscore, or a capital."""
    return "_" in name.strip("_") or name != name.lower()


@functools.cache
def _defined_where() -> dict[str, tuple[str, ...]]:
    """name -> the modules whose top level defines it (a function, a class, an assignment)."""
    where: dict[str, list[str]] = {}
    for module in MODULES:
        for node in _tree(module).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                where.setdefault(name, []).append(module)
    return {name: tuple(modules) for name, modules in where.items()}


@functools.cache
def _members(module: str) -> frozenset[str]:
    """What the classes of a module hold (methods, fields): `spec.peer_rng_impl` is an object
    of the module's class, spelled as the module."""
    names = set()
    for node in _tree(module).body:
        if isinstance(node, ast.ClassDef):
            for item in _statements(node.body, into_definitions=False):
                if isinstance(item, _DEFINITIONS):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return frozenset(names)


def _holds(module: str, rest: list[str]) -> bool:
    """Whether `module` holds `rest`: submodules, then a name at the top level or a member of
    one of its classes."""
    for part in rest:
        if f"{module}.{part}" in MODULES:
            module = f"{module}.{part}"
            continue
        return part in _top_names(module) or part in _members(module)
    return True


def problem(name: str, imported_as: dict[str, str] | None = None) -> str | None:
    """Why the dotted `name` points at nothing, or None (it exists, or it is no pointer);
    `imported_as`: the aliases of the module where it is written (`aliases`)."""
    parts = name.split(".")
    if parts[0] == "bert_jax":
        return None if _holds("bert_jax", parts[1:]) else "no such module or name"
    if parts[0] in NOT_MODULES or parts[-1] in EXTENSIONS:
        return None
    named = [m for m in MODULES if m.rsplit(".", 1)[-1] == parts[0]]
    if imported_as and parts[0] in imported_as:
        named.append(imported_as[parts[0]])
    if not named:
        if parts[0] in VARIABLE_LIKE or not _distinctive(parts[1]):
            return None
        moved = _defined_where().get(parts[1])
        if moved and not parts[0].startswith("_") and parts[0].islower():
            homes = ", ".join(m.removeprefix("bert_jax.") for m in moved)
            return f"no module {parts[0]}; {parts[1]} is in {homes}"
        return None
    if parts[0] in VARIABLE_LIKE:
        submodule = any(f"{m}.{parts[1]}" in MODULES for m in named)
        if not (submodule or parts[1].isupper()):
            return None
    if any(_holds(module, parts[1:]) for module in named):
        return None
    return f"no {parts[1]} in {' or '.join(m.removeprefix('bert_jax.') for m in named)}"


def texts(source: str, tree: ast.Module):
    """(line, text) of every comment and docstring of a module's source."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in [tree, *(n for n in _statements(tree.body) if isinstance(n, _DEFINITIONS))]:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            yield node.body[0].lineno, doc


@functools.cache
def _repository_files() -> frozenset[str]:
    """Every file's path in the repository, and each of its tails (`records/manifest.py`,
    `manifest.py`)."""
    found = set()
    for folder, folders, names in os.walk(REPO):
        folders[:] = [f for f in folders if not f.startswith(".") and f != "site"]
        for name in names:
            parts = pathlib.Path(folder, name).relative_to(REPO).parts
            found |= {"/".join(parts[i:]) for i in range(len(parts))}
    return frozenset(found)


def _file_exists(name: str) -> bool:
    return name in _repository_files()


def gone(source: str, tree: ast.Module | None = None) -> list[str]:
    """`line: pointer (why)` for every pointer of a module's comments and docstrings at nothing
    (`tree`: the source parsed, where it already is)."""
    found = []
    tree = ast.parse(source) if tree is None else tree
    imported_as = aliases(tree)
    for line, text in texts(source, tree):
        for match in DOTTED.finditer(text):
            why = problem(match.group(1), imported_as)
            if why:
                found.append(f"{line}: {match.group(1)} ({why})")
        for match in FILE.finditer(text):
            name = match.group(1)
            if name not in EXTERNAL_FILES and not _file_exists(name):
                found.append(f"{line}: {name} (no such file)")
    return found


def test_no_docstring_or_comment_points_at_what_is_gone():
    found = [
        f"{path.relative_to(REPO)}:{entry}"
        for module, path in MODULES.items()
        for entry in gone(_source(module), _tree(module))
    ]
    assert not found, "pointers at what does not exist:\n" + "\n".join(found)


def test_the_walk_catches_what_is_gone_and_passes_what_is_there():
    source = (
        '"""Read by `manifest.BEFORE_RECORDED` and ``bert_jax.data.layout``, as\n'
        "`settings.packing` and `model.vocab_size` say, after google-research/bert's\n"
        'create_pretraining_data.py; see launch/events.py."""\n'
        "# Made by ``prepare.prepare_cached``; checked by `manifest.NO_SUCH_NAME`, then\n"
        "# by `settings.GONE` and ``bert_jax.data.gone``, in `records/gone.py`.\n"
    )
    settings_modules = [m for m in MODULES if m.rsplit(".", 1)[-1] == "settings"]
    assert gone(source) == [
        "4: prepare.prepare_cached (no module prepare; prepare_cached is in "
        "data.preparation.cached)",
        "4: manifest.NO_SUCH_NAME (no NO_SUCH_NAME in data.records.manifest)",
        "5: settings.GONE (no GONE in "
        + " or ".join(m.removeprefix("bert_jax.") for m in settings_modules)
        + ")",
        "5: bert_jax.data.gone (no such module or name)",
        "5: records/gone.py (no such file)",
    ]
