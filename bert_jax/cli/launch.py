"""`bert-jax launch {tpu,slurm}`: `bert-jax pretrain` on a Cloud TPU VM slice or a SLURM cluster."""

from __future__ import annotations

import argparse


def add_to(subparsers) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="run `bert-jax pretrain` on a Cloud TPU VM slice or a SLURM GPU cluster",
        description="Thin launchers over `bert-jax pretrain`; pretrain arguments go after --. "
        "--dry-run prints every command (or the sbatch script) instead of running it. "
        "Recipes: launch/README.md.",
    )
    kinds = parser.add_subparsers(dest="launch_kind", required=True, metavar="KIND")
    _add_tpu(kinds)
    _add_slurm(kinds)


def _add_tpu(kinds) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", required=True, help="TPU VM name")
    common.add_argument("--zone", required=True, help="e.g. us-central2-b")
    common.add_argument("--project", default=None, help="default: gcloud's configured project")
    common.add_argument(
        "--remote-dir", default="bert-jax", help="directory under each worker's home"
    )
    common.add_argument("--dry-run", action="store_true", help="print the gcloud commands only")
    creating = argparse.ArgumentParser(add_help=False)
    creating.add_argument("--accelerator-type", default="v4-32")
    creating.add_argument("--version", default="tpu-ubuntu2204-base", help="TPU VM software")
    creating.add_argument("--spot", action="store_true", help="a Spot (preemptible) TPU VM")
    installing = argparse.ArgumentParser(add_help=False)
    installing.add_argument(
        "--source", default=None, help="bert-jax checkout to copy (default: this one)"
    )
    installing.add_argument("--archive", default=None, help="where to pack it locally")
    installing.add_argument("--jax-spec", default=None, help="default: jax[tpu]==<local jax>")
    installing.add_argument(
        "--setup-command",
        action="append",
        default=[],
        metavar="SHELL",
        help="extra shell line run on every worker after the install (e.g. a gcsfuse mount)",
    )
    running = argparse.ArgumentParser(add_help=False)
    running.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment"
    )
    running.add_argument(
        "--no-follow", action="store_true", help="do not stream worker 0's log after the start"
    )
    running.add_argument(
        "pretrain_args", nargs="*", metavar="-- PRETRAIN_ARGS", help="bert-jax pretrain args"
    )
    checking = argparse.ArgumentParser(add_help=False)
    checking.add_argument(
        "--skip-preflight",
        action="store_true",
        help="do not compile the job for --accelerator-type here before creating the TPU VM",
    )
    viewing = argparse.ArgumentParser(add_help=False)
    viewing.add_argument("--worker", type=int, default=0, help="whose log to stream")
    parser = kinds.add_parser("tpu", help="Cloud TPU VM slice: create, setup, run, logs, stop")
    actions = parser.add_subparsers(dest="tpu_action", required=True, metavar="ACTION")
    helps = {
        "up": (
            "compile-check here, then create (or reuse), setup, run",
            [common, creating, installing, running, checking],
        ),
        "create": ("create the TPU VM unless it exists", [common, creating]),
        "setup": ("copy this source tree to every worker and install it", [common, installing]),
        "run": ("start bert-jax pretrain on every worker; stream worker 0", [common, running]),
        "logs": ("stream a worker's log", [common, viewing]),
        "stop": ("SIGTERM every worker: checkpoint at the same step, then exit", [common]),
        "delete": ("delete the TPU VM", [common]),
    }
    for action, (summary, parents) in helps.items():
        action_parser = actions.add_parser(action, help=summary, parents=parents)
        action_parser.set_defaults(command_name=f"launch tpu {action}")
    parser.set_defaults(run=_run_tpu)


def _run_tpu(args) -> int:
    from bert_jax.launch import Runner, tpu

    # Flags only some actions have fall back to their defaults.
    vm = tpu.TpuVm(
        name=args.name,
        zone=args.zone,
        project=args.project,
        accelerator_type=getattr(args, "accelerator_type", "v4-32"),
        version=getattr(args, "version", "tpu-ubuntu2204-base"),
        spot=getattr(args, "spot", False),
        remote_dir=args.remote_dir,
    )
    tpu.perform(
        args.tpu_action,
        vm,
        Runner(dry_run=args.dry_run),
        pretrain_args=getattr(args, "pretrain_args", ()),
        env=tpu.parse_env(getattr(args, "env", ())),
        follow=not getattr(args, "no_follow", False),
        source_dir=getattr(args, "source", None),
        archive=getattr(args, "archive", None),
        jax_spec=getattr(args, "jax_spec", None),
        setup_commands=getattr(args, "setup_command", ()),
        worker=getattr(args, "worker", 0),
        check_fit=not getattr(args, "skip_preflight", False),
    )
    return 0


def _add_slurm(kinds) -> None:
    parser = kinds.add_parser(
        "slurm",
        help="write (and --submit) an sbatch script for GPU nodes",
        description="One process per GPU (--per gpu) or per node (--per node); the coordinator is "
        "the first node of the allocation.",
    )
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--per", choices=["gpu", "node"], default="gpu")
    parser.add_argument("--job-name", default="bert-jax")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--account", default=None)
    parser.add_argument("--time", default=None, help="e.g. 4-00:00:00")
    parser.add_argument("--cpus-per-task", type=int, default=None)
    parser.add_argument("--port", type=int, default=None, help="default: from the job id")
    parser.add_argument(
        "--output", default=None, help="SLURM's log (default: JOB_NAME-%%j.out beside the script)"
    )
    parser.add_argument("--bert-jax", default="bert-jax", help="the executable on the nodes")
    parser.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="SHELL",
        help="shell line run first, e.g. 'source ~/venv/bin/activate'",
    )
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--sbatch-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra #SBATCH option, e.g. exclusive or mem=0 (or --sbatch-option=--exclusive)",
    )
    parser.add_argument(
        "--script", default=None, help="default: JOB_NAME.sbatch in the pretrain --workdir"
    )
    parser.add_argument("--submit", action="store_true", help="run sbatch on the script")
    parser.add_argument("--dry-run", action="store_true", help="print the script only")
    parser.add_argument(
        "pretrain_args", nargs="*", metavar="-- PRETRAIN_ARGS", help="bert-jax pretrain args"
    )
    parser.set_defaults(run=_run_slurm, command_name="launch slurm")


def _run_slurm(args) -> int:
    from bert_jax.launch import Runner, slurm

    script, output = slurm.default_paths(
        args.job_name, args.pretrain_args, args.script, args.output
    )
    job = slurm.SlurmJob(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        per=args.per,
        job_name=args.job_name,
        partition=args.partition,
        account=args.account,
        time=args.time,
        cpus_per_task=args.cpus_per_task,
        port=args.port,
        output=output,
        bert_jax=args.bert_jax,
        setup=tuple(args.setup),
        env=slurm.parse_env(args.env),
        sbatch_options=tuple(args.sbatch_option),
    )
    slurm.write_and_submit(
        job,
        args.pretrain_args,
        script,
        Runner(dry_run=args.dry_run),
        submit=args.submit,
    )
    return 0
