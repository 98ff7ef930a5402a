"""`bert-jax finetune --task squad/v1.1|squad/v2.0|conll2003`: read, fine-tune, write the results.

SQuAD writes, into the workdir: `predictions.json` ({question id: answer}, the official format),
`null_odds.json` (v2.0: {id: null score - best non-null score}, the official script's
`--na-prob-file`), `nbest_predictions.json`, and `result.json` with the official figures on dev
(v1.1: exact_match, f1; v2.0: exact, f1, HasAns_*, NoAns_*, best_exact/best_f1 and thresholds).
CoNLL-2003 writes `dev_predictions.txt` (and `test_predictions.txt` when a test file is there) in
conlleval's input format (word, gold tag, predicted tag) and conlleval's span precision/recall/F1
in `result.json`. Both write `results.md`, the run beside the paper's numbers.

Defaults are the paper's where it gives them: SQuAD v1.1 lr 5e-5, batch 32, 3 epochs; v2.0 lr 5e-5,
batch 48, 2 epochs; both max_seq_length 384, doc_stride 128, max_query_length 64, n-best 20,
max answer length 30. CoNLL-2003 (no recipe in the paper): lr 5e-5, batch 32, 3 epochs, length 128.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax

from bert_jax.finetune.reports import run_report
from bert_jax.finetune.runs import finetuned_model
from bert_jax.finetune.runs import workdir as finetune_workdir
from bert_jax.finetune.tasks import conll as ner
from bert_jax.finetune.tasks import registry, squad, squad_answers
from bert_jax.finetune.tasks.task import SPANS, Task
from bert_jax.finetune.tuning import token_tuning as token_loop
from bert_jax.finetune.tuning.result import FinetuneResult
from bert_jax.finetune.tuning.settings import FinetuneSettings, PretrainedEncoder, load_pretrained
from bert_jax.finetune.tuning.settings import task_settings as settings_for
from bert_jax.runtime import fs
from bert_jax.runtime import outputs as files

logger = logging.getLogger(__name__)

# Each task's recipe, as registered (`Task.defaults`), by SQuAD version and CoNLL-2003's name.
TASK_DEFAULTS = {task.version: dict(task.defaults) for task in squad.TASKS} | {
    task.name: dict(task.defaults) for task in ner.TASKS if not task.feature_based
}


@dataclasses.dataclass(frozen=True)
class SpanOptions:
    """Task options beside `FinetuneSettings` (SQuAD's windows and answers; NER's context)."""

    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    document_context: bool = False
    dev_data: str | None = None


def task_settings(task: str | Task, overrides: Mapping[str, Any]) -> FinetuneSettings:
    """The task's recipe, then the overrides that are not None."""
    return settings_for(registry.get(task) if isinstance(task, str) else task, overrides)


def _is_writer() -> bool:
    return jax.process_index() == 0


def _write_text(path: str, text: str) -> None:
    files.write_bytes_atomic(path, text.encode("utf-8"))


def _is_tfds(data: str) -> bool:
    return data == "tfds" or data.startswith("tfds:")


