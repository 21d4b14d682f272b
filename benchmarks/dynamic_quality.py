"""Dynamic vocabulary vs hashing at equal table memory, on the drifting stream.

The two shipped experiments train the same DLRM on the same synthetic
clicks whose ids drift (features C3, C4, C6 deliver raw 64-bit ids from a
sliding window; far more distinct ids over the stream than table rows):

  dynamic   experiments/synthetic_dynamic.gin: each drifting feature's table
            (capacity = the window) is mapped by a dynamic vocabulary,
            "lru" eviction: an id gets a row of its own, a stale id gives
            its row back
  hashed    experiments/synthetic_hashed.gin: the same tables, the raw ids
            hashed into their rows (collisions and all)

For each seed (bound as `SyntheticCTR.seed` and `train.seed`: the data and
the model's initialisation) and each variant, `recsys train` runs in a
fresh process, one run at a time, its output in a log file, and its
`metrics.json` is read. Evaluation samples the last positions of the
training stream (the ids current at the end of training: the later part
of the stream), so the eval AUC is the figure compared. Printed, as
Markdown tables:

  1. per variant: eval AUC and log-loss, mean +- sd over the seeds (sd:
     the sample standard deviation), the Bayes AUC (the best any model can
     reach on the data), wall seconds per run;
  2. "AUC dynamic - hashed" per seed (the same data and initialisation:
     paired) and its mean +- sd, and whether dynamic leads by more than
     one sd;
  3. the dynamic tables' counters (metrics.json's vocabulary/<table>/...)
     per seed, next to the distinct ids the training stream delivered to
     the table (admissions above that are ids admitted again after an
     eviction) and how many ids of the last window (of those the stream
     delivered) hold a row in the run's last checkpoint (the others read
     zeros in evaluation);
  4. collisions per table: for the hashed tables, how many of the distinct
     ids of the training stream share a row with another id, and how many
     of the ids live at the end of training (the last window) do;
     computed in this process from the data source the gin config builds
     (the stream regenerated, its ids hashed as the table hashes them).
     For the dynamic tables 0 by construction (the index never maps two
     ids to one row: when the rows run out it evicts an id, it does not
     share its row): checked in each run's last checkpoint, whose index
     must hold distinct ids in distinct rows.

Each run's model dir is <root>/<variant>_seed<seed> (with its log next to
it), <root> a temporary folder deleted at the end unless --model_dir_root
is given. A run this script starts is its own: Ctrl-C or SIGTERM stops it
(SIGTERM, then SIGKILL after 30 s) before the script exits. The CPU model,
the load and the busy processes are printed before and after the runs.

Example:
  OMP_NUM_THREADS=1 python benchmarks/dynamic_quality.py      # 3 seeds x 2
  python benchmarks/dynamic_quality.py --seeds 0 --steps 3000 --json q.json
  python benchmarks/dynamic_quality.py --seeds 0,1 --steps 30 \\
      --gin_bindings 'SyntheticCTR.num_eval_examples = 2048' \\
      --gin_bindings 'train.eval_steps = 2'
"""

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import race  # noqa: E402  (this folder: machine state)
import tables  # noqa: E402  (this folder: Markdown tables)

#: Variant -> its shipped experiment (in recsys's experiments folder).
VARIANTS = {
  "dynamic": "synthetic_dynamic.gin",
  "hashed": "synthetic_hashed.gin",
}
#: metrics.json's counters of a dynamic table, vocabulary/<table>/<counter>.
COUNTERS = (
  "capacity",
  "rows_in_use",
  "admissions",
  "evictions",
  "refused",
  "default_hits",
)
#: Seconds a stopped run gets to exit after SIGTERM before SIGKILL.
STOP_GRACE_SECONDS = 30
#: Training examples regenerated per call when counting the stream's ids.
_CHUNK = 1 << 16


class Stopped(Exception):
  """SIGTERM reached this script (Ctrl-C raises KeyboardInterrupt)."""


class RunFailedError(RuntimeError):
  """A `recsys train` run exited with an error."""


def _raise_stopped(signum, frame) -> None:
  del signum, frame
  raise Stopped()


# ----------------------------------------------------------- settings, runs


def experiment_path(variant: str) -> str:
  from recsys import config

  return os.path.join(config.EXPERIMENTS_DIR, VARIANTS[variant])


