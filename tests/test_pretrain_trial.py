"""The CPU trial's config (issue 49): CPU-sized batches, a vocabulary that matches the tokenizer,
a warmup that fits the run, a dry run that says what the run will do, phases refused when one
would read data nobody named, and the parameter counts of docs/pretraining.md's sizes table.

Nothing here compiles a step: the trial's real run (minutes) is measured, not tested."""

from __future__ import annotations

import functools
import os
import re

import pytest

from bert_jax import cli
from bert_jax.core import optim
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_checks, config_lib, inputs, pretrain

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The docs' first pretraining command (docs/data.md, docs/pretraining.md), without its workdir.
TRIAL = ["pretrain", "--config", f"{REPO}/configs/bert.py:tiny", "--config.total_steps=200"]


@pytest.mark.parametrize("size", config_lib.CPU_SIZES)
def test_cpu_sizes_get_cpu_batches_and_the_vocabulary_of_their_tokenizer(size):
    config = config_lib.pretraining_config(size)
    assert (config.phase1.batch_size, config.phase2.batch_size) == (32, 8)
    # The embedding has the rows of the tokenizer the run trains, no more: it follows it.
    assert config.model.vocab_size == config_lib.FOLLOW_TOKENIZER
    assert config.data.tokenizer_vocab_size == 4000
    phases = config_lib.split_phases(config)
    assert str(inputs.vocab_choice(config, phases)) == "vocab 4000 (from the tokenizer)"
    assert config_lib.bert_config(config).vocab_size == 4000  # no tokenizer at hand: the same
    assert config_lib.model_config(size).vocab_size == 0  # init_from's preset agrees
    assert config.log_every_steps <= 10 and config.checkpoint.every_steps <= 50
    config.total_steps = 60
    optimizer, _ = config_lib.resolved_optimizer(config, config_lib.split_phases(config))
    assert optimizer.warmup_steps == 6  # 10% of the run
    assert config_lib.warmup_warning(config, config_lib.split_phases(config)) is None


@pytest.mark.parametrize("size", ["medium", "base", "large"])
def test_the_other_sizes_keep_the_papers_recipe(size):
    config = config_lib.pretraining_config(size)
    assert (config.phase1.batch_size, config.phase2.batch_size) == (256, 256)
    assert config.model.vocab_size == config_lib.FOLLOW_TOKENIZER  # the tokenizer's
    assert config_lib.bert_config(config).vocab_size == 30522  # plan, bench: the paper's
    assert (config.optimizer.warmup_steps, config.optimizer.warmup_fraction) == (10_000, 0.0)
    assert config.optimizer.learning_rate == 1e-4


def test_warmup_steps_win_over_the_fraction_and_per_phase_warmups_are_their_phases_share():
    config = config_lib.pretraining_config("tiny")
    config.total_steps = 200
    phases = config_lib.split_phases(config)
    config.optimizer.warmup_steps = 7
    assert config_lib.resolved_optimizer(config, phases)[0].warmup_steps == 7
    config.optimizer.warmup_steps = 0
    config.optimizer.schedule = "per_phase"
    config.phase2.warmup_steps = 3
    optimizer, specs = config_lib.resolved_optimizer(config, phases)
    assert [s.warmup_steps for s in specs] == [18, 3]  # 10% of phase 1's 180 steps; phase 2's own
    _, schedule = optim.from_config(optimizer, [p.steps for p in phases], specs)
    assert float(schedule(9)) == pytest.approx(config.optimizer.learning_rate * 9 / 18)
    assert config.optimizer.warmup_steps == 0  # the config itself is left as the user set it


def test_a_warmup_as_long_as_the_run_is_a_warning_in_the_dry_run_and_the_run(capsys):
    config = config_lib.pretraining_config("base")
    config.total_steps = 60
    warning = config_lib.warmup_warning(config, config_lib.split_phases(config))
    assert warning.startswith("warning: warmup 10000 >= config.total_steps=60: the learning rate ")
    assert "config.optimizer.warmup_fraction" in warning
    assert warning in config_checks.dry_run_outline(config)


