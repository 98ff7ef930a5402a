"""`pretrain --dry-run` refuses what the run would refuse about the mesh on this machine's
devices, with the run's own message (8 emulated CPU devices here)."""

from __future__ import annotations

import os

import jax

from bert_jax import cli
from bert_jax.core import partitioning

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
TINY = os.path.join(TINY, "bert.py:tiny")


def _dry_run(capsys, *overrides) -> tuple[int, str]:
    status = cli.main(["pretrain", "--config", TINY, "--dry-run", *overrides])
    return status, capsys.readouterr().err


def test_a_mesh_of_more_devices_than_there_are_is_refused_as_by_the_run(capsys):
    count = len(jax.devices())
    status, err = _dry_run(capsys, f"--config.mesh.shape={count * 2},1,1")
    assert status == 2 and err.count("\n") == 1, err
    try:
        partitioning.make_mesh((count * 2, 1, 1))
    except Exception as refusal:  # the run's own check and words
        assert err == f"bert-jax pretrain: error: {refusal}\n"
    else:
        raise AssertionError("the run accepts the mesh")
    assert "needs 16 devices, but 8 are available" in err


def test_a_batch_the_mesh_cannot_split_is_refused(capsys):
    status, err = _dry_run(capsys, "--config.mesh.shape=8,1,1", "--config.phase1.batch_size=12")
    assert status == 2
    assert "config.phase1.batch_size=12 is not divisible by the data-parallel size 8" in err


def test_a_mesh_that_fits_passes(capsys):
    status, err = _dry_run(capsys, "--config.mesh.shape=-1,2,1")
    assert status == 0, err
