"""What one fine-tuning run produced, for every task (GLUE's sentence tasks, SQuAD, CoNLL-2003
fine-tuned and feature-based, SWAG): `FinetuneResult`, built by each run from the shared loop's
`tuning_loop.Trained` (`FinetuneResult.of_run`) and written as the run's `result.json`.

result.json holds `to_json()`, plus what the run adds about where it came from (`model`,
`data`, `options`, `finished_at`; a sweep's trial: `trial`, `learning_rate`, `seed`, `run_id`,
`test_files`). Its keys are the fields below; a family's own figures (`details`: SQuAD's
`num_dev_examples`, CoNLL-2003's `labels`, `iob1` and `test_metrics`, the feature-based tagger's
`features` and `layers`, ...) sit beside them at the top level, and `dev_baseline` and
`prediction_summary` only where the run records them (GLUE, SWAG). `from_json` reads any run's
result.json back, those written before every task recorded its `selection_score` included
(`read_back` computes it then from the task's `selected_by`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tasks.task import Task

# Written only where a run records them (GLUE's and SWAG's runs record the first two, SQuAD's
# and CoNLL's not; a result.json read back from before runs timed their steps has no third).
_WHERE_RECORDED = ("dev_baseline", "prediction_summary", "train_seconds")


@dataclasses.dataclass
class FinetuneResult:
    """One run's figures. `dev_metrics` are the last evaluation's: metric -> figure in percent,
    or for a task with several dev evaluations (GLUE) report name (`MNLI-m`) -> metrics.
    `selection_score` is the task's `selected_by` on dev (`Task.selection_score`), what a sweep
    compares with `Task.is_better`."""

    task: str  # the registered task's name
    settings: dict[str, Any]  # FinetuneSettings.to_dict()
    dev_metrics: dict[str, Any]
    selection_score: float
    train_loss: float
    num_train_examples: int
    num_train_steps: int
    skipped_steps: int
    seconds: float
    history: list[dict[str, Any]]  # {"step", "epoch", "dev"} per evaluation
    # Of `seconds`, the training steps' (`tuning_loop.Trained.train_seconds`); None in a
    # result.json written before runs recorded it.
    train_seconds: float | None = None
    # By dev report name: what predicting one thing scores (`glue_metrics.constant_baseline`).
    dev_baseline: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # {"dev": {report name: summary}, "test": {split: summary}}: how the final predictions
    # spread (`glue_metrics.prediction_summary`; `single` names a model that predicts one thing).
    prediction_summary: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # The family's own figures, written beside the fields above.
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    # GLUE: test split -> (guids, prediction strings as the GLUE server expects them); not
    # written to result.json (the run writes them as files).
    test_predictions: dict[str, tuple[list[str], list[str]]] = dataclasses.field(
        default_factory=dict
    )

    @classmethod
    def of_run(
        cls,
        task: Task,
        settings: Any,
        trained: Any,
        num_train_examples: int,
        seconds: float,
        **fields: Any,
    ) -> FinetuneResult:
        """The result of `task`'s run with `settings` (a FinetuneSettings) whose loop returned
        `trained` (`tuning_loop.Trained`); `fields` are the other fields (`details`, ...)."""
        return cls(
            task=task.name,
            settings=settings.to_dict(),
            dev_metrics=trained.dev,
            selection_score=task.selection_score(trained.dev),
            train_loss=trained.train_loss,
            num_train_examples=num_train_examples,
            num_train_steps=trained.num_steps,
            skipped_steps=int(trained.state.skipped),
            seconds=seconds,
            history=trained.history,
            train_seconds=trained.train_seconds,
            **fields,
        )

    def to_json(self) -> dict[str, Any]:
        """result.json's figures (the run adds where it came from)."""
        values = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in ("details", "test_predictions")
        }
        for name in _WHERE_RECORDED:
            if values[name] is None or values[name] == {}:
                del values[name]
        clash = set(values) & set(self.details)
        if clash:
            raise ValueError(f"details {sorted(clash)} would overwrite the result's own fields")
        return {**values, **self.details}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> FinetuneResult:
        """A result.json read back (any run's, any version): the keys that are not fields go to
        `details`; a missing `selection_score` is the task's `selected_by` on dev."""
        record = read_back(record)
        names = {field.name for field in dataclasses.fields(cls)} - {"details", "test_predictions"}
        values = {key: value for key, value in record.items() if key in names}
        details = {key: value for key, value in record.items() if key not in names}
        return cls(**values, details=details)


def read_back(record: dict[str, Any]) -> dict[str, Any]:
    """A result.json's content as runs write it now: with its `selection_score` (the task's
    `selected_by` on dev, where a run written before every task recorded it has none)."""
    if "selection_score" in record or "dev_metrics" not in record:
        return record
    score = result_task(record).selection_score(record["dev_metrics"])
    return {**record, "selection_score": score}


def result_task(record: dict[str, Any]) -> Task:
    """The registered task a result.json is a run of (the feature-based one where it names
    `features`)."""
    return registry.get(record["task"], feature_based=record.get("features") is not None)
