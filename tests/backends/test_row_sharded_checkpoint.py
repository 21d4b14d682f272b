"""Row-sharded tables saved and restored by row slices, chunk by chunk.

References: the trained tables themselves (TF's whole-tensor reader of the
merged checkpoint), a replicated table on one replica restored from it,
TF's own `TPUEmbeddingForServing`, and other replica counts and layouts
restored by slices; the bundles written and read are counted.
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from backends import checkpoint as checkpoint_lib
from backends.layout import TableLayout
from backends.storage import row_init, row_sharded_checkpoint
from backends.mid_level.serving import ServingEmbedding
from backends.tensorcore.backend import TensorCoreEmbedding
from tests.backends import test_compiled_path as compiled
from tests.backends import test_row_sharded as sharded_case
from tests.conftest import mirrored_strategy

E = tf.tpu.experimental.embedding
state = compiled.table_state


def assert_equal(want, got):
  """Bit-identical: a restore moves values, it computes nothing."""
  assert sorted(want) == sorted(got)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
  """Chunks of 32 floats: every table spans several, shards end mid-chunk."""
  monkeypatch.setattr(row_init, "CHUNK_BYTES", 32 * 4)


def _save(emb, strategy, directory):
  """`row_sharded_checkpoint.save` through a CheckpointManager, as the
  Trainer."""
  root = tf.train.Checkpoint(embedding=emb)
  manager = tf.train.CheckpointManager(root, str(directory), max_to_keep=2)
  return row_sharded_checkpoint.save(
    root,
    strategy,
    lambda options: manager.save(checkpoint_number=7, options=options),
    chief=True,
  )


@pytest.fixture(scope="module")
def trained():
  """Two training steps on 2 replicas, contiguous rows (cached)."""
  return sharded_case.trained(
    2, False, layouts=TableLayout("row_sharded", row_layout="contiguous")
  )


def _fresh(replicas, **options):
  strategy = (
    mirrored_strategy(replicas)
    if replicas > 1
    else tf.distribute.get_strategy()
  )
  return sharded_case.make(strategy, **options)


def test_the_merged_checkpoint_is_tfs_full_tables(trained, tmp_path):
  path = _save(trained, mirrored_strategy(2), tmp_path)
  assert path == str(tmp_path / "ckpt-7")
  assert tf.train.latest_checkpoint(str(tmp_path)) == path
  # Only the merged checkpoint is left: no rows bundles, no renamed copy.
  left = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "*")))
  assert all(
    name.startswith(("ckpt-7.index", "ckpt-7.data-", "checkpoint"))
    for name in left
  ), left
  reader = tf.train.load_checkpoint(path)
  want = state(trained)
  sliced = row_sharded_checkpoint.sliced_keys(path)
  for name, value in want.items():
    table, slot = name.split("/")
    local = table if slot == "parameters" else f"{table}.S{slot}"
    key = f"embedding/{local}/.ATTRIBUTES/VARIABLE_VALUE"
    assert key in sliced
    np.testing.assert_array_equal(reader.get_tensor(key), value, err_msg=key)


@pytest.mark.parametrize(
  "replicas,layout",
  [
    (1, None),
    (2, "contiguous"),
    (3, "contiguous"),
    (4, "strided"),
    (8, "contiguous"),
  ],
  ids=["1-replicated", "2-contiguous", "3-contiguous", "4-strided", "8"],
)
def test_restores_into_any_replica_count_and_layout(
  trained, tmp_path, replicas, layout
):
  path = _save(trained, mirrored_strategy(2), tmp_path)
  options = (
    {}
    if layout is None
    else {"layouts": TableLayout("row_sharded", row_layout=layout)}
  )
  fresh = _fresh(replicas, **options)
  checkpoint_lib.restore(fresh, path)
  assert_equal(state(trained), state(fresh))


def test_tf_serving_embedding_reads_the_merged_checkpoint(trained, tmp_path):
  path = _save(trained, mirrored_strategy(2), tmp_path)
  sharded_case.assert_tf_serving_reads(path, state(trained))


def _counted_bundles(monkeypatch) -> tuple[list, list]:
  """`(written, read)`: each rows bundle's slice specs as it is saved, and
  each (key, slice spec) TF's RestoreV2 is asked for."""
  written: list = []
  read: list = []
  save_v2, restore_v2 = tf.raw_ops.SaveV2, tf.raw_ops.RestoreV2

  def counted_save(**kwargs):
    if ".rows-" in kwargs["prefix"]:
      written.append(kwargs["shape_and_slices"])
    return save_v2(**kwargs)

  def counted_restore(**kwargs):
    read.extend(zip(kwargs["tensor_names"], kwargs["shape_and_slices"]))
    return restore_v2(**kwargs)

  monkeypatch.setattr(tf.raw_ops, "SaveV2", counted_save)
  monkeypatch.setattr(tf.raw_ops, "RestoreV2", counted_restore)
  return written, read


