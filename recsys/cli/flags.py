"""The flags several `recsys` commands share, declared once.

Each command module adds its own flags and calls these for the shared
groups: the gin files and bindings, the runtime flags (TPU, backend,
threads, verbosity), and the ways past a refusal (`--allow_changed_settings`,
`--skip_memory_check`) that every command meeting it takes.
"""

import argparse

from recsys import ranges
from recsys.process import console


def add_gin_flags(parser: argparse.ArgumentParser, required: bool) -> None:
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
  parser.add_argument(
    "--allow_unused_bindings",
    action="store_true",
    help="go on (with a warning) although a gin binding is read by nothing "
    "in the run, e.g. a parameter of a model it does not train or a "
    "misspelt scope; refused by default, naming it. A gin file marks a "
    "binding it makes for only some runs with '# optional' on its line.",
  )


def add_runtime_flags(parser: argparse.ArgumentParser) -> None:
  """--tpu, --backend, the thread counts and --verbosity
  (`recsys.process.startup` applies the threads, `recsys.process.console`
  the verbosity)."""
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
    "tpu_embedding, tpu_embedding_v0, parameter_servers, serving) "
    "instead of gin's train.backend / 'auto'.",
  )
  parser.add_argument(
    "--intra_op_threads",
    type=thread_count,
    default=0,
    help="TensorFlow intra-op threads (0: automatic: 1 on a "
    "machine with 2 cores or fewer, else TF's default).",
  )
  parser.add_argument(
    "--inter_op_threads",
    type=thread_count,
    default=0,
    help="TensorFlow inter-op threads (0: automatic: 2 on a "
    "machine with 2 cores or fewer, else TF's default).",
  )
  add_verbose(parser)


def add_verbose(parser: argparse.ArgumentParser) -> None:
  """--verbosity and its short form -v (`recsys.process.console`)."""
  parser.add_argument(
    "--verbosity",
    choices=console.VERBOSITIES,
    default=console.DEFAULT_VERBOSITY,
    help="brief (default): the devices, the embedding backend and its "
    "memory plan, progress, and one line with the result; info: every log "
    "line of recsys too (rates, checkpoints, evaluations, memory); debug: "
    "also TensorFlow's own logs and full tracebacks.",
  )
  parser.add_argument(
    "-v",
    "--verbose",
    action="store_const",
    dest="verbosity",
    const="debug",
    help="the same as --verbosity debug.",
  )


def add_restore_refusal_flags(
  parser: argparse.ArgumentParser, command: str
) -> None:
  """The ways past the refusals of a command that restores a run (evaluate,
  export): --allow_changed_settings and --skip_memory_check."""
  parser.add_argument(
    "--allow_changed_settings",
    action="store_true",
    help=f"{command} although settings that change the math (data, split, "
    "features, model, ...) or the data files differ from those the run "
    "trained with; refused by default, naming them. Allowed changes are "
    "recorded in the model dir (changed_settings.jsonl) and the output.",
  )
  add_skip_memory_check(parser)


def add_skip_memory_check(parser: argparse.ArgumentParser) -> None:
  """The way past the memory check every command that builds tables runs
  (the refusal names this flag, so each of them takes it)."""
  parser.add_argument(
    "--skip_memory_check",
    action="store_true",
    help="build the embedding tables even if their memory plan exceeds "
    "this host's memory (refused by default, naming the tables).",
  )


class Ranged:
  """An argparse type: a number within a declared range (`recsys.ranges`),
  the one mechanism of the gin settings; argparse refuses anything else
  naming the flag, with exit status 2.

  Attributes:
    spec: the range (an `Int` or a `Real`).
    what: how the refusal says it (default: `spec.describe()`).
  """

  def __init__(self, spec: ranges.Spec, what: str | None = None):
    self.spec = spec
    self.what = what or spec.describe()

  def __call__(self, text: str) -> int | float:
    value: int | float | None
    try:
      value = int(text) if isinstance(self.spec, ranges.Int) else float(text)
    except ValueError:
      value = None
    if value is None or not self.spec.accepts(value):
      raise argparse.ArgumentTypeError(f"{text!r} is not {self.what}")
    return value


#: `recsys export --k`: candidates per query.
positive_int = Ranged(ranges.Int(1), "a positive integer")
#: TensorFlow's thread counts (0: automatic).
thread_count = Ranged(ranges.Int(0, 1024, note="0: automatic"))
