"""Test setup: 8 emulated CPU devices (set before JAX is imported) and strict rank promotion."""

import gc
import os
import sys

import pytest

from bert_jax.cli import (  # imports nothing of JAX (test_cli.py)
    collect_garbage_less_often,
    quiet_tensorflow,
)
from tests.xla_flags import with_devices  # noqa: E402 (imports nothing of JAX)

# As in `bert-jax` processes, from the first import on: collecting the tests imports JAX,
# TensorFlow, torch and transformers.
collect_garbage_less_often()

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + with_devices(8)).strip()
quiet_tensorflow()  # as in bert-jax processes: TensorFlow alike in every test, whatever the order
# What bert-jax caches (the embedded corpus), shared by the test processes and their children,
# outside the user's ~/.cache.
os.environ.setdefault(
    "BERT_JAX_CACHE_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "bert_jax_test_cache")
)
# The tests run on CPU devices, children too (libtpu, installed for the TPU compile tests, would
# otherwise probe for TPU chips in every process).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# TensorFlow (tf.data) imports Keras 3 eagerly, 1.5 s of every process that reads records; no
# test uses Keras, and with this setting (tf_keras is not installed) TensorFlow skips it.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

# No persistent compilation cache unless one is asked for (JAX_COMPILATION_CACHE_DIR set): on a
# fresh machine, as in CI, `make test` took 321 s with the cache JAX fills as it goes and 283 s
# without (598 against 533 CPU-s on 2 cores, idle): every compile pays for its cache key and the
# larger ones for a write, and few programs are compiled twice by different processes. A
# developer rerunning the suite may keep one (docs/development.md; on this tree 312 s for the run
# that fills it, 226 s for the runs after it). Set empty rather than left unset, so that the
# `bert-jax` processes the tests start (which keep a cache by default) compile afresh too.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_platforms", "cpu")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """PyTorch (transformers' reference models) on one thread in every test process: `make test`
    runs a worker per core, and a second PyTorch thread only waits for a core by spinning (a tiny
    model's forward cost several times its one-thread CPU time on the loaded 2-core machine)."""
    if "torch" not in sys.modules:  # collecting imports it; a run that needs none imports none
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_finish(session):
    """Python's cyclic garbage collector, at its defaults, walks every object the imports made
    (JAX, TensorFlow, torch, transformers: about 460,000 in each worker) each time it collects
    the oldest generation, and JAX's tracing allocates enough to set that off thousands of times.
    The objects alive after collection are frozen out of its walks, and it runs after 10,000 new
    objects instead of 700 (set when this file is imported): 44.8 s of the suite's CPU time in
    collections -> 15.4 s."""
    gc.freeze()


# The end-to-end tests that `make test` leaves to `make test-slow` (.ci/run runs both), each with
# why it is slow: each runs a whole command or training to a result, tens of seconds of CPU time
# on 2 cores, where the faster tests of the same module check the parts it puts together; or
# compiles further cases of a program (more meshes, settings, kernel shapes) whose main cases
# `make test` keeps, seconds each where `make test` has about 4 minutes for ~1,500 tests. Keyed by
# node id without parameters (every parameter moves) or with them (that case alone moves); they
# carry the mark `slow_e2e`, which pyproject.toml's addopts deselects. tests/test_ci_targets.py
# checks that each key names a test (not a case's parameters: a renamed case would run in
# `make test` again).
SLOW_END_TO_END = {
    # Several processes, each importing JAX and compiling its own steps.
    "tests/test_caches.py::test_a_command_run_again_reads_its_compiled_programs_back":
        "two `bert-jax fill-mask` processes, the second reading the first's compiled programs",
    "tests/test_step_buffers.py::test_a_program_run_inline_reuses_its_temporaries_and_one_run_on_jax_s_thread_does_not":
        "two processes, each starting JAX's CPU runtime its own way (inline, on its thread)",
    "tests/test_distributed.py::test_two_processes_compute_what_one_process_computes":
        "two 4-device processes and a one-process run of the same pretraining, then a resume",
    "tests/test_distributed.py::test_a_process_that_dies_stops_the_other":
        "two pretraining processes; waits out the heartbeat bound after one is killed",
    "tests/test_distributed.py::test_hosts_with_different_configs_stop_with_a_clear_error":
        "two `bert-jax pretrain` processes started to the config check",
    "tests/test_distributed.py::test_compile_only_prints_the_memory_per_device_without_initializing":
        "compiles the full train step for the 8-device mesh",
    "tests/test_faults_checkpoints.py::test_disk_full_run_prints_only_its_line_and_resumes_exactly":
        "a pretraining process that fills its disk, then a second that resumes it",
    "tests/test_pretrain.py::test_sigkill_after_checkpoint_then_resume_from_is_exact":
        "a pretraining process killed after a checkpoint, then a resumed run to the end",
    "tests/test_host_memory.py::test_a_child_past_the_limit_is_stopped_and_named":
        "a child process that imports JAX, then grows until the watcher stops it",
    "tests/test_metric_writers.py::test_tensorboard_is_written_without_importing_torch":
        "a Python process that imports bert-jax and tensorboardX with PyTorch hidden",
    "tests/test_bench.py::test_bench_and_the_train_step_import_without_tensorflow":
        "a Python process that imports bert-jax's bench and train step with TensorFlow barred",
    "tests/test_cli_flags.py::test_no_tensorflow_banner_on_stderr":
        "two bert-jax processes, each importing TensorFlow",
    "tests/test_cli.py::test_console_script_exit_statuses":
        "two processes importing the library, a command of the installed entry point among them",
    "tests/test_fill_mask.py::test_the_python_api_prints_nothing_of_libtpu_without_a_chip":
        "a Python process importing JAX and the library to fill masks and encode",
    # A whole recipe, sweep or fine-tuning run to a score.
    "tests/test_readme_recipe.py::test_the_recipe_runs_as_written_at_tiny_scale":
        "docs/reproduce.md's every step: tokenizer, data, pretraining, GLUE",
    "tests/test_squad.py::test_minilm_learns_synthetic_squad_end_to_end":
        "fine-tunes the real 6-layer all-MiniLM-L6-v2 on SQuAD until it answers",
    "tests/test_feature_ner.py::test_bilstm_tagger_learns_synthetic_conll_through_the_command":
        "a 4-layer encoder's features and a BiLSTM tagger trained on CoNLL until it learns",
    "tests/test_squad.py::test_v2_run_writes_the_official_files_with_a_tiny_encoder":
        "a SQuAD v2 fine-tuning run through the command, predictions and official files",
    "tests/test_finetune_sweep.py::test_sweep_runs_every_task_writes_reports_and_resumes":
        "a GLUE sweep over every task, interrupted and resumed",
    "tests/test_finetune_loop.py::test_finetuning_learns_is_deterministic_and_pads_evaluation":
        "64 fine-tuning steps to 90% accuracy, twice",
    "tests/test_finetune_settings.py::test_a_glue_run_records_the_settings_that_ran":
        "`bert-jax glue` with two learning rates",
    "tests/test_finetune_baseline.py::test_a_degenerate_model_is_flagged_in_every_report":
        "`bert-jax glue` over RTE and STS-B and every report",
    "tests/test_modernbert_finetune.py::test_a_glue_task_fine_tunes_from_a_modernbert_model":
        "a converted ModernBERT model fine-tuned through the command, twice",
    "tests/test_modernbert_token_tasks.py::test_squad_fine_tunes_from_a_modernbert_model":
        "SQuAD fine-tuning from a converted ModernBERT model through the command",
    "tests/test_modernbert_token_tasks.py::test_conll_fine_tunes_from_a_modernbert_model":
        "CoNLL-2003 fine-tuning from a converted ModernBERT model through the command",
    "tests/test_swag.py::test_tiny_encoder_learns_synthetic_swag_resumes_and_refuses_bad_rows":
        "SWAG fine-tuning until it learns, then a resume",
    "tests/test_ner.py::test_tiny_encoder_learns_synthetic_conll_end_to_end":
        "four epochs of CoNLL-2003 fine-tuning to F1 90, predictions scored again, a plot",
    "tests/test_modernbert_finetune.py::test_the_glue_sweep_runs_a_modernbert_model":
        "`bert-jax glue` over a converted ModernBERT model",
    "tests/test_objectives_cli.py::test_each_objective_pretrains_evaluates_and_exports_to_its_class":
        "per objective: pretraining, evaluation, export and transformers' class on it",
    "tests/test_side_by_side_benchmark.py::test_a_run_without_optional_flags_writes_its_summary_with_the_defaults":
        "the side-by-side benchmark's whole fine-tuning run",
    "tests/test_finetune_sweep.py::test_finetune_command_runs_one_setting":
        "`bert-jax finetune` on RTE through the command, its result and prediction files",
    "tests/test_finetune_registry.py::test_a_pair_task_in_one_module_runs_and_is_reported":
        "a registered task fine-tuned alone, then swept, to its reports",
    "tests/test_modernbert_finetune.py::test_swag_fine_tunes_from_a_modernbert_model":
        "a SWAG fine-tuning run from a converted ModernBERT model",
    # Pretraining runs to their end, several per test: make test keeps the parts they put
    # together (the train step, the checkpointer, the data position, the config checks).
    "tests/test_modernbert_pretrain.py::test_the_run_trains_modernbert_on_the_trapezoid":
        "reads the ModernBERT reference run (tests/conftest.py's modernbert_reference), a whole "
        "pretraining run its other readers share (test_modernbert keeps its steps in make test)",
    "tests/test_modernbert_pretrain.py::test_the_export_is_a_transformers_modernbert_computing_the_same":
        "reads the ModernBERT reference run, then exports it to transformers",
    "tests/test_modernbert_loose_ends.py::test_the_workdirs_checkpoint_keeps_the_runs_special_ids":
        "reads the ModernBERT reference run's checkpoint",
    "tests/test_pretrain.py::test_phase_switch_at_ninety_percent_with_the_schedule":
        "the 12-step two-phase reference run (the module's other runs compare with it)",
    "tests/test_pretrain.py::test_sigterm_then_resume_is_exact":
        "a pretraining run stopped by SIGTERM at step 6, resumed to the end",
    "tests/test_pretrain.py::test_workdir_is_a_model_for_later_commands":
        "encode, convert and fine-tuning on the reference run's workdir",
    "tests/test_pretrain.py::test_init_from_a_model_directory":
        "a second pretraining run that starts from the reference run's model",
    "tests/test_pretrain.py::test_the_run_draws_its_curves":
        "reads the reference run's plot (the run is its cost)",
    "tests/test_pretrain.py::test_a_finished_run_is_not_resumed_on_another_schedule":
        "a copy of the reference run refused, then resumed on its own schedule",
    "tests/test_pretrain.py::test_injected_nan_is_skipped_and_counted":
        "a pretraining run with a non-finite batch injected",
    "tests/test_pretrain.py::test_too_many_non_finite_steps_stop_with_the_checkpoint_intact":
        "a pretraining run stopped by non-finite steps",
    "tests/test_faults_checkpoints.py::test_truncated_latest_checkpoint_resumes_from_the_one_before_exactly":
        "a run resumed past a truncated checkpoint, preempted and resumed again to the end",
    "tests/test_modernbert_pretrain.py::test_sigterm_then_resume_is_exact":
        "a ModernBERT pretraining run stopped by SIGTERM, resumed to the end",
    "tests/test_pretrain_eval.py::test_a_run_on_records_evaluates_on_their_held_out_records_as_said":
        "a pretraining run evaluating its held-out records twice",
    "tests/test_pretrain_eval.py::test_a_run_on_a_corpus_evaluates_on_what_its_preparation_held_out":
        "prepares the embedded corpus, then a pretraining run evaluating what it held out",
    "tests/test_pretrain_eval.py::test_a_run_on_records_without_held_out_records_evaluates_nothing_and_draws_no_eval":
        "a pretraining run on records without held-out records",
    "tests/test_heldout_nsp_baseline.py::test_pretraining_says_them_in_its_eval_line_metrics_plot_and_final_line":
        "a pretraining run with evaluations, its metrics and plot",
    "tests/test_packing.py::test_pretraining_phase_with_packing_runs":
        "a pretraining run with packed batches (test_packing's other tests keep the packed "
        "losses and gradients equal to the unpacked ones)",
    "tests/test_faults_checkpoints.py::test_damaged_latest_checkpoint_is_set_aside":
        "per damaged file, a pretraining run resumed past the damaged checkpoint",
    "tests/test_faults_checkpoints.py::test_disk_full_during_a_save_is_one_line_and_keeps_the_last_checkpoint":
        "a pretraining run resumed at step 4 and trained to the save that fails",
    "tests/test_modernbert_loose_ends.py::test_init_from_a_modernbert_model":
        "a ModernBERT pretraining run started from the reference run's model",
    "tests/test_data_pipeline.py::test_restoring_the_position_in_a_new_process_continues_exactly":
        "a second Python process importing TensorFlow to continue both pipelines",
    # Fine-tuning commands to their end (make test keeps each task's steps against transformers).
    "tests/test_predict.py::test_each_head_kind_predicts_as_its_run_did":
        "five fine-tuning runs, one per head kind, each then predicted through the command",
    "tests/test_finetune_curve.py::test_each_checkpoint_curve_runs_resumes_and_plots":
        "a fine-tuning run per pretraining checkpoint, resumed, and the plot",
    "tests/test_finetuned_model_dir.py::test_the_sweep_keeps_the_selected_trials_model_only":
        "`bert-jax glue` with two learning rates",
    "tests/test_finetune_baseline.py::test_the_finetune_summary_shows_the_baseline_and_the_warning":
        "a fine-tuning run through the command",
    "tests/test_docs_commands.py::test_a_documented_command_runs":
        "every command the README and docs show, run as written at small sizes (pretraining, "
        "fine-tuning, the GLUE sweep among them)",
    # Benchmarks and references at full size.
    "tests/test_bench_torch.py::test_hf_torch_eager_trains_beside_ours_from_the_same_weights":
        "PyTorch's BertForPreTraining trained beside ours by the benchmark",
    "tests/test_bench.py::test_bench_times_packed_real_instances_on_the_sharded_step":
        "the benchmark preparing real instances and timing windows of the sharded step",
    "tests/test_modernbert_bench.py::test_modernbert_for_masked_lm_trains_beside_ours_from_the_same_weights":
        "transformers' ModernBertForMaskedLM trained beside ours by the benchmark",
    "tests/test_fill_mask.py::test_candidates_match_transformers_fill_mask_pipeline":
        "transformers' fill-mask pipeline on the real all-MiniLM-L6-v2, per tokenizer",
    # The whole model's train step compiled for the 8-device mesh, or run in Pallas's interpreter
    # (test_partitioning keeps BERT's sharded steps in make test, test_attention the kernels).
    "tests/test_local_attention.py::test_sharded_training_step_with_banded_layers":
        "the banded model's sharded train step compiled for the 8-device mesh",
    "tests/test_modernbert.py::test_sharded_training_step_on_the_mesh":
        "ModernBERT's sharded train step compiled for the 8-device mesh, two steps",
    "tests/test_attention.py::test_model_pallas_equals_xla_with_dropout":
        "the whole encoder's forward and gradients in Pallas's interpreter",
    # Further cases of a compiled program whose main cases make test keeps, a few seconds of
    # compiling each.
    "tests/test_attention.py::test_kernel_equals_einsum_path[24-24-16-16-0.0]":
        "the kernels' forward and backward in Pallas's interpreter without dropout on the block "
        "shape (make test keeps it with dropout, and the gathered shape without)",
    "tests/test_attention.py::test_kernel_equals_einsum_path[7-40-16-32-0.1]":
        "the same with dropout on the gathered shape",
    "tests/test_partitioning.py::test_sharded_training_matches_one_device[8x1x1]":
        "BERT's train step compiled for the data-only 8-device mesh (make test keeps (2, 2, 2) "
        "and (1, 2, 4))",
    "tests/test_partitioning.py::test_sharded_training_matches_one_device[2x4x1]":
        "the same for the 4-way FSDP mesh",
    "tests/test_partitioning.py::test_sharded_optimizer_state_matches_one_device":
        "BERT's train step with ZeRO's optimizer-state shardings compiled for the (4, 2, 1) mesh",
    "tests/test_model.py::test_outputs_without_jit_equal_the_compiled_ones":
        "the model's forward op by op, each operation compiled alone (make test keeps the "
        "compiled forward, float32 and bfloat16)",
    "tests/test_model.py::test_layers_share_one_trace_and_draw_each_layers_own_masks[full]":
        "the shared layers' step compiled twice more under jax.checkpoint (make test checks them "
        "without remat)",
    "tests/test_model.py::test_remat_gives_the_same_losses_and_gradients[dots]":
        "the gradients' program compiled for a second remat policy (make test keeps full remat "
        "against the plain model)",
    "tests/test_encode.py::test_minilm_features_of_inner_layers_match_transformers":
        "the real all-MiniLM-L6-v2 compiled through `bert-jax encode` for two inner layers "
        "(make test keeps each pooling at the last layer, and two layers through the Python API)",
    "tests/test_partitioning.py::test_prng_dropout_masks_are_the_same_on_any_mesh":
        "BERT's train step with jax.random's dropout masks compiled for one device and for the "
        "(2, 2, 2) mesh (make test keeps the default hash masks on its meshes)",
    "tests/test_finetune_packing.py::test_bucketed_and_packed_steps_equal_the_fixed_length_steps[regression-modernbert]":
        "ModernBERT's regression head bucketed and packed against its fixed-length run (make "
        "test keeps every head on BERT, and ModernBERT's sentence head)",
    "tests/test_finetune_packing.py::test_bucketed_and_packed_steps_equal_the_fixed_length_steps[choice-modernbert]":
        "ModernBERT's multiple-choice head, as above",
    "tests/test_finetune_packing.py::test_bucketed_and_packed_steps_equal_the_fixed_length_steps[tags-modernbert]":
        "ModernBERT's tagging head, as above",
    "tests/test_finetune_packing.py::test_bucketed_and_packed_steps_equal_the_fixed_length_steps[span-modernbert]":
        "ModernBERT's span head, as above",
    "tests/test_train.py::test_lamb_trains":
        "LAMB's train step compiled and trained 20 steps until the loss falls (make test trains "
        "the default AdamW until it overfits)",
}  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by mark
def pytest_collection_modifyitems(config, items):
    """Marks the tests of SLOW_END_TO_END `slow_e2e`. Modules with a test marked `slow` (tens of
    seconds each) run first: `make test`'s work stealing (pytest-xdist) balances what is left over
    the workers, but a long test that starts last has no one to share it. Whole modules move, so
    that their module fixtures are set up once; the order is otherwise kept."""
    for item in items:
        key = next(
            (k for k in (item.nodeid, item.nodeid.split("[", 1)[0]) if k in SLOW_END_TO_END), None
        )
        if key is not None:
            item.add_marker(pytest.mark.slow_e2e(SLOW_END_TO_END[key]))
    slow = {item.module for item in items if item.get_closest_marker("slow") is not None}
    items[:] = [i for i in items if i.module in slow] + [i for i in items if i.module not in slow]


@pytest.fixture(scope="session")
def shared_dirs(tmp_path_factory):
    """One 1000-piece tokenizer and one prepared-data cache for the pretraining runs of every
    module (test_pretrain's small_config reads them), made once per test process: each module
    that trained its own tokenizer also prepared the same records again."""
    from bert_jax.data.sources import embedded as sources
    from bert_jax.data.tokenizers.sentencepiece import train_sentencepiece

    root = tmp_path_factory.mktemp("pretrain_shared")
    text = root / "corpus.txt"
    with open(text, "w", encoding="utf-8") as f:
        for document in sources.embedded_documents("train"):
            f.write("\n".join(document) + "\n\n")
    train_sentencepiece([str(text)], 1000, str(root / "tokenizer"), lowercase=True)
    return {"tokenizer": str(root / "tokenizer"), "cache": str(root / "cache")}


@pytest.fixture(scope="session")
def modernbert_reference(shared_dirs, tmp_path_factory):
    """The ModernBERT reference run of test_modernbert_pretrain.small_config, once per test
    process for the modules that read it (its `reference` fixture)."""
    from bert_jax.training import pretrain
    from tests.test_modernbert_pretrain import STEPS, small_config

    workdir = str(tmp_path_factory.mktemp("modernbert_reference"))
    result = pretrain.pretrain(small_config(shared_dirs), workdir)
    assert result.final_step == STEPS and not result.preempted
    return workdir, result


@pytest.fixture(autouse=True)
def _restore_logging_handlers():
    """A command sets its progress handlers once per process (`data prepare`'s basicConfig,
    fine-tuning's stdout handler) on the sys.stdout of that moment; in a test worker that is one
    test's captured stream, closed when the test ends. Each test's handlers are put back after it,
    so a later test's logging never writes to a closed stream."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("bert_jax.finetune")]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers, lg.level, lg.propagate = handlers, level, propagate
