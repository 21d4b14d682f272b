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

    python benchmarks/exchange_cost_model.py
"""

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


def main() -> None:
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


if __name__ == "__main__":
  main()
