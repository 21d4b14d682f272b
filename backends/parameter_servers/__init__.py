"""The parameter-server family: tables split in row ranges over the
servers of a `ParameterServerStrategy` (`backend.ParameterServerEmbedding`,
registered as `parameter_servers`; `sharded`, its old name, still
works with a warning), and their storage (`storage.ParameterServers`).

It composes the TensorCore family's machinery
(`backends.tensorcore.composed`) with its own storage. This file imports
nothing.
"""
