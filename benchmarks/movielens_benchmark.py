"""MovieLens benchmark: baselines vs. the experiments over several split seeds.

`python benchmarks/movielens_benchmark.py --data_dir <folder>` (or
`--synthetic`; `recsys benchmark movielens ...` runs this file from the
checkout). A research harness, not the library: its baselines are
benchmarks/movielens_baselines.py. For each split seed, on the
held-out split that the experiments use (read from the experiment's own data
source, built through gin), this computes

  (a) ratings: the global mean, the damped user+item bias baseline (fixed
      damping user 10 / item 25, and damping chosen on a validation split
      carved from train) and a plain biased matrix factorization (NumPy ALS,
      its regularization chosen on the same validation split);
  (b) retrieval: top-K hit rates, K = 1, 5, 10, 50, 100, of the most
      popular movies (counted on the training interactions), of implicit
      ALS (its regularization and confidence chosen on the validation split)
      and of EASE (its regularization chosen likewise), under both
      protocols of the models' corpus hit rates: the whole movie corpus
      (seen items kept), and the movies the user did not rate in training
      (seen items excluded, `train.exclude_seen`; hyper-parameters chosen
      on validation for each protocol);
  (c) trains the experiments through `recsys.training.train` via gin (each in
      its own process) and reads their metrics.json; a retrieval experiment
      is evaluated under both protocols (metrics_seen_kept.json,
      metrics_exclude_seen.json), exported (<model dir>/export), and scored
      again from the SavedModel's top_k_raw signature by raw user id, as a
      client would query it (the "(SavedModel)" rows);

then prints each seed's table and the mean +- sd over the seeds.

Baselines are scored on exactly the rows the trainer evaluates (every
held-out example with `train.eval_steps = None`, else the first
eval_steps * eval_batch_size, in order).

`--holdout validation` reruns everything with the training split in the role
of the data: a seeded random `--validation_fraction` of the training ratings
is held out (written, with the user and item files, as RecBole atomic files
into a temporary folder), the experiments train on the rest and are scored on
it. Tune hyper-parameters that way; report `--holdout test` once.

Usage:
  recsys benchmark movielens --data_dir /path/to/ml-100k --seeds 5
  recsys benchmark movielens --synthetic --seeds 2 --experiments fm
  recsys benchmark movielens --data_dir D --holdout validation \\
      --ranking_bindings 'train.train_steps = 2000'
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Run as a script, this folder is on sys.path, not the checkout's root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.movielens_baselines import (  # noqa: E402
  FIXED_DAMPING,
  IALS_DIM,
  KS,
  MF_DIM,
  choose_damping,
  choose_ease,
  choose_ials,
  choose_mf_reg,
  ease_hit_rates,
  factor_hit_rates,
  fit_bias,
  fit_ease,
  fit_ials,
  fit_mf,
  popularity,
  rmse,
)

# The shipped experiments (recsys/experiments is the repo's experiments/).
_EXPERIMENTS_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"
)
EXPERIMENTS = {
  "ranking": os.path.join(_EXPERIMENTS_DIR, "movielens_ranking.gin"),
  "retrieval": os.path.join(_EXPERIMENTS_DIR, "movielens_retrieval.gin"),
  "fm": os.path.join(_EXPERIMENTS_DIR, "movielens_fm.gin"),
  "retrieval_history": os.path.join(
    _EXPERIMENTS_DIR, "movielens_retrieval_history.gin"
  ),
  # Not "ials": the NumPy baseline's results go by that name.
  "implicit_als": os.path.join(_EXPERIMENTS_DIR, "movielens_ials.gin"),
  "implicit_als_kept": os.path.join(
    _EXPERIMENTS_DIR, "movielens_ials_kept.gin"
  ),
}
KIND = {
  "ranking": "ranking",
  "fm": "ranking",
  "retrieval": "retrieval",
  "retrieval_history": "retrieval",
  "implicit_als": "retrieval",
  "implicit_als_kept": "retrieval",
}
VALIDATION_STEM = "movielens_train"

Arrays = dict[str, np.ndarray]
IALS_LABEL = "iALS (chosen on validation)"
SERVED_SUFFIX = " (SavedModel)"
EASE_LABEL = "EASE (chosen on validation)"
# Retrieval protocols: seen items kept in the ranking, or excluded.
PROTOCOLS = ("kept", "excluded")
# A retrieval run's metrics under each protocol (metrics.json is one of them,
# the run's own `train.exclude_seen`).
PROTOCOL_METRICS = {
  "kept": "metrics_seen_kept.json",
  "excluded": "metrics_exclude_seen.json",
}
# Where a retrieval run's SavedModel goes, inside its model dir.
EXPORT_DIR = "export"


# -- the experiments' data, through gin ----------------------------------------


def base_bindings(data_dir: str, variant: str, seed: int) -> list[str]:
  """Bindings every run gets: data folder and layout, split and run seeds."""
  return [
    f"MOVIELENS_DIR = {data_dir!r}",
    f"MovieLens.variant = {variant!r}",
    f"MovieLens.seed = {seed}",
    f"train.seed = {seed}",
  ]


def validation_bindings(folder: str, fraction: float) -> list[str]:
  """Bindings that point an experiment at a carved validation folder."""
  return [
    f"MOVIELENS_DIR = {folder!r}",
    "MovieLens.variant = 'atomic'",
    f"MovieLens.dataset_name = {VALIDATION_STEM!r}",
    "MovieLens.download = False",
    f"MovieLens.test_fraction = {fraction}",
  ]


def _query(name: str, default: Any = None) -> Any:
  """The parsed gin value of `name` (e.g. "train.eval_steps") or `default`."""
  import gin  # pylint: disable=g-import-not-at-top

  try:
    return gin.query_parameter(name)
  except ValueError:
    return default


def build_source(gin_file: str, bindings: Sequence[str]) -> tuple[Any, int]:
  """The experiment's data source (gin-built, unshuffled); its eval batch size.

  Args:
    gin_file: the experiment file.
    bindings: gin bindings applied after it.

  Returns:
    (source, number of held-out rows the trainer evaluates).
  """
  import gin  # pylint: disable=g-import-not-at-top

  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys import train_settings as settings  # pylint: disable=g-import-not-at-top
  from recsys.run.configured import configured_settings  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  config.parse(
    [gin_file], list(bindings) + ["MovieLens.shuffle = False"], finalize=False
  )
  source = config.value("train.data")
  # The eval batch and steps as the Trainer resolves them.
  configured = configured_settings()
  batch = settings.eval_batch_size(configured)
  steps = configured.eval_steps
  if steps is None:  # the whole split, its last partial batch included
    evaluated = source.test_size
  else:
    evaluated = min((source.test_size // batch) * batch, int(steps) * batch)
  gin.clear_config()
  return source, evaluated


def split_arrays(source: Any, training: bool, batch_size: int = 8192) -> Arrays:
  """user_id, item_id and label of every example of a split, in order."""
  out = collections.defaultdict(list)
  dataset = source.dataset(
    batch_size, training=training, repeat=False, drop_remainder=False
  )
  for features, labels in dataset:
    out["user"].append(features["categorical"]["user_id"].numpy())
    out["item"].append(features["categorical"]["item_id"].numpy())
    out["label"].append(labels.numpy())
  return {k: np.concatenate(v) for k, v in out.items()}


# -- the validation folder -----------------------------------------------------


def _id_vocab(values: Sequence[str]) -> list[str]:
  """The source's documented id map: raw ids sorted (numerically if numeric)."""
  values = sorted(set(values))
  if values and all(v.isdigit() for v in values):
    values.sort(key=int)
  return values


