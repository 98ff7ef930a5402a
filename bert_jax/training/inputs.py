"""The pretraining run's input side: the model it starts from, and the one decision of each input
that the run, its first line and its dry run read: the tokenizer (tokenizer_choice), the model's
vocabulary (vocab_choice: the tokenizer's unless set), the records (a raw corpus prepared once),
the iterators per phase, and the batches each phase evaluates (on eval_choice's source)."""

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
from bert_jax.training import config_lib, eval_choice
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
        loaded = model_dir.read_config(path)[0]
        family = "modernbert" if type(loaded).__name__ == "ModernBertConfig" else "bert"
        if family != config_lib.family_of(config):
            raise UserError(
                f"config.init_from={path} is a {family} model; this run pretrains "
                f"{config_lib.family_of(config)} (config.model.family)"
            )
        model, theirs = loaded.to_dict(), loaded.objective
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
    from bert_jax.data.sources import kinds as sources

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
    from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings

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
            [choice.corpus],
            own,
            TokenizerTrainSettings(vocab_size, lowercase=bool(config.data.lowercase)),
            size_setting="config.data.tokenizer_vocab_size",
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


def settings_from_config(config, settings_type, **decided):
    """A ``settings_type`` (``PrepareSettings``, ``PipelineSettings``) for this run: each of its
    fields that config.data declares under the same name (config_schema.DataSection) is that
    setting's value, handed down by name; `decided`: what the phase, the host or the caller sets
    (these win). A pipeline or preparation setting that config.data declares reaches the reader
    with no list to extend."""
    from bert_jax.training.config_schema import DataSection

    declared = {f.name for f in dataclasses.fields(DataSection)}
    named = {
        f.name: config.data[f.name]
        for f in dataclasses.fields(settings_type)
        if f.name in declared and f.name in config.data
    }
    return settings_type(**{**named, **decided})


def _prepared(
    config,
    phase: Phase,
    source: str,
    tokenizer,
    workdir: str,
    *,
    seed: int,
    dynamic: bool,
    heldout: bool,
    console=lambda *a: None,
):
    """`source` as records: prepared records as they are; a raw corpus prepared once into the
    cache (every host the same bytes) and its record files returned. `heldout`: the preparation
    sets data prepare's share of the documents aside (`<prepared>/heldout`), as for a training
    corpus whose held-out records the run evaluates on; an eval corpus keeps all its documents."""
    from bert_jax.data.preparation.cached import prepare_cached
    from bert_jax.data.preparation.settings import PrepareSettings
    from bert_jax.data.sources import kinds as sources

    check_records_objective(config, [(f"data for {phase.name}", source)])
    if sources.source_kind(source) == "records":
        return source
    console(
        f"data: {source} at length {phase.max_seq_length}, prepared once into "
        f"{config.data.cache_dir or os.path.join(workdir, 'data')} and reused from there"
    )
    # dupe_factor < 0 means 1 with dynamic masking (re-masked every epoch anyway), else data
    # prepare's declared default.
    dupe = int(config.data.dupe_factor)
    settings = settings_from_config(
        config,
        PrepareSettings,
        max_seq_length=phase.max_seq_length,
        max_predictions_per_seq=phase.max_predictions_per_seq,
        dupe_factor=dupe if dupe >= 0 else (1 if dynamic else PrepareSettings.dupe_factor),
        seed=seed,
        objective=config_lib.objective(config),
        instance_format=config_lib.instance_format(config),
        **({} if heldout else {"heldout_share": 0.0}),
        **config_lib.mask_shares(config),  # checked to sum to 1, naming config.data's keys
    )
    return prepare_cached(
        source,
        tokenizer,
        settings,
        config.data.cache_dir or os.path.join(workdir, "data"),
        write_marker=jax.process_index() == 0,
    )


def _iterator(
    config,
    phase: Phase,
    source: str,
    tokenizer,
    workdir: str,
    *,
    batch_size: int,
    seed: int,
    packing_factor: float = 0.0,
    heldout: bool = False,
    console=lambda *a: None,
    **decided,
):
    """This host's input shards of `source`, each a reader made from one PipelineSettings
    (settings_from_config: config.data's pipeline settings by name; `decided`: the caller's
    own values, e.g. an evaluation's static masking)."""
    from bert_jax.data.pipeline import packing
    from bert_jax.data.pipeline import tf_data as pipeline

    # Several instances per row (data/pipeline/packing.py): `packing_factor` records per packed row.
    pack = None
    if packing_factor > 0:
        pack = packing.PackingConfig(
            max_seq_length=phase.max_seq_length,
            max_predictions_per_row=phase.max_predictions_per_seq,
            factor=packing_factor,
        )
    settings = settings_from_config(
        config,
        pipeline.PipelineSettings,
        batch_size=batch_size,
        max_seq_length=phase.max_seq_length,
        max_predictions_per_seq=phase.max_predictions_per_seq,
        seed=seed,
        packing=pack,
        objective=config_lib.objective(config),
        **config_lib.mask_shares(config),
        **decided,
    )
    records = _prepared(
        config, phase, source, tokenizer, workdir, seed=seed, dynamic=settings.dynamic_masking,
        heldout=heldout, console=console,
    )  # fmt: skip

    def make_reader(shard: int, num_shards: int, shard_batch_size: int):
        shard_settings = dataclasses.replace(
            settings, batch_size=shard_batch_size, process_index=shard, process_count=num_shards
        )
        return pipeline.make_pretrain_iterator(records, shard_settings, tokenizer)

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
    from bert_jax.data.sources import kinds as sources

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


def _train_seed(config, phase: Phase) -> int:
    return int(config.seed) + phase.index


def train_iterator(config, phase: Phase, tokenizer, workdir: str, console=lambda *a: None):
    """This host's training batches for `phase` (`get_state`/`set_state`: its data position).
    A training corpus other than the embedded one (which has its own eval split) is prepared
    with data prepare's held-out share set aside, for eval_choices."""
    from bert_jax.data.sources import kinds as sources

    return _iterator(
        config,
        phase,
        phase.source,
        tokenizer,
        workdir,
        heldout=sources.source_kind(phase.source) != "embedded",
        batch_size=phase.batch_size,
        seed=_train_seed(config, phase),
        packing_factor=float(config[phase.name].get("packing_factor", 0.0)),
        console=console,
    )


def eval_batches(
    config,
    phase: Phase,
    choice: eval_choice.EvalChoice,
    tokenizer,
    workdir: str,
    console=lambda *a: None,
) -> list:
    """The held-out batches evaluated during `phase` (`choice`: eval_choices' for it), at its
    sequence length: choice.batches of config.eval.batch_size, statically masked; [] when the
    preparation of a training corpus set no documents aside (`console` says so)."""
    source = choice.source
    if choice.of_prepared_corpus:  # the run's own preparation of it (a cache hit by now)
        files = _prepared(
            config, phase, source, tokenizer, workdir, seed=_train_seed(config, phase),
            dynamic=bool(config.data.dynamic_masking), heldout=True,
        )  # fmt: skip
        source = eval_choice.complete_heldout(os.path.dirname(files[0]))
        if not source:
            console(
                f"no eval in {phase.name}: preparing {choice.source} set no documents aside (too "
                "few for data prepare's held-out share); set config.eval.source"
            )
            return []
    iterator = _iterator(
        config,
        phase,
        source,
        tokenizer,
        workdir,
        batch_size=int(config.eval.batch_size),
        seed=12345,
        console=console,
        dynamic_masking=False,  # evaluation reads the records' own masks, in order
        shuffle_buffer_size=1,
    )
    return [next(iterator) for _ in range(choice.batches)]
