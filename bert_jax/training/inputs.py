"""The pretraining run's input side: the model it starts from, and the one decision of each input
that the run, its first line and its dry run read: the tokenizer (tokenizer_choice), the model's
vocabulary (vocab_choice: the tokenizer's unless set), the records (a raw corpus prepared once),
the iterators per phase, and whether and on what each phase evaluates (eval_choices)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable

import jax

from bert_jax.data.pipeline import input_shards
from bert_jax.runtime import distributed, fs
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib
from bert_jax.training.config_lib import Phase

log = logging.getLogger("bert_jax")


def adopt_init_from(config, explicit: Iterable[str] = ()) -> list[str]:
    """With `config.init_from`: the model directory's architecture beyond shapes (hidden_act,
    layer_norm_eps, type and position embeddings, vocab_size) and its tokenizer replace the
    config's defaults, each logged; a conflicting setting the user made is refused, naming both
    values (see config_lib.adopt_model_identity; `explicit`: the --config.KEY overrides given).
    Returns what it changed, one "config.KEY: old -> new (from ...)" line each."""
    path = config.get("init_from", "")
    if not path:
        return []
    from bert_jax.convert import model_dir
    from bert_jax.data import objectives

    if model_dir.is_unexported_workdir(path):  # its run config and tokenizer/ describe the model
        with fs.open(os.path.join(path, model_dir.CONFIG_NAME), encoding="utf-8") as f:
            run = json.load(f)
        model = run.get("model", {})
        theirs = run.get("objective", objectives.DEFAULT_OBJECTIVE)
        tokenizer_dir = os.path.join(path, "tokenizer")
    else:
        model = model_dir.read_config(path)[0].to_dict()
        theirs = model["objective"]
        tokenizer_dir = os.path.join(model_dir.resolve(path), model_dir.TOKENIZER_DIR)
    source = f"config.init_from={path}"
    objectives.check_model(source, theirs, config_lib.objective(config))
    changes = config_lib.adopt_model_identity(config, model, source, explicit)
    if fs.isdir(tokenizer_dir) and config.data.tokenizer:
        from bert_jax.data.tokenizers import load_or_train as tokenizer_lib

        mine = tokenizer_lib.load_tokenizer(config.data.tokenizer).fingerprint()
        if mine != tokenizer_lib.load_tokenizer(tokenizer_dir).fingerprint():
            raise UserError(
                f"config.data.tokenizer={config.data.tokenizer} is not the tokenizer of {source} "
                f"({tokenizer_dir}): leave config.data.tokenizer out to use the model's"
            )
    elif fs.isdir(tokenizer_dir):
        config.data.tokenizer = tokenizer_dir
        changes.append(f"config.data.tokenizer: '' -> {tokenizer_dir!r}")
    changes = [f"{line} (from {source})" for line in changes]
    for line in changes:
        log.info("%s", line)
    return changes


@dataclasses.dataclass(frozen=True)
class TokenizerChoice:
    """Which tokenizer a run uses: its files (`path`; '' when the run trains one on `corpus`)
    and, in words, where it comes from."""

    path: str
    why: str
    corpus: str = ""


def trained_pieces(config) -> int:
    """The pieces of the SentencePiece model a run without a tokenizer trains:
    config.data.tokenizer_vocab_size, capped by a config.model.vocab_size that is set."""
    pieces = int(config.data.tokenizer_vocab_size)
    own = int(config.model.vocab_size)
    return pieces if own == config_lib.FOLLOW_TOKENIZER else min(pieces, own)


def tokenizer_choice(config, phases: list[Phase], workdir: str = "") -> TokenizerChoice:
    """The one decision of which tokenizer a run uses (the run and its dry run read it):
    `config.data.tokenizer`, the one saved next to prepared records, the one a run kept in
    `<workdir>/tokenizer`, or, for raw corpora only, one to train on the first phase's corpus."""
    from bert_jax.data import layout
    from bert_jax.data.sources import documents as sources

    if config.data.tokenizer:
        return TokenizerChoice(config.data.tokenizer, "config.data.tokenizer")
    for phase in phases:
        candidate = os.path.join(phase.source, layout.TOKENIZER_SUBDIR)
        if fs.isdir(candidate):
            return TokenizerChoice(candidate, f"saved with the records {phase.source}")
    own = os.path.join(workdir, "tokenizer") if workdir else ""
    if own and fs.isdir(own):
        return TokenizerChoice(own, "trained by an earlier run in this workdir")
    if not all(p.source for p in phases):  # the run refuses this (config_checks.validate)
        return TokenizerChoice("", "none yet (no data is named)")
    corpora = [p.source for p in phases if sources.source_kind(p.source) != "records"]
    if not corpora:
        raise UserError(
            "no tokenizer: set config.data.tokenizer (a tokenizer directory, .model or vocab.txt)"
        )
    where = f"kept in {own} for restarts" if own else "kept in <workdir>/tokenizer for restarts"
    return TokenizerChoice(
        "",
        f"a {trained_pieces(config)}-piece SentencePiece model trained on {corpora[0]} ({where})",
        corpora[0],
    )