def write_validation_folder(
  source: Any,
  train: Arrays,
  variant: str,
  folder: str,
  dataset_name: str | None = None,
) -> int:
  """Writes the training ratings, users and items as RecBole atomic files.

  Args:
    source: the experiment's ranking source (its `source_folder` is read again).
    train: `split_arrays(source, training=True)` (labels are ratings).
    variant: the layout of `source.source_folder`.
    folder: where `movielens_train.{inter,user,item}` go.
    dataset_name: the atomic file stem of the original data, if any.

  Returns:
    The number of ratings written.

  Raises:
    ValueError: a training row has no matching rating in the files.
  """
  from recsys.data.movielens import files as movielens_files  # pylint: disable=g-import-not-at-top

  raw = movielens_files.read(source.source_folder, variant, dataset_name)
  users = _id_vocab(list(raw.user) + list(raw.users))
  items = _id_vocab(list(raw.item) + list(raw.items))
  user_index = {v: i + 1 for i, v in enumerate(users)}
  item_index = {v: i + 1 for i, v in enumerate(items)}
  rows = collections.defaultdict(list)
  for row, (u, i, r) in enumerate(zip(raw.user, raw.item, raw.rating)):
    rows[(user_index[u], item_index[i], float(r))].append(row)
  chosen = []
  for u, i, r in zip(train["user"], train["item"], train["label"]):
    bucket = rows.get((int(u), int(i), float(r)))
    if not bucket:
      raise ValueError(
        f"training row (user {u}, item {i}, rating {r}) is not in "
        f"{source.source_folder}: the id map differs from {variant}'s."
      )
    chosen.append(bucket.pop())
  chosen.sort()
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, VALIDATION_STEM)
  with open(path + ".inter", "w", encoding="utf-8") as f:
    f.write("user_id:token\titem_id:token\trating:float\ttimestamp:float\n")
    for row in chosen:
      f.write(
        f"{raw.user[row]}\t{raw.item[row]}\t{raw.rating[row]:g}\t{raw.timestamp[row]}\n"
      )
  if raw.users:
    with open(path + ".user", "w", encoding="utf-8") as f:
      f.write(
        "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
      )
      for uid, info in raw.users.items():
        f.write(
          "\t".join(
            [uid, info["age"], info["gender"], info["occupation"], info["zip"]]
          )
          + "\n"
        )
  with open(path + ".item", "w", encoding="utf-8") as f:
    f.write(
      "item_id:token\tgenre:token_seq\tmovie_title:token_seq\t"
      "release_year:token\n"
    )
    for iid, genres in raw.items.items():
      info = raw.item_info.get(iid, {"title": "", "year": ""})
      title = " ".join(info["title"].replace("\t", " ").split())
      f.write(f"{iid}\t{' '.join(genres)}\t{title}\t{info['year']}\n")
  return len(chosen)


