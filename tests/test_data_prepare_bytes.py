"""Prepared records keep their bytes: digests written by the code before pairing, masking and
serialization moved to arrays (see also test_data_prepare.py's digests at seq 64).

The settings reach the paths the default settings rarely do: heavy truncation with a short
target in half the document passes, rows of 512 (two-byte positions) with 80 predictions, and
rows of 8 where every token is picked (Floyd's j == 0, no draw). A change here means a fixed
seed no longer reproduces earlier data.
"""

from __future__ import annotations

import hashlib

import pytest

from bert_jax.data.preparation.local_runner import prepare_records
from bert_jax.data.preparation.settings import PrepareSettings
from tests.data_fixtures import minilm_vocab_path


@pytest.mark.parametrize(
    ("settings", "instances", "digest"),
    [
        (
            dict(max_seq_length=16, max_predictions_per_seq=3, short_seq_prob=0.5, seed=3),
            1394,
            "d3bd698e0e995b10",
        ),
        (
            dict(max_seq_length=512, max_predictions_per_seq=80, masked_lm_prob=0.3, seed=4),
            177,
            "09f20a3117612a33",
        ),
        (
            dict(max_seq_length=8, max_predictions_per_seq=8, masked_lm_prob=0.9, seed=5),
            1532,
            "50e23ec79a7ae3fe",
        ),
    ],
)
def test_records_keep_their_bytes_at_unusual_settings(tmp_path, settings, instances, digest):
    settings = PrepareSettings(dupe_factor=2, num_groups=1, heldout_share=0.0, **settings)
    result = prepare_records(["embedded:eval"], minilm_vocab_path(), tmp_path, settings)
    assert result.instance_stats.instances == instances
    (path,) = result.files
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest()[:16] == digest
