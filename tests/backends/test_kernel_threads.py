"""The fused kernels split over the intra-op pool give bit-identical results.

By default (RECSYS_KERNEL_PARALLEL_MIN_WORK unset or `auto`) a fused call
splits its row loops over the intra-op threads the step's other tables leave
idle (one table here: all of them); set to N, every op above N floats of rows
splits. By output, keeping every output's summation order.
Crash-resume compares states exactly, so the same training steps with 1 and
2 intra-op threads must agree bit for bit (a bfloat16 table's stochastic
rounding too), and agree with the TF ops as
closely as the one-thread kernels do. The pool size is fixed when TF starts,
so each setting runs in its own process.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from backends.tensorcore import kernels

MIN_PARALLEL_WORK = 1 << 16  # the threshold set here (floats of row traffic)
VOCAB, DIM, BATCH, WIDTH = 100_000, 16, 4096, 8

# Two training steps (Adagrad, `mean` combiner, one unweighted and one
# weighted padded feature on one table) with the given intra-op threads;
# saves the activations (the linear loss's gradients do not depend on them),
# the table and its accumulator, and the padded-bags op's output.
_SCRIPT = f"""
import json, sys
import numpy as np
import tensorflow as tf

from backends.layout import TableLayout
threads, out, with_tf_ops = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(1)
import backends
from backends import inputs
from backends.tensorcore import kernels
E = tf.tpu.experimental.embedding
VOCAB, DIM, BATCH, WIDTH = {VOCAB}, {DIM}, {BATCH}, {WIDTH}

def batch(rng, weighted):
  lengths = rng.integers(0, WIDTH + 3, BATCH)       # some bags are cut
  ids = (rng.pareto(0.7, (BATCH, WIDTH)) * 50).astype(np.int64) % VOCAB
  weights = (rng.uniform(0.5, 2.0, (BATCH, WIDTH)) if weighted
             else np.zeros((BATCH, 0)))
  return inputs.PaddedBags(tf.constant(ids), tf.constant(lengths),
                           tf.constant(weights, tf.float32))

def train(fused, table_dtype="float32"):
  table = E.TableConfig(VOCAB, DIM, combiner="mean", name="t")
  config = {{"a": E.FeatureConfig(table, name="a"),
            "b": E.FeatureConfig(table, name="b")}}
  emb = backends.TensorCoreEmbedding(config, E.Adagrad(0.1),
                                     fused_kernels=fused,
                                     layouts=TableLayout(dtype=table_dtype))
  emb.build()
  var = emb.embedding_tables[table]
  var.assign(tf.cast(tf.random.stateless_normal(var.shape, seed=[4, 2]),
                     var.dtype))
  rng = np.random.default_rng(11)
  stats, state = [], {{}}
  for step in range(2):
    feats = {{"a": batch(rng, False), "b": batch(rng, True)}}
    cot = {{k: tf.constant(rng.normal(size=(BATCH, DIM)), tf.float32)
           for k in feats}}
    n = sum(int(np.minimum(f.lengths.numpy(), WIDTH).sum())
            for f in feats.values())
    u = len(np.unique(np.concatenate(
        [f.ids.numpy()[np.arange(WIDTH) < np.minimum(f.lengths.numpy(),
                                                     WIDTH)[:, None]]
         for f in feats.values()])))
    stats.append([n, u])
    with tf.GradientTape() as tape:
      acts = emb.lookup(feats, None, training=True)
      tape.watch(acts)
      state.update({{f"acts{{step}}_{{k}}": v.numpy()
                    for k, v in acts.items()}})
      loss = tf.add_n([tf.reduce_sum(acts[k] * cot[k]) for k in acts])
    emb.apply_gradients(tape.gradient(loss, acts))
  state["table"] = var.numpy().view(np.uint16 if var.dtype.size == 2
                                    else np.float32)
  for slots in emb.slot_variables().values():
    state.update({{k: v.numpy() for k, v in slots.items()}})
  return state, stats

fused, stats = train(True)
assert kernels.load() is not None
padded = kernels.load().recsys_padded_bags(
    *batch(np.random.default_rng(3), True))
result = {{f"fused/{{k}}": v for k, v in fused.items()}}
# A bfloat16 table: rows read narrow, updates rounded stochastically.
narrow, _ = train(True, "bfloat16")
result.update({{f"bf16/{{k}}": v for k, v in narrow.items()}})
# The lookup's de-duplication alone: ids Zipf-hot and spread, in bags.
rng = np.random.default_rng(5)
look_ids = (rng.pareto(0.7, 40_000) * 50).astype(np.int64) % VOCAB
look_segs = np.sort(rng.integers(0, BATCH, 40_000)).astype(np.int32)
look_table = tf.Variable(tf.random.stateless_normal([VOCAB, DIM], seed=[1, 2]))
look_scale = rng.uniform(0.5, 2.0, 40_000).astype(np.float32)
shuffled = rng.permutation(look_segs)
# Sorted segments (the split's contiguous ranges), unsorted ones (its
# filtering), and a scale: outputs and error messages of any split.
for name, segs, scale in (("lookup", look_segs, np.zeros([0], np.float32)),
                          ("lookup_unsorted", shuffled, look_scale)):
  for i, t in enumerate(kernels.load().recsys_bag_lookup(
      table=look_table.handle, ids=look_ids, segments=segs,
      scale=scale, num_segments=BATCH, concurrent_calls=1)):
    result[f"{{name}}/{{i}}"] = t.numpy()
