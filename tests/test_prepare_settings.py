"""Every `data prepare` setting is declared once (`PrepareSettings`): its flag and help, the keys
`prepare_config.json` records, the cache key of a pretraining run's preparation and the checks
come from the declarations, and no declared default is written again in the data code. NSP's
random-next share is one such setting, followed by the instances it makes."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import json
import pathlib

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.data import objectives
from bert_jax.data.instances.sentence_pairs import create_instance_rows
from bert_jax.data.preparation import cached
from bert_jax.data.preparation.local_runner import prepare_records
from bert_jax.data.preparation.settings import RECORDS_SETTINGS, PrepareSettings
from bert_jax.data.preparation.stage import FORMAT_VERSION
from bert_jax.data.records import manifest
from bert_jax.data.sentences import splitter_identity
from bert_jax.data.sources.documents import TEXT_EXTRACTION_VERSION
from bert_jax.runtime import declarations
from bert_jax.runtime.errors import UserError
from tests.data_fixtures import embedded_spm, embedded_spm_dir, embedded_tokenized, masking_config

REPO = pathlib.Path(__file__).resolve().parent.parent
# The options of `data prepare` that are not settings of the preparation: what to prepare, with
# which tokenizer and where; which engine runs it and its own options; --dry-run; and the flags
# of an earlier scheme of several machines, refused by name.
NOT_SETTINGS = {
    "help",
    "input",
    "tokenizer",
    "output",
    "runner",
    "beam_options",
    "dry_run",
    "beam_args",
    "shard_index",
    "num_shards",
    "merge",
}
# What prepare_config.json holds beside the records settings: what a run derives (the format,
# the groups' count, the text extraction's version, the tokenizer's fingerprint and size, the
# inputs' names and identities), and the held-out records' mark.
DERIVED = {
    "format_version",
    "num_groups",
    "text_extraction",
    "tokenizer_fingerprint",
    "vocab_size",
    "sources",
    manifest.INPUTS_KEY,
}
DECLARED = declarations.declarations(PrepareSettings)
DEFAULTS = declarations.defaults(PrepareSettings)


def _prepare_parser() -> argparse.ArgumentParser:
    def subcommands(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    data = subcommands(cli.build_parser()).choices["data"]
    return subcommands(data).choices["prepare"]


def test_every_option_is_a_declared_settings_flag_or_a_listed_non_setting():
    options = {a.dest: a for a in _prepare_parser()._actions}
    assert set(options) - NOT_SETTINGS == set(DECLARED)
    for name, declared in DECLARED.items():
        action = options[name]
        assert action.option_strings == [declarations.flag_name(name, declared)], name
        assert action.default == DEFAULTS[name], name  # the flag's default is the declaration's
        if DEFAULTS[name] not in (None, ""):
            assert "default " in action.help, name
        if declared.choices is None and declared.range_text():
            assert declared.range_text() in action.help, name
        else:
            assert action.choices in (None, declared.choices), name


def test_prepare_settings_has_no_undeclared_field():
    assert declarations.undeclared(PrepareSettings) == []
    assert set(RECORDS_SETTINGS) == {n for n, d in DECLARED.items() if d.records}


def test_a_setting_out_of_its_range_is_named_by_its_flag():
    with pytest.raises(UserError, match=r"--random-next-prob 1\.5 must be in \[0, 1\]"):
        PrepareSettings(random_next_prob=1.5).check()
    with pytest.raises(UserError, match=r"--max-predictions-per-seq 40 must be in \[1, "):
        PrepareSettings(max_seq_length=32, max_predictions_per_seq=40).check()
    with pytest.raises(UserError, match="--dupe-factor 0 must be >= 1; --seed -1 must be >= 0"):
        PrepareSettings(dupe_factor=0, seed=-1).check()


def test_the_manifest_records_the_records_settings_and_what_the_run_derived(tmp_path):
    settings = PrepareSettings(
        max_seq_length=64,
        max_predictions_per_seq=10,
        dupe_factor=1,
        num_groups=2,
        random_next_prob=0.3,
    )
    result = prepare_records(["embedded:eval"], embedded_spm_dir(), tmp_path / "out", settings)
    recorded = json.loads((tmp_path / "out" / "prepare_config.json").read_text())
    assert set(recorded) - DERIVED == set(RECORDS_SETTINGS)
    assert recorded["random_next_prob"] == 0.3 and recorded["dupe_factor"] == 1
    assert recorded["instance_format"] == "sentence_pairs"  # "" resolved for the objective
    assert recorded["splitter"] == splitter_identity(settings.splitter)
    held = tmp_path / "out" / "heldout" / "prepare_config.json"
    if held.exists():  # the held-out records' manifest: the same keys, and their mark
        assert set(json.loads(held.read_text())) == set(recorded) | {"heldout"}
    assert "random next" in result.summary()
    # The same directory with another share is refused, naming the setting.
    with pytest.raises(manifest.SettingsChangedError, match=r"random_next_prob: 0\.3 -> 0\.5"):
        changed = dataclasses.replace(settings, random_next_prob=0.5)
        prepare_records(["embedded:eval"], embedded_spm_dir(), tmp_path / "out", changed)


def test_records_prepared_before_the_share_was_recorded_read_as_the_papers():
    old = manifest.Manifest.from_json({"max_seq_length": 128})
    assert old.settings["random_next_prob"] == objectives.PAPER_RANDOM_NEXT_PROB == 0.5


def _other_value(name: str):
    """A value of setting `name` other than its default that the settings accept."""
    declared, default = DECLARED[name], DEFAULTS[name]
    if isinstance(default, bool):
        return not default
    if declared.choices is not None:
        return next(c for c in declared.choices if c != default)
    if name == "instance_format":
        return "doc_sentences"
    if isinstance(default, str):
        return default + "_other"
    if isinstance(default, float):
        return 0.25 if default != 0.25 else 0.5
    return default + 1


def test_the_cache_key_follows_every_records_setting_and_keeps_earlier_keys():
    tokenizer, items = embedded_spm(), ["embedded:eval"]
    base = PrepareSettings(dupe_factor=1)
    key = cached.cache_key(items, tokenizer, base)
    # The key before settings were declared (the paper's objective, none held out): a cache
    # prepared then is still found.
    before = {
        "items": items,
        "inputs": manifest.input_identity(items),
        "tokenizer": tokenizer.fingerprint(),
        "max_seq_length": 128,
        "max_predictions_per_seq": 20,
        "masked_lm_prob": 0.15,
        "short_seq_prob": 0.1,
        "dupe_factor": 1,
        "whole_word_mask": False,
        "seed": 12345,
        "splitter": splitter_identity("syntok"),
        "text_extraction": TEXT_EXTRACTION_VERSION,
        "format_version": FORMAT_VERSION,
        "num_groups": 0,
        "group_bytes": 8 << 20,
    }
    unheld = cached.cache_key(items, tokenizer, dataclasses.replace(base, heldout_share=0.0))
    assert unheld == before
    for name in RECORDS_SETTINGS:
        changes = {name: _other_value(name)}
        if name in ("instance_format", "mask_share", "same_share", "random_share"):
            changes.setdefault("objective", "mlm")  # a format without NSP; shares not checked
        other = cached.cache_key(items, tokenizer, dataclasses.replace(base, **changes))
        assert other != key, name

    def digest(k):
        return hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()

    assert digest(key) != digest(unheld)


@pytest.mark.parametrize("share", [objectives.RANDOM_NEXT_PROB, 0.3])
def test_the_random_next_share_follows_the_setting(share):
    """Over ~20,000 instances: the share of random next sentences among the pairs not forced to
    one (a chunk of one sentence always takes a random next) is the setting, as the summary
    counts them: (random_next - forced) / (instances - forced)."""
    batches, _ = create_instance_rows(
        embedded_tokenized(),
        masking_config(max_predictions_per_seq=10),
        max_seq_length=64,
        dupe_factor=4,
        seed=1,
        random_next_prob=share,
    )
    random_next = forced = instances = 0
    for batch in batches:
        random_next += int((batch.random_document_index >= 0).sum())
        forced += int(batch.forced_random_next.sum())
        instances += len(batch)
    assert instances - forced > 15_000
    measured = (random_next - forced) / (instances - forced)
    assert abs(measured - share) < 0.015, measured  # about four standard deviations


def test_the_default_share_writes_the_records_it_always_wrote():
    """Given explicitly at the paper's 0.5 or left to the default: the same pairs."""
    documents, masking = embedded_tokenized()[:200], masking_config()
    default, _ = create_instance_rows(documents, masking, max_seq_length=64, seed=5)
    given, _ = create_instance_rows(
        documents, masking, max_seq_length=64, seed=5, random_next_prob=0.5
    )
    for a, b in zip(default, given, strict=True):
        for feature in a.arrays:
            np.testing.assert_array_equal(a.arrays[feature], b.arrays[feature])


