"""The training steps: one step, and N steps in one tf.function.

This is TF's TPU host-loop pattern: the host calls a `tf.function` that runs
`steps_per_loop` steps on device (`for _ in tf.range(n): strategy.run(...)`),
so the per-call overhead is paid once per loop, not per step. Inside a step
the embedding backend and the dense optimizer are explicit:

    acts = backend.lookup(categorical, weights, training=True)   # in the tape
    per_example = model.per_example_loss(LossInputs(acts, features, labels))
    loss = replica_loss(model, per_example, GB)  # this replica's share
    dense_optimizer.apply_gradients(zip(dense_grads, model.trainable_variables))
    backend.apply_gradients(activation_grads)

Training health: every step checks that its loss and gradients are finite
(replicas agree on the verdict). A non-finite step is never applied under
"skip" (it is counted, the batch is consumed); under "stop" the loop ends
before that step and the trainer reports it without saving anything.
"""

from typing import Any

from recsys._keras import keras, tf
from recsys.models import base as model_base
from recsys.models.loss_inputs import LossInputs
from recsys.serving.lookup import map_batch_ids, maps_ids, split_batch
from recsys.training import batch_slices as slices_lib

NONFINITE_POLICIES = ("stop", "skip")


@tf.autograph.experimental.do_not_convert
def _all_finite(*structures) -> tf.Tensor:
  """True iff every float tensor (or IndexedSlices' values) is finite."""
  checks = []
  for t in tf.nest.flatten(structures, expand_composites=False):
    if t is None:
      continue
    if isinstance(t, tf.IndexedSlices):
      t = t.values
    if t.dtype.is_floating:
      checks.append(tf.reduce_all(tf.math.is_finite(t)))
  return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


@tf.autograph.experimental.do_not_convert
def _zeros_for_none(grads, acts):
  return tf.nest.map_structure(
    lambda g, a: tf.zeros_like(a) if g is None else g, grads, acts
  )


