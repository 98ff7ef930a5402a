"""What `bert-jax data prepare` is asked to do: `PrepareSettings`, every setting declared once.

Each field is made by `setting(default, help, ...)` (runtime/declarations.py): its default, help,
allowed range or choices, `records=True` where it shapes the records (`before=`: what records
made before it was recorded had), and `reader=True` for the readers' options. Everything else reads
the declaration: `data prepare`'s flags and their help (`declarations.add_flags`, cli/data.py),
the settings from the flags (`declarations.from_args`), the range checks (`check`:
`declarations.problems` plus the checks across settings), the settings `prepare_config.json`
records (`recorded`) and the cache key of a pretraining run's preparation (`cached.py`), both
from the `records` declarations. Defaults owned elsewhere are read, never written again: the
masking and pairing defaults from data/objectives.py, the reading sizes from the readers, the
held-out share and group size from data/layout.py, the splitter from data/sentences.py.

This module imports neither NumPy nor TensorFlow: `--help` reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bert_jax.data import objectives
from bert_jax.data.layout import (
    DEFAULT_GROUP_BYTES,
    DEFAULT_HELDOUT_SHARE,
    HELDOUT_FLOOR_CAP,
    HELDOUT_MIN_DOCUMENTS,
    HELDOUT_SUBDIR,
)
from bert_jax.data.sentences import DEFAULT_SPLITTER, SPLITTERS, splitter_identity
from bert_jax.data.sources.readers import DEFAULT_MAX_LINE_BYTES, DEFAULT_TEXT_FIELD
from bert_jax.data.sources.splits import DEFAULT_TARGET_BYTES
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError


def _bytes(count: int) -> str:
    """64 MiB for 64 << 20: how help shows a size in bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift} {unit}"
    return str(count)


