"""Every fine-tuning task by name: the one list `bert-jax finetune`, `glue`, the curve and the
reports look tasks up in.

The tasks are found, at the first look-up, in the modules of this package: each module that
defines `TASKS` (a tuple of `task.Task`) contributes them, in its order (so adding a task of a
known family is one module here). A task defined elsewhere (a script, a test) joins with
`register(task)`. A name (or alias) may be taken once per kind of run: CoNLL-2003 is one name for
its fine-tuned and its feature-based (`--features`) task.
"""

from __future__ import annotations

import importlib
import pkgutil

from bert_jax.finetune.tasks.task import SENTENCE, Task, name_key
from bert_jax.runtime.errors import UserError

_PACKAGE = __name__.rpartition(".")[0]
_TASKS: list[Task] = []
_found = False


def _discover() -> None:
    """Import this package's modules once and register their `TASKS`."""
    global _found
    if _found:
        return
    _found = True
    package = importlib.import_module(_PACKAGE)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{_PACKAGE}.{info.name}")
        for task in getattr(module, "TASKS", ()):
            register(task)


def register(task: Task) -> Task:
    """Add `task` to the registry (returns it); a name or alias already taken is an error."""
    _discover()
    for other in _TASKS:
        shared = task.keys & other.keys
        if shared and other.feature_based == task.feature_based:
            raise ValueError(f"task {task.name}: the name {sorted(shared)[0]!r} is {other.name}'s")
    _TASKS.append(task)
    return task


def unregister(task: Task) -> None:
    """Remove a task added with `register` (tests clean up with it)."""
    _TASKS.remove(task)


def all_tasks() -> tuple[Task, ...]:
    """Every task: the default sweep's first, in its order, then the others as registered."""
    _discover()
    return tuple(sorted(_TASKS, key=_sweep_key))


def _sweep_key(task: Task) -> tuple[bool, int]:
    return task.sweep_position is None, task.sweep_position or 0


def names() -> tuple[str, ...]:
    """The tasks' names (CoNLL-2003 once), as `finetune --task` takes them."""
    return tuple(dict.fromkeys(task.name for task in all_tasks()))


def find(name: str, feature_based: bool = False) -> Task | None:
    key = name_key(name)
    for task in all_tasks():
        if key in task.keys and task.feature_based == feature_based:
            return task
    return None


def get(name: str, feature_based: bool = False) -> Task:
    """The task `name` (any spelling); with `feature_based`, its `--features` variant."""
    found = find(name, feature_based)
    if found is not None:
        return found
    if feature_based and find(name) is not None:
        names_ = ", ".join(t.name for t in all_tasks() if t.feature_based)
        raise UserError(f"--features is the feature-based {names_} tagger; not for {name}")
    raise UserError(f"unknown task {name!r}; choose one of {', '.join(names())}")


def get_sentence_task(name: str) -> Task:
    """A task of `bert-jax glue` (a classifier on the pooled [CLS]) by name."""
    found = find(name)
    if found is None or found.family != SENTENCE:
        choices = [t.name for t in all_tasks() if t.family == SENTENCE]
        raise UserError(f"unknown GLUE task {name!r}; choose one of {', '.join(choices)}")
    return found


def sweep_order() -> tuple[str, ...]:
    """`bert-jax glue`'s default tasks, in the paper's Table 1 order."""
    return tuple(task.name for task in all_tasks() if task.sweep_position is not None)


def table_tasks() -> tuple[Task, ...]:
    """The tasks with columns in results.md's Table 1, in its order."""
    return tuple(task for task in all_tasks() if task.report_columns)


def benchmark_tasks(benchmark: str) -> tuple[Task, ...]:
    """The tasks of a benchmark (`GLUE`), in the order they were registered."""
    _discover()
    return tuple(task for task in _TASKS if task.benchmark == benchmark)
