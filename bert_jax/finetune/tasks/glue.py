"""GLUE, and any task of one sentence or a sentence pair with a label or a score: the task record
(`SentenceTask`), GLUE's nine tasks, and their readers (a local GLUE directory or TFDS `glue/*`).

A local directory has the standard layout written by the GLUE download script:

    CoLA/{train,dev,test}.tsv        train/dev have NO header: source, label, mark, sentence
    SST-2/{train,dev,test}.tsv       sentence, label
    MRPC/{train,dev,test}.tsv        Quality, #1 ID, #2 ID, #1 String, #2 String (BOM first)
    QQP/{train,dev,test}.tsv         id, qid1, qid2, question1, question2, is_duplicate
    STS-B/{train,dev,test}.tsv       index, genre, ..., sentence1, sentence2, score
    MNLI/{train,dev_matched,dev_mismatched,test_matched,test_mismatched}.tsv
                                     index, ..., sentence1, sentence2, [label1..label5,] gold_label
    QNLI/{train,dev,test}.tsv        index, question, sentence, label
    RTE/, WNLI/ {train,dev,test}.tsv index, sentence1, sentence2, label
    diagnostic/diagnostic.tsv        index, sentence1, sentence2 (AX; predicted with the MNLI model)

Test files differ from train/dev: they lead with an `index` column (QQP's is `id`) and have no label
column, and CoLA's test file has a header where its train/dev files have none. Columns are found by
header name, so these quirks need no special cases beyond CoLA's positional train/dev; every line
must have as many columns as the header. Fields are split on tabs with no quote processing (GLUE
text contains unbalanced quotes), as the original run_classifier does.

Errors name the file and line: a missing file, a wrong column count, a label outside the task's
label set, an unparsable or out-of-range STS-B score.

A task of another source brings its own `reader` (docs/finetuning.md, "Adding a task"); it is
trained, evaluated and reported as GLUE's are.

Why this file is long: a third of it is the table of GLUE tasks (columns, labels, splits, metrics
and the paper's figures of each), which the local-directory and TFDS readers below both follow.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tasks.task import SENTENCE, Task
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

TRAIN = "train"
BENCHMARK = "GLUE"  # what `Task.benchmark` names: the tasks of the official GLUE average


@dataclasses.dataclass(frozen=True)
class Example:
    """One row of a task file. `label` is a label string, an STS-B score, or None (test rows)."""

    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None


@dataclasses.dataclass(frozen=True)
class Columns:
    """Where the fields of a split live: header names, or positions for header-less files."""

    text_a: str | int
    text_b: str | int | None
    label: str | int | None
    index: str | int | None = None
    has_header: bool = True
    num_columns: int | None = None  # required for header-less files


@dataclasses.dataclass(frozen=True, kw_only=True)
class SentenceTask(Task):
    """A task of one sentence or a sentence pair, classified (or scored) on the pooled [CLS].

    `labels` is None for regression (STS-B). `dev_splits` maps each dev split to the name its
    results are reported under (MNLI: `MNLI-m`, `MNLI-mm`); `test_splits` maps each test split to
    the GLUE-server submission file. `reader(data, split)`, when given, returns a split's
    examples (a missing or malformed file a UserError naming it); without one, `data` is a GLUE
    directory (`directory`, `labeled_columns`, `test_columns`) or TFDS (`tfds_name`,
    `tfds_text_fields`).
    """

    family: str = SENTENCE
    labels: tuple[str, ...] | None
    is_pair: bool
    dev_splits: Mapping[str, str]
    test_splits: Mapping[str, str] = dataclasses.field(default_factory=dict)
    diagnostic: bool = False  # the GLUE diagnostic set (AX) is predicted with this task's model
    reader: Callable[[str, str], list[Example]] | None = None
    directory: str | None = None
    labeled_columns: Columns | None = None
    test_columns: Columns | None = None
    tfds_name: str | None = None
    tfds_text_fields: tuple[str, ...] = ()

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_outputs(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    def split_file(self, data_dir: str, split: str) -> str:
        assert self.directory is not None, f"{self.name} has its own reader"
        return os.path.join(data_dir, self.directory, f"{split}.tsv")


def _pair(text_a: str, text_b: str, label: str | None) -> Columns:
    return Columns(text_a=text_a, text_b=text_b, label=label)


def _paper(base: Mapping[str, float], large: Mapping[str, float]):
    """The task's columns of the paper's Table 1 (GLUE test server)."""
    return (("BERT-Base", dict(base)), ("BERT-Large", dict(large)))


_STANDARD_TEST = Columns(text_a="sentence1", text_b="sentence2", label=None, index="index")
# Table 1's average column (over its nine columns; WNLI is not one of them).
PAPER_AVERAGES = {"BERT-Base": 79.6, "BERT-Large": 82.1}

# In the official GLUE order (the order of its average); `sweep_position` is Table 1's.
TASKS: tuple[SentenceTask, ...] = (
    SentenceTask(
        name="CoLA",
        metrics=("matthews_corr",),
        paper=_paper({"CoLA": 52.1}, {"CoLA": 60.5}),
        sweep_position=4,
        report_columns=("CoLA",),
        benchmark=BENCHMARK,
        train_size="8.5k",
        directory="CoLA",
        labels=("0", "1"),
        is_pair=False,
        labeled_columns=Columns(text_a=3, text_b=None, label=1, has_header=False, num_columns=4),
        test_columns=Columns(text_a="sentence", text_b=None, label=None, index="index"),
        dev_splits={"dev": "CoLA"},
        test_splits={"test": "CoLA.tsv"},
        tfds_name="glue/cola",
        tfds_text_fields=("sentence",),
    ),
    SentenceTask(
        name="SST-2",
        metrics=("accuracy",),
        paper=_paper({"SST-2": 93.5}, {"SST-2": 94.9}),
        sweep_position=3,
        report_columns=("SST-2",),
        benchmark=BENCHMARK,
        train_size="67k",
        directory="SST-2",
        labels=("0", "1"),
        is_pair=False,
        labeled_columns=Columns(text_a="sentence", text_b=None, label="label"),
        test_columns=Columns(text_a="sentence", text_b=None, label=None, index="index"),
        dev_splits={"dev": "SST-2"},
        test_splits={"test": "SST-2.tsv"},
        tfds_name="glue/sst2",
        tfds_text_fields=("sentence",),
    ),
    SentenceTask(
        name="MRPC",
        metrics=("f1", "accuracy"),  # F1 of the positive class ("1")
        paper=_paper({"MRPC": 88.9}, {"MRPC": 89.3}),
        sweep_position=6,
        report_columns=("MRPC",),
        benchmark=BENCHMARK,
        train_size="3.5k",
        directory="MRPC",
        labels=("0", "1"),
        is_pair=True,
        labeled_columns=_pair("#1 String", "#2 String", "Quality"),
        test_columns=Columns(text_a="#1 String", text_b="#2 String", label=None, index="index"),
        dev_splits={"dev": "MRPC"},
        test_splits={"test": "MRPC.tsv"},
        tfds_name="glue/mrpc",
        tfds_text_fields=("sentence1", "sentence2"),
    ),
    SentenceTask(
        name="STS-B",
        metrics=("spearman", "pearson"),
        paper=_paper({"STS-B": 85.8}, {"STS-B": 86.5}),
        sweep_position=5,
        report_columns=("STS-B",),
        benchmark=BENCHMARK,
        train_size="5.7k",
        directory="STS-B",
        labels=None,
        is_pair=True,
        labeled_columns=_pair("sentence1", "sentence2", "score"),
        test_columns=_STANDARD_TEST,
        dev_splits={"dev": "STS-B"},
        test_splits={"test": "STS-B.tsv"},
        tfds_name="glue/stsb",
        tfds_text_fields=("sentence1", "sentence2"),
    ),
    SentenceTask(
        name="QQP",
        metrics=("f1", "accuracy"),
        paper=_paper({"QQP": 71.2}, {"QQP": 72.1}),
        sweep_position=1,
        report_columns=("QQP",),
        benchmark=BENCHMARK,
        train_size="363k",
        directory="QQP",
        labels=("0", "1"),
        is_pair=True,
        labeled_columns=_pair("question1", "question2", "is_duplicate"),
        test_columns=Columns(text_a="question1", text_b="question2", label=None, index="id"),
        dev_splits={"dev": "QQP"},
        test_splits={"test": "QQP.tsv"},
        tfds_name="glue/qqp",
        tfds_text_fields=("question1", "question2"),
    ),
    SentenceTask(
        name="MNLI",
        aliases=("MNLI-m", "MNLI-mm"),
        metrics=("accuracy",),
        paper=_paper({"MNLI-m": 84.6, "MNLI-mm": 83.4}, {"MNLI-m": 86.7, "MNLI-mm": 85.9}),
        sweep_position=0,
        report_columns=("MNLI-m", "MNLI-mm"),
        benchmark=BENCHMARK,
        train_size="392k",
        directory="MNLI",
        labels=("contradiction", "entailment", "neutral"),
        is_pair=True,
        labeled_columns=_pair("sentence1", "sentence2", "gold_label"),
        test_columns=_STANDARD_TEST,
        dev_splits={"dev_matched": "MNLI-m", "dev_mismatched": "MNLI-mm"},
        test_splits={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"},
        diagnostic=True,
        tfds_name="glue/mnli",
        tfds_text_fields=("premise", "hypothesis"),
    ),
    SentenceTask(
        name="QNLI",
        metrics=("accuracy",),
        paper=_paper({"QNLI": 90.5}, {"QNLI": 92.7}),
        sweep_position=2,
        report_columns=("QNLI",),
        benchmark=BENCHMARK,
        train_size="108k",
        directory="QNLI",
        labels=("entailment", "not_entailment"),
        is_pair=True,
        labeled_columns=_pair("question", "sentence", "label"),
        test_columns=Columns(text_a="question", text_b="sentence", label=None, index="index"),
        dev_splits={"dev": "QNLI"},
        test_splits={"test": "QNLI.tsv"},
        tfds_name="glue/qnli",
        tfds_text_fields=("question", "sentence"),
    ),
    SentenceTask(
        name="RTE",
        metrics=("accuracy",),
        paper=_paper({"RTE": 66.4}, {"RTE": 70.1}),
        sweep_position=7,
        report_columns=("RTE",),
        benchmark=BENCHMARK,
        train_size="2.5k",
        directory="RTE",
        labels=("entailment", "not_entailment"),
        is_pair=True,
        labeled_columns=_pair("sentence1", "sentence2", "label"),
        test_columns=_STANDARD_TEST,
        dev_splits={"dev": "RTE"},
        test_splits={"test": "RTE.tsv"},
        tfds_name="glue/rte",
        tfds_text_fields=("sentence1", "sentence2"),
    ),
    SentenceTask(  # in the sweep and the GLUE average, not in Table 1
        name="WNLI",
        metrics=("accuracy",),
        sweep_position=8,
        benchmark=BENCHMARK,
        directory="WNLI",
        labels=("0", "1"),
        is_pair=True,
        labeled_columns=_pair("sentence1", "sentence2", "label"),
        test_columns=_STANDARD_TEST,
        dev_splits={"dev": "WNLI"},
        test_splits={"test": "WNLI.tsv"},
        tfds_name="glue/wnli",
        tfds_text_fields=("sentence1", "sentence2"),
    ),
)

# The diagnostic set (AX) is scored with the MNLI model; the GLUE server expects AX.tsv.
DIAGNOSTIC_FILE = os.path.join("diagnostic", "diagnostic.tsv")
DIAGNOSTIC_SUBMISSION = "AX.tsv"
DIAGNOSTIC_COLUMNS = _STANDARD_TEST


class GlueDataError(UserError):
    """A task file is missing or malformed; the message names the file (and line)."""


def get_task(name: str) -> SentenceTask:
    """A sentence task by name, case- and dash-insensitive, with or without a `glue/` prefix."""
    return registry.get_sentence_task(name)  # type: ignore[return-value]


def parse_label(task: SentenceTask, raw: str, where: str) -> str | float:
    """A label string checked against the task's label set, or an STS-B score in [0, 5]."""
    if task.is_regression:
        try:
            score = float(raw)
        except ValueError:
            raise GlueDataError(f"{where}: {task.name} score {raw!r} is not a number") from None
        if not 0.0 <= score <= 5.0:
            raise GlueDataError(f"{where}: {task.name} score {score} is outside [0, 5]")
        return score
    assert task.labels is not None
    if raw not in task.labels:
        raise GlueDataError(
            f"{where}: label {raw!r} is not one of {task.name}'s labels {list(task.labels)}"
        )
    return raw


