"""`python -m backends.kernels`: builds the fused CPU kernels (see __init__)."""

import sys

from backends import kernels

sys.exit(kernels.main())
