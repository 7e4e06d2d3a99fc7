"""``python -m fleet.devstack``: what `make run` runs once the database is migrated."""

import sys

from fleet.devstack.stack import main

sys.exit(main())