def seed_bindings(seed: int) -> list[str]:
  """The seed of the data (and its planted model) and of the run."""
  return [f"SyntheticCTR.seed = {seed}", f"train.seed = {seed}"]


def length_bindings(steps: int, batch: int) -> list[str]:
  """`--steps`: that many steps on one pass over a stream as long, as the
  gin files make their runs (num_examples = steps x batch)."""
  if not steps:
    return []
  return [
    f"train.train_steps = {steps}",
    f"SyntheticCTR.num_examples = {steps * batch}",
  ]


def parse(path: str, bindings: list[str]):
  """Parses a variant's gin config here (gin's state replaced)."""
  import gin

  from recsys import config

  gin.clear_config()
  config.parse([path], bindings)


def data_settings() -> str:
  """The parsed config's data source and its settings, as text."""
  from recsys.gin_config import compat

  found = compat.referenced_configurable("train.data")
  if found is None:
    return "train.data unbound"
  source, settings = found
  return f"{source.__name__}({sorted(settings.items())!r})"


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _group_alive(pgid: int) -> bool:
  """Whether any process of process group `pgid` is left."""
  try:
    os.killpg(pgid, 0)
  except ProcessLookupError:
    return False
  return True


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
  """SIGINT and SIGTERM held while a run starts, then raised (as
  KeyboardInterrupt / Stopped) once `Popen` has returned and its caller
  can stop the run: raised inside `Popen`, after the child started, they
  left that run with nobody to stop it."""
  caught: list[int] = []
  old = {
    s: signal.signal(s, lambda signum, _: caught.append(signum))
    for s in _SIGNALS
  }
  try:
    yield
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)
  if caught:
    raise KeyboardInterrupt if caught[0] == signal.SIGINT else Stopped()


def stop(proc: subprocess.Popen) -> None:
  """Ends a run we started and its whole process group: SIGTERM (recsys
  train stops at a step and exits), SIGKILL after `STOP_GRACE_SECONDS` to
  whatever is left — the run's own children too, which may outlive it by
  a moment (its direct process exiting is not the group ending)."""
  old = {s: signal.signal(s, signal.SIG_IGN) for s in _SIGNALS}
  try:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline:
      if proc.poll() is not None and not _group_alive(proc.pid):
        break
      time.sleep(0.05)
    else:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    proc.wait()
    while _group_alive(proc.pid) and time.monotonic() < deadline + 5:
      time.sleep(0.05)  # SIGKILLed: gone as soon as the kernel reaps them
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)


def train(path: str, bindings: list[str], model_dir: str, log_path: str):
  """Runs `recsys train` in a fresh process (its own process group, which
  `stop` ends if this script is interrupted); returns (metrics, wall s).

  Raises:
    RunFailedError: the run exited with an error (the log's end quoted).
  """
  command = [
    sys.executable,
    "-m",
    "recsys",
    "train",
    "--gin_file",
    path,
    "--model_dir",
    model_dir,
  ]
  for binding in bindings:
    command += ["--gin_bindings", binding]
  with open(log_path, "w", encoding="utf-8") as log:
    log.write("$ " + " ".join(command) + "\n")
    log.flush()
    start = time.monotonic()
    proc = None
    try:
      with _signals_held():
        proc = subprocess.Popen(
          command,
          stdin=subprocess.DEVNULL,
          stdout=log,
          stderr=subprocess.STDOUT,
          start_new_session=True,
        )
      code = proc.wait()
    finally:
      if proc is not None:
        stop(proc)
    wall = time.monotonic() - start
  if code != 0:
    with open(log_path, encoding="utf-8", errors="replace") as f:
      tail = "".join(f.readlines()[-30:])
    raise RunFailedError(
      f"recsys train exited with status {code} (model dir {model_dir}); "
      f"the end of its log {log_path}:\n{tail}"
    )
  with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
    return json.load(f), wall


# -------------------------------------------------------------- collisions


def ids_sharing_a_row(rows) -> int:
  """How many of the ids (one row each, `rows`) share their row."""
  import numpy as np

  _, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
  return int(np.sum(counts[inverse] > 1))