def resolve_tokenizer(config, phases: list[Phase], workdir: str, console=lambda *a: None):
    """The run's tokenizer (tokenizer_choice), trained into `<workdir>/tokenizer` when the choice
    is to train one (`console` says so), so that restarts reuse it."""
    from bert_jax.data.tokenizers import load_or_train as tokenizer_lib

    choice = tokenizer_choice(config, phases, workdir)
    if choice.path:
        return tokenizer_lib.load_tokenizer(choice.path)
    own = os.path.join(workdir, "tokenizer")
    vocab_size = trained_pieces(config)
    if jax.process_index() == 0:
        console(
            f"training a {vocab_size}-piece SentencePiece tokenizer on {choice.corpus} (kept in "
            f"{own} for restarts)"
        )
        tokenizer_lib.train_tokenizer(
            [choice.corpus], vocab_size, own, lowercase=bool(config.data.lowercase)
        )
    distributed.sync_hosts("tokenizer")
    return tokenizer_lib.load_tokenizer(own)


@dataclasses.dataclass(frozen=True)
class VocabChoice:
    """The model's vocabulary and where it comes from: "set" (config.model.vocab_size) or
    "from the tokenizer" (config.model.vocab_size=0, the default)."""

    size: int
    origin: str

    def __str__(self) -> str:
        return f"vocab {self.size} ({self.origin})"


def vocab_choice(config, phases: list[Phase], workdir: str = "", tokenizer=None) -> VocabChoice:
    """The model's vocabulary as the run will have it (the dry run and the run's first line read
    it): config.model.vocab_size when set, else the size of the run's tokenizer (`tokenizer`, or
    tokenizer_choice's, loaded; trained_pieces for one the run will train)."""
    own = int(config.model.vocab_size)
    if own != config_lib.FOLLOW_TOKENIZER:
        return VocabChoice(own, "set")
    if tokenizer is None:
        choice = tokenizer_choice(config, phases, workdir)
        if not choice.corpus and not choice.path:  # no data named: no tokenizer to follow yet
            return VocabChoice(config_lib.vocab_size(config), "the size's: no data is named")
        if not choice.path:
            return VocabChoice(trained_pieces(config), "from the tokenizer")
        from bert_jax.data.tokenizers import load_or_train as tokenizer_lib

        tokenizer = tokenizer_lib.load_tokenizer(choice.path)
    return VocabChoice(int(tokenizer.vocab_size), "from the tokenizer")


def follow_tokenizer(config, tokenizer) -> None:
    """Gives a model that follows the tokenizer (config.model.vocab_size=0) the tokenizer's
    vocabulary, so that the checks, the saved config.json and the model all hold the number."""
    if int(config.model.vocab_size) == config_lib.FOLLOW_TOKENIZER:
        config.model.vocab_size = int(tokenizer.vocab_size)


def _iterator(
    config,
    phase: Phase,
    source: str,
    tokenizer,
    workdir: str,
    *,
    batch_size: int,
    seed: int,
    dynamic: bool,
    shuffle_buffer: int,
    packing_factor: float = 0.0,
    console=lambda *a: None,
):
    from bert_jax.data import sentences
    from bert_jax.data.pipeline import packing
    from bert_jax.data.pipeline import tf_data as pipeline
    from bert_jax.data.preparation import run as prepare
    from bert_jax.data.sources import documents as sources

    dupe = int(config.data.dupe_factor)
    # Several instances per row (data/pipeline/packing.py): `packing_factor` records per packed row.
    pack = None
    if packing_factor > 0:
        pack = packing.PackingConfig(
            max_seq_length=phase.max_seq_length,
            max_predictions_per_row=phase.max_predictions_per_seq,
            factor=packing_factor,
        )

    objective = config_lib.objective(config)
    shares = config_lib.mask_shares(config)
    records = source
    check_records_objective(config, [(f"data for {phase.name}", source)])
    if sources.source_kind(source) != "records":
        console(
            f"data: {source} at length {phase.max_seq_length}, prepared once into "
            f"{config.data.cache_dir or os.path.join(workdir, 'data')} and reused from there"
        )
        # A raw corpus: prepared once into the cache (every host the same bytes), then read.
        # dupe_factor < 0 means 1 with dynamic masking (re-masked every epoch anyway), else 5.
        records = prepare.prepare_cached(
            source,
            tokenizer,
            prepare.PrepareSettings(
                max_seq_length=phase.max_seq_length,
                max_predictions_per_seq=phase.max_predictions_per_seq,
                masked_lm_prob=float(config.data.masked_lm_prob),
                short_seq_prob=float(config.data.short_seq_prob),
                dupe_factor=dupe if dupe >= 0 else (1 if dynamic else 5),
                seed=seed,
                whole_word_mask=bool(config.data.whole_word_mask),
                num_workers=int(config.data.num_workers),
                splitter=str(config.data.get("splitter", sentences.DEFAULT_SPLITTER)),
                objective=objective,
                instance_format=config_lib.instance_format(config),
                **shares,
            ),
            config.data.cache_dir or os.path.join(workdir, "data"),
            write_marker=jax.process_index() == 0,
        )

    def make_reader(shard: int, num_shards: int, shard_batch_size: int):
        settings = pipeline.PipelineSettings(
            batch_size=shard_batch_size,
            max_seq_length=phase.max_seq_length,
            max_predictions_per_seq=phase.max_predictions_per_seq,
            seed=seed,
            process_index=shard,
            process_count=num_shards,
            dynamic_masking=dynamic,
            whole_word_mask=bool(config.data.whole_word_mask),
            masked_lm_prob=float(config.data.masked_lm_prob),
            shuffle_buffer_size=shuffle_buffer,
            packing=pack,
            skip_corrupt_records=bool(config.data.get("skip_corrupt_records", False)),
            objective=objective,
            **shares,
        )
        return pipeline.make_pretrain_iterator(records, settings, tokenizer)

    # This host's input shards, concatenated: the global batch depends on config.data.shards only.
    return input_shards.ShardedInput.build(
        make_reader,
        global_batch_size=batch_size,
        shards_setting=config_lib.data_shards(config),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )


