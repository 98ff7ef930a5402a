"""Families of names kept as one table each (STYLE 22), walked the way tests/test_declarations.py
walks settings: the supervisor's events (launch/events.py EVENTS) with their badput cause, restart
and run-ending attributes, and the consumers that read them; and the families a declaration's
attribute marks: the model's identity (BertConfig `identity`), data preparation's reader options
(PrepareSettings `reader`), the records settings recorded after the first manifest (`before`),
and the choices and ranges BertConfig checks."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import pathlib
import re

import pytest

from bert_jax.core.bert_config import BertConfig
from bert_jax.data.preparation.settings import RECORDS_SETTINGS, PrepareSettings
from bert_jax.data.records import manifest
from bert_jax.data.sources import splits
from bert_jax.launch import LaunchError, events, slurm, workdir_state
from bert_jax.runtime import declarations
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib, config_schema
from tests import helpers

LAUNCH = pathlib.Path(events.__file__).parent


# --- the supervisor's events -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(events.EVENTS))
def test_every_event_has_a_meaning_and_a_known_mode(name):
    event = events.EVENTS[name]
    assert event.name == name and event.meaning
    assert event.after in (None, events.RUNNING, *events.CAUSES), event.after
    assert event.slice in (None, "asked", "ready", "lost")
    if event.restart_cause:  # a restart's cause ends the run and says where the time goes
        assert event.ends_run and event.after in events.CAUSES
    if event.final:  # the run is over: no run of steps nor supervisor goes on after it
        assert event.ends_run and event.ends_watching
    if event.starts_attempt:
        assert event.after == "startup"


def test_the_tables_consumers_read_what_they_used_to_spell():
    # The names events.jsonl holds, and the order `launch ... status` lists the restarts in.
    assert events.RESTART_CAUSES == ("preempted", "stalled", "failed")
    assert events.STARTS == ("started", "restarted")
    assert set(events.named(final=True)) == {"finished", "gave-up"}
    assert list(events.CAUSES) == ["capacity", "startup", "lost", "stall", "other"]
    assert events.counts([{"event": "failed"}, {"event": "stalled"}, {"event": "deleted"}]) == {
        "preempted": 0,
        "stalled": 1,
        "failed": 1,
    }
    # A row of a kind this version does not know changes nothing.
    assert events.kind({"event": "from-a-newer-version"}) is events.NOT_KNOWN


def test_an_event_outside_the_table_is_refused(tmp_path):
    log = events.EventLog(str(tmp_path), clock=lambda: 1.0)
    with pytest.raises(ValueError, match="not one of events.EVENTS"):
        log.append("stoped")
    assert events.read(str(tmp_path)) == []


def _literal_events(source: str) -> set[str]:
    """Event names the code spells: `....log.append("NAME", ...)` and the event of a
    `Decision(action, "NAME", ...)` or `_failure(obs, policy, "NAME", ...)`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        where = {"append": 0, "Decision": 1, "_failure": 2, "_start": 0}.get(name)
        if name == "append" and not ast.unparse(func.value).endswith("log"):
            continue
        if where is not None and len(node.args) > where:
            arg = node.args[where]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def test_every_event_the_launcher_writes_is_in_the_table():
    written = set()
    for path in sorted(LAUNCH.glob("*.py")):
        written |= _literal_events(path.read_text())
    assert written <= set(events.EVENTS), written - set(events.EVENTS)
    # The walk sees the supervisor's and the watcher's rows (it is not vacuous).
    assert {"queued", "active", "running", "restarted", "gave-up", "cloud-errors"} <= written


def test_a_job_script_records_only_what_record_event_takes(tmp_path):
    script = slurm.SlurmJob(nodes=1).script(["--workdir", str(tmp_path / "run")])
    recorded = set(re.findall(r"launch slurm record (\S+) --workdir", script))
    assert recorded and recorded <= set(events.named(job_script=True))
    with pytest.raises(LaunchError, match="use one of started, preempted"):
        workdir_state.record_event(str(tmp_path), "running")


def test_launch_slurm_record_names_the_events_it_takes(tmp_path, capsys):
    from bert_jax import cli

    assert cli.main(["launch", "slurm", "record", "--workdir", str(tmp_path)]) == 2
    recordable = ", ".join(events.named(job_script=True))
    assert f"EVENT: one of {recordable})" in capsys.readouterr().err


