"""plan: the settings search (stages, pruning, the cache), the schedule's time and cost, the
winners' flags and the command's output.

Most tests script XLA's verdicts (what `plan` does with them is what they test); the module's
last tests compile a one-layer model for two TPU topologies for real (libtpu, no chip), a
handful of compiles shared by one module fixture (marker `tpu_compile`: `make test-tpu`)."""

from __future__ import annotations

import json
import os

import pytest

from bert_jax import cli
from bert_jax.cli import config_flags
from bert_jax.cli import plan as plan_cli
from bert_jax.planning import compile_check, cost_model, plan
from bert_jax.runtime import caches, errors, host_memory, topology
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib, step_log
from tests import faults
from tests.helpers import compile_in_process

GIB = 1024**3
BASE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs/bert.py")
PRICES = {"source": "test prices", "date": "today", "usd_per_chip_hour": {"v5p": 4.0}}
# Only meshes and accumulation, as `plan` searched before the settings search.
MESHES_ONLY = dict(dtypes=("bfloat16",), windowed=(False,), zero=(False,), remats=())


def scripted_check(
    peak_gib_per_sequence: float,
    step_ms_per_sequence: float,
    calls: list,
    micro_ms: float = 0.0,
    update_ms: float = 0.0,
    same_program: bool = False,
    data_ms: float = 0.0,
    zero_ms: float = 0.0,
):
    """A stand-in for compile_check.check: peak memory and step time proportional to the
    sequences per replica and micro-batch; records every (mesh, accumulation) it compiled.
    Rematerialization ("dots") halves the peak and costs 20% more time; its compiles are
    recorded with the policy as a fourth item. Each micro-batch costs `micro_ms` more.
    float32 costs 10% more than bfloat16, windowed einsums 5% more where they apply; ZeRO 1
    saves (1 - 1/data) of an update of `update_ms` and costs `zero_ms`; a data axis of d costs
    (d - 1) x `data_ms`. With `same_program`, ZeRO 1 lowers to the same program as without it."""

    def check(config, target=None, **_):
        (phase,) = config_lib.split_phases(config)
        mesh = tuple(config.mesh.shape)
        accum = int(config.grad_accum_steps)
        per_replica = phase.batch_size // (mesh[0] * mesh[1] * accum)
        remat, zero = config.model.remat, bool(config.mesh.shard_optimizer_state)
        windowed = bool(config.mesh.windowed_einsum) and (mesh[1] > 1 or mesh[2] > 1)
        calls.append((phase.name, mesh, accum) + ((remat,) if remat != "none" else ()))
        sharded = 1 if mesh[1] == 1 else 0.5  # fsdp halves what each chip holds
        sharded *= 0.5 if remat != "none" else 1
        peak = int(per_replica * peak_gib_per_sequence * sharded * GIB)
        if peak > 3 * target.hbm_bytes:  # far too large: XLA refuses to compile
            raise compile_check.DoesNotFitError(f"config.{phase.name} does not fit: scripted")
        per_micro = step_ms_per_sequence * per_replica * (1.2 if remat != "none" else 1)
        per_micro *= (1.1 if config.model.dtype == "float32" else 1) * (1.05 if windowed else 1)
        update = update_ms / mesh[0] + zero_ms if zero else update_ms
        seconds = ((per_micro + micro_ms) * accum + update + (mesh[0] - 1) * data_ms) / 1e3
        cost = cost_model.ProgramCost(1e12, 1e9, seconds, 0, {"all-reduce": 1}, link_bytes=1.2e8)
        priced = cost_model.ProgramCost(0.0, 0.0, update_ms / 1e3 or 1e-9, 0, {})
        key = repr(
            (phase.name, mesh, accum, remat, config.model.dtype, windowed)
            + (() if same_program else (zero,))
        )
        compiled = compile_check.PhaseCompile(
            phase.name, phase.batch_size, phase.max_seq_length, phase.max_predictions_per_seq,
            accum, cost_model.Memory(0, 0, 0, peak, 0), cost, priced, 1e15 * seconds, 1.0,
            program_key=key,
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
    result = plan.plan(base_config, target, kinds=["dp", "fsdp"], prices=PRICES, **MESHES_ONLY)
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
    data parallel step). With FSDP, which fits at 1 without remat, remat is pruned."""
    calls = []
    monkeypatch.setattr(compile_check, "check", scripted_check(4.0, 1.0, calls, micro_ms=10.0))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-16", "--remat", "dots,none,dots"]
    argv += ["--dtypes", "bfloat16", "--windowed-einsum", "false", "--shard-optimizer-state", "no"]
    outcome = faults.run_cli(capsys, [*argv, "--meshes", "dp,fsdp"])
    faults.assert_user_error(outcome, "--shard-optimizer-state: 'no' is not true or false")
    argv[-1] = "false"
    assert cli.main([*argv, "--meshes", "dp"]) == 0
    out = capsys.readouterr().out
    assert [c for c in calls if c[0] == "phase1"] == [
        ("phase1", (8, 1, 1), 1),
        ("phase1", (8, 1, 1), 2),
        ("phase1", (8, 1, 1), 1, "dots"),
    ]
    assert "| est. MFU | ICI ms, at least | compile s |" in out
    assert (
        "| phase1 | mesh | data parallel (8, 1, 1), bfloat16 | 16 | 2 | 64.00 | yes | 52.0 |" in out
    )
    assert (
        "| phase1 | remat | data parallel (8, 1, 1), bfloat16, remat dots | 32 | 1 | 64.00 " in out
    )
    assert "x 48.4 ms with data parallel (8, 1, 1), bfloat16, remat dots, 1 micro-batch" in out
    assert "--config.model.remat=dots --config.grad_accum_steps=1" in out
    assert cli.main([*argv, "--meshes", "dp,fsdp"]) == 0
    out = capsys.readouterr().out
    assert "phase1: 900,000 steps x 42.0 ms with fsdp (1, 8, 1), bfloat16, windowed" in out
    assert "fits without accumulation: remat only adds recomputation" in out
    outcome = faults.run_cli(capsys, [*argv, "--remat", "some"])
    faults.assert_user_error(outcome, "--remat: unknown policy 'some'")


@pytest.mark.parametrize(
    "failure, note",
    [
        (
            host_memory.ChildDied("compiling ...: its process ended by SIGSEGV"),
            "the compiler crashed",
        ),
        (host_memory.HostMemoryError("compiling ... held 21.0 GiB"), "compiling ... held 21.0 GiB"),
    ],
)
def test_a_compile_that_crashes_or_outgrows_the_host_is_noted_and_the_search_goes_on(
    monkeypatch, base_config, failure, note
):
    """Remat's compile (data parallel needs 2 micro-batches, so remat is tried at 1) crashes XLA
    or passes the host's memory: that candidate is not compiled, the plan is made without it."""
    scripted = scripted_check(4.0, 1.0, [], micro_ms=10.0)

    def check(config, target=None, **kwargs):
        if config.model.remat != "none":
            raise failure
        return scripted(config, target, **kwargs)

    monkeypatch.setattr(compile_check, "check", check)
    result = plan.plan(
        base_config, topology.parse("v5p-16"), kinds=["dp"], dtypes=("bfloat16",),
        windowed=(False,), zero=(False,), remats=("dots",),
    )  # fmt: skip
    (remat,) = [c for c in result.candidates if c.phase == "phase1" and c.stage == "remat"]
    assert not remat.fits and remat.note.startswith(note)
    assert result.schedule[0].candidate.accum_steps == 2 and result.schedule[0].candidate.fits