def check_same_ids(
  full: Any, carved: Any, train: Arrays, carved_arrays: Sequence[Arrays]
) -> None:
  """Checks the carved source encodes like the full one, with its training rows.

  Args:
    full: the experiment's source.
    carved: the source over the validation folder.
    train: the full source's training rows.
    carved_arrays: the carved source's fit and validation rows.

  Raises:
    ValueError: different feature vocabularies, or different rows.
  """

  def specs(source):
    return [
      (f.name, f.vocabulary_size, f.max_ids) for f in source.feature_specs
    ]

  def rows(arrays: Sequence[Arrays]) -> np.ndarray:
    table = np.stack(
      [
        np.concatenate([a[k] for a in arrays]).astype(np.float64)
        for k in ("user", "item", "label")
      ]
    )
    return table[:, np.lexsort(table[::-1])]

  if specs(full) != specs(carved):
    raise ValueError(
      f"validation folder features {specs(carved)} differ from {specs(full)}"
    )
  if not np.array_equal(rows([train]), rows(carved_arrays)):
    raise ValueError(
      "the validation folder's ratings differ from the training split's."
    )


# -- training the experiments --------------------------------------------------


def train_one(
  gin_file: str, bindings: Sequence[str], model_dir: str
) -> dict[str, Any]:
  """Trains one experiment in this process through `recsys.training.train`."""
  import logging  # pylint: disable=g-import-not-at-top

  logging.basicConfig(
    level=logging.INFO,
    format="%(asctime)s %(name)s %(message)s",
    datefmt="%H:%M:%S",
  )
  from recsys import config  # pylint: disable=g-import-not-at-top
  from recsys.serving.export import export  # pylint: disable=g-import-not-at-top
  from recsys.training import train  # pylint: disable=g-import-not-at-top

  config.parse([gin_file], list(bindings) + ["train.progress_bar = False"])
  trainer = train(model_dir=model_dir, action="build")
  metrics = trainer.train()
  if trainer.run.is_retrieval:  # the same model under both protocols, exported
    with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
      final = json.load(f)  # the run's own evaluation: one of the protocols
    own = "excluded" if final.get("eval/exclude_seen") else "kept"
    if not any("hit_rate" in key for key in final):
      own = None  # no final evaluation: score both protocols here
    for protocol, exclude_seen in (("kept", False), ("excluded", True)):
      if protocol == own:
        scored = {k: v for k, v in final.items() if k.startswith("eval/")}
      else:
        scored = trainer.evaluate(exclude_seen=exclude_seen)
      path = os.path.join(model_dir, PROTOCOL_METRICS[protocol])
      with open(path, "w", encoding="utf-8") as f:
        json.dump(scored, f, indent=2, sort_keys=True)
    export(trainer.run, os.path.join(model_dir, EXPORT_DIR))
  return metrics


def run_experiment(
  name: str, bindings: Sequence[str], model_dir: str
) -> dict[str, Any]:
  """Trains `name` in a child process; its metrics.json plus wall time."""
  command = [
    sys.executable,
    os.path.abspath(__file__),
    "--_train",
    EXPERIMENTS[name],
    "--_model_dir",
    model_dir,
  ]
  for binding in bindings:
    command += ["--_binding", binding]
  start = time.time()
  log_path = os.path.join(model_dir + ".log")
  os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
  with open(log_path, "w", encoding="utf-8") as log:
    code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
  if code:
    with open(log_path, encoding="utf-8") as f:
      tail = f.read()[-3000:]
    raise RuntimeError(
      f"training {name} failed (exit {code}); log {log_path}:\n{tail}"
    )
  with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
    metrics = json.load(f)
  metrics["wall_seconds"] = time.time() - start
  for protocol, name in PROTOCOL_METRICS.items():
    path = os.path.join(model_dir, name)
    if os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        metrics[protocol] = json.load(f)
  return metrics


