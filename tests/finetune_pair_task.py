"""A sentence-pair task in one module, as docs/finetuning.md's "Adding a task" shows: paraphrase
pairs in `DATA/train.tsv` and `DATA/dev.tsv`, one `sentence1<TAB>sentence2<TAB>label` per line,
read by the task's own reader; trained, evaluated and reported as GLUE's tasks are.

A module in bert_jax/finetune/tasks/ would say `TASKS = (TASK,)` and be found by the registry;
this one is registered by the tests that use it (`registry.register(TASK)`)."""

from __future__ import annotations

import os

from bert_jax.finetune.tasks import glue
from bert_jax.runtime import fs


def read(data: str, split: str) -> list[glue.Example]:
    """The examples of `DATA/<split>.tsv`; a missing file or a bad line names itself."""
    path = os.path.join(data, f"{split}.tsv")
    if not fs.isfile(path):
        raise glue.GlueDataError(f"{TASK.name} {split} file not found: {path}")
    examples = []
    for number, line in enumerate(fs.read_bytes(path).decode("utf-8").splitlines(), 1):
        fields = line.split("\t")
        if len(fields) != 3:
            raise glue.GlueDataError(f"{path}:{number}: expected 3 tab-separated columns")
        label = glue.parse_label(TASK, fields[2], f"{path}:{number}")
        examples.append(glue.Example(f"{split}-{number}", fields[0], fields[1], label))
    return examples


TASK = glue.SentenceTask(
    name="tiny-paraphrase",
    metrics=("f1", "accuracy"),  # reported on dev; F1 (of label "1") selects and is plotted
    labels=("0", "1"),
    is_pair=True,
    dev_splits={"dev": "tiny-paraphrase"},
    reader=read,
)
