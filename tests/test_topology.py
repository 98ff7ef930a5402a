"""Compiling for Cloud TPU slices on this CPU host: names, devices, and the compiled step's
memory and cost-model figures (XLA's real TPU compiler, via libtpu; see compile_check.py). The
tests that compile are marked `tpu_compile`: `make test-tpu` runs them."""

from __future__ import annotations

import pytest

from bert_jax import cli
from bert_jax.planning import compile_check, cost_model
from bert_jax.runtime import topology
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib, flops
from tests import faults

REPO_CONFIG = "configs/bert.py:tiny"
# A tiny model whose step compiles in seconds for a TPU: a small vocabulary and batch.
SMALL = {
    "model.vocab_size": 512,
    "model.num_hidden_layers": 1,
    "phase1.batch_size": 16,
    "phase1.max_seq_length": 32,
    "phase1.max_predictions_per_seq": 5,
    "phase2.batch_size": 16,
    "phase2.max_seq_length": 128,
    "phase2.max_predictions_per_seq": 20,
}


def small_config(mesh=(4, 1, 1), **changes):
    config = config_lib.pretraining_config("tiny")
    for key, value in {**SMALL, **changes}.items():
        node = config
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    config.mesh.shape = mesh
    return config


@pytest.mark.parametrize(
    "name, topology_name, chips, accelerator_type",
    [
        ("v5p-8", "v5p:2x2x1", 4, "v5p-8"),  # v5p-N counts TensorCores: 2 per chip
        ("v5p-16", "v5p:2x2x2", 8, "v5p-16"),
        ("v5p-128", "v5p:4x4x4", 64, "v5p-128"),
        ("v4-32", "v4:2x2x4", 16, "v4-32"),
        ("v4-8", "v4:2x2x1", 4, "v4-8"),
        ("v5litepod-16", "v5e:4x4", 16, "v5litepod-16"),  # v5e and v6e count chips
        ("v5litepod-256", "v5e:16x16", 256, "v5litepod-256"),
        ("v6e-8", "v6e:2x4", 8, "v6e-8"),
        ("v6e-64", "v6e:8x8", 64, "v6e-64"),
        ("v5p:4x4x4", "v5p:4x4x4", 64, "v5p-128"),
        ("V5E:2x2", "v5e:2x2", 4, "v5litepod-4"),
    ],
)
def test_names_count_as_cloud_tpu_does(name, topology_name, chips, accelerator_type):
    target = topology.parse(name)
    assert (target.topology, target.chips, target.accelerator_type) == (
        topology_name,
        chips,
        accelerator_type,
    )


@pytest.mark.parametrize(
    "name, said",
    [
        ("v5p-6", "counts TensorCores (2 per chip); N=6 is not a standard slice"),
        ("v5litepod-12", "counts chips; N=12"),
        ("v7-8", "unknown TPU generation 'v7'"),
        ("v5p:2x2", "v5p topologies have 3 axes"),
        ("tpu", "expected a Cloud TPU accelerator type"),
    ],
)
def test_bad_names_are_one_line(name, said):
    with pytest.raises(UserError) as caught:
        topology.parse(name)
    assert said in str(caught.value) and name in str(caught.value)
    assert "\n" not in str(caught.value)


def test_slices_give_their_devices_hosts_and_known_peaks():
    """Compile-only devices for every host of a slice, one per chip (v4: megacore), whose
    device kind the MFU table knows (v5p calls itself "TPU v5")."""
    for name, chips, hosts in [("v4-8", 4, 1), ("v5p:4x4x4", 64, 16), ("v6e-16", 16, 4)]:
        target = topology.parse(name)
        devices = target.devices()
        assert len(devices) == chips and topology.hosts(devices) == hosts
        assert devices[0].device_kind == target.generation.device_kind
        assert flops.peak_flops_per_chip(devices[0].device_kind) == target.peak_flops


def test_a_mesh_that_does_not_fit_the_torus_is_one_line():
    config = small_config(mesh=(8, 8, 1))
    with pytest.raises(UserError) as caught:
        compile_check.check(config, target=topology.parse("v5p:4x4x4"))
    message = str(caught.value)
    assert "config.mesh.shape=(8, 8, 1) cannot be laid over v5p:4x4x4" in message
    assert "torus axes 4x4x4" in message and "\n" not in message


