"""`bert-jax predict` on what `bert-jax finetune` wrote: a tiny BERT fine-tuned once on each head
kind (a GLUE single-sentence task, STS-B's regression on pairs, SWAG, SQuAD v1.1, CoNLL-2003),
its model directory read back, and each input kind given as JSONL and as TSV predicted as the run
predicted its own rows (labels and answers equal, scores to 1e-5). ModernBERT's runs
(tests/test_modernbert_finetune.py, test_modernbert_token_tasks.py) call the same check,
`check_predictions`, on theirs; docs/finetuning.md's predict commands run as written on these
runs. Then bad input: one line naming the file and row, exit 2."""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil

import pytest

from bert_jax import cli
from bert_jax.convert import task_heads
from bert_jax.convert.model_dir import load_model_dir, save_model_dir
from bert_jax.finetune.runs import one_task
from bert_jax.finetune.runs.squad_and_conll import SpanOptions
from bert_jax.finetune.tasks import conll as ner
from bert_jax.finetune.tasks import glue, glue_metrics, registry, squad, swag
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder

SMALL = dict(epochs=1.0, batch_size=8, eval_batch_size=8, max_seq_length=32, learning_rate=1e-3)
SCORE_TOLERANCE = 1e-5


# ------------------------------------------------------------------------------------------------
# The check every fine-tuned run's model passes
# ------------------------------------------------------------------------------------------------


def _tsv_cells(value) -> str:
    return " ".join(value) if isinstance(value, list) else str(value)


def predict_both(model, rows: list[dict], root) -> tuple[list[dict], list[dict]]:
    """`bert-jax predict` on `rows` written as JSONL and as TSV (lists: `endings` as numbered
    columns, `words` space-separated); the two outputs, JSONL's and TSV's."""
    root.mkdir(parents=True, exist_ok=True)
    flat = []
    for row in rows:
        cells = {k: v for k, v in row.items() if k != "endings"}
        cells.update({f"ending{i}": e for i, e in enumerate(row.get("endings", []))})
        flat.append(cells)
    names = list(flat[0])
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["\t".join(names)] + ["\t".join(_tsv_cells(r[n]) for n in names) for r in flat]
    (root / "rows.tsv").write_text("\n".join(lines) + "\n")
    for name in ("jsonl", "tsv"):
        argv = ["predict", "--model", str(model), "--input", str(root / f"rows.{name}")]
        assert cli.main([*argv, "--output", str(root / f"out.{name}")]) == 0
    from_jsonl = [json.loads(line) for line in (root / "out.jsonl").read_text().splitlines()]
    with open(root / "out.tsv", encoding="utf-8") as f:
        from_tsv = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert [p["id"] for p in from_jsonl] == [p["id"] for p in from_tsv] == [r["id"] for r in rows]
    for ours, theirs in zip(from_jsonl, from_tsv, strict=True):
        if "score" in ours:
            assert float(theirs["score"]) == pytest.approx(ours["score"], rel=1e-5, abs=1e-9)
    return from_jsonl, from_tsv


def check_predictions(workdir, data, root) -> str:
    """`bert-jax predict` with the model a run wrote into `workdir` predicts the run's own rows
    as the run did (JSONL and TSV); returns the head kind checked."""
    loaded = load_model_dir(workdir)  # WORKDIR/model, as predict reads it
    task, head = loaded.task, loaded.task["head"]
    values = json.loads((workdir / "model" / "config.json").read_text())
    family = values["model_type"]
    assert values["architectures"] == [task_heads.get(head).architecture(family)]
    result = json.loads((workdir / "result.json").read_text())
    assert task["name"] == result["task"] and task["settings"] == result["settings"]
    CHECKS[head](workdir, data, root, task, result)
    return head


def _sentence_check(workdir, data, root, task, result) -> None:
    spec = registry.get(task["name"])
    assert task["pair"] is spec.is_pair
    for split in ("test", *spec.dev_splits):
        examples = glue.read_split(data, spec, split)
        rows = [
            {"id": e.guid, "text": e.text_a, **({"text_pair": e.text_b} if spec.is_pair else {})}
            for e in examples
        ]
        predicted, as_tsv = predict_both(workdir, rows, root / split)
        if split == "test":  # the run's GLUE-server file
            with open(workdir / glue.submission_file(spec, split), encoding="utf-8") as f:
                ran = dict(line.rstrip("\n").split("\t") for line in list(f)[1:])
            for row, tsv_row in zip(predicted, as_tsv, strict=True):
                if spec.is_regression:  # written to 3 decimals, clipped to [0, 5]
                    clipped = min(max(row["score"], 0.0), 5.0)
                    assert clipped == pytest.approx(float(ran[row["id"]]), abs=5e-4 + 1e-6)
                else:
                    assert row["label"] == tsv_row["label"] == ran[row["id"]]
            continue
        # dev: the run's figures from these predictions
        if spec.is_regression:
            labels = [float(e.label) for e in examples]
            outputs = [p["score"] for p in predicted]
        else:
            labels = [spec.labels.index(e.label) for e in examples]
            outputs = [spec.labels.index(p["label"]) for p in predicted]
        import numpy as np

        metrics = glue_metrics.task_metrics(spec, np.asarray(labels), np.asarray(outputs))
        ran = result["dev_metrics"][spec.dev_splits[split]]
        # Correlations of a few near-equal scores move with their last digits (in percent).
        assert metrics == pytest.approx(ran, abs=0.05 if spec.is_regression else 1e-9)


