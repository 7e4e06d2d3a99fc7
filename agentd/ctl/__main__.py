"""``python -m agentd.ctl``: llmgw from a checkout."""

import sys

from agentd.ctl import main

sys.exit(main())
