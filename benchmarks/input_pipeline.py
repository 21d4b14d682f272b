"""Input-pipeline throughput (examples/s): synthetic CTR and retrieval, Criteo TSV, MovieLens.

Optionally compares the default experiment's training rate with its real
pipeline against the same model fed one cached batch, which shows whether the
pipeline is the bottleneck (on a shared 2-core machine the pipeline and the
train step compete for the same cores).

Usage:
  python benchmarks/input_pipeline.py                       # pipelines only
  python benchmarks/input_pipeline.py --trainer_steps 400   # + trainer comparison
  python benchmarks/input_pipeline.py --movielens_dir /path/to/ml-100k --movielens_variant atomic
"""

import argparse
import gzip
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: E402,F401  (Keras 2 before TensorFlow)
from recsys import data  # noqa: E402


def throughput(
  dataset: tf.data.Dataset, max_batches: int, warmup: int = 5
) -> tuple:
  """(examples/s, process CPU microseconds per example) after `warmup` batches.

  CPU time per example is the robust figure on a shared machine: it is what
  the pipeline takes away from the train step, whatever else is running.
  """
  iterator = iter(dataset)
  for _ in range(warmup):
    next(iterator)
  examples, start, cpu = 0, time.perf_counter(), time.process_time()
  for _ in range(max_batches):
    try:
      _, labels = next(iterator)
    except StopIteration:
      break
    examples += int(labels.shape[0])
  wall, cpu = time.perf_counter() - start, time.process_time() - cpu
  return examples / wall, 1e6 * cpu / examples


def write_criteo(path: str, lines: int, seed: int = 0) -> None:
  """A Criteo-format TSV with Criteo-like missing values and negative counts."""
  rng = np.random.default_rng(seed)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wt") as f:
    for start in range(0, lines, 10_000):
      n = min(10_000, lines - start)
      dense = rng.geometric(0.05, size=(n, 13)) - 2  # includes -1 (and 0)
      dense_missing = rng.random((n, 13)) < 0.2
      cats = rng.integers(0, 1 << 32, size=(n, 26))
      cat_missing = rng.random((n, 26)) < 0.1
      labels = rng.random(n) < 0.25
      for i in range(n):
        d = ["" if dense_missing[i, j] else str(dense[i, j]) for j in range(13)]
        c = [
          "" if cat_missing[i, j] else f"{cats[i, j]:08x}" for j in range(26)
        ]
        f.write("\t".join([str(int(labels[i]))] + d + c) + "\n")


