"""Evaluating a restored run's model: every example of the eval split once.

`Evaluator` scores a `RestoredRun`'s model on its eval source: the compiled
eval step (lookup, model, masked loss and metrics; XLA-compiled when the
run's compile plan says so), the loop over the distributed eval batches
(padded and masked, `recsys.run.eval_padding`, so the last partial batch
counts once), and the results as flat `eval/` metrics. `recsys evaluate`
calls `evaluate_restored`; the training controller calls the Trainer's
evaluator at its eval steps (`recsys.training.controller`).

Example:
  >>> run = RestoredRun("runs/demo", SyntheticCTR(), DLRM)
  >>> results, changes = evaluate_restored(run)
  >>> results["eval/auc"], results["step"]
"""

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

from recsys._keras import keras, tf
from recsys.data import errors as data_errors
from recsys.data import pipeline as data_pipeline
from recsys.model_dir.run_checks import RunChanges
from recsys.models.loss_inputs import LossInputs
from recsys.process import console
from recsys.run import run_summaries
from recsys.run.restored import RestoredRun
from recsys.serving.lookup import map_batch_ids, maps_ids, split_batch
from recsys.train_settings import TrainerConfigError

log = logging.getLogger("recsys.training")


@contextlib.contextmanager
def quiet_dataset_options_warning() -> Iterator[None]:
  """Hides one UserWarning of TF's that says nothing about the run.

  Iterating a distributed dataset of several replicas inside a `tf.function`
  (the evaluation loop) makes TF's own `OwnedMultiDeviceIterator` read
  `dataset.options()` while tracing, and `options()` warns that in graph
  mode it returns the options known at graph construction: every
  multi-replica evaluation printed it. Other warnings pass.
  """
  with warnings.catch_warnings():
    warnings.filterwarnings(
      "ignore",
      message="To make it possible to preserve tf.data options",
      category=UserWarning,
    )
    yield


class Evaluator:
  """Evaluates a restored run's model on `eval_steps` batches of its eval
  source (None: all of it).

  Args:
    run: the restored run (its strategy, backend, model, eval source and
      settings: `eval_batch_size`, `eval_steps`, `exclude_seen`).
  """

  def __init__(self, run: RestoredRun):
    self.run = run
    with run.strategy.scope():
      # The masked per-example losses are summed and the real examples
      # counted; `evaluate` divides (eval batches differ from training's).
      self.eval_loss_sum = keras.metrics.Sum("eval_loss_sum")
      self.eval_examples = keras.metrics.Sum("eval_examples", dtype=tf.int64)
      # `model.losses` as each replica step computes them (weight
      # regularizers, activity regularizers, `add_loss`): read inside the
      # step, where the losses of that batch's call live, and averaged.
      self.eval_regularization = keras.metrics.Mean("eval_regularization")
    self._names = list(run.backend.feature_config)
    self._maps_ids = maps_ids(run.backend)
    self._backend_lookup = tf.autograph.experimental.do_not_convert(
      run.backend.lookup
    )
    self._replica_step = self.eval_step
    if run.compile_plan.compile_steps:
      self._replica_step = tf.function(self.eval_step, jit_compile=True)
    self.eval_loop = tf.function(
      self._coordinator_loop
      if run.coordinator is not None
      else self._replicated_loop
    )
    self._datasets: dict[bool, Any] = {}

  def eval_step(self, batch) -> None:
    """One replica's eval step on a masked batch `(features, labels, mask)`.

    Updates `model.metrics` (weighted by the mask), the sum of the real
    examples' losses (`eval_loss_sum`, regularization left out), their
    count (`eval_examples`; padding rows count for nothing) and the mean of
    the model's regularization losses (`eval_regularization`: an activity
    regularizer sees the padded batch).
    """
    features, labels, mask = _with_batch_rows(batch, self._rows_per_step())
    ids, weights = split_batch((features, labels), self._names)
    acts = self._backend_lookup(ids, weights, training=False)
    # The mask is the examples' weight: padding rows weigh 0.
    per_example = self.run.model.per_example_loss(
      LossInputs(acts, features, labels, sample_weight=mask, training=False)
    )
    self.eval_loss_sum.update_state(tf.reduce_sum(per_example))
    self.eval_examples.update_state(tf.reduce_sum(tf.cast(mask > 0, tf.int64)))
    if self.run.model.losses:
      self.eval_regularization.update_state(tf.add_n(self.run.model.losses))

  @tf.autograph.experimental.do_not_convert
  def _rows_per_step(self) -> int:
    """Rows of one eval step's batch: every batch is padded whole."""
    if self.run.coordinator is not None:
      return self.run.eval_batch_size
    return self.run.eval_batch_size // self.run.strategy.num_replicas_in_sync

  @tf.autograph.experimental.do_not_convert
  def _map_ids(self, batch):
    """Dynamic tables: the batch's raw ids as rows (the indices unchanged)."""
    return map_batch_ids(self.run.backend, batch, self._names, training=False)

  def _replicated_loop(self, dataset) -> None:
    for batch in dataset:
      if self._maps_ids:  # on the host, before the (compiled) replica step
        batch = self._map_ids(batch)
      self.run.strategy.run(self._replica_step, args=(batch,))

  def _coordinator_loop(self, dataset) -> None:
    # Parameter servers: on the coordinator, outside `strategy.run`; it
    # reads the variables on the parameter servers and updates the metrics
    # there.
    for batch in dataset:
      if self._maps_ids:  # read-only, on the index's parameter server
        batch = self._map_ids(batch)
      self.eval_step(batch)

  def evaluate(self, exclude_seen: bool | None = None) -> dict[str, float]:
    """Evaluates the model now.

    Args:
      exclude_seen: the retrieval protocol of this evaluation (None: the
        run's `exclude_seen` setting); both protocols can score one model.

    Returns:
      `eval/loss` (the mean per-example loss of the examples scored, plus
      the regularization term as in `train/loss`), `eval/<metric>` for each
      of the model's metrics (AUC, log-loss, accuracy / RMSE / top-k hit
      rates) and `eval/examples`, the number of examples scored; with
      `exclude_seen`, the hit rates rank only candidates each user did not
      interact with in training, and `eval/exclude_seen` is 1.

    Raises:
      TrainerConfigError: `exclude_seen` for a ranking model.
      EmptyEvalSetError: the eval split has no example.
    """
    run = self.run
    if exclude_seen is None:
      exclude_seen = run.settings.exclude_seen
    exclude_seen = bool(exclude_seen)
    if exclude_seen and not run.is_retrieval:
      raise TrainerConfigError(
        "exclude_seen applies to retrieval models; "
        f"{type(run.model).__name__} is a ranking model."
      )
    run.evaluation.before_evaluation()
    if exclude_seen not in self._datasets:
      # Built once: building the input pipeline and tracing the eval loop
      # cost seconds; a distributed dataset can be iterated many times.
      self._datasets[exclude_seen] = run.distribute(
        run.eval_source,
        run.eval_batch_size,
        training=False,
        take_steps=run.settings.eval_steps,
        transform=run.evaluation.batch_transform(exclude_seen),
      )
    self.eval_loss_sum.reset_state()
    self.eval_examples.reset_state()
    self.eval_regularization.reset_state()
    for m in run.model.metrics:
      m.reset_state()
    with (
      run.memory.phase("evaluate"),
      quiet_dataset_options_warning(),  # traced on first use
    ):
      self.eval_loop(self._datasets[exclude_seen])
    examples = int(self.eval_examples.result())
    if not examples:
      raise data_errors.EmptyEvalSetError(
        data_pipeline.empty_eval_message(run.eval_source)
      )
    results = run_summaries.flat_results(
      run.model.metrics, "eval", run.evaluation.ks
    )
    results["eval/loss"] = float(
      self.eval_loss_sum.result()
    ) / examples + float(self.eval_regularization.result())
    if run.model.losses:
      results["eval/regularization_loss"] = float(
        self.eval_regularization.result()
      )
    results["eval/examples"] = float(examples)
    if exclude_seen:
      results["eval/exclude_seen"] = 1.0
    log.info("evaluated %d examples", examples)
    return results

  def optimum(self) -> dict[str, float]:
    """The eval source's known best metrics (`DataSource.known_optimum`)."""
    return run_summaries.known_optimum(
      self.run.eval_source, self.run.evaluation.ks
    )