def test_unpriced_ops_and_collectives_are_read_from_the_hlo():
    hlo = "\n".join(
        [
            "HloModule m",
            "%fused (p: f32[8]) -> f32[8] {",
            "  %r = u32[4]{0} rng-bit-generator(%s), algorithm=rng_default",
            "}",
            "ENTRY %main (a: f32[1024,256]) -> f32[] {",
            '  %c = f32[8]{0} custom-call(%a), custom_call_target="ConcatBitcast"',
            "  %g = (u32[2]{0}, u32[2]{0}) rng-bit-generator(%k), algorithm=rng_bit_generator",
            "  %ar = (f32[1024,256]{1,0}, bf16[10]{0}) all-reduce(%a, %b), channel_id=3",
            "  %ag = bf16[64,128]{1,0:T(8,128)} all-gather(%x), channel_id=4, dimensions={0}",
            "  %ag2 = bf16[64,128]{1,0} all-gather(%y), channel_id=4, dimensions={0}",
            "  %rs = f32[16]{0} reduce-scatter(%z), channel_id=5, replica_groups=mesh['axis_0'=2,"
            "'axis_1'=4] {'axis_0','axis_1'}, dimensions={0}",
            "  %cp = (f32[32]{0}, f32[32]{0}, u32[], u32[]) collective-permute-start(%w), "
            "channel_id=6",
            "  %cpd = f32[32]{0} collective-permute-done(%cp)",
            "}",
        ]
    )
    assert cost_model.count_unpriced_ops(hlo) == 2  # the entry computation's only
    assert cost_model.collective_bytes(hlo) == {
        "all-reduce": 1024 * 256 * 4 + 10 * 2,
        "all-gather": 64 * 128 * 2,  # one collective, cloned
        "reduce-scatter": 16 * 4 * 8,  # its input: the result times the group
        "collective-permute": 32 * 4,
    }
    # On the links (ring algorithms): the reduce-scatter's group is spelled out (8 devices),
    # the permute sends its buffer; the others' groups are the module's partitions.
    assert cost_model.link_bytes(hlo) == 7 / 8 * 16 * 4 * 8 + 32 * 4  # 1 partition
    four = hlo.replace("HloModule m", "HloModule m, num_partitions=4")
    assert cost_model.link_bytes(four) == pytest.approx(
        2 * 3 / 4 * (1024 * 256 * 4 + 10 * 2) + 3 / 4 * 64 * 128 * 2 + 7 / 8 * 16 * 4 * 8 + 32 * 4
    )


def test_loop_bodies_count_as_often_as_they_run():
    """XLA prices a while body once: the correction counts it trip-count times (nested loops
    multiply) by the compiler's cycle estimates, and its unpriced ops once, as XLA prices them;
    a cond's branches and fused computations are left to XLA's own pricing."""

    def op(cycles, text="fusion(%a)"):
        return f'  %x = f32[8]{{0}} {text}, backend_config={{"estimated_cycles":"{cycles}"}}'

    hlo = "\n".join(
        [
            "HloModule m",
            "%fused (p: f32[8]) -> f32[8] {",
            '  %r = u32[4]{0} custom-call(%s), custom_call_target="ConcatBitcast"',
            "}",
            "%cond_in (p: (u32[])) -> pred[] {",
            "  %c = u32[] constant(4)",
            "}",
            "%body_in (p: (u32[])) -> (u32[]) {",
            op(10),
            "  %cp = (f32[8]{0}, f32[8]{0}) collective-permute-start(%a), channel_id=9",
            '  %u = u32[4]{0} custom-call(%s), custom_call_target="ConcatBitcast"',
            "}",
            "%cond_out (p: (u32[])) -> pred[] {",
            "  %c = u32[] constant(1)",
            "  %d = u32[] constant(2)",
            "}",
            "%body_out (p: (u32[])) -> (u32[]) {",
            op(20),
            "  %w = (u32[]) while(%p), condition=%cond_in, body=%body_in, metadata={}",
            "}",
            "%branch (p: f32[8]) -> f32[8] {",
            "  %g = (u32[2]{0}, u32[2]{0}) rng-bit-generator(%k), algorithm=rng_bit_generator",
            "}",
            "ENTRY %main (a: f32[8]) -> f32[8] {",
            op(100),
            "  %w = (u32[]) while(%t), condition=%cond_out, body=%body_out",
            "  %k = f32[8]{0} conditional(%q, %a, %a), branch_computations={%branch, %fused}",
            "}",
        ]
    )
    # once: 100 + 20 + 10; as run: 100 + 2 x (20 + 4 x 10).
    assert cost_model.loop_factor(hlo) == pytest.approx(220 / 130)
    assert cost_model.count_unpriced_ops(hlo) == 1  # the inner body's; not a branch's or fusion's
    assert cost_model.link_bytes(hlo) == 2 * 4 * 8 * 4  # a permute in the inner body, 8 runs
    assert cost_model.loop_factor(hlo.replace("while(", "call(")) == 1.0
    assert cost_model.loop_factor("ENTRY %main () -> f32[] {\n}") == 1.0