def test_the_dry_run_says_what_the_trial_will_do(capsys):
    assert cli.main([*TRIAL, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "phase1: steps 0..179 (180), seq 128, 20 predictions, global batch 32" in out
    assert "phase2: steps 180..199 (20), seq 512, 80 predictions, global batch 8" in out
    assert "learning rate 0.001: warmup 20 steps, then linear decay to 0 at step 200" in out
    assert "a checkpoint every 50 steps and at the end" in out
    assert "  vocab 4000 (from the tokenizer); tokenizer: a 4000-piece SentencePiece model " in out
    assert "warning" not in out


def test_the_runs_first_line_says_its_plan():
    config = config_lib.pretraining_config("tiny")
    config.total_steps = 60
    line = pretrain.opening_line(config, "/w")
    assert line == (
        "bert-jax pretrain: 2 layers, hidden 128, vocab 4000 (from the tokenizer); 60 steps "
        "(config.total_steps) in 2 phase(s), lr 0.001 after warmup 6 steps; a line every 10 "
        "steps, checkpoint every 50 "
        "and at the end, eval every 100 steps and at the end (10 batches of 32, at each phase's "
        "sequence length); workdir /w"
    )
    config.model.vocab_size = 5000
    assert ", vocab 5000 (set); " in pretrain.opening_line(config, "/w")


def test_the_first_line_says_when_nothing_will_be_evaluated(tmp_path):
    config = config_lib.pretraining_config("tiny")
    (tmp_path / "part-00000.tfrecord").write_bytes(b"")
    (tmp_path / "tokenizer").mkdir()  # records without held-out ones, nor config.eval.source
    config.data.source = str(tmp_path)
    config.model.vocab_size = 1000  # no tokenizer to read in the tokenizer/ above
    assert (
        f"no eval ({tmp_path} has no held-out records (heldout/) and config.eval.source is not "
        "set); " in pretrain.opening_line(config, "/w")
    )
    config.eval.every_steps = 0
    assert "no eval (config.eval.every_steps=0); " in pretrain.opening_line(config, "/w")


def test_a_phase_without_data_beside_one_with_data_is_refused_in_one_line(tmp_path, capsys):
    workdir = tmp_path / "w"
    argv = [*TRIAL, "--workdir", str(workdir), f"--config.phase1.data={tmp_path}/records128"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "config.phase2.data is empty" in err and "config.data.source='embedded'" in err
    assert not workdir.exists()
    # Named data for both, or a shared source the user set, is what the user asked for.
    config = config_lib.pretraining_config("tiny")
    config.phase1.data = "/records/128"
    config.data.source = "/corpus.txt"
    assert [p.source for p in config_lib.split_phases(config)] == ["/records/128", "/corpus.txt"]
    config.data.source = "embedded"
    with pytest.raises(UserError, match="config.phase2.data is empty"):
        config_lib.split_phases(config)
    config.phase2.fraction, config.phase1.fraction = 0.0, 1.0  # phase 2 does not run
    assert [p.source for p in config_lib.split_phases(config)] == ["/records/128"]


def test_the_sizes_table_holds_the_models_parameter_counts():
    """docs/pretraining.md's table: each size's BertForPreTraining count at vocab 30522 and at
    the size's own vocabulary, as the model counts them."""
    with open(os.path.join(REPO, "docs", "pretraining.md"), encoding="utf-8") as f:
        text = f.read()
    rows = re.findall(r"^\| (tiny|mini|small|medium|base|large) \|(.*)\|$", text, re.MULTILINE)
    assert [size for size, _ in rows] == list(config_lib.SIZES)
    # A model counted once (each count traces its init): medium, base and large have the
    # vocabulary of 30522 as their own.
    count_parameters = functools.cache(config_lib.count_parameters)
    for size, cells in rows:
        cells = [cell.strip() for cell in cells.split("|")]
        at_30522, own = (int(cell.split()[0].replace(",", "")) for cell in cells[4:6])
        config = config_lib.pretraining_config(size)
        vocab = inputs.vocab_choice(config, config_lib.split_phases(config)).size
        model = config_lib.bert_config(config).replace(vocab_size=vocab)
        assert own == count_parameters(model), size
        config.model.vocab_size = 30522
        assert at_30522 == count_parameters(config_lib.bert_config(config)), size


def test_the_decay_shape_is_a_checked_setting_the_dry_run_states(capsys):
    argv = [*TRIAL, "--config.optimizer.decay=cosine", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "learning rate 0.001: warmup 20 steps, then cosine decay to 0 at step 200" in out
    assert cli.main([*TRIAL, "--config.optimizer.decay=cosine", "--dry-run",
                     "--config.optimizer.schedule=per_phase"]) == 0  # fmt: skip
    assert "each phase warms up (phase1 18, phase2 2 steps) and decays (cosine) to 0" in (
        capsys.readouterr().out
    )
    assert cli.main([*TRIAL, "--config.optimizer.decay=step", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "bert-jax pretrain: error: config.optimizer.decay='step' is not one of "
        "'linear', 'cosine', 'wsd'"
    ), err
