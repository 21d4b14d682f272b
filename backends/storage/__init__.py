"""Where a table's rows and optimizer slots live: one storage per table.

A backend that owns its tables (`backends.composed`) keeps each table in one
of these storages, chosen per table; the engines (`backends.engines`) run
the same step against any of them:

  replicated          a full copy on every replica (`replicated.Replicated`):
                      TF's `TPUEmbeddingV0` design, the `tensorcore` default.
  row_sharded         each replica owns a slice of the rows and their slots
                      (`replica_sharded.ReplicaSharded`); a step exchanges
                      ids, rows and gradients through the replicas'
                      collectives, and each owner alone updates its rows.
  parameter_servers   row ranges on the parameter servers of a
                      `ParameterServerStrategy` (`parameter_servers.
                      ParameterServers`), the `sharded` backend.

Whatever the storage, a checkpoint holds TF's full `<table>` and
`<table>.S<slot>` tensors, so it moves between storages, backends and
`TPUEmbeddingForServing`.
"""

from backends.placement import PLACEMENTS
from backends.storage.base import TableStorage, Tracker

__all__ = ["PLACEMENTS", "TableStorage", "Tracker"]