def served_hit_rates(
  export_dir: str,
  source: Any,
  held_out: Arrays,
  exclude_seen: bool,
  loaded: Any = None,
) -> dict[str, float]:
  """Top-K hit rates scored from an exported SavedModel's "top_k_raw"
  signature: each held-out pair's user sent by its RAW id (as a client
  would), hit at K if the pair's raw item id is among the first K returned.

  Args:
    export_dir: the SavedModel (`recsys.serving.export.export` of a retrieval run
      whose source has raw ids).
    source: the experiment's MovieLens source (its raw-id maps).
    held_out: `user` and `item` ids of the scored pairs.
    exclude_seen: the signature's `exclude_seen` for every query.
    loaded: `tf.saved_model.load(export_dir)` when the caller has it (one
      load for both protocols); loaded here if None.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if loaded is None:
    loaded = tf.saved_model.load(export_dir)
  top_k = loaded.signatures["top_k_raw"]
  parser = source.raw_parser()
  users, index = np.unique(held_out["user"], return_inverse=True)
  raw_users = parser.raw_ids("user_id", tf.constant(users, tf.int64))
  raw_items = parser.raw_ids("item_id", tf.constant(held_out["item"], tf.int64))
  returned = []
  for start in range(0, len(users), 1024):
    batch = raw_users[start : start + 1024]
    out = top_k(
      user_id=batch, exclude_seen=tf.fill(tf.shape(batch), exclude_seen)
    )
    returned.append(out["candidate_raw_ids"].numpy())
  ranked = np.concatenate(returned)[index]  # [pairs, k] raw item ids
  width = ranked.shape[1]
  if width < max(KS):
    raise ValueError(
      f"{export_dir}: top_k_raw returns {width} candidates, fewer than "
      f"the largest cut-off {max(KS)}; export with k >= {max(KS)}."
    )
  found = ranked == raw_items.numpy()[:, None]
  rank = np.where(found.any(1), found.argmax(1), width)
  return {f"top{k}": float((rank < k).mean()) for k in KS}


def model_hit_rates(metrics: dict[str, Any]) -> dict[str, float]:
  """{"top<k>": rate} from metrics.json's `eval/hit_rate/top_<k>_...` keys."""
  out = {}
  for k in KS:
    for key, value in metrics.items():
      if key.startswith("eval/") and f"top_{k}_" in key and "hit_rate" in key:
        out[f"top{k}"] = float(value)
  return out


# -- main ----------------------------------------------------------------------


def main(
  argv: Sequence[str] | None = None, prog: str | None = None
) -> dict[str, Any]:
  """Computes the baselines, trains the experiments, prints the table.

  Args:
    argv: command-line arguments (default: sys.argv[1:]).
    prog: the command's name in usage lines (default: the script's).

  Returns:
    The results (also written to --json when given).
  """
  parser = argparse.ArgumentParser(
    prog=prog,
    description=__doc__.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split("\n", 1)[1],
  )
  parser.add_argument("--data_dir", help="folder with the MovieLens files.")
  parser.add_argument(
    "--synthetic",
    action="store_true",
    help="no real files: generate MovieLens-like ratings with planted "
    "effects in ml-100k's layout (recsys.testing.movielens).",
  )
  parser.add_argument(
    "--variant",
    default="auto",
    choices=("auto", "ml-100k", "ml-1m", "atomic"),
    help="file layout (atomic: RecBole's ml-100k.inter/.user/.item; auto: "
    "detected from the files).",
  )
  parser.add_argument(
    "--seed",
    type=int,
    default=0,
    help="the first split seed (MovieLens.seed) and run seed (train.seed).",
  )
  parser.add_argument(
    "--seeds",
    type=int,
    default=1,
    help="number of split seeds: seed, seed + 1, ... (mean +- sd over them).",
  )
  parser.add_argument(
    "--holdout",
    default="test",
    choices=("test", "validation"),
    help="score on the test split, or on a validation split carved "
    "from train (for tuning).",
  )
  parser.add_argument(
    "--validation_fraction",
    type=float,
    default=0.125,
    help="share of the training ratings held out for validation.",
  )
  parser.add_argument(
    "--experiments",
    nargs="*",
    default=[
      "ranking",
      "fm",
      "retrieval",
      "retrieval_history",
      "implicit_als",
      "implicit_als_kept",
    ],
    choices=sorted(EXPERIMENTS),
    help="experiments to train (none: baselines only).",
  )
  parser.add_argument(
    "--ranking_bindings",
    action="append",
    default=[],
    help="extra gin binding for the ranking run (repeatable).",
  )
  parser.add_argument(
    "--retrieval_bindings",
    action="append",
    default=[],
    help="extra gin binding for the retrieval run (repeatable).",
  )
  parser.add_argument(
    "--model_root",
    default=None,
    help="where the runs' model dirs go (default: a new temporary folder; "
    "a finished run already there is resumed, i.e. only evaluated).",
  )
  parser.add_argument(
    "--json", default=None, help="also write the results here."
  )
  parser.add_argument("--_train", help=argparse.SUPPRESS)
  parser.add_argument("--_model_dir", help=argparse.SUPPRESS)
  parser.add_argument(
    "--_binding", action="append", default=[], help=argparse.SUPPRESS
  )
  args = parser.parse_args(argv)
  if args._train:  # pylint: disable=protected-access
    train_one(args._train, args._binding, args._model_dir)  # pylint: disable=protected-access
    return {}
  if not args.data_dir and not args.synthetic:
    parser.error("--data_dir (or --synthetic) is required")
  import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from recsys.data.movielens import files as movielens_files  # pylint: disable=g-import-not-at-top

  root = args.model_root or tempfile.mkdtemp(prefix="movielens_benchmark_")
  os.makedirs(root, exist_ok=True)
  if args.synthetic:
    from recsys.testing import movielens as movielens_synthetic  # pylint: disable=g-import-not-at-top

    args.data_dir = movielens_synthetic.write_ml100k_like(
      os.path.join(root, "synthetic_ml-100k")
    )
    args.variant = "ml-100k"
  if args.variant == "auto":
    args.variant = movielens_files.detect_variant(args.data_dir)
    if args.variant is None:
      parser.error(
        f"no MovieLens files in {args.data_dir!r} (u.data, ratings.dat or "
        "<name>.inter); pass --variant or --synthetic"
      )
  per_seed = []
  for seed in range(args.seed, args.seed + args.seeds):
    results = run_seed(args, seed, root)
    print_table(results, flush=True)
    per_seed.append(results)
    with open(os.path.join(root, "results.json"), "w", encoding="utf-8") as f:
      json.dump(per_seed, f, indent=2, sort_keys=True)  # so far
  summary = summarize(per_seed)
  print_summary(summary, args)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(
        {"seeds": per_seed, "summary": summary}, f, indent=2, sort_keys=True
      )
  return {"seeds": per_seed, "summary": summary}


