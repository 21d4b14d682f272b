"""Tests of backends/optimizers.py: the TPU optimizer math vs NumPy and TF.

Every optimizer and option runs several steps with varying id subsets on a
23 x 7 table and is compared, table and every slot, to the NumPy reference
(backends/reference_optimizers.py); Adagrad, FTRL and non-lazy Adam are also
compared to TF's own training kernels on the same inputs.
"""

import logging  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import optimizers  # noqa: E402
from backends import reference_optimizers as ref  # noqa: E402
from backends.base import UnsupportedConfigError  # noqa: E402
from tests.conftest import mirrored_strategy  # noqa: E402

E = tf.tpu.experimental.embedding
VOCAB, DIM = 23, 7
RTOL, ATOL = 2e-5, 2e-6
# Unique ids per step: sizes vary, sets overlap, one step touches one row.
STEP_IDS = [
  [0, 5, 22, 7, 11],
  [5, 6, 7, 8, 9, 10, 21, 1, 3],
  [22],
  [3, 11, 0, 14, 15, 16, 2, 19, 20, 12, 13, 4],
]


def _steps(seed: int = 0, scale: float = 1.0):
  rng = np.random.default_rng(seed)
  return [
    (
      np.array(ids, np.int32),
      (scale * rng.normal(size=(len(ids), DIM))).astype(np.float32),
    )
    for ids in STEP_IDS
  ]


def _initial_table(seed: int = 1) -> np.ndarray:
  return (
    np.random.default_rng(seed).normal(0, 0.1, (VOCAB, DIM)).astype(np.float32)
  )


def _variables(opt, table0):
  """Table and slot variables, slots initialised by TF's own initializers."""
  table = tf.Variable(table0)
  slots = {
    name: tf.Variable(init(shape=(VOCAB, DIM), dtype=tf.float32))
    for name, init in optimizers.slot_initializers(opt).items()
  }
  return table, slots


def _assert_matches(table, slots, want_table, want_slots, step):
  np.testing.assert_allclose(
    np.asarray(table),
    want_table,
    rtol=RTOL,
    atol=ATOL,
    err_msg=f"table after step {step}",
  )
  assert sorted(slots) == sorted(want_slots)
  for name, var in slots.items():
    np.testing.assert_allclose(
      np.asarray(var),
      want_slots[name],
      rtol=RTOL,
      atol=ATOL,
      err_msg=f"slot {name} after {step}",
    )


def _check_against_reference(opt, steps=None, lrs=None, set_lr=None):
  """Runs `steps` through apply_sparse_update and the NumPy reference."""
  steps = steps or _steps()
  table0 = _initial_table()
  table, slots = _variables(opt, table0)
  want_table = table0
  want_slots = ref.initial_slots(opt, VOCAB, DIM)
  for i, (ids, grads) in enumerate(steps):
    if set_lr is not None:
      set_lr(lrs[i])
    optimizers.apply_sparse_update(
      opt, table, slots, tf.constant(ids), tf.constant(grads)
    )
    want_table, want_slots = ref.apply(opt, want_table, want_slots, ids, grads)
    _assert_matches(table, slots, want_table, want_slots, i)


# -- every optimizer x the options every optimizer has -------------------------

OPTIMIZERS = {
  "SGD": lambda **kw: E.SGD(learning_rate=0.1, **kw),
  "Adagrad": lambda **kw: E.Adagrad(learning_rate=0.1, **kw),
  "AdagradMomentum": lambda **kw: E.AdagradMomentum(
    learning_rate=0.05, momentum=0.9, **kw
  ),
  "Adam": lambda **kw: E.Adam(learning_rate=0.01, **kw),
  "FTRL": lambda **kw: E.FTRL(learning_rate=0.1, **kw),
}
COMMON_OPTIONS = {
  "defaults": {},
  "clipvalue_scalar": {"clipvalue": 0.3},
  "clipvalue_tuple": {"clipvalue": (-0.2, 0.5)},
  "clipvalue_max_only": {"clipvalue": (None, 0.4)},
  "clip_weight": {"clip_weight_min": -0.05, "clip_weight_max": 0.08},
  "weight_decay": {"weight_decay_factor": 0.1},
  "weight_decay_times_lr": {
    "weight_decay_factor": 0.5,
    "multiply_weight_decay_factor_by_learning_rate": True,
  },
  "all_combined": {
    "clipvalue": 0.5,
    "clip_weight_min": -0.1,
    "clip_weight_max": 0.1,
    "weight_decay_factor": 0.05,
  },
}


