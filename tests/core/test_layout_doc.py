"""docs/layout.md is the newcomer's map: every path it names exists, and every package
in the tree is on it. A move that forgets the map fails here, naming what is off."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs" / "layout.md"
# Where the map's bare file names (`passes`, `serve.py` beside its package) live.
TREES = ("agentd", "fleet", "llmgw_site", "tests", "templates", "docs", "bench")
# Packages whose name says what they hold, left off the map.
UNNAMED = {"fleet", "fleet/migrations", "fleet/management/commands"}


def _paths(text: str) -> set[str]:
    """Every backticked path the map names: one with a slash, or a file name."""
    tokens = re.findall(r"`([^`\s]+)`", text)
    return {
        t
        for t in tokens
        if ("/" in t or re.fullmatch(r"[\w-]+\.(py|md|txt|yaml|json|html)", t))
        and not t.startswith(("http", "-", "/", "var/"))  # var/: made at run time
    }


def _exists(path: str) -> bool:
    if "*" in path:
        return bool(list(ROOT.glob(path)))
    if "/" in path:
        # The table of homes inside fleet/services/ names its paths from there.
        return any((base / path.rstrip("/")).exists() for base in (ROOT, ROOT / "fleet/services"))
    return any(next((ROOT / tree).rglob(path), None) for tree in TREES)


def test_every_path_the_layout_names_exists():
    missing = sorted(p for p in _paths(LAYOUT.read_text()) if not _exists(p))
    assert missing == [], f"docs/layout.md names paths that are not in the tree: {missing}"


def test_every_package_is_on_the_layout():
    named = set()
    for p in _paths(LAYOUT.read_text()):
        named |= {p.rstrip("/"), f"fleet/services/{p.rstrip('/')}"}
    packages = sorted(
        str(init.parent.relative_to(ROOT))
        for top in ("agentd", "fleet", "llmgw_site")
        for init in (ROOT / top).rglob("__init__.py")
    )
    absent = [p for p in packages if p not in UNNAMED and p not in named]
    assert absent == [], f"packages docs/layout.md does not name: {absent}"
