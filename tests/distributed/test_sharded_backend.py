"""The parameter_servers backend on an in-process cluster against its
references.

One subprocess (`sharded_run.py`) starts 2 workers and 2 parameter servers
in-process, builds `sharded_case`'s tables with the `parameter_servers` backend
and trains 2 steps through a `ClusterCoordinator`. This process computes the
references: the same steps on `tensorcore` (tested against TF's own classes),
the rows' gradients and TPU-math updates in NumPy
(`backends/reference_optimizers`), and TF's "div" partition of the rows.
Checkpoints are restored across backends both ways.
"""

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import backends  # noqa: E402
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import checkpoint as ckpt_lib  # noqa: E402
from backends import conformance  # noqa: E402
from backends import reference_optimizers as ref  # noqa: E402
from backends.parameter_servers import backend as ps_backend  # noqa: E402
from backends.parameter_servers import storage as parameter_servers  # noqa: E402
from tests.distributed import cluster as cluster_lib  # noqa: E402
from tests.distributed import sharded_case as case  # noqa: E402

E = tf.tpu.experimental.embedding


def _tensorcore(config=None):
  emb = backends.create(
    config or case.feature_config(),
    None,
    tf.distribute.get_strategy(),
    backend="tensorcore",
  )
  emb.build()
  for table, var in emb.embedding_tables.items():
    var.assign(case.table_values()[table.name])
  return emb


def _train_tensorcore():
  """The sharded run's steps on tensorcore; returns (backend, acts per step)."""
  emb = _tensorcore()
  acts_per_step = []
  for raw in case.raw_batches():
    acts = conformance.linear_loss_step(emb, *case.tensors(raw))
    acts_per_step.append({k: v.numpy() for k, v in acts.items()})
  return emb, acts_per_step


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """The sharded run's outputs; it restores a tensorcore checkpoint too."""
  tmp = tmp_path_factory.mktemp("sharded")
  source = _tensorcore()
  slots = source.slot_variables()
  rng = np.random.default_rng(3)
  for name in slots:  # distinctive slot values to restore
    for var in slots[name].values():
      var.assign(rng.uniform(0.1, 1.0, var.shape).astype(np.float32))
  tc_path = tf.train.Checkpoint(embedding=source).save(str(tmp / "tc" / "ckpt"))
  expected_restore = {
    f"{t.name}": v.numpy() for t, v in source.embedding_tables.items()
  }
  expected_restore.update(
    {f"{n}/{s}": v.numpy() for n, sl in slots.items() for s, v in sl.items()}
  )
  cluster_lib.run_script(
    ["-m", "tests.distributed.sharded_run", str(tmp), tc_path], timeout=300
  )
  with open(tmp / "devices.json", encoding="utf-8") as f:
    devices = json.load(f)
  return {
    "npz": np.load(tmp / "result.npz"),
    "devices": devices,
    "ckpt": str(tmp / "ckpt-1"),
    "expected_restore": expected_restore,
  }


def _div_offsets(rows, shards):
  base, extra = divmod(rows, shards)
  sizes = [base + (i < extra) for i in range(shards)]
  return np.cumsum([0] + sizes)


@pytest.mark.slow
def test_each_parameter_server_holds_only_its_rows(run):
  npz, devices = run["npz"], run["devices"]
  assert (
    devices["backend"] == "parameter_servers"
  )  # what "auto" picked under PS
  for table, rows in (("users", 23), ("items", 11), ("ads", 5)):
    want = [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)]
    assert devices["tables"][table] == want
    for slot_devices in devices["slots"][table].values():
      assert slot_devices == want  # slots live with their table's rows
    offsets = _div_offsets(rows, 2)
    full = npz[f"table/{table}"]
    for i in range(2):
      np.testing.assert_array_equal(
        npz[f"shard/{table}/{i}"], full[offsets[i] : offsets[i + 1]]
      )
    for key in npz.files:
      if key.startswith(f"slotshard/{table}/") and key.endswith("/0"):
        slot = key.split("/")[2]
        np.testing.assert_array_equal(
          npz[key], npz[f"slot/{table}/{slot}"][: offsets[1]]
        )


@pytest.mark.slow
def test_lookups_and_updates_equal_tensorcore(run):
  npz = run["npz"]
  emb, acts_per_step = _train_tensorcore()
  for step, acts in enumerate(acts_per_step):
    for name, value in acts.items():
      np.testing.assert_allclose(
        npz[f"acts{step}/{name}"],
        value,
        rtol=1e-5,
        atol=1e-6,
        err_msg=f"{step} {name}",
      )
  for table, var in emb.embedding_tables.items():
    np.testing.assert_allclose(
      npz[f"table/{table.name}"], var.numpy(), rtol=1e-5, atol=1e-6
    )
  for name, slots in emb.slot_variables().items():
    for slot, var in slots.items():
      np.testing.assert_allclose(
        npz[f"slot/{name}/{slot}"], var.numpy(), rtol=1e-5, atol=1e-6
      )


