"""The pretraining run's input side: the model it starts from, tokenizer, input shards, iterators
per phase, eval source."""

from __future__ import annotations

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


def resolve_tokenizer(config, phases: list[Phase], workdir: str, console=lambda *a: None):
    """The run's tokenizer: `config.data.tokenizer`, the one saved next to prepared records, or
    (for raw corpora only) a SentencePiece model trained on the first phase's corpus and kept in
    `<workdir>/tokenizer` so that restarts reuse it (`console` says when one is trained)."""
    from bert_jax.data import layout
    from bert_jax.data.sources import documents as sources
    from bert_jax.data.tokenizers import load_or_train as tokenizer_lib

    if config.data.tokenizer:
        return tokenizer_lib.load_tokenizer(config.data.tokenizer)
    for phase in phases:
        candidate = os.path.join(phase.source, layout.TOKENIZER_SUBDIR)
        if fs.isdir(candidate):
            return tokenizer_lib.load_tokenizer(candidate)
    own = os.path.join(workdir, "tokenizer")
    if fs.isdir(own):
        return tokenizer_lib.load_tokenizer(own)
    corpora = [p.source for p in phases if sources.source_kind(p.source) != "records"]
    if not corpora:
        raise UserError(
            "no tokenizer: set config.data.tokenizer (a tokenizer directory, .model or vocab.txt)"
        )
    vocab_size = min(int(config.data.tokenizer_vocab_size), int(config.model.vocab_size))
    if jax.process_index() == 0:
        console(
            f"training a {vocab_size}-piece SentencePiece tokenizer on {corpora[0]} (kept in "
            f"{own} for restarts)"
        )
        tokenizer_lib.train_tokenizer(
            [corpora[0]], vocab_size, own, lowercase=bool(config.data.lowercase)
        )
    distributed.sync_hosts("tokenizer")
    return tokenizer_lib.load_tokenizer(own)


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


def eval_source(config, phase: Phase) -> str:
    """`config.eval.source`, or the embedded corpus's held-out split for embedded training."""
    if config.eval.source:
        return config.eval.source
    from bert_jax.data.sources import documents as sources

    if sources.source_kind(phase.source) == "embedded":
        return "embedded:eval"
    return ""


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


def eval_batches(config, phase: Phase, tokenizer, workdir: str, console=lambda *a: None) -> list:
    """The held-out batches evaluated during `phase`; [] when evaluation is off or has no source."""
    source = eval_source(config, phase)
    if config.eval.every_steps <= 0 or not source:
        return []
    iterator = _iterator(
        config,
        phase,
        source,
        tokenizer,
        workdir,
        batch_size=int(config.eval.batch_size),
        seed=12345,
        dynamic=False,
        shuffle_buffer=1,
        console=console,
    )
    return [next(iterator) for _ in range(int(config.eval.batches))]
