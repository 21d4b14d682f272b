"""Every shipped experiment with and without `train.jit_compile`, 1 and 2 replicas.

A TPU compiles every step with XLA; this script checks, on the CPU, that each
experiment in `experiments/` trains compiled to the same metrics (within
noise) as uncompiled, on one replica and on two mirrored CPU replicas (which
run the compiled path's static shapes uncompiled: XLA cannot compile CPU
collectives). Criteo and MovieLens run on small files it generates; every
experiment is shrunk to `--steps` steps of batch `--batch`.

    python benchmarks/compiled_experiments.py --steps 200
    python benchmarks/compiled_experiments.py --experiments synthetic_dlrm --replicas 1

Prints one row per (experiment, replicas, jit_compile): final eval metrics,
examples/s (median loop after the first) and wall seconds (compiling included).
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

EXPERIMENTS = (
  "synthetic_dlrm",
  "synthetic_dcn",
  "synthetic_two_tower",
  "movielens_ranking",
  "movielens_retrieval",
  "criteo_dlrm",
  "criteo_dcn",
)


def write_criteo(folder: str, lines: int, seed: int = 0) -> str:
  """A small Kaggle-layout Criteo folder (train.txt, eval.txt) with signal."""
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  for name, n in (("train.txt", lines), ("eval.txt", lines // 4)):
    with open(os.path.join(folder, name), "w") as f:
      for _ in range(n):
        dense = rng.integers(0, 100, 13)
        cats = rng.integers(0, 50, 26)
        logit = 0.05 * (dense[0] - 50) + (cats[0] % 5 - 2) * 0.8
        label = int(rng.uniform() < 1 / (1 + np.exp(-logit)))
        f.write(
          "\t".join(
            [str(label)]
            + [str(d) for d in dense]
            + [f"{c * 2654435761 % (1 << 32):08x}" for c in cats]
          )
          + "\n"
        )
  return folder


def write_movielens(
  folder: str,
  users: int = 300,
  items: int = 200,
  ratings: int = 12000,
  seed: int = 0,
) -> str:
  """A small ml-100k-layout folder (u.data, u.user, u.item) with a planted MF."""
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  u_f, i_f = rng.normal(size=(users, 4)), rng.normal(size=(items, 4))
  with open(os.path.join(folder, "u.user"), "w") as f:
    for u in range(1, users + 1):
      f.write(f"{u}|{rng.integers(18, 70)}|{'MF'[u % 2]}|other|{10000 + u}\n")
  with open(os.path.join(folder, "u.item"), "wb") as f:
    for i in range(1, items + 1):
      genres = "|".join(str(int(rng.uniform() < 0.2)) for _ in range(19))
      f.write(
        f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|{genres}\n".encode(
          "latin-1"
        )
      )
  with open(os.path.join(folder, "u.data"), "w") as f:
    for k in range(ratings):
      u, i = rng.integers(0, users), rng.integers(0, items)
      r = int(np.clip(np.round(3 + u_f[u] @ i_f[i] / 2), 1, 5))
      f.write(f"{u + 1}\t{i + 1}\t{r}\t{880000000 + k}\n")
  return folder


def bindings(name: str, data: dict, steps: int, batch: int) -> list:
  out = [
    f"train.train_steps = {steps}",
    f"train.global_batch_size = {batch}",
    f"train.steps_per_loop = {max(1, steps // 4)}",
    "train.eval_steps = 8",
    "train.eval_every = 0",
    "train.checkpoint_every = 0",
    "train.progress_bar = False",
    "train.summaries = False",
  ]
  if name.startswith("criteo"):
    out += [
      f"CRITEO_DIR = '{data['criteo']}'",
      "CriteoTSV.max_vocab_size = 1000",
      "EmbeddingSettings.dim = 16",
      "DLRM.bottom_mlp = (64, 16)",
      "DLRM.top_mlp = (64, 32)",
      "WarmupPolyDecay.base_learning_rate = 0.1",
      "WarmupPolyDecay.warmup_steps = 10",
      f"WarmupPolyDecay.decay_start_step = {steps}",
      "WarmupPolyDecay.decay_steps = 10",
    ]
  if name.startswith("movielens"):
    out.append(f"MOVIELENS_DIR = '{data['movielens']}'")
  if name.startswith("synthetic") and "two_tower" not in name:
    out.append("SyntheticCTR.oracle_examples = 4096")
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
  parser.add_argument("--replicas", default="1,2")
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--json", help="also write the rows here")
  args = parser.parse_args(argv)

  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import gin  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.training import train  # pylint: disable=g-import-not-at-top

  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
  )
  strategies = {
    1: tf.distribute.get_strategy(),
    2: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
  }
  work = tempfile.mkdtemp(prefix="compiled_experiments_")
  data = {
    "criteo": write_criteo(os.path.join(work, "criteo"), 20000),
    "movielens": write_movielens(os.path.join(work, "movielens")),
  }
  rows = []
  for name in args.experiments.split(","):
    path = os.path.join(config.EXPERIMENTS_DIR, f"{name}.gin")
    for replicas in (int(r) for r in args.replicas.split(",")):
      for jit in (False, True):
        gin.clear_config()
        config.parse([path], bindings(name, data, args.steps, args.batch))
        start = time.time()
        metrics = train(
          model_dir=os.path.join(work, f"{name}_{replicas}_{jit}"),
          strategy=strategies[replicas],
          jit_compile=jit,
        )
        row = {
          "experiment": name,
          "replicas": replicas,
          "jit_compile": jit,
          "wall_s": round(time.time() - start, 1),
          "examples_per_s": round(metrics.get("examples_per_second_steady", 0)),
          **{
            k: round(v, 4) for k, v in metrics.items() if k.startswith("eval/")
          },
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  sys.exit(main())
