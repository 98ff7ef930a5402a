"""What a fine-tuning task is: the record every task registers once (`registry` holds them all).

A `Task` says which run trains it (its family), how users may spell its name, the metrics it
reports (the paper's first), the paper's recipe where it differs from `FinetuneSettings`' defaults,
the paper's figures, and its place in `bert-jax glue`'s sweep and in the reports. The family's
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

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"task {self.name}: family {self.family!r} is not one of {FAMILIES}")
        if not self.metrics:
            raise ValueError(f"task {self.name}: no metrics")

    @property
    def paper_metric(self) -> str:
        """The metric the paper reports first (what a sweep selects by and a curve plots)."""
        return self.metrics[0]

    @property
    def keys(self) -> frozenset[str]:
        """Every spelling of its name, as `name_key` compares them."""
        return frozenset(name_key(name) for name in (self.name, *self.aliases))
