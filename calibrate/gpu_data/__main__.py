"""`python -m calibrate.gpu_data DATASET --out OUT` (see calibrate.gpu_data.export)."""

import sys

from calibrate.gpu_data.export import main

sys.exit(main())