result["lookup/ids"] = look_ids
for name, pos, bad_id, bad_seg in (("late_id", 39_000, VOCAB, 0),
                                   ("negative_id", 20_000, -3, 0),
                                   ("segment", 30_000, 1, BATCH),
                                   ("segment_at_end", 39_999, 1, BATCH),
                                   ("id_before_segment", 10_000, VOCAB, -1)):
  bad_ids, bad_segs = look_ids.copy(), look_segs.copy()
  bad_ids[pos] = bad_id
  bad_segs[pos + (name == "id_before_segment") * 5_000] = (
      bad_seg if name != "id_before_segment" else -1)
  try:
    kernels.load().recsys_bag_lookup(
        table=look_table.handle, ids=bad_ids, segments=bad_segs,
        scale=tf.zeros([0]), num_segments=BATCH, concurrent_calls=1)
    result[f"error/{{name}}"] = np.array("no error")
  except tf.errors.InvalidArgumentError as e:
    result[f"error/{{name}}"] = np.array(e.message)
result.update({{f"padded/{{i}}": t.numpy() for i, t in enumerate(padded)}})
if with_tf_ops:
  tf_ops, _ = train(False)
  result.update({{f"tf_ops/{{k}}": v for k, v in tf_ops.items()}})
np.savez(out, **result)
print(json.dumps(stats))
"""


def _train(tmp_path, threads: int, with_tf_ops: bool, forced: bool = True):
  out = tmp_path / f"threads{threads}{'forced' if forced else 'auto'}.npz"
  root = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  env = {
    **os.environ,
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "PYTHONPATH": os.pathsep.join(
      filter(None, [root, os.environ.get("PYTHONPATH")])
    ),
  }
  env.pop("RECSYS_KERNEL_PARALLEL_MIN_WORK", None)  # the default: auto
  if forced:
    env["RECSYS_KERNEL_PARALLEL_MIN_WORK"] = str(MIN_PARALLEL_WORK)
  proc = subprocess.run(
    [
      sys.executable,
      "-c",
      _SCRIPT,
      str(threads),
      str(out),
      "1" if with_tf_ops else "0",
    ],
    capture_output=True,
    text=True,
    check=False,
    timeout=300,
    env=env,
    cwd=root,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  stats = json.loads(proc.stdout.strip().splitlines()[-1])
  with np.load(out) as data:
    return {k: data[k] for k in data.files}, stats


@pytest.fixture(scope="module")
def one_thread(tmp_path_factory):
  """The one-thread run, for both tests: with one intra-op thread nothing
  splits, whatever RECSYS_KERNEL_PARALLEL_MIN_WORK says."""
  return _train(tmp_path_factory.mktemp("one"), 1, with_tf_ops=False)


@pytest.mark.slow
@pytest.mark.skipif(kernels.load() is None, reason="fused kernels unavailable")
def test_one_and_two_intra_op_threads_give_identical_states(
  tmp_path, one_thread
):
  one, stats = one_thread
  two, _ = _train(tmp_path, 2, with_tf_ops=True)
  # Three threads: the lookup's bag sums split over two parts beside its
  # de-duplication (two threads: one part for each).
  three, _ = _train(tmp_path, 3, with_tf_ops=False)
  # Every op of the step is above the threshold, so two threads split it.
  for n, u in stats:
    assert n * DIM >= MIN_PARALLEL_WORK and u * DIM >= MIN_PARALLEL_WORK
  for key, value in one.items():
    np.testing.assert_array_equal(two[key], value, err_msg=key)
    np.testing.assert_array_equal(three[key], value, err_msg=key)
  # A bad entry fails every split naming the first one, as one thread does.
  assert "id 100000 at position 39000 is outside" in str(one["error/late_id"])
  assert "id -3 at position 20000" in str(one["error/negative_id"])
  assert "segment 4096 at position 30000" in str(one["error/segment"])
  # Still sorted: the split's contiguous ranges never reach it.
  assert "segment 4096 at position 39999" in str(one["error/segment_at_end"])
  assert "id 100000 at position 10000" in str(one["error/id_before_segment"])
  # The split de-duplication keeps tf.unique's first-occurrence order.
  ids = two["lookup/ids"]
  _, first = np.unique(ids, return_index=True)
  np.testing.assert_array_equal(two["lookup/1"], ids[np.sort(first)])
  np.testing.assert_array_equal(two["lookup/1"][two["lookup/2"]], ids)
  fused = sorted(k.split("/", 1)[1] for k in two if k.startswith("fused/"))
  assert fused == sorted(
    k.split("/", 1)[1] for k in two if k.startswith("tf_ops/")
  )
  for key in fused:
    # The one-thread kernels' tolerance against the TF ops
    # (test_fused_kernels.test_fused_steps_equal_tf_ops).
    np.testing.assert_allclose(
      two[f"fused/{key}"],
      two[f"tf_ops/{key}"],
      rtol=3e-6,
      atol=3e-7,
      err_msg=key,
    )


@pytest.mark.skipif(kernels.load() is None, reason="fused kernels unavailable")
def test_one_table_splits_by_itself_with_identical_states(tmp_path, one_thread):
  # The automatic split (the default): the step has one table, so its lookup
  # and update take both intra-op threads, and still match one thread.
  one, _ = one_thread
  two, _ = _train(tmp_path, 2, with_tf_ops=False, forced=False)
  assert sorted(one) == sorted(two)
  for key, value in one.items():
    np.testing.assert_array_equal(two[key], value, err_msg=key)
