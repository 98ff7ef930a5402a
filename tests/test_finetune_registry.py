"""The task registry: every task once, found by each of its spellings; no other list of task
names in the package; and a sentence-pair task added in one module (tests/finetune_pair_task.py)
trained, evaluated and reported end to end like GLUE's."""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import os

import pytest

from bert_jax import cli
from bert_jax.finetune.runs import one_task, sweep
from bert_jax.finetune.tasks import glue, registry
from bert_jax.finetune.tasks.task import CHOICES, FROZEN_TAGS, SENTENCE, SPANS, TAGS
from bert_jax.finetune.tuning.settings import FinetuneSettings
from bert_jax.runtime.errors import UserError
from tests import finetune_pair_task
from tests.glue_fixtures.tiny import tiny_pretrained

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bert_jax")
# The modules that define tasks (their TASKS); nothing else in the package spells a task's name.
TASK_MODULES = {
    os.path.join("finetune", "tasks", f"{name}.py") for name in ("glue", "squad", "conll", "swag")
}


def test_every_task_once_in_the_papers_order_with_its_family():
    assert registry.sweep_order() == (
        "MNLI", "QQP", "QNLI", "SST-2", "CoLA", "STS-B", "MRPC", "RTE", "WNLI",
    )  # fmt: skip
    assert registry.names() == (
        *registry.sweep_order(),
        "conll2003",
        "squad/v1.1",
        "squad/v2.0",
        "swag",
    )
    families = {(t.name, t.feature_based): t.family for t in registry.all_tasks()}
    assert families[("squad/v2.0", False)] == SPANS and families[("swag", False)] == CHOICES
    assert families[("conll2003", False)] == TAGS and families[("conll2003", True)] == FROZEN_TAGS
    assert {families[(name, False)] for name in registry.sweep_order()} == {SENTENCE}
    assert [t.name for t in registry.benchmark_tasks(glue.BENCHMARK)] == [
        "CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI",
    ]  # fmt: skip
    for task in registry.all_tasks():
        assert task.metrics and (task.paper or task.name == "WNLI"), task.name


@pytest.mark.parametrize(
    "spelling, name",
    [
        ("glue/MRPC", "MRPC"), ("mrpc", "MRPC"), ("sst2", "SST-2"), ("glue/sts_b", "STS-B"),
        ("MNLI-mm", "MNLI"), ("squad/v1.1", "squad/v1.1"), ("squad1.1", "squad/v1.1"),
        ("SQuAD/v2", "squad/v2.0"), ("squad-2.0", "squad/v2.0"), ("CoNLL-2003", "conll2003"),
        ("ner", "conll2003"), ("swag/regular", "swag"),
    ],
)  # fmt: skip
def test_each_spelling_finds_its_task(spelling, name):
    assert registry.get(spelling).name == name


def test_unknown_names_are_one_line_naming_the_choices():
    with pytest.raises(UserError, match=r"unknown task 'squad/v3'; choose one of MNLI, QQP, "):
        registry.get("squad/v3")
    with pytest.raises(UserError, match=r"unknown GLUE task 'swag'; choose one of MNLI, QQP, "):
        glue.get_task("swag")
    with pytest.raises(UserError, match="--features is the feature-based .* not for glue/MRPC"):
        registry.get("glue/MRPC", feature_based=True)
    assert registry.get("conll2003", feature_based=True).family == FROZEN_TAGS
    with pytest.raises(ValueError, match="the name 'mrpc' is MRPC's"):
        registry.register(glue.SentenceTask(name="mrpc", metrics=("f1",), labels=None,
                                            is_pair=True, dev_splits={"dev": "mrpc"}))  # fmt: skip


def test_the_command_line_takes_its_task_names_from_the_registry(tmp_path, capsys):
    """Every registered name gets past the task look-up (to the missing data); any other name is
    refused there, naming the registry's."""
    argv = ["finetune", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "no_data")]
    for name in [*registry.names(), "xnli"]:
        workdir = str(tmp_path / name.replace("/", "_"))
        assert cli.main([*argv, "--workdir", workdir, "--task", name]) == 2
        err = capsys.readouterr().err
        refused = f"unknown task {name!r}; choose one of {', '.join(registry.names())}\n" in err
        assert refused == (name == "xnli"), err


