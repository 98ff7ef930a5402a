"""The configs and the TPU price table that ship with bert-jax, named without a path.

`--config bert:base` (or `bert:tiny`, `demo`) reads `bert_jax/configs/bert.py` with the argument
`base`, wherever bert-jax is installed; a file path (`configs/bert.py:base`, `my_run.py`) is read
as a file. `configs/` in a checkout holds thin files that load these.
"""

from __future__ import annotations

import os

from bert_jax.runtime.errors import UserError

FOLDER = os.path.dirname(os.path.abspath(__file__))
# `plan`'s on-demand prices per chip-hour (`plan --prices` names another file).
TPU_PRICES = os.path.join(FOLDER, "tpu_prices.json")


def names() -> list[str]:
    """The packaged configs: `bert`, `demo`."""
    return sorted(
        name[:-3] for name in os.listdir(FOLDER) if name.endswith(".py") and name != "__init__.py"
    )


def resolve(spec: str, flag: str = "--config") -> str:
    """`FILE[:ARG]` as a path ml_collections can load: an existing file stays as it is; a bare
    name (`bert:base`, `demo`) is the packaged config of that name. UserError otherwise."""
    path, sep, arg = spec.partition(":")
    if os.path.isfile(path):
        return spec
    if path and os.sep not in path and "/" not in path:
        packaged = os.path.join(FOLDER, path if path.endswith(".py") else f"{path}.py")
        if os.path.basename(packaged) != "__init__.py" and os.path.isfile(packaged):
            return packaged + sep + arg
    hint = ""
    if os.path.basename(path).removesuffix(".py") in names():  # configs/bert.py outside a checkout
        shipped = ", ".join(f"{name}:SIZE" if name == "bert" else name for name in names())
        hint = f" (the configs that ship with bert-jax are named without a path: {shipped})"
    raise UserError(f"{flag} {spec}: no such file{hint}")