# --- the model's identity --------------------------------------------------------------------


def test_the_identity_fields_are_declared_model_settings_hugging_face_names_too():
    assert set(config_lib.IDENTITY_FIELDS) == {
        "vocab_size",
        "hidden_act",
        "layer_norm_eps",
        "type_vocab_size",
        "max_position_embeddings",
    }
    model_keys = config_schema.family_fields("bert")
    # A model directory's config.json, as Hugging Face wrote it (all-MiniLM-L6-v2's), holds them.
    with open(os.path.join(helpers.minilm_dir(), "config.json"), encoding="utf-8") as f:
        theirs = json.load(f)
    for name in config_lib.IDENTITY_FIELDS:
        assert name in declarations.declarations(BertConfig) and name in model_keys, name
        assert name in theirs, name


# --- data preparation's reader options -------------------------------------------------------


def test_the_reader_options_are_prepare_settings_and_read_splits_keywords():
    settings = PrepareSettings()
    options = settings.reader_options()
    assert set(options) == splits.reader_option_names()
    keywords = inspect.signature(splits.read_split).parameters
    by_keyword = {
        (name if declared.reader is True else declared.reader): name
        for name, declared in declarations.declarations(PrepareSettings).items()
        if declared.reader
    }
    for keyword, value in options.items():
        # The reader's own default is the declared one (no second default drifts).
        assert keywords[keyword].default == value == getattr(settings, by_keyword[keyword])
    changed = dataclasses.replace(settings, splitter="regex", strict=True, text_field="body")
    assert {k: changed.reader_options()[k] for k in ("splitter_name", "strict", "text_field")} == {
        "splitter_name": "regex",
        "strict": True,
        "text_field": "body",
    }
    with pytest.raises(TypeError, match="unexpected options"):
        splits.cut_splits([], splitter=True)


# --- records settings recorded after the first manifest --------------------------------------


def test_a_setting_recorded_later_says_what_earlier_records_had():
    before = declarations.before_recorded(PrepareSettings)
    assert before and set(before) <= set(RECORDS_SETTINGS)
    for name, value in before.items():
        declared = declarations.declarations(PrepareSettings)[name]
        assert declared.allows(value), f"{name}: {value!r} is outside its declaration"
    # The manifest's table is the declarations' and the text extraction's version (derived).
    assert manifest.BEFORE_RECORDED == {**before, manifest.EXTRACTION_KEY: 1}
    # Every entry is still one a run records (none stale).
    assert set(manifest.BEFORE_RECORDED) <= {*PrepareSettings().recorded(), manifest.EXTRACTION_KEY}
    # What records made before then had: the regex splitter, no held-out share, the paper's mix.
    assert before["splitter"] == "regex" and before["heldout_share"] == 0.0
    assert (before["mask_share"], before["same_share"], before["random_share"]) == (0.8, 0.1, 0.1)


def test_an_old_manifest_reads_with_what_its_records_had():
    old = manifest.Manifest.from_json({"max_seq_length": 128, "seed": 1, "inputs": []})
    for name, value in manifest.BEFORE_RECORDED.items():
        assert old.settings[name] == value, name
    assert old.settings["seed"] == 1 and old.inputs == ()
    new = manifest.Manifest.from_json({"splitter": "syntok 1.4.4", "heldout_share": 0.01})
    assert new.settings["splitter"] == "syntok 1.4.4" and new.settings["heldout_share"] == 0.01


# --- BertConfig's checks are its declarations' -----------------------------------------------


def _outside(declared: declarations.Declaration):
    """A value the declaration refuses, or None where it allows every value."""
    if declared.choices is not None:
        return "not-a-choice"
    if declared.low is not None:
        return declared.low if declared.low_open else declared.low - 1
    if declared.high is not None:
        return declared.high if declared.high_open else declared.high + 1
    return None


@pytest.mark.parametrize("name", sorted(declarations.declarations(BertConfig)))
def test_bert_config_refuses_what_a_declaration_refuses(name):
    declared = declarations.declarations(BertConfig)[name]
    value = _outside(declared)
    if value is None:
        BertConfig(**{name: declarations.defaults(BertConfig)[name]})
        return
    with pytest.raises(UserError, match=rf"\b{name} {value!r} (is not one of|must be)"):
        BertConfig(**{name: value})