def run_seed(args: argparse.Namespace, seed: int, root: str) -> dict[str, Any]:
  """Baselines and experiments on split seed `seed`; returns the results."""

  bindings = base_bindings(os.path.abspath(args.data_dir), args.variant, seed)
  results: dict[str, Any] = {
    "holdout": args.holdout,
    "seed": seed,
    "variant": args.variant,
    "data_dir": args.data_dir,
  }

  # The experiments' test split, and a validation split carved from its train.
  t0 = time.time()
  rank_file, ret_file = EXPERIMENTS["ranking"], EXPERIMENTS["retrieval"]
  full, evaluated = build_source(rank_file, bindings)
  train, test = split_arrays(full, True), split_arrays(full, False)
  folder = os.path.join(root, f"validation_data_seed{seed}")
  write_validation_folder(
    full, train, args.variant, folder, _dataset_name(rank_file, bindings)
  )
  carve = validation_bindings(folder, args.validation_fraction)
  carved, carved_evaluated = build_source(rank_file, bindings + carve)
  fit, valid = split_arrays(carved, True), split_arrays(carved, False)
  check_same_ids(full, carved, train, [fit, valid])
  du, di, valid_rmse = choose_damping(fit, valid)
  mf_reg, mf_valid_rmse = choose_mf_reg(fit, valid)
  results["split"] = {
    "split": full.split,
    "test_fraction": _query_file(
      rank_file, bindings, "MovieLens.test_fraction"
    ),
    "train": full.train_size,
    "test": full.test_size,
    "validation_fit": carved.train_size,
    "validation": carved.test_size,
  }
  results["damping_chosen_on_validation"] = {
    "user": du,
    "item": di,
    "validation_rmse": valid_rmse,
  }

  if args.holdout == "validation":
    fit_rows, eval_rows, n_eval, run_bindings = (
      fit,
      valid,
      carved_evaluated,
      bindings + carve,
    )
  else:
    fit_rows, eval_rows, n_eval, run_bindings = train, test, evaluated, bindings
  eval_rows = {k: v[:n_eval] for k, v in eval_rows.items()}
  results["ranking_rows_scored"] = n_eval
  results["global_mean_rmse"] = rmse(
    np.full(n_eval, fit_rows["label"].mean()), eval_rows["label"]
  )
  results["bias_fixed"] = {
    "user_damping": FIXED_DAMPING[0],
    "item_damping": FIXED_DAMPING[1],
    "rmse": rmse(
      fit_bias(fit_rows, *FIXED_DAMPING)(eval_rows["user"], eval_rows["item"]),
      eval_rows["label"],
    ),
  }
  results["bias_tuned"] = {
    "user_damping": du,
    "item_damping": di,
    "rmse": rmse(
      fit_bias(fit_rows, du, di)(eval_rows["user"], eval_rows["item"]),
      eval_rows["label"],
    ),
  }

  results["mf"] = {
    "reg": mf_reg,
    "validation_rmse": mf_valid_rmse,
    "rmse": rmse(
      fit_mf(fit_rows, reg=mf_reg)(eval_rows["user"], eval_rows["item"]),
      eval_rows["label"],
    ),
  }

  # Retrieval: the experiment's interactions (its min_rating), same split.
  ret_source, ret_evaluated = build_source(ret_file, run_bindings)
  ret_train, ret_test = (
    split_arrays(ret_source, True),
    split_arrays(ret_source, False),
  )
  results["retrieval_rows_scored"] = ret_evaluated
  results["retrieval_min_rating"] = _query_file(
    ret_file, run_bindings, "MovieLens.min_rating", 0.0
  )
  results.update(
    _retrieval_baselines(
      ret_file,
      bindings + carve,
      ret_source,
      ret_train,
      {k: v[:ret_evaluated] for k, v in ret_test.items()},
    )
  )
  results["baseline_seconds"] = time.time() - t0

  extra = {
    "ranking": args.ranking_bindings,
    "retrieval": args.retrieval_bindings,
  }
  for name in args.experiments:
    model_dir = os.path.join(root, f"{name}_{args.holdout}_seed{seed}")
    more = extra[KIND[name]]
    metrics = run_experiment(name, run_bindings + more, model_dir)
    results[name] = {
      "metrics": metrics,
      "model_dir": model_dir,
      "bindings": more,
    }
    if KIND[name] == "retrieval":  # the exported SavedModel, by raw user id
      import tensorflow as tf  # pylint: disable=g-import-not-at-top

      held_out = {k: v[:ret_evaluated] for k, v in ret_test.items()}
      export_dir = os.path.join(model_dir, EXPORT_DIR)
      loaded = tf.saved_model.load(export_dir)  # once for both protocols
      results[name]["served"] = {
        protocol: served_hit_rates(
          export_dir,
          ret_source,
          held_out,
          exclude_seen=protocol == "excluded",
          loaded=loaded,
        )
        for protocol in PROTOCOLS
      }
  return results