def check_records_objective(config, named_sources) -> None:
    """Refuses (one line naming both) prepared records made for another objective than
    config.objective; `named_sources`: (what, source) pairs. Corpora and foreign records pass."""
    from bert_jax.data import layout, objectives
    from bert_jax.data.sources import documents as sources

    objective = config_lib.objective(config)
    shares = config_lib.mask_shares(config)
    for what, source in named_sources:
        if source and sources.source_kind(source) == "records" and fs.isdir(source):
            recorded = layout.read_prepare_config(source)
            objectives.check_records(f"{source} ({what})", recorded, objective, "config.objective")
            if recorded is None or bool(config.data.dynamic_masking) or objective == "ltr":
                continue
            # Static masking trains on the records' own MASK/SAME/RND mix: it must be the config's.
            before = objectives.BEFORE_RECORDED
            theirs = {k: float(recorded.get(k, before[k])) for k in objectives.SHARE_KEYS}
            if theirs != shares:
                raise UserError(
                    f"{source} ({what}) was masked with MASK/SAME/RND "
                    f"{objectives.shares_text(theirs)} but config.data asks for "
                    f"{objectives.shares_text(shares)} with static masking "
                    "(config.data.dynamic_masking=False): prepare them with those shares"
                )


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
    from bert_jax.data import layout

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
    from bert_jax.data import layout
    from bert_jax.data.records import manifest
    from bert_jax.data.sources import documents as sources

    if int(config.eval.every_steps) <= 0:
        return EvalChoice("", "config.eval.every_steps=0")
    if config.eval.source:
        return EvalChoice(config.eval.source, "config.eval.source")
    kind = sources.source_kind(phase.source) if phase.source else ""
    if kind == "embedded":
        return EvalChoice("embedded:eval", "the embedded corpus's held-out split")
    unset = "and config.eval.source is not set"
    if kind != "records":
        return EvalChoice("", f"{phase.source} is a corpus, not prepared records, {unset}")
    heldout = layout.heldout_dir(phase.source)
    if not (fs.isdir(heldout) and sources.source_kind(heldout) == "records"):
        return EvalChoice(
            "", f"{phase.source} has no held-out records ({layout.HELDOUT_SUBDIR}/) {unset}"
        )
    try:
        manifest.require_complete(heldout)
    except manifest.IncompleteRecordsError:
        return EvalChoice("", f"the held-out records {heldout} are incomplete {unset}")
    return EvalChoice(heldout, f"the held-out records of {phase.source}")


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


def train_iterator(config, phase: Phase, tokenizer, workdir: str, console=lambda *a: None):
    """This host's training batches for `phase` (`get_state`/`set_state`: its data position)."""
    return _iterator(
        config,
        phase,
        phase.source,
        tokenizer,
        workdir,
        batch_size=phase.batch_size,
        seed=int(config.seed) + phase.index,
        dynamic=bool(config.data.dynamic_masking),
        shuffle_buffer=int(config.data.shuffle_buffer_size),
        packing_factor=float(config[phase.name].get("packing_factor", 0.0)),
        console=console,
    )


def eval_batches(
    config, phase: Phase, choice: EvalChoice, tokenizer, workdir: str, console=lambda *a: None
) -> list:
    """The held-out batches evaluated during `phase` (`choice`: eval_choices' for it), at its
    sequence length: choice.batches of config.eval.batch_size, statically masked."""
    iterator = _iterator(
        config,
        phase,
        choice.source,
        tokenizer,
        workdir,
        batch_size=int(config.eval.batch_size),
        seed=12345,
        dynamic=False,
        shuffle_buffer=1,
        console=console,
    )
    return [next(iterator) for _ in range(choice.batches)]
