"""A run's metrics and TensorBoard records: values, settings, metrics.json.

Metrics: Keras metrics as flat `{prefix/name: float}` dicts
(`flat_results`), written as TensorBoard scalars by the chief's
`SummaryWriters` and assembled, with what the run ran on and the data's
known optimum, into `metrics.json` (`run_metrics`, `known_optimum`).

Settings, so runs compare side by side: the operative config is written as
a text summary (rendered as a code block by TensorBoard's text plugin), and,
when the `tensorboard` package is installed, the gin bindings with plain
values (numbers, strings, booleans) go to the HParams plugin.

Example:
  >>> writers = SummaryWriters(run_dir, enabled=True)
  >>> writers.write("train", flat_results(model.metrics, "train"), step=10)
  >>> with writer.as_default(step=0):
  ...   write_config_summaries(gin.operative_config_str(), step=0)
"""

import ast
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from recsys._keras import keras, tf
from recsys.data.pipeline import DataSource
from recsys.model_dir import run_configs
from recsys.model_dir import run_dir as run_dir_lib

log = logging.getLogger("recsys.training")

CONFIG_TAG = "operative_config"

HParam = int | float | str | bool


def hparams(config_text: str) -> dict[str, HParam]:
  """The bindings of an operative config whose values are plain scalars."""
  out = {}
  for key, text in run_configs.bindings(config_text).items():
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      continue  # references (@Class), macros, objects
    if isinstance(value, (bool, int, float, str)):
      out[key] = value
  return out


def write_config_summaries(config_text: str, step: int) -> None:
  """Writes the config as text (and HParams) into the default summary writer."""
  metadata = tf.compat.v1.SummaryMetadata()
  metadata.plugin_data.plugin_name = "text"
  markdown = "\n".join("    " + line for line in config_text.splitlines())
  tf.summary.write(
    CONFIG_TAG,
    tf.constant(markdown),
    step=step,
    metadata=metadata.SerializeToString(),
  )
  try:
    from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top
  except ImportError:
    log.info(
      "HParams not written: the tensorboard package is not installed "
      "(pip install tensorboard); the config is in the text summary."
    )
    return
  values = hparams(config_text)
  if values:
    hp.hparams(values)


# -- metrics -------------------------------------------------------------------


def flat_results(
  metrics, prefix: str, ks: tuple[int, ...] = ()
) -> dict[str, float]:
  """{prefix/name: float} for Keras metrics; vector results get `_i` names.

  A vector result with one value per top-k cut-off in `ks` (a retrieval
  model's hit rates) gets `_top<k>` names instead.
  """
  out = {}
  for metric in metrics:
    result = metric.result()
    items: Iterable[tuple[Any, Any]]
    if isinstance(result, Mapping):
      items = result.items()
    else:
      items = [(metric.name, result)]
    for name, value in items:
      value = np.asarray(value, dtype=np.float64).reshape(-1)
      if value.size == 1:
        out[f"{prefix}/{name}"] = float(value[0])
        continue
      for i, v in enumerate(value):
        suffix = f"top{ks[i]}" if len(ks) == value.size else str(i)
        out[f"{prefix}/{name}_{suffix}"] = float(v)
  return out


def throughput(
  loops: Sequence[tuple[int, float]], seconds: float, global_batch_size: int
) -> dict[str, float]:
  """A run's training speed, two ways, and a log line saying which is which.

  Args:
    loops: `(steps, seconds)` of each compiled loop this process ran.
    seconds: wall time from the start of training to the end of its last
      loop (tracing, periodic evaluations and checkpoints included).
    global_batch_size: examples per step.

  Returns:
    `examples_per_second_steady`: the loops after the first, which traces
    (and, under XLA, compiles) the step: the rate a long run settles at.
    `examples_per_second_whole_run`: every step this process trained over
    `seconds`: what a short run got. Either is left out without its loops.
  """
  out = {}
  steady = loops[1:]
  steady_seconds = sum(t for _, t in steady)
  if steady_seconds > 0:
    out["examples_per_second_steady"] = (
      sum(n for n, _ in steady) * global_batch_size / steady_seconds
    )
  steps = sum(n for n, _ in loops)
  if steps and seconds > 0:
    out["examples_per_second_whole_run"] = steps * global_batch_size / seconds
  if steps:
    rate = out.get("examples_per_second_whole_run", float("nan"))
    steady_text = (
      f"{out['examples_per_second_steady']:,.0f} examples/s steady (the "
      "loops after the first)"
      if "examples_per_second_steady" in out
      else "one loop only, so no steady rate"
    )
    log.info(
      "trained %d steps in %.1f s: %s examples/s over the whole run "
      "(tracing or compiling the step, evaluations and checkpoints "
      "included); %s",
      steps,
      seconds,
      f"{rate:,.0f}",
      steady_text,
    )
  return out


def learning_rate(optimizer: Any) -> float:
  """The dense optimizer's current learning rate (NaN: it has none)."""
  lr = getattr(optimizer, "learning_rate", None)
  if lr is None:
    return float("nan")
  if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
    return float(lr(optimizer.iterations))
  return float(tf.convert_to_tensor(lr))


def known_optimum(source: Any, ks: tuple[int, ...] = ()) -> dict[str, float]:
  """The source's known best metrics (`DataSource.known_optimum`)."""
  if not isinstance(source, DataSource):
    return {}
  optimum = source.known_optimum(ks)
  return {k: float(v) for k, v in optimum.items()}


