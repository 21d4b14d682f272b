"""`recsys info`: what `recsys train` with the same flags would run on."""

import argparse
from typing import Any

from recsys.cli import command, flags, version


def _add_flags(parser: argparse.ArgumentParser) -> None:
  flags.add_gin_flags(parser, required=False)
  flags.add_runtime_flags(parser)


COMMAND = command.Command(
  name="info",
  help="print versions, devices, strategy and backend choice.",
  description="Print what recsys detects here: versions, devices, the "
  "strategy and the embedding backend it would pick and why; with "
  "--gin_file also the experiment's tables and their memory plan.",
  epilog="example:\n  recsys info\n  recsys info "
  "--gin_file experiments/synthetic_dlrm.gin",
  add_flags=_add_flags,
  starts_tensorflow=True,
)


def run(args: argparse.Namespace) -> int:
  """What `recsys train` with the same flags would run on, and its tables.

  With gin files, the strategy is the one `train` builds from them (e.g.
  cpu_2replicas.gin's two mirrored replicas), and the memory plan comes
  from the data source, or from its gin settings when its files are not
  there yet (a folder macro may stay unbound).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.run import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

  lines = [
    version.version_line(tf.__version__, tf.keras.__name__.split(".")[0])
  ]
  missing = config.register_all()
  if missing:
    lines.append(f"could not import: {', '.join(missing)}")
  feature_config, optimizer, backend = None, None, args.backend or "auto"
  plan, note = None, ""
  if args.gin_file:
    from recsys.run.configured import (  # pylint: disable=g-import-not-at-top
      configured_embedding,
      configured_feature_specs,
      configured_plan,
      configured_strategy,
    )

    # Not finalized: a data folder's required macro may stay unbound here.
    config.parse(args.gin_file, args.gin_bindings, finalize=False)
    # The run's strategy (train.num_cpu_replicas), before TF's runtime starts.
    strategy, _ = configured_strategy(args.tpu)
    specs = configured_feature_specs()  # the source built once
    feature_config, optimizer, backend, note = configured_embedding(
      args.backend, specs
    )
    # What `train` plans and checks, refused as `train` refuses it.
    plan = configured_plan(feature_config, optimizer, backend, strategy, specs)
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
  from backends.tensorcore import kernels  # pylint: disable=g-import-not-at-top

  lines.append(f"fused CPU kernels (tensorcore on CPU): {kernels.status()}")
  print("\n".join(lines))
  # A forced backend that cannot run here: the report says why, and the
  # command ends as `recsys train` would (BackendUnavailableError, exit 2).
  if backend != "auto":
    registry.resolve(backend, strategy)
  print(_summary(registry.decide(backend, strategy)[0], strategy, plan))
  return 0


def _summary(backend: str, strategy: Any, plan: Any) -> str:
  """The report's last line: what `recsys train` would run on and, with
  an experiment, whether its tables fit."""
  where = (
    f"recsys info: recsys train would use the {backend} backend on "
    f"{strategy.num_replicas_in_sync} replica(s)"
  )
  if plan is None:
    return f"{where} (--gin_file EXPERIMENT adds its tables' memory plan)."
  from backends import placement  # pylint: disable=g-import-not-at-top

  verdict = {True: "they fit", False: "they do not fit", None: ""}[plan.fits]
  return (
    f"{where}; its tables take {placement.human_bytes(plan.bytes_per_device)}"
    f" per device{', ' + verdict if verdict else ''}."
  )
