"""config_lib: the paper's defaults, the phase split, validation, the dry-run outline, counts."""

from __future__ import annotations

import os
import types

import pytest

from bert_jax.core import partitioning
from bert_jax.training import config_checks, config_lib
from tests.helpers import pretraining_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan(total_steps, fraction=0.9):
    config = config_lib.pretraining_config("tiny")
    config.total_steps = total_steps
    config.phase1.fraction, config.phase2.fraction = fraction, round(1.0 - fraction, 10)
    return config_lib.split_phases(config)


def test_the_paper_plan_is_90_percent_at_128_then_10_percent_at_512():
    phases = config_lib.split_phases(config_lib.pretraining_config("base"))
    assert [(p.name, p.start, p.steps, p.end) for p in phases] == [
        ("phase1", 0, 900_000, 900_000),
        ("phase2", 900_000, 100_000, 1_000_000),
    ]
    assert [(p.max_seq_length, p.max_predictions_per_seq, p.batch_size) for p in phases] == [
        (128, 20, 256),
        (512, 80, 256),
    ]
    assert [p.index for p in phases] == [0, 1]
    # A step belongs to the phase whose range holds it; past the end, the last phase.
    assert [config_lib.phase_at(phases, s).index for s in (0, 899_999, 900_000, 10**7)] == [
        0,
        0,
        1,
        1,
    ]


def test_phase_steps_round_and_the_last_phase_takes_the_rest():
    assert [(p.start, p.steps) for p in plan(1000)] == [(0, 900), (900, 100)]
    assert [(p.start, p.steps) for p in plan(7)] == [(0, 6), (6, 1)]  # round(6.3)
    assert [(p.start, p.steps) for p in plan(15)] == [(0, 14), (14, 1)]  # round(13.5) = 14
    # A phase left with no steps is dropped; the other phase keeps its index and name.
    assert [(p.name, p.index, p.steps) for p in plan(1)] == [("phase1", 0, 1)]
    assert [(p.name, p.index, p.steps) for p in plan(10, fraction=0.0)] == [("phase2", 1, 10)]
    assert [(p.name, p.steps) for p in plan(10, fraction=1.0)] == [("phase1", 10)]


def test_each_phase_reads_its_own_data_or_the_shared_source():
    config = config_lib.pretraining_config("tiny")
    config.total_steps = 10
    config.data.source = "/records/128"
    config.phase2.data = "/records/512"
    assert [p.source for p in config_lib.split_phases(config)] == ["/records/128", "/records/512"]


@pytest.mark.parametrize(
    "total_steps, fraction, message",
    [
        (0, 0.9, "total_steps=0 must be positive"),
        (-5, 0.9, "total_steps=-5 must be positive"),
        (100, 0.8, "fraction must be 1"),
        (100, -0.1, "fraction must be 1"),
    ],
)
def test_plan_errors_name_the_setting(total_steps, fraction, message):
    config = config_lib.pretraining_config("tiny")
    config.total_steps = total_steps
    config.phase1.fraction = fraction
    with pytest.raises(ValueError, match=message):
        config_lib.split_phases(config)


def small_config(**overrides):
    return pretraining_config(
        10,
        batch_size=16,
        **{"model.max_position_embeddings": 64, "eval.batch_size": 16, **overrides},
    )


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh((-1, 1, 1))  # 8 emulated devices, all on `data`


def test_a_valid_config_passes(mesh):
    config = small_config()
    tokenizer = types.SimpleNamespace(vocab_size=40_000)  # the model follows it (vocab_size 0)
    config_checks.validate(config, config_lib.split_phases(config), mesh, tokenizer)
    config_checks.validate(config, config_lib.split_phases(config), mesh, None)
    config.model.vocab_size = 4000
    same = types.SimpleNamespace(vocab_size=4000)
    config_checks.validate(config, config_lib.split_phases(config), mesh, same)