def _split_line(line: str) -> list[str]:
    return line.rstrip("\r\n").split("\t")


def _column_index(columns: Columns, field: str, header: Sequence[str] | None, path: str) -> int:
    key = getattr(columns, field)
    if isinstance(key, int):
        return key
    assert header is not None
    if key not in header:
        raise GlueDataError(
            f"{path}:1: header has no column {key!r} (columns: {list(header)}); is this the "
            "standard GLUE layout?"
        )
    return list(header).index(key)


def read_tsv(
    path: str, task: SentenceTask, columns: Columns, labeled: bool, split: str
) -> list[Example]:
    """Examples of one GLUE file. `labeled=False` reads test files (labels are None)."""
    if not fs.isfile(path):
        raise GlueDataError(
            f"{task.name} {split} file not found: {path} (expected the standard GLUE layout, "
            f"e.g. {task.directory}/{split}.tsv)"
        )
    # utf-8-sig: MRPC's header starts with a byte-order mark. No newline translation.
    lines = fs.read_bytes(path).decode("utf-8-sig").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header: list[str] | None = None
    first_data_line = 0
    if columns.has_header:
        if not lines:
            raise GlueDataError(f"{path}: file is empty (expected a header line)")
        header = _split_line(lines[0])
        first_data_line = 1
        num_columns = len(header)
    else:
        assert columns.num_columns is not None
        num_columns = columns.num_columns
    text_a = _column_index(columns, "text_a", header, path)
    text_b = None if columns.text_b is None else _column_index(columns, "text_b", header, path)
    label = _column_index(columns, "label", header, path) if labeled else None
    index = None if columns.index is None else _column_index(columns, "index", header, path)

    examples = []
    for line_number in range(first_data_line, len(lines)):
        where = f"{path}:{line_number + 1}"
        fields = _split_line(lines[line_number])
        if len(fields) != num_columns:
            raise GlueDataError(
                f"{where}: expected {num_columns} tab-separated columns"
                f"{' (as in the header)' if header else ''}, found {len(fields)}"
            )
        guid = fields[index] if index is not None else f"{split}-{line_number - first_data_line}"
        examples.append(
            Example(
                guid=guid,
                text_a=fields[text_a],
                text_b=None if text_b is None else fields[text_b],
                label=None if label is None else parse_label(task, fields[label], where),
            )
        )
    if not examples:
        raise GlueDataError(f"{path}: no examples")
    return examples


