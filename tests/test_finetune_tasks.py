"""GLUE readers on fixture files in the exact GLUE layout (quirks included), TFDS records, and the
errors for missing files, wrong column counts and labels outside a task's label set."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from bert_jax.finetune.tasks import glue as tasks
from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tasks.glue import Example, GlueDataError
from tests.glue_fixtures.tiny import GLUE_DIR

# (task, split) -> (number of examples, first example) for every file of the fixture directory.
EXPECTED = {
    ("CoLA", "train"): (12, Example("train-0", "The cat sat on the mat.", None, "1")),
    ("CoLA", "dev"): (5, Example("dev-0", "My brother likes green apples.", None, "1")),
    ("CoLA", "test"): (3, Example("0", "The book was read by the girl.", None, None)),
    ("SST-2", "train"): (
        12,
        Example("train-0", "a gorgeous , witty , seductive movie . ", None, "1"),
    ),
    ("SST-2", "test"): (3, Example("0", "a witty delight", None, None)),
    ("MRPC", "train"): (
        8,
        Example("train-0", "He said the plan was good.", "He stated that the plan was good.", "1"),
    ),
    ("MRPC", "test"): (3, Example("0", "The firm grew.", "The firm expanded.", None)),
    ("QQP", "train"): (
        8,
        Example("train-0", "How do I learn Python?", "What is the best way to learn Python?", "1"),
    ),
    ("QQP", "test"): (3, Example("0", "How do I swim?", "What is the best way to swim?", None)),
    ("STS-B", "train"): (
        8,
        Example("train-0", "A plane is taking off.", "An air plane is taking off.", 5.0),
    ),
    ("STS-B", "test"): (3, Example("0", "A bird is flying.", "A bird flies.", None)),
    ("MNLI", "train"): (
        9,
        Example("train-0", "The man is sleeping on the couch.", "A man is asleep.", "entailment"),
    ),
    ("MNLI", "dev_matched"): (
        3,
        Example("dev_matched-0", "A dog runs on the beach.", "An animal is outside.", "entailment"),
    ),
    ("MNLI", "dev_mismatched"): (
        4,
        Example(
            "dev_mismatched-0",
            "The letter was sent on Friday.",
            "The letter was mailed.",
            "entailment",
        ),
    ),
    ("MNLI", "test_matched"): (2, Example("0", "A man sings.", "Someone is singing.", None)),
    ("MNLI", "test_mismatched"): (3, Example("0", "The plan failed.", "The plan worked.", None)),
    ("MNLI", "diagnostic"): (
        2,
        Example("0", "The cat sat on the mat.", "The cat did not sit on the mat.", None),
    ),
    ("QNLI", "train"): (
        6,
        Example(
            "train-0", "What color is the sky?", "The sky is blue on a clear day.", "entailment"
        ),
    ),
    ("QNLI", "test"): (2, Example("0", "What is water?", "Water is a liquid.", None)),
    ("RTE", "dev"): (
        3,
        Example("dev-0", "He lives in Berlin.", "He lives in Germany.", "entailment"),
    ),
    ("RTE", "test"): (2, Example("0", "The door is open.", "The door is not closed.", None)),
    ("WNLI", "train"): (
        4,
        Example(
            "train-0",
            "The trophy did not fit in the case because it was too big.",
            "The trophy was too big.",
            "1",
        ),
    ),
    ("WNLI", "test"): (1, Example("0", "Sam hugged Tom because he was sad.", "Tom was sad.", None)),
}


@pytest.mark.parametrize("task_name,split", sorted(EXPECTED))
def test_reader_parses_fixture(task_name, split):
    count, first = EXPECTED[(task_name, split)]
    examples = tasks.read_split(GLUE_DIR, task_name, split)
    assert len(examples) == count
    assert examples[0] == first


@pytest.mark.parametrize("task_name", registry.sweep_order())
def test_every_split_of_every_task_reads_with_labels_in_the_label_set(task_name):
    spec = tasks.get_task(task_name)
    for split in ("train", *spec.dev_splits):
        examples = tasks.read_split(GLUE_DIR, spec, split)
        for example in examples:
            assert example.text_a and (example.text_b is not None) == spec.is_pair
            if spec.is_regression:
                assert 0.0 <= example.label <= 5.0
            else:
                assert example.label in spec.labels
    for split in tasks.available_test_splits(GLUE_DIR, spec):
        examples = tasks.read_split(GLUE_DIR, spec, split)
        assert all(e.label is None for e in examples)
        # Test rows keep the file's own index: the submission is keyed by it.
        assert [e.guid for e in examples] == [str(i) for i in range(len(examples))]


def test_quirks_header_less_cola_bom_and_unbalanced_quotes():
    cola = tasks.read_split(GLUE_DIR, "CoLA", "dev")
    # Header-less: the first line is an example; a quote inside a sentence is kept verbatim.
    assert cola[-1].text_a == 'The "quiet" man left.' and cola[-1].label == "1"
    # MRPC's header starts with a byte-order mark; the "Quality" column is still found.
    with open(os.path.join(GLUE_DIR, "MRPC", "train.tsv"), "rb") as f:
        assert f.read(3) == b"\xef\xbb\xbf"
    assert {e.label for e in tasks.read_split(GLUE_DIR, "MRPC", "train")} == {"0", "1"}
    # An unbalanced double quote does not swallow the following lines (no CSV quoting).
    sst = tasks.read_split(GLUE_DIR, "SST-2", "dev")
    assert sst[-1].text_a == 'the worst " movie ' and len(sst) == 4


def test_mnli_reads_gold_label_from_train_and_dev_layouts():
    # 12 columns in train, 16 in dev (five annotator labels), 10 in test; gold_label is last.
    train = tasks.read_split(GLUE_DIR, "mnli", "train")
    dev = tasks.read_split(GLUE_DIR, "glue/MNLI", "dev_mismatched")
    assert [e.label for e in train[:3]] == ["entailment", "contradiction", "neutral"]
    assert dev[-1] == Example(
        "dev_mismatched-3", "He paid the bill.", "The bill was paid.", "entailment"
    )


def test_task_names_and_splits():
    assert tasks.get_task("glue/sst2").name == "SST-2"
    assert tasks.get_task("STS-B") is tasks.get_task("stsb")
    with pytest.raises(ValueError, match="unknown GLUE task"):
        tasks.get_task("squad")
    with pytest.raises(ValueError, match="no split 'dev'"):
        tasks.read_split(GLUE_DIR, "MNLI", "dev")
    assert tasks.available_test_splits(GLUE_DIR, tasks.get_task("MNLI")) == [
        "test_matched",
        "test_mismatched",
        "diagnostic",
    ]
    assert tasks.submission_file(tasks.get_task("MNLI"), "test_mismatched") == "MNLI-mm.tsv"


# --- bad input: the error names the file and the line ------------------------------------------


@pytest.fixture
def glue_copy(tmp_path):
    target = tmp_path / "glue"
    shutil.copytree(GLUE_DIR, target, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return target


def _replace_line(path, line_number, text):
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[line_number - 1] = text
    path.write_text("\n".join(lines), encoding="utf-8")


def test_missing_file_is_named(glue_copy):
    os.remove(glue_copy / "RTE" / "dev.tsv")
    with pytest.raises(GlueDataError, match=r"RTE dev file not found: .*RTE/dev\.tsv"):
        tasks.read_split(str(glue_copy), "RTE", "dev")
    with pytest.raises(GlueDataError, match=r"RTE/dev\.tsv"):
        tasks.check_task_files(str(glue_copy), tasks.get_task("RTE"))
    with pytest.raises(GlueDataError, match="directory not found"):
        tasks.check_task_files(str(glue_copy / "nowhere"), tasks.get_task("RTE"))


def test_wrong_column_count_names_file_and_line(glue_copy):
    path = glue_copy / "QNLI" / "train.tsv"
    _replace_line(path, 3, "1\tWhat color is the sky?\tMany birds fly south in winter.")
    with pytest.raises(GlueDataError, match=r"QNLI/train\.tsv:3: expected 4 .* found 3"):
        tasks.read_split(str(glue_copy), "QNLI", "train")
    # Header-less CoLA: the count comes from the layout, not a header.
    path = glue_copy / "CoLA" / "train.tsv"
    _replace_line(path, 2, "gj04\t0\tThey drank the pub.")
    with pytest.raises(GlueDataError, match=r"CoLA/train\.tsv:2: expected 4 .* found 3"):
        tasks.read_split(str(glue_copy), "CoLA", "train")


def test_label_outside_the_label_set_names_file_and_line(glue_copy):
    path = glue_copy / "MNLI" / "dev_matched.tsv"
    lines = path.read_text(encoding="utf-8").split("\n")
    fields = lines[2].split("\t")
    fields[-1] = "contradictory"
    _replace_line(path, 3, "\t".join(fields))
    with pytest.raises(GlueDataError, match=r"dev_matched\.tsv:3: label 'contradictory'"):
        tasks.read_split(str(glue_copy), "MNLI", "dev_matched")
    path = glue_copy / "STS-B" / "train.tsv"
    fields = path.read_text(encoding="utf-8").split("\n")[1].split("\t")
    _replace_line(path, 2, "\t".join([*fields[:-1], "5.5"]))
    with pytest.raises(GlueDataError, match=r"STS-B/train\.tsv:2: STS-B score 5.5 is outside"):
        tasks.read_split(str(glue_copy), "STS-B", "train")


def test_windows_line_endings_and_missing_header_column(glue_copy):
    path = glue_copy / "RTE" / "train.tsv"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert tasks.read_split(str(glue_copy), "RTE", "train")[1].label == "not_entailment"
    path = glue_copy / "SST-2" / "train.tsv"
    _replace_line(path, 1, "text\tlabel")
    with pytest.raises(GlueDataError, match=r"SST-2/train\.tsv:1: header has no column 'sentence'"):
        tasks.read_split(str(glue_copy), "SST-2", "train")


# --- TFDS glue/* records ------------------------------------------------------------------------


def test_tfds_records_map_onto_glue_labels():
    mnli = tasks.get_task("MNLI")
    names = ["entailment", "neutral", "contradiction"]  # TFDS's order differs from GLUE's files
    record = {"premise": b"A man sleeps.", "hypothesis": b"A man is awake.", "label": 2, "idx": 7}
    example = tasks.example_from_tfds(mnli, record, names, labeled=True, where="tfds")
    assert example == Example("7", "A man sleeps.", "A man is awake.", "contradiction")
    mrpc = tasks.get_task("MRPC")
    record = {"sentence1": b"a", "sentence2": b"b", "label": np.int64(1), "idx": np.int32(0)}
    example = tasks.example_from_tfds(
        mrpc, record, ["not_equivalent", "equivalent"], labeled=True, where="tfds"
    )
    assert example.label == "1"
    sts = tasks.get_task("STS-B")
    record = {"sentence1": b"x", "sentence2": b"y", "label": np.float32(3.8), "idx": 1}
    assert tasks.example_from_tfds(sts, record, None, True, "tfds").label == pytest.approx(3.8)
    cola = tasks.get_task("CoLA")
    record = {"sentence": b"Test row.", "label": -1, "idx": 4}
    assert tasks.example_from_tfds(cola, record, None, labeled=False, where="tfds") == Example(
        "4", "Test row.", None, None
    )
    assert [tasks.tfds_split_name(s) for s in ("dev", "dev_mismatched", "test_matched")] == [
        "validation",
        "validation_mismatched",
        "test_matched",
    ]


def test_tfds_reader_on_mocked_glue():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        dev = tasks.read_split("tfds", "MNLI", "dev_mismatched")
        test = tasks.read_split("tfds", "CoLA", "test")
        diagnostic = tasks.read_split("tfds", "MNLI", "diagnostic")
    assert len(dev) == 4 and all(e.text_b is not None for e in dev)
    assert {e.label for e in dev} <= set(tasks.get_task("MNLI").labels)
    assert all(e.label is None and e.text_b is None for e in test)
    assert all(e.guid.isdigit() for e in test)
    assert all(e.label is None for e in diagnostic)