def test_each_worker_writes_and_reads_only_its_rows_by_chunks(
  trained, tmp_path, monkeypatch
):
  """Bundles hold at most 32 floats of this worker's chunks; a restore asks
  for each chunk."""
  written, read = _counted_bundles(monkeypatch)
  path = _save(trained, mirrored_strategy(2), tmp_path)
  tables = row_sharded_checkpoint.row_sliced(
    tf.train.Checkpoint(embedding=trained)
  )
  chunks = [c for v in tables.values() for c in v.local_chunks()]
  # Every chunk written once; a bundle holds at most 32 floats of them.
  assert sorted(s for specs in written for s in specs) == sorted(
    c[0] for c in chunks
  )
  for specs in written:
    floats = [
      row_sharded_checkpoint.row_sharded.parse_slice_spec(s)[1]
      * int(s.split()[1])
      for s in specs
    ]
    assert sum(floats) <= 32 or len(specs) == 1

  read.clear()
  fresh = _fresh(2, layouts=TableLayout("row_sharded", row_layout="contiguous"))
  checkpoint_lib.restore(fresh, path)
  sliced_reads = [spec for _, spec in read if spec]
  assert len(sliced_reads) == len(chunks)
  assert_equal(state(trained), state(fresh))


def test_an_interrupted_saves_rows_are_never_merged(trained, tmp_path):
  """Stale rows bundles of another run beside the prefix are removed first."""
  stale = f"{tmp_path}/ckpt-7.rows-00003-000000"
  key = "embedding/shared/.ATTRIBUTES/VARIABLE_VALUE"
  tf.raw_ops.SaveV2(
    prefix=stale,
    tensor_names=[key],
    shape_and_slices=["23 7 0,2:-"],
    tensors=[tf.fill([2, 7], 99.0)],
  )
  path = _save(trained, mirrored_strategy(2), tmp_path)
  assert not glob.glob(stale + "*")
  got = tf.train.load_checkpoint(path).get_tensor(key)
  np.testing.assert_array_equal(got, state(trained)["shared/parameters"])


def test_a_whole_table_checkpoint_restores_into_shards(tmp_path):
  """A replicated run's checkpoint (whole tensors) into 3 contiguous shards."""
  replicated = sharded_case.trained(1, False)
  path = tf.train.Checkpoint(embedding=replicated).save(str(tmp_path / "r"))
  assert not row_sharded_checkpoint.sliced_keys(path)
  fresh = _fresh(3, layouts=TableLayout("row_sharded", row_layout="contiguous"))
  checkpoint_lib.restore(fresh, path)
  assert_equal(state(replicated), state(fresh))


@pytest.mark.parametrize("replicas", [1, 2], ids=["1-replica", "2-replicas"])
def test_replicated_tables_are_saved_and_restored_by_chunks(
  tmp_path, monkeypatch, replicas
):
  """Replicated tables and their slots too: written once, from the first
  replica's copy, as row slices of TF's full tensors (a bundle at most 32
  floats), read back chunk by chunk into every copy, and never read whole;
  TF's own TPUEmbeddingForServing reads the merged checkpoint."""
  strategy = (
    mirrored_strategy(replicas)
    if replicas > 1
    else tf.distribute.get_strategy()
  )
  trained = sharded_case.trained(replicas, False)
  assert set(trained.placements().values()) == {"replicated"}
  written, read = _counted_bundles(monkeypatch)
  path = _save(trained, strategy, tmp_path)
  tables = row_sharded_checkpoint.row_sliced(
    tf.train.Checkpoint(embedding=trained)
  )
  assert len(tables) == len(trained.replicated_table_variables()) > 3
  chunks = [c[0] for v in tables.values() for c in v.local_chunks()]
  assert sorted(s for specs in written for s in specs) == sorted(chunks)
  assert row_sharded_checkpoint.sliced_keys(path) == set(tables)
  sharded_case.assert_tf_serving_reads(path, state(trained))

  read.clear()
  fresh = _fresh(replicas)
  checkpoint_lib.restore(fresh, path)
  table_reads = [spec for key, spec in read if key in tables]
  assert sorted(table_reads) == sorted(chunks)  # no whole read ("")
  assert_equal(state(trained), state(fresh))
  for variable in fresh.replicated_table_variables():
    copies = strategy.experimental_local_results(variable)
    for copy in copies[1:]:
      np.testing.assert_array_equal(copy.numpy(), copies[0].numpy())

  # What `recsys evaluate` restores into: the tables alone, no slots.
  read.clear()
  tables_only = _fresh(replicas, restore_only=True)
  assert tables_only.lookup_only
  assert not any(tables_only.slot_variables().values())
  checkpoint_lib.restore(tables_only, path)
  params = {k for k in tables if ".S" not in k.split("/")[1]}
  assert {key for key, _ in read} == params
  for table, variable in tables_only.embedding_tables.items():
    np.testing.assert_array_equal(
      tf.convert_to_tensor(variable).numpy(),
      state(trained)[f"{table.name}/parameters"],
    )

  # What `recsys export` restores into: the tables alone, by chunks too.
  read.clear()
  serving = ServingEmbedding.from_backend(fresh)
  checkpoint_lib.restore(serving, path)
  params = row_sharded_checkpoint.row_sliced(
    tf.train.Checkpoint(embedding=serving)
  )
  assert set(params) < set(tables)  # no slots
  params_chunks = [c[0] for k in params for c in tables[k].local_chunks()]
  assert sorted(spec for key, spec in read if key in tables) == sorted(
    params_chunks
  )
  for table, variable in serving.embedding_tables.items():
    np.testing.assert_array_equal(
      variable.numpy(), state(trained)[f"{table.name}/parameters"]
    )
