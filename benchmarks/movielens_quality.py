"""MovieLens quality: baselines vs. the shipped experiments over split seeds.

The logic lives in `recsys.tools.movielens_benchmark` (also
`recsys benchmark movielens`); this script is kept for its old command line:

  python benchmarks/movielens_quality.py --data_dir /path/to/ml-100k --seeds 5
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recsys.tools import movielens_benchmark  # noqa: E402

if __name__ == "__main__":
  movielens_benchmark.main()
