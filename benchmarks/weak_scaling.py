"""Weak scaling, per replica: whole models on 1..8 CPU replicas and 2 workers.

Each replica keeps its own batch while the replicas grow (weak scaling), so
an ideal run costs each replica the same whatever their number. For each
model of `--models` and each count of `--replicas` (logical CPU devices of
one process, `MirroredStrategy`), and for `--workers` processes of one
replica each (`MultiWorkerMirroredStrategy`, a local cluster started as
`recsys launch` starts one), a fresh process measures:

  dlrm  the default experiment's DLRM (`experiments/synthetic_dlrm.gin`)
        with every table row-sharded (all-to-all exchange), `--batch`
        examples per replica: the Trainer's train step, `--loop` steps per
        call, median of `--reps` calls;
  ials  ImplicitALS at `--users` x `--items` (`benchmarks/ials_scale.py`),
        tables row-sharded, `--ials_batch` entries per replica: one epoch
        after a first, tracing one.

and prints one table: step time, examples per second, CPU-microseconds
per example (every process's CPU time over the examples; an iALS example
is an observed pair, solved twice an epoch), the collective bytes one
replica puts into a step (read from the traced step, not the planner's
figure), and the peak RSS of each process. `--json` saves the rows (what
`benchmarks/exchange_cost_model.py --measured` projects to a pod from).

Every process it starts is its own: a SIGTERM or SIGINT stops them and
then it (status 143 / 130), and none outlives it.

All replicas share this machine's cores: on 2 cores, 8 replicas take at
least 4x the time of 2, so the figure to read is CPU per example (the
work the replicas add), and the bytes.

    python benchmarks/weak_scaling.py [--models dlrm,ials] \\
        [--replicas 1,2,4,8] [--workers 2] [--json FILE]
"""

import argparse
import io
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODELS = ("dlrm", "ials")
#: How long the other workers may take to end after the chief did.
_SETTLE_SECONDS = 120.0