def _choices_check(workdir, data, root, task, result) -> None:
    examples = swag.read_split(str(data), "dev")
    rows = [
        {"id": e.example_id, "context": e.sent1, "start": e.sent2, "endings": list(e.endings)}
        for e in examples
    ]
    predicted, as_tsv = predict_both(workdir, rows, root / "swag")
    with open(workdir / "dev_predictions.csv", encoding="utf-8") as f:
        ran = {row["id"]: row for row in csv.DictReader(f)}
    for row, tsv_row, given in zip(predicted, as_tsv, rows, strict=True):
        choice = ran[row["id"]]["prediction"]
        assert str(row["label"]) == tsv_row["label"] == choice
        assert row["ending"] == given["endings"][int(choice)]
        assert row["score"] == pytest.approx(float(ran[row["id"]][f"score{choice}"]), abs=2e-6)


def _spans_check(workdir, data, root, task, result) -> None:
    assert task["options"]["version"] == result["task"].split("/")[1]
    examples, _ = squad.read_json(str(data / f"dev-{task['options']['version']}.json"))
    rows = [{"id": e.qid, "question": e.question, "context": e.context} for e in examples]
    predicted, as_tsv = predict_both(workdir, rows, root / "squad")
    answers = json.loads((workdir / "predictions.json").read_text())
    nbest = json.loads((workdir / "nbest_predictions.json").read_text())
    for row, tsv_row in zip(predicted, as_tsv, strict=True):
        assert row["answer"] == tsv_row["answer"] == answers[row["id"]]
        entry = next(e for e in nbest[row["id"]] if e["text"] == row["answer"])
        # The probability is over the n best spans; a barely trained model's logits tie near
        # the 20th place, where the run's sharded forward pass and this one-device one may
        # admit different spans of equal score, which moves every probability a little.
        assert row["score"] == pytest.approx(entry["probability"], abs=2e-3)


def _tags_check(workdir, data, root, task, result) -> None:
    sentences = ner.read_split(str(data), "dev")
    rows = [{"id": str(i), "words": list(s.words)} for i, s in enumerate(sentences)]
    predicted, as_tsv = predict_both(workdir, rows, root / "conll")
    blocks = (workdir / "dev_predictions.txt").read_text().strip().split("\n\n")
    ran = [[line.split()[2] for line in block.split("\n")] for block in blocks]
    for row, tsv_row, tags in zip(predicted, as_tsv, ran, strict=True):
        assert row["tags"] == tsv_row["tags"].split()
        assert all(tag in task["labels"] for tag in row["tags"])  # the model's own (IOB2)
        shown = ner.iob2_to_iob1(row["tags"]) if task["options"]["iob1"] else row["tags"]
        assert shown == tags
        assert len(row["scores"]) == len(row["words"]) and all(0 < s <= 1 for s in row["scores"])


CHECKS = {
    "classification": _sentence_check,
    "regression": _sentence_check,
    "multiple_choice": _choices_check,
    "span": _spans_check,
    "tags": _tags_check,
}


# ------------------------------------------------------------------------------------------------
# BERT: each head kind fine-tuned once, then predicted from
# ------------------------------------------------------------------------------------------------


