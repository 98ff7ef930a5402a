"""`bert-jax bench` (the bench/ package) on tiny models (2 steps; no timing is asserted)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import minilm_dir, tiny_config

from bert_jax import cli
from bert_jax.bench import data as bench_data
from bert_jax.bench import peer, timing
from bert_jax.bench import spec as bench_spec
from bert_jax.data.pipeline import packing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_spec(**overrides) -> bench_spec.BenchSpec:
    values = dict(
        model=tiny_config(),
        batch_size=8,
        seq_len=32,
        max_predictions=4,
        steps=2,
        windows=2,
        warmup_steps=1,
        optimizer=bench_spec.OptimizerSpec(warmup_steps=10, total_steps=100),
    )
    values.update(overrides)
    return bench_spec.BenchSpec(**values)


def test_bench_times_packed_real_instances_on_the_sharded_step():
    # BERT's uncased WordPiece vocabulary (30,522 ids) needs the full embedding table; one narrow
    # layer keeps that table, its optimizer update and the compiles small.
    model = tiny_config(
        vocab_size=30522,
        max_position_embeddings=128,
        vocab_pad_multiple=128,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=1,
    )
    spec = tiny_spec(
        model=model,
        seq_len=128,
        max_predictions=20,
        data="embedded",
        packing=True,
        packing_factor=1.5,
        tokenizer=os.path.join(minilm_dir(), "vocab.txt"),
        peak_tflops=1.0,
    )
    data = bench_data.make_data(spec)
    assert data.packing_stats.instances_per_row > 1.0
    assert set(data.batches[0]) == set(packing.PACKED_KEYS)
    assert "next_sentence_weights" not in data.peer_batches[0]  # the peer gets them unpacked
    report = timing.run(spec, log=lambda *_: None, compare_unpacked=True)
    ours, unpacked = report.sides
    assert unpacked.name == "bert-jax unpacked" and unpacked.windows[0].instances == 2 * 8
    assert report.ratio > 0 and set(report.paired_ratios()) == {"wall", "cpu"}
    assert ours.name == "bert-jax" and ours.num_devices == 8 and len(ours.windows) == 2
    for window in ours.windows:
        assert window.steps == 2 and window.real_tokens < window.padded_tokens == 2 * 8 * 128
        assert window.instances > window.steps * spec.batch_size  # several instances per row
    assert ours.compile_seconds > 0 and np.isfinite(ours.warmup_loss)
    assert "packed at factor" in report.data
    # MFU counts the model's FLOPs on real tokens; HFU what is computed at every position
    # (padding included): our head on the predicted slots, our last layer only where heads read.
    flops = bench_spec.model_flops_per_token(spec)
    computed = bench_spec.hardware_flops_per_position(spec)
    assert ours.mfu == pytest.approx(ours.tokens_per_sec * flops / 8e12)
    assert ours.hfu == pytest.approx(ours.padded_tokens_per_sec * computed / 8e12)
    # The padding rows (30592 - 30522) count as computed, not as model FLOPs.
    dense = dataclasses.replace(spec, model=spec.model.replace(sparse_last_layer=False))
    padding = 6 * (20 / 128) * spec.model.hidden_size * 70
    assert bench_spec.hardware_flops_per_position(dense) == pytest.approx(flops + padding)
    assert computed < flops
    text = report.render()
    assert "vocab 30522 (ours padded to 30592)" in text
    assert "| bert-jax " in text and "| bert-jax unpacked |" in text and "tok/s real" in text
    assert report.to_dict()["sides"][0]["tokens_per_sec"] == ours.tokens_per_sec


def test_synthetic_batches_are_full_rows_and_cpu_has_no_mfu():
    spec = tiny_spec()
    data = bench_data.make_data(spec)
    assert bench_data.batch_counts(data.batches[0]) == (8 * 32, 8 * 32, 8)
    assert data.batches is data.peer_batches
    assert bench_spec.peak_flops(spec, "cpu") is None
    assert bench_spec.peak_flops(spec, "NVIDIA H100 80GB HBM3") == 989e12


def test_spec_from_config_follows_the_phase_and_model_overrides():
    from ml_collections import config_flags  # noqa: F401 (the config path needs it anyway)

    from bert_jax.bench.settings import BenchSettings
    from bert_jax.training import config_lib

    config = config_lib.pretraining_config("base")
    config.model.attention_impl = "dot_product"
    config.mesh.shard_optimizer_state, config.mesh.windowed_einsum = True, False
    spec = bench_spec.spec_from_config(config, BenchSettings(seq_len=512, batch_size=4))
    assert spec.shard_optimizer_state and not spec.windowed_einsum  # the step the run compiles
    assert (spec.seq_len, spec.max_predictions, spec.batch_size) == (512, 80, 4)
    assert spec.model.attention_impl == "dot_product" and spec.model.hidden_size == 768
    assert bench_spec.spec_from_config(config).max_predictions == 20
    assert bench_spec.spec_from_config(config, BenchSettings(seq_len=256)).max_predictions == 40
    assert bench_spec.spec_from_json(bench_spec.spec_to_json(spec)) == spec
    assert (spec.data, spec.rng_impl) == ("synthetic", config.dropout_rng_impl)
    # --packing implies real data; the tokenizer is the command line's, else the config's.
    packed = bench_spec.spec_from_config(config, BenchSettings(packing=True, rng_impl="rbg"))
    assert (packed.data, packed.packing, packed.rng_impl) == ("embedded", True, "rbg")
    assert packed.tokenizer == config.data.tokenizer
    real = bench_spec.spec_from_config(config, BenchSettings(real_data=True, tokenizer="tok"))
    assert (real.data, real.packing, real.tokenizer) == ("embedded", False, "tok")
    with pytest.raises(ValueError, match="packing needs real lengths"):
        tiny_spec(packing=True)


def test_an_optimizer_the_peers_do_not_run_is_refused_saying_how_to_time_the_model():
    """modernbert:base trains with StableAdamW; the peers run AdamW, so bench says which
    override times the model rather than comparing two different updates."""
    from bert_jax.configs import modernbert
    from bert_jax.runtime.errors import UserError

    config = modernbert.get_config("base")
    with pytest.raises(UserError, match=r"'stableadamw': add --config.optimizer.name=adamw "):
        bench_spec.spec_from_config(config)
    config.optimizer.name = "adamw"
    assert bench_spec.spec_from_config(config).model.num_hidden_layers == 22


def test_settings_are_declared_once_and_refused_by_their_flags(capsys):
    """A spec's defaults are BenchSettings'; a value out of its range is one line naming its
    flag, from the command line or from a spec built in Python."""
    from bert_jax.bench.settings import BenchSettings
    from bert_jax.runtime import declarations

    spec = bench_spec.BenchSpec(tiny_config(), batch_size=2, seq_len=8, max_predictions=2)
    given = {"seq_len": 8, "batch_size": 2}
    declared = declarations.as_dict(BenchSettings(**given))
    assert {name: declared[name] for name in bench_spec.SPEC_SETTINGS} == {
        name: getattr(spec, name) for name in bench_spec.SPEC_SETTINGS
    }
    # The others are what is timed beside ours (`timing.run`'s arguments) and the data.
    others = set(declared) - set(bench_spec.SPEC_SETTINGS)
    assert others == {"real_data", "peer", "peer_python", "compare_unpacked"}
    with pytest.raises(ValueError, match="^--warmup -1 must be >= 0$"):
        tiny_spec(warmup_steps=-1)
    with pytest.raises(ValueError, match="^--packing-factor 0.5 must be 0 or >= 1$"):
        tiny_spec(packing_factor=0.5)
    argv = ["bench", "--config", "bert:tiny", "--windows", "0"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == "bert-jax bench: error: --windows 0 must be >= 1\n"
    # A PRNG name is checked before JAX sees it (JAX's own error is a traceback).
    assert cli.main(["bench", "--config", "bert:tiny", "--rng-impl", "philox"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bert-jax bench: error: --rng-impl 'philox' is not '' or one of ")
    assert err.count("\n") == 1 and "unsafe_rbg" in err


def test_missing_peer_environment_says_how_to_make_it(capsys, monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    with pytest.raises(peer.PeerMissingError, match="make bench-peer"):
        timing.run(tiny_spec(), peer="hf-flax", peer_python="/nonexistent/python")
    # With a peer, our process does not take most of a GPU's memory up front either.
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    status = cli.main(
        [
            "bench",
            "--config",
            os.path.join(REPO, "configs", "bert.py:tiny"),
            "--peer",
            "hf-flax",
            "--peer-python",
            "/nonexistent/python",
        ]
    )
    assert status == 2
    assert "make bench-peer" in capsys.readouterr().err


def test_peer_labels_are_the_masked_positions():
    batch = {
        "input_ids": np.array([[2, 7, 4, 3], [2, 4, 9, 3]], np.int32),
        "input_mask": np.ones((2, 4), np.int32),
        "segment_ids": np.zeros((2, 4), np.int32),
        "masked_lm_positions": np.array([[2, 0], [1, 2]], np.int32),
        "masked_lm_ids": np.array([[8, 0], [5, 6]], np.int32),
        "masked_lm_weights": np.array([[1, 0], [1, 1]], np.float32),
        "next_sentence_labels": np.array([0, 1], np.int32),
    }
    inputs = peer.hf_inputs(batch)
    np.testing.assert_array_equal(inputs["labels"], [[-100, -100, 8, -100], [-100, 5, 6, -100]])
    assert inputs["next_sentence_label"].tolist() == [0, 1]


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(peer.default_peer_python()), reason="no .venv-peer (make bench-peer)"
)
def test_peer_runs_beside_ours_and_gives_a_ratio():
    spec = tiny_spec(model=tiny_config(num_hidden_layers=1), seq_len=16, windows=1, steps=1)
    report = timing.run(spec, peer="hf-flax", log=lambda *_: None)
    ours, other = report.sides
    assert other.name == "hf-flax" and ours.num_devices == other.num_devices == 1
    assert len(other.windows) == 1 and other.windows[0].real_tokens == 8 * 16
    # Same model size and data from a fresh init: both start near ln(vocab) + ln(2).
    assert abs(other.warmup_loss - ours.warmup_loss) < 0.5
    assert report.ratio > 0 and "bert-jax / hf-flax" in report.render()


def test_bench_and_the_train_step_import_without_tensorflow():
    # The GPU machines that run `bert-jax bench` have no TensorFlow: any import of it fails here.
    code = (
        "import sys\n"
        "sys.modules['tensorflow'] = None\n"
        "import bert_jax.bench.timing, bert_jax.bench.peer\n"
        "import bert_jax.core.trainer, bert_jax.core.model\n"
        "import bert_jax.finetune.tuning.sentence_tuning, bert_jax.cli.bench\n"
        # What `--real-data` reads (the embedded corpus, pairs and masking, packing).
        "import bert_jax.data.sources.documents, bert_jax.data.instances.sentence_pairs\n"
        "import bert_jax.data.masking.settings, bert_jax.data.masking.static_rows\n"
        "import bert_jax.data.tokenizers.load_or_train\n"
        "from bert_jax.bench import data, spec\n"
        "from tests.helpers import tiny_config\n"
        "s = spec.BenchSpec(model=tiny_config(), batch_size=2, seq_len=8, max_predictions=2)\n"
        "assert data.batch_counts(data.synthetic_data(s).batches[0]) == (16, 16, 2)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