def trainer_rates(steps: int) -> tuple:
  """(examples/s with the real pipeline, with one cached batch) of the default experiment."""
  import gin  # pylint: disable=g-import-not-at-top

  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.training import train as train_fn  # pylint: disable=g-import-not-at-top

  root = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "experiments"
  )

  class Cached:
    """The source's first batch, repeated: a pipeline that costs nothing."""

    def __init__(self, source):
      self._source = source
      self.feature_specs, self.num_dense = (
        source.feature_specs,
        source.num_dense,
      )

    def dataset(self, batch_size, **kwargs):
      return self._source.dataset(batch_size, **kwargs).take(1).cache().repeat()

    def __getattr__(self, name):
      return getattr(self._source, name)

  rates = []
  for cached in (False, True):
    gin.clear_config()
    config.parse(
      [os.path.join(root, "synthetic_dlrm.gin")],
      [
        f"train.train_steps = {steps}",
        "train.steps_per_loop = 100",
        "train.eval_steps = 1",
        "train.progress_bar = False",
        "train.summaries = False",
      ],
      finalize=False,
    )
    model_dir = tempfile.mkdtemp(prefix="bench_trainer_")
    try:
      trainer = train_fn(model_dir, action="build")
      if cached:
        trainer.run.source = Cached(trainer.run.source)
      rates.append(trainer.train()["examples_per_second_steady"])
    finally:
      shutil.rmtree(model_dir, ignore_errors=True)
  return tuple(rates)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch_size", type=int, default=2048)
  parser.add_argument(
    "--batches", type=int, default=100, help="batches timed per source"
  )
  parser.add_argument("--criteo_lines", type=int, default=200_000)
  parser.add_argument("--movielens_dir", default=None)
  parser.add_argument("--movielens_variant", default="ml-100k")
  parser.add_argument(
    "--trainer_steps",
    type=int,
    default=0,
    help="> 0: also time the default experiment (real vs cached input)",
  )
  parser.add_argument(
    "--trainer_repeats",
    type=int,
    default=2,
    help="alternate real/cached runs this often; report the best of each",
  )
  args = parser.parse_args()
  bs, n = args.batch_size, args.batches
  print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs, batch {bs}")
  rows = []

  rows.append(
    (
      "SyntheticCTR (default experiment config)",
      throughput(data.SyntheticCTR().dataset(bs), n),
    )
  )
  rows.append(
    (
      "SyntheticCTR, 26 features, 2 weighted bags",
      throughput(
        data.SyntheticCTR(
          vocab_sizes=[10_000] * 26,
          multi_hot_sizes=[1] * 24 + [4, 8],
          weighted=[False] * 24 + [True, True],
        ).dataset(bs),
        n,
      ),
    )
  )
  rows.append(
    (
      "SyntheticRetrieval (default)",
      throughput(data.SyntheticRetrieval().dataset(bs), n),
    )
  )

  tmp = tempfile.mkdtemp(prefix="bench_criteo_")
  try:
    plain = os.path.join(tmp, "day_0")
    t0 = time.perf_counter()
    write_criteo(plain, args.criteo_lines)
    with (
      open(plain, "rb") as src,
      gzip.open(plain + ".gz", "wb", compresslevel=1) as dst,
    ):
      shutil.copyfileobj(src, dst)
    print(
      f"wrote {args.criteo_lines:,} Criteo lines in {time.perf_counter() - t0:.1f} s"
    )
    batches = args.criteo_lines // bs
    for name, path in (("plain", plain), ("gzip", plain + ".gz")):
      source = data.CriteoTSV(train_files=path, vocab_sizes="kaggle")
      rows.append(
        (
          f"CriteoTSV {name}, hashed ids, 1 file",
          throughput(source.dataset(bs, repeat=False), batches - 6, warmup=5),
        )
      )
  finally:
    shutil.rmtree(tmp, ignore_errors=True)

  if args.movielens_dir:
    source = data.MovieLens(args.movielens_dir, variant=args.movielens_variant)
    rows.append(
      (
        f"MovieLens {args.movielens_variant} ranking",
        throughput(source.dataset(bs), n),
      )
    )

  print(f"\n{'pipeline':48s} {'examples/s':>12s} {'CPU us/example':>15s}")
  for name, (rate, cpu) in rows:
    print(f"{name:48s} {rate:12,.0f} {cpu:15.2f}")

  if args.trainer_steps:
    runs = [
      trainer_rates(args.trainer_steps) for _ in range(args.trainer_repeats)
    ]
    real, cached = max(r[0] for r in runs), max(r[1] for r in runs)
    print(
      f"\ndefault experiment (synthetic_dlrm.gin, batch 1024), {args.trainer_steps} steps, "
      f"best of {args.trainer_repeats}:"
    )
    print(f"{'  with SyntheticCTR pipeline':48s} {real:12,.0f}")
    print(f"{'  with one cached batch (no input cost)':48s} {cached:12,.0f}")
    print(
      f"  input pipeline costs {100 * (1 - real / cached):.0f}% of the training rate"
    )
    cpu = throughput(data.SyntheticCTR().dataset(1024), n)[1]
    print(
      f"  SyntheticCTR at batch 1024: {cpu:.2f} CPU us/example, i.e. "
      f"{cpu * cached / 1e6:.2f} CPU-seconds per second at the cached rate "
      f"({os.cpu_count()} cores)"
    )


if __name__ == "__main__":
  main()
