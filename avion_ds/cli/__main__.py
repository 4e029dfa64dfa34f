"""`python -m avion_ds.cli`: the `avion-ds` entry."""

import sys

from avion_ds.cli import main

sys.exit(main())
