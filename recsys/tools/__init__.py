"""Command-line tools outside `recsys` training (e.g. `tpu_smoke`)."""