@dataclasses.dataclass(frozen=True)
class PrepareSettings:
    """How to prepare: one declared setting per `data prepare` flag (same name, same meaning);
    `records=True` marks those the records' bytes depend on."""

    max_seq_length: int = setting(
        objectives.MAX_SEQ_LENGTH,
        "tokens per instance, [CLS] and [SEP] in",
        low=5,  # [CLS] A [SEP] B [SEP]
        records=True,
    )
    max_predictions_per_seq: int = setting(
        objectives.MAX_PREDICTIONS_PER_SEQ,
        "masked positions per instance at most (at most --max-seq-length)",
        low=1,
        records=True,
    )
    masked_lm_prob: float = setting(
        objectives.MASKED_LM_PROB,
        "share of tokens masked",
        low=0.0,
        high=1.0,
        low_open=True,
        high_open=True,
        records=True,
    )
    short_seq_prob: float = setting(
        objectives.SHORT_SEQ_PROB,
        "share of instances cut shorter than --max-seq-length",
        low=0.0,
        high=1.0,
        records=True,
    )
    random_next_prob: float = setting(
        objectives.RANDOM_NEXT_PROB,
        "share of sentence pairs whose B is a random sentence of another document (NSP's "
        "label 1; a chunk of one sentence always takes one)",
        low=0.0,
        high=1.0,
        records=True,
        before=objectives.BEFORE_RECORDED["random_next_prob"],
    )
    # The command line's default, which users see: five passes, each masked anew. A library
    # caller that wants one pass says dupe_factor=1 (a pretraining run with dynamic masking does).
    dupe_factor: int = setting(5, "passes over the corpus, each masked anew", low=1, records=True)
    # google-research/bert's create_pretraining_data.py's random_seed.
    seed: int = setting(12345, "seeds the groups, pairs, masks and shuffle", low=0, records=True)
    whole_word_mask: bool = setting(False, "mask all pieces of a word together", records=True)
    objective: str = setting(
        objectives.DEFAULT_OBJECTIVE,
        "what the records are for: mlm+nsp (the paper's), mlm (no NSP) or ltr (left-to-right "
        "LM, unmasked); pretrain refuses records of another objective",
        choices=objectives.OBJECTIVES,
        records=True,
        before=objectives.BEFORE_RECORDED["objective"],
    )
    instance_format: str = setting(
        "",
        "sentence_pairs (NSP's), doc_sentences or full_sentences (RoBERTa's, no NSP)",
        zero="default: sentence_pairs for mlm+nsp, else full_sentences",
        records=True,
        before=objectives.BEFORE_RECORDED["instance_format"],
        metavar="FORMAT",
    )
    mask_share: float = setting(
        objectives.DEFAULT_SHARES["mask_share"],
        "share of the masked tokens replaced by [MASK]",
        low=0.0,
        high=1.0,
        records=True,
        before=objectives.BEFORE_RECORDED["mask_share"],
    )
    same_share: float = setting(
        objectives.DEFAULT_SHARES["same_share"],
        "share of the masked tokens left unchanged",
        low=0.0,
        high=1.0,
        records=True,
        before=objectives.BEFORE_RECORDED["same_share"],
    )
    random_share: float = setting(
        objectives.DEFAULT_SHARES["random_share"],
        "share of the masked tokens replaced by a random id",
        low=0.0,
        high=1.0,
        records=True,
        before=objectives.BEFORE_RECORDED["random_share"],
    )
    num_workers: int = setting(
        1,
        "processes on this machine (reading splits, then making groups); the records are the "
        "same for any number",
        low=1,
    )
    # The groups shape the records through the count they give (recorded as `num_groups`, a
    # derived entry: ``prepare_config.json`` holds the count, not these settings).
    num_groups: int = setting(
        0,
        "documents go to this many groups by a hash of their place in the input, a shard per "
        "group; random next sentences come from the same group",
        low=0,
        zero="0: one group per --group-bytes of input",
    )
    group_bytes: int = setting(
        DEFAULT_GROUP_BYTES,
        "input bytes per group when --num-groups is not given (as stored: compressed dumps and "
        "Parquet count compressed); a group is what a worker holds at a time",
        low=1,
        show=_bytes,
    )
    split_bytes: int = setting(
        DEFAULT_TARGET_BYTES,
        "inputs are read in splits of about this many bytes, a unit of parallel work; the "
        "records do not depend on it",
        low=1,
        show=_bytes,
    )
    heldout_share: float = setting(
        DEFAULT_HELDOUT_SHARE,
        "share of documents held out for evaluation (chosen by a hash of their place in the "
        f"input, the same for any runner), written as records of their own in "
        f"DIR/{HELDOUT_SUBDIR}/ and never in the training records; at least "
        f"{HELDOUT_MIN_DOCUMENTS} documents (at most 1 in {HELDOUT_FLOOR_CAP}) while above 0",
        low=0.0,
        high=0.5,
        zero="0: none",
        records=True,
        before=0.0,  # every document in the training records
    )
    documents_per_shard: int = setting(
        0,
        "no longer used (documents go to groups by hash): give --num-groups or --group-bytes; "
        "accepted, with a warning",
        low=0,
    )
    tfds_data_dir: str | None = setting(
        None,
        "where TFDS keeps its data sets (tfds: inputs; default: TFDS's own)",
        metavar="DIR",
        reader=True,
    )
    text_field: str = setting(
        DEFAULT_TEXT_FIELD,
        "JSONL / Parquet / TFDS field with the text",
        records=True,
        before="text",  # the field records made before it was recorded were read from
        metavar="NAME",
        reader=True,
    )
    sentence_split: bool = setting(
        False,
        "split the lines of text files into sentences (for a paragraph per line)",
        records=True,
        reader=True,
    )
    splitter: str = setting(
        DEFAULT_SPLITTER,
        "sentence splitter for prose (JSONL, Parquet, TFDS, Wikipedia, --sentence-split), "
        "chosen on benchmarks/sentence_split_eval.py; regex is the rules of earlier versions",
        choices=SPLITTERS,
        records=True,
        before="regex",  # what records made before the splitter was recorded were cut with
        reader="splitter_name",  # the readers' keyword
    )
    max_line_bytes: int = setting(
        DEFAULT_MAX_LINE_BYTES,
        "longer lines are skipped (counted as long_lines)",
        low=1,
        reader=True,
    )
    strict: bool = setting(False, "stop at the first bad line instead of skipping it", reader=True)
    overwrite: bool = setting(False, "rewrite the shards in --output")

    def check(self) -> None:
        """Raises a UserError naming every setting out of its declared range by its flag, then
        the checks across settings (the predictions fit the length; the objective's format; the
        MASK/SAME/RND shares add up)."""
        problems = declarations.problems(self)
        if self.max_predictions_per_seq > self.max_seq_length >= 1:
            problems.append(
                f"--max-predictions-per-seq {self.max_predictions_per_seq} must be in [1, "
                f"--max-seq-length {self.max_seq_length}]"
            )
        if problems:
            raise UserError("invalid data prepare settings: " + "; ".join(problems))
        objectives.instance_format(self.objective, self.instance_format, "--instance-format")
        from bert_jax.data.masking.settings import check_shares  # NumPy: not for --help

        check_shares(
            self.mask_share,
            self.same_share,
            self.random_share,
            ("--mask-share", "--same-share", "--random-share"),
        )

    def recorded(self) -> dict[str, Any]:
        """name -> value of every setting that shapes the records, as `prepare_config.json`
        records it: the instance format resolved, the splitter by its identity (the library's
        version too: another version may cut the same text differently), shares as floats."""
        values = {}
        for field in declarations.declared_fields(type(self)):
            if field.metadata["declaration"].records:
                value = getattr(self, field.name)
                # A share given as 0 or 1 is recorded as the float it means.
                values[field.name] = float(value) if isinstance(field.default, float) else value
        values["instance_format"] = objectives.instance_format(
            self.objective, self.instance_format, "--instance-format"
        )
        values["splitter"] = splitter_identity(self.splitter)
        return values

    def reader_options(self) -> dict[str, Any]:
        """The reader options (declared `reader`), under the readers' keywords: what
        `splits.cut_splits` and `splits.read_split` take beside the split."""
        return {
            (name if declared.reader is True else declared.reader): getattr(self, name)
            for name, declared in declarations.declarations(type(self)).items()
            if declared.reader
        }


RECORDS_SETTINGS = declarations.marked(PrepareSettings, "records")
