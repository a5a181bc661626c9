"""``python -m zspeed``: the same as the ``zspeed`` console script."""
import sys

from .cli import main

sys.exit(main())
