"""docs/operations.md's XID table is agentd/xid.py's, row for row: the table operators read
is the one the control plane acts on."""

import re
from pathlib import Path

from agentd.xid import XIDS

ROOT = Path(__file__).resolve().parents[2]


def test_the_xid_table_in_the_docs_is_agentd_xids():
    docs = (ROOT / "docs" / "operations.md").read_text()
    section = docs[docs.index("## GPU faults and notices") :]
    rows = re.findall(r"^\| (\d+) \| (.+?) \| `(\w+)` \|$", section, re.M)

    assert rows == [(str(x.number), x.meaning, str(x.action)) for x in XIDS.values()]
