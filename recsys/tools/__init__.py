"""Command-line tools that are not part of `recsys` training (e.g. `tpu_smoke`)."""