@pytest.mark.parametrize(
  "options", COMMON_OPTIONS.values(), ids=COMMON_OPTIONS.keys()
)
@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_common_options_match_reference(make, options):
  _check_against_reference(make(**options))


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_callable_learning_rate_is_read_every_step(make):
  lr = [0.1]
  opt = make()
  opt.learning_rate = lambda: lr[0]
  _check_against_reference(
    opt, lrs=[0.1, 0.02, 0.3, 0.07], set_lr=lambda v: lr.__setitem__(0, v)
  )


# -- per-optimizer options -----------------------------------------------------

SPECIFIC = {
  "Adagrad_initial_accumulator": E.Adagrad(0.2, initial_accumulator_value=2.0),
  "AdagradMomentum_defaults": E.AdagradMomentum(0.05),
  "AdagradMomentum_nesterov": E.AdagradMomentum(
    0.05, momentum=0.8, use_nesterov=True
  ),
  "AdagradMomentum_exponent": E.AdagradMomentum(
    0.05, momentum=0.5, exponent=4.0
  ),
  "AdagradMomentum_beta2": E.AdagradMomentum(0.05, momentum=0.9, beta2=0.95),
  "AdagradMomentum_epsilon": E.AdagradMomentum(0.05, momentum=0.9, epsilon=0.3),
  "AdagradMomentum_all": E.AdagradMomentum(
    0.05,
    momentum=0.7,
    use_nesterov=True,
    exponent=3.0,
    beta2=0.9,
    epsilon=1e-3,
    clipvalue=0.8,
    weight_decay_factor=0.01,
  ),
  "Adam_non_lazy": E.Adam(0.01, lazy_adam=False),
  "Adam_sum_outside_sqrt": E.Adam(0.01, sum_inside_sqrt=False),
  "Adam_betas_epsilon": E.Adam(0.01, beta_1=0.5, beta_2=0.9, epsilon=0.1),
  "Adam_non_lazy_outside_sqrt": E.Adam(
    0.01, lazy_adam=False, sum_inside_sqrt=False, epsilon=0.05
  ),
  "Adam_non_lazy_clip_decay": E.Adam(
    0.01,
    lazy_adam=False,
    clipvalue=(-0.3, 0.2),
    clip_weight_min=-0.1,
    clip_weight_max=0.12,
    weight_decay_factor=0.2,
    multiply_weight_decay_factor_by_learning_rate=True,
  ),
  "FTRL_lr_power": E.FTRL(0.1, learning_rate_power=-0.3),
  "FTRL_lr_power_zero": E.FTRL(0.1, learning_rate_power=0.0),
  "FTRL_l1": E.FTRL(0.1, l1_regularization_strength=0.5),
  "FTRL_l2": E.FTRL(0.1, l2_regularization_strength=0.4),
  "FTRL_beta": E.FTRL(0.1, beta=0.5),
  "FTRL_initial_accumulator": E.FTRL(0.1, initial_accumulator_value=1.5),
  "FTRL_multiply_linear": E.FTRL(0.1, multiply_linear_by_learning_rate=True),
  "FTRL_multiply_linear_l1_l2_beta": E.FTRL(
    0.1,
    multiply_linear_by_learning_rate=True,
    l1_regularization_strength=0.3,
    l2_regularization_strength=0.2,
    beta=0.4,
    learning_rate_power=-0.4,
  ),
  "FTRL_allow_zero_accumulator": E.FTRL(
    0.1, allow_zero_accumulator=True, l1_regularization_strength=0.2
  ),
  "FTRL_all": E.FTRL(
    0.1,
    learning_rate_power=-0.6,
    l1_regularization_strength=0.2,
    l2_regularization_strength=0.1,
    beta=0.3,
    clipvalue=0.7,
    weight_decay_factor=0.05,
    clip_weight_min=-0.2,
    clip_weight_max=0.15,
  ),
}


