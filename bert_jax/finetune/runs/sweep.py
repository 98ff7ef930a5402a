"""The paper's GLUE protocol as a resumable sweep: tasks x learning rates x seeds.

Workdir layout:

    trials/<TASK>/lr=<LR>_seed=<SEED>/result.json    one finished trial (written last, atomically)
    trials/<TASK>/lr=<LR>_seed=<SEED>/<FILE>.tsv     its test predictions, GLUE-server format
    trials/<TASK>/lr=<LR>_seed=<SEED>/model/         the selected trial's fine-tuned model
                                                     (`--keep-models`: finetuned_model.py)
    submission/<FILE>.tsv                            the selected trial's predictions per task
    results.json, results.csv, results.md, plots/<TASK>.png     (see report.py)

A trial counts as done when its `result.json` exists; an interrupted sweep, run again with the same
arguments, skips those and runs the rest. A `result.json` written with different training settings
(epochs, batch size, sequence length, model, ...) is an error rather than silently mixed in.

Why this file is long: it holds the sweep's whole protocol, each piece short and read in order:
trials and their directories, reuse of finished ones, the run of one (`finetune` is one trial),
selection and the kept models, the submission copy and the sweep's options.

Selection (best on dev): per task, the selected trial is the one with the best `selection_score`,
the dev figure the task is selected by in its direction (`Task.selected_by`, `higher_is_better`;
GLUE's: the paper's metric, MNLI's the mean of matched and mismatched accuracy); ties go to the
earlier trial in sweep order.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import jax

from bert_jax.core import optim
from bert_jax.finetune.reports import references
from bert_jax.finetune.reports import sweep_report as report
from bert_jax.finetune.runs import finetuned_model
from bert_jax.finetune.runs import workdir as finetune_workdir
from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tasks.glue import (
    SentenceTask,
    available_test_splits,
    check_task_files,
    get_task,
    submission_file,
)
from bert_jax.finetune.tuning.batches import TaskData, load_task_data
from bert_jax.finetune.tuning.result import FinetuneResult, read_back
from bert_jax.finetune.tuning.sentence_tuning import finetune, make_mesh
from bert_jax.finetune.tuning.settings import (
    DEFAULTS,
    SWEPT,
    TRIAL_SETTINGS,
    FinetuneSettings,
    PretrainedEncoder,
    load_pretrained,
    swept_option,
)
from bert_jax.finetune.tuning.tuning_loop import figures
from bert_jax.runtime import fs
from bert_jax.runtime import outputs as files
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib, load_model

logger = logging.getLogger(__name__)

PAPER_LEARNING_RATES = SWEPT["learning_rate"]  # the paper's grid, as declared
RESULT_NAME = "result.json"
SUBMISSION_DIR = "submission"


@dataclasses.dataclass(frozen=True)
class Trial:
    task: SentenceTask
    learning_rate: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.task.name}/lr={self.learning_rate:g}_seed={self.seed}"

    def directory(self, workdir: str) -> str:
        return os.path.join(
            workdir, "trials", self.task.name, f"lr={self.learning_rate:g}_seed={self.seed}"
        )


@dataclasses.dataclass
class SweepOutcome:
    """Every trial's record (loaded or new), which trials ran now, and the report files."""

    records: list[dict[str, Any]]
    ran: list[str]
    reused: list[str]
    selected: dict[str, dict[str, Any]]  # by task, the selected trial's record
    written: list[str]
    models: dict[str, str | None] = dataclasses.field(default_factory=dict)  # by task


