"""The task heads a fine-tuned model directory may hold: one table, read by the writer
(`model_dir.save_model_dir(..., task=...)`), the loader and the exporter to transformers.

Each head kind names the transformers class it corresponds to in each family, its
`problem_type` where transformers has one, and how many outputs its classifier has. The tree a
fine-tuned model directory's params hold is the fine-tuning state's own: the encoder under
`ENCODER_KEY` (BERT's `BertModel` tree with its pooler; ModernBERT's `ModernBertModel` tree, a
plain ModernBERT directory's `model` subtree) and the head under `HEAD_KEY`:

    BERT       classifier/output/{kernel [hidden, outputs], bias [outputs]}
    ModernBERT classifier/head/{dense, norm}/...   (the MLM head's transform, transformers'
                                                   `head.dense`, `head.norm`)
               classifier/output/{kernel, bias}    (transformers' `classifier`, or `qa_outputs`)

This module imports nothing of fine-tuning (convert/ sits below finetune/): the heads' modules
live in `bert_jax.finetune.heads`, and tests/test_finetuned_model_dir.py holds this table's trees
equal to theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

ENCODER_KEY = "bert"  # the fine-tuning state's encoder subtree, in both families
HEAD_KEY = "classifier"  # the head's subtree


@dataclasses.dataclass(frozen=True)
class HeadKind:
    """One kind of task head. `classes`: config.json's `model_type` -> transformers' class;
    `outputs`: the classifier's width when fixed (None: one output per label);
    `problem_type`: transformers' config field, where the class reads it."""

    name: str
    classes: Mapping[str, str]
    outputs: int | None
    problem_type: str | None
    about: str

    def architecture(self, family: str) -> str:
        return self.classes[family]

    def num_outputs(self, labels: Sequence[str]) -> int:
        return self.outputs if self.outputs is not None else len(labels)


def _classes(suffix: str) -> dict[str, str]:
    return {"bert": f"BertFor{suffix}", "modernbert": f"ModernBertFor{suffix}"}


HEADS: dict[str, HeadKind] = {
    kind.name: kind
    for kind in (
        HeadKind(
            "classification",
            _classes("SequenceClassification"),
            None,
            "single_label_classification",
            "a label for a text or a pair (GLUE but STS-B)",
        ),
        HeadKind(
            "regression",
            _classes("SequenceClassification"),
            1,
            "regression",
            "a score for a text or a pair (STS-B)",
        ),
        HeadKind(
            "multiple_choice",
            _classes("MultipleChoice"),
            1,
            None,
            "one score per choice, softmax over the choices (SWAG)",
        ),
        HeadKind(
            "span",
            _classes("QuestionAnswering"),
            2,
            None,
            "start and end logits at every token (SQuAD)",
        ),
        HeadKind(
            "tags",
            _classes("TokenClassification"),
            None,
            None,
            "a tag per word, read at its first sub-token (CoNLL-2003)",
        ),
    )
}


def get(name: str) -> HeadKind:
    """The head kind `name`; a ValueError naming the kinds for another."""
    if name not in HEADS:
        raise ValueError(f"head {name!r} is not one of {', '.join(HEADS)}")
    return HEADS[name]


def head_tree(config: Any, head: str, labels: Sequence[str]) -> dict[str, Any]:
    """The shapes (nested dict of tuples) of the head's params for `config`'s family."""
    from bert_jax.convert import modernbert_names
    from bert_jax.core.modernbert_config import ModernBertConfig

    outputs, hidden = get(head).num_outputs(labels), config.hidden_size
    tree: dict[str, Any] = {"output": {"kernel": (hidden, outputs), "bias": (outputs,)}}
    if isinstance(config, ModernBertConfig):
        tree["head"] = modernbert_names.expected_tree(config, has_heads=True)["head"]
    return tree


def transformers_fields(family: str, task: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's fields as transformers writes them for the task's class: `architectures`,
    `num_labels`, `id2label` and `label2id` (string keys of ints; transformers' `LABEL_i` where
    the head's outputs have no names of their own), `problem_type` where the class reads it."""
    kind = get(task["head"])
    labels = list(task["labels"])
    count = kind.num_outputs(labels)
    names = labels if len(labels) == count else [f"LABEL_{i}" for i in range(count)]
    fields: dict[str, Any] = {
        "architectures": [kind.architecture(family)],
        "num_labels": count,
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }
    if kind.problem_type is not None:
        fields["problem_type"] = kind.problem_type
    return fields


# config.json's keys that `transformers_fields` writes (read back by nothing else here).
TRANSFORMERS_KEYS = ("architectures", "num_labels", "id2label", "label2id", "problem_type")