@pytest.mark.tpu_compile
def test_compile_for_a_tpu_reports_memory_cost_and_collectives():
    """v5e: the cost model's step grows with sequence length, its time lies above the FLOP
    bound, XLA's FLOPs agree with DESIGN.md's formula, and the report says what it estimates."""
    config = small_config()
    model = config_lib.bert_config(config)
    report = compile_check.check(config, target=topology.parse("v5e:2x2"))
    first, second = report.phases
    assert report.fits and report.num_devices == 4 and report.device_kind == "TPU v5 lite"
    for phase in report.phases:
        estimate = report.estimates(phase)
        bound = phase.cost.flops / report.peak_flops
        assert phase.step_seconds > bound > 0
        assert 0 < estimate["mfu"] < 1
        assert phase.cost.collective_bytes["all-reduce"] > 0  # data parallel: gradients
        # which a ring all-reduce over 4 chips sends 2 x 3/4 of over the links (float32), at
        # v5e's 200 GB/s per chip and direction; the cost model's step leaves this time out.
        # XLA reduces only the position rows the phase uses (the rest are known zeros).
        unused = (model.max_position_embeddings - phase.max_seq_length) * model.hidden_size
        gradients = 4 * (config_lib.count_parameters(model) - unused)
        assert 1.5 * gradients <= phase.cost.link_bytes <= 1.5 * gradients * 1.01
        assert estimate["link_seconds"] == pytest.approx(phase.cost.link_bytes / 200e9)
        # XLA counts every op of the step per device: besides the matmuls the formula counts
        # (with the sparse last layer at the masked positions and [CLS]), the optimizer, the
        # dropout masks' hashing, LayerNorm, softmax, the loss: up to 29% at this size (one
        # layer, hidden 128; the share shrinks as the model grows).
        last_layer = (phase.max_predictions_per_seq + 1) / phase.max_seq_length
        formula = phase.tokens_per_step * flops.flops_per_token(
            model,
            phase.max_seq_length,
            phase.max_predictions_per_seq / phase.max_seq_length,
            last_layer,
        )
        xla_total = phase.step_flops * report.num_devices
        assert formula <= xla_total <= 1.35 * formula, xla_total / formula
    assert second.step_seconds > first.step_seconds
    text = compile_check.format_report(report)
    assert text.startswith("compile check: v5litepod-4 (topology v5e:2x2: 4 chips, 16 GiB HBM")
    assert "phase2: global batch 16 x seq 128 (20 predictions): arguments" in text
    assert "XLA cost-model estimate (not a measurement): step" in text
    assert "collectives per chip per step: all-reduce" in text
    assert "on the inter-chip links at least" in text and "at 200 GB/s per chip" in text
    assert "verdict: fits" in text and "device memory v5e HBM" in text


