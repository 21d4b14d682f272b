"""The Trainer: builds a run's objects and does what training asks of them.

It holds the run's state: the strategy, the embedding backend
(`embedding_backend`), the model and dense optimizer (built inside
`strategy.scope()`), the run's checkpoints (`checkpoints.RunCheckpoints`:
automatic resume at the exact step), TensorBoard writers and metrics
(`run_summaries`) and the run folder (`run_dir`). Settings are checked in
`settings`, input is distributed by `input`, the compiled step functions
live in `recsys.training.loop`, and when the loop evaluates, saves, logs
and stops is decided by `recsys.training.controller`. What a model's
evaluation needs besides its batches (a retrieval model's corpus index and
seen items) the model's evaluation hooks do (`recsys.models.evaluation_hooks`).

Example:
  >>> trainer = Trainer(model_dir="/tmp/run", source=SyntheticCTR(),
  ...                   model=DLRM, global_batch_size=512, train_steps=1000)
  >>> metrics = trainer.train()
"""

import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import gin

from backends import hardware
from recsys import _tf_internal
from recsys import features as features_lib
from recsys import train_settings as settings_lib
from recsys._keras import keras, tf
from recsys.data import errors as data_errors
from recsys.data import pipeline as data_pipeline
from recsys.data import sources as data_sources
from recsys.data.from_dataset import DatasetSource
from recsys.errors import RecsysError
from recsys.models import evaluation_hooks as hooks_lib
from recsys.models import model_args
from recsys.models import seen_items as seen_lib
from recsys.run import embedding_backend as backend_lib
from recsys.run import input as input_lib
from recsys.run import memory_peaks, run_summaries, schedules
from recsys.run import strategy as strategy_lib
from recsys.run_folder import checkpoints as checkpoints_lib
from recsys.run_folder import run_checks, run_configs, run_inputs
from recsys.run_folder import run_dir as run_dir_lib
from recsys.train_settings import TrainSettings
from recsys.training import controller as controller_lib
from recsys.training import coordinated as coordinated_lib
from recsys.training import loop as loop_lib
from recsys.training import signals as signals_lib

log = logging.getLogger("recsys.training")

# Where a run keeps its files: recsys.run_folder.run_dir (the one owner).
METRICS_FILE = run_dir_lib.METRICS_FILE
OPERATIVE_CONFIG_FILE = run_dir_lib.OPERATIVE_CONFIG_FILE


TrainerConfigError = settings_lib.TrainerConfigError


EmptyEvalSetError = data_errors.EmptyEvalSetError


CorruptCheckpointError = checkpoints_lib.CorruptCheckpointError


class NonFiniteLossError(RecsysError, FloatingPointError):
  """A training step's loss or gradients were NaN/inf (policy "stop").

  Attributes:
    step: the failing step (1-based: the batch consumed by that step).
    last_checkpoint: path of the newest checkpoint, or None.
  """

  def __init__(self, message: str, step: int, last_checkpoint: str | None):
    super().__init__(message)
    self.step, self.last_checkpoint = step, last_checkpoint


def default_embedding_optimizer() -> Any:
  """The embedding optimizer of a run that names none: Adagrad(0.05)."""
  return tf.tpu.experimental.embedding.Adagrad(0.05)


def _transformed_first(transform, preprocess, features, labels, *mask):
  """`preprocess` of a batch whose features `transform` changed first."""
  return preprocess(transform(features), labels, *mask)


def _check_no_float16(model: keras.Model) -> None:
  """Refuses a model that computes in float16 (a mixed_float16 policy).

  float16 gradients need loss scaling (Keras's `LossScaleOptimizer`, which
  `compile()` adds); the Trainer's step differentiates the loss as it is,
  so small gradients would silently round to zero. bfloat16 has float32's
  range and needs none: it is the TPU's policy.

  Raises:
    TrainerConfigError: naming the layer and its policy.
  """
  layers = [model] + [
    m for m in model.submodules if isinstance(m, keras.layers.Layer)
  ]
  for layer in layers:
    if layer.compute_dtype == "float16":
      raise TrainerConfigError(
        f"layer {layer.name!r} of the model computes in float16 (Keras "
        f"dtype policy {layer.dtype_policy.name!r}); float16 gradients need "
        "loss scaling, which the Trainer's step does not do, so small ones "
        "would silently become 0. Use "
        "tf.keras.mixed_precision.set_global_policy('mixed_bfloat16') (the "
        "TPU's policy: float32's range, no loss scaling) or 'float32' "
        "before building the Trainer."
      )