def test_the_stages_prune_what_cannot_win_and_say_why(monkeypatch, base_config):
    """The full search on v5p-16 with a scripted cost model: windowed einsums are priced 5%
    dearer, float32 10%: the winner is FSDP in bfloat16 with them off. Pruned, each with its
    reason: windowed einsums on a mesh that gathers no weights, on the slower meshes, ZeRO 1
    without a data axis, ZeRO 1 whose whole possible saving cannot close the gap, remat without
    accumulation; in phase 2, data parallel (phase 1's 1.3x its best, over the margin)."""
    calls = []
    check = scripted_check(0.01, 1.0, calls, micro_ms=3.0, update_ms=6.0, data_ms=2, zero_ms=2)
    monkeypatch.setattr(compile_check, "check", check)
    result = plan.plan(base_config, topology.parse("v5p-16"), kinds=["dp", "fsdp", "dp_fsdp"])
    pruned = {(c.phase, c.stage, c.setting.label()): c.note for c in result.candidates if c.pruned}
    reasons = {
        ("phase1", "windowed einsum", "data parallel (8, 1, 1), bfloat16"):
            "no weights gathered",
        ("phase1", "windowed einsum", "data x fsdp (2, 4, 1), bfloat16, windowed einsums on"):
            "tried on the fastest weight-sharding mesh only",
        ("phase1", "ZeRO 1", "fsdp (1, 8, 1), bfloat16, windowed einsums off, ZeRO 1"):
            "data axis of 1",
        ("phase1", "ZeRO 1", "data parallel (8, 1, 1), bfloat16, ZeRO 1"): "cannot win: ",
        ("phase1", "remat", "fsdp (1, 8, 1), bfloat16, windowed einsums off, remat dots"):
            "remat only adds recomputation",
        ("phase2", "mesh", "data parallel (8, 1, 1), bfloat16"): "over the margin 1.25",
    }  # fmt: skip
    for key, words in reasons.items():
        assert words in pruned[key], (key, pruned.get(key))
    compiled = [c for c in result.candidates if not c.pruned]
    for s in result.schedule:
        timed = [c for c in compiled if c.phase == s.phase and c.timed]
        assert s.candidate == min(timed, key=lambda c: c.step_seconds)
        assert s.candidate.setting.label() == "fsdp (1, 8, 1), bfloat16, windowed einsums off"
        assert s.runner_up is not None and s.runner_up.step_seconds >= s.candidate.step_seconds
        assert "faster); peak HBM" in s.why and "ICI at least" in s.why
    # data x fsdp could save 6 ms x 1/2 of its update: within reach, so ZeRO 1 was compiled
    assert ("phase1", (2, 4, 1), 1) in calls
    zero = [c for c in compiled if c.shard_optimizer_state]
    assert [(c.phase, c.mesh) for c in zero] == [("phase1", (2, 4, 1)), ("phase2", (2, 4, 1))]
    assert all(c.timed for c in zero)
    assert [c.dtype for c in compiled if c.stage == "dtype"] == ["float32", "float32"]
    assert result.flags == result.schedule[0].flags
    assert "--config.mesh.shape=(1,8,1)" in result.flags