#: A retrieval evaluation's top-k hit rate, both namings: the Trainer's
#: (`eval/hit_rate_top10`, `flat_results` with the model's `ks`) and TFRS's
#: metric dict (`eval/hit_rate/top_10_categorical_accuracy`).
_HIT_RATE = re.compile(
  r"^eval/hit_rate(?:_top(\d+)|/top_(\d+)_categorical_accuracy)$"
)


def hit_rates(metrics: Mapping[str, Any]) -> dict[int, float]:
  """A retrieval evaluation's top-k hit rates by k ({} for ranking)."""
  out = {}
  for key, value in metrics.items():
    m = _HIT_RATE.match(key)
    if m:
      out[int(m.group(1) or m.group(2))] = float(value)
  return dict(sorted(out.items()))


def against_optimum(metrics: Mapping[str, Any]) -> str:
  """The metric reached next to the best the data allows, in one phrase.

  For sources that know their optimum (`known_optimum`: synthetic data):
  the eval AUC next to `bayes_auc`, or a retrieval model's top-10 hit rate
  (else its smallest k's) next to `best_hit_rate_<k>`; "" otherwise. What
  `recsys train` ends on, so a new user sees how good the run is.
  """
  if "bayes_auc" in metrics and "eval/auc" in metrics:
    name, value, best = "AUC", metrics["eval/auc"], metrics["bayes_auc"]
  else:
    rates = hit_rates(metrics)
    ks = [k for k in rates if f"best_hit_rate_{k}" in metrics]
    if not ks:
      return ""
    k = 10 if 10 in ks else ks[0]
    name = f"top-{k} hit rate"
    value, best = rates[k], metrics[f"best_hit_rate_{k}"]
  at = f" at step {metrics['step']}" if "step" in metrics else ""
  return f"{name} {value:.4f}{at}; the best possible on this data: {best:.4f}"


def result_line(metrics: Mapping[str, Any]) -> str:
  """An evaluation's key metric(s) in one phrase ("" without any): next to
  the best the data allows where it is known (`against_optimum`), else the
  AUC, the RMSE, the top-10 and top-100 hit rates, or the eval loss."""
  reached = against_optimum(metrics)
  if reached:
    return reached
  at = f" at step {metrics['step']}" if "step" in metrics else ""
  rates = hit_rates(metrics)
  if "eval/auc" in metrics:
    return f"AUC {metrics['eval/auc']:.4f}{at}"
  if "eval/rmse" in metrics:
    return f"RMSE {metrics['eval/rmse']:.4f}{at}"
  if rates:
    ks = [k for k in (10, 100) if k in rates] or list(rates)[:1]
    seen = (
      " (items each user had in training excluded)"
      if metrics.get("eval/exclude_seen")
      else ""
    )
    return (
      f"top-{' / top-'.join(map(str, ks))} hit rate"
      f"{'s' if len(ks) > 1 else ''} "
      f"{' / '.join(f'{rates[k]:.4f}' for k in ks)}{at}{seen}"
    )
  if "eval/loss" in metrics:
    return f"eval loss {metrics['eval/loss']:.4f}{at}"
  return ""


def run_metrics(
  metrics: Mapping[str, float],
  backend: str,
  strategy: tf.distribute.Strategy,
  global_batch_size: int,
) -> dict[str, Any]:
  """What `metrics.json` holds: `metrics` and what the run ran on."""
  return {
    "backend": backend,
    "strategy": type(strategy).__name__,
    "replicas": strategy.num_replicas_in_sync,
    "global_batch_size": global_batch_size,
    **metrics,
  }


# -- TensorBoard ---------------------------------------------------------------


def scalar_summary(name: str, value: float, step: int) -> None:
  """A TensorBoard scalar, with or without the tensorboard package installed.

  `tf.summary.scalar` needs the tensorboard package; without it, write the
  same record (a float32 scalar tagged for the "scalars" plugin) directly.
  """
  metadata = tf.compat.v1.SummaryMetadata()
  metadata.plugin_data.plugin_name = "scalars"
  tf.summary.write(
    name,
    tf.constant(value, tf.float32),
    step=step,
    metadata=metadata.SerializeToString(),
  )


class SummaryWriters:
  """The run's TensorBoard writers, one per `run_dir.SUMMARY_KINDS`.

  Disabled (summaries off, or a non-chief worker), they write nothing.
  """

  def __init__(self, run_dir: run_dir_lib.RunDir, enabled: bool):
    self._writers = None
    if enabled:
      self._writers = {
        kind: tf.summary.create_file_writer(run_dir.summaries(kind))
        for kind in run_dir_lib.SUMMARY_KINDS
      }

  def __bool__(self) -> bool:
    return self._writers is not None

  def write(self, kind: str, values: Mapping[str, float], step: int) -> None:
    """`values` as scalars (named without their `prefix/`) at `step`."""
    if not self._writers:
      return
    with self._writers[kind].as_default(step=step):
      for name, value in values.items():
        scalar_summary(name.split("/", 1)[-1], value, step)
    self._writers[kind].flush()

  def write_config(self, config_text: str, step: int) -> None:
    """The operative config (and HParams) next to the training curves."""
    if not self._writers:
      return
    with self._writers["train"].as_default(step=step):
      write_config_summaries(config_text, step)
