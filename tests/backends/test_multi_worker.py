"""TensorCore under a real 2-process MultiWorkerMirroredStrategy on localhost."""

import json
import os
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.backends import mwms_worker
from tests.conftest import mirrored_strategy
from tests.distributed import cluster as cluster_lib

WORKER = Path(__file__).with_name("mwms_worker.py")


def _free_ports(n):
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env.update(TF_CPP_MIN_LOG_LEVEL="3", **extra)
  return env


@pytest.mark.slow
def test_two_workers_equal_one_process_on_the_global_batch(tmp_path):
  """2 processes == 1 process with 2 replicas == 1 replica, same global batch,
  for a table of rows and one of raw ids through a dynamic vocabulary
  (every worker's raw ids are gathered before each index update, so both
  workers' indices make the one process's decisions).

  The references train in this process; the workers in two of their own."""
  ref = tmp_path / "ref.npz"
  mwms_worker.main(str(ref))
  two_replicas = tmp_path / "two_replicas.npz"
  mwms_worker.main(str(two_replicas), 2, strategy=mirrored_strategy(2))
  cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
  cluster_lib.run_workers(
    [
      [sys.executable, str(WORKER), str(tmp_path / f"w{i}.npz")]
      for i in range(2)
    ],
    [
      _env(
        TF_CONFIG=json.dumps(
          {"cluster": cluster, "task": {"type": "worker", "index": i}}
        )
      )
      for i in range(2)
    ],
  )
  want = np.load(ref)
  w0, w1 = np.load(tmp_path / "w0.npz"), np.load(tmp_path / "w1.npz")
  mirrored = np.load(two_replicas)
  for key in ("table", "acc", "dtable", "dacc"):
    # Both workers apply the same summed update: bit-identical.
    np.testing.assert_array_equal(w0[key], w1[key])
    np.testing.assert_allclose(w0[key], mirrored[key], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w0[key], want[key], rtol=1e-5, atol=1e-6)
  for key in ("keys", "rows", "counters"):  # the same ids in the same rows
    for got in (w0, w1, mirrored):
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  admissions, capacity, _, evictions, _, in_use = want["counters"]
  assert evictions > 0 and in_use == capacity < admissions

  # "s": 3 index shards held apart (0 and 2 by worker 0, 1 by worker 1),
  # together the one process's index: each worker's ids mapped by the
  # holders of their shards, rows reset everywhere, counters summed.
  assert [w0["held"].tolist(), w1["held"].tolist()] == [[0, 2], [1]]
  assert want["held"].tolist() == [0, 1, 2]
  for key in ("stable", "sacc"):
    np.testing.assert_array_equal(w0[key], w1[key])
    np.testing.assert_allclose(w0[key], want[key], rtol=1e-5, atol=1e-6)
  mapping = np.concatenate(
    [np.stack([w["srows"], w["skeys"]], 1) for w in (w0, w1)]
  )
  mapping = mapping[np.argsort(mapping[:, 0])]
  np.testing.assert_array_equal(mapping[:, 0], want["srows"])
  np.testing.assert_array_equal(mapping[:, 1], want["skeys"])
  for got in (w0, w1, mirrored):  # read as an evaluation reads
    np.testing.assert_array_equal(got["scounters"], want["scounters"])
    np.testing.assert_array_equal(got["slooked"], want["slooked"])
  admissions, capacity, _, evictions, _, in_use = want["scounters"]
  assert evictions > 0 and in_use == capacity < admissions
  # The cluster's checkpoint (each worker wrote its shards as slices),
  # restored into one process holding every shard: the same index.
  restored = mwms_worker.restored_state(
    str(tmp_path / "cluster_checkpoint" / "ckpt")
  )
  for key, value in restored.items():
    np.testing.assert_allclose(value, want[key], rtol=1e-5, atol=1e-6)
