"""Dynamic-vocabulary tables on parameter servers (`dynamic_ps_run.py`: an
in-process cluster of 2 workers and 2 parameter servers, in a subprocess).

The index lives once for every worker: whole on the first parameter
server, or in shards spread over the servers:

* steps run one at a time end exactly where one process does (tensorcore,
  default strategy, same batches), the index in 2 shards, one on each
  server: the index's ids, rows, ages and counters equal, tables and
  slots to float tolerance;
* steps of both workers at once still leave one consistent index — each
  step maps, evicts and resets alone (a critical section on the server):
  no two ids share a row, the hash table and the row arrays agree, the
  counters add up, and a read-only lookup reads exactly the admitted ids.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.distributed import cluster as cluster_lib
from tests.distributed import dynamic_case as case


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  path = tmp_path_factory.mktemp("dynamic_ps") / "out.npz"
  log = cluster_lib.run_script(
    ["-m", "tests.distributed.dynamic_ps_run", str(path)], timeout=300
  )
  assert "DYNAMIC_PS_RUN_OK" in log, log[-3000:]
  return np.load(path)


def _part(run, name: str) -> dict[str, np.ndarray]:
  prefix = f"{name}/"
  return {k[len(prefix) :]: run[k] for k in run.files if k.startswith(prefix)}


def _one_process() -> dict[str, np.ndarray]:
  emb = case.backend(tf.distribute.get_strategy(), "tensorcore", shards=2)
  emb.build()

  @tf.function
  def step(ids, labels):
    case.replica_step(emb, emb.map_ids({"item": ids}, training=True), labels)

  for ids, labels in case.batches():
    step(tf.constant(ids), tf.constant(labels))
  out = case.state(emb)
  every = tf.constant(case.every_id())
  out["looked_up"] = emb.map_ids({"item": every}, training=False)[
    "item"
  ].numpy()
  return out


@pytest.mark.slow
def test_one_step_at_a_time_ends_where_one_process_does(run):
  got, want = _part(run, "sequential"), _one_process()
  devices = got.pop("index_devices").tolist()
  assert len(devices) == 2, devices  # no server holds the whole index
  for task, device in enumerate(devices):
    assert f"/job:ps/replica:0/task:{task}/" in device, devices
  assert sorted(got) == sorted(want)
  assert int(want["counter/evictions"]) > 0, want  # rows really reused
  for key, value in want.items():
    if value.dtype.kind == "f":
      np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6)
    else:
      np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.slow
def test_both_workers_at_once_leave_one_consistent_index(run):
  got = _part(run, "concurrent")
  devices = got.pop("index_devices").tolist()
  assert ["/job:ps/replica:0/task:0/" in d for d in devices] == [True]
  occupied = np.flatnonzero(got["occupied"])
  keys = got["keys"][occupied]
  assert len(np.unique(keys)) == len(keys)  # no two ids share a row
  pairs = np.stack([keys, occupied], axis=1)
  np.testing.assert_array_equal(got["pairs"], pairs[np.argsort(keys)])
  in_use = int(got["counter/rows_in_use"])
  assert in_use == len(occupied) <= case.CAPACITY
  admitted, evicted = (
    int(got[f"counter/{k}"]) for k in ("admissions", "evictions")
  )
  assert admitted - evicted == in_use and evicted > 0
  assert got["last_seen"][occupied].max() == case.STEPS - 1  # every step ran
  rows = dict(zip(keys.tolist(), occupied.tolist()))
  want = [rows.get(i, -1) for i in case.every_id().tolist()]
  np.testing.assert_array_equal(got["looked_up"], want)
  assert np.isfinite(got["table"]).all()