def is_test_split(split: str) -> bool:
    return split.startswith("test") or split == "diagnostic"


def read_split(data: str, task: SentenceTask | str, split: str) -> list[Example]:
    """Examples of `split` ("train", "dev", "dev_matched", "test", "diagnostic", ...).

    `data` is a local GLUE directory, or "tfds" / "tfds:DATA_DIR" for TFDS `glue/*`.
    """
    task = get_task(task) if isinstance(task, str) else task
    valid = {TRAIN, *task.dev_splits, *task.test_splits}
    if task.diagnostic:
        valid.add("diagnostic")
    if split not in valid:
        raise UserError(f"{task.name} has no split {split!r}; it has {sorted(valid)}")
    if task.reader is not None:
        return _checked(task, split, task.reader(data, split))
    if data == "tfds" or data.startswith("tfds:"):
        return read_tfds(task, split, data_dir=data[5:] or None)
    if split == "diagnostic":
        path = os.path.join(data, DIAGNOSTIC_FILE)
        return read_tsv(path, task, DIAGNOSTIC_COLUMNS, labeled=False, split=split)
    test = is_test_split(split)
    columns = task.test_columns if test else task.labeled_columns
    return read_tsv(task.split_file(data, split), task, columns, labeled=not test, split=split)


def _checked(task: SentenceTask, split: str, examples: Sequence[Example]) -> list[Example]:
    """A task's own reader's examples, each label checked as the GLUE readers check theirs."""
    if not examples:
        raise GlueDataError(f"{task.name} {split}: the reader found no examples")
    checked = []
    for example in examples:
        if example.label is not None:
            where = f"{task.name} {split} example {example.guid}"
            label = parse_label(task, str(example.label), where)
            example = dataclasses.replace(example, label=label)
        checked.append(example)
    return checked


