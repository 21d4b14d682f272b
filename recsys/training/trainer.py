"""The Trainer: builds a run's objects and drives training and evaluation.

It owns the run's state and side effects: the strategy, the embedding backend
(chosen through `backends.create`), the model and dense optimizer (built
inside `strategy.scope()`), checkpoints with `tf.train.CheckpointManager`
(automatic resume at the exact step), TensorBoard summaries, the progress bar,
`operative_config.gin` and `metrics.json` in the model dir. The compiled step
functions live in `recsys.training.loop`.

Example:
  >>> trainer = Trainer(model_dir="/tmp/run", source=SyntheticCTR(),
  ...                   model=DLRM, global_batch_size=512, train_steps=1000)
  >>> metrics = trainer.train()
"""

import inspect
import json
import logging
import math
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional

import gin
import numpy as np

from tensorflow.core.framework import summary_pb2  # pylint: disable=g-direct-tensorflow-import

import backends
from recsys import features as features_lib
from recsys._keras import keras, tf
from recsys.training import loop as loop_lib

log = logging.getLogger("recsys.training")

METRICS_FILE = "metrics.json"
OPERATIVE_CONFIG_FILE = "operative_config.gin"


class TrainerConfigError(ValueError):
  """The trainer's settings are inconsistent (batch sizes, steps, sources)."""


def _call_with_supported(factory: Callable[..., Any], **kwargs) -> Any:
  """Calls `factory` with the keyword arguments its signature accepts.

  A class is inspected through its `__init__`: gin hands `@Model` over as a
  generated subclass whose own signature is `(*args, **kwargs)`.
  """
  target = factory.__init__ if isinstance(factory, type) else factory
  try:
    params = inspect.signature(target).parameters
  except (TypeError, ValueError):
    return factory(**kwargs)
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return factory(**kwargs)
  return factory(**{k: v for k, v in kwargs.items() if k in params})


def _flat_results(metrics, prefix: str) -> Dict[str, float]:
  """{prefix/name: float} for Keras metrics; vector results get `_i` names."""
  out = {}
  for metric in metrics:
    result = metric.result()
    if isinstance(result, Mapping):
      items = result.items()
    else:
      items = [(metric.name, result)]
    for name, value in items:
      value = np.asarray(value, dtype=np.float64).reshape(-1)
      if value.size == 1:
        out[f"{prefix}/{name}"] = float(value[0])
        continue
      ks = list(getattr(metric, "_ks", None) or getattr(metric, "ks", None) or [])
      for i, v in enumerate(value):
        suffix = f"top{ks[i]}" if len(ks) == value.size else str(i)
        out[f"{prefix}/{name}_{suffix}"] = float(v)
  return out


def _scalar_summary(name: str, value: float, step: int) -> None:
  """A TensorBoard scalar, with or without the tensorboard package installed.

  `tf.summary.scalar` needs the tensorboard package; without it, write the
  same record (a float32 scalar tagged for the "scalars" plugin) directly.
  """
  metadata = summary_pb2.SummaryMetadata()
  metadata.plugin_data.plugin_name = "scalars"
  tf.summary.write(name, tf.constant(value, tf.float32), step=step,
                   metadata=metadata.SerializeToString())