def evaluate_restored(
  run: RestoredRun,
  other_data: bool = False,
  exclude_seen: bool | None = None,
) -> tuple[dict[str, Any], RunChanges]:
  """Evaluates a restored run's checkpoint, on the run's own data.

  The settings and input files are first checked against the run's
  (`RestoredRun.check_restored`): evaluating a model on a split it trained
  on is refused unless allowed.

  Args:
    run: a run restored from a model dir with a checkpoint.
    other_data: evaluate on other data on purpose (data settings and files
      may differ; `recsys evaluate --eval_on`).
    exclude_seen: the retrieval protocol (None: the run's setting).

  Returns:
    `(results, changes)`: the eval metrics with `step` (and
    `changed_settings`, the lines of `changes`, when something differs
    from the run), and the `run_checks.RunChanges` to record.

  Raises:
    FileNotFoundError: the model dir has no checkpoint.
    ChangedSettingsError: settings or files differ and that is not allowed.
  """
  step = run.require_checkpoint("evaluate")
  changes = run.check_restored("evaluate", other_data=other_data)
  log.info(
    "evaluating step %d of %s ...",
    step,
    run.model_dir,
    extra=console.shown_as(console.STATUS),
  )
  results: dict[str, Any] = dict(Evaluator(run).evaluate(exclude_seen))
  results["step"] = step
  if changes:
    results["changed_settings"] = changes.lines()
  return results, changes


@tf.autograph.experimental.do_not_convert
def _with_batch_rows(batch: Any, rows: int) -> Any:
  """`batch` with its dense tensors' unknown first dimension set to `rows`.

  A finite distributed dataset hands its replicas batches of unknown size
  (tf.distribute's handling of a last partial batch), though every eval
  batch is padded whole: without the static size a row-sharded table's
  exchange fell back to all-gather at evaluation, with a warning per table.
  """

  def fix(t):
    if isinstance(t, tf.Tensor) and t.shape.rank and t.shape[0] is None:
      return tf.ensure_shape(t, [rows] + t.shape[1:].as_list())
    return t

  return tf.nest.map_structure(fix, batch)