def _parse(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split("\n", 2)[2],
  )
  parser.add_argument("--models", default="dlrm,ials", help="dlrm, ials")
  parser.add_argument(
    "--replicas", default="1,2,4,8", help="replica counts of one process"
  )
  parser.add_argument(
    "--workers", type=int, default=2, help="worker processes (0: none)"
  )
  parser.add_argument(
    "--batch", type=int, default=1024, help="DLRM examples per replica"
  )
  parser.add_argument("--loop", type=int, default=10, help="steps per call")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument(
    "--gin_bindings", action="append", default=[], help="DLRM overrides"
  )
  parser.add_argument("--users", type=int, default=1_000_000)
  parser.add_argument("--items", type=int, default=100_000)
  parser.add_argument("--pairs", type=int, default=10_000_000)
  parser.add_argument(
    "--ials_batch", type=int, default=4096, help="iALS entries per replica"
  )
  parser.add_argument("--history_chunk", type=int, default=16)
  parser.add_argument("--json", help="also save the rows to this file")
  # One measurement (what the driver starts): model, replicas, output file.
  parser.add_argument("--task", choices=MODELS, help=argparse.SUPPRESS)
  parser.add_argument("--task_replicas", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--out", help=argparse.SUPPRESS)
  return parser.parse_args(argv)


# -- one measurement, in its own process ---------------------------------


def _strategy(replicas: int):
  """A MultiWorkerMirroredStrategy under TF_CONFIG, else `replicas`
  logical CPUs of this process."""
  from recsys.run import strategy as strategy_lib  # noqa: PLC0415

  return strategy_lib.make_strategy(num_cpu_replicas=replicas)[0]


def _measure_dlrm(args: argparse.Namespace, strategy) -> dict:
  """The DLRM's train step with every table row-sharded."""
  import row_sharding  # noqa: PLC0415  (this folder is on sys.path)

  from recsys import planning  # noqa: PLC0415

  replicas = strategy.num_replicas_in_sync
  row_sharding.ARGS = argparse.Namespace(
    gin_file="experiments/synthetic_dlrm.gin",
    gin_bindings=[
      f"train.global_batch_size = {args.batch * replicas}",
      *args.gin_bindings,
    ],
    loop=args.loop,
  )
  base = row_sharding._trainer(strategy, None)
  names = [base.backend.table_name(t) for t in base.backend.tables]
  trainer = row_sharding._trainer(
    strategy,
    planning.EmbeddingPlacement(
      tables={name: "row_sharded" for name in names}, exchange="all_to_all"
    ),
  )
  batch = next(
    iter(
      trainer.run.distribute(
        trainer.run.source, trainer.settings.global_batch_size, training=True
      )
    )
  )
  timer, graph = row_sharding._time_steps(trainer, batch)
  walls, cpus = zip(*(timer() for _ in range(args.reps)))
  exchanged, dynamic = row_sharding.collective_byte_count(graph)
  return {
    "step_ms": statistics.median(walls),
    "cpu_ms": statistics.median(cpus),
    "examples_per_step": args.batch * replicas,
    "collective_bytes": exchanged,
    "dynamic_collectives": dynamic,
  }


def _measure_ials(args: argparse.Namespace, strategy) -> dict:
  """One epoch of ImplicitALS, its tables row-sharded."""
  import ials_scale  # noqa: PLC0415  (this folder is on sys.path)

  settings = argparse.Namespace(
    users=args.users,
    items=args.items,
    pairs=args.pairs,
    zipf=1.1,
    dim=16,
    batch_size=args.ials_batch,
    history_chunk=args.history_chunk,
    placement="row_sharded",
    epochs=1,
    reg=100.0,
    alpha=10.0,
    seed=0,
  )
  out = ials_scale.measure(settings, strategy)
  return {
    "step_ms": out["seconds"][0] / out["steps"] * 1e3,
    "cpu_ms": out["cpu_seconds"][0] / out["steps"] * 1e3,
    # An epoch solves every pair twice (once a side): a pair per half.
    "examples_per_step": out["pairs"] / out["steps"],
    "collective_bytes": out["collective_bytes"],
    "dynamic_collectives": out["dynamic_collectives"],
  }


def _task(args: argparse.Namespace) -> None:
  import recsys  # noqa: F401, PLC0415  (Keras 2 before TensorFlow)

  sys.path.insert(0, HERE)
  os.chdir(REPO)  # the gin file's path
  strategy = _strategy(args.task_replicas)
  measure = _measure_dlrm if args.task == "dlrm" else _measure_ials
  row = measure(args, strategy)
  row["peak_rss_mib"] = (
    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  )
  task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
  path = os.path.join(args.out, f"task{task.get('index', 0)}.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(row, f)


# -- the driver ----------------------------------------------------------


def _task_argv(args: argparse.Namespace, model: str, replicas: int, out: str):
  argv = [
    "--task",
    model,
    "--task_replicas",
    str(replicas),
    "--out",
    out,
    "--batch",
    str(args.batch),
    "--loop",
    str(args.loop),
    "--reps",
    str(args.reps),
    "--users",
    str(args.users),
    "--items",
    str(args.items),
    "--pairs",
    str(args.pairs),
    "--ials_batch",
    str(args.ials_batch),
    "--history_chunk",
    str(args.history_chunk),
  ]
  for binding in args.gin_bindings:
    argv += ["--gin_bindings", binding]
  return argv


def _env() -> dict:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
  return env


def _one_process(args, model: str, replicas: int) -> list:
  """The rows the task files of one process hold. The process is this
  one's own (`recsys.launch.run_owned`): a SIGTERM or SIGINT here is
  forwarded to it, and it ends with this process."""
  from recsys import launch  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as out:
    argv = [sys.executable, __file__, *_task_argv(args, model, replicas, out)]
    code = launch.run_owned(argv, env=_env())
    if code != 0:
      print(f"{model}, {replicas} replicas: exit status {code}", flush=True)
      sys.exit(code)
    return _rows(out)


def _cluster(args, model: str, workers: int) -> list:
  """The rows of `workers` processes of one replica each (a local
  MultiWorkerMirroredStrategy cluster, owned as `recsys launch` owns one:
  a SIGTERM or SIGINT here stops it, and it ends with this process)."""
  from recsys import launch  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as out:
    printed = io.StringIO()
    cluster = launch.Cluster(
      launch.cluster_spec(workers, 0),
      _task_argv(args, model, 1, out),
      out=printed,
      env=_env(),
      log_dir=out,
      program=[sys.executable, __file__],
    )
    with launch.StopSignals() as signals:
      try:
        cluster.start()
        code = cluster.wait(stopping=signals.stopping)
        if code == 0:  # the chief; the other workers end after it
          cluster.settle(seconds=_SETTLE_SECONDS, stopping=signals.stopping)
      finally:
        cluster.stop()
    if signals.first is not None:
      sys.exit(launch.signal_status(signals.first))
    if code != 0 or any(s != 0 for s in cluster.statuses().values()):
      sys.exit(f"{model}, {workers} workers: {printed.getvalue()[-4000:]}")
    return _rows(out)


def _rows(out: str) -> list:
  names = sorted(n for n in os.listdir(out) if n.startswith("task"))
  rows = []
  for name in names:
    with open(os.path.join(out, name), encoding="utf-8") as f:
      rows.append(json.load(f))
  return rows


def _combined(model: str, replicas: int, processes: list) -> dict:
  """One row of the table from its processes' rows: the first process's
  step time, the CPU time of them all."""
  first = processes[0]
  examples = first["examples_per_step"]
  cpu_ms = sum(p["cpu_ms"] for p in processes)
  return {
    "model": model,
    "replicas": replicas,
    "processes": len(processes),
    "step_ms": first["step_ms"],
    "examples_per_s": examples / first["step_ms"] * 1e3,
    "cpu_us_per_example": cpu_ms / examples * 1e3,
    "collective_bytes": first["collective_bytes"],
    "dynamic_collectives": first["dynamic_collectives"],
    "peak_rss_mib": [p["peak_rss_mib"] for p in processes],
  }


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def _print_table(rows: list) -> None:
  from recsys import planning  # noqa: PLC0415

  print(
    "| model | replicas | processes | step ms | examples/s "
    "| CPU-us / example | x 1 replica | collectives / replica / step "
    "| peak RSS MiB / process |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  first = {}
  for row in rows:
    base = first.setdefault(row["model"], row["cpu_us_per_example"])
    shown = planning.human_bytes(row["collective_bytes"])
    if row["dynamic_collectives"]:
      shown += f" + {row['dynamic_collectives']} dynamic"
    rss = ", ".join(f"{m:,.0f}" for m in row["peak_rss_mib"])
    print(
      f"| {row['model']} | {row['replicas']} | {row['processes']} "
      f"| {row['step_ms']:.1f} | {row['examples_per_s']:,.0f} "
      f"| {row['cpu_us_per_example']:.2f} "
      f"| {row['cpu_us_per_example'] / base:.2f} | {shown} | {rss} |"
    )


def main(argv=None) -> None:
  args = _parse(argv)
  if args.task:
    _task(args)
    return
  sys.path.insert(0, REPO)
  models = [m for m in args.models.split(",") if m]
  unknown = sorted(set(models) - set(MODELS))
  if unknown:
    sys.exit(f"--models: unknown {unknown}; choose from {list(MODELS)}")
  counts = [int(r) for r in args.replicas.split(",") if r]
  print(
    f"{_cpu_model()}, {os.cpu_count()} cores, load "
    f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
    f"OMP_NUM_THREADS={_env()['OMP_NUM_THREADS']}; DLRM {args.batch} "
    f"examples/replica, iALS {args.users:,} x {args.items:,} "
    f"({args.pairs:,} pairs drawn), {args.ials_batch} entries/replica, "
    f"history_chunk {args.history_chunk}; tables row-sharded, all-to-all",
    flush=True,
  )
  rows = []
  for model in models:
    runs = [(r, f"{r} replica(s)", _one_process) for r in counts]
    if args.workers > 1:
      runs.append((args.workers, f"{args.workers} workers", _cluster))
    for replicas, label, run in runs:
      start = time.perf_counter()
      rows.append(_combined(model, replicas, run(args, model, replicas)))
      print(
        f"  {model}, {label}: {time.perf_counter() - start:.0f} s", flush=True
      )
      if args.json:  # after each row: a failure later keeps them
        with open(args.json, "w", encoding="utf-8") as f:
          json.dump({"cpu": _cpu_model(), "rows": rows}, f, indent=1)
  _print_table(rows)


if __name__ == "__main__":
  main()
