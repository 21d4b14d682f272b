"""The training step's fused kernels alone on one 10^7 x 32 table, per call.

Isolates what the kernels' thread split does, without the rest of the step:
one RecsysBagLookup (bags of 4 uniform ids) and one Adagrad RecsysBagApply
(row gradients and update) over `N` ids, as the only table of a step (so
by default they split over the intra-op threads), each a tf.function;
median wall and CPU ms of 30 calls. The intra-op pool size is fixed when TF
starts, so run it once per setting:

    python benchmarks/kernel_ops_threads.py INTRA_THREADS N [--rows ROWS]

`--rows` sizes the table (default 10^7: ~2.6 GB of table and slot, so
every id's row is a cache miss); tests/benchmarks runs the script on a
small one.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_parser.add_argument("intra_threads", type=int)
_parser.add_argument("n", type=int, help="ids per call")
_parser.add_argument("--rows", type=int, default=10_000_000)
ARGS = _parser.parse_args()

tf.config.threading.set_intra_op_parallelism_threads(ARGS.intra_threads)
tf.config.threading.set_inter_op_parallelism_threads(1)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from backends.tensorcore import kernels  # noqa: E402

ops = kernels.load()
rows, dim, n = ARGS.rows, 32, ARGS.n
t = tf.Variable(tf.zeros([rows, dim]))
acc = tf.Variable(tf.fill([rows, dim], 0.1))
rng = np.random.default_rng(0)
ids = tf.constant(rng.integers(0, rows, n), tf.int64)
segs = tf.constant((np.arange(n) // 4).astype(np.int32))
from backends import optimizers  # noqa: E402

E = tf.tpu.experimental.embedding
attrs = optimizers.fused_attrs(E.Adagrad(0.05))


@tf.function
def lookup():
  return ops.recsys_bag_lookup(
    table=t.handle,
    ids=ids,
    segments=segs,
    scale=tf.zeros([0]),
    num_segments=n // 4,
    concurrent_calls=1,
  )


acts, uniq, index = lookup()
grads = tf.ones_like(acts)


@tf.function
def apply():
  ops.recsys_bag_apply(
    table=t.handle,
    slots=[acc.handle],
    unique_ids=uniq,
    grads=grads,
    index=index,
    segments=segs,
    scale=tf.zeros([0]),
    learning_rate=0.05,
    rounding_step=0,
    concurrent_calls=1,
    **attrs,
  )


for name, f in (("lookup", lookup), ("bag_apply", apply)):
  for _ in range(3):
    f()
  ts, cpu = [], []
  for _ in range(30):
    s, c = time.perf_counter(), time.process_time()
    r = f()
    if r is not None:
      tf.nest.map_structure(lambda x: x.numpy(), r)
    ts.append(time.perf_counter() - s)
    cpu.append(time.process_time() - c)
  wall_ms, cpu_ms = statistics.median(ts) * 1e3, statistics.median(cpu) * 1e3
  print(f"{name} {wall_ms:.2f} ms, {cpu_ms:.2f} CPU ms")
