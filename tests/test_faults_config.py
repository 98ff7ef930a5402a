"""Fault and bad-input battery, config and launch side: a run that starts from a model directory
takes its identity (or refuses a conflicting setting), config typos and out-of-range values are
named, launchers name a missing tool and write nothing in the current directory. Every case
checks the exit status, the one line naming the setting, tool or file, and the trees it touched."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from bert_jax.convert import model_dir as md
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_checks, config_lib, config_schema, inputs
from tests.convert_fixtures import random_params, write_vocab
from tests.faults import assert_user_error, run_cli, tree_digest
from tests.helpers import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "bert.py:tiny")
# A converted Google checkpoint's identity: the tanh GELU, its own vocabulary (and tokenizer).
GOOGLE_LIKE = tiny_config(
    num_hidden_layers=1, hidden_act="gelu_new", vocab_size=512, max_position_embeddings=512
)
SHORT = tiny_config(num_hidden_layers=1, max_position_embeddings=128)  # 128 positions only


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny model directories (saved once for the module) and a second, different vocab."""
    root = tmp_path_factory.mktemp("models")
    vocab = write_vocab(str(root / "vocab.txt"), GOOGLE_LIKE.vocab_size)
    other = write_vocab(str(root / "other_vocab.txt"), 300)
    google = md.save_model_dir(root / "google", GOOGLE_LIKE, random_params(GOOGLE_LIKE), vocab)
    short = md.save_model_dir(root / "short", SHORT, random_params(SHORT))
    return {"google": google, "short": short, "other_vocab": other, "root": str(root)}


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """An empty current directory: no case may write there."""
    path = tmp_path / "cwd"
    path.mkdir()
    monkeypatch.chdir(path)
    return path


def _pretrain(capsys, *flags: str):
    return run_cli(capsys, ["pretrain", "--config", TINY, "--dry-run", *flags])


def _config_file(tmp_path, body: str) -> str:
    path = tmp_path / "my_config.py"
    path.write_text(
        "from bert_jax.training.config_lib import pretraining_config\n\n\ndef get_config():\n"
        '    config = pretraining_config("tiny")\n' + body + "    return config\n"
    )
    return str(path)


# --- Model identity on init_from ---------------------------------------------------------------


def test_init_from_takes_the_models_tanh_gelu_vocabulary_and_tokenizer(capsys, models, cwd):
    before = tree_digest(models["root"])
    outcome = _pretrain(capsys, f"--config.init_from={models['google']}")
    assert outcome.code == 0, outcome.err
    assert tree_digest(models["root"]) == before and tree_digest(cwd) == {}

    # The library path pretrain() takes: the same adoption, and the model computes the tanh GELU.
    config = config_lib.pretraining_config("tiny")
    config.init_from = models["google"]
    inputs.adopt_init_from(config)
    model_config = config_lib.bert_config(config)
    assert (model_config.hidden_act, model_config.vocab_size) == ("gelu_new", 512)
    assert config.data.tokenizer == os.path.join(models["google"], "tokenizer")
    from bert_jax.core.bert_config import ACTIVATIONS

    x = np.linspace(-3, 3, 7, dtype=np.float32)
    used = np.asarray(ACTIVATIONS[model_config.hidden_act](x))
    np.testing.assert_allclose(used, jax.nn.gelu(x, approximate=True), rtol=1e-6)
    assert not np.allclose(used, jax.nn.gelu(x, approximate=False), rtol=0, atol=1e-5)