@pytest.mark.parametrize(
    "overrides, vocab, message",
    [
        ({"model.vocab_size": 4000}, 40_000, "has 40000 tokens but config.model.vocab_size=4000"),
        ({"data.source": ""}, None, "config.phase1.data and config.data.source are empty"),
        ({"phase2.max_seq_length": 128}, None, r"config.phase2.max_seq_length=128 exceeds"),
        ({"phase1.max_predictions_per_seq": 40}, None, "max_predictions_per_seq=40 exceeds"),
        ({"phase1.batch_size": 12}, None, "config.phase1.batch_size=12 is not divisible"),
        ({"phase2.batch_size": 24, "data.shards": 16}, None, "by the 16 input shards"),
        ({"grad_accum_steps": 4}, None, "must be divisible by config.grad_accum_steps=4"),
        ({"grad_accum_steps": 0}, None, "config.grad_accum_steps=0"),
        ({"eval.batch_size": 4}, None, "config.eval.batch_size"),
        ({"eval.batch_size": 8, "data.shards": 16}, None, "config.eval.batch_size=8"),
    ],
)
def test_validate_names_the_setting(mesh, overrides, vocab, message):
    config = small_config(**overrides)
    tokenizer = None if vocab is None else types.SimpleNamespace(vocab_size=vocab)
    with pytest.raises(ValueError, match=message):
        config_checks.validate(config, config_lib.split_phases(config), mesh, tokenizer)


def test_evaluation_off_skips_the_eval_batch_checks(mesh):
    config = small_config(**{"eval.every_steps": 0, "eval.batch_size": 3})
    config_checks.validate(config, config_lib.split_phases(config), mesh, None)


@pytest.mark.parametrize(
    "size, layers, hidden, heads", [("base", 12, 768, 12), ("large", 24, 1024, 16)]
)
def test_parameter_counts_match_hugging_face(size, layers, hidden, heads):
    """The paper's 110M (Base) and 340M (Large), counted as Hugging Face's BertForPreTraining
    counts them (the tied decoder once), built from a config on the meta device (no weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    model_config = config_lib.bert_config(config_lib.pretraining_config(size))
    assert (model_config.num_hidden_layers, model_config.hidden_size) == (layers, hidden)
    hf_config = transformers.BertConfig(
        vocab_size=model_config.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=model_config.max_position_embeddings,
        type_vocab_size=model_config.type_vocab_size,
    )
    with torch.device("meta"):
        hf_model = transformers.BertForPreTraining(hf_config)
    hf_count = sum(p.numel() for p in hf_model.parameters())
    assert config_lib.count_parameters(model_config) == hf_count
    assert hf_count == {"base": 110_106_428, "large": 336_226_108}[size]
    # Vocabulary padding rows (30522 -> 30592) are not parameters of the model.
    assert model_config.padded_vocab_size == 30592


def test_base_and_large_configs_follow_the_paper(capsys):
    from bert_jax import cli

    for size, params in (("base", "110,106,428"), ("large", "336,226,108")):
        assert (
            cli.main(["pretrain", "--config", f"{REPO}/configs/bert.py:{size}", "--dry-run"]) == 0
        )
        out = capsys.readouterr().out
        assert f"parameters: {params}" in out
        config = config_lib.pretraining_config(size)
        opt = config.optimizer
        assert (opt.learning_rate, opt.warmup_steps, opt.b1, opt.b2, opt.eps) == (
            1e-4,
            10_000,
            0.9,
            0.999,
            1e-6,
        )
        assert (opt.weight_decay, opt.clip_norm, config.total_steps) == (0.01, 1.0, 1_000_000)
        assert (config.phase1.batch_size, config.phase2.batch_size) == (256, 256)
        assert config.model.hidden_dropout_prob == config.model.attention_probs_dropout_prob == 0.1
        assert "steps 0..899999 (900000), seq 128, 20 predictions" in out
        assert "steps 900000..999999 (100000), seq 512, 80 predictions" in out


def test_the_dry_run_outline_lists_every_setting_as_an_override_in_key_order():
    config = config_lib.pretraining_config("tiny")
    text = config_checks.dry_run_outline(config)
    lines = text.splitlines()
    settings = [line.strip().split(" = ")[0] for line in lines[1 : lines.index("phases:")]]
    assert settings == sorted(settings, key=lambda key: key.split("."))
    assert "optimizer.learning_rate" in settings and "phase2.max_seq_length" in settings
    assert "  mesh.shape = (-1, 1, 1)" in lines
    assert len(settings) == len(set(settings)) > 50


def test_unknown_size_names_the_choices():
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        config_lib.pretraining_config("huge")