def test_a_setting_that_lowers_to_the_same_program_is_pruned(monkeypatch, base_config):
    """ZeRO 1 that changes nothing (the scripted program key ignores it): reported as pruned,
    naming the candidate whose program it is."""
    check = scripted_check(0.01, 1.0, [], update_ms=50.0, same_program=True)
    monkeypatch.setattr(compile_check, "check", check)
    result = plan.plan(
        base_config, topology.parse("v5p-16"), kinds=["dp"], dtypes=("bfloat16",), remats=()
    )
    (zero,) = [c for c in result.candidates if c.shard_optimizer_state and c.phase == "phase1"]
    assert zero.pruned and not zero.fits
    assert zero.note == "compiles to the same program as data parallel (8, 1, 1), bfloat16"


def test_nothing_fits_is_said_and_exit_4(monkeypatch, capsys):
    """A batch that fits at no accumulation factor up to --max-accum: each mesh says why, the
    schedule says nothing fits, and the command exits 4 as `--compile-only` does."""
    calls = []
    monkeypatch.setattr(compile_check, "check", scripted_check(1000.0, 1.0, calls))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-16", "--remat", ""]
    argv += ["--meshes", "dp", "--max-accum", "4"]
    assert cli.main(argv) == 4
    out = capsys.readouterr().out
    assert "no: does not fit up to 4 micro-batches" in out
    assert "phase1: 900,000 steps: nothing fits this slice" in out
    assert [accum for phase, _, accum in calls if phase == "phase1"] == [1, 2, 4]


