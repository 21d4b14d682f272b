"""The `recsys` command: train, evaluate, export and info subcommands.

Examples:
  recsys train --gin_file experiments/synthetic_dlrm.gin --model_dir runs/demo
  recsys train --gin_file experiments/criteo_dcn.gin \\
      --gin_bindings "CRITEO_DIR = '/data/criteo'" --model_dir runs/dcn
  recsys train --gin_file experiments/movielens_ranking.gin \\
      --gin_bindings "MOVIELENS_DIR = '/data/ml-100k'" --model_dir runs/ml100k
  recsys evaluate --model_dir runs/demo
  recsys evaluate --model_dir runs/ml100k --eval_on seed1 \\
      --gin_bindings "MovieLens.seed = 1"
  recsys export --model_dir runs/demo --export_dir runs/demo/export
  recsys info --gin_file experiments/synthetic_dlrm.gin
"""

import argparse
import contextlib
import json
import logging
import os
import platform
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

DESCRIPTION = (
  "Train, evaluate and export gin-configured recommender models "
  "whose embeddings run on CPU, GPU or any Cloud TPU."
)

log = logging.getLogger("recsys")


def _add_gin_flags(parser: argparse.ArgumentParser, required: bool) -> None:
  parser.add_argument(
    "--gin_file",
    action="append",
    default=[],
    required=required,
    metavar="FILE",
    help="gin file to parse: a path or a shipped experiment's name, e.g. "
    "synthetic_dlrm.gin (`recsys experiments` lists them). Repeatable; "
    "later files override earlier ones; `include` resolves relative to "
    "the including file first, then in the shipped experiments.",
  )
  parser.add_argument(
    "--gin_bindings",
    action="append",
    default=[],
    metavar="BINDING",
    help='extra gin binding, e.g. "train.train_steps = 100" (repeatable; '
    "applied after the files).",
  )


def _add_runtime_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "--tpu",
    default=None,
    metavar="ADDR",
    help="TPU name or grpc:// address, or 'local' on a TPU VM "
    "(default: no TPU; GPUs are used when present).",
  )
  parser.add_argument(
    "--backend",
    default=None,
    metavar="NAME",
    help="force an embedding backend (tensorcore, "
    "tpu_embedding, tpu_embedding_v0, sharded, serving) "
    "instead of gin's train.backend / 'auto'.",
  )
  parser.add_argument(
    "--intra_op_threads",
    type=int,
    default=0,
    help="TensorFlow intra-op threads (0: automatic: 1 on a "
    "machine with 2 cores or fewer, else TF's default).",
  )
  parser.add_argument(
    "--inter_op_threads",
    type=int,
    default=0,
    help="TensorFlow inter-op threads (0: automatic: 2 on a "
    "machine with 2 cores or fewer, else TF's default).",
  )
  parser.add_argument(
    "-v",
    "--verbose",
    action="store_true",
    help="TensorFlow's own logs and full tracebacks.",
  )


def _add_allow_changed_settings(
  parser: argparse.ArgumentParser, command: str
) -> None:
  parser.add_argument(
    "--allow_changed_settings",
    action="store_true",
    help=f"{command} although settings that change the math (data, split, "
    "features, model, ...) or the data files differ from those the run "
    "trained with; refused by default, naming them. Allowed changes are "
    "recorded in the model dir (changed_settings.jsonl) and the output.",
  )


def _add_skip_memory_check(parser: argparse.ArgumentParser) -> None:
  """The way past the memory check every command that builds tables runs
  (the refusal names this flag, so each of them takes it)."""
  parser.add_argument(
    "--skip_memory_check",
    action="store_true",
    help="build the embedding tables even if their memory plan exceeds "
    "this host's memory (refused by default, naming the tables).",
  )


def _command(sub, name: str, **kwargs) -> argparse.ArgumentParser:
  """A subcommand whose description and examples keep their line breaks."""
  return sub.add_parser(
    name, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
  )


