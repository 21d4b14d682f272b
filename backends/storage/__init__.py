"""Where a table's rows live, and what every storage of them shares.

One storage per table, for the backends that own their tables
(`backends.tensorcore.composed`); the engines run the same step against any:

  replicated          a full copy on every replica (`replicated.Replicated`):
                      TF's `TPUEmbeddingV0` design, the `tensorcore` default.
  row_sharded         each replica owns a slice of the rows and their slots
                      (`row_sharded.RowSharded`); a step exchanges ids, rows
                      and gradients through the replicas' collectives
                      (`exchange`, rows laid out by `row_layout`), and each
                      owner alone updates its rows.

The parameter-server family keeps its tables in its own storage
(`backends.parameter_servers.storage`), on this package's `base`.

And the concerns of a table's rows whatever the storage: narrow dtypes
(`narrow`), the initial values drawn row by row (`row_init`, with the float64
math of `exact_math`), and row-sharded tables in checkpoints, written and
read by row slices (`row_sharded_checkpoint`). "Row-sharded" means rows
split over the replicas, and only that: tables split over parameter servers
are the `parameter_servers` backend's.

Whatever the storage, a checkpoint holds TF's full `<table>` and
`<table>.S<slot>` tensors, so it moves between storages, backends and
`TPUEmbeddingForServing`. This file imports nothing: the floor
(`backends.optimizers`, `backends.checkpoint`) imports single modules of it
without loading the storages (`base` imports the optimizers).
"""