def test_topology_needs_compile_only(capsys):
    argv = ["pretrain", "--config", REPO_CONFIG, "--topology", "v5e:2x2"]
    faults.assert_user_error(faults.run_cli(capsys, argv), "--topology", "--compile-only")
    argv += ["--compile-only", "--topology", "v9-8"]
    faults.assert_user_error(faults.run_cli(capsys, argv), "v9-8")


@pytest.mark.tpu_compile
def test_fsdp_shards_arguments_and_memory_follows_the_micro_batch():
    """v4 (megacore), global batch 256 over 4 chips: FSDP holds about a quarter of the
    data-parallel arguments; 4 accumulation steps (16 sequences per chip at a time instead of
    64) take less memory, and the estimate counts the loop's body 4 times (XLA prices it once:
    `cost_model.loop_factor`)."""
    one_phase = {"phase1.fraction": 1.0, "phase2.fraction": 0.0, "phase1.batch_size": 256}
    target = topology.parse("v4:2x2x1")
    whole = compile_check.check(small_config(**one_phase), target).phases[0]
    fsdp = compile_check.check(small_config(mesh=(1, 4, 1), **one_phase), target).phases[0]
    micro = compile_check.check(small_config(grad_accum_steps=4, **one_phase), target).phases[0]
    assert 3.0 < whole.memory.argument / fsdp.memory.argument <= 4.0
    assert micro.peak_bytes < whole.peak_bytes
    assert whole.cost.loop_factor == 1.0 and micro.cost.loop_factor > 2.0
    assert 0.8 < micro.step_flops / whole.step_flops < 1.2
    assert 0.5 < micro.step_seconds / whole.step_seconds < 2.0
    # XLA:TPU splits one of FSDP's gathered matmuls into a windowed loop of permutes; with
    # `mesh.windowed_einsum=False` the step compiles without them (partitioning.compiler_options)
    assert fsdp.cost.collective_bytes.get("collective-permute", 0) > 0
    plain = small_config(mesh=(1, 4, 1), **one_phase)
    plain.mesh.windowed_einsum = False
    unwindowed = compile_check.check(plain, target).phases[0]
    assert "collective-permute" not in unwindowed.cost.collective_bytes
    assert unwindowed.memory.argument == fsdp.memory.argument


@pytest.mark.tpu_compile
def test_the_cost_model_prices_a_collective_as_memory_not_link_time():
    """A 64 MiB float32 all-reduce over 4 v5e chips: XLA's cost model prices it near the HBM
    traffic of reading and writing it, not the time a ring needs on the links (2 x 3/4 of it
    at 200 GB/s per chip and direction): `cost_model.link_bytes` is what it leaves out."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    target = topology.parse("v5e:2x2")
    mesh = Mesh(np.array(target.devices()), ("data",))
    rows = jax.ShapeDtypeStruct(
        (4, 2**24), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("data"))
    )
    summed = jax.jit(lambda x: x.sum(0), out_shardings=NamedSharding(mesh, PartitionSpec()))
    cost = cost_model.read_cost(summed.lower(rows).compile())
    assert cost.collective_bytes == {"all-reduce": 2**26}
    assert cost.link_bytes == 2 * 3 / 4 * 2**26
    link_seconds = cost.link_bytes / target.ici_bytes_per_second
    assert 0 < cost.seconds < link_seconds / 2, (cost.seconds, link_seconds)


@pytest.mark.tpu_compile
def test_sharded_optimizer_state_compiles_for_a_tpu():
    """ZeRO stage 1 on 4 v5e chips: the Adam slots hold a quarter of their data-parallel bytes
    per chip, the parameters stay whole, and the update compiled alone takes the gradients in
    the slots' layout, as the step applies them."""
    one_phase = {"phase1.fraction": 1.0, "phase2.fraction": 0.0}
    target = topology.parse("v5e:2x2")
    whole = compile_check.check(small_config(**one_phase), target).phases[0]
    config = small_config(**one_phase)
    config.mesh.shard_optimizer_state = True
    zero = compile_check.check(config, target).phases[0]
    params = 4 * config_lib.count_parameters(config_lib.bert_config(config))
    # arguments: parameters + 2 Adam slots (+ the batch); ZeRO 1 splits the slots of every
    # parameter with an `embed` axis (kernels, tables, LayerNorms; not the biases of the wider
    # layers), so each chip saves up to 3/4 of 2 x the parameters' bytes
    saved = whole.memory.argument - zero.memory.argument
    assert 1.3 * params < saved <= 1.5 * params, saved / params
    assert zero.step_seconds and zero.update is not None and zero.update.seconds > 0