# Where a declared default is defined: the declaration itself, or the module owning the constant
# it reads. Anywhere else in the data code, the literal is a second copy.
OWNERS = {"bert_jax/data/preparation/settings.py"}
# Values too common to call a copy (0 or 1, so also a switch or 0.0 and 1.0; "unset").
ORDINARY = {0, 1, None, ""}


def _data_files() -> list[pathlib.Path]:
    files = sorted((REPO / "bert_jax" / "data").rglob("*.py")) + [REPO / "bert_jax/cli/data.py"]
    return [f for f in files if str(f.relative_to(REPO)) not in OWNERS]


def _literal_defaults(tree: ast.AST):
    """(name, value, line) of every literal given as a default under a name: a parameter's
    default, a class field's (`name: type = value`), a keyword argument (`name=value`)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if isinstance(default, ast.Constant):
                    yield arg.arg, default.value, default.lineno
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(node.value, ast.Constant):
                yield node.target.id, node.value.value, node.lineno
        elif isinstance(node, ast.keyword) and node.arg and isinstance(node.value, ast.Constant):
            yield node.arg, node.value.value, node.value.lineno


def test_a_declared_default_is_not_written_again_in_the_data_code():
    distinctive = {
        name: value
        for name, value in DEFAULTS.items()
        if not isinstance(value, bool) and value not in ORDINARY
    }
    copies = []
    for path in _data_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, value, line in _literal_defaults(tree):
            if (
                name in distinctive
                and value == distinctive[name]
                and type(value) is type(distinctive[name])
            ):
                copies.append(f"{path.relative_to(REPO)}:{line}: {name}={value!r}")
    assert not copies, "declared in PrepareSettings (or its owner), written again:\n" + "\n".join(
        copies
    )


def test_the_pages_give_the_declared_dupe_factor_or_one_pass():
    """README's and the manual's `data prepare` commands agree with --dupe-factor's declaration
    (and so with --help): one that gives it gives the declared default, or 1 (one pass: records
    to evaluate on, or for a run that masks anew)."""
    from tests.test_docs_commands import COMMANDS

    declared = DEFAULTS["dupe_factor"]
    given = []
    for command in COMMANDS:
        argv = list(command.argv)
        if argv[:2] == ["data", "prepare"] and "--dupe-factor" in argv:
            given.append((command.name, int(argv[argv.index("--dupe-factor") + 1])))
    assert given  # the pages show the flag
    assert [g for g in given if g[1] not in (declared, 1)] == [], f"declared: {declared}"
