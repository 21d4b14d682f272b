"""Fixture writers for tests and demos: files in a real layout, seeded.

Nothing in the library imports this package; tests, `recsys benchmark
movielens --synthetic` and the docs' examples do.
"""
