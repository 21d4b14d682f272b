"""The backends that wrap a TF mid-level API object: TPUEmbedding (V1/V2,
`tpu_embedding`), TPUEmbeddingV0 (`tpu_embedding_v0`) and
TPUEmbeddingForServing (`serving`, the export's lookup), and what they
share (`common`). This file imports nothing.
"""