def trials_for(
    tasks: Sequence[str], learning_rates: Sequence[float], seeds: Sequence[int]
) -> list[Trial]:
    """Every (task, learning rate, seed) in sweep order: tasks as given, then lr, then seed."""
    if not tasks or not learning_rates or not seeds:
        raise UserError("a sweep needs at least one task, learning rate and seed")
    specs = [get_task(name) for name in tasks]
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise UserError(f"a task is listed twice in {list(tasks)}")
    if len(set(learning_rates)) != len(learning_rates) or len(set(seeds)) != len(seeds):
        raise UserError("learning rates and seeds must not repeat")
    for lr in learning_rates:  # checked by their declarations before any trial runs
        FinetuneSettings(learning_rate=float(lr))
    for seed in seeds:
        FinetuneSettings(seed=int(seed))
    return [
        Trial(spec, float(lr), int(seed))
        for spec in specs
        for lr in learning_rates
        for seed in seeds
    ]


def write_json_atomic(path: str, payload: Any) -> None:
    files.write_json_atomic(path, payload)


def write_submission_tsv(path: str, guids: Sequence[str], predictions: Sequence[str]) -> None:
    """`index<TAB>prediction` per test row, as the GLUE server reads it (written atomically)."""
    rows = [f"{guid}\t{prediction}\n" for guid, prediction in zip(guids, predictions, strict=True)]
    files.write_bytes_atomic(path, ("index\tprediction\n" + "".join(rows)).encode("utf-8"))


def trial_record(
    trial: Trial, result: FinetuneResult, model: str, data: str, run_id: str
) -> dict[str, Any]:
    record = result.to_json()
    record.update(
        learning_rate=trial.learning_rate,
        seed=trial.seed,
        trial=trial.name,
        model=model,
        data=data,
        run_id=run_id,
        finished_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        test_files=sorted(submission_file(trial.task, split) for split in result.test_predictions),
    )
    return record


def load_finished(
    trial: Trial, workdir: str, settings: FinetuneSettings, model: str
) -> dict[str, Any] | None:
    """The trial's saved record when it finished with matching settings; None when not finished."""
    return load_matching(os.path.join(trial.directory(workdir), RESULT_NAME), settings, model)


def as_run(saved_settings: dict[str, Any]) -> dict[str, Any]:
    """A saved run's settings with those added since filled in as the run ran them: the declared
    default, except that "bert" runs saved before `decay_from` decayed from step 0, and before
    `adam_epsilon` ran the original code's 1e-6 ("adamw-hf" runs ran torch's, the default)."""
    ran = {**DEFAULTS, **saved_settings}
    before = {"decay_from": "step-0", "adam_epsilon": optim.BERT_EPSILON}
    if ran["optimizer"] == "bert":
        ran.update({k: v for k, v in before.items() if k not in saved_settings})
    return ran


def load_matching(path: str, settings: FinetuneSettings, model: str) -> dict[str, Any] | None:
    """A finished run's `result.json` at `path` (None when absent; `result.read_back`: with its
    selection score where an older run wrote none); a UserError when it was run with other
    settings or another model (shared by every resumable fine-tuning run)."""
    if not fs.exists(path):
        return None
    with fs.open(path, encoding="utf-8") as f:
        record = json.load(f)
    want = settings.to_dict()
    saved = as_run(record["settings"])
    differ = [
        f"{key}: saved {saved.get(key)!r}, now {want[key]!r}"
        for key in TRIAL_SETTINGS  # what changes a run's result (each setting's declaration)
        if saved.get(key) != want[key]
    ]
    if record.get("model") != model:
        differ.append(f"model: saved {record.get('model')!r}, now {model!r}")
    if differ:
        raise UserError(
            f"{path} is a finished trial with different settings ({'; '.join(differ)}); use "
            "another --workdir, or delete it to run the trial again"
        )
    return read_back(record)


def is_writer() -> bool:
    """Only the first process writes results (every process computes the same ones)."""
    return jax.process_index() == 0