def stream_tables() -> tuple[dict[str, dict], dict]:
  """Per mapped table of the parsed config (`EmbeddingPlacement.
  vocabularies`): its rows, policy, the distinct ids the training stream
  delivers to it, those of the last window, and for a hashed table how
  many of each share a row (hashed as the run hashes them); and per
  table the ids of the last window (int64 NumPy).

  The training stream: examples [0, min(train_steps, num_examples //
  batch) x batch) of the source (batch b holds examples [bB, (b+1)B); a
  sized stream repeats from its start).
  """
  import gin
  import numpy as np
  import tensorflow as tf

  from backends import vocabulary
  from recsys import config
  from recsys.gin_config import compat
  from recsys.run import configured

  # Built here (config.value would turn the source's refusal into None).
  source = compat.evaluate(gin.query_parameter("train.data"))
  settings = configured.configured_settings()
  batch, steps = settings.global_batch_size, settings.train_steps
  bound = config.value("EmbeddingPlacement.vocabularies") or {}
  policies = {table: compat.evaluate(p) for table, p in bound.items()}
  feature_config = configured.configured_embedding(
    feature_specs=(list(source.feature_specs), "")
  )[0]
  if not feature_config:
    raise ValueError("the gin config builds no embedding tables (train.data)")
  features_of = {
    table: [f for f, c in feature_config.items() if c.table.name == table]
    for table in policies
  }
  sizes = {
    c.table.name: int(c.table.vocabulary_size) for c in feature_config.values()
  }
  batches = (
    steps
    if source.num_examples is None
    else min(steps, source.num_examples // batch)
  )
  trained = batches * batch
  names = sorted({f for fs in features_of.values() for f in fs})

  # The generator branches on Python values only, as the Trainer's input
  # pipeline runs it: autograph's conversion of it took 3.5 s here.
  @tf.function(
    input_signature=[tf.TensorSpec([None], tf.int64)], autograph=False
  )
  def delivered(index):
    categorical = source.examples(index)[0]["categorical"]
    return {
      n: getattr(categorical[n], "flat_values", categorical[n]) for n in names
    }

  seen: dict[str, list] = {n: [] for n in names}
  for start in range(0, trained, _CHUNK):
    out = delivered(
      tf.range(start, min(start + _CHUNK, trained), dtype=tf.int64)
    )
    for n in names:
      seen[n].append(np.unique(out[n].numpy()))
  result, windows = {}, {}
  for table, policy in policies.items():
    fs = features_of[table]
    stream = np.unique(np.concatenate([np.concatenate(seen[f]) for f in fs]))
    last = np.unique(
      np.concatenate(
        [source.delivered_ids(f, source.window(f, trained - 1)) for f in fs]
      )
    )
    row = {
      "policy": type(policy).__name__,
      "rows": sizes[table],
      "features": fs,
      "stream_ids": int(stream.size),
      "window_ids": int(last.size),
      "window_ids_delivered": int(np.isin(last, stream).sum()),
      "stream_sharing": None,
      "window_sharing": None,
    }
    if isinstance(policy, vocabulary.HashedIds):
      index = vocabulary.HashedIndex(table, sizes[table], policy)
      for key, ids in (("stream_sharing", stream), ("window_sharing", last)):
        row[key] = ids_sharing_a_row(index.lookup(tf.constant(ids)).numpy())
    result[table] = row
    windows[table] = last
  return result, windows


def checkpoint_index(model_dir: str, table: str, window) -> dict:
  """A dynamic table's index as the run's last checkpoint holds it: how
  many ids it maps, how many of them share a row, whether it is
  consistent (ids distinct, each row in range, occupied and holding its id
  in `keys`), and how many of the ids `window` (the last window's) it
  maps."""
  import numpy as np
  import tensorflow as tf

  path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  reader = tf.train.load_checkpoint(path)
  # The backend's `vocabularies` child (backends.vocabulary.stage):
  # `.../vocabularies/tables/<table>/<state>`, the table name escaped.
  escaped = table.replace(".", "..").replace("/", ".S")
  marker = f"vocabularies/tables/{escaped}/"
  prefixes = {
    name[: name.index(marker) + len(marker)]
    for name in reader.get_variable_to_shape_map()
    if (name.startswith(marker) or f"/{marker}" in name)
  }
  if len(prefixes) != 1:
    raise ValueError(
      f"checkpoint {path}: expected one vocabulary index of table "
      f"{table!r} ('...{marker}...'), found {sorted(prefixes)}."
    )
  (prefix,) = prefixes

  def read(name: str):
    return reader.get_tensor(prefix + name)

  ids = read("table/.ATTRIBUTES/table-keys")
  rows = read("table/.ATTRIBUTES/table-values")
  keys = read("keys/.ATTRIBUTES/VARIABLE_VALUE")
  occupied = read("occupied/.ATTRIBUTES/VARIABLE_VALUE")
  in_range = bool(np.all((rows >= 0) & (rows < keys.size)))
  consistent = (
    in_range
    and np.unique(ids).size == ids.size
    and int(occupied.sum()) == ids.size
    and bool(np.all(occupied[rows]))
    and bool(np.all(keys[rows] == ids))
  )
  return {
    "ids": int(ids.size),
    "rows": int(keys.size),
    "sharing": ids_sharing_a_row(rows),
    "consistent": bool(consistent),
    "window_ids_held": int(np.isin(window, ids).sum()),
  }


# ----------------------------------------------------------------- reports


def mean_sd(values) -> tuple[float, float]:
  """Mean and sample standard deviation (nan for fewer than 2 values)."""
  values = list(values)
  sd = statistics.stdev(values) if len(values) > 1 else math.nan
  return statistics.fmean(values), sd


def pm(values, digits: int = 4, sign: str = "") -> str:
  mean, sd = mean_sd(values)
  if math.isnan(sd):
    return f"{mean:{sign}.{digits}f}"
  return f"{mean:{sign}.{digits}f} +- {sd:.{digits}f}"


def share(part, whole) -> str:
  if part is None:
    return "-"
  return f"{part:,} ({100 * part / whole:.1f} %)" if whole else f"{part:,}"


def report(runs: list[dict], streams: dict, seeds: list[int]) -> dict:
  """Prints the tables; returns the summary (per variant, differences)."""
  variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
  of = {(r["variant"], r["seed"]): r for r in runs}
  summary: dict = {"variants": {}, "differences": []}
  print("\nPer variant (eval on the last positions of the stream):\n")
  rows = []
  for v in variants:
    mine = [of[v, s] for s in seeds]
    auc = [r["metrics"]["eval/auc"] for r in mine]
    loss = [r["metrics"]["eval/logloss"] for r in mine]
    bayes = [r["metrics"]["bayes_auc"] for r in mine]
    wall = [r["wall_seconds"] for r in mine]
    summary["variants"][v] = {
      "auc_mean_sd": mean_sd(auc),
      "logloss_mean_sd": mean_sd(loss),
      "bayes_auc_mean": statistics.fmean(bayes),
      "wall_seconds_mean": statistics.fmean(wall),
    }
    rows.append(
      f"{v} | {len(mine)} | {pm(auc)} | {pm(loss)} | {pm(bayes)} | "
      f"{mine[0]['metrics']['step']} | {statistics.fmean(wall):.0f}"
    )
  tables.print_table(
    "variant | seeds | eval AUC | eval logloss | Bayes AUC | steps | "
    "wall s per run",
    rows,
  )
  if set(variants) == set(VARIANTS):
    print("\nAUC dynamic - hashed, per seed (same data, same init):\n")
    rows, diffs = [], []
    for s in seeds:
      dyn = of["dynamic", s]["metrics"]["eval/auc"]
      hashed = of["hashed", s]["metrics"]["eval/auc"]
      diffs.append(dyn - hashed)
      summary["differences"].append({"seed": s, "auc_difference": dyn - hashed})
      rows.append(f"{s} | {dyn:.4f} | {hashed:.4f} | {dyn - hashed:+.4f}")
    dyn_all = [of["dynamic", s]["metrics"]["eval/auc"] for s in seeds]
    hashed_all = [of["hashed", s]["metrics"]["eval/auc"] for s in seeds]
    rows.append(
      f"mean +- sd | {pm(dyn_all)} | {pm(hashed_all)} | {pm(diffs, sign='+')}"
    )
    tables.print_table(
      "seed | dynamic AUC | hashed AUC | dynamic - hashed", rows
    )
    mean, sd = mean_sd(diffs)
    spread = max(
      summary["variants"][v]["auc_mean_sd"][1] for v in ("dynamic", "hashed")
    )
    summary["difference_mean_sd"] = (mean, sd)
    if math.isnan(sd):
      verdict = "one seed: no sd to compare with"
    else:
      lead = "ahead" if mean > 0 else "behind"
      beyond = abs(mean) > sd and abs(mean) > spread
      verdict = (
        f"dynamic is {lead} by {abs(mean):.4f}, "
        f"{'more' if beyond else 'not more'} than one sd (sd of the "
        f"per-seed differences {sd:.4f}; of a variant's AUC up to {spread:.4f})"
      )
    summary["verdict"] = verdict
    print(f"\ndynamic - hashed: {verdict}")
  dynamic_runs = [of["dynamic", s] for s in seeds if ("dynamic", s) in of]
  if dynamic_runs:
    print("\nDynamic tables' counters (metrics.json) per seed:\n")
    rows = []
    for r in dynamic_runs:
      for table, counters in r["counters"].items():
        stream = streams[r["seed"]][table]
        again = int(counters["admissions"]) - stream["stream_ids"]
        held = r["index"][table]["window_ids_held"]
        rows.append(
          f"{r['seed']} | {table} | "
          + " | ".join(f"{int(counters[c]):,}" for c in COUNTERS)
          + f" | {stream['stream_ids']:,} | {again:,} | {held:,} of "
          f"{stream['window_ids_delivered']:,}"
        )
    tables.print_table(
      "seed | table | " + " | ".join(COUNTERS) + " | distinct ids in the "
      "stream | admissions - distinct ids | ids of the last window the "
      "stream delivered: with a row (checkpoint)",
      rows,
    )
  print(
    "\nCollisions: ids sharing a row with another id (hashed: from the "
    "regenerated stream; dynamic: in the run's last checkpoint):\n"
  )
  rows = []
  for s in seeds:
    for table, t in streams[s].items():
      dyn = of.get(("dynamic", s))
      if dyn is None:
        dynamic = "-"
      else:
        index = dyn["index"][table]
        dynamic = (
          f"{index['sharing']:,} of {index['ids']:,} ids in "
          f"{index['rows']:,} rows"
          + ("" if index["consistent"] else " (INDEX INCONSISTENT)")
        )
      rows.append(
        f"{s} | {table} | {t['rows']:,} | {t['stream_ids']:,} | "
        f"{share(t['stream_sharing'], t['stream_ids'])} | "
        f"{t['window_ids']:,} | {share(t['window_sharing'], t['window_ids'])}"
        f" | {dynamic}"
      )
  tables.print_table(
    "seed | table | rows | distinct ids in the stream | hashed: sharing a "
    "row | ids of the last window | hashed: sharing a row | dynamic: "
    "sharing a row (checkpoint)",
    rows,
  )
  return summary


# -------------------------------------------------------------------- main


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument(
    "--seeds", default="0,1,2", help="comma list (default 0,1,2)"
  )
  parser.add_argument(
    "--variants",
    default=",".join(VARIANTS),
    help=f"comma list of {', '.join(VARIANTS)} (default both)",
  )
  parser.add_argument(
    "--steps",
    type=int,
    default=0,
    help="train steps per run, on a stream of steps x batch examples "
    "(binds train.train_steps and SyntheticCTR.num_examples); 0: the gin "
    "files' (6000)",
  )
  parser.add_argument(
    "--gin_bindings",
    action="append",
    default=[],
    help="passed to every run (repeat it), e.g. "
    "'SyntheticCTR.num_eval_examples = 2048'; the seeds' bindings come last",
  )
  parser.add_argument(
    "--model_dir_root",
    default="",
    help="keep the runs (model dirs and logs) here; default: a temporary "
    "folder, deleted at the end",
  )
  parser.add_argument("--json", default="", help="also write everything here")
  args = parser.parse_args(argv)
  try:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
  except ValueError:
    parser.error(f"--seeds {args.seeds!r}: give integers, e.g. 0,1,2")
  variants = [v for v in args.variants.split(",") if v]
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown or not variants or not seeds:
    parser.error(
      f"--variants {args.variants!r} / --seeds {args.seeds!r}: give seeds "
      f"and variants from {list(VARIANTS)}"
    )
  if args.steps < 0:
    parser.error(f"--steps {args.steps}: give a positive count, or 0")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  signal.signal(signal.SIGTERM, _raise_stopped)
  from recsys.errors import RecsysError

  root = args.model_dir_root or tempfile.mkdtemp(prefix="dynamic_quality_")
  try:
    result = measure(args, seeds, variants, root)
  except (RunFailedError, FileExistsError, RecsysError) as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print("interrupted: no run of this script is left running", file=sys.stderr)
    return 130
  except Stopped:
    print("SIGTERM: no run of this script is left running", file=sys.stderr)
    return 143
  finally:
    if not args.model_dir_root:
      shutil.rmtree(root, ignore_errors=True)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
  return 0


def measure(args, seeds: list[int], variants: list[str], root: str) -> dict:
  """The collisions, the runs (into `root`) and the report; returns all
  of it (what --json writes)."""
  import tensorflow as tf

  from recsys.process import threads as threads_lib
  from recsys.run import configured

  intra, inter, _ = threads_lib.thread_settings(
    0, 0, threads_lib.available_cores()
  )
  # The runs' bindings: --steps, the user's, then the seed's.
  bindings = {}
  data = {}
  for v in variants:
    parse(experiment_path(v), args.gin_bindings)
    batch = configured.configured_settings().global_batch_size
    for s in seeds:
      bindings[v, s] = (
        length_bindings(args.steps, batch)
        + args.gin_bindings
        + seed_bindings(s)
      )
      parse(experiment_path(v), bindings[v, s])
      data[v, s] = data_settings()
  for s in seeds:
    if len({data[v, s] for v in variants}) > 1:
      raise ValueError(
        f"seed {s}: the variants train on different data "
        f"({ {v: data[v, s] for v in variants} }); compare them on one "
        "stream: bind data settings for all (--gin_bindings)."
      )
  settings = {
    "machine": f"{race.cpu_model()}, {platform.machine()}, "
    f"{os.cpu_count()} cpus, Python {platform.python_version()}, "
    f"TF {tf.__version__}",
    "threads (recsys train's choice, intra-op / inter-op)": f"{intra or 'TF'}"
    f" / {inter or 'TF'}",
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
    "seeds": seeds,
    "variants": {v: VARIANTS[v] for v in variants},
    "steps": args.steps or "the gin files'",
    "gin_bindings": args.gin_bindings,
    "date": time.strftime("%Y-%m-%d %H:%M %Z"),
  }
  print("settings: " + json.dumps(settings))
  print(race.machine_state("before"), flush=True)

  # Collisions first: cheap next to the runs, and a config error shows now.
  streams, windows = {}, {}
  counted_in = "hashed" if "hashed" in variants else variants[0]
  for s in seeds:
    start = time.monotonic()
    parse(experiment_path(counted_in), bindings[counted_in, s])
    streams[s], windows[s] = stream_tables()
    print(
      f"seed {s}: the training stream's ids counted in "
      f"{time.monotonic() - start:.0f} s: "
      + ", ".join(
        f"{t} {r['stream_ids']:,} ids" for t, r in streams[s].items()
      ),
      flush=True,
    )

  os.makedirs(root, exist_ok=True)
  runs: list[dict] = []
  for s in seeds:
    for v in variants:  # interleaved: a load change hits both alike
      runs.append(one_run(v, s, bindings[v, s], root, windows[s]))
  print(race.machine_state("after"))
  summary = report(runs, streams, seeds)
  return {
    "settings": settings,
    "runs": runs,
    "streams": {str(s): t for s, t in streams.items()},
    **summary,
  }


def one_run(
  variant: str, seed: int, bindings: list[str], root: str, windows: dict
) -> dict:
  """Trains one variant and seed into `root`; its metrics, counters and
  (dynamic) checkpointed index checks."""
  name = f"{variant}_seed{seed}"
  model_dir = os.path.join(root, name)
  if os.path.exists(model_dir):
    raise FileExistsError(
      f"{model_dir} exists: recsys train would resume that run, not train "
      "this one; give another --model_dir_root or delete it."
    )
  load = race.load_average()[0]
  metrics, wall = train(
    experiment_path(variant),
    bindings,
    model_dir,
    os.path.join(root, f"{name}.log"),
  )
  run = {
    "variant": variant,
    "seed": seed,
    "model_dir": model_dir,
    "wall_seconds": wall,
    "load_at_start": load,
    "metrics": metrics,
    "counters": {},
    "index": {},
  }
  for key, value in metrics.items():
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "vocabulary":
      run["counters"].setdefault(parts[1], {})[parts[2]] = value
  if variant == "dynamic":
    run["index"] = {
      table: checkpoint_index(model_dir, table, window)
      for table, window in windows.items()
    }
  print(
    f"{name}: eval AUC {metrics['eval/auc']:.4f} (Bayes "
    f"{metrics['bayes_auc']:.4f}), {metrics['step']} steps, {wall:.0f} s "
    f"wall, load {load:.2f} at its start",
    flush=True,
  )
  return run


if __name__ == "__main__":
  sys.exit(main())
