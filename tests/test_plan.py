"""plan: the search over meshes and accumulation factors, the schedule's time and cost, and the
command's output. XLA's verdicts are scripted here (compile_check's real compiles for TPU slices
are tested in test_topology.py); what is tested is what `plan` does with them."""

from __future__ import annotations

import json
import os

import pytest

from bert_jax import cli, compile_check, config_lib, cost_model, plan, topology
from bert_jax.errors import UserError
from tests import faults

GIB = 1024**3
BASE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs/bert.py")
PRICES = {"source": "test prices", "date": "today", "usd_per_chip_hour": {"v5p": 4.0}}


def scripted_check(
    peak_gib_per_sequence: float, step_ms_per_sequence: float, calls: list, micro_ms: float = 0.0
):
    """A stand-in for compile_check.check: peak memory and step time proportional to the
    sequences per replica and micro-batch; records every (mesh, accumulation) it compiled.
    Rematerialization ("dots") halves the peak and costs 20% more time; its compiles are
    recorded with the policy as a fourth item. Each micro-batch costs `micro_ms` more."""

    def check(config, target=None, **_):
        (phase,) = config_lib.plan_phases(config)
        mesh = tuple(config.mesh.shape)
        accum = int(config.grad_accum_steps)
        per_replica = phase.batch_size // (mesh[0] * mesh[1] * accum)
        remat = config.model.remat
        calls.append((phase.name, mesh, accum) + ((remat,) if remat != "none" else ()))
        sharded = 1 if mesh[1] == 1 else 0.5  # fsdp halves what each chip holds
        sharded *= 0.5 if remat != "none" else 1
        peak = int(per_replica * peak_gib_per_sequence * sharded * GIB)
        if peak > 3 * target.hbm_bytes:  # far too large: XLA refuses to compile
            raise compile_check.DoesNotFitError(f"config.{phase.name} does not fit: scripted")
        per_micro = step_ms_per_sequence * per_replica * (1.2 if remat != "none" else 1)
        seconds = (per_micro + micro_ms) * accum / 1e3
        cost = cost_model.ProgramCost(1e12, 1e9, seconds, 0, {"all-reduce": 1}, link_bytes=1.2e8)
        update = cost_model.ProgramCost(0.0, 0.0, 1e-9, 0, {})
        compiled = compile_check.PhaseCompile(
            phase.name, phase.batch_size, phase.max_seq_length, phase.max_predictions_per_seq,
            accum, cost_model.Memory(0, 0, 0, peak, 0), cost, update, 1e15 * seconds, 1.0,
        )  # fmt: skip
        return compile_check.CompileReport(
            {"data": mesh[0], "fsdp": mesh[1], "tensor": mesh[2]}, "tpu",
            target.generation.device_kind, target.chips, 1, target.hbm_bytes, "HBM",
            [compiled], target, target.peak_flops,
        )  # fmt: skip

    return check


@pytest.fixture
def base_config():
    config = config_lib.pretraining_config("base")
    config.total_steps = 1000  # phase1 900 steps, phase2 100
    return config


def test_accumulation_doubles_until_the_step_fits(monkeypatch, base_config):
    """v5p-16 (8 chips, 95 GiB): 256 sequences over 8 replicas = 32 each at 4 GiB per sequence
    is 128 GiB: too much for data parallel until 2 micro-batches; FSDP holds half and fits at 1."""
    calls = []
    monkeypatch.setattr(compile_check, "check", scripted_check(4.0, 1.0, calls))
    target = topology.parse("v5p-16")
    result = plan.plan(base_config, target, kinds=["dp", "fsdp"], prices=PRICES)
    by_mesh = {(c.phase, c.mesh_kind): c for c in result.candidates}
    dp, fsdp = by_mesh["phase1", "dp"], by_mesh["phase1", "fsdp"]
    assert (dp.fits, dp.accum_steps, dp.batch_per_replica) == (True, 2, 16)
    assert (fsdp.fits, fsdp.accum_steps, fsdp.batch_per_replica) == (True, 1, 32)
    assert dp.peak_bytes == 64 * GIB and fsdp.peak_bytes == 64 * GIB
    assert calls[:3] == [
        ("phase1", (8, 1, 1), 1),
        ("phase1", (8, 1, 1), 2),
        ("phase1", (1, 8, 1), 1),
    ]
    # The schedule takes the fastest fitting candidate of each phase: equal here, the first.
    first = result.schedule[0]
    assert first.steps == 900 and first.candidate.step_seconds == pytest.approx(0.032)
    assert first.seconds == pytest.approx(900 * 0.032)
    total = 900 * 0.032 + 100 * 0.032
    assert result.total_seconds == pytest.approx(total)
    assert result.chip_hours == pytest.approx(total / 3600 * 8)
    assert result.cost == pytest.approx(total / 3600 * 8 * 4.0)
    assert result.prices_source == "test prices today"


