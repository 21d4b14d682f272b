"""The fused CPU kernels (backends/tensorcore/kernels) against the TF ops they
replace.

The NumPy reference tests of test_tensorcore_training run both paths; here:
the two paths side by side on every optimizer and input kind, the tape's
view of a fused lookup, the variables' copy-on-read protocol, errors, and the
build and fallback machinery.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import backends
from backends import optimizers
from backends.tensorcore import kernels
from tests.backends import test_tensorcore_training as training
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
DIM = training.DIM


def test_kernels_build_and_load_here():
  # CI has a compiler: a broken build must fail here, not fall back quietly.
  assert kernels.load() is not None
  assert kernels.library_path().exists()
  assert kernels.status() == f"built, {kernels.library_path()}"


def test_status_says_what_training_will_use(monkeypatch, tmp_path):
  monkeypatch.setenv(kernels.ENV_DIR, str(tmp_path))
  assert kernels.status().startswith("not built yet")
  monkeypatch.setenv("CXX", "")
  monkeypatch.setenv("PATH", str(tmp_path))
  assert kernels.status().startswith("unavailable (no C++ compiler)")
  monkeypatch.setenv(kernels.ENV_SWITCH, "0")
  assert kernels.status().startswith("off")


# A stand-in compiler: logs its arguments, writes its `-o` file, and fails
# (printing an error line) on a source named in $FAIL_ON.
_FAKE_CXX = """#!/bin/sh
echo "$@" >> "$LOG"
out=""; prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  case "$a" in *"$FAIL_ON"*) [ -n "$FAIL_ON" ] && \\
    echo "$a:1: error: no luck" >&2 && exit 3;; esac
  prev="$a"
