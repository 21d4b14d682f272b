"""The Trainer: a restored run and the training loop around it.

It composes a `recsys.run.restored.RestoredRun` (the strategy, embedding
backend, model, dense optimizer, checkpoints and run folder, restored at
the newest checkpoint: what `recsys evaluate` and `recsys export` use
alone) with what training adds: the compiled step functions
(`recsys.training.loop`), TensorBoard writers (`run_summaries`), the
resume checks, and the controller (`recsys.training.controller`), which
decides when the loop evaluates (the run's
`recsys.run.evaluation.Evaluator`), saves, logs and stops.

Example:
  >>> trainer = Trainer(model_dir="/tmp/run", source=SyntheticCTR(),
  ...                   model=DLRM, global_batch_size=512, train_steps=1000)
  >>> metrics = trainer.train()
"""

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import gin

from recsys import _tf_internal
from recsys._keras import keras, tf
from recsys.errors import RecsysError
from recsys.model_dir import run_configs
from recsys.run import evaluation as evaluation_lib
from recsys.run import restored as restored_lib
from recsys.run import run_summaries, schedules
from recsys.run import strategy as strategy_lib
from recsys.train_settings import TrainSettings
from recsys.training import batch_slices as slices_lib
from recsys.training import controller as controller_lib
from recsys.training import coordinated as coordinated_lib
from recsys.training import loop as loop_lib
from recsys.training import signals as signals_lib

log = logging.getLogger("recsys.training")


class NonFiniteLossError(RecsysError, FloatingPointError):
  """A training step's loss or gradients were NaN/inf (policy "stop").

  Attributes:
    step: the failing step (1-based: the batch consumed by that step).
    last_checkpoint: path of the newest checkpoint, or None.
  """

  def __init__(self, message: str, step: int, last_checkpoint: str | None):
    super().__init__(message)
    self.step, self.last_checkpoint = step, last_checkpoint


