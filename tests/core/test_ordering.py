"""tests/ordering.py: each xdist worker's first share mixes waiting and in-process tests,
and no test is lost, doubled, or a waiting module split."""

from dataclasses import dataclass, field
from pathlib import Path

from tests.ordering import TESTS, _third_sizes, interleave


@dataclass(eq=False)
class Item:
    path: Path
    n: int
    marks: set = field(default_factory=set)

    def get_closest_marker(self, name):
        return name if name in self.marks else None


def _collection() -> list[Item]:
    items = []
    for m in range(30):  # in-process modules first, as collection orders them
        items += [Item(TESTS / "api" / f"test_unit_{m}.py", i) for i in range(20)]
    for m in range(9):
        items += [Item(TESTS / "e2e" / f"test_scenario_{m}.py", i) for i in range(2)]
    items += [Item(TESTS / "gateway" / "test_live.py", i, {"live"}) for i in range(6)]
    return items


def test_each_worker_begins_with_a_mix_and_every_test_is_kept_once():
    items = _collection()
    ordered = interleave(items, 3)

    assert sorted(map(id, ordered)) == sorted(map(id, items))
    start = 0
    for size in _third_sizes(len(items), 3):
        third = ordered[start : start + size]
        start += size
        e2e = [i for i, t in enumerate(third) if "e2e" in t.path.parts]
        # every worker waits on some scenarios, and none only at its share's end
        assert e2e and e2e[0] < len(third) // 2, [t.path.name for t in third]
        # what a finished worker steals from the back is in-process
        assert third[-1].path.parent.name == "api"
    # a waiting module's tests stay together, in their order
    for name in {t.path for t in items if t.path.parent.name != "api"}:
        where = [i for i, t in enumerate(ordered) if t.path == name]
        assert where == list(range(where[0], where[0] + len(where)))
        assert [ordered[i].n for i in where] == sorted(ordered[i].n for i in where)
