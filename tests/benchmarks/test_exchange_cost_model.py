"""The pod projection's inversion: measured bytes back to ids per replica."""

import pytest

from backends import placement
from benchmarks import exchange_cost_model


@pytest.mark.parametrize("replicas", [2, 4, 8])
@pytest.mark.parametrize("ids", [1, 37, 4096, 250_000])
def test_ids_for_inverts_the_planners_all_to_all_bytes(ids, replicas):
  sent = placement.exchange_bytes("all_to_all", ids, replicas, 64)
  found = exchange_cost_model.ids_for(sent, replicas, 64)
  # The fewest ids that put at least `sent` bytes in: `ids` or fewer with
  # the same owner capacity.
  assert placement.exchange_bytes("all_to_all", found, replicas, 64) == sent
  assert found <= ids
  assert placement.exchange_bytes("all_to_all", found - 1, replicas, 64) < sent
