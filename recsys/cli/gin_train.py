"""From a command's flags to the gin-configured `train` call.

`--gin_file` (or, for evaluate and export, the model dir's own
operative_config.gin), then `--gin_bindings` and one binding per settings
switch (`--no_progress`, `--skip_memory_check`, ...), then `train` with the
strategy `--tpu` asks for.
"""

import argparse
import os
from collections.abc import Sequence


def gin_files(args: argparse.Namespace) -> list[str]:
  """--gin_file, or the model dir's operative config for evaluate/export."""
  if args.gin_file:
    return list(args.gin_file)
  model_dir = getattr(args, "model_dir", None)
  if model_dir:
    from recsys.gin_config import untrusted as gin_untrusted  # pylint: disable=g-import-not-at-top
    from recsys.model_dir import run_dir  # pylint: disable=g-import-not-at-top

    path = run_dir.RunDir(model_dir).operative_config
    if os.path.isfile(path):
      return [gin_untrusted.check_bindings_only(path)]  # no imports
    raise FileNotFoundError(
      f"{path} does not exist: pass --gin_file (the experiment's gin files) "
      f"or point --model_dir at a directory written by `recsys train`."
    )
  return []


def bindings(args: argparse.Namespace) -> list[str]:
  """--gin_bindings, then one binding per settings switch given.

  The switches are declared with their settings (`settings.flag_settings`):
  e.g. `--no_progress` binds `train.progress_bar = False`.
  """
  from recsys import train_settings as settings  # pylint: disable=g-import-not-at-top

  found = list(args.gin_bindings)
  for flag, (name, value) in settings.flag_settings().items():
    if getattr(args, flag, False):
      found.append(f"train.{name} = {value!r}")
  return found


def configured(
  args: argparse.Namespace, extra_bindings: Sequence[str] = (), **kwargs
):
  """Parses the command's gin files, then calls the gin-configured `train`
  (`recsys.run.configured.configured_run`): the run's `ConfiguredRun`.

  Nothing of `recsys.training` is loaded: evaluate and export restore the
  run (`.restored()`), `recsys train` hands it to the Trainer (`train`).
  The strategy is built here, from `--tpu` (or the config's `train.tpu`)
  and the config's `train.num_cpu_replicas`, and passed to `train`: before
  gin calls it, which first builds its arguments (see
  `configured_strategy`); the flag never goes into the gin config.

  Args:
    args: the parsed flags (gin files and bindings, model dir, runtime flags).
    extra_bindings: bindings the command adds after the user's.
    **kwargs: arguments of `configured_run` besides `model_dir` (e.g. an
      already built `strategy`, the `action`); they override `--backend`.

  Raises:
    config.GinConfigError: a gin error, with the gin files and bindings named.
  """
  from recsys import _tf_startup, config  # pylint: disable=g-import-not-at-top
  from recsys.run import configured as configured_lib  # pylint: disable=g-import-not-at-top

  files, given = gin_files(args), bindings(args)
  config.parse(files, given + list(extra_bindings))
  if "strategy" not in kwargs:
    kwargs["strategy"], _ = configured_lib.configured_strategy(
      getattr(args, "tpu", None)
    )
  if getattr(args, "verbosity", None) != "debug":  # the runtime is set up
    _tf_startup.emit_first_use_notices()
  if getattr(args, "backend", None):
    kwargs.setdefault("backend", args.backend)
  return config.call(
    configured_lib.configured_run,
    files,
    given,
    model_dir=args.model_dir,
    **kwargs,
  )


def call_train(args: argparse.Namespace) -> dict[str, float]:
  """`recsys train`: the configured run trained by the Trainer; its final
  metrics."""
  from recsys.training.train import build_trainer  # pylint: disable=g-import-not-at-top

  return build_trainer(configured(args, action="train")).train()