def test_a_host_too_small_to_compile_is_not_a_slice_too_small(monkeypatch, capsys, tmp_path):
    """Every candidate stopped at this host's memory limit (never compiled): no verdict on the
    slice, so not exit 4 (which `launch tpu up --plan` would repeat) but one line naming the
    host's limit and its setting, exit 2; a plan file saying so is refused with the reason."""
    monkeypatch.setenv(host_memory.LIMIT_ENV, "0.5")

    def check(config, target=None, **kwargs):
        raise host_memory.HostMemoryError("compiling phase1 held 0.6 GiB")

    monkeypatch.setattr(compile_check, "check", check)
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-8", "--remat", ""]
    argv += ["--meshes", "dp", "--json"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()[-1:]
    assert "phase1: no verdict on this host: 1 candidate(s) could not be compiled here" in line
    assert "of 0.5 GiB" in line and host_memory.LIMIT_ENV in line
    found = json.loads(captured.out)
    assert found["schedule"][0]["candidate"] is None and found["schedule"][0]["undecided"] == 1
    path = tmp_path / "plan.json"
    path.write_text(captured.out)
    with pytest.raises(UserError, match="could not be compiled on the host that planned"):
        plan.flags_from_plan_json(str(path))


def test_a_fit_without_a_usable_time_says_so(monkeypatch, base_config):
    """XLA's cost model can price a step at zero or below (ops it cannot price count -1 s): the
    candidate fits but cannot be ranked, and says why."""
    monkeypatch.setattr(compile_check, "check", scripted_check(0.01, -1.0, []))
    result = plan.plan(base_config, topology.parse("v5p-16"), kinds=["dp"], **MESHES_ONLY)
    (first, *_) = result.candidates
    assert first.fits and not first.timed
    assert first.note == "fits, but XLA's cost model gave no positive step time"
    assert result.schedule[0].candidate is None and not result.flags


def test_json_output_and_the_shipped_price_file(monkeypatch, capsys):
    monkeypatch.setattr(compile_check, "check", scripted_check(0.01, 1.0, []))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5litepod-16", "--json"]
    argv += ["--dtypes", "bfloat16", "--windowed-einsum", "false", "--shard-optimizer-state=false"]
    assert cli.main([*argv, "--meshes", "dp,fsdp_tp", "--margin", "10"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accelerator_type"] == "v5litepod-16" and result["chips"] == 16
    meshes = {tuple(c["mesh"]) for c in result["candidates"] if not c["pruned"]}
    assert meshes == {(16, 1, 1), (1, 4, 4)}  # fsdp with a tensor axis of 4 (12 heads)
    # the collectives' least time on v5e's links (200 GB/s per chip and direction)
    timed = [c["link_seconds"] for c in result["candidates"] if not c["pruned"]]
    assert timed == [pytest.approx(6e-4)] * 4
    shipped = plan.load_prices(None)
    assert result["price_per_chip_hour"] == shipped["usd_per_chip_hour"]["v5e"]
    assert shipped["source"] and shipped["date"]
    assert result["cost"] == pytest.approx(
        result["total_seconds"] / 3600 * 16 * result["price_per_chip_hour"]
    )
    assert result["flags"] and all(s["flags"] for s in result["schedule"])


def test_bad_plan_arguments_are_one_line(capsys, tmp_path):
    base = ["plan", "--config", f"{BASE}:tiny"]
    faults.assert_user_error(faults.run_cli(capsys, base), "--topology is required")
    outcome = faults.run_cli(capsys, [*base, "--topology", "v5p-16", "--meshes", "ring"])
    faults.assert_user_error(outcome, "unknown mesh kind 'ring'")
    outcome = faults.run_cli(capsys, [*base, "--topology", "v5p-16", "--dtypes", "fp8"])
    faults.assert_user_error(outcome, "--dtypes: 'fp8'")
    outcome = faults.run_cli(capsys, [*base, "--topology", "v5p-16", "--margin", "0.5"])
    faults.assert_user_error(outcome, "--margin 0.5 must be >= 1")
    broken = tmp_path / "prices.json"
    broken.write_text("{not json")
    outcome = faults.run_cli(capsys, [*base, "--topology", "v5p-16", "--prices", str(broken)])
    faults.assert_user_error(outcome, str(broken), "not JSON")
    with pytest.raises(UserError, match="usd_per_chip_hour"):
        broken.write_text("{}")
        plan.load_prices(str(broken))
    with pytest.raises(UserError, match="not the output of `bert-jax plan --json`"):
        plan.flags_from_plan_json(str(broken))
    with pytest.raises(UserError, match="does not exist"):
        plan.flags_from_plan_json(str(tmp_path / "missing.json"))


def test_a_dry_run_says_the_search_and_compiles_nothing(monkeypatch, capsys, tmp_path):
    """`plan --dry-run`: the slice, the phases, each stage and the meshes stage 1 would compile,
    checked as the search checks them; no compile, nothing written."""

    def no_compile(*args, **kwargs):
        raise AssertionError("a dry run compiled")

    monkeypatch.setattr(compile_check, "check", no_compile)
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-8", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "BERT 12/768/12 on v5p-8 (v5p:2x2x1: 4 chips, 95 GiB HBM each)" in out
    assert "phase1 900000 steps at length 128, global batch 256" in out
    assert "dp (4, 1, 1), fsdp (1, 4, 1), dp_fsdp (2, 2, 1)" in out
    for stage in ("stage 2, windowed einsums on", "stage 3, ZeRO 1 on", "stage 4, dtypes float32"):
        assert stage in out
    assert "price: $4.20 per chip-hour" in out
    expected = plan.search_size(config_lib.pretraining_config("base"), topology.parse("v5p-8"))
    each, _ = plan.compile_seconds_estimate()
    total = step_log.format_duration(expected * each)
    assert (
        f"search time, an estimate: about {expected} candidate compiles x " in out
        and f" = about {total}; candidates in the compile cache " in out
    )
    assert os.listdir(tmp_path) == []
    outcome = faults.run_cli(capsys, [*argv, "--dtypes", "fp8"])  # checked as the search checks
    faults.assert_user_error(outcome, "--dtypes: 'fp8'")


def test_the_search_says_candidate_k_of_about_n_with_an_eta(monkeypatch, capsys, base_config):
    """As README shows it (a Base config on a slice), each compiled candidate is a line on
    stderr: `candidate k of about N`, the time so far and an ETA; N (search_size, also in the
    dry run) is not below what the search compiled."""
    monkeypatch.setattr(compile_check, "check", scripted_check(4.0, 1.0, [], micro_ms=10.0))
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-16"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    expected = plan.search_size(base_config, topology.parse("v5p-16"))
    numbered = [line for line in err if line.startswith("plan: candidate ")]
    assert numbered[0].startswith(f"plan: candidate 1 of about {expected}, phase1 mesh: ")
    assert all(" so far, ETA " in line for line in numbered)
    assert len(numbered) <= expected
    assert [line.split(" of ")[0] for line in numbered] == [
        f"plan: candidate {k}" for k in range(1, len(numbered) + 1)
    ]
    pruned = [line for line in err if line.startswith("plan: ") and line not in numbered]
    assert pruned and all("candidate" not in line.split(":")[1] for line in pruned)


def test_ctrl_c_during_the_search_is_one_line_saying_how_to_go_on(monkeypatch, capsys, base_config):
    """Ctrl-C while the third candidate compiles (the search runs the compile in a child that
    ignores it; the command is interrupted): one line on stderr saying what was done and how
    to go on, exit 130, no stack."""
    scripted, calls = scripted_check(4.0, 1.0, []), []

    def interrupted(config, target=None, **kwargs):
        calls.append(config.mesh.shape)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return scripted(config, target, **kwargs)

    monkeypatch.setattr(compile_check, "check", interrupted)
    monkeypatch.setenv(caches.CACHE_ENV, "/tmp/plan-cache")
    argv = ["plan", "--config", f"{BASE}:base", "--topology", "v5p-16"]
    assert cli.main(argv) == errors.EXIT_INTERRUPTED == 130
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    last = captured.err.splitlines()[-1]
    expected = plan.search_size(base_config, topology.parse("v5p-16"))
    # The first mesh took two compiles (1 and 2 micro-batches); the second was being compiled.
    assert last.startswith(f"plan: stopped after 1 of about {expected} candidates (2 compiled, ")
    assert last.endswith(
        "kept in the compile cache /tmp/plan-cache: run the same command again to go on; what "
        "was compiled is read back in seconds"
    )


# --- real compiles for two TPU topologies (libtpu, no chip) ----------------------------------

# (topology, what the search may vary): a handful of compiles of a one-layer model.
TOPOLOGIES = {
    "v5p-8": dict(kinds=("dp", "fsdp"), dtypes=("bfloat16",), remats=()),
    "v5litepod-4": dict(
        kinds=("dp", "fsdp"), dtypes=("bfloat16",), windowed=(False,), zero=(False,), remats=()
    ),
}


def _one_layer_config():
    config = config_lib.pretraining_config("tiny")
    with config.unlocked():
        config.total_steps = 100
        config.phase1.fraction, config.phase2.fraction = 1.0, 0.0
        config.phase1.batch_size, config.phase1.max_seq_length = 32, 64
        config.phase1.max_predictions_per_seq = 8
        config.model.num_hidden_layers, config.model.vocab_size = 1, 512
    return config


@pytest.fixture(scope="module")
def compiled_plans(tmp_path_factory):
    """Each topology planned twice with one compile cache: the first compiles, the second reads
    every figure back."""
    pytest.importorskip("libtpu")
    cache = tmp_path_factory.mktemp("compile_cache")
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(caches.CACHE_ENV, str(cache))
        compile_in_process(patch)
        for name, space in TOPOLOGIES.items():
            target = topology.parse(name)
            first = plan.plan(_one_layer_config(), target, **space)
            again = plan.plan(_one_layer_config(), target, **space)
            found[name] = (first, again)
    return found


@pytest.mark.tpu_compile
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_search_returns_the_fastest_it_compiled(compiled_plans, name):
    first, _ = compiled_plans[name]
    compiled = [c for c in first.candidates if c.timed]
    assert len(compiled) >= 2 and first.compiles >= len(compiled)
    (s,) = first.schedule
    assert s.candidate == min(compiled, key=lambda c: c.step_seconds)
    assert s.runner_up is not None and s.runner_up.step_seconds >= s.candidate.step_seconds
    assert s.flags == s.candidate.flags and first.flags == s.flags
    assert len({c.program for c in compiled}) == len(compiled)


@pytest.mark.tpu_compile
def test_pruned_candidates_are_reported_with_their_reason(compiled_plans, capsys):
    first, _ = compiled_plans["v5p-8"]
    pruned = {(c.stage, c.setting.label()): c.note for c in first.candidates if c.pruned}
    assert "no weights gathered" in pruned["windowed einsum", "data parallel (4, 1, 1), bfloat16"]
    fsdp_zero = "fsdp (1, 4, 1), bfloat16, windowed einsums off, ZeRO 1"
    assert "data axis of 1" in pruned["ZeRO 1", fsdp_zero]
    assert all(not c.fits and not c.compiles for c in first.candidates if c.pruned)
    text = plan.format_plan(first)
    assert "pruned (not compiled):" in text and f"{fsdp_zero}: data axis of 1" in text


@pytest.mark.tpu_compile
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_a_replan_reads_the_compile_cache(compiled_plans, name):
    first, again = compiled_plans[name]
    assert again.compiles == 0 and first.compiles > 0
    strip = lambda c: (c.setting, c.step_seconds, c.peak_bytes, c.program)  # noqa: E731
    assert [strip(c) for c in again.candidates] == [strip(c) for c in first.candidates]
    assert "candidate(s) read from the compile cache" in plan.format_plan(again)


@pytest.mark.tpu_compile
def test_flags_from_the_plan_json_round_trip(compiled_plans, tmp_path):
    """The flags read back from `plan --json` parse as config overrides and set the winner."""
    first, _ = compiled_plans["v5p-8"]
    path = tmp_path / "plan.json"
    path.write_text(first.to_json())
    flags = plan.flags_from_plan_json(str(path))
    assert flags == list(first.flags) == plan.flags_from_plan_json(str(path), "phase1")
    winner = first.schedule[0].candidate
    argv = ["--config", f"{BASE}:tiny", *flags, "--topology", "v5p-8"]
    config = config_flags.parse(plan_cli.COMMAND, argv).config
    assert tuple(config.mesh.shape) == winner.mesh
    assert config.model.dtype == winner.dtype and config.model.remat == winner.remat
    assert config.mesh.windowed_einsum == winner.windowed_einsum
    assert config.mesh.shard_optimizer_state == winner.shard_optimizer_state
    assert config.grad_accum_steps == winner.accum_steps
    with pytest.raises(UserError, match="no phase 'phase2'; it has phase1"):
        plan.flags_from_plan_json(str(path), "phase2")


def test_the_dry_runs_compile_time_is_this_hosts_cached_mean(monkeypatch, tmp_path):
    """The per-compile figure of the dry run's estimate: the mean of the compiles in this host's
    compile cache, else the documented typical one."""
    monkeypatch.setenv(caches.CACHE_ENV, str(tmp_path))
    assert plan.compile_seconds_estimate()[0] == plan.TYPICAL_COMPILE_SECONDS
    folder = tmp_path / "tpu_compiles"
    folder.mkdir()
    for name, entry in (("a", {"compile_seconds": 60.0}), ("b", {"compile_seconds": 120.0})):
        (folder / f"{name}.json").write_text(json.dumps(entry), encoding="utf-8")
    (folder / "c.json").write_text(json.dumps({"does_not_fit": "x"}), encoding="utf-8")
    assert plan.compile_seconds_estimate() == (90.0, f"the mean of the 2 compiles in {folder}")
