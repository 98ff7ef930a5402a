"""SWAG (the paper's Table 4): the task, the official CSV files and their four-choice features.

Reading. `--data` is a directory with the official `train.csv`, `val.csv` and (optionally)
`test.csv`, header `,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,
ending2,ending3,label` (test.csv has no `label`). Fields hold commas, quotes and even line breaks,
so the files are read with the `csv` module. A row with another field count than the header, an
empty column it needs or a label outside 0..3 is a `SwagDataError` (one line naming the file and
the data row, counted from 1 after the header).

Features. Each example becomes four sequences, one per ending: `[CLS] sent1 [SEP] sent2 ending_i
[SEP]` (segment 0 for sent1, 1 for the rest), truncated longest-first to `max_seq_length`, as the
paper (and Hugging Face's run_swag) builds them: int32 arrays [N, 4, max_seq_length].
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.tasks.task import CHOICES, Task
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

TASK_NAME = "swag"
TASKS = (
    Task(
        name=TASK_NAME,
        family=CHOICES,
        aliases=("swag/v1", "swag/regular"),
        metrics=("accuracy",),
        # Table 4's recipe (the paper gives no length; 128 holds nearly every SWAG choice).
        defaults={"learning_rate": 2e-5, "batch_size": 16, "epochs": 3.0, "max_seq_length": 128},
        paper=(  # Table 4
            ("BERT-Base (paper, dev)", {"accuracy": 81.6}),
            ("BERT-Large (paper, dev)", {"accuracy": 86.6}),
        ),
    ),
)
NUM_CHOICES = 4
SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}
HEADER = (
    "",
    "video-id",
    "fold-ind",
    "startphrase",
    "sent1",
    "sent2",
    "gold-source",
    "ending0",
    "ending1",
    "ending2",
    "ending3",
    "label",
)
_NEEDED = ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3")


class SwagDataError(UserError):
    """A SWAG file is missing or malformed; the message names the file and row."""


@dataclasses.dataclass(frozen=True)
class SwagExample:
    example_id: str  # the file's first (unnamed) column
    sent1: str
    sent2: str
    endings: tuple[str, ...]
    label: int | None  # None in test.csv


def split_path(data: str, split: str) -> str:
    return os.path.join(data, SPLIT_FILES[split])


def check_files(data: str) -> None:
    """The directory and its train and val files exist (test.csv is optional)."""
    if not fs.isdir(data):
        raise SwagDataError(f"SWAG data directory not found: {data}")
    for split in ("train", "dev"):
        if not fs.isfile(split_path(data, split)):
            raise SwagDataError(f"{data}: no SWAG {split} file {SPLIT_FILES[split]}")


def read_csv(path: str, labelled: bool = True) -> list[SwagExample]:
    """The examples of one official SWAG CSV file (see the module docstring)."""
    if not fs.isfile(path):
        raise SwagDataError(f"SWAG file not found: {path}")
    try:
        text = fs.read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SwagDataError(f"{path}: not UTF-8 text ({error})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise SwagDataError(f"{path}: empty file (expected the header {','.join(HEADER)})")
        columns = {name: index for index, name in enumerate(header)}
        wanted = _NEEDED + (("label",) if labelled else ())
        missing = [name for name in wanted if name not in columns]
        if missing:
            raise SwagDataError(
                f"{path}: header has no column {', '.join(missing)} (expected {','.join(HEADER)})"
            )
        examples = [
            _example(row, columns, len(header), labelled, f"{path}: row {number}")
            for number, row in enumerate(reader, 1)
            if row  # a trailing blank line
        ]
    except csv.Error as error:
        raise SwagDataError(f"{path}: row near line {reader.line_num}: {error}") from None
    if not examples:
        raise SwagDataError(f"{path}: no examples")
    return examples


def _example(
    row: list[str], columns: dict[str, int], width: int, labelled: bool, where: str
) -> SwagExample:
    if len(row) != width:
        raise SwagDataError(f"{where}: expected {width} fields, found {len(row)}")
    empty = [name for name in ("sent1", "ending0") if not row[columns[name]].strip()]
    if empty:
        raise SwagDataError(f"{where}: empty {empty[0]}")
    label = None
    if labelled:
        text = row[columns["label"]].strip()
        if text not in {str(i) for i in range(NUM_CHOICES)}:
            raise SwagDataError(f"{where}: label {text!r} is not one of 0..{NUM_CHOICES - 1}")
        label = int(text)
    return SwagExample(
        example_id=row[0],
        sent1=row[columns["sent1"]],
        sent2=row[columns["sent2"]],
        endings=tuple(row[columns[f"ending{i}"]] for i in range(NUM_CHOICES)),
        label=label,
    )


def read_split(data: str, split: str) -> list[SwagExample] | None:
    """A split's examples; None for a missing test.csv."""
    path = split_path(data, split)
    if split == "test" and not fs.isfile(path):
        return None
    if split == "test":
        # The official test.csv has no label column; a labelled copy is read the same way.
        return read_csv(path, labelled=False)
    return read_csv(path)


def choice_texts(example: SwagExample) -> list[tuple[str, str]]:
    """(first, second) segment of each choice: sent1, then sent2 followed by the ending."""
    return [(example.sent1, f"{example.sent2} {ending}".strip()) for ending in example.endings]


def build_features(
    examples: Sequence[SwagExample], tokenizer: Any, max_seq_length: int
) -> dict[str, np.ndarray]:
    """input_ids/input_mask/segment_ids [N, 4, max_seq_length] and labels [N] (-1 in test)."""
    from bert_jax.data.tokenizers.pair_encoding import encode_pairs

    pairs = [pair for example in examples for pair in choice_texts(example)]
    encoded = encode_pairs(
        tokenizer, [a for a, _ in pairs], [b for _, b in pairs], max_seq_length=max_seq_length
    )
    arrays = {
        key: value.reshape(len(examples), NUM_CHOICES, max_seq_length)
        for key, value in encoded.items()
    }
    arrays["labels"] = np.asarray([-1 if e.label is None else e.label for e in examples], np.int32)
    return arrays