def _task_data(root, vocabulary: list[str]) -> dict[str, object]:
    """Data directories of the synthetic SWAG, SQuAD v1.1 and CoNLL-2003 sets."""
    from tests.test_ner import _synthetic_conll
    from tests.test_squad import synthetic_squad
    from tests.test_swag import _synthetic_swag

    swag_dir, squad_dir, conll_dir = root / "swag", root / "squad", root / "conll"
    for path in (swag_dir, squad_dir, conll_dir):
        path.mkdir()
    words = [w for w in vocabulary if w.isalpha() and len(w) > 3 and w != "good"][:30]
    _synthetic_swag(swag_dir / "train.csv", 16, 1, words)
    _synthetic_swag(swag_dir / "val.csv", 6, 2, words)
    for split, count, seed in (("train", 16, 1), ("dev", 6, 2)):
        payload, _ = synthetic_squad(count, seed)
        (squad_dir / f"{split}-v1.1.json").write_text(json.dumps(payload), encoding="utf-8")
    for name, count, seed in (("train.txt", 16, 1), ("valid.txt", 6, 2)):
        _synthetic_conll(conll_dir / name, count, seed, (words * 2)[:40])
    return {"swag": swag_dir, "squad/v1.1": squad_dir, "conll2003": conll_dir}


DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
# The runs docs/finetuning.md's predict commands name, as this test's workdirs.
DOCS_RUNS = {"runs/sst2": "glue-SST-2", "runs/squad11": "squad-v1.1", "runs/ner": "conll2003"}