@pytest.mark.parametrize("opt", SPECIFIC.values(), ids=SPECIFIC.keys())
def test_optimizer_options_match_reference(opt):
  _check_against_reference(opt)


def test_ftrl_l1_zeroes_some_weights_and_not_others():
  """Guards the FTRL_l1 case above against testing only one branch."""
  opt = SPECIFIC["FTRL_l1"]
  table, slots = _variables(opt, _initial_table())
  for ids, grads in _steps():
    optimizers.apply_sparse_update(opt, table, slots, ids, grads)
  touched = np.unique(np.concatenate(STEP_IDS))
  w = np.asarray(table)[touched]
  assert 0 < np.mean(w == 0) < 1


@pytest.mark.parametrize("multiply_linear", [False, True])
def test_ftrl_callable_lr_with_multiply_linear(multiply_linear):
  lr = [0.1]
  opt = E.FTRL(
    lambda: lr[0],
    l1_regularization_strength=0.1,
    beta=0.2,
    multiply_linear_by_learning_rate=multiply_linear,
  )
  _check_against_reference(
    opt, lrs=[0.1, 0.05, 0.2, 0.01], set_lr=lambda v: lr.__setitem__(0, v)
  )


def test_ftrl_allow_zero_accumulator_gives_zero_not_nan_for_zero_rows():
  opt = E.FTRL(0.1, allow_zero_accumulator=True)
  table, slots = _variables(opt, _initial_table())
  slots["accumulators"].assign(tf.zeros([VOCAB, DIM]))  # e.g. from a checkpoint
  ids = np.array([2, 4, 6], np.int32)
  grads = np.ones((3, DIM), np.float32)
  grads[1, :3] = 0.0  # n' = 0 for these elements of row 4
  optimizers.apply_sparse_update(opt, table, slots, ids, grads)
  want_table, want_slots = ref.apply(
    opt,
    _initial_table(),
    {"accumulators": np.zeros((VOCAB, DIM)), "linears": np.zeros((VOCAB, DIM))},
    ids,
    grads,
  )
  assert np.all(np.isfinite(np.asarray(table)))
  np.testing.assert_array_equal(np.asarray(table)[4, :3], 0.0)
  _assert_matches(table, slots, want_table, want_slots, 0)


def test_non_lazy_adam_updates_untouched_rows_and_lazy_does_not():
  for lazy in (True, False):
    opt = E.Adam(0.01, lazy_adam=lazy)
    table0 = _initial_table()
    table, slots = _variables(opt, table0)
    for ids, grads in _steps()[:2]:
      optimizers.apply_sparse_update(opt, table, slots, ids, grads)
    untouched = sorted(set(range(VOCAB)) - set(STEP_IDS[0] + STEP_IDS[1]))
    # Rows 0, 22 and 11 have momentum from step 1 but no gradient in step 2.
    moved = np.asarray(table)[[0, 11, 22]] - table0[[0, 11, 22]]
    np.testing.assert_array_equal(
      np.asarray(table)[untouched], table0[untouched]
    )
    assert np.all(moved != 0)
    step1 = ref.apply(
      opt, table0, ref.initial_slots(opt, VOCAB, DIM), *_steps()[0]
    )
    assert lazy == np.allclose(
      np.asarray(table)[[0, 11, 22]],
      step1[0][[0, 11, 22]],
      rtol=RTOL,
      atol=ATOL,
    )


