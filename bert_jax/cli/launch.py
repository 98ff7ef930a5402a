"""`bert-jax launch {tpu,slurm}`: `bert-jax pretrain` on a Cloud TPU VM slice or a SLURM cluster.

Why this file is long: it declares the flags of eleven actions (nine of `launch tpu`, `slurm` and
its status), grouped in argparse parents that several actions share; what the actions do lives
in `bert_jax.launch` (and the plan's flags in `bert_jax.planning.plan.with_planned_flags`).
"""

from __future__ import annotations

import argparse

from bert_jax.launch import LaunchError


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
    from bert_jax.launch.queued import SWITCHES, Capacity
    from bert_jax.launch.tpu import TpuVm
    from bert_jax.runtime import declarations

    # The slice's flags, their help and defaults from `TpuVm`'s declarations: the name and the
    # zone (no default) required by every action, the rest where an action uses them.
    common = argparse.ArgumentParser(add_help=False)
    fields = {field.name: field for field in declarations.declared_fields(TpuVm)}
    for name in ("name", "zone"):
        options = declarations.flag_options(fields[name])
        common.add_argument(f"--{name}", dest=name, required=True, **options)
    declarations.add_flags(common, TpuVm, names=["project", "remote_dir"])
    common.add_argument("--dry-run", action="store_true", help="print the gcloud commands only")
    creating = argparse.ArgumentParser(add_help=False)
    declarations.add_flags(creating, TpuVm, names=["accelerator_type", "version"])
    # How the slice is asked for, from `Capacity`'s declarations: a switch per capacity kind
    # (none: on-demand), then the request's limit and the way without a queued resource.
    kinds_of_capacity = creating.add_mutually_exclusive_group()
    for kind, text in SWITCHES.items():
        kinds_of_capacity.add_argument(
            f"--{kind}", dest="kind", action="store_const", const=kind, help=text
        )
    declarations.add_flags(creating, Capacity, names=["valid_until_duration", "no_queued"])
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
    chosen = running.add_mutually_exclusive_group()
    chosen.add_argument(
        "--settings",
        default=None,
        metavar="PLAN.json",
        help="run the settings a `bert-jax plan --json` file chose for the whole run (its "
        "--config. flags are added to PRETRAIN_ARGS, which win where both set a key)",
    )
    chosen.add_argument(
        "--plan",
        action="store_true",
        help="run `bert-jax plan` for --accelerator-type and the --config in PRETRAIN_ARGS here "
        "first (minutes of compile; cached), then run what it chose, as --settings does",
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
    deleting = argparse.ArgumentParser(add_help=False)
    declarations.add_flags(deleting, Capacity, names=["no_queued"])
    watching = _watching_flags()
    starting_watch = argparse.ArgumentParser(add_help=False)
    starting_watch.add_argument(
        "--watch",
        action="store_true",
        help="then keep the run alive until its model is exported (launch/README.md)",
    )
    parser = kinds.add_parser("tpu", help="Cloud TPU VM slice: create, setup, run, logs, stop")
    actions = parser.add_subparsers(dest="tpu_action", required=True, metavar="ACTION")
    helps = {
        "up": (
            "compile-check here, then create (or reuse), setup, run; --watch: and supervise",
            [common, creating, installing, running, checking, starting_watch, watching],
        ),
        "create": ("create the TPU VM unless it exists", [common, creating]),
        "setup": ("copy this source tree to every worker and install it", [common, installing]),
        "run": ("start bert-jax pretrain on every worker; stream worker 0", [common, running]),
        "logs": ("stream a worker's log", [common, viewing]),
        "stop": ("SIGTERM every worker: checkpoint at the same step, then exit", [common]),
        "delete": ("delete the queued resource and its TPU VM", [common, deleting]),
    }
    for action, (summary, parents) in helps.items():
        action_parser = actions.add_parser(action, help=summary, parents=parents)
        action_parser.set_defaults(command_name=f"launch tpu {action}", run=_run_tpu)
    workdir = argparse.ArgumentParser(add_help=False)
    workdir.add_argument("--workdir", required=True, help="the run's workdir (gs://...)")
    watch = actions.add_parser(
        "watch",
        help="supervise a run started by `launch tpu up` (settings from WORKDIR/launch/)",
        parents=[workdir, watching],
    )
    watch.add_argument(
        "--dry-run", action="store_true", help="say what it would do; read and run nothing"
    )
    watch.set_defaults(command_name="launch tpu watch", run=_run_watch)
    status = actions.add_parser(
        "status",
        help="slice state, step, checkpoint, ETA, restarts by cause, goodput (from WORKDIR)",
        parents=[workdir],
    )
    status.add_argument(
        "--no-gcloud", action="store_true", help="do not ask gcloud for the slice's state"
    )
    status.add_argument(
        "--dry-run", action="store_true", help="say what it would read; read nothing"
    )
    status.set_defaults(command_name="launch tpu status", run=_run_status)


def _watching_flags() -> argparse.ArgumentParser:
    from bert_jax.launch.supervisor import Policy
    from bert_jax.runtime import declarations

    watching = argparse.ArgumentParser(add_help=False)
    group = watching.add_argument_group("supervisor (--watch, watch)")
    # The supervisor's policy: every flag, its help and default from `Policy`'s declarations.
    declarations.add_flags(group, Policy)
    group.add_argument(
        "--detach",
        action="store_true",
        help="supervise in the background (pid file and log: --pid-file, --log)",
    )
    group.add_argument("--pid-file", default=None, help="default: bert-jax-watch-NAME.pid")
    group.add_argument("--log", default=None, help="default: bert-jax-watch-NAME.log")
    group.add_argument(
        "--no-stream", action="store_true", help="do not stream worker 0's log while watching"
    )
    return watching


def _policy(args):
    """The supervisor's policy from the parsed flags; a bad value is a LaunchError naming its
    flag, raised here, before anything runs."""
    from bert_jax.launch.supervisor import Policy
    from bert_jax.runtime import declarations

    return declarations.from_args(Policy, args)


def _watch_argv(args, workdir: str) -> list[str]:
    """`launch tpu watch` with this command's supervisor flags (for --detach)."""
    from bert_jax.runtime import declarations

    argv = ["launch", "tpu", "watch", "--workdir", workdir, "--no-stream"]
    return argv + declarations.to_flags(_policy(args))


def _supervise(args, workdir: str) -> int:
    import os

    from bert_jax.launch import Runner, watcher, workdir_state

    policy = _policy(args)  # refused here, before a detached child would be started
    job = workdir_state.load_job(workdir)
    if args.detach:
        pid_file = args.pid_file or f"bert-jax-watch-{job.vm.name}.pid"
        log_file = args.log or f"bert-jax-watch-{job.vm.name}.log"
        pid = watcher.detach(_watch_argv(args, workdir), pid_file, log_file)
        print(
            f"supervising {job.vm.name} in the background: pid {pid} (in {pid_file}), log "
            f"{os.path.abspath(log_file)}; `bert-jax launch tpu status --workdir {workdir}`"
        )
        return 0
    runner = Runner()
    runner.require("gcloud")
    return watcher.Watcher(job, policy, runner, stream=not args.no_stream).run()


def _run_watch(args) -> int:
    if args.dry_run:  # reads nothing, runs nothing: the bucket may not be reachable from here
        _policy(args)
        print(
            f"# would supervise the run whose job {args.workdir}/launch/job.json describes: "
            "describe its slice, create or recreate it, start or restart the run, until its "
            "model is exported" + (" (in the background)" if args.detach else "")
        )
        return 0
    return _one_line_for_cloud_errors(args, lambda: _supervise(args, args.workdir))


def _run_status(args) -> int:
    import shutil

    from bert_jax.launch import Runner, workdir_state

    if args.dry_run:
        print(
            f"# would read {args.workdir}/launch/ (events, job) and the heartbeats"
            + ("" if args.no_gcloud else ", and ask gcloud for the slice's state")
        )
        return 0
    use_gcloud = not args.no_gcloud and shutil.which("gcloud") is not None
    print(workdir_state.status_text(args.workdir, Runner() if use_gcloud else None))
    return 0


def _run_tpu(args) -> int:
    return _one_line_for_cloud_errors(args, lambda: _tpu_action(args))


def _one_line_for_cloud_errors(args, action) -> int:
    import sys

    from bert_jax.launch import CommandFailed, tpu
    from bert_jax.runtime.errors import EXIT_DOES_NOT_FIT

    try:
        return action()
    except tpu.DoesNotFit as err:
        print(f"bert-jax {args.command_name}: {err}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    except CommandFailed as err:  # gcloud said why, above; retrying later may work
        print(f"bert-jax {args.command_name}: error: {err}", file=sys.stderr)
        return 1


def _tpu_action(args) -> int:
    from bert_jax.launch import Runner, queued, slurm, tpu
    from bert_jax.runtime import declarations

    if hasattr(args, "max_failures"):  # `up`: its supervisor settings, before anything runs
        _policy(args)
    # A setting whose flag this action lacks is its declared default.
    capacity = declarations.from_args(queued.Capacity, args)
    vm = declarations.from_args(tpu.TpuVm, args, spot=capacity.kind == "spot")
    if getattr(args, "settings", None) or getattr(args, "plan", False):
        args.pretrain_args = _with_planned_settings(args)
    runner = Runner(dry_run=args.dry_run)
    qr = None
    if not capacity.no_queued and args.tpu_action in ("up", "create", "delete"):
        qr = queued.QueuedResource(vm, capacity.kind, capacity.valid_until_duration)
    watch = getattr(args, "watch", False)
    workdir = slurm.workdir_in(getattr(args, "pretrain_args", ()))
    if watch and workdir is None:
        raise LaunchError("--watch needs the run's --workdir in the pretrain arguments")
    if watch and args.dry_run:  # what `up` runs first; the supervisor's later steps as a note
        tpu.perform(
            "up",
            vm,
            runner,
            pretrain_args=args.pretrain_args,
            env=tpu.parse_env(args.env),
            follow=False,
            source_dir=args.source,
            archive=args.archive,
            jax_spec=args.jax_spec,
            setup_commands=args.setup_command,
            check_fit=not args.skip_preflight,
            create_slice=(lambda: queued.bring_up(qr, runner)) if qr else None,
        )
        runner.note(
            f"then: save the job in {workdir}/launch/ and supervise the run until its model is "
            f"exported, as `bert-jax launch tpu watch --workdir {workdir}` does"
            + (" (in the background)" if args.detach else "")
        )
        return 0
    if watch:
        _save_job(args, vm, capacity, workdir)
    elif args.tpu_action == "up" and workdir is not None and not args.dry_run:
        _save_job_if_reachable(args, vm, capacity, workdir)
    if watch:
        if not args.skip_preflight:
            tpu.preflight(vm, runner, args.pretrain_args, args.source or tpu.default_source_dir())
        return _supervise(args, workdir)
    tpu.perform(
        args.tpu_action,
        vm,
        runner,
        pretrain_args=getattr(args, "pretrain_args", ()),
        env=tpu.parse_env(getattr(args, "env", ())),
        follow=not getattr(args, "no_follow", False),
        source_dir=getattr(args, "source", None),
        archive=getattr(args, "archive", None),
        jax_spec=getattr(args, "jax_spec", None),
        setup_commands=getattr(args, "setup_command", ()),
        worker=getattr(args, "worker", 0),
        check_fit=not getattr(args, "skip_preflight", False),
        create_slice=(lambda: queued.bring_up(qr, runner)) if qr else None,
        delete_slice=(lambda: queued.delete_slice(qr, runner)) if qr else None,
    )
    return 0


def _with_planned_settings(args) -> list[str]:
    """PRETRAIN_ARGS with what `plan` chose for the slice (see `plan.with_planned_flags`); a dry
    run prints the `plan` command instead of running it (minutes of compile) and adds nothing."""
    import os
    import shlex
    import subprocess
    import sys
    import tempfile

    from bert_jax.launch import pretrain_args
    from bert_jax.planning import plan

    accelerator = args.accelerator_type  # `up`, the one action with --settings and --plan
    what, path = "--settings", args.settings
    if args.plan:
        config_args = pretrain_args.config_args(args.pretrain_args)
        if not any(a.startswith("--config=") for a in config_args):
            raise LaunchError("--plan needs the run's --config in the pretrain arguments")
        command = [sys.executable, "-m", "bert_jax.cli", "plan", *config_args]
        command += ["--topology", accelerator, "--json"]
        shown = shlex.join(["bert-jax", *command[3:]])
        if args.dry_run:
            print(f"# planning {accelerator} (not in a dry run): {shown}")
            print("# the settings `plan` chooses join the pretrain arguments below")
            return list(args.pretrain_args)
        print(f"# planning {accelerator}: {shown}", flush=True)
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if done.returncode not in (0, 4):
            raise LaunchError(f"--plan: `bert-jax plan` exited with {done.returncode} (above)")
        what, path = "--plan", os.path.join(tempfile.mkdtemp(prefix="bert-jax-plan-"), "plan.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(done.stdout)
    # The user's keys are found in either spelling (`--config.k v`, `--config.k=v`).
    _, added = plan.with_planned_flags(
        path, accelerator, pretrain_args.joined(args.pretrain_args), what
    )
    print(f"# settings from {what} {path}: {' '.join(added) or '(all set in PRETRAIN_ARGS)'}")
    return [*args.pretrain_args, *added]


def _save_job_if_reachable(args, vm, capacity, workdir: str) -> None:
    """Without --watch: keep the job in a gs:// workdir too, so that `launch tpu watch` can take
    over later; a path only the workers see (a FUSE mount) is left alone."""
    from bert_jax.runtime import fs
    from bert_jax.runtime.errors import UserError

    if not fs.is_remote(workdir):
        return
    try:
        _save_job(args, vm, capacity, workdir)
    except (UserError, OSError) as err:
        print(f"# not written: {workdir}/launch/job.json ({err}); `launch tpu watch` needs it")


def _save_job(args, vm, capacity, workdir: str) -> None:
    """WORKDIR/launch/job.json and src.tar.gz: what `launch tpu watch` restarts from."""
    import os
    import tempfile

    from bert_jax.launch import tpu, workdir_state

    job = workdir_state.Job(
        vm=vm,
        workdir=workdir,
        pretrain_args=tuple(args.pretrain_args),
        capacity=None if capacity.no_queued else capacity.kind,
        valid_until_duration=capacity.valid_until_duration,
        env=tuple(tpu.parse_env(args.env).items()),
        jax_spec=args.jax_spec or tpu.default_jax_spec(),
        setup_commands=tuple(args.setup_command),
    )
    archive = args.archive or os.path.join(tempfile.gettempdir(), f"bert-jax-src-{vm.name}.tar.gz")
    workdir_state.save_job(job, args.source or tpu.default_source_dir(), archive)


def _add_slurm(kinds) -> None:
    from bert_jax.launch import slurm
    from bert_jax.runtime import declarations

    parser = kinds.add_parser(
        "slurm",
        help="write (and --submit) an sbatch script for GPU nodes; `slurm status`: how it goes",
        description="One process per GPU (--per gpu) or per node (--per node); the coordinator is "
        "the first node of the allocation. `bert-jax launch slurm status --workdir W` prints the "
        "run's events, step, ETA and goodput; `record` is what the script calls to add events.",
    )
    # The job's settings: every flag, its help and default from `SlurmJob`'s declarations; the
    # three that take a line each time they are given are added here.
    declarations.add_flags(parser, slurm.SlurmJob)
    parser.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="SHELL",
        help="shell line run first, e.g. 'source ~/venv/bin/activate'",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment"
    )
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
    parser.add_argument("--workdir", default=None, help="for `status` and `record`")
    parser.add_argument("--note", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--exit-status", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true", help="print the script only")
    parser.add_argument(
        "pretrain_args", nargs="*", metavar="-- PRETRAIN_ARGS", help="bert-jax pretrain args"
    )
    parser.set_defaults(run=_run_slurm, command_name="launch slurm")


def _run_slurm(args) -> int:
    import dataclasses

    from bert_jax.launch import Runner, events, slurm, workdir_state
    from bert_jax.runtime import declarations

    action = args.pretrain_args[:1]
    if action in (["status"], ["record"]):
        if not args.workdir:
            raise LaunchError(f"launch slurm {action[0]} needs --workdir (the run's workdir)")
        if action == ["status"]:
            if args.dry_run:
                print(f"# would read {args.workdir}/launch/ (events) and the heartbeats")
                return 0
            print(workdir_state.status_text(args.workdir))
            return 0
        if len(args.pretrain_args) != 2:
            recordable = ", ".join(events.named(job_script=True))
            raise LaunchError(f"launch slurm record EVENT --workdir W (EVENT: one of {recordable})")
        if args.dry_run:
            print(f"# would add the event {args.pretrain_args[1]} to {args.workdir}/launch/")
            return 0
        workdir_state.record_event(
            args.workdir, args.pretrain_args[1], note=args.note, exit_status=args.exit_status
        )
        return 0
    job = declarations.from_args(
        slurm.SlurmJob,
        args,
        setup=tuple(args.setup),
        env=slurm.parse_env(args.env),
        sbatch_options=tuple(args.sbatch_option),
    )
    script, output = slurm.default_paths(job.job_name, args.pretrain_args, args.script, job.output)
    job = dataclasses.replace(job, output=output)
    slurm.write_and_submit(
        job,
        args.pretrain_args,
        script,
        Runner(dry_run=args.dry_run),
        submit=args.submit,
    )
    return 0