class StepFunctions:
  """Builds the compiled training loop of one run (its evaluation:
  `recsys.run.evaluation.Evaluator`).

  Args:
    strategy: the run's strategy.
    model: a ranking or retrieval model (`per_example_loss`, `metrics`).
    backend: a built embedding backend.
    dense_optimizer: a Keras optimizer for `model.trainable_variables`.
    global_batch_size: examples per step over all replicas.
    global_step: int64 variable counting training steps (cross-replica).
    loss_metric: a `keras.metrics.Mean` fed the global mean loss of each step.
    nonfinite_policy: "stop" (end the loop before a step whose loss or
      gradients are NaN/inf; `first_nonfinite_step` names it) or "skip"
      (leave such steps out, count them in `nonfinite_steps`).
    jit_compile: compile each replica's training step with XLA
      (`tf.function(jit_compile=True)`): lookup, model, dense optimizer,
      embedding update, metrics and the non-finite guard in one program.
      Needs collectives XLA can compile (one replica, GPUs, TPUs); under a
      TPUStrategy the step is compiled anyway.
    batch_slices: the model's loss over this many slices of each replica's
      batch, side by side (`recsys.training.batch_slices.resolve` picks it).

  Raises:
    ValueError: an unknown policy, or "skip" with a backend that must send
      gradients every step (the TPU embedding accelerator).
  """

  def __init__(
    self,
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    backend: Any,
    dense_optimizer: Any,
    global_batch_size: int,
    global_step: tf.Variable,
    loss_metric: keras.metrics.Metric,
    nonfinite_policy: str = "stop",
    jit_compile: bool = False,
    batch_slices: int = 1,
  ):
    if nonfinite_policy not in NONFINITE_POLICIES:
      raise ValueError(
        f"nonfinite_policy={nonfinite_policy!r}: use one of "
        f"{list(NONFINITE_POLICIES)}."
      )
    if nonfinite_policy == "skip" and getattr(
      getattr(backend, "capabilities", None), "needs_tpu", False
    ):
      raise ValueError(
        f"nonfinite_policy='skip' needs a backend that can leave a step's "
        f"update out; {type(backend).__name__} runs the TPU's own update "
        "every step: use nonfinite_policy='stop'."
      )
    self.nonfinite_policy = nonfinite_policy
    with strategy.scope():
      agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
      self.nonfinite_steps = tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name="nonfinite_steps",
        aggregation=agg,
      )
      self.first_nonfinite_step = tf.Variable(
        -1,
        dtype=tf.int64,
        trainable=False,
        name="first_nonfinite_step",
        aggregation=agg,
      )
    self._strategy = strategy
    self._model = model
    self._backend = backend
    self._optimizer = dense_optimizer
    self._global_batch_size = global_batch_size
    self._global_step = global_step
    self._loss_metric = loss_metric
    self._names = list(backend.feature_config)
    self._maps_ids = maps_ids(backend)
    # A backend has no data-dependent Python control flow: skipping
    # autograph's conversion of its code cuts tracing the default
    # experiment's step from ~25 s to ~5 s (the project's own packages are
    # never converted, `backends._tf_internal.leave_project_code_unconverted`;
    # this covers a third party's backend). TFRS's code stays converted
    # (its tasks rely on autograph, e.g. `len(tf.shape(x))`).
    self._backend_lookup = tf.autograph.experimental.do_not_convert(
      backend.lookup
    )
    self._backend_apply = tf.autograph.experimental.do_not_convert(
      backend.apply_gradients
    )
    self.jit_compile = bool(jit_compile)
    self.batch_slices = int(batch_slices)
    self._replica_train_step = self.train_step
    if self.jit_compile:
      self._replica_train_step = tf.function(self.train_step, jit_compile=True)
    self.train_loop = tf.function(self._train_loop)

  @tf.autograph.experimental.do_not_convert
  def _lookup(self, batch, training: bool):
    ids, weights = split_batch(batch, self._names)
    return self._backend_lookup(ids, weights, training=training)

  @tf.autograph.experimental.do_not_convert
  def _agreed(self, finite: tf.Tensor) -> tf.Tensor:
    """Every replica's verdict combined: finite only if finite everywhere."""
    if self._strategy.num_replicas_in_sync == 1:
      return finite
    ctx = tf.distribute.get_replica_context()
    bad = ctx.all_reduce(
      tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32)
    )
    return bad < 0.5

  def train_step(self, batch) -> tf.Tensor:
    """One replica's step; returns whether it was finite on every replica."""
    features, labels = batch
    variables = self._model.trainable_variables
    with tf.GradientTape() as tape:
      acts = self._lookup(batch, training=True)
      tape.watch(acts)
      per_example = slices_lib.per_example_loss(
        self._model, LossInputs(acts, features, labels), self.batch_slices
      )
      # The replica's share: summed over replicas, the global batch's mean.
      loss = model_base.replica_loss(
        self._model, per_example, self._global_batch_size
      )
    dense_grads, act_grads = tape.gradient(loss, (variables, acts))
    act_grads = _zeros_for_none(act_grads, acts)
    finite = self._agreed(_all_finite(loss, dense_grads, act_grads))
    pairs = [(g, v) for g, v in zip(dense_grads, variables) if g is not None]

    def apply():
      if pairs:
        self._optimizer.apply_gradients(pairs)
      self._backend_apply(act_grads)
      # The per-replica loss is already divided by the global batch: the sum
      # over replicas is the step's mean loss; Mean averages replica values.
      self._loss_metric.update_state(
        loss * tf.cast(self._strategy.num_replicas_in_sync, loss.dtype)
      )
      return tf.constant(True)

    def skip():
      self._backend.abandon_training_lookup()
      return tf.constant(False)

    if self.nonfinite_policy == "skip":
      return tf.cond(finite, apply, skip)
    # "stop": the loop ends at this step and nothing after it is saved, so
    # the update can run unconditionally (no branch around TPU updates).
    apply()
    return finite

  def run_train_steps(self, iterator, num_steps: int) -> None:
    """Runs `num_steps` training steps in one call of the compiled loop."""
    self.train_loop(iterator, tf.constant(num_steps, tf.int32))

  @tf.autograph.experimental.do_not_convert
  def _map_ids(self, batch):
    """Dynamic tables: the batch's raw ids as rows (updates the indices).

    In cross-replica context, on the host: the indices' hash tables cannot
    run in a TPU's replica step (nor in any XLA-compiled one), and here the
    step's ids of every replica are mapped in one order anyway."""
    return map_batch_ids(self._backend, batch, self._names, training=True)

  def _train_loop(self, iterator, num_steps: tf.Tensor) -> None:
    for _ in tf.range(num_steps):
      batch = next(iterator)
      if self._maps_ids:  # on the host, before the (compiled) replica step
        batch = self._map_ids(batch)
      finite = self._strategy.run(self._replica_train_step, args=(batch,))
      finite = self._strategy.experimental_local_results(finite)[0]
      if not finite:
        if self.first_nonfinite_step < 0:
          self.first_nonfinite_step.assign(self._global_step + 1)
        self.nonfinite_steps.assign_add(1)
        if self.nonfinite_policy == "stop":
          break
      # Skipped steps count: the step is the number of batches consumed,
      # which is what positions the data on resume.
      self._global_step.assign_add(1)