def _row_grads(raw, table: str, vocab: int, dim: int) -> np.ndarray:
  """d(sum(acts * cot))/d(table) in NumPy, from the combiners' definitions."""
  g = np.zeros((vocab, dim))
  cot = raw["cot"]
  if table == "users":
    for b, bag in enumerate(raw["user"]):  # mean
      for i in bag:
        g[i] += cot["user"][b] / len(bag)
    for b, seq in enumerate(raw["history"]):  # sequence: position p < L
      for p, i in enumerate(seq[: case.SEQ]):
        g[i] += cot["history"][b, p]
  elif table == "items":
    for b, (bag, w) in enumerate(zip(raw["item"], raw["item_w"])):  # sqrtn
      norm = np.sqrt(np.sum(np.square(np.asarray(w, np.float64))))
      for i, wi in zip(bag, w):
        g[i] += wi / norm * cot["item"][b]
  else:
    for b, row in enumerate(raw["ad"]):  # sum over the dense [B, 2] ids
      for i in row:
        g[i] += cot["ad"][b]
  return g


@pytest.mark.slow
def test_updates_follow_the_numpy_tpu_reference(run):
  npz = run["npz"]
  config = case.feature_config()
  tables = {f.table.name: f.table for f in config.values()}
  for name, table in tables.items():
    w = case.table_values()[name].astype(np.float64)
    slots = {
      k: v.astype(np.float64)
      for k, v in ref.initial_slots(table.optimizer, *w.shape).items()
    }
    for raw in case.raw_batches():
      g = _row_grads(raw, name, *w.shape)
      ids = np.nonzero(np.any(g != 0, axis=1))[0]
      w, slots = ref.apply(table.optimizer, w, slots, ids, g[ids])
    np.testing.assert_allclose(
      npz[f"table/{name}"], w, rtol=2e-5, atol=2e-5, err_msg=name
    )
    for slot, value in slots.items():
      np.testing.assert_allclose(
        npz[f"slot/{name}/{slot}"],
        value,
        rtol=2e-5,
        atol=2e-5,
        err_msg=f"{name}/{slot}",
      )


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tensorcore", "serving"])
def test_sharded_checkpoint_restores_on_one_machine(run, target):
  npz = run["npz"]
  emb = backends.create(
    case.feature_config(), None, tf.distribute.get_strategy(), backend=target
  )
  ckpt_lib.restore(emb, run["ckpt"])
  emb.build()
  for table, var in emb.embedding_tables.items():
    np.testing.assert_array_equal(var.numpy(), npz[f"table/{table.name}"])
  if target == "tensorcore":
    for name, slots in emb.slot_variables().items():
      for slot, var in slots.items():
        np.testing.assert_array_equal(var.numpy(), npz[f"slot/{name}/{slot}"])


@pytest.mark.slow
def test_tensorcore_checkpoint_restores_into_sharded_tables(run):
  npz, want = run["npz"], run["expected_restore"]
  for key, value in want.items():
    np.testing.assert_array_equal(npz[f"restored/{key}"], value, err_msg=key)
  assert run["devices"]["restored"]["users"] == [
    f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(2)
  ]


def test_refused_outside_a_parameter_server_strategy():
  with pytest.raises(
    backends.BackendUnavailableError,
    match=r"needs a ParameterServerStrategy .* this is "
    r"_DefaultDistributionStrategy.*use 'tensorcore'",
  ):
    backends.create(
      case.feature_config(),
      None,
      tf.distribute.get_strategy(),
      backend="parameter_servers",
    )
  assert "parameter_servers" not in backends.available(
    tf.distribute.get_strategy()
  )


def test_table_partitioner_splits_only_tables_being_built():
  part = ps_backend.TablePartitioner(num_shards=4)
  shape = tf.TensorShape([23, 7])
  assert part(shape, tf.float32) == [1, 1]  # a dense-model variable
  with parameter_servers.building_tables():
    assert part(shape, tf.float32) == [4, 1]
    assert part(tf.TensorShape([3, 7]), tf.float32) == [3, 1]  # <= rows
    by_size = ps_backend.TablePartitioner(4, min_shard_bytes=23 * 7 * 4 // 2)
    assert by_size(shape, tf.float32) == [2, 1]
  assert part(shape, tf.float32) == [1, 1]