def available_test_splits(data: str, task: SentenceTask) -> list[str]:
    """Test splits (and MNLI's diagnostic set) present in `data`; TFDS (and a task with its own
    reader) always has them."""
    splits = list(task.test_splits)
    if task.diagnostic:
        splits.append("diagnostic")
    if task.reader is not None or data == "tfds" or data.startswith("tfds:"):
        return splits
    present = []
    for split in splits:
        path = (
            os.path.join(data, DIAGNOSTIC_FILE)
            if split == "diagnostic"
            else task.split_file(data, split)
        )
        if fs.isfile(path):
            present.append(split)
    return present


def check_task_files(data: str, task: SentenceTask) -> None:
    """Fail early, naming the file, when a local GLUE directory lacks a train or dev file (a
    task with its own reader checks its files as it reads them)."""
    if task.reader is not None or data == "tfds" or data.startswith("tfds:"):
        return
    if not fs.isdir(data):
        raise GlueDataError(f"GLUE data directory not found: {data}")
    for split in (TRAIN, *task.dev_splits):
        path = task.split_file(data, split)
        if not fs.isfile(path):
            raise GlueDataError(
                f"{task.name} {split} file not found: {path} (expected the standard GLUE "
                f"layout, e.g. {task.directory}/{split}.tsv)"
            )


