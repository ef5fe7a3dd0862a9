"""``python -m sapiens_seg.ray``: see :func:`sapiens_seg.ray.main`."""

import sys

from sapiens_seg.ray import main

sys.exit(main())