def seen_exclusions(train: Arrays, held_out: Arrays, num_users: int) -> Any:
  """Each held-out pair's user's training items (never its own item), for
  the "seen items excluded" protocol: `SeenItems`, as evaluation uses."""
  from recsys.models.retrieval.seen_items import SeenItems  # noqa: PLC0415 (imports TF)

  seen = SeenItems.from_pairs(train["user"], train["item"], num_users + 1)
  return seen.lookup(held_out["user"], held_out["item"])


def _retrieval_baselines(
  ret_file: str,
  carved_bindings: Sequence[str],
  source: Any,
  train: Arrays,
  held_out: Arrays,
) -> dict[str, Any]:
  """Popularity, iALS and EASE under both protocols; iALS's (reg, alpha)
  and EASE's reg chosen on the retrieval experiment's validation split
  carved from train, for each protocol, then fit on `train` and scored on
  `held_out`."""
  carved, _ = build_source(ret_file, carved_bindings)
  fit, valid = split_arrays(carved, True), split_arrays(carved, False)
  users, items = source.num_users, source.num_items
  out: dict[str, Any] = {}
  # The grid searches' fits on `fit`, shared by both protocols (only their
  # scoring differs).
  ials_fitted: dict = {}
  ease_fitted: dict = {}
  for protocol in PROTOCOLS:
    suffix = "" if protocol == "kept" else "_excluded"
    valid_seen = test_seen = None
    if protocol == "excluded":
      valid_seen = seen_exclusions(fit, valid, users)
      test_seen = seen_exclusions(train, held_out, users)
    out["popularity" + suffix] = popularity(
      train["item"], held_out["item"], test_seen
    )
    reg, alpha, nu, valid_rates = choose_ials(
      fit, valid, users, items, valid_seen, ials_fitted
    )
    start = time.time()  # the chosen point's fit and scoring, not the search
    p, q = fit_ials(train, users, items, reg=reg, alpha=alpha, reg_exponent=nu)
    out["ials" + suffix] = {
      "reg": reg,
      "alpha": alpha,
      "reg_exponent": nu,
      "validation": valid_rates,
      "rates": factor_hit_rates(p, q, held_out, items, exclusions=test_seen),
      "seconds": time.time() - start,
    }
    reg, valid_rates = choose_ease(
      fit, valid, users, items, valid_seen, ease_fitted
    )
    start = time.time()
    weights = fit_ease(train, users, items, reg)
    out["ease" + suffix] = {
      "reg": reg,
      "validation": valid_rates,
      "rates": ease_hit_rates(
        weights, train, held_out, users, items, exclusions=test_seen
      ),
      "seconds": time.time() - start,
    }
  return out


