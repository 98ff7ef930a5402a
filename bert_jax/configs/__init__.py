"""The configs that ship with bert-jax, named without a path.

`--config bert:base` (or `bert:tiny`, `modernbert:base`, `demo`, `paper/table5_no_nsp`,
`paper/table8:0_20_80`) reads the file of that name under `bert_jax/configs/` (`.py` may be
added) with the argument after the colon, wherever bert-jax is installed; a file path
(`configs/bert.py:base`, `my_run.py`) is read as a file. `configs/` in a checkout holds thin
files that load these.

bert.py    the paper's recipe at each size (`bert:SIZE`; base and large are the paper's runs)
modernbert.py  ModernBERT's recipe at each size (`modernbert:SIZE`; base and large published)
demo.py    `make demo`: BERT-Tiny on the embedded corpus in minutes on a CPU
paper/     the paper's experiments (Tables 5, 6 and 8), each a few settings over bert.py's
"""

from __future__ import annotations

import os

from bert_jax.runtime.errors import UserError

FOLDER = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The packaged configs: `bert`, `demo`, `paper/table5_ltr`, ..."""
    found = []
    for folder, subfolders, files in os.walk(FOLDER):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(("_", ".")))
        relative = os.path.relpath(folder, FOLDER)
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                parts = [] if relative == "." else relative.split(os.sep)
                found.append("/".join([*parts, name[:-3]]))
    return sorted(found)


def _packaged(name: str) -> str | None:
    """The file of the packaged config `name` (`bert`, `paper/table8.py`), or None."""
    name = name.removesuffix(".py")
    return os.path.join(FOLDER, *name.split("/")) + ".py" if name in names() else None


def resolve(spec: str, flag: str = "--config") -> str:
    """`FILE[:ARG]` as a path ml_collections can load: an existing file stays as it is; a name
    without a path (`bert:base`, `demo`, `paper/table5_ltr`) is the packaged config of that
    name. UserError otherwise."""
    path, sep, arg = spec.partition(":")
    if os.path.isfile(path):
        return spec
    packaged = _packaged(path)
    if packaged is not None:
        return packaged + sep + arg
    hint = ""
    # configs/bert.py or configs/paper/table8.py outside a checkout
    shipped = [name for name in names() if path.removesuffix(".py").endswith(f"/{name}")]
    if shipped and "/" not in shipped[0]:
        sized = ("bert", "modernbert")  # get_config(SIZE)
        top = ", ".join(f"{n}:SIZE" if n in sized else n for n in names() if "/" not in n)
        hint = f" (the configs that ship with bert-jax are named without a path: {top})"
    elif shipped:
        hint = f" (it ships with bert-jax, named without a path: {flag} {shipped[0]}{sep}{arg})"
    raise UserError(f"{flag} {spec}: no such file{hint}")