done
echo built > "$out"
"""


def _fake_compiler(tmp_path, monkeypatch, fail_on=""):
  cxx = tmp_path / "fake-c++"
  cxx.write_text(_FAKE_CXX)
  cxx.chmod(0o755)
  monkeypatch.setenv("CXX", str(cxx))
  monkeypatch.setenv("LOG", str(tmp_path / "calls.log"))
  monkeypatch.setenv("FAIL_ON", fail_on)
  monkeypatch.setenv(kernels.ENV_DIR, str(tmp_path / "cache"))
  return tmp_path / "calls.log"


def test_build_compiles_each_source_then_links_them_into_the_library(
  tmp_path, monkeypatch
):
  log = _fake_compiler(tmp_path, monkeypatch)
  target = kernels.build()
  assert target == kernels.library_path() and target.read_text() == "built\n"
  calls = log.read_text().splitlines()
  compiles, (link,) = calls[:-1], calls[-1:]
  assert sorted(c.split(" -c ")[1].split()[0] for c in compiles) == sorted(
    str(source) for source in kernels.SOURCES
  )
  assert link.startswith("-shared ") and link.count(".o ") == len(
    kernels.SOURCES
  ), link
  # Nothing but the library is left in the cache folder.
  assert sorted(p.name for p in target.parent.iterdir()) == sorted(
    [target.name, ".build.lock"]
  )
  assert kernels.build() == target
  assert len(log.read_text().splitlines()) == len(kernels.SOURCES) + 1


def test_a_failed_compile_names_the_error_and_leaves_no_library(
  tmp_path, monkeypatch
):
  _fake_compiler(tmp_path, monkeypatch, fail_on="vocabulary_ops.cc")
  with pytest.raises(kernels.KernelBuildError) as info:
    kernels.build()
  assert "(exit 3)" in str(info.value)
  assert "vocabulary_ops.cc:1: error: no luck" in str(info.value)
  folder = kernels.library_path().parent
  assert [p.name for p in folder.iterdir()] == [".build.lock"]


def _run(name, fused, strategy=None, steps=3):
  """Trains the mixed config of test_tensorcore_training on fixed batches."""
  strategy = strategy or tf.distribute.get_strategy()
  factories, lr = training._optimizers()  # pylint: disable=protected-access
  config, table_opts = training._config(factories[name]())  # pylint: disable=protected-access
  with strategy.scope():
    emb = backends.TensorCoreEmbedding(
      config, table_opts["shared"], fused_kernels=fused
    )
    emb.build()
    for var in emb.embedding_tables.values():
      var.assign(tf.random.stateless_normal(var.shape, seed=[3, var.shape[0]]))
  rng = np.random.default_rng(5)

  @tf.function
  def step(features, weights, cotangents):
    strategy.run(
      lambda *a: training._linear_loss_step(emb, *a),  # pylint: disable=protected-access
      args=(features, weights, cotangents),
    )

  for i in range(steps):
    lr.assign(0.05 * (i + 1))
    rows, weights = training._batch(rng, 8)  # pylint: disable=protected-access
    cot = {
      k: tf.constant(
        rng.normal(size=(8, 3, DIM) if k == "s" else (8, DIM)), tf.float32
      )
      for k in rows
    }
    step(*training._tensors(rows, weights), cot)  # pylint: disable=protected-access
  values = {t.name: v for t, v in emb.embedding_tables.items()}
  for table, slots in emb.slot_variables().items():
    values.update({f"{table}/{k}": v for k, v in slots.items()})
  return {
    k: (v.values[0] if hasattr(v, "values") else v).numpy()
    for k, v in values.items()
  }


@pytest.mark.parametrize("name", training.OPTIMIZER_NAMES)
def test_fused_steps_equal_tf_ops(name):
  fused, tf_ops = _run(name, True), _run(name, False)
  assert sorted(fused) == sorted(tf_ops)
  for key in fused:
    # Same float32 operations; TF's graph rewrites (x / sqrt(y) becomes
    # x * rsqrt(y)) and summation order leave a few ulps.
    np.testing.assert_allclose(
      fused[key], tf_ops[key], rtol=3e-6, atol=3e-7, err_msg=key
    )


@pytest.mark.parametrize("name", ["adagrad_options", "adam_lazy"])
def test_fused_equal_tf_ops_under_two_replicas(name):
  # Each replica gets the whole batch; the touched rows' exchange is shared.
  fused = _run(name, True, strategy=mirrored_strategy(2))
  tf_ops = _run(name, False, strategy=mirrored_strategy(2))
  for key in fused:
    np.testing.assert_allclose(
      fused[key], tf_ops[key], rtol=3e-6, atol=3e-7, err_msg=key
    )


def test_tape_on_table_sees_the_fused_lookup_as_a_gather():
  table = E.TableConfig(30, DIM, combiner="mean", name="t")
  config = {"f": E.FeatureConfig(table), "g": E.FeatureConfig(table)}
  feats = {
    "f": tf.ragged.constant([[1, 2, 2], [7]], dtype=tf.int64),
    "g": tf.ragged.constant([[2], [9, 1]], dtype=tf.int64),
  }
  grads = {}
  for fused in (True, False):
    emb = backends.TensorCoreEmbedding(config, E.SGD(0.1), fused_kernels=fused)
    emb.build()
    var = emb.embedding_tables[table]
    var.assign(tf.reshape(tf.range(30 * DIM, dtype=tf.float32), [30, DIM]))
    with (
      tf.GradientTape() as tape
    ):  # no watch: the table is a trainable variable
      acts = emb(feats, training=True)
      loss = tf.reduce_sum(acts["f"] * 2.0) + tf.reduce_sum(acts["g"] ** 2)
    grad = tape.gradient(loss, var)
    assert isinstance(grad, tf.IndexedSlices)
    grads[fused] = tf.convert_to_tensor(grad).numpy()
  np.testing.assert_allclose(grads[True], grads[False], rtol=1e-6)
  assert np.count_nonzero(grads[True].any(axis=1)) == 4  # rows 1, 2, 7, 9


def test_a_value_read_before_the_update_keeps_its_value():
  """Copy-on-read: the in-place update never writes into a dense read."""
  table = E.TableConfig(10, DIM, name="t")
  emb = backends.TensorCoreEmbedding({"f": E.FeatureConfig(table)}, E.SGD(1.0))
  emb.build()
  var = emb.embedding_tables[table]
  before = var.read_value()  # aliases the buffer until a sparse access
  kept = before.numpy().copy()
  with tf.GradientTape() as tape:
    acts = emb({"f": tf.constant([3, 4])}, training=True)
    loss = tf.reduce_sum(acts["f"])
  emb.apply_gradients(tape.gradient(loss, acts))
  np.testing.assert_array_equal(before.numpy(), kept)
  np.testing.assert_allclose(var.numpy()[[3, 4]], kept[[3, 4]] - 1.0, rtol=1e-6)


def test_unchecked_out_of_range_id_is_an_error_in_the_kernel():
  table = E.TableConfig(10, DIM, name="t")
  feature = E.FeatureConfig(table, name="f")
  feature.validate_weights_and_indices = False  # Python checks off
  emb = backends.TensorCoreEmbedding({"f": feature}, E.SGD(1.0))
  emb.build()
  with pytest.raises(
    tf.errors.InvalidArgumentError, match=r"id 12 .*\[0, 10\)"
  ):
    emb({"f": tf.constant([3, 12])}, training=True)


def test_sparse_apply_refuses_mismatched_slots():
  ops = kernels.load()
  table = tf.Variable(tf.zeros([5, 4]))
  acc = tf.Variable(tf.zeros([6, 4]))
  attrs = optimizers.fused_attrs(E.Adagrad(0.1))
  with pytest.raises(tf.errors.InvalidArgumentError, match="slot 1 has shape"):
    ops.recsys_sparse_apply(
      table=table.handle,
      slots=[acc.handle],
      ids=tf.constant([1], tf.int64),
      grads=tf.ones([1, 4]),
      learning_rate=0.1,
      rounding_step=0,
      **attrs,
    )


@pytest.mark.parametrize(
  "opt",
  [
    E.SGD(0.3, clipvalue=0.5),
    E.Adagrad(0.2, weight_decay_factor=0.01, clip_weight_max=0.3),
    E.Adam(
      0.1,
      multiply_weight_decay_factor_by_learning_rate=True,
      weight_decay_factor=0.5,
    ),
  ],
  ids=["sgd", "adagrad", "adam"],
)
@pytest.mark.parametrize("scaled", [False, True])
def test_bag_apply_equals_row_gradients_then_sparse_apply(opt, scaled):
  # The fused backward-and-update kernel does the two ops' float32
  # operations in the same order: the same bits.
  ops = kernels.load()
  rng = np.random.default_rng(7)
  n, segs, vocab, dim = 500, 60, 300, 5
  ids = (rng.pareto(0.8, n) * 20).astype(np.int64) % vocab
  segments = rng.integers(0, segs, n).astype(np.int32)
  scale = rng.uniform(0.1, 2.0, n).astype(np.float32) if scaled else []
  scale = tf.constant(scale, tf.float32)
  grads = tf.constant(rng.normal(size=(segs, dim)), tf.float32)
  init = rng.normal(size=(vocab, dim)).astype(np.float32)
  names = opt._slot_names()  # pylint: disable=protected-access
  attrs = optimizers.fused_attrs(opt)
  states = []
  for fused in (False, True):
    table = tf.Variable(init)
    slots = [tf.Variable(tf.fill([vocab, dim], 0.1)) for _ in names]
    _, unique, index = ops.recsys_bag_lookup(
      table=table.handle,
      ids=ids,
      segments=segments,
      scale=scale,
      num_segments=segs,
    )
    if fused:
      ops.recsys_bag_apply(
        table=table.handle,
        slots=[v.handle for v in slots],
        unique_ids=unique,
        grads=grads,
        index=index,
        segments=segments,
        scale=scale,
        learning_rate=0.1,
        rounding_step=0,
        **attrs,
      )
    else:
      row_grads = ops.recsys_row_gradients(
        grads=grads,
        index=index,
        segments=segments,
        scale=scale,
        num_rows=tf.size(unique, out_type=tf.int32),
      )
      ops.recsys_sparse_apply(
        table=table.handle,
        slots=[v.handle for v in slots],
        ids=unique,
        grads=row_grads,
        learning_rate=0.1,
        rounding_step=0,
        **attrs,
      )
    states.append([table.numpy()] + [v.numpy() for v in slots])
  assert not np.array_equal(states[0][0], init)  # the step did something
  for want, got in zip(*states):
    np.testing.assert_array_equal(got, want)


def test_bag_apply_refuses_out_of_range_index():
  ops = kernels.load()
  table = tf.Variable(tf.zeros([5, 4]))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="index 2 or segment 0 at position 1"
  ):
    ops.recsys_bag_apply(
      table=table.handle,
      slots=[],
      unique_ids=tf.constant([1, 3], tf.int64),
      grads=tf.ones([1, 4]),
      index=tf.constant([0, 2], tf.int32),
      segments=tf.constant([0, 0], tf.int32),
      scale=tf.zeros([0]),
      learning_rate=0.1,
      rounding_step=0,
      **optimizers.fused_attrs(E.SGD(0.1)),
    )
  np.testing.assert_array_equal(table.numpy(), 0.0)  # nothing was applied


@pytest.mark.parametrize(
  "opt, expected",
  [
    (E.SGD(0.1), "sgd"),
    (E.Adagrad(0.1), "adagrad"),
    (E.Adam(0.1), "adam"),
    (E.Adam(0.1, lazy_adam=False), None),
    (E.FTRL(0.1), None),
    (E.AdagradMomentum(0.1, momentum=0.9), None),
  ],
)
def test_fused_attrs_cover_sgd_adagrad_lazy_adam(opt, expected):
  attrs = optimizers.fused_attrs(opt)
  assert (attrs and attrs["optimizer"]) == expected


def _python(code: str, **env) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    check=False,
    timeout=300,
    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
    cwd=os.path.dirname(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ),
  )


def test_switched_off_by_environment_falls_back_to_tf_ops():
  """And so do the dynamic tables' indices (their update's TF ops)."""
  out = _python(
    "import recsys; from backends.tensorcore import kernels; "
    "print(kernels.load())\n"
    "import tensorflow as tf\n"
    "from tests.backends.test_vocabulary_fused import dynamic_backend\n"
    "emb = dynamic_backend()\n"
    "print('fused', emb.dynamic_tables()['t'].fused)\n"
    "rows = emb.map_ids({'f': tf.constant([7, 2**40, 7])}, training=True)\n"
    "print('rows', rows['f'].numpy().tolist())\n",
    RECSYS_FUSED_KERNELS="0",
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout.splitlines() == ["None", "fused False", "rows [0, 1, 0]"]
  assert "RECSYS_FUSED_KERNELS=0" in out.stderr


@pytest.mark.slow
def test_compiler_failure_is_reported_and_training_falls_back(tmp_path):
  fake = tmp_path / "fake-g++"
  fake.write_text(
    "#!/bin/sh\necho 'embedding_ops.cc:1: error: no compiler here' >&2\nexit "
    "1\n"
  )
  fake.chmod(0o755)
  code = (
    "import recsys, tensorflow as tf, backends\n"
    "E = tf.tpu.experimental.embedding\n"
    "t = E.TableConfig(5, 2, name='t')\n"
    "emb = backends.TensorCoreEmbedding({'f': E.FeatureConfig(t)}, "
    "E.SGD(1.0))\n"
    "emb.build()\n"
    "print('kernels', emb._kernels)\n"
    "with tf.GradientTape() as tape:\n"
    "  acts = emb({'f': tf.constant([1])}, training=True)\n"
    "emb.apply_gradients(tape.gradient(tf.reduce_sum(acts['f']), acts))\n"
  )
  out = _python(code, CXX=str(fake), RECSYS_KERNEL_DIR=str(tmp_path / "cache"))
  assert out.returncode == 0, out.stderr
  assert "kernels None" in out.stdout
  assert "no compiler here" in out.stderr  # the compiler's error, in the log


def test_module_command_builds_and_prints_the_library():
  out = subprocess.run(
    [sys.executable, "-m", "backends.tensorcore.kernels"],
    capture_output=True,
    text=True,
    check=False,
    timeout=300,
    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == str(kernels.library_path())


@pytest.mark.parametrize(
  "ids",
  [
    np.arange(0, 1 << 20, 1 << 9),  # shared low bits
    np.random.default_rng(0).integers(0, 1 << 20, 3000),  # repeats
    np.array([5, 5, 0, 7, 0, 5]),
    np.array([], np.int64),
  ],
  ids=["powers_of_two", "random", "small", "empty"],
)
def test_lookup_deduplicates_in_first_occurrence_order(ids):
  ops = kernels.load()
  table = tf.Variable(tf.random.stateless_normal([1 << 20, 2], seed=[1, 2]))
  ids = ids.astype(np.int64)
  acts, unique, index = ops.recsys_bag_lookup(
    table=table.handle,
    ids=ids,
    segments=np.arange(len(ids), dtype=np.int32),
    scale=tf.zeros([0]),
    num_segments=len(ids),
  )
  want_unique, want_index = tf.unique(
    tf.constant(ids, tf.int64), out_idx=tf.int32
  )
  np.testing.assert_array_equal(unique.numpy(), want_unique.numpy())
  np.testing.assert_array_equal(index.numpy(), want_index.numpy())
  np.testing.assert_array_equal(
    acts.numpy(), tf.gather(table, ids).numpy().reshape(-1, 2)
  )
  # The lookup as two ops (steps of few tables): the same outputs, bit for
  # bit (one kernel class sums both), with unsorted segments and a scale.
  dedup_unique, dedup_index = ops.recsys_bag_dedup(ids=ids, num_rows=1 << 20)
  np.testing.assert_array_equal(dedup_unique.numpy(), unique.numpy())
  np.testing.assert_array_equal(dedup_index.numpy(), index.numpy())
  rng = np.random.default_rng(len(ids))
  segments = rng.integers(0, 7, len(ids)).astype(np.int32)
  scale = rng.uniform(0.5, 2.0, len(ids)).astype(np.float32)
  want_acts, _, _ = ops.recsys_bag_lookup(
    table=table.handle,
    ids=ids,
    segments=segments,
    scale=scale,
    num_segments=7,
  )
  sums = ops.recsys_bag_sums(
    table=table.handle,
    ids=ids,
    segments=segments,
    scale=scale,
    num_segments=7,
  )
  np.testing.assert_array_equal(sums.numpy(), want_acts.numpy())


def test_bag_dedup_and_sums_refuse_out_of_range_ids():
  ops = kernels.load()
  table = tf.Variable(tf.zeros([10, 2]))
  ids = np.array([3, 12, -1], np.int64)
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"id 12 at position 1 is outside the table's rows \[0, 10\)",
  ):
    ops.recsys_bag_dedup(ids=ids, num_rows=10)
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"id 12 at position 1 is outside the table's rows \[0, 10\)",
  ):
    ops.recsys_bag_sums(
      table=table.handle,
      ids=ids,
      segments=np.zeros(3, np.int32),
      scale=tf.zeros([0]),
      num_segments=1,
    )


@pytest.mark.parametrize("num_tables, two_ops", [(1, True), (8, False)])
def test_few_tables_look_up_with_two_ops(num_tables, two_ops):
  # One table on 2 inter-op threads: sums and de-duplication as two ops the
  # executor runs side by side; 8 tables keep every thread busy: one op each.
  config = {
    f"f{i}": E.FeatureConfig(E.TableConfig(10, DIM, name=f"t{i}"))
    for i in range(num_tables)
  }
  emb = backends.TensorCoreEmbedding(config, E.SGD(1.0))
  emb.build()
  feats = {k: tf.constant([3, 4, 3], tf.int64) for k in config}

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      acts = emb(feats, training=True)
      loss = tf.add_n([tf.reduce_sum(a) for a in acts.values()])
    emb.apply_gradients(tape.gradient(loss, acts))

  inter = tf.config.threading.get_inter_op_parallelism_threads()
  if not 1 < (inter or os.cpu_count() or 1) <= 8:
    pytest.skip("the choice depends on the inter-op threads")
  types = [
    op.type for op in step.get_concrete_function().graph.get_operations()
  ]
  assert ("RecsysBagDedup" in types) == two_ops
  assert types.count("RecsysBagLookup") == (0 if two_ops else num_tables)
  table = emb.embedding_tables[config["f0"].table]
  before = table.numpy()
  step()
  # Row 3 got two gradients of 1, row 4 one (SGD, rate 1), in float32.
  want = before.copy()
  want[3] -= np.float32(2.0)
  want[4] -= np.float32(1.0)
  np.testing.assert_array_equal(table.numpy(), want)


@pytest.mark.parametrize("weighted", [False, True])
def test_padded_bags_flatten_like_the_tf_ops(weighted):
  from backends import inputs  # pylint: disable=g-import-not-at-top

  bags = [[3, 1, 4], [], [1, 5, 9, 2, 6], [5]]  # the 5-id bag is cut to 4
  weights = [[0.5 + i for i, _ in enumerate(b)] for b in bags]
  ragged = tf.ragged.constant(bags, dtype=tf.int64)
  w = tf.ragged.constant(weights, dtype=tf.float32) if weighted else None
  padded = inputs.pad_bags(ragged, w, 4)
  table = E.TableConfig(10, DIM, name="t")
  layout = inputs.FeatureLayout("f", E.FeatureConfig(table, name="f"), "t")
  fused = inputs._from_padded(layout, padded, kernels.load())  # pylint: disable=protected-access
  tf_ops = inputs._from_padded(layout, padded)  # pylint: disable=protected-access
  for got, want, what in zip(
    fused, tf_ops, ("ids", "rows", "positions", "weights", "cut")
  ):
    if want is None:
      assert got is None, what
    else:
      np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=what)
  assert int(fused[4]) == 1


def _numpy_flat(ids, lengths):
  """The real entries of padded bags in row-major order, and their rows."""
  width = ids.shape[1]
  real = np.arange(width)[None, :] < np.minimum(lengths, width)[:, None]
  return ids[real], np.nonzero(real)[0]


def test_padded_bags_id_check_names_the_first_bad_id_and_its_row():
  ops = kernels.load()
  ids = np.array([[3, 1, 0], [5, 9, 0], [4, 10, -2], [12, 0, 0]], np.int64)
  lengths = np.array([2, 2, 3, 1], np.int64)  # 10 at row 2 comes first
  feature = "feature `f` (table `t`, vocabulary_size=10)"
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"feature `f` \(table `t`, vocabulary_size=10\) got id 10 at "
    r"batch row 2; ids must be in \[0, 10\)\.",
  ):
    ops.recsys_padded_bags(
      ids=ids,
      lengths=lengths,
      weights=tf.zeros([4, 0]),
      vocabulary_size=10,
      feature=feature,
    )
  with pytest.raises(
    tf.errors.InvalidArgumentError, match=r"got id -2 at batch row 2"
  ):
    ops.recsys_padded_bags(
      ids=np.where(ids == 10, 1, ids),
      lengths=lengths,
      weights=tf.zeros([4, 0]),
      vocabulary_size=10,
      feature=feature,
    )


def test_padded_bags_id_check_reads_only_real_entries():
  # Padding (past a bag's length) may hold anything: it is never looked up.
  ops = kernels.load()
  ids = np.array([[3, 99, -7], [9, 1, 0], [0, 0, 55]], np.int64)
  lengths = np.array([1, 3, 0], np.int64)
  values, rows, _, _, cut, _ = ops.recsys_padded_bags(
    ids=ids,
    lengths=lengths,
    weights=tf.zeros([3, 0]),
    vocabulary_size=10,
    feature="feature `f`",
  )
  want_values, want_rows = _numpy_flat(ids, lengths)
  np.testing.assert_array_equal(values.numpy(), want_values)
  np.testing.assert_array_equal(rows.numpy(), want_rows)
  assert int(cut) == 0


@pytest.mark.parametrize("weighted", [False, True])
def test_padded_bags_drop_leaves_out_ids_outside_the_table(weighted):
  # Real entries outside [0, 10) are left out (their positions kept for the
  # others), counted; padding may hold anything; a bag longer than W is cut.
  ops = kernels.load()
  ids = np.array(
    [[3, -1, 7], [10, 10, 99], [0, 0, 55], [9, 2**40, 4], [1, 2, 3]],
    np.int64,
  )
  lengths = np.array([3, 2, 0, 3, 5], np.int64)
  weights = np.arange(15, dtype=np.float32).reshape(5, 3) + 0.5
  values, rows, positions, out_w, cut, dropped = ops.recsys_padded_bags(
    ids=ids,
    lengths=lengths,
    weights=weights if weighted else tf.zeros([5, 0]),
    vocabulary_size=10,
    drop=True,
  )
  real = np.arange(3)[None, :] < np.minimum(lengths, 3)[:, None]
  kept = real & (ids >= 0) & (ids < 10)
  np.testing.assert_array_equal(values.numpy(), ids[kept])
  np.testing.assert_array_equal(rows.numpy(), np.nonzero(kept)[0])
  np.testing.assert_array_equal(positions.numpy(), np.nonzero(kept)[1])
  if weighted:
    np.testing.assert_array_equal(out_w.numpy(), weights[kept])
  assert int(dropped) == int((real & ~kept).sum()) == 4
  assert int(cut) == 2


def _padded_step(emb, feature):
  @tf.function
  def step(features):
    with tf.GradientTape() as tape:
      acts = emb.lookup(features, training=True)
      loss = tf.reduce_sum(acts[feature])
    emb.apply_gradients(tape.gradient(loss, acts))

  return step


def test_out_of_range_padded_id_fails_the_graph_step_naming_it():
  # In a graph the fused op that flattens padded bags checks the ids (the
  # Python check's message); nothing is updated.
  table = E.TableConfig(10, DIM, name="t")
  emb = backends.TensorCoreEmbedding(
    {"f": E.FeatureConfig(table)}, E.SGD(1.0), bag_widths=3
  )
  emb.build()
  before = emb.embedding_tables[table].numpy()
  padded, _ = emb.preprocess(
    {"f": tf.ragged.constant([[1, 2], [3, 12, 4], [5]], dtype=tf.int64)}
  )
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"feature `f` \(table `t`, vocabulary_size=10\) got id 12 at "
    r"batch row 1; ids must be in \[0, 10\)",
  ):
    _padded_step(emb, "f")(padded)
  np.testing.assert_array_equal(emb.embedding_tables[table].numpy(), before)


def test_drop_policy_on_padded_bags_in_a_graph_still_drops_and_counts():
  # The op that flattens the bags drops (and counts) the ids outside.
  table = E.TableConfig(10, DIM, combiner="sum", name="t")
  emb = backends.TensorCoreEmbedding(
    {"f": E.FeatureConfig(table)},
    E.SGD(1.0),
    bag_widths=3,
    invalid_ids="drop",
  )
  emb.build()
  var = emb.embedding_tables[table]
  before = var.numpy()
  padded, _ = emb.preprocess(
    {"f": tf.ragged.constant([[1, 2], [3, 12, 4], [-5]], dtype=tf.int64)}
  )
  _padded_step(emb, "f")(padded)
  changed = np.nonzero((var.numpy() != before).any(axis=1))[0]
  np.testing.assert_array_equal(changed, [1, 2, 3, 4])  # SGD(1): each row - 1
  np.testing.assert_allclose(var.numpy()[changed], before[changed] - 1.0)
  assert emb.input_stats()["invalid_ids"]["f"] == 2


def _numpy_sums(terms, targets, scale, num_rows):
  """out[targets[i]] += terms[i] * scale[i] from zeros, in entry order."""
  out = np.zeros((num_rows, terms.shape[1]), np.float32)
  for i, row in enumerate(targets):
    term = terms[i] if scale is None else terms[i] * np.float32(scale[i])
    out[row] = out[row] + term
  return out


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("order", ["first_occurrence", "any"])
def test_row_gradients_and_bag_sums_equal_numpy_bit_for_bit(scaled, order):
  # Rows that no entry reaches come out 0, rows reached in any order sum in
  # entry order; a -0.0 term gives +0.0 (0.0 + -0.0), as zero-then-add.
  ops = kernels.load()
  rng = np.random.default_rng(3)
  n, segs, vocab, dim = 400, 50, 40, 6
  ids = rng.integers(0, vocab - 1, n).astype(np.int64)
  segments = rng.integers(0, segs - 5, n).astype(np.int32)
  if order == "first_occurrence":
    segments = np.sort(segments)
  # The last id alone in its bag and its row: a -0.0 row and gradient. The
  # 4 bags after it stay empty.
  ids[-1], segments[-1] = vocab - 1, segs - 5
  scale = rng.uniform(0.1, 2.0, n).astype(np.float32) if scaled else None
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  table[vocab - 1] = -0.0
  acts, unique, index = ops.recsys_bag_lookup(
    table=tf.Variable(table).handle,
    ids=ids,
    segments=segments,
    scale=tf.constant(scale if scaled else [], tf.float32),
    num_segments=segs,
  )
  want_acts = _numpy_sums(table[ids], segments, scale, segs)
  np.testing.assert_array_equal(acts.numpy(), want_acts)
  np.testing.assert_array_equal(np.signbit(acts.numpy()), np.signbit(want_acts))
  grads = rng.normal(size=(segs, dim)).astype(np.float32)
  grads[segs - 5] = -0.0
  index = index.numpy()
  num_rows = len(unique)
  if order == "any":  # rows numbered in another order, some never reached
    num_rows += 7
    index = rng.permutation(num_rows)[index].astype(np.int32)
  row_grads = ops.recsys_row_gradients(
    grads=grads,
    index=index,
    segments=segments,
    scale=tf.constant(scale if scaled else [], tf.float32),
    num_rows=num_rows,
  ).numpy()
  want = _numpy_sums(grads[segments], index, scale, num_rows)
  np.testing.assert_array_equal(row_grads, want)
  np.testing.assert_array_equal(np.signbit(row_grads), np.signbit(want))


@pytest.mark.parametrize("capacity", [0, 3, 40])
def test_buckets_fill_the_send_buffer_as_the_tf_ops_do(capacity):
  """`RecsysBuckets` against the all-to-all's TF path (`_buckets` and its
  scatter): the same slots, buffer and counts, with invalid ids and
  buckets that overflow (capacity 3, even 0) among them."""
  from backends.storage import exchange

  rng = np.random.default_rng(capacity)
  num, n = 4, 97
  owner = tf.constant(rng.integers(0, num, n), tf.int32)
  local = tf.constant(rng.integers(0, 10**9, n), tf.int64)
  valid = tf.constant(rng.random(n) < 0.8)
  slot, send, counts = kernels.load().recsys_buckets(
    owner=owner, local=local, valid=valid, num_shards=num, capacity=capacity
  )
  want_slot, want_counts = exchange._buckets(owner, valid, num, capacity)
  want_send = tf.scatter_nd(
    want_slot[:, tf.newaxis], local, [num * capacity + 1]
  )[: num * capacity]
  np.testing.assert_array_equal(slot, want_slot)
  np.testing.assert_array_equal(send, want_send)
  np.testing.assert_array_equal(counts, want_counts)
  with pytest.raises(tf.errors.InvalidArgumentError, match="owner 4"):
    kernels.load().recsys_buckets(
      owner=tf.constant([4]),
      local=tf.constant([1], tf.int64),
      valid=tf.constant([True]),
      num_shards=num,
      capacity=capacity,
    )