def _installed_version(*packages: str) -> str:
  """The version of the first of `packages` installed ("?": none)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  for package in packages:
    try:
      return metadata.version(package)
    except metadata.PackageNotFoundError:
      continue
  return "?"


def version_line(
  tensorflow: str | None = None, keras_module: str = "tf_keras"
) -> str:
  """recsys, TensorFlow, Keras and Python versions, in one line.

  Args:
    tensorflow: TF's version as imported (None: the installed package's,
      read without importing TensorFlow, for `recsys --version`).
    keras_module: the module `tf.keras` is (recsys makes it tf_keras).
  """
  import recsys  # pylint: disable=g-import-not-at-top

  tensorflow = tensorflow or _installed_version(
    "tensorflow", "tensorflow-cpu", "tf-nightly"
  )
  return (
    f"recsys {recsys.__version__}, TensorFlow {tensorflow}, "
    f"Keras {_installed_version('tf-keras')} ({keras_module}), "
    f"Python {platform.python_version()}"
  )


class _PrintVersion(argparse.Action):
  """`recsys --version`: prints `version_line()` (TF is not imported)."""

  def __init__(self, option_strings, dest, **kwargs):
    super().__init__(option_strings, dest, nargs=0, **kwargs)

  def __call__(self, parser, namespace, values, option_string=None):
    print(version_line())
    parser.exit()


def build_parser() -> argparse.ArgumentParser:
  """The argument parser of `recsys` and its subcommands."""
  parser = argparse.ArgumentParser(
    prog="recsys",
    description=DESCRIPTION,
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog="Run `recsys <command> --help` for a command's flags.\n\n"
    + __doc__.split("\n", 1)[1],
  )
  parser.add_argument(
    "--version",
    action=_PrintVersion,
    help="print the recsys, TensorFlow, Keras and Python versions.",
  )
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  sub.required = True

  train = _command(
    sub,
    "train",
    help="train a model (resumes from --model_dir).",
    description="Train the experiment the gin files describe. An existing "
    "checkpoint in --model_dir is resumed at its step. Writes checkpoints, "
    "TensorBoard summaries, operative_config.gin and metrics.json there.",
    epilog="example:\n  recsys train --gin_file experiments/synthetic_dlrm.gin "
    "--model_dir runs/demo\n  recsys train "
    "--gin_file experiments/synthetic_dlrm.gin "
    "--gin_file experiments/hardware/cpu_2replicas.gin \\\n"
    "      --gin_bindings 'train.train_steps = 500' --model_dir runs/demo2",
  )
  _add_gin_flags(train, required=True)
  train.add_argument(
    "--model_dir",
    required=True,
    help="where checkpoints, summaries and metrics go.",
  )
  train.add_argument(
    "--no_progress",
    action="store_true",
    help="log lines instead of a progress bar.",
  )
  train.add_argument(
    "--allow_changed_settings",
    action="store_true",
    help="resume the checkpoint in --model_dir although settings that "
    "change the math (data, model, optimizers, batch size, seed, ...) "
    "differ from the previous run's; refused by default, naming them.",
  )
  _add_skip_memory_check(train)
  _add_runtime_flags(train)

  evaluate = _command(
    sub,
    "evaluate",
    help="evaluate the latest checkpoint of a model dir.",
    description="Restore the latest checkpoint of --model_dir and evaluate "
    "it; prints the metrics as JSON and, if the model dir is writable, "
    "keeps them in eval_metrics.json (nothing else is written, but a line "
    "in changed_settings.jsonl for allowed changes). Without "
    "--gin_file the run's own operative_config.gin is used; settings or "
    "data files that differ from the run's are refused, naming them "
    "(--eval_on NAME evaluates on other data on purpose).",
    epilog="example:\n  recsys evaluate --model_dir runs/demo\n"
    "  recsys evaluate --model_dir runs/demo "
    "--gin_bindings 'train.eval_steps = None'",
  )
  _add_gin_flags(evaluate, required=False)
  evaluate.add_argument("--model_dir", required=True)
  evaluate.add_argument(
    "--eval_on",
    default=None,
    metavar="NAME",
    help="evaluate on other data on purpose: the data settings given with "
    "--gin_file/--gin_bindings (and the data files) may differ from the "
    "run's, the model's may not; the results go to "
    "eval_metrics-NAME.json, never to eval_metrics.json.",
  )
  evaluate.add_argument(
    "--exclude_seen",
    action="store_true",
    help="retrieval: rank for each held-out pair only the candidates its "
    "user did not interact with in training (train.exclude_seen).",
  )
  _add_allow_changed_settings(evaluate, "evaluate")
  _add_skip_memory_check(evaluate)
  _add_runtime_flags(evaluate)

  export = _command(
    sub,
    "export",
    help="export a SavedModel that serves on CPU.",
    description="Restore the latest checkpoint of --model_dir (trained with "
    "any backend) and write a SavedModel whose serving_default signature "
    "takes the data source's ids and returns scores (ranking) or top-k "
    "candidates (retrieval); for Criteo and MovieLens, serving_raw takes "
    "raw values (TSV columns, raw user/item ids) and applies the training "
    "hashing and vocabularies in the graph.",
    epilog="example:\n  recsys export --model_dir runs/demo "
    "--export_dir runs/demo/export",
  )
  _add_gin_flags(export, required=False)
  export.add_argument("--model_dir", required=True)
  export.add_argument("--export_dir", required=True)
  export.add_argument(
    "--k",
    type=_positive_int,
    default=None,
    metavar="K",
    help="retrieval: candidates the top-k signatures (serving_default, "
    "serving_raw, top_k, top_k_raw) return per query, at most the corpus "
    "size (default: 100, or the whole corpus if it holds fewer). Refused "
    "for ranking models.",
  )
  _add_allow_changed_settings(export, "export")
  _add_skip_memory_check(export)
  export.add_argument("-v", "--verbose", action="store_true")

  info = _command(
    sub,
    "info",
    help="print versions, devices, strategy and backend choice.",
    description="Print what recsys detects here: versions, devices, the "
    "strategy and the embedding backend it would pick and why; with "
    "--gin_file also the experiment's tables and their memory plan.",
    epilog="example:\n  recsys info\n  recsys info "
    "--gin_file experiments/synthetic_dlrm.gin",
  )
  _add_gin_flags(info, required=False)
  _add_runtime_flags(info)

  experiments = _command(
    sub,
    "experiments",
    help="list the shipped experiment gin files, or print one.",
    description="The experiment gin files installed with recsys. Pass a "
    "name to --gin_file from any directory, include it from your own gin "
    "file (include 'synthetic_dlrm.gin'), or print it to start your own.",
    epilog="example:\n  recsys experiments\n  recsys experiments "
    "synthetic_dlrm.gin > my_dlrm.gin",
  )
  experiments.add_argument(
    "name", nargs="?", default=None, help="print this experiment's gin file."
  )

  launch = _command(
    sub,
    "launch",
    help="run a command on a local cluster (chief, workers, ps).",
    description="Start a small TF_CONFIG cluster of processes on this "
    "machine (127.0.0.1, free ports) that all run the command after `--`: "
    "with --ps > 0 a chief, workers and parameter servers "
    "(ParameterServerStrategy, 'sharded' tables); with --ps 0 workers of a "
    "MultiWorkerMirroredStrategy. Log lines are prefixed with the task; "
    "every process is stopped when the chief exits, on Ctrl-C, or when a "
    "task the cluster cannot lose fails.",
    epilog="example:\n  recsys launch --workers 2 --ps 2 -- train "
    "--gin_file experiments/synthetic_dlrm.gin \\\n"
    "      --gin_file experiments/hardware/local_cluster.gin "
    "--model_dir runs/ps",
  )
  from recsys import launch as launch_lib  # pylint: disable=g-import-not-at-top

  launch_lib.add_arguments(launch)
  sub.add_parser(  # handled in main(): recsys.tools.movielens_benchmark
    "benchmark",
    help="`benchmark movielens`: baselines vs. experiments over split seeds.",
  )
  return parser


def _configure_runtime(args: argparse.Namespace) -> None:
  verbose = getattr(args, "verbose", False)
  if not verbose:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  logging.basicConfig(
    level=logging.INFO,
    format="%(asctime)s %(name)s %(levelname)s %(message)s",
    datefmt="%H:%M:%S",
  )
  from recsys import _tf_startup  # pylint: disable=g-import-not-at-top

  tf_module, devices = _tf_startup.start(verbose)
  tf: Any = tf_module
  logging.getLogger("recsys").info(devices)
  if not verbose:
    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.WARNING)
  intra, inter, why = thread_settings(
    getattr(args, "intra_op_threads", 0),
    getattr(args, "inter_op_threads", 0),
    available_cores(),
  )
  try:
    if intra:
      tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
      tf.config.threading.set_inter_op_parallelism_threads(inter)
  except (
    RuntimeError
  ):  # TF already running in this process (called as a library)
    if not why:
      raise
    why = ""
  if why:
    logging.getLogger("recsys").info(why)


def thread_settings(intra: int, inter: int, cores: int) -> tuple[int, int, str]:
  """The TF (intra-op, inter-op) threads to set (0: TF's default), and why.

  Flags given are kept. With neither given on a machine of 2 cores or fewer,
  one thread per op and two ops at a time: the recsys steps are many small
  ops, and one core stays free for the input pipeline (the default
  experiment trained 1.3x faster than with TF's default 2/2 on 2 cores,
  same metrics).
  """
  if intra or inter or cores > 2:
    return intra, inter, ""
  return (
    1,
    2,
    (
      f"{cores} CPU core(s): TF intra-op threads 1, inter-op 2 "
      "(set --intra_op_threads / --inter_op_threads to override)"
    ),
  )


def available_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def _gin_files(args: argparse.Namespace) -> list[str]:
  """--gin_file, or the model dir's operative config for evaluate/export."""
  if args.gin_file:
    return list(args.gin_file)
  model_dir = getattr(args, "model_dir", None)
  if model_dir:
    from recsys import untrusted_config  # pylint: disable=g-import-not-at-top
    from recsys.run_folder import run_dir  # pylint: disable=g-import-not-at-top

    path = run_dir.RunDir(model_dir).operative_config
    if os.path.isfile(path):
      return [untrusted_config.check_bindings_only(path)]  # no imports
    raise FileNotFoundError(
      f"{path} does not exist: pass --gin_file (the experiment's gin files) "
      f"or point --model_dir at a directory written by `recsys train`."
    )
  return []


def _bindings(args: argparse.Namespace) -> list[str]:
  """--gin_bindings, then one binding per settings switch given.

  The switches are declared with their settings (`settings.flag_settings`):
  e.g. `--no_progress` binds `train.progress_bar = False`.
  """
  from recsys import train_settings as settings  # pylint: disable=g-import-not-at-top

  bindings = list(args.gin_bindings)
  for flag, (name, value) in settings.flag_settings().items():
    if getattr(args, flag, False):
      bindings.append(f"train.{name} = {value!r}")
  return bindings


def _call_train(
  args: argparse.Namespace, extra_bindings: Sequence[str] = (), **kwargs
):
  """Parses the command's gin files, then calls the gin-configured `train`.

  The strategy is built here, from `--tpu` (or the config's `train.tpu`)
  and the config's `train.num_cpu_replicas`, and passed to `train`: before
  gin calls `train`, which first builds its arguments (see
  `configured_strategy`); the flag never goes into the gin config.

  Args:
    args: the parsed flags (gin files and bindings, model dir, runtime flags).
    extra_bindings: bindings the command adds after the user's.
    **kwargs: arguments of `train` besides `model_dir` (e.g. an already
      built `strategy`); they override `--backend`.

  Returns:
    What `train` returns for the action.

  Raises:
    config.GinConfigError: a gin error, with the gin files and bindings named.
  """
  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.training import train  # pylint: disable=g-import-not-at-top
  from recsys.training.train import configured_strategy  # pylint: disable=g-import-not-at-top

  files, bindings = _gin_files(args), _bindings(args)
  config.parse(files, bindings + list(extra_bindings))
  if "strategy" not in kwargs:
    kwargs["strategy"], _ = configured_strategy(getattr(args, "tpu", None))
  if getattr(args, "backend", None):
    kwargs.setdefault("backend", args.backend)
  return config.call(train, files, bindings, model_dir=args.model_dir, **kwargs)


#: `recsys` exits with this status on SIGTERM (128 + 15), as a preempted
#: training run does (recsys.training.signals.PREEMPTED_EXIT_CODE).
SIGTERM_EXIT_CODE = 143
#: ... and with this one on Ctrl-C (128 + 2), as a training run stopped by
#: it does after its checkpoint (signals.INTERRUPTED_EXIT_CODE).
INTERRUPTED_EXIT_CODE = 130


@contextlib.contextmanager
def _sigterm_exits_143() -> Iterator[None]:
  """SIGTERM outside the training loop exits with 143, not by the signal.

  The training loop installs its own handler (save, then stop with 143);
  before it does — TF's start-up, restoring, building — and for evaluate
  and export there is nothing to save, but a scheduler still expects 143.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    del signum, frame
    print(
      "recsys: SIGTERM received outside the training loop; stopping "
      "(checkpoints already saved are kept).",
      file=sys.stderr,
    )
    raise SystemExit(SIGTERM_EXIT_CODE)

  previous = signal.signal(signal.SIGTERM, handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def cmd_train(args: argparse.Namespace) -> int:
  metrics = _call_train(args)
  from recsys.run import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

  # In a multi-worker run every worker returns the metrics; one prints them.
  if strategy_lib.is_chief_task():
    print(json.dumps(metrics, indent=2, sort_keys=True), flush=True)
    ending = _ending(args.model_dir, metrics)
    if ending:  # after the JSON, which stdout keeps to itself
      print(f"recsys train: {ending}", file=sys.stderr)
  return 0


def _ending(model_dir: str, metrics: dict[str, Any]) -> str:
  """`recsys train`'s last line: nothing was trained if the run was
  complete already (and how to train again), and the metric reached next
  to the best the data allows, where the source knows it."""
  from recsys.run import run_summaries  # pylint: disable=g-import-not-at-top

  step = metrics.get("step")
  parts = []
  if metrics.get("steps_trained") == 0:
    parts.append(
      f"nothing trained: {model_dir} was complete already at step {step} "
      "(metrics.json keeps the run that trained it). To train again, pass "
      "another --model_dir, or more steps: --gin_bindings "
      f"'train.train_steps = {2 * int(step or 0)}'."
    )
  reached = run_summaries.against_optimum(metrics)
  if reached:
    parts.append(f"The restored model: {reached}." if parts else f"{reached}.")
  return " ".join(parts)


def cmd_evaluate(args: argparse.Namespace) -> int:
  from recsys.run.evaluation import evaluate_restored  # pylint: disable=g-import-not-at-top
  from recsys.run_folder import run_dir  # pylint: disable=g-import-not-at-top

  run = run_dir.RunDir(args.model_dir)
  name = args.eval_on
  path = run.other_eval_metrics(name) if name else run.eval_metrics
  restored = _call_train(args, action="restore")  # reads the model dir only
  metrics, changes = evaluate_restored(restored, other_data=bool(name))
  if name:
    metrics["eval_on"] = name
  print(json.dumps(metrics, indent=2, sort_keys=True))
  if name:  # what the other data was, next to its results
    metrics["eval_input_files"] = restored.input_fingerprints(eval_only=True)
  try:  # a convenience copy; a read-only model dir (e.g. a shared run) is fine
    run.write_eval_metrics(metrics, name)
    if changes:
      run.record_changes("evaluate", restored.restored_step, changes, path)
  except OSError as e:
    log.warning(
      "%s not written (%s); the metrics are printed above",
      path,
      e.strerror or e,
    )
  return 0


def _positive_int(text: str) -> int:
  """An argparse type: a positive integer (`recsys export --k`)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
  return value


def cmd_export(args: argparse.Namespace) -> int:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from recsys import export as export_lib  # pylint: disable=g-import-not-at-top

  # The serving backend restores a checkpoint of any training backend
  # (SparseCore's stacked tables included) on CPU; the export copies its
  # tables without the optimizer slots. Where the training devices held the
  # tables (train.placement, a device's memory) does not apply here.
  restored = _call_train(
    args,
    [
      "train.progress_bar = False",
      "train.summaries = False",
      "train.placement = None",
    ],
    action="restore",
    backend="serving",
    strategy=tf.distribute.get_strategy(),
  )
  step = restored.require_checkpoint("export")
  changes = restored.check_restored("export")
  provenance = {
    "model_dir": os.path.abspath(args.model_dir),
    "step": step,
    "changed_settings": changes.lines(),
    "input_files": restored.input_fingerprints(),
  }
  path = export_lib.export(
    restored,
    args.export_dir,
    k=args.k,
    extra_files={export_lib.PROVENANCE_FILE: json.dumps(provenance, indent=2)},
  )
  if changes:
    restored.run_dir.record_changes("export", step, changes, path)
  changed = "".join(f"\n  changed: {line}" for line in changes.lines())
  print(f"exported step {step} to {path}{changed}")
  return 0


def cmd_info(args: argparse.Namespace) -> int:
  """What `recsys train` with the same flags would run on, and its tables.

  With gin files, the strategy is the one `train` builds from them (e.g.
  cpu_2replicas.gin's two mirrored replicas), and the memory plan comes
  from the data source, or from its gin settings when its files are not
  there yet (a folder macro may stay unbound).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.run import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

  lines = [version_line(tf.__version__, tf.keras.__name__.split(".")[0])]
  missing = config.register_all()
  if missing:
    lines.append(f"could not import: {', '.join(missing)}")
  feature_config, optimizer, backend = None, None, args.backend or "auto"
  plan, note = None, ""
  if args.gin_file:
    from recsys.training.train import (  # pylint: disable=g-import-not-at-top
      configured_embedding,
      configured_plan,
      configured_strategy,
    )

    # Not finalized: a data folder's required macro may stay unbound here.
    config.parse(args.gin_file, args.gin_bindings, finalize=False)
    # The run's strategy (train.num_cpu_replicas), before TF's runtime starts.
    strategy, _ = configured_strategy(args.tpu)
    feature_config, optimizer, backend, note = configured_embedding(
      args.backend
    )
    # What `train` plans and checks, refused as `train` refuses it.
    plan = configured_plan(feature_config, optimizer, backend, strategy)
  else:
    strategy, _ = strategy_lib.make_strategy(args.tpu)
  from backends import registry  # pylint: disable=g-import-not-at-top
  from recsys import planning  # pylint: disable=g-import-not-at-top

  lines.append(
    planning.describe_environment(strategy, backend=backend, plan=plan)
  )
  if plan is not None and plan.fits is False:
    lines.append(
      "recsys train, evaluate and export refuse this plan before a table is "
      + (
        "allocated, but train.skip_memory_check is set: they would try"
        if config.value("train.skip_memory_check")
        else "allocated (--skip_memory_check to try anyway)"
      )
    )
  if note:
    lines.append(note)
  from backends import kernels  # pylint: disable=g-import-not-at-top

  lines.append(f"fused CPU kernels (tensorcore on CPU): {kernels.status()}")
  print("\n".join(lines))
  # A forced backend that cannot run here: the report says why, and the
  # command ends as `recsys train` would (BackendUnavailableError, exit 2).
  if backend != "auto":
    registry.resolve(backend, strategy)
  return 0


def cmd_experiments(args: argparse.Namespace) -> int:
  """Lists the shipped experiments, or prints the one named."""
  from recsys import experiments_catalog as catalog  # pylint: disable=g-import-not-at-top

  if args.name:
    try:
      sys.stdout.write(catalog.read_experiment(args.name))
    except catalog.UnknownExperimentError as e:
      print(f"recsys experiments: {e}", file=sys.stderr)
      return 2
    return 0
  shipped = catalog.list_experiments()
  width = max(len(x.name) for x in shipped)
  print(f"experiments shipped with recsys ({catalog.EXPERIMENTS_DIR}):")
  for x in shipped:
    print(f"  {x.name:<{width}}  {x.summary}")
  print(
    "\nuse: recsys train --gin_file synthetic_dlrm.gin --model_dir runs/demo;"
    " print one: recsys experiments NAME"
  )
  return 0


def cmd_launch(args: argparse.Namespace) -> int:
  from recsys import launch as launch_lib  # pylint: disable=g-import-not-at-top

  try:
    return launch_lib.run(args)
  except launch_lib.LaunchError as e:
    print(f"recsys launch: {e}", file=sys.stderr)
    return 2


COMMANDS = {
  "train": cmd_train,
  "evaluate": cmd_evaluate,
  "export": cmd_export,
  "info": cmd_info,
}


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the `recsys` console script and `python -m recsys`."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["benchmark"]:  # its own flags: --help there
    if argv[1:2] != ["movielens"]:
      print("recsys benchmark: choose one: movielens", file=sys.stderr)
      return 2
    from recsys.tools import movielens_benchmark  # pylint: disable=g-import-not-at-top

    movielens_benchmark.main(argv[2:], prog="recsys benchmark movielens")
    return 0
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command == "launch":  # starts processes; needs no TensorFlow here
    return cmd_launch(args)
  if args.command == "experiments":  # reads files; needs no TensorFlow
    return cmd_experiments(args)
  try:
    with _sigterm_exits_143():
      early = _check_files(args)  # seconds before TensorFlow's start-up
      return early if early is not None else _run_command(args)
  except KeyboardInterrupt:  # Ctrl-C outside the training loop
    print(
      f"recsys {args.command}: interrupted (Ctrl-C); checkpoints already "
      "saved are kept.",
      file=sys.stderr,
    )
    return INTERRUPTED_EXIT_CODE


def _check_files(args: argparse.Namespace) -> int | None:
  """The exit status of a gin file or model dir that cannot be used, found
  before TensorFlow is imported (`cli_checks`); None: go on."""
  from recsys import cli_checks  # pylint: disable=g-import-not-at-top

  try:
    cli_checks.check(
      args.command, args.gin_file, getattr(args, "model_dir", None)
    )
  except cli_checks.GinFileNotFoundError as e:
    print(
      f"recsys {args.command}: gin configuration error:\n{e}", file=sys.stderr
    )
    return 2
  except cli_checks.ModelDirNotFoundError as e:
    return _report(args.command, e)
  return None


def _run_command(args: argparse.Namespace) -> int:
  """Runs a TensorFlow command; errors become a message and an exit status."""
  _configure_runtime(args)
  from recsys import config  # pylint: disable=g-import-not-at-top

  try:
    return COMMANDS[args.command](args)
  except config.GinConfigError as e:
    if args.verbose:
      raise
    print(
      f"recsys {args.command}: gin configuration error:\n{e}", file=sys.stderr
    )
    return 2
  except (ValueError, RuntimeError, OSError, FloatingPointError) as e:
    exit_code = getattr(e, "exit_code", None)
    if exit_code:  # a clean stop, e.g. TrainingPreempted
      print(f"recsys {args.command}: {e}", file=sys.stderr)
      return exit_code
    if args.verbose:
      raise
    return _report(args.command, e, 2 if _is_configuration_error(e) else 1)
  except Exception as e:  # noqa: BLE001 - TF's errors raised inside a step
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if args.verbose or not isinstance(e, tf.errors.OpError):
      raise
    return _report(args.command, e)


def _report(command: str, error: BaseException, exit_code: int = 1) -> int:
  """Prints a failed command's error in one line; returns `exit_code`."""
  print(
    f"recsys {command}: {type(error).__name__}: {_short(error)}\n(run "
    "with --verbose for the traceback)",
    file=sys.stderr,
  )
  return exit_code


def _is_configuration_error(error: BaseException) -> bool:
  """Whether the settings asked for what cannot be (exit status 2, as gin
  and flag errors): an unknown backend, option or preset, a backend that
  cannot run under this strategy, any `recsys.errors.SettingsError`
  (trainer settings that do not fit, a placement or memory setting that
  cannot be), whichever command meets it."""
  from backends import base, registry  # pylint: disable=g-import-not-at-top
  from recsys import errors  # pylint: disable=g-import-not-at-top

  return isinstance(
    error,
    (
      registry.UnknownBackendError,
      registry.UnknownBackendOptionError,
      base.UnsupportedConfigError,
      base.BackendUnavailableError,
      errors.SettingsError,
    ),
  ) and not isinstance(error, base.UnsupportedInputError)


def _short(error: BaseException) -> str:
  """An error's own message: TF's OpErrors without their graph-node trail,
  without the "In call to configurable ..." line gin adds."""
  from recsys import _gin_compat  # pylint: disable=g-import-not-at-top

  message = getattr(error, "message", None) or str(error)
  message = _gin_compat.without_call_trail(str(message))
  kept = [
    line
    for line in str(message).splitlines()
    if line.strip()
    and not line.lstrip().startswith(("[[", "\t [[", "In call to configurable"))
    and "Op:__inference" not in line
  ]
  return "\n".join(kept) or str(error)


if __name__ == "__main__":
  sys.exit(main())
