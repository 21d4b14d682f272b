"""TPU smoke test: every TPU embedding backend against `tensorcore` on one TPU.

    python -m recsys.tools.tpu_smoke --tpu <name or grpc://host:8470>

For each optimizer, trains a few steps of a small synthetic embedding model
on the TPU with `tensorcore` (its XLA-compiled step: the path `auto` takes on
a TPU without an embedding accelerator), with the backend `auto` picks, and
with each TPU embedding backend the TPU supports (`tpu_embedding` on
embedding_feature V1 or V2, `tpu_embedding_v0` on any TPU); and once with
`tensorcore` on this machine's CPU, uncompiled, on the same global batches:
the reference. Every run starts from the same initial tables and saves a
checkpoint; each checkpoint is restored on the CPU into the `serving` backend
(which also proves the checkpoints portable) and its tables and slots are
compared with the CPU run's. Exits with status 1 if any differs beyond the
tolerance, and with status 2 within `--connect_timeout` seconds if the TPU
cannot be reached.

`tensorcore+dynamic` and `tpu_embedding_v0+dynamic` train those backends
with the `users` table dynamic (`backends.vocabulary.DynamicVocabulary`:
raw 64-bit ids of 1,009 users into 64 rows, so rows are evicted and
reset), from its row-keyed initial values: each batch is mapped on the
host in cross-replica context before `strategy.run`, as the Trainer does,
and every tensor of its checkpoint (tables, slots, the index: its ids,
rows and counters exactly) is compared with `tensorcore+dynamic@cpu`'s.
`tpu_embedding+dynamic_kept` (embedding_feature V1: SparseCore's
checkpoints stack their tables) does so with a vocabulary that never
reuses a row (eviction "none", unknown ids reading the unknown row: what
the embedding engine takes), against `tensorcore+dynamic_kept@cpu`.

Each training run is a separate process: a TPU hosts one embedding engine
configuration per initialisation.

This tool has never been run by its authors: no TPU was reachable from the
machines the project was developed on. Please report what it prints.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from typing import Any

from recsys.errors import RecsysError

OPTIMIZERS = ("sgd", "adagrad", "adagrad_momentum", "adam", "ftrl")
#: A backend with a dynamic-vocabulary `users` table: `<backend>` + this
#: (evicting, resetting reused rows), or + `KEPT` (never reusing a row).
WITH_DYNAMIC = "+dynamic"
KEPT = "+dynamic_kept"
#: tensorcore with a dynamic `users` table: the dynamic runs' reference.
DYNAMIC = "tensorcore" + WITH_DYNAMIC
TPU_BACKENDS = (
  "tensorcore",
  "auto",
  "tpu_embedding",
  "tpu_embedding_v0",
  DYNAMIC,
  "tpu_embedding_v0" + WITH_DYNAMIC,
  "tpu_embedding" + KEPT,
)
REFERENCE = "tensorcore@cpu"  # tensorcore, uncompiled, on this machine's CPU
ON_CPU = "@cpu"
VOCAB = {"users": 1009, "tags": 97}
#: The dynamic `users` table's rows: far fewer than the users, so the
#: index evicts within a few steps and resets the rows it reuses.
DYNAMIC_ROWS = 64
DIMS = {"users": 16, "tags": 8}
MAX_TAGS = 4


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="python -m recsys.tools.tpu_smoke",
    description=(
      "Train a few steps with each TPU embedding backend this TPU "
      "supports and with the reference backend 'tensorcore' on the "
      "same data; compare tables and optimizer slots."
    ),
  )
  parser.add_argument(
    "--tpu",
    required=True,
    help="TPU name or address (as for TPUClusterResolver); "
    "'local' for a TPU VM.",
  )
  parser.add_argument("--steps", type=int, default=5, help="training steps")
  parser.add_argument(
    "--per_replica_batch",
    type=int,
    default=16,
    help="per-replica batch (a multiple of 4 for SparseCore)",
  )
  parser.add_argument(
    "--optimizers",
    default=",".join(OPTIMIZERS),
    help=f"comma-separated subset of {', '.join(OPTIMIZERS)}",
  )
  parser.add_argument(
    "--backends",
    default=",".join(TPU_BACKENDS),
    help="backends to run on the TPU and compare with "
    "tensorcore on the CPU (those the hardware cannot run "
    "are skipped, with the reason; 'auto' is the automatic "
    "choice)",
  )
  parser.add_argument(
    "--connect_timeout",
    type=float,
    default=30.0,
    help="seconds to wait for the TPU to answer before giving up with an error",
  )
  parser.add_argument("--rtol", type=float, default=1e-3)
  parser.add_argument("--atol", type=float, default=1e-4)
  parser.add_argument(
    "--workdir",
    default=None,
    help="where checkpoints go (default: a temp directory)",
  )
  parser.add_argument("--run_one", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
  return parser


# -- one training run (a child process) ----------------------------------------


def _optimizer(name: str):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  e = tf.tpu.experimental.embedding
  return {
    "sgd": lambda: e.SGD(0.1),
    "adagrad": lambda: e.Adagrad(0.1),
    "adagrad_momentum": lambda: e.AdagradMomentum(0.1, momentum=0.9),
    "adam": lambda: e.Adam(0.01),
    "ftrl": lambda: e.FTRL(0.1),
  }[name]()


def _feature_config(dynamic: bool = False):
  """Two tables from fixed initial values; `tags` is a mean-combined bag.
  `dynamic`: `users` starts from a seeded normal instead (row-keyed, so a
  reused row can start again: `backends.storage.row_init`)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  e = tf.tpu.experimental.embedding
  rng = np.random.default_rng(0)
  tables = {}
  for name, combiner in (("users", "sum"), ("tags", "mean")):
    init = rng.normal(0, 0.1, (VOCAB[name], DIMS[name])).astype(np.float32)
    initializer, rows = tf.constant_initializer(init), VOCAB[name]
    if dynamic and name == "users":
      initializer = tf.random_normal_initializer(0.0, 0.1, seed=7)
      rows = DYNAMIC_ROWS
    tables[name] = e.TableConfig(
      rows,
      DIMS[name],
      name=name,
      combiner=combiner,
      initializer=initializer,
    )
  return {
    "user": e.FeatureConfig(tables["users"]),
    "tags": e.FeatureConfig(tables["tags"]),
  }