class Trainer:
  """Builds and runs one experiment under one strategy.

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

  # The settings the methods read as attributes, set by `_store_settings`
  # from the fields declared with `trainer=` (a test keeps both the same).
  allow_changed_settings: bool
  global_batch_size: int
  eval_batch_size: int
  train_steps: int
  steps_per_loop: int
  eval_every: int
  eval_steps: int | None
  checkpoint_every: int
  seed: int
  progress_bar: bool
  exclude_seen: bool

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
    self.model_dir = model_dir
    self.strategy = strategy or tf.distribute.get_strategy()
    self._store_settings(st)
    self._validate(source, eval_source)
    # ParameterServerStrategy: this process coordinates; steps run on the
    # workers through a ClusterCoordinator (recsys.training.coordinated).
    self._coordinator = (
      strategy_lib.make_coordinator(self.strategy)
      if hardware.is_parameter_server(self.strategy)
      else None
    )
    self._make_folder()
    keras.utils.set_random_seed(st.seed)
    self.memory = memory_peaks.PeakMemory()  # each phase's peak RSS
    with self.memory.phase("init"):
      self._build_embedding()
      self._build_model(model)
      self._build_checkpoints()
      self._build_steps()
      self._build_writers()
    with self.memory.phase("restore"):
      self.restored_step = self.restore()

  # -- construction steps ----------------------------------------------------

  def _store_settings(self, st: TrainSettings) -> None:
    """The settings the methods read, as attributes (normalized).

    Which, and how normalized, is declared with each setting
    (`settings.trainer_attributes`); the class annotations above type them.
    """
    for name, value in settings_lib.trainer_attributes(st).items():
      setattr(self, name, value)

  def _validate(self, source: Any, eval_source: Any) -> None:
    """Keeps the sources (datasets wrapped), then checks the settings."""
    self.source, self.eval_source = data_sources.run_sources(
      source,
      eval_source,
      self.settings.feature_config,
      self.settings.embedding,
    )
    settings_lib.check(
      self.settings, self.source, self.eval_source, self.strategy
    )

  def _make_folder(self) -> None:
    """Creates the model dir (refusing a file of that name); with
    summaries on (their writers write at once) it must be writable."""
    model_dir = self.model_dir
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
      raise TrainerConfigError(
        f"model_dir {model_dir!r} is a file; it must be a folder (new or "
        "holding a run to resume)."
      )
    if self.settings.summaries:
      run_dir_lib.RunDir(model_dir).check_writable()
    try:
      os.makedirs(model_dir, exist_ok=True)
    except PermissionError as e:
      raise run_dir_lib.ModelDirNotWritableError(
        f"model dir {model_dir!r} cannot be created ({e.strerror}): pass a "
        "--model_dir in a folder this user may write."
      ) from e

  def _build_embedding(self) -> None:
    """Tables, embedding optimizer, step counter and the embedding backend."""
    st, source = self.settings, self.source
    self.feature_config = (
      dict(source.feature_config)
      if isinstance(source, DatasetSource)
      else features_lib.feature_config(
        source.feature_specs, st.embedding, seed=st.seed
      )
    )
    features_lib.check_embedding_optimizer(
      st.embedding_optimizer, "train.embedding_optimizer"
    )
    embedding_optimizer = st.embedding_optimizer
    if embedding_optimizer is None:
      embedding_optimizer = default_embedding_optimizer()
    with self.strategy.scope():
      self.global_step = tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name="global_step",
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
      )
    # On copies: the caller's optimizers and tables keep their schedules.
    self.embedding_optimizer, self.feature_config = schedules.bind_to_step(
      embedding_optimizer, self.feature_config, self.global_step
    )
    embedding_optimizer = self.embedding_optimizer
    (
      self.backend_name,
      self.backend_reason,
      self.compile_plan,
      self.backend,
    ) = backend_lib.make_backend(
      st, source, self.strategy, self.feature_config, embedding_optimizer
    )

  def _build_model(self, model: Callable[..., keras.Model]) -> None:
    """Tables, model, dense optimizer, loss metric and RNG, in scope."""
    dense_optimizer = self.settings.dense_optimizer or keras.optimizers.Adam
    with self.strategy.scope():
      self.backend.build()
      self.model = model(**model_args.model_kwargs(model, self.source))
      self.model.create_variables(features_lib.dims(self.feature_config))
      _check_no_float16(self.model)
      self.dense_optimizer = dense_optimizer()
      self.dense_optimizer.build(self.model.trainable_variables)
      self.loss_metric = keras.metrics.Mean("loss")
      # Randomness drawn during training comes from this generator, saved with
      # the run so a resumed run continues its stream (the built-in models
      # and data draw none: they are functions of the seed and the step).
      self.rng = tf.random.Generator.from_seed(self.settings.seed)
    self._evaluation: hooks_lib.EvaluationHooks = self.model.evaluation_hooks(
      hooks_lib.EvaluationContext(
        self.source,
        self.eval_source,
        self.eval_batch_size,
        compile_tower=functools.partial(loop_lib.embed_fn, self.backend),
      )
    )
    if self.exclude_seen and not self.is_retrieval:
      raise TrainerConfigError(
        "train.exclude_seen = True applies to retrieval models; "
        f"{type(self.model).__name__} is a ranking model (it scores given "
        "pairs, it ranks no corpus): leave exclude_seen off."
      )

  def _build_checkpoints(self) -> None:
    """The checkpoint, the run folder and the chief's / a worker's managers."""
    # Only the chief writes the run's files; the other workers of a
    # multi-worker run save to a scratch folder (`checkpoints`).
    self._chief = strategy_lib.is_chief(self.strategy)
    resolver = getattr(self.strategy, "cluster_resolver", None)
    self.run_dir = run_dir_lib.RunDir(
      self.model_dir,
      chief=self._chief,
      task=None
      if self._chief or resolver is None
      else (resolver.task_type, resolver.task_id),
    )
    self.checkpoints = checkpoints_lib.RunCheckpoints(
      self.run_dir,
      {
        "model": self.model,
        "embedding": self.backend,
        "optimizer": self.dense_optimizer,
        "step": self.global_step,
        "rng": self.rng,
      },
      self.global_step,
      self.backend,
      max_to_keep=self.settings.max_checkpoints,
    )
    self.checkpoint = self.checkpoints.checkpoint  # the run's objects

  def _build_steps(self) -> None:
    """The compiled step functions (scheduled on workers under PS)."""
    self.steps = self._step_functions_class(
      self.strategy,
      self.model,
      self.backend,
      self.dense_optimizer,
      self.global_batch_size,
      self.global_step,
      self.loss_metric,
      nonfinite_policy=self.settings.nonfinite_policy,
      jit_compile=self.compile_plan.compile_steps,
    )
    self._eval_datasets: dict[bool, Any] = {}
    self._batches: Any = None  # the training iterator, during train()

  def _build_writers(self) -> None:
    """TensorBoard writers: the chief's, when summaries are on."""
    self._writers = run_summaries.SummaryWriters(
      self.run_dir, enabled=self.settings.summaries and self._chief
    )

  # -- construction helpers ------------------------------------------------

  @property
  def is_retrieval(self) -> bool:
    """Whether the model is a retrieval model (it indexes a corpus)."""
    return self._evaluation.ranks_corpus

  # -- data ----------------------------------------------------------------

  def _distribute(
    self,
    source,
    global_batch: int,
    training: bool,
    skip_steps: int = 0,
    take_steps: int | None = None,
    transform: hooks_lib.BatchTransform | None = None,
  ):
    """A distributed dataset of `source` (`recsys.run.input`); with
    `transform`, each batch's features are transformed first (evaluation:
    the model's `batch_transform`, e.g. its users' seen candidates)."""
    preprocess = functools.partial(
      input_lib.preprocess, self.backend, list(self.feature_config)
    )
    if transform is not None:
      preprocess = functools.partial(_transformed_first, transform, preprocess)
    if training:
      return input_lib.training_input(
        self.strategy,
        source,
        global_batch,
        preprocess,
        options=self.backend.input_options(),
        skip_steps=skip_steps,
        coordinator=self._coordinator,
      )
    return input_lib.eval_input(
      self.strategy,
      source,
      global_batch,
      preprocess,
      options=self.backend.input_options(),
      take_steps=take_steps,
      coordinator=self._coordinator,
    )

  def seen_items(self) -> seen_lib.SeenItems:
    """Each user's candidates in the training split (read once, then kept;
    a retrieval model's, through its evaluation hooks)."""
    return self._evaluation.seen_items()

  # -- checkpoints -----------------------------------------------------------

  def restore(self) -> int:
    """Restores the newest readable checkpoint (`RunCheckpoints.restore`)."""
    return self.checkpoints.restore()

  def save(self) -> str:
    """Saves a checkpoint at the current step; returns the chief's path."""
    with self.memory.phase("save"):
      return self.checkpoints.save()

  def save_if_new(self, step: int) -> str:
    """Saves a checkpoint unless the newest one holds `step`."""
    with self.memory.phase("save"):
      return self.checkpoints.save_if_new(step)

  @property
  def manager(self) -> tf.train.CheckpointManager:
    """This process's `tf.train.CheckpointManager` (a worker's: scratch)."""
    return self.checkpoints.manager

  def _check_finite(self, reached: int) -> None:
    """Raises `NonFiniteLossError` if the loop stopped on a NaN/inf step."""
    if self.steps.nonfinite_policy != "stop":
      return
    bad = int(self.steps.first_nonfinite_step.numpy())
    if bad < 0:
      return
    latest = self.checkpoints.latest
    saved = (
      f"the last good checkpoint is {latest}"
      if latest
      else "no checkpoint was saved yet (set checkpoint_every)"
    )
    raise NonFiniteLossError(
      f"training step {bad} produced a NaN/inf loss or gradients (on the "
      f"batch that step reads: batch {bad - 1} of the training data counted "
      f"from 0, {self.global_batch_size} examples); training stopped at "
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
    self.run_dir.check_writable()  # before the lock, which writes there
    lock = self.run_dir.lock()
    if self._chief:  # other workers write nothing of their own here
      lock.acquire()
    try:
      with signals_lib.StopRequests() as stop:
        return self._train(stop)
    finally:
      lock.release()

  def _train(self, stop: signals_lib.StopRequests) -> dict[str, float]:
    """`train` under the lock: the run prepared, the controller's loop from
    the restored step, then the run's final metrics written."""
    step = int(self.global_step.numpy())
    self._prepare_run(step)
    if step >= self.train_steps:
      self._say_complete(step)
    self._batches = iter(
      self._distribute(
        self.source, self.global_batch_size, training=True, skip_steps=step
      )
    )
    try:
      final = self._controller().train(step, stop)
    finally:
      self._batches = None
      log.info("peak RSS of this process: %s", self.memory.describe())
    final["steps_trained"] = final["step"] - step
    final.update(self.optimum())
    # A run trained to its end before keeps the metrics.json of that run
    # (its train/ and speed figures); a file of another step is replaced.
    if final["steps_trained"] or self.run_dir.metrics_step() != step:
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
      self.model_dir,
      step,
      self.train_steps,
      2 * step,
    )

  def _prepare_run(self, step: int) -> None:
    """Before training from `step`: a resume's changed settings checked and
    recorded and its learning-rate schedules continued, the eval split
    checked, the run's config and inputs written."""
    self.run_dir.refuse_links()  # before training: refused up front
    files = self.input_fingerprints() if self._chief else {}
    if step:  # a resume: same math settings and data as the last run?
      changes = self.run_dir.check(
        "train",
        gin.operative_config_str(),
        files,
        step,
        self.allow_changed_settings,
      )
      self._continue_schedules(step)  # before a step is traced
      for line in changes.lines():
        log.warning("resuming with a changed setting (allowed): %s", line)
      if changes:
        self.run_dir.record_changes("train", step, changes)
    if step < self.train_steps:  # fail now, not after training
      self.eval_source.check_eval_split()
    self.write_operative_config()
    self.run_dir.write_input_files(files, step)
    # The settings next to the curves in TensorBoard.
    self._writers.write_config(gin.operative_config_str(), step)

  def _continue_schedules(self, step: int) -> None:
    """On a resume at `step`, before a step is traced: the learning-rate
    schedules go on from the rates they reached, over this run's length
    (`schedules.resumed`, from the lengths of the runs kept here)."""
    runs = run_configs.run_lengths(self.model_dir)
    runs.append((step, self.train_steps))
    tables = {id(f.table): f.table for f in self.feature_config.values()}
    schedules.resume_bound(
      [self.embedding_optimizer, *(t.optimizer for t in tables.values())],
      runs,
    )
    legacy = isinstance(self.dense_optimizer, keras.optimizers.legacy.Optimizer)
    with self.strategy.scope():
      dense, _ = _tf_internal.keras_learning_rate(self.dense_optimizer, legacy)
    continued = schedules.resumed(dense, runs)
    if continued is not dense:
      self.dense_optimizer.learning_rate = continued

  def _controller(self) -> controller_lib.Controller:
    """The loop's timing, from the run's settings."""
    return controller_lib.Controller(
      self,
      controller_lib.LoopSchedule(
        train_steps=self.train_steps,
        steps_per_loop=self.steps_per_loop,
        eval_every=self.eval_every,
        checkpoint_every=self.checkpoint_every,
      ),
      self.global_batch_size,
      progress_bar=bool(self.progress_bar),
    )

  # -- what the controller asks (controller.TrainingRun) ---------------------

  def run_steps(self, num_steps: int) -> None:
    """Runs `num_steps` training steps of the current `train()`'s batches;
    the loss and the model's metrics start afresh."""
    self.loss_metric.reset_state()
    for m in self.model.metrics:
      m.reset_state()
    with self.memory.phase("train"):
      self.steps.run_train_steps(self._batches, num_steps)

  def check_steps(self) -> None:
    """Raises if the steps just run read invalid ids or went NaN/inf."""
    self.backend.raise_for_invalid_inputs()  # before anything is saved
    self._check_finite(int(self.global_step.numpy()))

  def train_results(self) -> dict[str, float]:
    """The metrics of the steps since `run_steps`: `train/<metric>` (those
    the model's hooks keep), `train/loss`, `learning_rate` and, with
    policy "skip", `train/nonfinite_steps`."""
    results = self._evaluation.training_results(
      run_summaries.flat_results(
        self.model.metrics, "train", self._evaluation.ks
      )
    )
    results["train/loss"] = float(self.loss_metric.result())
    results["learning_rate"] = run_summaries.learning_rate(self.dense_optimizer)
    if self.steps.nonfinite_policy == "skip":
      results["train/nonfinite_steps"] = float(
        self.steps.nonfinite_steps.numpy()
      )
    return results

  def write_summaries(
    self, kind: str, values: Mapping[str, float], step: int
  ) -> None:
    """Writes `values` to the `kind` summaries (chief, summaries on)."""
    self._writers.write(kind, values, step)

  def agreed_stop(self, requested: str | None) -> str | None:
    """The stop signal every worker agreed on (`strategy.agreed_stop`)."""
    return strategy_lib.agreed_stop(self.strategy, requested)

  # -- evaluation ------------------------------------------------------------

  def index_corpus(self) -> int:
    """Embeds the whole candidate corpus into the model's index (retrieval;
    the model's evaluation hooks do it).

    Returns:
      The number of candidates indexed (0: the model ranks no corpus).
    """
    return self._evaluation.index_corpus()

  def evaluate(self, exclude_seen: bool | None = None) -> dict[str, float]:
    """Evaluates on `eval_steps` batches of the eval source (None: all of it).

    Args:
      exclude_seen: the retrieval protocol of this evaluation (None: the
        run's `exclude_seen` setting); both protocols can score one model.

    Every example is scored exactly once: the last partial batch is padded
    and masked (`recsys.run.eval_padding`), on every strategy and in
    compiled steps.

    Returns:
      `eval/loss` (the mean per-example loss of the examples scored, plus
      the regularization term as in `train/loss`), `eval/<metric>` for each
      of the model's metrics (AUC, log-loss, accuracy / RMSE / top-k hit
      rates) and `eval/examples`, the number of examples scored; with
      `exclude_seen`, the hit rates rank only candidates each user did not
      interact with in training, and `eval/exclude_seen` is 1.

    Raises:
      EmptyEvalSetError: the eval split has no example.
    """
    if exclude_seen is None:
      exclude_seen = self.exclude_seen
    exclude_seen = bool(exclude_seen)
    if exclude_seen and not self.is_retrieval:
      raise TrainerConfigError(
        "exclude_seen applies to retrieval models; "
        f"{type(self.model).__name__} is a ranking model."
      )
    self._evaluation.before_evaluation()
    if exclude_seen not in self._eval_datasets:
      # Built once: building the input pipeline and tracing the eval loop
      # cost seconds; a distributed dataset can be iterated many times.
      self._eval_datasets[exclude_seen] = self._distribute(
        self.eval_source,
        self.eval_batch_size,
        training=False,
        take_steps=self.eval_steps,
        transform=self._evaluation.batch_transform(exclude_seen),
      )
    dataset = self._eval_datasets[exclude_seen]
    self.steps.reset_eval_metrics()
    for m in self.model.metrics:
      m.reset_state()
    with (
      self.memory.phase("evaluate"),
      loop_lib.quiet_dataset_options_warning(),  # traced on first use
    ):
      self.steps.eval_loop(dataset)
    examples = int(self.steps.eval_examples.result())
    if not examples:
      raise EmptyEvalSetError(
        data_pipeline.empty_eval_message(self.eval_source)
      )
    results = run_summaries.flat_results(
      self.model.metrics, "eval", self._evaluation.ks
    )
    results["eval/loss"] = float(
      self.steps.eval_loss_sum.result()
    ) / examples + run_summaries.regularization_loss(self.model)
    results["eval/examples"] = float(examples)
    if exclude_seen:
      results["eval/exclude_seen"] = 1.0
    log.info("evaluated %d examples", examples)
    return results

  def optimum(self) -> dict[str, float]:
    """The source's known best metrics (`DataSource.known_optimum`)."""
    return run_summaries.known_optimum(self.eval_source, self._evaluation.ks)

  # -- the run's settings and data ------------------------------------------

  def input_fingerprints(self, eval_only: bool = False) -> dict[str, Any]:
    """Fingerprints of the files the sources read (`run_inputs`)."""
    sources = (
      [self.eval_source] if eval_only else [self.source, self.eval_source]
    )
    return run_inputs.fingerprints(p for s in sources for p in s.input_files())

  def check_restored(
    self, command: str, other_data: bool = False
  ) -> run_checks.RunChanges:
    """Before `command` ("evaluate", "export") uses the restored checkpoint:
    the settings and input files are the run's (`run_checks`).

    Args:
      command: what is about to use the checkpoint.
      other_data: data settings and files may differ (an evaluation on
        other data on purpose).

    Returns:
      Every difference from the run (allowed: `train.allow_changed_settings`,
      or data ones with `other_data`); the caller records them.

    Raises:
      ChangedSettingsError: something differs that is not allowed.
    """
    return self.run_dir.check(
      command,
      gin.operative_config_str(),
      self.input_fingerprints(),
      self.restored_step,
      self.allow_changed_settings,
      other_data=other_data,
    )

  # -- files -----------------------------------------------------------------

  def write_operative_config(self) -> str:
    """Writes the run's gin config into the model dir (`RunDir`)."""
    return self.run_dir.write_operative_config(gin.operative_config_str())

  def write_metrics(self, metrics: Mapping[str, float]) -> str:
    """Writes `metrics.json`: `metrics` and what the run ran on."""
    return self.run_dir.write_metrics(
      run_summaries.run_metrics(
        metrics,
        self.backend_name,
        self.strategy,
        self.global_batch_size,
      )
    )

  # -- parameter-server training (recsys.training.coordinated) ---------------

  @property
  def _step_functions_class(self) -> Callable[..., loop_lib.StepFunctions]:
    """`StepFunctions`, or its coordinator-scheduled version under PS."""
    if self._coordinator is None:
      return loop_lib.StepFunctions
    return functools.partial(
      coordinated_lib.CoordinatedStepFunctions, self._coordinator
    )
