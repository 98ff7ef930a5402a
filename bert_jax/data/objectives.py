"""Pretraining objectives as data settings: which objective records are made for, in which
instance format, and the one-line refusals when records and a config disagree.

Objectives (``OBJECTIVES``, as ``core.bert_config``'s): "mlm+nsp" (the paper's), "mlm" (masked
LM only, no NSP) and "ltr" (a left-to-right LM; records carry no masking). Instance formats:

- ``sentence_pairs``: ``[CLS] A [SEP] B [SEP]`` with B the actual or a random next (the paper's;
  the only format NSP can train on, and the paper's own "No NSP" input).
- ``doc_sentences``: contiguous sentences of one document up to the length, ``[CLS] ... [SEP]``
  (RoBERTa's DOC-SENTENCES): an instance never crosses a document, so the last one of a
  document is often short.
- ``full_sentences``: contiguous sentences up to the length, crossing documents with a [SEP]
  between them (RoBERTa's FULL-SENTENCES): every instance but a group's last is nearly full.

Records without a recorded objective (older ``data prepare`` output) are "mlm+nsp" sentence pairs.

The masking defaults are defined here and nowhere else (``MASKED_LM_PROB``,
``MAX_PREDICTIONS_PER_SEQ``, ``DEFAULT_SHARES``), with the instances' length
(``MAX_SEQ_LENGTH``), the share of short instances (``SHORT_SEQ_PROB``) and NSP's share of random
next sentences (``RANDOM_NEXT_PROB``): masking, instance creation, preparation's declared settings
(data/preparation/settings.py, whence ``bert-jax data prepare``'s flags), the pipeline and the
training config read them.
"""

from __future__ import annotations

from bert_jax.runtime.errors import UserError

# Spelled again here because `data` imports neither `core` nor JAX (`data prepare` runs without
# them); tests/test_objectives.py checks that the two tuples are equal.
OBJECTIVES = ("mlm+nsp", "mlm", "ltr")
INSTANCE_FORMATS = ("sentence_pairs", "doc_sentences", "full_sentences")
DEFAULT_OBJECTIVE = "mlm+nsp"
# The masking defaults, defined here only: MaskingConfig, PrepareSettings, PipelineSettings, the
# training config and `data prepare`'s flags all read them (this module imports no NumPy, so the
# command line can). The paper's (and google-research/bert's create_pretraining_data.py's):
# 15% of the tokens selected, at most 20 per 128-token sequence, and of the selected tokens 80%
# [MASK], 10% unchanged, 10% a random token (PAPER_SHARES: a fact of the paper and of the
# original tool's records, so also what records without recorded shares were masked with,
# BEFORE_RECORDED). DEFAULT_SHARES is the mix a run uses when none is given: change the default
# there, and records prepared before shares were recorded still read as PAPER_SHARES.
MASKED_LM_PROB = 0.15
MAX_PREDICTIONS_PER_SEQ = 20
PAPER_SHARES = {"mask_share": 0.8, "same_share": 0.1, "random_share": 0.1}
DEFAULT_SHARES = PAPER_SHARES
SHARE_KEYS = tuple(PAPER_SHARES)  # ("mask_share", "same_share", "random_share")
# The instances' length when none is given: the paper's first phase (90% of its steps).
MAX_SEQ_LENGTH = 128
# The share of sentence-pair instances cut to a random shorter length (the original's
# short_seq_prob), read by instance creation, `data prepare` and the training config alike.
SHORT_SEQ_PROB = 0.1
# NSP: the share of sentence pairs whose B is a random sentence of another document (label 1).
# The paper's 50% (PAPER_RANDOM_NEXT_PROB, what every record prepared before the share was
# recorded used: BEFORE_RECORDED) is the default.
PAPER_RANDOM_NEXT_PROB = 0.5
RANDOM_NEXT_PROB = PAPER_RANDOM_NEXT_PROB
# What `data prepare` records about the objective, with the value of records prepared before it
# did (PrepareSettings' declarations read it as their `before`; manifest.BEFORE_RECORDED).
BEFORE_RECORDED = {
    "objective": DEFAULT_OBJECTIVE,
    "instance_format": "sentence_pairs",
    **PAPER_SHARES,
    "random_next_prob": PAPER_RANDOM_NEXT_PROB,
}


def shares_text(shares: dict) -> str:
    """80/10/10 for {"mask_share": 0.8, "same_share": 0.1, "random_share": 0.1}."""
    return "/".join(f"{100 * shares[k]:g}" for k in SHARE_KEYS)


def check_objective(objective: str, setting: str) -> str:
    if objective not in OBJECTIVES:
        raise UserError(f"{setting}={objective!r} is not one of {', '.join(OBJECTIVES)}")
    return objective


def instance_format(objective: str, requested: str, setting: str) -> str:
    """The instance format of `objective` ("" : sentence_pairs with NSP, else full_sentences);
    UserError naming `setting` for an unknown one or for NSP without sentence pairs."""
    if not requested:
        return "sentence_pairs" if objective == "mlm+nsp" else "full_sentences"
    if requested not in INSTANCE_FORMATS:
        raise UserError(f"{setting}={requested!r} is not one of {', '.join(INSTANCE_FORMATS)}")
    if objective == "mlm+nsp" and requested != "sentence_pairs":
        raise UserError(
            f"{setting}={requested!r} has no next sentence to predict: objective 'mlm+nsp' "
            "needs sentence_pairs (use objective 'mlm' or 'ltr' for this format)"
        )
    if objective == "ltr" and requested == "sentence_pairs":
        raise UserError(
            f"{setting}='sentence_pairs' is not supported with objective 'ltr' (pairs are made "
            "masked): use doc_sentences or full_sentences"
        )
    return requested


def recorded_objective(prepare_config: dict | None) -> str | None:
    """The objective records were prepared for (None: foreign records, nothing recorded)."""
    if prepare_config is None:
        return None
    return str(prepare_config.get("objective", DEFAULT_OBJECTIVE))


def check_records(where: str, prepare_config: dict | None, objective: str, setting: str) -> None:
    """Refuses, in one line naming both, records prepared for another objective."""
    theirs = recorded_objective(prepare_config)
    if theirs is not None and theirs != objective:
        raise UserError(
            f"{where} holds records prepared for objective {theirs!r} but {setting} is "
            f"{objective!r}: prepare them with `data prepare --objective {objective}`"
        )


def check_model(where: str, theirs: str, objective: str, setting: str = "config.objective"):
    """Refuses, in one line naming both, starting from a model trained for another objective."""
    if theirs != objective:
        raise UserError(
            f"{where} was pretrained for objective {theirs!r} but {setting} is {objective!r}: "
            "a run continues its own objective (set the same objective, or start from scratch)"
        )