def _string_constants(path: str) -> list[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_other_module_spells_a_task_name():
    """A task's names and aliases are written once, in its family's module: a list of task names
    anywhere else in the package (a sweep order, a table's columns, a dispatch on names) fails."""
    spellings = {spelling for t in registry.all_tasks() for spelling in (t.name, *t.aliases)}
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or os.path.relpath(path, PACKAGE) in TASK_MODULES:
                continue
            found += [
                f"{os.path.relpath(path, PACKAGE)}:{line}: {text!r}"
                for line, text in _string_constants(path)
                if text in spellings
            ]
    assert found == []


SMALL = {"epochs": 1, "batch_size": 8, "eval_batch_size": 8, "max_seq_length": 32}
_SENTENCES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "she reads a good book",
    "we walked to the old house",
    "he plays music every night",
    "they ate bread and cheese",
]


@pytest.fixture
def pair_task(tmp_path):
    """tests/finetune_pair_task.py's task, registered, over a few generated TSV lines."""
    data = tmp_path / "pairs"
    data.mkdir()
    for split, count in (("train", 24), ("dev", 12)):
        lines = []
        for i in range(count):
            first = _SENTENCES[i % len(_SENTENCES)]
            same = i % 2 == 0
            second = first if same else _SENTENCES[(i + 1) % len(_SENTENCES)]
            lines.append(f"{first}\t{second}\t{int(same)}\n")
        (data / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    task = registry.register(finetune_pair_task.TASK)
    yield task, str(data)
    registry.unregister(task)


def test_a_readers_labels_are_checked_as_glues_are(pair_task):
    task, data = pair_task
    assert {e.label for e in glue.read_split(data, "tiny-paraphrase", "train")} == {"0", "1"}
    odd = dataclasses.replace(task, reader=lambda data, split: [glue.Example("7", "a", "b", 2)])
    with pytest.raises(UserError, match="tiny-paraphrase dev example 7: label '2' is not one of"):
        glue.read_split(data, odd, "dev")


def test_a_pair_task_in_one_module_runs_and_is_reported(pair_task, tmp_path):
    task, data = pair_task
    assert registry.get("Tiny_Paraphrase") is task and task.family == SENTENCE
    encoder = tiny_pretrained()
    result = one_task.run_task(encoder, "tiny-paraphrase", data, str(tmp_path / "one"), SMALL)
    dev = result["dev_metrics"]["tiny-paraphrase"]
    assert set(dev) == {"f1", "accuracy"} and all(0.0 <= v <= 100.0 for v in dev.values())
    assert one_task.dev_score(result) == ("dev f1", dev["f1"])
    with open(tmp_path / "one" / "result.json", encoding="utf-8") as f:
        assert json.load(f)["dev_metrics"] == result["dev_metrics"]

    workdir = tmp_path / "sweep"
    outcome = sweep.run_sweep(
        encoder, data, str(workdir), tasks=["tiny-paraphrase"], learning_rates=[3e-5],
        seeds=[0], settings=FinetuneSettings(**SMALL), predict_test=False,
    )  # fmt: skip
    assert outcome.ran == ["tiny-paraphrase/lr=3e-05_seed=0"]
    with open(workdir / "results.json", encoding="utf-8") as f:
        results = json.load(f)
    selected = results["tasks"]["tiny-paraphrase"]["selected"]
    assert selected["dev_metrics"] == outcome.selected["tiny-paraphrase"]["dev_metrics"]
    assert results["summary"]["glue_task_scores"]["tiny-paraphrase"] == pytest.approx(
        sum(selected["dev_metrics"]["tiny-paraphrase"].values()) / 2
    )
    with open(workdir / "results.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["task"], r["paper_score"]) for r in rows] == [
        ("tiny-paraphrase", f"{selected['dev_metrics']['tiny-paraphrase']['f1']:.4f}")
    ]
    markdown = (workdir / "results.md").read_text(encoding="utf-8")
    assert "| tiny-paraphrase | F1 " in markdown
    assert (workdir / "plots" / "tiny-paraphrase.png").stat().st_size > 0
