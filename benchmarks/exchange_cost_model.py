"""Projected exchange bytes and time per step for many replicas (on paper).

The byte counts are the planner's (`backends.placement.exchange_bytes`,
checked against the traced step's collective operands on 2 and 4 CPU
replicas by tests/backends/test_exchange.py); the times are projections
from published link bandwidths, not measurements:

* TPU v5e pod slice (2D torus, 256 chips): 400 GB/s bidirectional ICI per
  chip (200 GB/s in), 1.6 TB/s bisection for the full pod (scaled by
  sqrt(R / 256) for a smaller square slice);
* hosts on a data-center network: 2 x 100 Gb/s NICs per host (v5e's), one
  replica per host here.

An all-gather delivers every replica's ids, rows and gradients to every
replica: bound by each replica's inbound link (`(R - 1) U (8 + 3 row) /
link`, the rows' all-reduce counted as a ring's). An all-to-all sends each
byte once: bound by the inbound link or, on a torus, by the bisection that
about half of all bytes cross (`R x inbound / 2 / bisection`); on a
switched network by each replica's own link. Latency, congestion and
the rows' lookup are left out: the projection is the bandwidth floor.

With `--measured FILE` (`benchmarks/weak_scaling.py --json FILE`) it
projects from measured bytes instead: each model's collective bytes per
replica and step at its largest measured replica count are read as an
all-to-all of `U` ids per replica (the `U` whose planner figure equals
them, rows of `--row_bytes`; the dense gradients' and Gramians'
all-reduces, constant per replica, ride along), and that `U` is carried
to 64 and 256 replicas by the planner's formula, then timed as above.

    python benchmarks/exchange_cost_model.py [--measured FILE]
"""

import argparse
import json
import math

from backends import placement

ICI_IN = 200e9  # bytes/s into one v5e chip (400 GB/s bidirectional)
POD_BISECTION = 1.6e12  # bytes/s, a 256-chip v5e pod
DCN = 2 * 100e9 / 8  # bytes/s per host: 2 x 100 Gb/s


def _models():
  """(name, per table: (ids per replica per step, row bytes))."""
  batch = 1024  # examples per replica per step
  dlrm = [(batch * m, 16 * 4) for m in (1, 1, 1, 1, 1, 1, 3, 5)]
  # A 2 x 10^8 x 128 float32 table (102 GB; Adagrad's slot doubles it),
  # 20 ids per example.
  big = [(batch * 20, 128 * 4)]
  return [
    ("default DLRM, 8 tables x 16 dims, 1,024 examples/replica", dlrm),
    ("one 102 GB table (2e8 x 128), 20 ids/example, 1,024 ex/replica", big),
  ]


def _bisection(replicas: int) -> float:
  return POD_BISECTION * math.sqrt(replicas / 256)


def _planned_table() -> None:
  print(
    "| model | R | all-gather | all-to-all | ratio | ICI all-gather "
    "| ICI all-to-all | DCN all-gather | DCN all-to-all |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for name, tables in _models():
    for replicas in (8, 64, 256):
      gather = sum(
        placement.exchange_bytes("all_gather", ids, replicas, row)
        for ids, row in tables
      )
      a2a = sum(
        placement.exchange_bytes("all_to_all", ids, replicas, row)
        for ids, row in tables
      )
      # What one replica receives from the others: all-gather: every other
      # replica's ids and gradients, and a ring all-reduce of R x U rows
      # (2 (R - 1) / R of it); all-to-all: its buckets from the others.
      inbound_gather = sum(
        (replicas - 1) * ids * (8 + 3 * row) for ids, row in tables
      )
      inbound_a2a = a2a * (replicas - 1) / replicas
      times = (
        inbound_gather / ICI_IN,
        max(
          inbound_a2a / ICI_IN,
          replicas * inbound_a2a / 2 / _bisection(replicas),
        ),
        inbound_gather / DCN,
        inbound_a2a / DCN,
      )
      print(
        f"| {name} | {replicas} | {placement.human_bytes(gather)} "
        f"| {placement.human_bytes(a2a)} | {gather / a2a:.1f} | "
        + " | ".join(f"{t * 1e3:.2f} ms" for t in times)
        + " |"
      )


def _a2a_times(replicas: int, sent: float) -> tuple[float, float]:
  """(ICI, DCN) seconds of an all-to-all whose replicas each put `sent`
  bytes in (what one receives: all but its own bucket)."""
  inbound = sent * (replicas - 1) / replicas
  ici = max(inbound / ICI_IN, replicas * inbound / 2 / _bisection(replicas))
  return ici, inbound / DCN


def ids_for(sent: int, replicas: int, row_bytes: int) -> int:
  """The ids per replica `U` whose all-to-all over `replicas` puts `sent`
  bytes into collectives (`placement.exchange_bytes`, which grows with U)."""
  low, high = 1, 1
  while (
    placement.exchange_bytes("all_to_all", high, replicas, row_bytes) < sent
  ):
    high *= 2
  while low < high:
    mid = (low + high) // 2
    if placement.exchange_bytes("all_to_all", mid, replicas, row_bytes) < sent:
      low = mid + 1
    else:
      high = mid
  return low


def _measured(path: str, row_bytes: int, targets=(64, 256)) -> None:
  with open(path, encoding="utf-8") as f:
    measured = json.load(f)
  print(
    f"Projected from the bytes measured on {measured['cpu']} "
    f"(rows of {row_bytes} bytes):"
  )
  print(
    "| model | measured R | measured bytes | R | projected bytes "
    "| ICI all-to-all | DCN all-to-all |"
  )
  print("|---|---|---|---|---|---|---|")
  by_model: dict[str, dict] = {}
  for row in measured["rows"]:  # each model's most replicas
    best = by_model.get(row["model"])
    if best is None or row["replicas"] > best["replicas"]:
      by_model[row["model"]] = row
  for model, row in by_model.items():
    replicas, sent = row["replicas"], row["collective_bytes"]
    if replicas < 2 or not sent:
      continue
    ids = ids_for(sent, replicas, row_bytes)
    for target in targets:
      bytes_at = placement.exchange_bytes("all_to_all", ids, target, row_bytes)
      ici, dcn = _a2a_times(target, bytes_at)
      print(
        f"| {model} | {replicas} | {placement.human_bytes(sent)} | {target} "
        f"| {placement.human_bytes(bytes_at)} | {ici * 1e3:.2f} ms "
        f"| {dcn * 1e3:.2f} ms |"
      )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__.split("\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split("\n", 2)[2],
  )
  parser.add_argument(
    "--measured", help="a `benchmarks/weak_scaling.py --json` file"
  )
  parser.add_argument(
    "--row_bytes", type=int, default=16 * 4, help="bytes of a row (16 x f32)"
  )
  args = parser.parse_args(argv)
  if args.measured:
    _measured(args.measured, args.row_bytes)
  else:
    _planned_table()


if __name__ == "__main__":
  main()