def _query_file(
  gin_file: str, bindings: Sequence[str], name: str, default: Any = None
) -> Any:
  """The value of `name` after parsing `gin_file` with `bindings`."""
  import gin  # pylint: disable=g-import-not-at-top

  from recsys import config  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  config.parse([gin_file], bindings, finalize=False)
  value = _query(name, default)
  gin.clear_config()
  return value


def _dataset_name(gin_file: str, bindings: Sequence[str]) -> str | None:
  """The experiment's MovieLens.dataset_name (atomic file stem), if bound."""
  return _query_file(gin_file, bindings, "MovieLens.dataset_name")


def _ranking_rows(results: dict[str, Any]) -> dict[str, float]:
  rows = {
    "global mean": results["global_mean_rmse"],
    "damped bias (user 10, item 25)": results["bias_fixed"]["rmse"],
    "damped bias (damping chosen on validation)": results["bias_tuned"]["rmse"],
    "plain biased MF (ALS, reg chosen on validation)": results["mf"]["rmse"],
  }
  for name in EXPERIMENTS:
    if KIND[name] == "ranking" and name in results:
      rows[os.path.basename(EXPERIMENTS[name])] = results[name]["metrics"][
        "eval/rmse"
      ]
  return rows


def _retrieval_rows(
  results: dict[str, Any], protocol: str = "kept"
) -> dict[str, dict[str, float]]:
  suffix = "" if protocol == "kept" else "_excluded"
  rows = {
    "most popular": results["popularity" + suffix],
    IALS_LABEL: results["ials" + suffix]["rates"],
    EASE_LABEL: results["ease" + suffix]["rates"],
  }
  for name in EXPERIMENTS:
    if KIND[name] == "retrieval" and name in results:
      label = os.path.basename(EXPERIMENTS[name])
      rows[label] = model_hit_rates(results[name]["metrics"].get(protocol, {}))
      if "served" in results[name]:
        rows[label + SERVED_SUFFIX] = results[name]["served"][protocol]
  return rows