class Trainer:
  """Builds and runs one experiment under one strategy.

  Args:
    model_dir: checkpoints, summaries, `operative_config.gin`, `metrics.json`.
    source: the training data source (`feature_specs`, `num_dense`,
      `dataset(...)`; retrieval sources also `candidates(...)`).
    model: a model class or factory, called inside `strategy.scope()` with the
      source's `feature_specs`, `num_dense` (and for retrieval
      `query_features`, `candidate_features`, `candidate_id_feature`) as far
      as its signature accepts them.
    strategy: the `tf.distribute` strategy (default: the current one).
    embedding: `EmbeddingSettings` (dim, combiner, per-table overrides).
    embedding_optimizer: default `tf.tpu.experimental.embedding` optimizer.
    dense_optimizer: Keras optimizer class or factory (called in scope).
    backend: embedding backend name or "auto".
    backend_options: keyword arguments for the backend's constructor.
    eval_source: source for evaluation; default: `source` with training=False.
    global_batch_size: examples per step over all replicas.
    eval_batch_size: global eval batch (default: global_batch_size).
    train_steps: total steps (a resumed run continues up to this).
    steps_per_loop: steps per compiled host call.
    eval_every: evaluate every N steps (0: only at the end).
    eval_steps: eval batches per evaluation (None: the whole eval set).
    checkpoint_every: save every N steps (0: only at the end).
    max_checkpoints: checkpoints kept.
    seed: seeds Python, NumPy and TF (`keras.utils.set_random_seed`).
    progress_bar: show a tqdm bar (on a terminal).
    summaries: write TensorBoard summaries.
  """

  def __init__(self,
               model_dir: str,
               source: Any,
               model: Callable[..., keras.Model],
               strategy: Optional[tf.distribute.Strategy] = None,
               embedding: Optional[features_lib.EmbeddingSettings] = None,
               embedding_optimizer: Optional[Any] = None,
               dense_optimizer: Optional[Callable[[], Any]] = None,
               backend: str = "auto",
               backend_options: Optional[Mapping[str, Any]] = None,
               eval_source: Optional[Any] = None,
               global_batch_size: int = 1024,
               eval_batch_size: Optional[int] = None,
               train_steps: int = 1000,
               steps_per_loop: int = 100,
               eval_every: int = 0,
               eval_steps: Optional[int] = 20,
               checkpoint_every: int = 0,
               max_checkpoints: int = 3,
               seed: int = 0,
               progress_bar: bool = True,
               summaries: bool = True):
    self.model_dir = model_dir
    self.source = source
    self.eval_source = eval_source if eval_source is not None else source
    self.strategy = strategy or tf.distribute.get_strategy()
    self.global_batch_size = int(global_batch_size)
    self.eval_batch_size = int(eval_batch_size or global_batch_size)
    self.train_steps = int(train_steps)
    self.steps_per_loop = max(1, int(steps_per_loop))
    self.eval_every = int(eval_every or 0)
    self.eval_steps = eval_steps
    self.checkpoint_every = int(checkpoint_every or 0)
    self.seed = seed
    self.progress_bar = progress_bar
    self._check_batch_sizes()
    if isinstance(self.strategy,
                  tf.distribute.experimental.ParameterServerStrategy):
      raise TrainerConfigError(
          "the Trainer's host loop does not drive ParameterServerStrategy "
          "(it needs a ClusterCoordinator); unset the 'ps' job in TF_CONFIG "
          "or use MultiWorkerMirroredStrategy.")
    os.makedirs(model_dir, exist_ok=True)
    keras.utils.set_random_seed(seed)

    self.feature_config = features_lib.feature_config(
        source.feature_specs, embedding)
    if embedding_optimizer is None:
      embedding_optimizer = tf.tpu.experimental.embedding.Adagrad(0.05)
    self.embedding_optimizer = embedding_optimizer
    with self.strategy.scope():
      self.global_step = tf.Variable(
          0, dtype=tf.int64, trainable=False, name="global_step",
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    for opt in [embedding_optimizer] + [
        f.table.optimizer for f in self.feature_config.values()]:
      self._bind_schedule(opt)
    self.backend_name, self.backend_reason = backends.registry.resolve(
        backend, self.strategy)
    # `resolve` logs the choice and its reason (the one place "auto" is
    # decided); construct the resolved class directly so it is not re-resolved.
    # The data source knows its longest bags: static widths give compiled
    # steps fixed shapes (and replicas a fixed-size exchange of touched rows).
    options = {"bag_widths": {spec.name: spec.max_ids
                              for spec in source.feature_specs
                              if spec.multi_hot and not spec.sequence_length}}
    options.update(backend_options or {})
    self.backend = backends.get(self.backend_name)(
        self.feature_config, embedding_optimizer, strategy=self.strategy,
        **options)
    dense_optimizer = dense_optimizer or keras.optimizers.Adam
    with self.strategy.scope():
      self.backend.build()
      self.model = _call_with_supported(model, **self._model_kwargs())
      self.model.create_variables(features_lib.dims(self.feature_config))
      self.dense_optimizer = dense_optimizer()
      self.dense_optimizer.build(self.model.trainable_variables)
      self.loss_metric = keras.metrics.Mean("loss")
    self.checkpoint = tf.train.Checkpoint(
        model=self.model, embedding=self.backend,
        optimizer=self.dense_optimizer, step=self.global_step)
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, os.path.join(model_dir, "checkpoints"),
        max_to_keep=max_checkpoints, step_counter=self.global_step)
    self.steps = loop_lib.StepFunctions(
        self.strategy, self.model, self.backend, self.dense_optimizer,
        self.global_batch_size, self.global_step, self.loss_metric)
    self._eval_dataset = None
    self._writers = None
    if summaries:
      self._writers = {
          kind: tf.summary.create_file_writer(os.path.join(model_dir, kind))
          for kind in ("train", "eval")}
    self.restored_step = self.restore()

  # -- construction helpers ------------------------------------------------

  def _check_batch_sizes(self) -> None:
    replicas = self.strategy.num_replicas_in_sync
    for name, size in (("global_batch_size", self.global_batch_size),
                       ("eval_batch_size", self.eval_batch_size)):
      if size < 1 or size % replicas:
        raise TrainerConfigError(
            f"{name}={size} must be a positive multiple of the "
            f"{replicas} replicas in sync (per-replica batch = {name} / "
            f"{replicas}).")

  def _bind_schedule(self, optimizer: Any) -> None:
    """Makes a Keras schedule as embedding learning rate follow the step.

    `tf.tpu.experimental.embedding` optimizers take a float or a
    zero-argument callable; a `LearningRateSchedule` from gin (e.g.
    `embedding.Adam.learning_rate = @WarmupPolyDecay()`) is wrapped in
    `lambda: schedule(global_step)` (the optimizer object is updated).
    """
    lr = getattr(optimizer, "learning_rate", None)
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
      step = self.global_step
      optimizer.learning_rate = lambda: lr(step)

  def _model_kwargs(self) -> Dict[str, Any]:
    kwargs = {"feature_specs": list(self.source.feature_specs),
              "num_dense": int(getattr(self.source, "num_dense", 0) or 0)}
    for attr in ("query_features", "candidate_features",
                 "candidate_id_feature"):
      if hasattr(self.source, attr):
        kwargs[attr] = getattr(self.source, attr)
    return kwargs

  @property
  def is_retrieval(self) -> bool:
    return hasattr(self.model, "index_candidates")

  # -- data ----------------------------------------------------------------

  def _preprocess(self, features, labels):
    names = list(self.feature_config)
    ids, weights = loop_lib.split_batch((features, labels), names)
    ids, weights = self.backend.preprocess(ids, weights)
    features = dict(features)
    categorical = dict(features["categorical"])
    categorical.update(ids)
    features["categorical"] = categorical
    kept = {k: v for k, v in (weights or {}).items() if v is not None}
    extra = {k: v for k, v in (features.get("weights") or {}).items()
             if k not in names}
    if kept or extra:
      features["weights"] = {**extra, **kept}
    else:
      features.pop("weights", None)
    return features, labels

  def _distribute(self, source, global_batch: int, training: bool,
                  skip_steps: int = 0, take_steps: Optional[int] = None):
    """A distributed dataset of per-replica batches of `source`."""

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      per_replica = ctx.get_per_replica_batch_size(global_batch)
      kwargs = {"training": training, "input_context": ctx,
                "drop_remainder": True}
      if not training:
        kwargs["repeat"] = False
      ds = source.dataset(per_replica, **kwargs)
      batches_per_step = max(1, ctx.num_replicas_in_sync //
                             ctx.num_input_pipelines)
      if skip_steps:
        ds = ds.skip(skip_steps * batches_per_step)
      if take_steps is not None:
        ds = ds.take(take_steps * batches_per_step)
      ds = ds.map(tf.autograph.experimental.do_not_convert(self._preprocess),
                  num_parallel_calls=tf.data.AUTOTUNE)
      return ds.prefetch(tf.data.AUTOTUNE)

    return self.strategy.distribute_datasets_from_function(
        dataset_fn, options=self.backend.input_options())

  # -- checkpoints -----------------------------------------------------------

  def restore(self) -> int:
    """Restores the latest checkpoint of the model dir; returns its step."""
    path = self.manager.latest_checkpoint
    if not path:
      return 0
    try:
      from backends import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
      verify = getattr(ckpt_lib, "verify_compatible", None)
    except ImportError:
      verify = None
    if verify is not None:
      verify(path, self.backend)
    self.checkpoint.restore(path).assert_existing_objects_matched()
    step = int(self.global_step.numpy())
    log.info("restored %s at step %d", path, step)
    return step

  def save(self) -> str:
    step = int(self.global_step.numpy())
    path = self.manager.save(checkpoint_number=step)
    log.info("saved checkpoint %s", path)
    return path

  # -- running ---------------------------------------------------------------

  def _learning_rate(self) -> float:
    lr = getattr(self.dense_optimizer, "learning_rate", None)
    if lr is None:
      return float("nan")
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
      return float(lr(self.dense_optimizer.iterations))
    return float(tf.convert_to_tensor(lr))

  def _write(self, kind: str, values: Mapping[str, float], step: int) -> None:
    if not self._writers:
      return
    with self._writers[kind].as_default(step=step):
      for name, value in values.items():
        _scalar_summary(name.split("/", 1)[-1], value, step)
    self._writers[kind].flush()

  def _next_boundary(self, step: int) -> int:
    end = min(self.train_steps, step + self.steps_per_loop)
    for every in (self.eval_every, self.checkpoint_every):
      if every:
        end = min(end, (step // every + 1) * every)
    return end

  def train(self) -> Dict[str, float]:
    """Trains to `train_steps` (resuming), evaluates, writes metrics.json.

    Returns:
      The final metrics: `train/loss`, `train/<metric>`, `eval/<metric>`,
      `examples_per_second`, `step`, and the source's known optimum
      (`bayes_auc`, ...) when it reports one.
    """
    step = int(self.global_step.numpy())
    self.write_operative_config()
    iterator = iter(self._distribute(self.source, self.global_batch_size,
                                     training=True, skip_steps=step))
    bar = self._progress(step)
    results: Dict[str, float] = {}
    throughput = []
    start_step, start_time = step, time.time()
    while step < self.train_steps:
      end = self._next_boundary(step)
      self.loss_metric.reset_state()
      for m in self.model.metrics:
        m.reset_state()
      t0 = time.time()
      self.steps.run_train_steps(iterator, end - step)
      results = _flat_results(self.model.metrics, "train")
      if self.is_retrieval:  # corpus hit rates are computed in evaluation only
        results = {k: v for k, v in results.items() if "hit_rate" not in k}
      results["train/loss"] = float(self.loss_metric.result())
      elapsed = time.time() - t0
      examples_per_second = (end - step) * self.global_batch_size / elapsed
      if step > start_step or end == self.train_steps:
        throughput.append((end - step, elapsed))
      step = end
      results["learning_rate"] = self._learning_rate()
      results["examples_per_second"] = examples_per_second
      self._write("train", results, step)
      if not math.isfinite(results["train/loss"]):
        raise FloatingPointError(
            f"training loss is {results['train/loss']} at step {step}; lower "
            "the learning rates or check the data.")
      if bar is not None:
        bar.update(end - bar.n)
        bar.set_postfix(loss=f"{results['train/loss']:.4f}",
                        ex_s=f"{examples_per_second:,.0f}")
      else:
        log.info("step %d/%d loss %.5f %.0f examples/s", step,
                 self.train_steps, results["train/loss"], examples_per_second)
      if self.checkpoint_every and step % self.checkpoint_every == 0:
        self.save()
      if self.eval_every and step % self.eval_every == 0 and step < self.train_steps:
        self._log_eval(self.evaluate(), step)
    if bar is not None:
      bar.close()
    latest = self.manager.latest_checkpoint
    if latest is None or not latest.endswith(f"-{step}"):
      self.save()
    final = dict(results)
    final.update(self.evaluate())
    self._log_eval(final, step)
    steps_timed = sum(n for n, _ in throughput)
    seconds = sum(t for _, t in throughput)
    final["step"] = step
    if seconds > 0:
      final["examples_per_second"] = steps_timed * self.global_batch_size / seconds
    final["elapsed_seconds"] = time.time() - start_time
    final.update(self.optimum())
    self.write_metrics(final)
    self.write_operative_config()
    return final

  def _log_eval(self, results: Mapping[str, float], step: int) -> None:
    evals = {k: v for k, v in results.items() if k.startswith("eval/")}
    self._write("eval", evals, step)
    log.info("eval at step %d: %s", step,
             ", ".join(f"{k}={v:.5f}" for k, v in sorted(evals.items())))

  def _progress(self, step: int):
    if not self.progress_bar:
      return None
    try:
      from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top
    except ImportError:
      return None
    return tqdm.tqdm(total=self.train_steps, initial=step, unit="step",
                     dynamic_ncols=True, desc="train")

  def index_corpus(self) -> int:
    """Embeds the whole candidate corpus into the model's index (retrieval).

    Returns:
      The number of candidates indexed.
    """
    embed = loop_lib.embed_fn(self.backend, self.model.candidate_embeddings,
                              self.model.candidate_features)
    ids, embeddings = [], []
    for batch in self.eval_source.candidates(self.eval_batch_size):
      embeddings.append(embed(batch))
      ids.append(self.model.candidate_ids(batch))
    ids = tf.concat(ids, 0)
    self.model.index_candidates(ids, tf.concat(embeddings, 0))
    return int(ids.shape[0])

  def evaluate(self) -> Dict[str, float]:
    """Evaluates on `eval_steps` batches of the eval source.

    Returns:
      `eval/loss` and `eval/<metric>` for each of the model's metrics (AUC,
      log-loss, accuracy / RMSE / top-k hit rates).
    """
    if self.is_retrieval:
      self.index_corpus()
    if self._eval_dataset is None:
      # Built once: building the input pipeline and tracing the eval loop
      # cost seconds; a distributed dataset can be iterated many times.
      self._eval_dataset = self._distribute(
          self.eval_source, self.eval_batch_size, training=False,
          take_steps=self.eval_steps)
    dataset = self._eval_dataset
    self.loss_metric.reset_state()
    for m in self.model.metrics:
      m.reset_state()
    self.steps.eval_loop(dataset)
    results = _flat_results(self.model.metrics, "eval")
    results["eval/loss"] = float(self.loss_metric.result())
    return results

  def optimum(self) -> Dict[str, float]:
    """The source's known best metrics (synthetic data), if it reports them."""
    out = {}
    for attr in ("bayes_auc", "bayes_logloss"):
      value = getattr(self.eval_source, attr, None)
      if value is not None:
        out[attr] = float(value() if callable(value) else value)
    best = getattr(self.eval_source, "best_hit_rate", None)
    pop = getattr(self.eval_source, "popularity_hit_rate", None)
    ks = getattr(self.model, "ks", ())
    for k in ks:
      if best is not None:
        out[f"best_hit_rate_{k}"] = float(best(k))
      if pop is not None:
        out[f"popularity_hit_rate_{k}"] = float(pop(k))
    return out

  # -- files -----------------------------------------------------------------

  def write_operative_config(self) -> str:
    path = os.path.join(self.model_dir, OPERATIVE_CONFIG_FILE)
    with open(path, "w", encoding="utf-8") as f:
      f.write(gin.operative_config_str())
    return path

  def write_metrics(self, metrics: Mapping[str, float]) -> str:
    path = os.path.join(self.model_dir, METRICS_FILE)
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"backend": self.backend_name,
                 "strategy": type(self.strategy).__name__,
                 "replicas": self.strategy.num_replicas_in_sync,
                 "global_batch_size": self.global_batch_size,
                 **{k: v for k, v in metrics.items()}}, f, indent=2,
                sort_keys=True)
    return path