def submission_file(task: SentenceTask, split: str) -> str:
    return DIAGNOSTIC_SUBMISSION if split == "diagnostic" else task.test_splits[split]


# ------------------------------------------------------------------------------------------------
# TFDS glue/*
# ------------------------------------------------------------------------------------------------


def tfds_split_name(split: str) -> str:
    """Our split names -> TFDS's (`dev` is `validation`; MNLI's suffixes carry over)."""
    if split.startswith("dev"):
        return "validation" + split[3:]
    if split == "diagnostic":
        return "test"
    return split


def example_from_tfds(
    task: SentenceTask,
    record: dict,
    label_names: Sequence[str] | None,
    labeled: bool,
    where: str,
) -> Example:
    """An Example from one TFDS `glue/*` record (NumPy values, as `tfds.as_numpy` yields).

    TFDS stores labels as class indices; `label_names` (the dataset's ClassLabel names) turn them
    into the task's labels. TFDS orders MNLI as (entailment, neutral, contradiction) and names the
    binary classes (e.g. not_equivalent/equivalent); those binary names map to GLUE's "0"/"1" by
    index, the NLI names map by name.
    """

    def text(field: str) -> str:
        value = record[field]
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    text_a = text(task.tfds_text_fields[0])
    text_b = text(task.tfds_text_fields[1]) if len(task.tfds_text_fields) > 1 else None
    label: str | float | None = None
    if labeled:
        raw = record["label"]
        if task.is_regression:
            label = parse_label(task, str(float(raw)), where)
        else:
            assert task.labels is not None and label_names is not None
            index = int(raw)
            if not 0 <= index < len(label_names):
                raise GlueDataError(f"{where}: label index {index} outside {list(label_names)}")
            name = label_names[index]
            label = parse_label(task, name if name in task.labels else str(index), where)
    return Example(guid=str(int(record["idx"])), text_a=text_a, text_b=text_b, label=label)


def read_tfds(task: SentenceTask, split: str, data_dir: str | None = None) -> list[Example]:
    """Examples from TFDS `glue/*` (imports TensorFlow Datasets lazily)."""
    import tensorflow_datasets as tfds

    name = "glue/ax" if split == "diagnostic" else task.tfds_name
    tfds_split = tfds_split_name(split)
    builder = tfds.builder(name, data_dir=data_dir)
    builder.download_and_prepare()
    label_feature = builder.info.features["label"]
    label_names = getattr(label_feature, "names", None)
    labeled = not is_test_split(split)
    dataset = builder.as_dataset(split=tfds_split)
    return [
        example_from_tfds(task, record, label_names, labeled, f"tfds {name}[{tfds_split}] #{i}")
        for i, record in enumerate(tfds.as_numpy(dataset))
    ]