def docs_predict_commands() -> list[list[str]]:
    """The commands of docs/finetuning.md's blocks marked as run here (tests/test_predict.py)."""
    with open(os.path.join(DOCS, "finetuning.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    commands, mine, in_block = [], False, False
    for line in lines:
        if line.startswith("```"):
            in_block, mine = (not in_block), mine and not in_block
            continue
        if line.strip() == "<!-- test: elsewhere tests/test_predict.py -->":
            mine = True
        elif in_block and mine and line.startswith("bert-jax "):
            commands.append(shlex.split(line)[1:])
    return commands


def run_docs_commands(tmp_path, monkeypatch) -> None:
    """Each command as written, in a directory where its --model is the run of that name and
    its --input the rows predicted from that run (in the file's format)."""
    commands = docs_predict_commands()
    assert {argv[argv.index("--model") + 1] for argv in commands} == set(DOCS_RUNS)
    sandbox = tmp_path / "docs"
    (sandbox / "runs").mkdir(parents=True)
    for name, run in DOCS_RUNS.items():
        (sandbox / name).symlink_to(tmp_path / "runs" / run)
    monkeypatch.chdir(sandbox)
    for argv in commands:
        run = DOCS_RUNS[argv[argv.index("--model") + 1]]
        given, output = argv[argv.index("--input") + 1], argv[argv.index("--output") + 1]
        suffix = "jsonl" if given.endswith(".jsonl") else "tsv"
        rows = sorted((tmp_path / "predicted" / run).glob(f"*/rows.{suffix}"))[0]
        shutil.copy(rows, sandbox / given)
        assert cli.main(argv) == 0, argv
        written = (sandbox / output).read_text().splitlines()
        assert len(written) == len(rows.read_text().splitlines()), argv


@pytest.mark.slow
def test_each_head_kind_predicts_as_its_run_did(tmp_path, capsys, monkeypatch):
    """One test (the runs are its cost; a fixture shared by several tests could run on several
    workers): each kind fine-tuned, its workdir read by predict."""
    config, params = tiny_encoder(num_hidden_layers=1)  # a run costs its compiles: one layer
    tokenizer = fixture_tokenizer()
    model = save_model_dir(tmp_path / "tiny", config, params, tokenizer)
    data = {"glue/SST-2": GLUE_DIR, "glue/STS-B": GLUE_DIR}
    data.update(_task_data(tmp_path, list(tokenizer.vocab)[120:]))
    span = one_task.TaskOptions(span=SpanOptions(doc_stride=16, max_query_length=12))
    checked = []
    for name, where in data.items():
        workdir = tmp_path / "runs" / name.replace("/", "-")
        overrides = {**SMALL, "max_seq_length": 40} if name.startswith("squad") else SMALL
        one_task.run_task(model, name, str(where), str(workdir), overrides, span)
        checked.append(check_predictions(workdir, where, tmp_path / "predicted" / workdir.name))
    assert sorted(checked) == sorted(task_heads.HEADS)
    # Progress on a long input: a line with the rows done and the rate (here, every batch).
    argv = ["predict", "--model", str(tmp_path / "runs" / "glue-SST-2" / "model")]
    argv += ["--input", str(tmp_path / "predicted" / "glue-SST-2" / "test" / "rows.tsv")]
    capsys.readouterr()
    assert cli.main([*argv, "--batch-size", "1", "--progress-every", "1e-9"]) == 0
    captured = capsys.readouterr()
    assert "predict: 1/3 rows, " in captured.err and " rows/s" in captured.err
    assert captured.out.startswith('{"id": ')  # JSONL on standard output
    run_docs_commands(tmp_path, monkeypatch)


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair_model(tmp_path_factory):
    """A fine-tuned pair classifier's directory (a random head: nothing here predicts)."""
    import numpy as np

    config, params = tiny_encoder()
    labels = ["entailment", "not_entailment"]
    task = {"name": "RTE", "head": "classification", "labels": labels, "max_seq_length": 32}
    head = {"output": {"kernel": np.zeros((config.hidden_size, 2), np.float32)}}
    head["output"]["bias"] = np.zeros(2, np.float32)
    path = tmp_path_factory.mktemp("predict") / "rte"
    params = {"bert": params["bert"], "classifier": head}
    return save_model_dir(path, config, params, fixture_tokenizer(), task={**task, "pair": True})


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("rows.jsonl", '{"text": "a", "text_pair": "b"}\n{"text": "a"}\n', "line 2: no "),
        ("rows.jsonl", '{"text": "a", "text_pair": "b"}\n[1, 2]\n', "line 2: not a JSON object"),
        ("rows.jsonl", '{"text": "a",\n', "line 1: not JSON"),
        ("rows.jsonl", '{"text": 3, "text_pair": "b"}\n', "line 1: 'text' must be a string"),
        ("rows.tsv", "text\ttext_pair\na\tb\nc\n", "line 3: 1 columns, the header has 2"),
        ("rows.tsv", "text\na\n", "line 2: no 'text_pair' field"),
        ("rows.tsv", "text\ttext_pair\n", "holds a header (text, text_pair) and no rows"),
        ("rows.tsv", "\n\n", "holds no rows"),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_row(
    pair_model, tmp_path, capsys, name, text, message
):
    path = tmp_path / name
    path.write_text(text)
    assert cli.main(["predict", "--model", pair_model, "--input", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and message in err, err
    if "no 'text_pair'" in message:
        assert "the model (RTE) reads text and text_pair (a pair)" in err


def test_a_model_without_a_head_and_a_foreign_output_are_refused(pair_model, tmp_path, capsys):
    config, params = tiny_encoder()
    plain = save_model_dir(tmp_path / "plain", config, params, fixture_tokenizer())
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a", "text_pair": "b"}\n')
    assert cli.main(["predict", "--model", plain, "--input", str(rows)]) == 2
    assert "is not a fine-tuned model" in capsys.readouterr().err
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    argv = ["predict", "--model", pair_model, "--input", str(rows), "--output", str(notes)]
    assert cli.main(argv) == 2
    assert "exists and does not hold predictions" in capsys.readouterr().err
    assert notes.read_text() == "my notes\n" and os.path.exists(pair_model)


def _random_head_model(root, head: str, **task) -> str:
    """A fine-tuned model directory of a head kind with a random head (nothing trained)."""
    import numpy as np

    from bert_jax.convert import model_dir as model_format

    config, params = tiny_encoder()
    entry = {"name": "t", "head": head, "labels": [], "max_seq_length": 32, **task}
    shapes = model_format.expected_tree(config, False, entry)["classifier"]
    rng = np.random.default_rng(0)
    head_params = {
        layer: {name: rng.normal(size=shape).astype(np.float32) for name, shape in leaves.items()}
        for layer, leaves in shapes.items()
    }
    params = {"bert": params["bert"], "classifier": head_params}
    return save_model_dir(root / head, config, params, fixture_tokenizer(), task=entry)


def test_unanswerable_questions_and_any_number_of_endings(tmp_path):
    """A SQuAD v2.0 model answers "" or the context's characters; multiple choice takes rows of
    different numbers of endings (each number its own batches)."""
    from bert_jax.inference.predict import predict

    span = _random_head_model(tmp_path, "span", options={"version": "v2.0", "doc_stride": 8})
    context = "my color is red . my city is paris . my animal is a small grey cat ."
    rows = [{"question": q, "context": context} for q in ("what is my city ?", "who am i ?")]
    answers = predict(span, rows, log=lambda line: None)
    assert [a["id"] for a in answers] == ["0", "1"]
    assert all(a["answer"] in context and 0 < a["score"] <= 1 for a in answers)
    choices = _random_head_model(tmp_path, "multiple_choice")
    rows = [
        {"context": "the cat", "endings": ["sat", "ran", "slept"]},
        {
            "id": "b",
            "context": "the dog",
            "start": "it",
            "endings": ["ate", "barked", "hid", "ran"],
        },
    ]
    chosen = predict(choices, rows, log=lambda line: None)
    assert [c["id"] for c in chosen] == ["0", "b"]
    for row, choice in zip(rows, chosen, strict=True):
        assert choice["ending"] == row["endings"][choice["label"]] and 0 < choice["score"] <= 1
