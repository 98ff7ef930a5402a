"""The `bert-jax pretrain` arguments a launcher forwards (after `--`): read, never rewritten.

A user may spell a flag's value either way, `--config configs/bert.py:base` or
`--config=configs/bert.py:base`, and `pretrain` accepts both. A launcher that looks inside the
arguments (the --workdir to watch, the --config to plan, the keys a plan must not override) reads
them through `joined`, so both spellings mean the same; what it forwards is what the user typed.
"""

from __future__ import annotations

from collections.abc import Sequence


def _is_value(token: str) -> bool:
    """`pretrain` takes no positional arguments, so a token after a flag that is not itself a
    flag is that flag's value (a negative number too)."""
    if not token.startswith("-"):
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def joined(pretrain_args: Sequence[str]) -> list[str]:
    """Each flag with its value as one `--flag=value` token; a flag without a value (a boolean
    such as `--dry-run`) stays as it is."""
    out: list[str] = []
    i = 0
    while i < len(pretrain_args):
        arg = pretrain_args[i]
        if (
            arg.startswith("-")
            and "=" not in arg
            and i + 1 < len(pretrain_args)
            and _is_value(pretrain_args[i + 1])
        ):
            out.append(f"{arg}={pretrain_args[i + 1]}")
            i += 2
        else:
            out.append(arg)
            i += 1
    return out


def _name(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("-")


def value_of(pretrain_args: Sequence[str], name: str) -> str | None:
    """The value given to `--NAME` (the last one when given twice), or None."""
    found = None
    for arg in joined(pretrain_args):
        if _name(arg) == name and "=" in arg:
            found = arg.split("=", 1)[1]
    return found


def config_args(pretrain_args: Sequence[str]) -> list[str]:
    """The `--config=FILE[:ARG]` and `--config.KEY=VALUE` arguments (what `plan` reads), in the
    order given."""
    return [
        arg
        for arg in joined(pretrain_args)
        if _name(arg) == "config" or _name(arg).startswith("config.")
    ]
