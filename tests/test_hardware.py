"""The hardware table (runtime/hardware.py): every device kind names one chip, exactly and in any
order, and a chip declared once reaches `plan`, `bench` and the training metrics' MFU."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bert_jax import cli
from bert_jax.bench import spec as bench_spec
from bert_jax.core.model import BertConfig
from bert_jax.planning import compile_check, plan
from bert_jax.runtime import hardware, topology
from bert_jax.training import config_lib, flops
from tests.test_plan import BASE, scripted_check

GIB = 1024**3

# A chip nobody makes: a TPU whose accelerator types count chips, on a 2-D torus.
NEW_CHIP = hardware.Chip(
    "v9x", ("TPU v9x", "TPU v9 lite"), 1234.0, 48, 6.5, hardware.TpuSlices("v9x-", 1, 2, 900.0)
)


def test_every_device_kind_names_one_chip_in_any_order():
    for table in (hardware.CHIPS, tuple(reversed(hardware.CHIPS))):
        kinds = {kind: chip for chip in table for kind in chip.device_kinds}
        assert len(kinds) == sum(len(c.device_kinds) for c in table)  # none declared twice
        for kind, chip in kinds.items():
            assert hardware._kinds(table)[kind] is chip
    assert hardware.by_device_kind("TPU v5").name == "v5p"  # v5p calls itself "TPU v5"
    assert hardware.by_device_kind("TPU v5 lite").name == "v5e"
    assert hardware.by_device_kind("NVIDIA H200").name == "h200"
    # Exact: no prefix or substring of a known kind matches, nor another case.
    for kind in ("TPU v4 lite", "TPU v6", "NVIDIA H100", "nvidia h200", "H100", "cpu", ""):
        assert hardware.by_device_kind(kind) is None, kind


def test_a_kind_or_name_declared_twice_is_refused(monkeypatch):
    twice = dataclasses.replace(NEW_CHIP, device_kinds=("TPU v9x", "TPU v5"))
    monkeypatch.setattr(hardware, "CHIPS", (*hardware.CHIPS, twice))
    with pytest.raises(ValueError, match="device kind 'TPU v5' is declared by chips 'v5p' and"):
        hardware.by_device_kind("TPU v4")
    alias = dataclasses.replace(
        NEW_CHIP, tpu=dataclasses.replace(NEW_CHIP.tpu, aliases=("trillium",))
    )
    monkeypatch.setattr(hardware, "CHIPS", (*hardware.CHIPS[:-1], alias))
    with pytest.raises(ValueError, match="name trillium is declared by chips 'v6e' and 'v9x'"):
        hardware.tpu_generations()


def test_the_figures_each_reader_sees_are_the_tables():
    """The TPU slices, `plan`'s default prices (their source and date with them) and the peak
    that bench and the metrics use all come from the one table."""
    for chip in hardware.CHIPS:
        for kind in chip.device_kinds:
            assert flops.peak_flops_per_chip(kind) == chip.peak_bf16_tflops * 1e12
        if chip.tpu:
            target = topology.parse(f"{chip.tpu.cloud_prefix}{8 * chip.tpu.cores_per_chip_in_name}")
            assert target.generation is chip and target.chips == 8
            assert target.hbm_bytes == chip.hbm_gib * GIB
    prices = plan.load_prices(None)
    assert prices["usd_per_chip_hour"] == {"v4": 3.22, "v5e": 1.2, "v5p": 4.2, "v6e": 2.7}
    assert prices["source"].startswith("cloud.google.com/tpu/pricing") and prices["date"]


def test_a_new_chip_is_one_declaration(monkeypatch, capsys):
    """Declared once, a new chip is a `--topology` for `plan` (its HBM, peak and price in the
    plan), a known device kind for `bench` and an MFU for the training metrics."""
    monkeypatch.setattr(hardware, "CHIPS", (*hardware.CHIPS, NEW_CHIP))

    target = topology.parse("v9x-16")
    assert (target.topology, target.accelerator_type, target.chips) == ("v9x:4x4", "v9x-16", 16)
    assert topology.parse("v9x:2x2").generation is NEW_CHIP

    monkeypatch.setattr(compile_check, "check", scripted_check(0.01, 1.0, []))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v9x-16", "--json"]
    argv += ["--dtypes", "bfloat16", "--windowed-einsum", "false", "--shard-optimizer-state=false"]
    assert cli.main([*argv, "--meshes", "dp"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["hbm_bytes"] == 48 * GIB and result["price_per_chip_hour"] == 6.5
    assert result["cost"] == pytest.approx(result["total_seconds"] / 3600 * 16 * 6.5)
    # the scripted collectives' 120 MB on the chip's links, 900 GB/s per chip and direction
    timed = [c["link_seconds"] for c in result["candidates"] if not c["pruned"]]
    assert timed and timed == [pytest.approx(1.2e8 / 900e9)] * len(timed)
    config = config_lib.pretraining_config("base")
    outline = plan.describe_search(config, target, prices=plan.load_prices(None))
    assert "v9x-16 (v9x:4x4: 16 chips, 48 GiB HBM each)" in outline
    assert "price: $6.50 per chip-hour" in outline

    spec = bench_spec.BenchSpec(BertConfig(), batch_size=8, seq_len=128, max_predictions=20)
    assert bench_spec.peak_flops(spec, "TPU v9 lite") == 1234e12

    window = flops.Throughput(BertConfig(), num_chips=2, device_kind="TPU v9x")
    window.add(real_tokens=1000, batch_size=8, seq_len=128, predictions=20)
    summary = window.summary()
    assert summary["mfu"] == pytest.approx(summary["model_tflops_per_sec"] / (2 * 1234))