def _reference(backend: str) -> str:
  """The CPU run `backend`'s TPU run is compared with."""
  kind = _dynamic_kind(backend)
  return "tensorcore" + kind + ON_CPU if kind else REFERENCE


def _dynamic_kind(run: str) -> str:
  """`run`'s (`<backend>[+dynamic|+dynamic_kept][@cpu]`) dynamic suffix,
  or "" for static tables."""
  run = run.removesuffix(ON_CPU)
  return next((k for k in (KEPT, WITH_DYNAMIC) if run.endswith(k)), "")


def _is_dynamic(run: str) -> bool:
  """Whether `run` has a dynamic table."""
  return bool(_dynamic_kind(run))


def _backend_of(run: str) -> str:
  """The registered backend (or "auto") `run` trains."""
  return run.removesuffix(ON_CPU).removesuffix(_dynamic_kind(run))


def _vocabulary(run: str):
  """The dynamic `users` table's vocabulary of `run` (None: static)."""
  from backends.vocabulary import DynamicVocabulary  # pylint: disable=g-import-not-at-top

  kind = _dynamic_kind(run)
  if kind == KEPT:  # what TF's TPUEmbedding takes: no row ever reused
    return DynamicVocabulary(eviction="none", unknown="unknown_row")
  return DynamicVocabulary(eviction="lru") if kind else None


def _raw_user_ids(users: Any) -> Any:
  """Distinct 64-bit raw ids for `users`, none of them a row number."""
  return users * 7919 + 2**40


