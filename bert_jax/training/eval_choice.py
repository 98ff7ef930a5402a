"""Whether and on what each phase of a pretraining run evaluates: the one decision
(`eval_choices`) that the loop, its first line and its dry run read, and its words
(`eval_outline`)."""

from __future__ import annotations

import dataclasses
import json
import os

from bert_jax.data import layout
from bert_jax.data.records import manifest
from bert_jax.data.sources import kinds as sources
from bert_jax.runtime import fs
from bert_jax.training.config_lib import Phase


@dataclasses.dataclass(frozen=True)
class EvalChoice:
    """Whether and on what one phase evaluates: `source` ('' = it does not), why (in words), the
    steps at which it does (counted as the loop counts them: after `step` steps), and how many
    batches of config.eval.batch_size (fewer than config.eval.batches where the held-out records
    hold fewer instances: `note` says so)."""

    source: str
    why: str
    steps: tuple[int, ...] = ()
    batches: int = 0
    note: str = ""
    # `source` is a training corpus: the held-out records its preparation sets aside.
    of_prepared_corpus: bool = False


def evaluates_at(config, step: int, total: int) -> bool:
    """Whether the run evaluates after `step` steps of `total` (if its phase has a source):
    every config.eval.every_steps and at the end; never with every_steps <= 0."""
    every = int(config.eval.every_steps)
    return every > 0 and (step % every == 0 or step == total)


def eval_choices(config, phases: list[Phase]) -> list[EvalChoice]:
    """The one decision of whether and on what each phase evaluates (the loop, its first line
    and the dry run read it), first that applies: evaluation off (config.eval.every_steps=0),
    config.eval.source, the held-out records beside the phase's records
    (`<records>/heldout`, written by `data prepare`), the embedded corpus's held-out split; else
    none, saying why. A phase none of whose steps is an eval step evaluates nothing either."""
    total = phases[-1].end if phases else 0
    every = int(config.eval.every_steps)
    choices = []
    for phase in phases:
        choice = _eval_source(config, phase)
        if not choice.source:
            choices.append(choice)
            continue
        # Multiples of every_steps in (start, end], and the run's last step.
        steps = list(range((phase.start // every + 1) * every, phase.end + 1, every))
        if phase.end == total and (not steps or steps[-1] != total):
            steps.append(total)
        if not steps:
            choices.append(
                EvalChoice("", f"no eval step falls in its steps {phase.start}..{phase.end - 1}")
            )
            continue
        choices.append(
            dataclasses.replace(choice, steps=tuple(steps), **_eval_size(config, choice))
        )
    return choices


def _eval_size(config, choice: EvalChoice) -> dict:
    """config.eval.batches, or as many whole batches as prepared records hold (counted by the
    `part-NNNNN.json` beside each shard), so that no instance is evaluated twice."""
    batches, size = int(config.eval.batches), int(config.eval.batch_size)
    count = _prepared_instances(choice.source)
    if count is None or count >= batches * size:
        return {"batches": batches}
    if count < size:
        note = f"its {count} instances are fewer than a batch of {size}: some count twice"
        return {"batches": 1, "note": note}
    whole = count // size
    return {"batches": whole, "note": f"{whole} batches, as many as its {count} instances fill"}


def _prepared_instances(source: str) -> int | None:
    """The instances of records `data prepare` wrote (the sum of each shard's counts file);
    None for anything else (a corpus, foreign records, a shard without its counts)."""

    if not (source and fs.isdir(source)):
        return None
    shards = [name for name in fs.listdir(source) if name.endswith(layout.RECORD_SUFFIX)]
    total = 0
    for name in shards:
        counts = os.path.join(source, name[: -len(layout.RECORD_SUFFIX)] + ".json")
        if not fs.exists(counts):
            return None
        with fs.open(counts, encoding="utf-8") as f:
            total += int(json.load(f).get("instances", 0))
    return total if shards else None


def _eval_source(config, phase: Phase) -> EvalChoice:

    if int(config.eval.every_steps) <= 0:
        return EvalChoice("", "config.eval.every_steps=0")
    if config.eval.source:
        return EvalChoice(config.eval.source, "config.eval.source")
    if not phase.source:  # the run refuses this (config_checks.validate)
        return EvalChoice("", "no data is named")
    kind = sources.source_kind(phase.source)
    if kind == "embedded":
        return EvalChoice("embedded:eval", "the embedded corpus's held-out split")
    unset = "and config.eval.source is not set"
    if kind != "records":  # a corpus the run prepares, setting data prepare's share aside
        why = f"the held-out records set aside when {phase.source} is prepared"
        return EvalChoice(phase.source, why, of_prepared_corpus=True)
    heldout = layout.heldout_dir(phase.source)
    if not (fs.isdir(heldout) and sources.source_kind(heldout) == "records"):
        return EvalChoice(
            "", f"{phase.source} has no held-out records ({layout.HELDOUT_SUBDIR}/) {unset}"
        )
    if not complete_heldout(phase.source):
        return EvalChoice("", f"the held-out records {heldout} are incomplete {unset}")
    return EvalChoice(heldout, f"the held-out records of {phase.source}")


def complete_heldout(records: str) -> str:
    """The held-out records directory of `records` when it holds finished records, else ''."""

    heldout = layout.heldout_dir(records)
    if not (fs.isdir(heldout) and sources.source_kind(heldout) == "records"):
        return ""
    try:
        manifest.require_complete(heldout)
    except manifest.IncompleteRecordsError:
        return ""
    return heldout


def eval_outline(config, phases: list[Phase]) -> tuple[str, list[str]]:
    """(summary, a line per phase) of eval_choices in words: the run's first line says the
    summary, the dry run both."""
    choices = eval_choices(config, phases)
    if not any(choice.source for choice in choices):
        reasons = list(dict.fromkeys(choice.why for choice in choices))
        return f"no eval ({'; '.join(reasons)})", []
    summary = (
        f"eval every {config.eval.every_steps} steps and at the end ({config.eval.batches} "
        f"batches of {config.eval.batch_size}, at each phase's sequence length)"
    )  # a phase whose held-out records hold fewer says so on its line
    lines = []
    for phase, choice in zip(phases, choices):
        if not choice.source:
            lines.append(f"{phase.name}: no eval ({choice.why})")
            continue
        steps = choice.steps
        at = f"step {steps[0]}"
        if len(steps) > 1:
            at = f"{len(steps)} steps ({steps[0]}..{steps[-1]})"
        note = f"; {choice.note}" if choice.note else ""
        lines.append(f"{phase.name}: at {at} on {choice.source} ({choice.why}){note}")
    return summary, lines
