"""`fit` with the Embedding layer on clusters equals `fit` in one process.

MultiWorkerMirroredStrategy (2 worker processes on localhost, tensorcore
backend; the dynamic table's 2 index shards one on each) and
ParameterServerStrategy (1 worker, 2 parameter servers, tables
row-sharded by the parameter_servers backend, steps scheduled by Keras through a
ClusterCoordinator) train the same model from the same values on the same
global batches as the default strategy (`keras_fit_run.py`): same tables,
slots and dense weights, and the same index of its dynamic-vocabulary table
(raw user ids into fewer rows: admitted, evicted and reset alike).
"""

import json
import sys

import numpy as np
import pytest

from tests.distributed import cluster as cluster_lib
from tests.layers import keras_fit_run

SCRIPT = ["-m", "tests.layers.keras_fit_run"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The default strategy's fit (in this process), which both clusters must
  equal: run once for the module."""
  path = str(tmp_path_factory.mktemp("single") / "single.npz")
  keras_fit_run.main("single", path)
  single = np.load(path)
  assert int(single["users.evictions"]) > 0  # rows really reused
  return single


def _assert_same(got, want):
  got, want = dict(got), dict(want)
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_allclose(
      got[key], want[key], rtol=1e-5, atol=1e-5, err_msg=key
    )


@pytest.mark.slow
def test_parameter_server_fit_equals_one_process(tmp_path, reference):
  out = str(tmp_path / "ps.npz")
  log = cluster_lib.run_script(SCRIPT + ["ps", out], timeout=300)
  assert "backend parameter_servers" in log
  _assert_same(np.load(out), reference)


@pytest.mark.slow
def test_multi_worker_mirrored_fit_equals_one_process(tmp_path, reference):
  spec = {"worker": cluster_lib.cluster_spec(2, 0)["worker"]}
  cluster_lib.run_workers(
    [
      [sys.executable, *SCRIPT, "mwms", str(tmp_path / f"w{i}.npz")]
      for i in range(2)
    ],
    [
      cluster_lib.subprocess_env(
        TF_CONFIG=json.dumps(
          {"cluster": spec, "task": {"type": "worker", "index": i}}
        )
      )
      for i in range(2)
    ],
    cwd=str(cluster_lib.REPO),
  )
  workers = [dict(np.load(tmp_path / f"w{i}.npz")) for i in range(2)]
  # The users index's 2 shards are held apart (one a worker): together,
  # the one process's ids and rows; the rest each worker has whole.
  assert [w.pop("users.held").tolist() for w in workers] == [[0], [1]]
  pairs = np.concatenate(
    [np.stack([w.pop("users.rows"), w.pop("users.ids")], 1) for w in workers]
  )
  pairs = pairs[np.argsort(pairs[:, 0])]
  want = dict(reference)
  assert want.pop("users.held").tolist() == [0, 1]
  np.testing.assert_array_equal(pairs[:, 0], want.pop("users.rows"))
  np.testing.assert_array_equal(pairs[:, 1], want.pop("users.ids"))
  for got in workers:
    _assert_same(got, want)
