"""`python -m backends.tensorcore.kernels`: builds the fused CPU kernels (see
__init__)."""

import sys

from backends.tensorcore import kernels

sys.exit(kernels.main())
