"""bert-jax's on-disk caches (`runtime.caches`): one root, and JAX's persistent compilation cache
turned on for `bert-jax` commands, so a command run again reads its compiled programs back."""

import os
import subprocess
import sys

import pytest

from bert_jax.runtime import caches

JAX_SETTINGS = (
    caches.JAX_CACHE_DIR_ENV,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_COMPILATION_CACHE_MAX_SIZE",
)


@pytest.fixture
def bare_env(monkeypatch, tmp_path):
    """No cache settings of the test session's (conftest sets JAX's and bert-jax's)."""
    for name in (*JAX_SETTINGS, caches.CACHE_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_the_cache_root_is_the_setting_else_xdg_else_home(bare_env, tmp_path):
    assert caches.cache_root() == str(tmp_path / "home" / ".cache" / "bert_jax")
    bare_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caches.cache_root() == str(tmp_path / "xdg" / "bert_jax")
    bare_env.setenv(caches.CACHE_ENV, str(tmp_path / "mine"))
    assert caches.cache_root() == str(tmp_path / "mine")
    bare_env.setenv(caches.CACHE_ENV, "")
    assert caches.cache_root() is None


def test_compiled_programs_are_kept_under_the_root(bare_env, tmp_path):
    bare_env.setenv(caches.CACHE_ENV, str(tmp_path / "root"))
    directory = caches.keep_compiled_programs()
    assert directory == str(tmp_path / "root" / caches.COMPILED_PROGRAMS_DIR)
    assert not os.path.exists(tmp_path / "root")  # made when JAX writes, not by `--help`
    assert os.environ[caches.JAX_CACHE_DIR_ENV] == directory
    assert float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) == (
        caches.MIN_COMPILE_SECONDS
    )
    assert int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]) == caches.MAX_BYTES


@pytest.mark.parametrize("users", [str(os.sep + "elsewhere"), ""], ids=["a directory", "off"])
def test_a_jax_cache_the_user_set_stands(bare_env, tmp_path, users):
    bare_env.setenv(caches.CACHE_ENV, str(tmp_path / "root"))
    bare_env.setenv(caches.JAX_CACHE_DIR_ENV, users)
    assert caches.keep_compiled_programs() == (users or None)
    assert os.environ[caches.JAX_CACHE_DIR_ENV] == users
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ


@pytest.mark.parametrize("root", ["", "a file"])
def test_no_cache_root_or_an_unwritable_one_keeps_nothing(bare_env, tmp_path, root):
    if root:  # unwritable for root too: a file where the directory would be
        root = tmp_path / root
        root.write_text("not a directory")
    bare_env.setenv(caches.CACHE_ENV, str(root))
    assert caches.keep_compiled_programs() is None
    assert caches.JAX_CACHE_DIR_ENV not in os.environ


def test_a_command_run_again_reads_its_compiled_programs_back(tmp_path):
    """Two `bert-jax fill-mask` processes with only bert-jax's cache root set: the first writes
    its compiled programs under ROOT/xla, the second reads them back (JAX logs the hits) and
    prints the same predictions."""
    from bert_jax.convert.model_dir import save_model_dir
    from bert_jax.data.sources import embedded as corpus
    from bert_jax.data.tokenizers.sentencepiece import train_sentencepiece
    from tests.convert_fixtures import random_params
    from tests.helpers import tiny_config

    text = tmp_path / "corpus.txt"
    sentences = [s for d in corpus.embedded_documents("train")[:40] for s in d]
    text.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    tokenizer = train_sentencepiece([text], 300, tmp_path / "spm", lowercase=True, num_threads=1)
    config = tiny_config(vocab_size=300, num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    model = tmp_path / "model"
    save_model_dir(model, config, random_params(config, seed=0), tokenizer=tokenizer)

    env = {k: v for k, v in os.environ.items() if k not in JAX_SETTINGS}
    env[caches.CACHE_ENV] = str(tmp_path / "root")
    # The tiny model's programs compile in well under MIN_COMPILE_SECONDS: keep every one.
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    command = [os.path.join(os.path.dirname(sys.executable), "bert-jax"), "fill-mask"]
    command += ["--model", str(model), "--json", "the [MASK] of the story"]
    kept = tmp_path / "root" / caches.COMPILED_PROGRAMS_DIR

    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    entries = sorted(os.listdir(kept))
    assert entries, "the first run kept no compiled program"

    second = subprocess.run(
        command, env={**env, "JAX_LOG_COMPILES": "1"}, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout == first.stdout
    assert "Persistent compilation cache hit" in second.stderr
    assert sorted(os.listdir(kept)) == entries


def test_every_command_but_one_that_times_its_compiles_keeps_compiled_programs(monkeypatch):
    from bert_jax import cli
    from bert_jax.cli import config_flags

    kept = []
    monkeypatch.setattr(caches, "keep_compiled_programs", lambda: kept.append(True))
    monkeypatch.setattr(config_flags.ConfigCommand, "main", lambda self, argv: 0)
    for command in ("bench", "pretrain", "plan"):
        kept.clear()
        assert cli.main([command]) == 0
        assert kept == ([] if command == "bench" else [True]), command
    assert [c.name for c in cli._CONFIG_COMMANDS.values() if c.times_compiles] == ["bench"]