def test_rematerialization_is_tried_only_where_it_saves_micro_batches(monkeypatch, capsys):
    """Data parallel needs 2 micro-batches without remat: remat is compiled at 1 only, where it
    fits (20% dearer per sequence, but one micro-batch's overhead instead of two: the faster
    data parallel step). FSDP fits at 1 without remat: remat is not compiled for it, and it
    stays fastest."""
    calls = []
    monkeypatch.setattr(compile_check, "check", scripted_check(4.0, 1.0, calls, micro_ms=10.0))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-16", "--remat", "dots,none,dots"]
    assert cli.main([*argv, "--meshes", "dp,fsdp"]) == 0
    out = capsys.readouterr().out
    assert [c for c in calls if c[0] == "phase1"] == [
        ("phase1", (8, 1, 1), 1),
        ("phase1", (8, 1, 1), 2),
        ("phase1", (8, 1, 1), 1, "dots"),
        ("phase1", (1, 8, 1), 1),
    ]
    assert "| est. MFU | ICI ms, at least | compile s |" in out
    assert "| phase1 | data parallel (8, 1, 1) | 16 | 2 | 64.00 | yes | 52.0 |" in out
    assert "| phase1 | data parallel (8, 1, 1), remat dots | 32 | 1 | 64.00 | yes | 48.4 |" in out
    assert "phase1: 900,000 steps x 42.0 ms with fsdp (1, 8, 1), 1 micro-batch" in out
    assert cli.main([*argv, "--meshes", "dp"]) == 0
    out = capsys.readouterr().out
    assert "x 48.4 ms with data parallel (8, 1, 1), remat dots, 1 micro-batch" in out
    outcome = faults.run_cli(capsys, [*argv, "--remat", "some"])
    faults.assert_user_error(outcome, "--remat: unknown policy 'some'")


def test_nothing_fits_is_said_and_exit_4(monkeypatch, capsys):
    """A batch that fits at no accumulation factor up to --max-accum: each mesh says why, the
    schedule says nothing fits, and the command exits 4 as `--compile-only` does."""
    calls = []
    monkeypatch.setattr(compile_check, "check", scripted_check(1000.0, 1.0, calls))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-16"]
    argv += ["--meshes", "dp", "--max-accum", "4"]
    assert cli.main(argv) == 4
    out = capsys.readouterr().out
    assert "no: does not fit up to 4 micro-batches" in out
    assert "phase1: 900,000 steps: nothing fits this slice" in out
    assert [accum for phase, _, accum in calls if phase == "phase1"] == [1, 2, 4]


def test_json_output_and_the_shipped_price_file(monkeypatch, capsys):
    monkeypatch.setattr(compile_check, "check", scripted_check(0.01, 1.0, []))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5litepod-16", "--json"]
    assert cli.main([*argv, "--meshes", "dp,fsdp_tp"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accelerator_type"] == "v5litepod-16" and result["chips"] == 16
    meshes = {tuple(c["mesh"]) for c in result["candidates"]}
    assert meshes == {(16, 1, 1), (1, 4, 4)}  # fsdp with a tensor axis of 4 (12 heads)
    # the collectives' least time on v5e's links (200 GB/s per chip and direction)
    assert [c["link_seconds"] for c in result["candidates"]] == [pytest.approx(6e-4)] * 4
    shipped = plan.load_prices(None)
    assert result["price_per_chip_hour"] == shipped["usd_per_chip_hour"]["v5e"]
    assert shipped["source"] and shipped["date"]
    assert result["cost"] == pytest.approx(
        result["total_seconds"] / 3600 * 16 * result["price_per_chip_hour"]
    )


def test_bad_plan_arguments_are_one_line(capsys, tmp_path):
    base = ["plan", "--config", f"{BASE}:tiny"]
    faults.assert_user_error(faults.run_cli(capsys, base), "--topology is required")
    outcome = faults.run_cli(capsys, [*base, "--topology", "v5p-16", "--meshes", "ring"])
    faults.assert_user_error(outcome, "unknown mesh kind 'ring'")
    broken = tmp_path / "prices.json"
    broken.write_text("{not json")
    outcome = faults.run_cli(capsys, [*base, "--topology", "v5p-16", "--prices", str(broken)])
    faults.assert_user_error(outcome, str(broken), "not JSON")
    with pytest.raises(UserError, match="usd_per_chip_hour"):
        broken.write_text("{}")
        plan.load_prices(str(broken))