def _dataset(ctx, per_replica_batch: int, steps: int, dynamic: bool = False):
  """Deterministic batches: the same for every backend, sharded by pipeline
  (`dynamic`: raw user ids, of many more users than the table's rows)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  seed = 1000 * ctx.input_pipeline_id

  def batch(step):
    s = tf.stack([seed, step])
    user = tf.random.stateless_uniform(
      [per_replica_batch], s, 0, VOCAB["users"], tf.int64
    )
    if dynamic:
      user = _raw_user_ids(user)
    lengths = tf.random.stateless_uniform(
      [per_replica_batch], s + 1, 1, MAX_TAGS + 1, tf.int64
    )
    values = tf.random.stateless_uniform(
      [tf.reduce_sum(lengths)], s + 2, 0, VOCAB["tags"], tf.int64
    )
    tags = tf.RaggedTensor.from_row_lengths(values, lengths)
    label = tf.random.stateless_uniform([per_replica_batch], s + 3)
    return {"user": user, "tags": tags}, label

  per_pipeline = steps * ctx.num_replicas_in_sync // ctx.num_input_pipelines
  return tf.data.Dataset.range(per_pipeline).map(batch)


def _train_one(args, backend: str, optimizer: str, out: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import recsys  # noqa: F401 pylint: disable=g-import-not-at-top,unused-import

  vocabulary = _vocabulary(backend)
  if backend.endswith(ON_CPU):  # the TPU's global batches, one CPU replica
    path = train_and_save(
      tf.distribute.get_strategy(),
      "tensorcore",
      optimizer,
      args.steps,
      args.per_replica_batch,
      out,
      replicas=args.replicas,
      vocabulary=vocabulary,
    )
    print(json.dumps({"checkpoint": path}))
    return
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=args.tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  strategy = tf.distribute.TPUStrategy(resolver)
  path = train_and_save(
    strategy,
    _backend_of(backend),
    optimizer,
    args.steps,
    args.per_replica_batch,
    out,
    vocabulary=vocabulary,
  )
  print(json.dumps({"checkpoint": path}))


def train_and_save(
  strategy,
  backend: str,
  optimizer: str,
  steps: int,
  per_replica_batch: int,
  out: str,
  replicas: int | None = None,
  vocabulary: Any = None,
) -> str:
  """Trains `steps` steps of `backend` under `strategy`; returns the checkpoint.

  `replicas`: on a one-replica strategy, train on the global batches that
  this many replicas would see (each step the replicas' batches joined).
  `vocabulary`: the `users` table takes raw ids through this vocabulary
  (`_vocabulary`; None: static), each batch mapped on the host before
  `strategy.run`; it starts from its row-keyed initial values (TF's V0
  draws its own), those a reused row starts again from.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import backends  # pylint: disable=g-import-not-at-top
  import recsys  # noqa: F401 pylint: disable=g-import-not-at-top,unused-import

  if backend == "auto":
    backend, _ = backends.registry.resolve("auto", strategy)
  options = {}
  declared = backends.registry.get(backend).options
  if "per_replica_batch_size" in declared:  # the engine's static buffers
    options["per_replica_batch_size"] = per_replica_batch
  if "static_shapes" in declared:  # a static-shape engine pads the bags
    options["bag_widths"] = MAX_TAGS
  layouts = None
  dynamic = vocabulary is not None
  if dynamic:
    from backends.layout import TableLayout  # pylint: disable=g-import-not-at-top

    layouts = {
      "users": TableLayout(vocabulary=vocabulary),
      "tags": TableLayout(),
    }
  emb = backends.create(
    _feature_config(dynamic),
    _optimizer(optimizer),
    strategy,
    backend=backend,
    layouts=layouts,
    **options,
  )
  with strategy.scope():
    emb.build()
  if dynamic:
    _start_users_row_keyed(emb)
  joined = replicas or 1
  global_batch = per_replica_batch * strategy.num_replicas_in_sync * joined

  def dataset_fn(ctx):
    if joined > 1:
      ctx = tf.distribute.InputContext(num_replicas_in_sync=joined)
      ds = _dataset(ctx, per_replica_batch, steps, dynamic).batch(joined)
      ds = ds.map(
        lambda f, y: (
          {
            "user": tf.reshape(f["user"], [-1]),
            "tags": f["tags"].merge_dims(0, 1),
          },
          tf.reshape(y, [-1]),
        )
      )
    else:
      ds = _dataset(ctx, per_replica_batch, steps, dynamic)
    return ds.map(lambda f, y: (emb.preprocess(f)[0], y))

  data = iter(
    strategy.distribute_datasets_from_function(
      dataset_fn, options=emb.input_options()
    )
  )

  @tf.function
  def step(iterator):
    def replica_step(features, labels):
      with tf.GradientTape() as tape:
        acts = emb.lookup(features, training=True)
        tape.watch(acts)
        score = tf.reduce_sum(acts["user"], 1) + tf.reduce_sum(acts["tags"], 1)
        loss = tf.reduce_sum((score - labels) ** 2) / global_batch
      emb.apply_gradients(tape.gradient(loss, acts))
      return loss

    features, labels = next(iterator)
    if dynamic:  # on the host: the index cannot run in a TPU's step
      features = emb.map_ids(features, training=True)
    return strategy.run(replica_step, args=(features, labels))

  for _ in range(steps):
    step(data)
  return tf.train.Checkpoint(embedding=emb).save(os.path.join(out, "ckpt"))


def _start_users_row_keyed(emb) -> None:
  """The dynamic `users` table from its row-keyed initial values, those a
  reused row starts again from (TF's V0 and TPUEmbedding draw their own).
  TPUEmbedding's tables live in the engine: their host copies are set,
  then loaded onto it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from backends import _tf_internal  # pylint: disable=g-import-not-at-top
  from backends.storage import reset  # pylint: disable=g-import-not-at-top

  table = next(t for t in emb.tables if t.name == "users")
  rows = tf.range(table.vocabulary_size, dtype=tf.int64)
  values = reset.starting_values(table, None, rows)["parameters"]
  load_onto_tpu = getattr(emb, "load_onto_tpu", None)
  if load_onto_tpu is None:  # the tables are variables here
    emb.embedding_tables[table].assign(values)
    return
  variables = _tf_internal.mid_level_variables(emb.mid_level)
  variables["users"]["parameters"].assign(values)
  load_onto_tpu()


# -- the comparison (the parent process, CPU only) -----------------------------


def read_on_cpu(path: str, optimizer: str) -> dict[str, Any]:
  """Tables and slots of a smoke checkpoint, restored into `serving` on CPU."""
  import recsys  # noqa: F401 pylint: disable=g-import-not-at-top,unused-import
  from backends import checkpoint  # pylint: disable=g-import-not-at-top
  from backends.mid_level.serving import ServingEmbedding  # pylint: disable=g-import-not-at-top

  emb = ServingEmbedding(_feature_config(), _optimizer(optimizer))
  checkpoint.restore(emb, path)
  values = {
    emb.table_name(t): v.numpy() for t, v in emb.embedding_tables.items()
  }
  for table, slots in emb.slot_variables().items():
    values.update({f"{table}/{s}": v.numpy() for s, v in slots.items()})
  return values


def read_checkpoint(path: str) -> dict[str, Any]:
  """Every tensor of a checkpoint by its key (tables, slots, indices); a
  hash table's exported keys and values as `[n, 2]` pairs sorted by key
  (the order of an export is the table implementation's, and a TPU host
  and a CPU may use different ones)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  reader = tf.train.load_checkpoint(path)
  out = {}
  for key in reader.get_variable_to_shape_map():
    if key.startswith("_CHECKPOINTABLE_OBJECT_GRAPH"):
      continue
    if key.endswith("-values"):
      continue
    value = reader.get_tensor(key)
    if key.endswith("-keys"):
      pairs = np.stack(
        [value, reader.get_tensor(key[: -len("keys")] + "values")]
      )
      value = pairs[:, np.argsort(value, kind="stable")].T
    out[key] = value
  return out


def compare(values: dict, reference: dict, rtol: float, atol: float):
  """`(ok, worst |diff|)` of two runs' tensors: the same keys and shapes,
  floats within the tolerance, anything else equal."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  if sorted(values) != sorted(reference):
    return False, float("inf")
  ok, worst = True, 0.0
  for key, want in reference.items():
    got = np.asarray(values[key])
    want = np.asarray(want)
    if got.shape != want.shape:
      return False, float("inf")
    if want.dtype.kind == "f":
      ok &= bool(np.allclose(got, want, rtol=rtol, atol=atol))
      if want.size:
        worst = max(worst, float(np.max(np.abs(got - want))))
    else:
      ok &= bool(np.array_equal(got, want))
  return ok, worst


class TPUUnreachableError(RecsysError, RuntimeError):
  """The TPU did not answer in time."""


def _check_reachable(tpu: str, timeout: float) -> None:
  """Fails fast on a `grpc://host:port` address nothing listens on."""
  if not tpu.startswith("grpc://"):
    return
  host, _, port = tpu[len("grpc://") :].rpartition(":")
  try:
    with socket.create_connection((host, int(port)), timeout=timeout):
      pass
  except (OSError, ValueError) as e:
    raise TPUUnreachableError(
      f"TPU {tpu!r}: cannot connect to {host}:{port} within {timeout:.0f} s "
      f"({e}). Check the address (grpc://<host>:8470) and that the TPU is "
      "running and reachable from this machine."
    ) from e


def _tpu_facts(tpu: str, timeout: float = 30.0) -> dict[str, Any]:
  """Embedding feature and the backends that can run (asked in a child).

  Raises:
    TPUUnreachableError: no answer from the TPU within `timeout` seconds.
  """
  _check_reachable(tpu, timeout)
  code = (
    "import json, recsys, tensorflow as tf, backends\n"
    "try:\n"
    f"  r = tf.distribute.cluster_resolver.TPUClusterResolver(tpu={tpu!r})\n"
    "  tf.config.experimental_connect_to_cluster(r)\n"
    "  tf.tpu.experimental.initialize_tpu_system(r)\n"
    "  s = tf.distribute.TPUStrategy(r)\n"
    "except Exception as e:\n"  # no TPU there: its error, for one line
    "  print(json.dumps({'error': type(e).__name__, 'message': str(e)}))\n"
    "  raise SystemExit(3)\n"
    "f = s.extended.tpu_hardware_feature.embedding_feature\n"
    "reasons = "
    "{n: backends.get(n).unavailable_reason(s) for n in backends.names()}\n"
    "print(json.dumps({'feature': f.name, 'replicas': s.num_replicas_in_sync,"
    " 'unavailable': reasons}))\n"
  )
  try:
    result = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      timeout=timeout,
    )
  except subprocess.TimeoutExpired as e:
    raise TPUUnreachableError(
      f"TPU {tpu!r}: no answer within {timeout:.0f} s (connecting and "
      "initialising the TPU system). Check the name or address and that "
      "the TPU is running; --connect_timeout waits longer."
    ) from e
  if result.returncode:
    raise TPUUnreachableError(connection_failure(tpu, result))
  return json.loads(result.stdout.strip().splitlines()[-1])


#: How to point the tool at a TPU, for its connection errors.
_POINT_AT_A_TPU = (
  "on a TPU VM pass --tpu local; elsewhere the TPU's name (--tpu my-tpu, "
  "with gcloud's project and zone set) or its address (--tpu "
  "grpc://<host>:8470)"
)


def connection_failure(tpu: str, result: subprocess.CompletedProcess) -> str:
  """One line for a child that could not connect to `tpu`: what it tried,
  the error's first sentence, how to point the tool at a TPU (it printed
  TF's 33-line traceback)."""
  lines = (result.stdout or "").strip().splitlines()
  try:
    error = json.loads(lines[-1]) if lines else {}
  except ValueError:
    error = {}
  if "error" in error:
    message = " ".join(str(error.get("message", "")).split())
    first = re.split(r"(?<=\.)\s", message, maxsplit=1)[0][:200]
    why = f"{error['error']}: {first}"
  else:  # the child failed before trying (its last line of stderr)
    tail = (result.stderr or "").strip().splitlines()
    why = tail[-1][:200] if tail else f"exit status {result.returncode}"
  return (
    f"TPU {tpu!r}: no TPU found (tried TPUClusterResolver(tpu={tpu!r}) and "
    f"initialize_tpu_system: {why}); {_POINT_AT_A_TPU}."
  )


def _run_child(args, backend: str, optimizer: str, out: str) -> str | None:
  cmd = [
    sys.executable,
    "-m",
    "recsys.tools.tpu_smoke",
    "--tpu",
    args.tpu,
    "--steps",
    str(args.steps),
    "--per_replica_batch",
    str(args.per_replica_batch),
    "--run_one",
    f"{backend}:{optimizer}",
    "--replicas",
    str(args.replicas),
    "--workdir",
    out,
  ]
  result = subprocess.run(cmd, capture_output=True, text=True)
  if result.returncode:
    print(
      f"  {backend} / {optimizer}: FAILED to train:\n{result.stderr[-3000:]}"
    )
    return None
  return json.loads(result.stdout.strip().splitlines()[-1])["checkpoint"]


def _named(values: dict) -> str:
  """The compared tensors, named (a checkpoint's: counted)."""
  if len(values) > 8:
    return f"{len(values)} checkpoint tensors"
  return str(sorted(values))


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  if args.run_one:
    backend, optimizer = args.run_one.split(":")
    _train_one(args, backend, optimizer, args.workdir)
    return 0

  optimizers = [o for o in args.optimizers.split(",") if o]
  unknown = sorted(set(optimizers) - set(OPTIMIZERS))
  if unknown:
    raise SystemExit(f"unknown optimizers {unknown}; choose from {OPTIMIZERS}")
  try:
    facts = _tpu_facts(args.tpu, args.connect_timeout)
  except TPUUnreachableError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  args.replicas = facts["replicas"]
  print(
    f"TPU {args.tpu}: embedding_feature={facts['feature']}, "
    f"{facts['replicas']} replicas"
  )
  candidates = []
  for name in [b for b in args.backends.split(",") if b]:
    registered = _backend_of(name)
    reason = (
      None
      if name == "auto"
      else facts["unavailable"].get(registered, "not a registered backend")
    )
    if not reason and _dynamic_kind(name) == KEPT and facts["feature"] != "V1":
      reason = "SparseCore stacks its checkpoint's tables (compared raw here)"
    if reason:
      print(f"  skipping {name}: {reason}")
    else:
      candidates.append(name)
  workdir = args.workdir or tempfile.mkdtemp(prefix="tpu_smoke_")
  failures = 0
  for optimizer in optimizers:
    runs = {}
    references = sorted({_reference(b) for b in candidates})
    for backend in references + candidates:
      out = os.path.join(workdir, f"{backend}_{optimizer}")
      path = _run_child(args, backend, optimizer, out)
      if path is None:
        failures += 1
      elif _is_dynamic(backend):  # the index too
        runs[backend] = read_checkpoint(path)
      else:
        runs[backend] = read_on_cpu(path, optimizer)
    for backend in candidates:
      if backend not in runs or _reference(backend) not in runs:
        continue
      values, reference = runs[backend], runs[_reference(backend)]
      ok, worst = compare(values, reference, args.rtol, args.atol)
      failures += not ok
      print(
        f"  {optimizer:17s} {backend:18s} vs {_reference(backend)} after "
        f"{args.steps} "
        f"steps: max |diff| {worst:.3g} over {_named(reference)} -> "
        f"{'OK' if ok else 'MISMATCH'}"
      )
  print("PASS" if not failures else f"FAIL ({failures})")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