def summarize(per_seed: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Mean and sd (ddof 1; 0 for one seed) over seeds of every row."""

  def stats(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, np.float64)
    return {
      "mean": float(v.mean()),
      "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
    }

  ranking: dict[str, list[float]] = collections.defaultdict(list)
  retrieval: dict[str, dict[str, dict[str, list[float]]]] = {
    protocol: collections.defaultdict(lambda: collections.defaultdict(list))
    for protocol in PROTOCOLS
  }
  seconds: dict[str, list[float]] = collections.defaultdict(list)
  for results in per_seed:
    for label, value in _ranking_rows(results).items():
      ranking[label].append(value)
    for protocol in PROTOCOLS:
      for label, rates in _retrieval_rows(results, protocol).items():
        for k, value in rates.items():
          retrieval[protocol][label][k].append(value)
    for name in EXPERIMENTS:
      if name in results:
        seconds[os.path.basename(EXPERIMENTS[name])].append(
          results[name]["metrics"]["elapsed_seconds"]
        )
    for label, key in ((IALS_LABEL, "ials"), (EASE_LABEL, "ease")):
      if "seconds" in results[key]:  # fit + score, seen items kept
        seconds[label].append(results[key]["seconds"])
  return {
    "seeds": [r["seed"] for r in per_seed],
    "holdout": per_seed[0]["holdout"],
    "ranking_rmse": {k: stats(v) for k, v in ranking.items()},
    **{
      "retrieval_hit_rate" + ("" if protocol == "kept" else "_excluded"): {
        label: {k: stats(v) for k, v in rates.items()}
        for label, rates in retrieval[protocol].items()
      }
      for protocol in PROTOCOLS
    },
    "train_eval_seconds": {k: stats(v) for k, v in seconds.items()},
  }


def print_summary(summary: dict[str, Any], args: argparse.Namespace) -> None:
  """Prints mean +- sd over the seeds, models next to baselines."""
  seeds = summary["seeds"]
  print(
    f"\nMovieLens {args.variant} ({args.data_dir}): mean +- sd over "
    f"{len(seeds)} random 80/20 split seed(s) {seeds}, scored on the "
    f"{summary['holdout']} split."
  )
  secs = summary["train_eval_seconds"]

  def note(label: str) -> str:
    if label not in secs:
      return ""
    t = secs[label]
    what = "fit+score" if label in (IALS_LABEL, EASE_LABEL) else "train+eval"
    return f"  ({what} {t['mean']:.1f} +- {t['sd']:.1f} s per seed)"

  print("\nRanking RMSE (lower is better)")
  for label, st in summary["ranking_rmse"].items():
    print(f"  {label:<50} {st['mean']:.4f} +- {st['sd']:.4f}{note(label)}")
  titles = {
    "retrieval_hit_rate": "over the whole corpus (seen items kept)",
    "retrieval_hit_rate_excluded": "over the movies each user did not rate "
    "in training (seen items excluded)",
  }
  for key, title in titles.items():
    print(f"\nRetrieval hit rate {title}")
    print(f"  {'':<40}" + "".join(f"{'top' + str(k):>17}" for k in KS))
    for label, rates in summary[key].items():
      cells = "".join(
        f"{rates[f'top{k}']['mean']:>9.4f} +-{rates[f'top{k}']['sd']:.4f}"
        if f"top{k}" in rates
        else f"{'':>17}"
        for k in KS
      )
      print(f"  {label:<40}{cells}{note(label)}")
  print()


def print_table(results: dict[str, Any], flush: bool = False) -> None:
  """Prints the baselines and the experiments side by side."""
  s = results["split"]
  holdout = results["holdout"]
  print(
    f"\nMovieLens {results['variant']} ({results['data_dir']}): "
    f"{s['split']} split, test_fraction {s['test_fraction']}, seed "
    f"{results['seed']}: {s['train']} train / {s['test']} test ratings; "
    f"validation carved from train: {s['validation_fit']} fit / "
    f"{s['validation']} validation."
  )
  print(f"Scored on the {holdout} split.\n")
  print(
    f"Ranking: RMSE on {results['ranking_rows_scored']} {holdout} ratings "
    "(lower is better)"
  )
  rows = [
    ("global mean", results["global_mean_rmse"], ""),
    (
      f"damped bias (user {FIXED_DAMPING[0]:g}, item {FIXED_DAMPING[1]:g})",
      results["bias_fixed"]["rmse"],
      "",
    ),
    (
      f"damped bias (user {results['bias_tuned']['user_damping']:g}, item "
      f"{results['bias_tuned']['item_damping']:g}; chosen on validation)",
      results["bias_tuned"]["rmse"],
      "",
    ),
  ]
  for name in [n for n in EXPERIMENTS if KIND[n] == "ranking"]:
    if name not in results:
      continue
    m = results[name]["metrics"]
    rows.append(
      (
        os.path.basename(EXPERIMENTS[name]),
        m["eval/rmse"],
        f"train+eval {m['elapsed_seconds']:.0f} s, "
        f"process {m['wall_seconds']:.0f} s",
      )
    )
  rows.insert(
    3,
    (
      f"plain biased MF (ALS, dim {MF_DIM}, reg {results['mf']['reg']:g} "
      "chosen on validation)",
      results["mf"]["rmse"],
      "",
    ),
  )
  for label, value, note in rows:
    print(f"  {label:<58} {value:.4f}  {note}")
  for protocol in PROTOCOLS:
    _print_retrieval(results, protocol)
  print(flush=flush)


def _print_retrieval(results: dict[str, Any], protocol: str) -> None:
  """One seed's retrieval rows under one protocol (seen items kept or not)."""
  suffix = "" if protocol == "kept" else "_excluded"
  corpus = (
    "whole corpus, seen items kept"
    if protocol == "kept"
    else "seen items excluded"
  )
  print(
    f"\nRetrieval: top-K hit rate on {results['retrieval_rows_scored']} "
    f"{results['holdout']} interactions (ratings >= "
    f"{results['retrieval_min_rating']:g}; {corpus})"
  )
  print(f"  {'':<24}" + "".join(f"{'top' + str(k):>9}" for k in KS))
  ials, ease = results["ials" + suffix], results["ease" + suffix]
  lines = [
    ("most popular", results["popularity" + suffix], ""),
    (
      "iALS",
      ials["rates"],
      f"dim {IALS_DIM}, reg {ials['reg']:g}, alpha {ials['alpha']:g}, "
      f"nu {ials.get('reg_exponent', 0.0):g} chosen on validation; fit+score "
      f"{ials.get('seconds', float('nan')):.1f} s",
    ),
    (
      "EASE",
      ease["rates"],
      f"reg {ease['reg']:g} chosen on validation; fit+score "
      f"{ease.get('seconds', float('nan')):.1f} s",
    ),
  ]
  for name in [n for n in EXPERIMENTS if KIND[n] == "retrieval"]:
    if name not in results:
      continue
    m = results[name]["metrics"]
    label = os.path.basename(EXPERIMENTS[name])[:-4]
    lines.append(
      (
        label,
        model_hit_rates(m.get(protocol, {})),
        f"train+eval {m['elapsed_seconds']:.0f} s, "
        f"process {m['wall_seconds']:.0f} s",
      )
    )
    if "served" in results[name]:
      lines.append(
        (
          "  " + SERVED_SUFFIX.strip(),
          results[name]["served"][protocol],
          "top_k_raw by raw user id",
        )
      )
  for label, rates, note in lines:
    print(
      f"  {label:<24}"
      + "".join(f"{rates.get(f'top{k}', float('nan')):>9.4f}" for k in KS)
      + f"  {note}"
    )


if __name__ == "__main__":
  main()