def run_token_task(
    model: str | PretrainedEncoder,
    task: str | Task,
    data: str,
    workdir: str,
    settings: FinetuneSettings | None = None,
    options: SpanOptions | None = None,
    log: Callable[[str], None] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> dict[str, Any]:
    """Fine-tune on SQuAD or CoNLL-2003 and write the workdir's files; returns result.json's.

    `model`: a model directory / pretraining workdir, or a loaded encoder; `mesh` defaults to
    one of `settings.mesh_shape` over every device."""
    log = log or logger.info
    options = options or SpanOptions()
    task = registry.get(task) if isinstance(task, str) else task
    settings = settings or task_settings(task, {})
    version = task.version if task.family == SPANS else None  # type: ignore[attr-defined]
    # Inputs first, then the workdir, then the model: a bad input or model leaves nothing behind.
    if version is not None:
        splits = _read_squad(version, data, options)
    else:
        ner.check_files(data)
        splits = tuple(ner.read_split(data, split) for split in ("train", "dev", "test"))
    finetune_workdir.check_workdir(workdir)
    encoder = load_pretrained(model, single_run=True) if isinstance(model, str) else model
    trained: dict[str, Any] = {}
    run = _run_squad if version is not None else _run_ner
    finished, outputs = run(encoder, task, splits, settings, options, log, mesh, trained.update)
    result = finished.to_json()
    result.update(
        model=fs.abspath(model) if isinstance(model, str) else encoder.source,
        data=data,
        options=dataclasses.asdict(options),
        finished_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    workdir = finetune_workdir.open_workdir(workdir, "finetune", writer=_is_writer())
    entry = token_task_entry(task, result, settings, options)
    finetuned_model.keep(workdir, settings, True, encoder, trained["params"], entry)
    if _is_writer():
        workdir = finetune_workdir.open_workdir(workdir, "finetune")
        for name, text in outputs.items():
            _write_text(os.path.join(workdir, name), text)
        _write_text(os.path.join(workdir, "results.md"), run_report.results_markdown(result))
        fs.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
        plot_name = result["task"].replace("/", "-") + ".png"
        run_report.plot_history(os.path.join(workdir, "plots", plot_name), result)
        files.write_json_atomic(os.path.join(workdir, "result.json"), result)
    return result


def token_task_entry(
    task: Task, result: Mapping[str, Any], settings: FinetuneSettings, options: SpanOptions
) -> dict[str, Any]:
    """The fine-tuned model directory's task entry (model_dir's docstring): SQuAD's span head
    with its windows and answers' options; CoNLL-2003's tags (as trained: IOB2 unless the
    training files used IOBES) and whether the data's files write them in IOB1."""
    if task.family == SPANS:
        spans = dataclasses.asdict(options)
        kept = ("doc_stride", "max_query_length", "n_best_size", "max_answer_length")
        kept += ("null_score_diff_threshold",)
        kept_options = {key: spans[key] for key in kept}
        return finetuned_model.task_entry(
            result["task"], "span", [], settings, {**kept_options, "version": task.version}
        )
    return finetuned_model.task_entry(
        result["task"], "tags", result["labels"], settings, {"iob1": result["iob1"]}
    )


def _json_text(payload: Any) -> str:
    return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"


def _read_squad(version, data, options):
    if _is_tfds(data):
        data_dir = data[5:] or None
        return squad.read_tfds(version, "train", data_dir), squad.read_tfds(
            version, "validation", data_dir
        )
    train_path, dev_path = squad.split_files(data, version, options.dev_data)
    return squad.read_json(train_path)[0], squad.read_json(dev_path)[0]


def _run_squad(encoder, task, splits, settings, options, log, mesh, on_trained=None):
    """SQuAD's run: its `FinetuneResult` and the prediction files' text."""
    version = task.version
    train, dev = splits
    windows = dict(
        tokenizer=encoder.tokenizer,
        max_seq_length=settings.max_seq_length,
        doc_stride=options.doc_stride,
        max_query_length=options.max_query_length,
    )
    train_features = squad.build_features(train, training=True, **windows)
    if train_features.skipped_answers:
        log(f"{train_features.skipped_answers} training answers not found at answer_start: skipped")
    dev_features = squad.build_features(dev, **windows)
    dataset = squad.as_dataset(dev)
    log(f"SQuAD {version}: {len(train)} train questions -> {len(train_features)} windows")

    def answers(logits):
        return squad_answers.answers_from_logits(
            dev,
            dev_features,
            logits,
            version,
            options.n_best_size,
            options.max_answer_length,
            options.null_score_diff_threshold,
        )

    def evaluate(logits):
        found = answers(logits)
        odds = found.null_odds if version == "v2.0" else None
        return squad_answers.evaluate(
            dataset, found.predictions, version, odds, options.null_score_diff_threshold
        )

    run = token_loop.train_and_evaluate(
        encoder,
        token_loop.SPAN,
        2,
        train_features.arrays,
        evaluate,
        dev_features.arrays,
        settings,
        head_dropout=0.0,
        log=log,
        mesh=mesh,
        on_trained=on_trained,
        while_compiling=run_report.load_plotting,  # for the plot at the end
    )
    found = answers(run.logits)
    outputs = {
        "predictions.json": _json_text(found.predictions),
        "nbest_predictions.json": _json_text(found.nbest),
    }
    if version == "v2.0":
        outputs["null_odds.json"] = _json_text(found.null_odds)
    details = dict(
        num_train_features=run.num_train_features,
        num_dev_examples=len(dev),
        skipped_train_answers=train_features.skipped_answers,
    )
    result = FinetuneResult.of_run(
        task, settings, run.trained, len(train), run.seconds, details=details
    )
    return result, outputs


def _run_ner(encoder, task, splits, settings, options, log, mesh, on_trained=None):
    """CoNLL-2003's run: its `FinetuneResult` and the prediction files' text."""
    train, dev, test = splits
    labels = ner.label_list(train)
    iob1 = ner.uses_iob1(train)

    def features(sentences):
        return ner.build_features(
            sentences, encoder.tokenizer, labels, settings.max_seq_length, options.document_context
        )

    train_features, dev_features = features(train), features(dev)
    test_features = None if test is None else features(test)
    log(f"CoNLL-2003: {len(train)} train sentences -> {len(train_features)} windows, {labels}")

    def score(sentences, feats, logits):
        predicted = ner.predicted_tags(sentences, feats, logits, labels, iob1)
        return ner.conlleval([s.tags for s in sentences], predicted), predicted

    run = token_loop.train_and_evaluate(
        encoder,
        token_loop.TAGS,
        len(labels),
        train_features.arrays,
        lambda logits: score(dev, dev_features, logits)[0],
        dev_features.arrays,
        settings,
        head_dropout=settings.dropout,
        log=log,
        final_arrays={} if test_features is None else {"test": test_features.arrays},
        mesh=mesh,
        on_trained=on_trained,
        while_compiling=run_report.load_plotting,  # for the plot at the end
    )
    _, dev_predicted = score(dev, dev_features, run.logits)
    outputs = {"dev_predictions.txt": ner.conll_text(dev, dev_predicted)}
    details: dict[str, Any] = {"num_train_features": run.num_train_features}
    if test is not None:
        details["test_metrics"], test_predicted = score(
            test, test_features, run.final_logits["test"]
        )
        outputs["test_predictions.txt"] = ner.conll_text(test, test_predicted)
    details.update(labels=list(labels), iob1=bool(iob1))
    result = FinetuneResult.of_run(
        task, settings, run.trained, len(train), run.seconds, details=details
    )
    return result, outputs