@pytest.mark.parametrize("make", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_empty_ids_change_nothing(make):
  opt = make(weight_decay_factor=0.1, clipvalue=0.2)
  table0 = _initial_table()
  table, slots = _variables(opt, table0)
  before = {k: np.asarray(v) for k, v in slots.items()}
  optimizers.apply_sparse_update(
    opt, table, slots, tf.zeros([0], tf.int64), tf.zeros([0, DIM])
  )
  np.testing.assert_array_equal(np.asarray(table), table0)
  for k, v in slots.items():
    np.testing.assert_array_equal(np.asarray(v), before[k])


def test_int64_ids():
  _check_against_reference(
    E.FTRL(0.1, l2_regularization_strength=0.1),
    steps=[(ids.astype(np.int64), g) for ids, g in _steps()],
  )


# -- tf.function, XLA and MirroredStrategy -------------------------------------


def _one_of_each():
  return {
    "SGD": E.SGD(0.1, clip_weight_max=0.1),
    "Adagrad": E.Adagrad(0.1),
    "AdagradMomentum": E.AdagradMomentum(0.05, momentum=0.9, use_nesterov=True),
    "Adam": E.Adam(0.01, lazy_adam=False),
    "FTRL": E.FTRL(0.1, l1_regularization_strength=0.2, beta=0.1),
  }


def _with_variable_lr(opt):
  """Swaps in a callable lr that reads a variable (works inside tf.function)."""
  lr_var = tf.Variable(0.1)
  opt.learning_rate = lr_var.read_value
  return opt, lr_var


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("name", sorted(_one_of_each()))
def test_inside_tf_function(name, jit_compile):
  opt, lr_var = _with_variable_lr(_one_of_each()[name])
  table0 = _initial_table()
  table, slots = _variables(opt, table0)

  @tf.function(
    jit_compile=jit_compile,
    input_signature=[
      tf.TensorSpec([None], tf.int32),
      tf.TensorSpec([None, DIM], tf.float32),
    ],
  )
  def step(ids, grads):
    optimizers.apply_sparse_update(opt, table, slots, ids, grads)

  want_table, want_slots = table0, ref.initial_slots(opt, VOCAB, DIM)
  for i, ((ids, grads), lr) in enumerate(zip(_steps(), [0.1, 0.03, 0.2, 0.05])):
    lr_var.assign(lr)
    step(ids, grads)
    want_table, want_slots = ref.apply(
      opt, want_table, want_slots, ids, grads, lr=lr
    )
    _assert_matches(table, slots, want_table, want_slots, i)
  if not jit_compile:
    assert step.experimental_get_tracing_count() == 1


@pytest.fixture(scope="module")
def two_cpus():
  """Two logical CPUs; set here unless the TF runtime already started."""
  try:
    tf.config.set_logical_device_configuration(
      tf.config.list_physical_devices("CPU")[0],
      [tf.config.LogicalDeviceConfiguration()] * 2,
    )
  except RuntimeError:
    pass  # Runtime already initialised (tests/conftest.py configures 4).
  if len(tf.config.list_logical_devices("CPU")) < 2:
    pytest.skip(
      "needs 2 logical CPUs, but the TF runtime was initialised "
      "with fewer before this module could configure them"
    )


@pytest.mark.parametrize(
  "in_function", [True, False], ids=["tf_function", "eager"]
)
@pytest.mark.parametrize("name", sorted(_one_of_each()))
def test_mirrored_two_replicas_update_both_copies(name, in_function, two_cpus):
  del two_cpus
  strategy = mirrored_strategy(2)
  opt = _one_of_each()[name]
  table0 = _initial_table()
  with strategy.scope():
    table, slots = _variables(opt, table0)
  assert isinstance(table, tf.distribute.DistributedValues)

  def step(ids, grads):
    strategy.run(
      optimizers.apply_sparse_update, args=(opt, table, slots, ids, grads)
    )

  if in_function:
    step = tf.function(step)
  want_table, want_slots = table0, ref.initial_slots(opt, VOCAB, DIM)
  for i, (ids, grads) in enumerate(_steps()):
    step(tf.constant(ids), tf.constant(grads))
    want_table, want_slots = ref.apply(opt, want_table, want_slots, ids, grads)
    for replica in range(2):
      _assert_matches(
        strategy.experimental_local_results(table)[replica],
        {
          k: strategy.experimental_local_results(v)[replica]
          for k, v in slots.items()
        },
        want_table,
        want_slots,
        f"{i} (replica {replica})",
      )


# -- against TF's own kernels --------------------------------------------------


def _tf_vars(table0, *slots0):
  return [tf.Variable(x) for x in (table0,) + slots0]


def _assert_steps_match_tf(opt, tf_slots0, tf_apply, rtol, atol):
  """Runs `_steps()` through our update, TF's kernel
  (`tf_apply(table, *slots, ids, grads)` on variables holding the table and
  `tf_slots0`, by slot name) and the reference; after each step ours and the
  reference must equal TF's table and slots."""
  table0 = _initial_table()
  table, slots = _variables(opt, table0)
  tf_vars = _tf_vars(table0, *tf_slots0.values())
  want_table, want_slots = table0, ref.initial_slots(opt, VOCAB, DIM)
  for ids, grads in _steps():
    optimizers.apply_sparse_update(opt, table, slots, ids, grads)
    tf_apply(*tf_vars, ids, grads)
    want_table, want_slots = ref.apply(opt, want_table, want_slots, ids, grads)
    gots = [table, *(slots[k] for k in tf_slots0)]
    wants = [want_table, *(want_slots[k] for k in tf_slots0)]
    for got, tf_got, want in zip(gots, tf_vars, wants):
      np.testing.assert_allclose(
        np.asarray(got), np.asarray(tf_got), rtol=rtol, atol=atol
      )
      np.testing.assert_allclose(want, np.asarray(tf_got), rtol=rtol, atol=atol)


@pytest.mark.parametrize("initial_accumulator", [0.1, 1.0])
def test_adagrad_matches_resource_sparse_apply_adagrad_v2(initial_accumulator):
  opt = E.Adagrad(0.15, initial_accumulator_value=initial_accumulator)

  def tf_apply(tf_table, tf_acc, ids, grads):
    tf.raw_ops.ResourceSparseApplyAdagradV2(
      var=tf_table.handle,
      accum=tf_acc.handle,
      lr=0.15,
      epsilon=0.0,
      grad=grads,
      indices=ids,
    )

  _assert_steps_match_tf(
    opt,
    {"accumulators": np.full((VOCAB, DIM), initial_accumulator, np.float32)},
    tf_apply,
    RTOL,
    ATOL,
  )


FTRL_VS_TF = {
  "defaults": {},
  "lr_power": {"learning_rate_power": -0.3},
  "l1_l2": {
    "l1_regularization_strength": 0.3,
    "l2_regularization_strength": 0.2,
  },
  "beta": {"beta": 0.5, "l1_regularization_strength": 0.1},
  "multiply_linear": {
    "multiply_linear_by_learning_rate": True,
    "l1_regularization_strength": 0.3,
    "l2_regularization_strength": 0.2,
  },
  "multiply_linear_beta": {
    "multiply_linear_by_learning_rate": True,
    "beta": 0.5,
    "learning_rate_power": -0.7,
  },
}


@pytest.mark.parametrize("options", FTRL_VS_TF.values(), ids=FTRL_VS_TF.keys())
def test_ftrl_matches_resource_sparse_apply_ftrl(options):
  """TF's kernel has no beta; the proto says: use l2 + beta / (2 lr)."""
  lr = 0.2
  opt = E.FTRL(lr, initial_accumulator_value=0.3, **options)

  def tf_apply(tf_table, tf_acc, tf_lin, ids, grads):
    tf.raw_ops.ResourceSparseApplyFtrl(
      var=tf_table.handle,
      accum=tf_acc.handle,
      linear=tf_lin.handle,
      grad=grads,
      indices=ids,
      lr=lr,
      l1=opt.l1_regularization_strength,
      l2=opt.l2_regularization_strength + opt.beta / (2 * lr),
      lr_power=opt.learning_rate_power,
      multiply_linear_by_lr=opt.multiply_linear_by_learning_rate,
    )

  _assert_steps_match_tf(
    opt,
    {
      "accumulators": np.full((VOCAB, DIM), 0.3, np.float32),
      "linears": np.zeros((VOCAB, DIM), np.float32),
    },
    tf_apply,
    1e-4,
    1e-5,
  )


def test_non_lazy_adam_matches_resource_apply_adam_without_bias_correction():
  """TF's dense Adam with beta powers 0 is Adam without bias correction."""
  opt = E.Adam(
    0.02,
    beta_1=0.8,
    beta_2=0.95,
    epsilon=0.01,
    lazy_adam=False,
    sum_inside_sqrt=False,
  )
  table0 = _initial_table()
  table, slots = _variables(opt, table0)
  tf_table, tf_m, tf_v = _tf_vars(
    table0,
    np.zeros((VOCAB, DIM), np.float32),
    np.zeros((VOCAB, DIM), np.float32),
  )
  for ids, grads in _steps():
    optimizers.apply_sparse_update(opt, table, slots, ids, grads)
    dense = np.zeros((VOCAB, DIM), np.float32)
    dense[ids] = grads
    tf.raw_ops.ResourceApplyAdam(
      var=tf_table.handle,
      m=tf_m.handle,
      v=tf_v.handle,
      beta1_power=0.0,
      beta2_power=0.0,
      lr=0.02,
      beta1=0.8,
      beta2=0.95,
      epsilon=0.01,
      grad=dense,
    )
    for got, tf_got in [
      (table, tf_table),
      (slots["momenta"], tf_m),
      (slots["velocities"], tf_v),
    ]:
      np.testing.assert_allclose(
        np.asarray(got), np.asarray(tf_got), rtol=RTOL, atol=ATOL
      )


# -- slots and configuration checks --------------------------------------------


# The checkpoint slot names of TF's mid-level API
# (docs/optimizers.md#slot-names-in-checkpoints).
TF_SLOT_NAMES = {
  "SGD": [],
  "Adagrad": ["accumulators"],
  "AdagradMomentum": ["accumulators", "momenta"],
  "Adam": ["momenta", "velocities"],
  "FTRL": ["accumulators", "linears"],
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_slot_names_and_initial_values_are_tfs(name):
  opt = OPTIMIZERS[name]()
  assert optimizers.slot_names(opt) == TF_SLOT_NAMES[name]
  _, slots = _variables(opt, _initial_table())
  want = ref.initial_slots(opt, VOCAB, DIM)
  assert list(slots) == list(want)
  for name in want:
    np.testing.assert_array_equal(np.asarray(slots[name]), want[name])


def test_custom_optimizer_is_rejected_naming_the_table():
  custom = E.CustomOptimizer(custom_computation=tf.function(lambda *a: a[0]))
  with pytest.raises(UnsupportedConfigError, match="'users'.*CustomOptimizer"):
    optimizers.check_supported(custom, "users")
  with pytest.raises(ValueError):
    optimizers.slot_names(custom)


def test_keras_optimizer_is_rejected_naming_the_table():
  with pytest.raises(
    UnsupportedConfigError, match="'items'.*keras.*SGD is not a tf.tpu"
  ):
    optimizers.check_supported(tf.keras.optimizers.SGD(), "items")


@pytest.mark.parametrize(
  "opt,match",
  [
    (E.FTRL(0.1, learning_rate_power=0.5), "learning_rate_power"),
    (E.FTRL(0.1, l1_regularization_strength=-1.0), "l1_regularization"),
    (E.SGD(0.1, clip_weight_min=1.0, clip_weight_max=0.5), "clip_weight_min"),
    (E.SGD(0.1, clipvalue=(1.0, -1.0)), "clip_gradient_min"),
  ],
  ids=["ftrl_lr_power", "ftrl_l1", "clip_weight", "clipvalue"],
)
def test_invalid_hyperparameters_are_rejected(opt, match):
  with pytest.raises(UnsupportedConfigError, match=f"'t'.*{match}"):
    optimizers.check_supported(opt, "t")


def test_no_gradient_accumulation_is_accepted_and_noted(caplog):
  opt = E.Adagrad(0.1, use_gradient_accumulation=False)
  with caplog.at_level(logging.INFO, logger="recsys.backends"):
    optimizers.check_supported(opt, "users")
    assert "use_gradient_accumulation=False" in caplog.text
    assert "'users'" in caplog.text
    caplog.clear()
    _check_against_reference(opt)
    assert not caplog.text  # noted once, not at every step


def test_missing_slot_and_bad_shapes_name_the_table():
  opt = E.Adam(0.1)
  table, slots = _variables(opt, _initial_table())
  ids, grads = _steps()[0]
  with pytest.raises(ValueError, match="velocities"):
    optimizers.apply_sparse_update(
      opt, table, {"momenta": slots["momenta"]}, ids, grads
    )
  with pytest.raises(ValueError, match="dimension 6.*dimension 7"):
    optimizers.apply_sparse_update(opt, table, slots, ids, grads[:, :6])
  with pytest.raises(ValueError, match=r"ids must be a vector"):
    optimizers.apply_sparse_update(opt, table, slots, ids[:, None], grads)