class Trainer:
  """Trains one experiment: a restored run (`self.run`, a `RestoredRun`)
  and the training loop around it.

  Its public surface: `train()`, `evaluate()`, `save()`; `run` (the
  restored run: strategy, sources, backend, model, optimizers, step,
  checkpoints, run folder), `settings` (its `TrainSettings`), `schedule`
  (the loop's `LoopSchedule`), `evaluator`, `steps` (the compiled step
  functions); and, for the objects a caller inspects after training,
  `model` and `backend` (the run's). Everything else is read where it
  lives: `trainer.run.<part>`, `trainer.settings.<field>`.

  Args:
    model_dir: checkpoints, summaries, `operative_config.gin`, `metrics.json`.
    source: the training data source, a `recsys.data.DataSource` (or an
      unbatched `tf.data.Dataset` with the `feature_config` setting).
    model: a model class or factory, called inside `strategy.scope()` with the
      source's values of the arguments its kind declares:
      `RankingModel.TRAINER_ARGUMENTS` (`feature_specs`, `num_dense`) or
      `RetrievalModel.TRAINER_ARGUMENTS` (also `query_features`,
      `candidate_features`, `candidate_id_feature`).
    strategy: the `tf.distribute` strategy (default: the current one).
    eval_source: source for evaluation; default: `source` with training=False.
    settings: how the run trains (`TrainSettings`: batch sizes, steps,
      optimizers, backend, ...).
    **setting_values: or the settings as keywords, each a `TrainSettings`
      field (`Trainer(dir, source, DLRM, seed=1)` runs with
      `TrainSettings(seed=1)`); not together with `settings`.

  Reliability: `train()` holds an exclusive lock on the model dir (a second
  run there is refused), turns SIGTERM/Ctrl-C into a checkpoint at the exact
  step and `TrainingPreempted`, and resumes from the newest checkpoint that
  reads back whole (a truncated one is skipped with a warning, not deleted).
  Checkpoints are written by TF's `CheckpointManager`, which publishes a
  checkpoint only after all its files are written, so a crash (even SIGKILL
  during a save) loses at most the steps since the last one.
  """

  def __init__(
    self,
    model_dir: str,
    source: Any,
    model: Callable[..., keras.Model],
    strategy: tf.distribute.Strategy | None = None,
    eval_source: Any | None = None,
    settings: TrainSettings | None = None,
    **setting_values: Any,
  ):
    if settings is not None and setting_values:
      raise TypeError(
        f"Trainer: give settings= or the settings as keywords "
        f"({', '.join(sorted(setting_values))}), not both."
      )
    # Keyword callers name settings directly: Trainer(..., seed=1).
    st = settings if settings is not None else TrainSettings(**setting_values)
    self.settings = st
    # When the loop evaluates, saves and stops, the settings normalized.
    self.schedule = controller_lib.LoopSchedule.of_settings(st)
    # The run's objects, built and restored (no loop): what evaluate and
    # export use too. The Trainer adds the training loop around them.
    self.run = restored_lib.RestoredRun(
      model_dir, source, model, strategy, eval_source, st
    )
    with self.run.memory.phase("init"):
      with self.run.strategy.scope():
        self.loss_metric = keras.metrics.Mean("loss")
      self._build_steps()
      self._build_writers()
    # Scores the model when the controller asks (and `evaluate()`).
    self.evaluator = evaluation_lib.Evaluator(self.run)

  # -- the public parts besides `run` and `settings` -------------------------

  @property
  def model(self) -> keras.Model:
    """The run's model (`run.model`), trained in place."""
    return self.run.model

  @property
  def backend(self) -> Any:
    """The run's embedding backend (`run.backend`): the tables."""
    return self.run.backend

  @property
  def _global_batch_size(self) -> int:
    return int(self.settings.global_batch_size)

  # -- construction steps ----------------------------------------------------

  def _build_steps(self) -> None:
    """The compiled step functions (scheduled on workers under PS)."""
    run = self.run
    self.slice_plan = slices_lib.resolve(
      self.settings.batch_slices,
      run.model,
      run.strategy,
      run.compile_plan.compile_steps,
      self._global_batch_size,
    )
    log.info(
      "the model's loss on %d slice(s) of each batch: %s.",
      self.slice_plan.slices,
      self.slice_plan.reason,
    )
    self.steps = self._step_functions_class(
      run.strategy,
      run.model,
      run.backend,
      run.dense_optimizer,
      self._global_batch_size,
      run.global_step,
      self.loss_metric,
      nonfinite_policy=self.settings.nonfinite_policy,
      jit_compile=run.compile_plan.compile_steps,
      batch_slices=self.slice_plan.slices,
    )
    self._batches: Any = None  # the training iterator, during train()

  def _build_writers(self) -> None:
    """TensorBoard writers: the chief's, when summaries are on."""
    self._writers = run_summaries.SummaryWriters(
      self.run.run_dir, enabled=self.settings.summaries and self.run.chief
    )

  # -- checkpoints -----------------------------------------------------------

  def save(self) -> str:
    """Saves a checkpoint at the current step; returns the chief's path."""
    with self.run.memory.phase("save"):
      return self.run.checkpoints.save()

  def save_if_new(self, step: int) -> str:
    """Saves a checkpoint unless the newest one holds `step`."""
    with self.run.memory.phase("save"):
      return self.run.checkpoints.save_if_new(step)

  def _check_finite(self, reached: int) -> None:
    """Raises `NonFiniteLossError` if the loop stopped on a NaN/inf step."""
    if self.steps.nonfinite_policy != "stop":
      return
    bad = int(self.steps.first_nonfinite_step.numpy())
    if bad < 0:
      return
    latest = self.run.checkpoints.latest
    saved = (
      f"the last good checkpoint is {latest}"
      if latest
      else "no checkpoint was saved yet (set checkpoint_every)"
    )
    raise NonFiniteLossError(
      f"training step {bad} produced a NaN/inf loss or gradients (on the "
      f"batch that step reads: batch {bad - 1} of the training data counted "
      f"from 0, {self._global_batch_size} examples); training stopped at "
      f"step {reached} without saving; {saved}. Lower the learning rates, "
      "check that batch for NaN/inf dense features or extreme labels, or "
      "set train.nonfinite_policy = 'skip' to leave such steps out.",
      step=bad,
      last_checkpoint=latest,
    )

  # -- running ---------------------------------------------------------------

  def train(self) -> dict[str, float]:
    """Trains to `train_steps` (resuming), evaluates, writes metrics.json.

    When it evaluates, saves and stops is `recsys.training.controller`'s.

    A run whose checkpoint already holds `train_steps` (the same call run
    again) trains nothing: it says so, evaluates the restored model and
    keeps `metrics.json`, which the call that trained it wrote.

    Returns:
      The final metrics: `train/loss`, `train/<metric>`, `eval/<metric>`,
      `examples_per_second_steady` and `examples_per_second_whole_run`
      (`run_summaries.throughput`), `step`, `steps_trained` (by this call),
      and the source's known optimum (`bayes_auc`, ...) when it reports
      one. With nothing trained: the evaluation, `step`, `steps_trained`
      = 0 and the optimum (no `train/` or speed figures).

    Raises:
      ModelDirNotWritableError: this user may not write the model dir.
      ModelDirBusyError: another live run trains in this model dir.
      TrainingPreempted: SIGTERM or Ctrl-C arrived; a checkpoint was saved at
        the step reached (`recsys train` exits with status 143).
      NonFiniteLossError: a step had NaN/inf loss or gradients (policy
        "stop"); names the step and the last good checkpoint.
    """
    self.run.run_dir.check_writable()  # before the lock, which writes there
    lock = self.run.run_dir.lock()
    if self.run.chief:  # other workers write nothing of their own here
      lock.acquire()
    try:
      with signals_lib.StopRequests() as stop:
        return self._train(stop)
    finally:
      lock.release()

  def _train(self, stop: signals_lib.StopRequests) -> dict[str, float]:
    """`train` under the lock: the run prepared, the controller's loop from
    the restored step, then the run's final metrics written."""
    run = self.run
    step = int(run.global_step.numpy())
    self._prepare_run(step)
    if step >= self.schedule.train_steps:
      self._say_complete(step)
    self._batches = iter(
      run.distribute(
        run.source, self._global_batch_size, training=True, skip_steps=step
      )
    )
    try:
      final = self._controller().train(step, stop)
    finally:
      self._batches = None
      log.info("peak RSS of this process: %s", run.memory.describe())
    final["steps_trained"] = final["step"] - step
    final.update(self.evaluator.optimum())
    # A run trained to its end before keeps the metrics.json of that run
    # (its train/ and speed figures); a file of another step is replaced.
    if final["steps_trained"] or run.run_dir.metrics_step() != step:
      self.write_metrics(final)
    self.write_operative_config()
    return final

  def _say_complete(self, step: int) -> None:
    """Warns that the run is complete at `step`: nothing will be trained."""
    log.warning(
      "nothing to train: %s already holds step %d (train_steps = %d), so "
      "the restored model is only evaluated and metrics.json keeps the "
      "figures of the run that trained it. To train again, use another "
      "model dir, or more steps (train_steps; on the command line "
      "--gin_bindings 'train.train_steps = %d').",
      self.run.model_dir,
      step,
      self.schedule.train_steps,
      2 * step,
    )

  def _prepare_run(self, step: int) -> None:
    """Before training from `step`: a resume's changed settings checked and
    recorded and its learning-rate schedules continued, the eval split
    checked, the run's config and inputs written."""
    run = self.run
    run.run_dir.refuse_links()  # before training: refused up front
    files = run.input_fingerprints() if run.chief else {}
    if step:  # a resume: same math settings and data as the last run?
      changes = run.run_dir.check(
        "train",
        gin.operative_config_str(),
        files,
        step,
        bool(self.settings.allow_changed_settings),
      )
      self._continue_schedules(step)  # before a step is traced
      for line in changes.lines():
        log.warning("resuming with a changed setting (allowed): %s", line)
      if changes:
        run.run_dir.record_changes("train", step, changes)
    if step < self.schedule.train_steps:  # fail now, not after training
      run.eval_source.check_eval_split()
    self.write_operative_config()
    run.run_dir.write_input_files(files, step)
    # The settings next to the curves in TensorBoard.
    self._writers.write_config(gin.operative_config_str(), step)

  def _continue_schedules(self, step: int) -> None:
    """On a resume at `step`, before a step is traced: the learning-rate
    schedules go on from the rates they reached, over this run's length
    (`schedules.resumed`, from the lengths of the runs kept here)."""
    run = self.run
    runs = run_configs.run_lengths(run.model_dir)
    runs.append((step, self.schedule.train_steps))
    tables = {id(f.table): f.table for f in run.feature_config.values()}
    schedules.resume_bound(
      [run.embedding_optimizer, *(t.optimizer for t in tables.values())],
      runs,
    )
    optimizer = run.dense_optimizer
    legacy = isinstance(optimizer, keras.optimizers.legacy.Optimizer)
    with run.strategy.scope():
      dense, _ = _tf_internal.keras_learning_rate(optimizer, legacy)
    continued = schedules.resumed(dense, runs)
    if continued is not dense:
      optimizer.learning_rate = continued

  def _controller(self) -> controller_lib.Controller:
    """The loop's timing, from the run's settings: the controller runs the
    Trainer's steps and the evaluator at their steps."""
    return controller_lib.Controller(
      self,
      self.evaluator,
      self.schedule,
      self._global_batch_size,
      progress_bar=bool(self.settings.progress_bar),
    )

  # -- what the controller asks (controller.TrainingRun) ---------------------

  def run_steps(self, num_steps: int) -> None:
    """Runs `num_steps` training steps of the current `train()`'s batches;
    the loss and the model's metrics start afresh."""
    self.loss_metric.reset_state()
    for m in self.model.metrics:
      m.reset_state()
    with self.run.memory.phase("train"):
      self.steps.run_train_steps(self._batches, num_steps)

  def check_steps(self) -> None:
    """Raises if the steps just run read invalid ids or went NaN/inf."""
    self.backend.raise_for_invalid_inputs()  # before anything is saved
    self._check_finite(int(self.run.global_step.numpy()))

  def end_training(self) -> None:
    """Releases the training batches' input pipeline (its prefetch threads
    keep preparing batches no step will take) before the final evaluation:
    its teardown took 0-5 s, silently, after the final evaluation's line."""
    self._batches = None

  def train_results(self) -> dict[str, float]:
    """The metrics of the steps since `run_steps`: `train/<metric>` (those
    the model's hooks keep), `train/loss`, `learning_rate` (the dense
    optimizer's, when the model has dense weights it trains), with policy
    "skip" `train/nonfinite_steps`, per narrow table
    `train/saturated_values/<table>` (`backends.storage.narrow`), and per
    dynamic-vocabulary table `vocabulary/<table>/<counter>`
    (`backends.vocabulary.VocabularyIndex.counters`)."""
    hooks = self.run.evaluation
    results = hooks.training_results(
      run_summaries.flat_results(self.model.metrics, "train", hooks.ks)
    )
    results["train/loss"] = float(self.loss_metric.result())
    if self.model.trainable_variables:  # e.g. not iALS: tables only
      results["learning_rate"] = run_summaries.learning_rate(
        self.run.dense_optimizer
      )
    if self.steps.nonfinite_policy == "skip":
      results["train/nonfinite_steps"] = float(
        self.steps.nonfinite_steps.numpy()
      )
    # Narrow tables' values saturated at their dtype's range (every worker
    # calls it: a row-sharded table's count is summed over them).
    for table, count in self.backend.narrow_counts().items():
      results[f"train/saturated_values/{table}"] = float(count)
    # Dynamic-vocabulary tables: rows in use of the capacity, admissions,
    # evictions, ids refused a row and lookups that read the default.
    for table, index in self.backend.dynamic_tables().items():
      for counter, value in index.counters().items():
        results[f"vocabulary/{table}/{counter}"] = float(value)
    return results

  def write_summaries(
    self, kind: str, values: Mapping[str, float], step: int
  ) -> None:
    """Writes `values` to the `kind` summaries (chief, summaries on)."""
    self._writers.write(kind, values, step)

  def agreed_stop(self, requested: str | None) -> str | None:
    """The stop signal every worker agreed on (`strategy.agreed_stop`)."""
    return strategy_lib.agreed_stop(self.run.strategy, requested)

  # -- evaluation ------------------------------------------------------------

  def evaluate(self, exclude_seen: bool | None = None) -> dict[str, float]:
    """Evaluates the model now (`recsys.run.evaluation.Evaluator.evaluate`:
    every example of `eval_steps` batches once; `exclude_seen` None: the
    run's setting).

    Raises:
      EmptyEvalSetError: the eval split has no example.
    """
    return self.evaluator.evaluate(exclude_seen)

  # -- files -----------------------------------------------------------------

  def write_operative_config(self) -> str:
    """Writes the run's gin config into the model dir (`RunDir`)."""
    return self.run.run_dir.write_operative_config(gin.operative_config_str())

  def write_metrics(self, metrics: Mapping[str, float]) -> str:
    """Writes `metrics.json`: `metrics` and what the run ran on."""
    return self.run.run_dir.write_metrics(
      run_summaries.run_metrics(
        metrics,
        self.run.backend_name,
        self.run.strategy,
        self._global_batch_size,
      )
    )

  # -- parameter-server training (recsys.training.coordinated) ---------------

  @property
  def _step_functions_class(self) -> Callable[..., loop_lib.StepFunctions]:
    """`StepFunctions`, or its coordinator-scheduled version under PS."""
    if self.run.coordinator is None:
      return loop_lib.StepFunctions
    return functools.partial(
      coordinated_lib.CoordinatedStepFunctions, self.run.coordinator
    )