def run_trial(
    trial: Trial,
    encoder: PretrainedEncoder,
    model: str,
    task_data: TaskData,
    data: str,
    directory: str,
    settings: FinetuneSettings,
    mesh: Any,
    run_id: str,
    log: Callable[[str], None],
    selected: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune one trial, write its test predictions and its model (as `--keep-models` says;
    `selected`: the task's selected trial before this one, None for the first or a single run),
    then its result.json (the done marker).

    `model` names the pretrained model in the record (what a resumed sweep compares).
    """
    trial_settings = dataclasses.replace(
        settings, learning_rate=trial.learning_rate, seed=trial.seed
    )
    trained: dict[str, Any] = {}
    result = finetune(
        encoder, task_data, trial_settings, mesh=mesh, log=log, on_trained=trained.update
    )
    record = trial_record(trial, result, model, data, run_id)
    now_selected = selected is None or trial.task.is_better(
        record["selection_score"], selected["selection_score"]
    )
    entry = sentence_task_entry(trial.task, trial_settings)
    finetuned_model.keep(directory, settings, now_selected, encoder, trained["params"], entry)
    if is_writer():
        fs.makedirs(directory, exist_ok=True)
        for split, (guids, predictions) in result.test_predictions.items():
            write_submission_tsv(
                os.path.join(directory, submission_file(trial.task, split)), guids, predictions
            )
        write_json_atomic(os.path.join(directory, RESULT_NAME), record)
    return record


def run_single(
    model: str | PretrainedEncoder,
    task: str | SentenceTask,
    data: str,
    workdir: str,
    settings: FinetuneSettings | None = None,
    predict_test: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """`bert-jax finetune`: one task and setting; writes `workdir/result.json` and the test
    predictions (`workdir/<FILE>.tsv`, GLUE-server format). Returns the result record."""
    log = log or logger.info
    settings = settings or FinetuneSettings()
    spec = get_task(task) if isinstance(task, str) else task
    check_task_files(data, spec)
    # The workdir is checked first and created only once the model has been read: a damaged
    # model directory leaves no new workdir behind.
    finetune_workdir.check_workdir(workdir)
    mesh = make_mesh(settings)
    # Loaded here, the encoder is this run's alone: its params go into the state once.
    encoder = load_pretrained(model, single_run=True) if isinstance(model, str) else model
    workdir = finetune_workdir.open_workdir(workdir, "finetune", writer=is_writer())
    test_splits = available_test_splits(data, spec) if predict_test else []
    task_data = load_task_data(data, spec, encoder.tokenizer, settings.max_seq_length, test_splits)
    trial = Trial(spec, settings.learning_rate, settings.seed)
    run_id = f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    model_name = fs.abspath(model) if isinstance(model, str) else model.source
    return run_trial(
        trial,
        encoder,
        model_name,
        task_data,
        data,
        fs.abspath(workdir),
        settings,
        mesh,
        run_id,
        log,
    )


def sentence_task_entry(task: SentenceTask, settings: FinetuneSettings) -> dict[str, Any]:
    """The fine-tuned model directory's task entry of a sentence task (model_dir's docstring):
    a classifier over its labels, or STS-B's regressor; `pair` says which texts it reads."""
    head = "regression" if task.is_regression else "classification"
    labels = [] if task.is_regression else list(task.labels or ())
    return finetuned_model.task_entry(task.name, head, labels, settings, pair=task.is_pair)


def select_trials(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task, the selected trial's record: the best selection score in the task's direction
    (`Task.is_better`; the earliest on ties)."""
    selected: dict[str, dict[str, Any]] = {}
    for record in records:
        current = selected.get(record["task"])
        if current is None or get_task(record["task"]).is_better(
            record["selection_score"], current["selection_score"]
        ):
            selected[record["task"]] = record
    return selected


def trial_directory(record: dict[str, Any], workdir: str) -> str:
    """Where a trial's record, predictions and model lie."""
    trial = Trial(get_task(record["task"]), record["learning_rate"], record["seed"])
    return trial.directory(workdir)


def keep_selected_models(
    selected: dict[str, dict[str, Any]],
    records: Sequence[dict[str, Any]],
    workdir: str,
    settings: FinetuneSettings,
) -> dict[str, str | None]:
    """Each task's selected trial's model directory (None where it kept none: a trial run with
    `--keep-models none`); under "selected", the other trials' models are removed."""
    models: dict[str, str | None] = {}
    for task_name, record in selected.items():
        keep = trial_directory(record, workdir)
        if settings.keep_models == "selected":
            others = [trial_directory(r, workdir) for r in records if r["task"] == task_name]
            finetuned_model.prune(others, keep)
        path = os.path.join(keep, finetuned_model.MODEL_SUBDIR)
        models[task_name] = path if fs.exists(os.path.join(path, "config.json")) else None
    return models


def copy_submission(selected: dict[str, dict[str, Any]], workdir: str) -> list[str]:
    """Copy each task's selected trial's prediction files into `workdir/submission/`."""
    target = os.path.join(workdir, SUBMISSION_DIR)
    fs.makedirs(target, exist_ok=True)
    written = []
    for task_name, record in selected.items():
        source = Trial(get_task(task_name), record["learning_rate"], record["seed"]).directory(
            workdir
        )
        for name in record.get("test_files", []):
            data = fs.read_bytes(os.path.join(source, name))
            files.write_bytes_atomic(os.path.join(target, name), data)
            written.append(os.path.join(target, name))
    return written


# The sweep's own options beside the settings: the lists of the swept settings among them.
SWEEP_OPTIONS = ("tasks", *(swept_option(name) for name in SWEPT), "predict_test")


def _read_config_file(path: str) -> dict[str, Any]:
    """A JSON file, or a Python file whose `get_config()` returns a dict or ConfigDict."""
    if not os.path.isfile(path):
        raise UserError(f"sweep config not found: {path}")
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    elif path.endswith(".py"):
        import importlib.util

        spec = importlib.util.spec_from_file_location("_glue_sweep_config", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise UserError(f"{path} defines no get_config()")
        values = module.get_config()
        values = values.to_dict() if hasattr(values, "to_dict") else dict(values)
    else:
        raise UserError(f"sweep config {path}: use a .json or .py file")
    if not isinstance(values, dict):
        raise UserError(f"sweep config {path} must hold a mapping, not {type(values).__name__}")
    return values


def sweep_options(
    config_path: str | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The sweep's options: the paper's defaults < a config file < explicit overrides (not None).

    Returns keyword arguments for `run_sweep`: tasks, learning_rates, seeds, predict_test and
    settings (a FinetuneSettings). Unknown keys are an error naming them.
    """
    fields = {f.name for f in dataclasses.fields(FinetuneSettings)}
    values: dict[str, Any] = {}
    sources = [(config_path, _read_config_file(config_path))] if config_path else []
    sources.append(("command line", {k: v for k, v in (overrides or {}).items() if v is not None}))
    for source, given in sources:
        unknown = sorted(set(given) - fields - set(SWEEP_OPTIONS))
        if unknown:
            raise UserError(
                f"{source}: unknown sweep option(s) {unknown}; known: "
                f"{sorted(fields | set(SWEEP_OPTIONS))}"
            )
        values.update(given)
    settings_values = {k: v for k, v in values.items() if k in fields}
    if "mesh_shape" in settings_values:
        settings_values["mesh_shape"] = tuple(int(x) for x in settings_values["mesh_shape"])
    kinds = {field.name: field.type for field in dataclasses.fields(FinetuneSettings)}
    swept = {
        swept_option(name): tuple(
            (float if kinds[name] == "float" else int)(x)
            for x in values.get(swept_option(name), defaults)
        )
        for name, defaults in SWEPT.items()
    }
    return {
        "tasks": tuple(values.get("tasks", registry.sweep_order())),
        **swept,
        "predict_test": bool(values.get("predict_test", True)),
        "settings": FinetuneSettings(**settings_values),
    }


def run_sweep(
    model: str | PretrainedEncoder,
    data: str,
    workdir: str,
    tasks: Sequence[str] | None = None,
    learning_rates: Sequence[float] = PAPER_LEARNING_RATES,
    seeds: Sequence[int] = SWEPT["seed"],
    settings: FinetuneSettings | None = None,
    predict_test: bool = True,
    on_trial_end: Callable[[dict[str, Any]], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> SweepOutcome:
    """Run (or resume) the sweep in `workdir`, then select each task's trial (best on dev),
    keep its model (`settings.keep_models`) and write every report.

    `model`: a model directory / pretraining workdir path, or an already loaded encoder.
    `tasks` defaults to the paper's nine (`registry.sweep_order()`); `on_trial_end` is called
    with each new trial's record right after it is saved.
    """
    log = log or logger.info
    settings = settings or FinetuneSettings()
    tasks = registry.sweep_order() if tasks is None else tasks
    trials = trials_for(tasks, learning_rates, seeds)
    for spec in {trial.task.name: trial.task for trial in trials}.values():
        check_task_files(data, spec)
    workdir = finetune_workdir.open_workdir(workdir, "glue", writer=is_writer())
    mesh = make_mesh(settings)
    # The model is loaded only when a trial has to run: a finished sweep rewrites its reports
    # without reading any weights.
    encoder = None if isinstance(model, str) else model
    model_source = fs.abspath(model) if isinstance(model, str) else model.source
    run_id = f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"

    records: list[dict[str, Any]] = []
    ran: list[str] = []
    reused: list[str] = []
    data_by_task: dict[str, Any] = {}
    for trial in trials:
        record = load_finished(trial, workdir, settings, model_source)
        if record is not None:
            log(f"{trial.name}: finished earlier, skipped")
            records.append(record)
            reused.append(trial.name)
            continue
        if encoder is None:
            encoder = load_pretrained(model_source)
        if trial.task.name not in data_by_task:
            # Encoded once per task, only when a trial of it still has to run.
            data_by_task.clear()
            test_splits = available_test_splits(data, trial.task) if predict_test else []
            data_by_task[trial.task.name] = load_task_data(
                data, trial.task, encoder.tokenizer, settings.max_seq_length, test_splits
            )
        log(f"{trial.name}: running")
        selected_before = select_trials(records).get(trial.task.name)
        record = run_trial(
            trial,
            encoder,
            model_source,
            data_by_task[trial.task.name],
            data,
            trial.directory(workdir),
            settings,
            mesh,
            run_id,
            log,
            selected=selected_before,
        )
        shown = figures(record["dev_metrics"], trial.task.name)
        log(f"{trial.name}: dev {shown} ({record['seconds']:.1f}s)")
        for note in references.prediction_notes(record):
            log(f"{trial.name}: warning: {note}")
        records.append(record)
        ran.append(trial.name)
        if on_trial_end is not None:
            on_trial_end(record)

    selected = select_trials(records)
    models = keep_selected_models(selected, records, workdir, settings)
    for task_name, path in models.items():
        if path is not None:
            log(f"{task_name}: the selected trial's model is {path}")
        elif settings.keep_models != "none":
            log(
                f"{task_name}: the selected trial ({selected[task_name]['trial']}) kept no "
                "model (it ran with --keep-models none); delete its result.json and run the "
                "sweep again to train it once more"
            )
    if encoder is None:  # every trial finished earlier: the config alone, no weights
        config = load_model.load_model_dir(model_source, load_params=False).config
    else:
        config = encoder.config
    if not is_writer():
        return SweepOutcome(records, ran, reused, selected, written=[], models=models)
    written = copy_submission(selected, workdir)
    written += report.write_reports(
        workdir,
        records,
        selected,
        model=model_source,
        model_label=config_lib.model_label(config),
        data=data,
        learning_rates=learning_rates,
        seeds=seeds,
        settings=settings,
    )
    return SweepOutcome(records, ran, reused, selected, written=written, models=models)
