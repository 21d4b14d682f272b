"""The TensorCore family: backends that own their tables (a storage per
table x an engine per step, `composed.ComposedBackend`), the engines
(`engines/`), the fused CPU kernels (`kernels/`) and `tensorcore`
itself (`backend.TensorCoreEmbedding`). The storages are shared
(`backends.storage`); the parameter-server family composes the same
machinery with its own storage.

Nothing here is imported by the floor (`backends/*.py`); only the
registry names the backend. This file imports nothing, so importing one
module of the family loads no other.
"""