@pytest.mark.tpu_compile
def test_a_model_that_cannot_fit_is_exit_4_naming_the_phase(capsys):
    """XLA's TPU compiler rematerializes activations to fit a large batch (the tiny model at
    batch 65536 x 128 fits a v5e chip that way), so the refusal is tested with parameters and
    Adam slots no chip holds."""
    argv = ["pretrain", "--config", REPO_CONFIG, "--compile-only", "--topology", "v5e:2x2"]
    argv += [f"--config.{k}={v}" for k, v in SMALL.items()]
    argv += ["--config.model.vocab_size=16000000", "--config.mesh.shape=(4,1,1)"]
    argv += ["--config.phase1.fraction=1.0", "--config.phase2.fraction=0.0"]
    capsys.readouterr()
    assert cli.main(argv) == 4
    out = capsys.readouterr().out
    assert "compile check: DOES NOT FIT on v5litepod-4" in out
    assert "config.phase1 (global batch 16, seq 32) does not fit" in out
    assert "exceeds available HBM" in out


def test_the_cost_models_cycles_are_summed_by_where_they_are_spent():
    fwd = "jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0"
    bwd = "jit(train_step)/transpose(jvp(BertForPreTraining))/bert/encoder/layer_1"

    def op(name, cycles, opcode="fusion"):
        return (
            f'  %x = f32[8]{{0}} {opcode}(%a), kind=kLoop, metadata={{op_name="{name}"}}, '
            f'backend_config={{"window_config":{{"estimated_cycles":"{cycles}"}}}}'
        )

    hlo = "\n".join(
        [
            op(f"{fwd}/attention/Dropout_0/xor", 10),
            op(f"{fwd}/attention/bqhd,bkhd->bhqk/dot_general", 20),
            op(f"{bwd}/attention/bqhd,bkhd->bhqk/dot_general", 40),
            op(f"{bwd}/intermediate/dense/dot_general", 30),
            op(f"{fwd}/output_LayerNorm/add", 5),
            op("jit(train_step)/cond/branch_1_fun/add", 7),
            op("jit(train_step)/reduce_sum", 3),
            op("", 2, opcode="all-reduce"),
            "  %y = f32[8]{0} add(%a, %b)",  # no estimate: not counted
        ]
    )
    assert cost_model.cycles_by_category(hlo) == {
        "dropout masks": {"forward": 10, "backward": 0, "other": 0},
        "attention matmuls": {"forward": 20, "backward": 40, "other": 0},
        "dense matmuls": {"forward": 0, "backward": 30, "other": 0},
        "layer norm": {"forward": 5, "backward": 0, "other": 0},
        "optimizer update": {"forward": 0, "backward": 0, "other": 7},
        "gradient norm, metrics": {"forward": 0, "backward": 0, "other": 3},
        "collectives": {"forward": 0, "backward": 0, "other": 2},
    }


@pytest.mark.tpu_compile
def test_modernbert_compiles_for_a_tpu_with_its_banded_phase(capsys):
    """`pretrain --compile-only` on ModernBERT's tiny recipe: phase 1 (128 tokens, window 64)
    attends through the masked full matrix, phase 2 (256 tokens, 4 windows) in bands; both
    compile for 4 v5e chips and fit."""
    argv = ["pretrain", "--config", "modernbert:tiny", "--compile-only", "--topology", "v5e:2x2"]
    argv += ["--config.mesh.shape=(4,1,1)", "--config.model.vocab_size=512"]
    argv += ["--config.phase1.batch_size=16", "--config.phase2.batch_size=16"]
    capsys.readouterr()
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "compile check: v5litepod-4 (topology v5e:2x2: 4 chips" in out
    assert "phase1: global batch 16 x seq 128" in out
    assert "phase2: global batch 16 x seq 256" in out
    assert "verdict: fits" in out
