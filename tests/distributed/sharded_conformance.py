"""Runs the conformance suite on the parameter_servers backend in an in-process
cluster.

Usage: python -m tests.distributed.sharded_conformance OUT_JSON

This process starts 1 worker and 2 parameter servers (tables split 12/11
rows) and is the coordinator; the suite's calls run from it, the rows on
their shards. It writes {check name: null (passed) or the failure} to
OUT_JSON. A separate process, because a process connected to a cluster stays
connected.
"""

import json
import sys

from tests.distributed import cluster as cluster_lib

SPEC, SERVERS = cluster_lib.in_process_cluster(workers=1, ps=2)

import tensorflow as tf  # noqa: E402

from backends import conformance  # noqa: E402
from backends.parameter_servers import backend as ps_backend  # noqa: E402


def main(out_path: str) -> None:
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(SPEC), rpc_layer="grpc"
  )
  strategy = tf.distribute.experimental.ParameterServerStrategy(
    resolver, variable_partitioner=ps_backend.TablePartitioner(2)
  )
  suite = conformance.Conformance(
    lambda config, opt: ps_backend.ParameterServerEmbedding(
      config, opt, strategy
    ),
    ps_backend.ParameterServerEmbedding.capabilities,
  )
  results: dict[str, str | None] = {}
  for name in conformance.check_names():
    try:
      suite.run(name)
      results[name] = None
    except conformance.ConformanceError as e:
      results[name] = str(e)
  with open(out_path, "w", encoding="utf-8") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(sys.argv[1])