def test_dry_run_shows_the_adopted_identity(capsys, models, cwd):
    capsys.readouterr()
    from bert_jax import cli

    argv = ["pretrain", "--config", TINY, "--dry-run", f"--config.init_from={models['google']}"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "model.hidden_act = 'gelu_new'" in out and "model.vocab_size = 512" in out
    # Each value taken from the model is said once, with where it came from.
    source = f"(from config.init_from={models['google']})"
    assert f"config.model.hidden_act: 'gelu' -> 'gelu_new' {source}" in out
    vocab = config_lib.pretraining_config("tiny").model.vocab_size  # the preset's, given way
    assert f"config.model.vocab_size: {vocab} -> 512 {source}" in out
    assert f"data.tokenizer = '{os.path.join(models['google'], 'tokenizer')}'" in out
    assert tree_digest(cwd) == {}


def test_an_explicit_exact_gelu_against_a_tanh_model_is_refused(capsys, models, cwd):
    before = tree_digest(models["root"])
    outcome = _pretrain(
        capsys, f"--config.init_from={models['google']}", "--config.model.hidden_act=gelu"
    )
    assert_user_error(outcome, "config.model.hidden_act='gelu'", "hidden_act='gelu_new'")
    assert f"config.init_from={models['google']}" in outcome.message
    assert tree_digest(models["root"]) == before and tree_digest(cwd) == {}


def test_loading_a_config_file_writes_nothing_beside_it(capsys, cwd, tmp_path, monkeypatch):
    """Python writes bytecode caches wherever the environment lets it (the tests' own setting
    is forced off here): a config file's directory still gets no __pycache__/."""
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    config = _config_file(tmp_path, "")
    before = tree_digest(tmp_path)
    assert run_cli(capsys, ["pretrain", "--config", config, "--dry-run"]).code == 0
    assert tree_digest(tmp_path) == before
    assert sys.dont_write_bytecode is False  # and the setting is as it was


def test_a_config_file_value_that_conflicts_with_the_model_is_refused(
    capsys, models, cwd, tmp_path
):
    config = _config_file(tmp_path, "    config.model.layer_norm_eps = 1e-5\n")
    before = tree_digest(tmp_path)
    outcome = run_cli(
        capsys,
        ["pretrain", "--config", config, "--dry-run", f"--config.init_from={models['google']}"],
    )
    assert_user_error(outcome, "config.model.layer_norm_eps=1e-05", "layer_norm_eps=1e-12")
    assert tree_digest(tmp_path) == before


def test_a_different_explicit_tokenizer_is_refused(capsys, models, cwd):
    outcome = _pretrain(
        capsys,
        f"--config.init_from={models['google']}",
        f"--config.data.tokenizer={models['other_vocab']}",
    )
    assert_user_error(outcome, "config.data.tokenizer", models["other_vocab"], "tokenizer")
    assert tree_digest(cwd) == {}


def test_the_models_positions_bound_the_sequence_length(capsys, models, cwd):
    outcome = _pretrain(capsys, f"--config.init_from={models['short']}")
    assert_user_error(
        outcome, "config.phase2.max_seq_length=512", "config.model.max_position_embeddings=128"
    )


def test_init_from_a_missing_directory_names_it(capsys, cwd, tmp_path):
    missing = str(tmp_path / "no_model")
    assert_user_error(_pretrain(capsys, f"--config.init_from={missing}"), missing)
    assert tree_digest(cwd) == {} and not os.path.exists(missing)


def test_identity_rules_in_the_library():
    """Preset defaults give way to the model; values the user set do not, even equal to the
    preset's; the two names of the tanh GELU agree."""
    model = {"hidden_act": "gelu_tanh", "vocab_size": 100, "layer_norm_eps": 1e-12}
    config = config_lib.pretraining_config("tiny")
    vocab = config.model.vocab_size
    config.model.hidden_act = "gelu_new"
    assert config_lib.adopt_model_identity(config, model, "m") == [
        f"config.model.vocab_size: {vocab} -> 100"
    ]
    config = config_lib.pretraining_config("tiny")
    with pytest.raises(UserError, match=rf"config.model.vocab_size={vocab} but the model has"):
        config_lib.adopt_model_identity(config, model, "m", ["config.model.vocab_size"])


# --- Config typos and values -------------------------------------------------------------------


def test_a_config_file_key_typo_names_the_file_and_the_closest_setting(capsys, cwd, tmp_path):
    config = _config_file(tmp_path, "    config.optimizer.learnig_rate = 1e-3\n")
    outcome = run_cli(capsys, ["pretrain", "--config", config, "--dry-run"])
    assert_user_error(
        outcome,
        config,
        "config.optimizer.learnig_rate is not a setting",
        "did you mean config.optimizer.learning_rate?",
    )
    assert tree_digest(cwd) == {}


def test_an_unknown_model_key_in_a_config_file_is_named(capsys, cwd, tmp_path):
    """It used to reach BertConfig(**...) as a TypeError traceback."""
    config = _config_file(tmp_path, '    config.model.hiden_act = "gelu_new"\n')
    outcome = run_cli(capsys, ["pretrain", "--config", config, "--dry-run"])
    assert_user_error(outcome, config, "config.model.hiden_act", "config.model.hidden_act?")


def test_a_config_override_typo_is_one_line_with_a_suggestion(capsys, cwd):
    outcome = _pretrain(capsys, "--config.optimzer.learning_rate=1e-3")
    assert_user_error(outcome, "--config.optimzer.learning_rate", "did you mean")
    assert "--config.optimizer.learning_rate" in outcome.message


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optimizer.decouple_lr=maybe", "a boolean setting takes true or false, not 'maybe'"),
        ("total_steps=abc", "an integer setting takes a whole number, not 'abc'"),
        ("optimizer.learning_rate=fast", "a number setting takes a number such as 1e-4"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_setting_and_what_it_takes(
    capsys, cwd, override, expected
):
    outcome = _pretrain(capsys, f"--config.{override}")
    assert_user_error(outcome, f"--config.{override}: {expected}")
    assert "(" not in outcome.message  # not absl's raw tuple


@pytest.mark.parametrize(
    "override, named",
    [
        ("total_steps=-5", "config.total_steps=-5"),
        ("log_every_steps=0", "config.log_every_steps=0"),
        ("checkpoint.every_steps=0", "config.checkpoint.every_steps=0"),
        ("checkpoint.keep=0", "config.checkpoint.keep=0"),
        ("phase1.batch_size=-256", "config.phase1.batch_size=-256"),
        ("phase1.max_predictions_per_seq=0", "config.phase1.max_predictions_per_seq=0"),
        ("optimizer.warmup_steps=-1", "config.optimizer.warmup_steps=-1"),
        ("optimizer.learning_rate=-0.1", "config.optimizer.learning_rate=-0.1"),
        ("phase2.max_seq_length=100000", "config.phase2.max_seq_length=100000"),
        ("phase1.max_seq_length=3", "config.phase1.max_seq_length=3"),
        ("model.vocab_size=-3", "config.model.vocab_size=-3"),
        ("model.max_position_embeddings=0", "config.model.max_position_embeddings=0"),
        ("data.masked_lm_prob=2.0", "config.data.masked_lm_prob=2.0"),
        ("eval.batches=0", "config.eval.batches"),
        # Floats that are not finite, or out of their range (issue 27's second round).
        ("optimizer.learning_rate=nan", "config.optimizer.learning_rate=nan"),
        ("optimizer.learning_rate=inf", "config.optimizer.learning_rate=inf"),
        ("optimizer.end_learning_rate=-inf", "config.optimizer.end_learning_rate=-inf"),
        ("optimizer.weight_decay=-0.01", "config.optimizer.weight_decay=-0.01"),
        ("optimizer.weight_decay=nan", "config.optimizer.weight_decay=nan"),
        ("optimizer.eps=0.0", "config.optimizer.eps=0.0"),
        ("optimizer.b1=1.0", "config.optimizer.b1=1.0"),
        ("optimizer.b2=-0.5", "config.optimizer.b2=-0.5"),
        ("optimizer.clip_norm=nan", "config.optimizer.clip_norm=nan"),
        ("model.hidden_dropout_prob=1.5", "config.model.hidden_dropout_prob=1.5"),
        ("model.attention_probs_dropout_prob=nan", "config.model.attention_probs_dropout_prob"),
        ("model.layer_norm_eps=0.0", "config.model.layer_norm_eps=0.0"),
        ("model.initializer_range=inf", "config.model.initializer_range=inf"),
        ("data.masked_lm_prob=0.0", "config.data.masked_lm_prob=0.0"),
        ("data.masked_lm_prob=nan", "config.data.masked_lm_prob=nan"),
        ("data.short_seq_prob=-0.1", "config.data.short_seq_prob=-0.1"),
        ("phase1.learning_rate=-0.5", "config.phase1.learning_rate=-0.5"),
        ("phase1.packing_factor=0.5", "config.phase1.packing_factor=0.5"),
        ("phase1.fraction=nan", "config.phase1.fraction"),
    ],
)
def test_absurd_values_are_named_before_anything_runs(capsys, cwd, override, named):
    assert_user_error(_pretrain(capsys, f"--config.{override}"), named)
    assert tree_digest(cwd) == {}


def test_a_non_finite_rate_stops_a_real_run_before_its_workdir_exists(capsys, cwd, tmp_path):
    """Not only --dry-run: `pretrain --workdir` with a NaN rate ran and exited 0 before."""
    workdir = tmp_path / "run"
    argv = ["pretrain", "--config", TINY, "--workdir", str(workdir)]
    outcome = run_cli(capsys, [*argv, "--config.optimizer.learning_rate=nan"])
    assert_user_error(outcome, "config.optimizer.learning_rate=nan must be a finite number")
    assert not workdir.exists() and tree_digest(cwd) == {}


def test_a_workdir_under_a_regular_file_names_the_flag_and_the_file(capsys, cwd, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a sentence.\n", encoding="utf-8")
    before = tree_digest(tmp_path)
    workdir = corpus / "w9"
    outcome = run_cli(capsys, ["pretrain", "--config", TINY, "--workdir", str(workdir)])
    assert_user_error(
        outcome, f"--workdir {workdir}", f"{corpus} is a regular file, not a directory"
    )
    assert "Errno" not in outcome.message
    assert tree_digest(tmp_path) == before


def test_a_sentencepiece_model_that_is_not_one_is_named(capsys, cwd, tmp_path):
    bogus = tmp_path / "random.model"
    bogus.write_bytes(np.random.default_rng(0).bytes(4096))
    output = tmp_path / "records"
    argv = ["data", "prepare", "--input", "embedded", "--tokenizer", str(bogus)]
    outcome = run_cli(capsys, [*argv, "--output", str(output)])
    assert_user_error(outcome, f"{bogus} is not a SentencePiece model")
    assert "INTERNAL" not in outcome.message and not output.exists()
    assert tree_digest(cwd) == {}


def test_a_vocab_txt_that_is_not_text_is_named_with_its_line(capsys, cwd, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"[PAD]\n[UNK]\n\xff\xfe binary\n")
    output = tmp_path / "records"
    argv = ["data", "prepare", "--input", "embedded", "--tokenizer", str(vocab)]
    outcome = run_cli(capsys, [*argv, "--output", str(output)])
    assert_user_error(outcome, f"{vocab}: line 3 is not UTF-8 text")
    assert not output.exists()


# Settings with a closed set of values (issue 36 item 8): a dry run accepted optimizer.name=adam
# and optimizer.schedule=linear, which the run refused after writing config.json and tokenizer/;
# model.dtype=bf16 was a TypeError traceback (exit 1) in both.
CLOSED_SET_CASES = [
    ("model.dtype=bf16", "config.model.dtype='bf16' is not one of 'float32', 'bfloat16'"),
    ("model.param_dtype=float16", "config.model.param_dtype='float16' is not one of"),
    ("optimizer.name=adam", "config.optimizer.name='adam' is not one of 'adamw', 'lamb'"),
    ("optimizer.schedule=linear", "config.optimizer.schedule='linear' is not one of 'whole_run'"),
    ("model.hidden_act=swish", "config.model.hidden_act='swish' is not one of 'gelu', "),
    ("model.attention_impl=flash", "config.model.attention_impl='flash' is not one of 'auto'"),
    ("model.attention_impl=dot_product", "config.model.attention_impl='dot_product' cannot apply"),
    ("model.dropout_impl=bernoulli", "config.model.dropout_impl='bernoulli' is not one of 'hash'"),
    ("model.remat=some", "config.model.remat='some' is not one of 'none', 'full', 'dots'"),
    ("dropout_rng_impl=philox", "config.dropout_rng_impl='philox' is not one of 'threefry2x32'"),
    ("data.splitter=punkt", "config.data.splitter='punkt' is not one of 'syntok'"),
    ("mesh.shape=(2,2)", "config.mesh.shape=(2, 2) must be 3 sizes"),
    ("mesh.shape=(-1,-1,1)", "config.mesh.shape=(-1, -1, 1) must be 3 sizes"),
]


@pytest.mark.parametrize("override, named", CLOSED_SET_CASES)
def test_a_value_outside_its_closed_set_is_refused_by_the_dry_run_and_the_run_alike(
    capsys, cwd, tmp_path, override, named
):
    """One line naming the setting and its values (exit 2), the same from `--dry-run` as from a
    real run, which writes nothing: its workdir is never created."""
    dry = _pretrain(capsys, f"--config.{override}")
    assert_user_error(dry, named)
    workdir = tmp_path / "run"
    argv = ["pretrain", "--config", TINY, "--workdir", str(workdir), f"--config.{override}"]
    real = run_cli(capsys, argv)
    assert_user_error(real, named)
    assert real.message == dry.message
    assert not workdir.exists() and tree_digest(cwd) == {}


def test_every_allowed_value_is_one_the_run_accepts():
    """config_checks.CHOICES is what the model, the optimizer and the keys take: no value the
    dry run lets through is refused later."""
    from bert_jax.configs import modernbert
    from bert_jax.core import optim
    from bert_jax.core.model import BertConfig
    from bert_jax.core.trainer import init_and_dropout_keys

    choices = config_checks.CHOICES
    config = config_lib.pretraining_config("tiny")
    modern = modernbert.get_config("tiny")  # the keys only a ModernBERT config holds
    for key in choices:
        value = config_schema.setting_value(config, key)
        if value is None:
            value = config_schema.setting_value(modern, key)
        assert value in choices[key], key
    for key in ("hidden_act", "attention_impl", "dropout_impl", "remat", "dtype", "param_dtype"):
        for value in choices[f"model.{key}"]:
            BertConfig(**{key: value})
            if key.endswith("dtype"):
                assert jax.numpy.dtype(value).name == value
    for name in choices["optimizer.name"]:
        for schedule in choices["optimizer.schedule"]:
            config.optimizer.name, config.optimizer.schedule = name, schedule
            optim.from_config(config.optimizer, [10, 5], [config.phase1, config.phase2])
    for impl in choices["dropout_rng_impl"]:
        init_and_dropout_keys(0, impl)


def test_compile_only_checks_the_values_too(capsys, cwd):
    outcome = run_cli(
        capsys, ["pretrain", "--config", TINY, "--compile-only", "--config.log_every_steps=-1"]
    )
    assert_user_error(outcome, "config.log_every_steps=-1", only_line=False)


def test_data_prepare_length_bound(capsys, tmp_path):
    """The bound `data prepare --max-seq-length` checks: every size preset's 512 positions."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here.\nAnother one there.\n")
    before = tree_digest(tmp_path)
    argv = ["data", "prepare", "--input", str(corpus), "--tokenizer", "none"]
    outcome = run_cli(capsys, [*argv, "--output", str(tmp_path / "out"), "--max-seq-length=100000"])
    assert_user_error(outcome, "--max-seq-length=100000", "512 position embeddings")
    assert tree_digest(tmp_path) == before
    with pytest.raises(
        UserError, match=r"--max-seq-length=100000 exceeds the model's 512 position"
    ):
        config_checks.check_sequence_length(100000, "--max-seq-length")
    config_checks.check_sequence_length(512, "--max-seq-length")


# --- Launchers ---------------------------------------------------------------------------------


@pytest.fixture
def no_tools(tmp_path, monkeypatch):
    """A PATH with nothing on it: no gcloud, sbatch or srun."""
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.mark.parametrize("action", ["create", "up", "logs"])
def test_launch_tpu_without_gcloud_names_it(capsys, cwd, no_tools, tmp_path, action):
    archive = tmp_path / "src.tar.gz"
    argv = ["launch", "tpu", action, "--name", "n", "--zone", "z"]
    if action == "up":
        argv += ["--archive", str(archive), "--", "--config", "c"]
    outcome = run_cli(capsys, argv)
    assert_user_error(outcome, "gcloud not found on PATH", "cloud.google.com")
    assert tree_digest(cwd) == {} and not archive.exists()


def test_launch_slurm_submit_without_sbatch_names_it_and_writes_nothing(
    capsys, cwd, no_tools, tmp_path
):
    workdir = tmp_path / "run"
    argv = ["launch", "slurm", "--nodes", "1", "--submit", "--", "--workdir", str(workdir)]
    assert_user_error(run_cli(capsys, argv), "sbatch not found on PATH")
    assert tree_digest(cwd) == {} and not workdir.exists()


def test_launch_slurm_writes_under_the_workdir_not_the_cwd(capsys, cwd, tmp_path):
    workdir = tmp_path / "run"
    argv = ["launch", "slurm", "--nodes", "1", "--", "--config", "c", f"--workdir={workdir}"]
    outcome = run_cli(capsys, argv)
    assert outcome.code == 0, outcome.err
    script = (workdir / "bert-jax.sbatch").read_text()
    assert f"#SBATCH --output={workdir}/bert-jax-%j.out\n" in script
    assert tree_digest(cwd) == {}
    # Rewriting its own script is fine; the cwd stays empty.
    assert run_cli(capsys, argv).code == 0 and tree_digest(cwd) == {}


def test_launch_slurm_without_a_place_for_the_script_is_refused(capsys, cwd):
    outcome = run_cli(capsys, ["launch", "slurm", "--nodes", "1", "--", "--config", "c"])
    assert_user_error(outcome, "--script", "--workdir")
    assert tree_digest(cwd) == {}


def test_launch_slurm_log_path_it_cannot_write_names_output(capsys, cwd, tmp_path):
    workdir = tmp_path / "my runs"
    argv = ["launch", "slurm", "--nodes", "1", "--", "--config", "c", "--workdir", str(workdir)]
    assert_user_error(run_cli(capsys, argv), str(workdir), "--output PATH")
    assert tree_digest(cwd) == {} and not workdir.exists()


def test_launch_slurm_never_replaces_a_file_it_did_not_write(capsys, cwd, tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("my own notes\n")
    before = tree_digest(tmp_path)
    argv = ["launch", "slurm", "--nodes", "1", "--script", str(mine), "--", "--config", "c"]
    assert_user_error(run_cli(capsys, argv), str(mine), "not written by bert-jax")
    assert tree_digest(tmp_path) == before


def test_runner_names_a_tool_that_vanished_between_check_and_run():
    from bert_jax.launch import LaunchError, Runner

    def gone(argv, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    with pytest.raises(LaunchError, match="^sbatch not found on PATH"):
        Runner(out=open(os.devnull, "w"), run=gone)(["sbatch", "x"])  # noqa: SIM115
