"""The fine-tuning workdir as an output: its marker, what it holds, and the check before writing.

`bert-jax finetune` and `bert-jax glue` write their results (result.json, the GLUE-server TSVs,
model/, trials/, submission/, results.*, plots/; SQuAD's predictions.json, null_odds.json,
nbest_predictions.json; CoNLL-2003's dev/test_predictions.txt; SWAG's dev/test_predictions.csv;
the checkpoint curve's steps/ and curve.*) into `--workdir`, replacing earlier ones of the same
name. So they write only into a directory that is new, empty or already theirs (it carries
`bert_jax_finetune.json`, or holds a result of an earlier run), never into one holding other files,
the current or home directory, or a pretraining workdir (`runtime.outputs.check_replaceable`).

One run writes into a workdir at a time: `one_writer` holds pretraining's lock
(`training.workdir.WorkdirLock`, `bert-jax.lock`) while a run works, so a second run started on
the same workdir is refused, naming the first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from bert_jax.runtime import fs
from bert_jax.runtime import outputs as files
from bert_jax.runtime.errors import user_path
from bert_jax.training.workdir import LOCK_NAME, WorkdirLock

MARKER = "bert_jax_finetune.json"
_NAMES = (
    MARKER,
    LOCK_NAME,
    "result.json",
    "trials",
    "submission",
    "results.json",
    "results.csv",
    "results.md",
    "plots",
    "model",  # the fine-tuned model (finetuned_model.py)
    # SQuAD and CoNLL-2003 (squad_and_conll.py)
    "predictions.json",
    "null_odds.json",
    "nbest_predictions.json",
    "dev_predictions.txt",
    "test_predictions.txt",
    # SWAG (runs/multiple_choice.py)
    "dev_predictions.csv",
    "test_predictions.csv",
    # the pretraining-step curve (curve.py)
    "steps",
    "curve.json",
    "curve.md",
)


def is_finetune_workdir(path: str) -> bool:
    """Marked, or holding a result of a run from before the marker existed."""
    return any(fs.exists(os.path.join(path, name)) for name in (MARKER, "result.json", "trials"))


KIND = files.OutputKind(
    name="fine-tuning workdir",
    marker=MARKER,
    is_own=is_finetune_workdir,
    holds=lambda name: name in _NAMES or name.endswith(".tsv"),
)


def check_workdir(workdir: str) -> None:
    """Refuses a `workdir` this command must not write into (see the module docstring)."""
    files.check_replaceable(fs.abspath(workdir), KIND, action="write into")


def open_workdir(workdir: str, command: str, writer: bool = True) -> str:
    """Checks `workdir` (see the module docstring), creates and marks it; its absolute path."""
    workdir = fs.abspath(workdir)
    check_workdir(workdir)
    if writer:
        with user_path(workdir, "--workdir", writing=True):
            fs.makedirs(workdir, exist_ok=True)
            marker = os.path.join(workdir, MARKER)
            if not fs.exists(marker):
                files.write_json_atomic(marker, {"written_by": f"bert-jax {command}"})
    return workdir


@contextlib.contextmanager
def one_writer(workdir: str, command: str = "finetune", writer: bool = True) -> Iterator[None]:
    """Holds `workdir`'s lock meanwhile (process 0: `writer`); refuses a workdir this command
    must not write into, or one another run holds. A workdir created here is removed again if
    the run leaves nothing in it but its marker (a failed run leaves no new directory)."""
    if not writer:
        yield
        return
    workdir = fs.abspath(workdir)
    check_workdir(workdir)
    created = not fs.exists(workdir)
    open_workdir(workdir, command)
    try:
        with WorkdirLock(workdir):
            yield
    finally:
        if created and not fs.is_remote(workdir) and set(os.listdir(workdir)) <= {MARKER}:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(workdir, MARKER))
            os.rmdir(workdir)
