"""What a fine-tuning task is: the record every task registers once (`registry` holds them all).

A `Task` says which run trains it (its family), how users may spell its name, the metrics it
reports (the paper's first), the paper's recipe where it differs from `FinetuneSettings`' defaults,
the paper's figures, the dev metric a run is selected by and its direction (`selected_by`,
`higher_is_better`: what a sweep's selection, a run's `selection_score` and the checkpoint curve
read), and its place in `bert-jax glue`'s sweep and in the reports. The family's
module beside this one (`glue`, `squad`, `conll`, `swag`) holds its reader, features and metrics,
and its tasks (a family's own record type adds what its run needs, e.g. `glue.SentenceTask`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# Families: which run trains a task (`runs.one_task` holds one run per family).
SENTENCE = "sentence"  # a classifier (or regressor) on the pooled [CLS]: GLUE and tasks like it
SPANS = "spans"  # start/end logits at every token: SQuAD
TAGS = "tags"  # a label at every word's first sub-token: CoNLL-2003 fine-tuned
FROZEN_TAGS = "frozen_tags"  # frozen BERT layers into a BiLSTM tagger: CoNLL-2003 feature-based
CHOICES = "choices"  # one score per choice on the pooled [CLS]: SWAG
FAMILIES = (SENTENCE, SPANS, TAGS, FROZEN_TAGS, CHOICES)


def name_key(name: str) -> str:
    """How task names compare: without case, '-' and '_', and without a `glue/` prefix."""
    if name.lower().startswith("glue/"):
        name = name[5:]
    return name.lower().replace("-", "").replace("_", "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """One fine-tuning task, as registered.

    `paper` holds the paper's rows for this task: (system, {column: figure in percent}); the
    columns are report names (`MNLI-m`) for GLUE and metric names for the others.
    `sweep_position` orders `bert-jax glue`'s default tasks (the paper's Table 1 order; None:
    not in the default sweep); `report_columns` are its columns in results.md's Table 1.
    """

    name: str  # as result.json records it and the reports show it
    family: str  # one of FAMILIES
    metrics: tuple[str, ...]  # the figures it reports on dev, the paper's first
    aliases: tuple[str, ...] = ()  # other spellings users may type (compared by `name_key`)
    feature_based: bool = False  # chosen with `--features` (BERT frozen)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # FinetuneSettings
    paper: tuple[tuple[str, Mapping[str, float]], ...] = ()
    sweep_position: int | None = None
    report_columns: tuple[str, ...] = ()
    benchmark: str | None = None  # "GLUE": counts in the official GLUE average
    train_size: str | None = None  # as the paper's table lists it (`392k`)
    # The dev metric runs are selected by (one of `metrics`; default: the paper's, the first) and
    # whether a higher figure is the better one.
    selected_by: str = ""
    higher_is_better: bool = True

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"task {self.name}: family {self.family!r} is not one of {FAMILIES}")
        if not self.metrics:
            raise ValueError(f"task {self.name}: no metrics")
        if not self.selected_by:
            object.__setattr__(self, "selected_by", self.metrics[0])
        if self.selected_by not in self.metrics:
            raise ValueError(
                f"task {self.name}: selected_by={self.selected_by!r} is not one of its metrics "
                f"{self.metrics}"
            )

    def selection_score(self, dev_metrics: Mapping[str, Any]) -> float:
        """The figure runs of this task are compared by: `selected_by` on dev, averaged over the
        dev evaluations where a run has several (GLUE's {report name: metrics}: MNLI's m and mm)."""
        if self.selected_by in dev_metrics:
            return float(dev_metrics[self.selected_by])
        values = [m[self.selected_by] for m in dev_metrics.values() if isinstance(m, Mapping)]
        if not values:
            raise KeyError(f"task {self.name}: no {self.selected_by!r} in {sorted(dev_metrics)}")
        return float(sum(values)) / len(values)  # np.mean's figure; --help imports no NumPy

    def is_better(self, score: float, than: float) -> bool:
        """Whether a run scoring `score` is selected over one scoring `than` (a tie is not)."""
        return score > than if self.higher_is_better else score < than

    @property
    def paper_metric(self) -> str:
        """The metric the paper reports first (its reports' column; runs are selected by
        `selected_by`, this one unless the task names another)."""
        return self.metrics[0]

    @property
    def keys(self) -> frozenset[str]:
        """Every spelling of its name, as `name_key` compares them."""
        return frozenset(name_key(name) for name in (self.name, *self.aliases))
