"""The operators' tables, printed the same by ``manage.py nodes`` and ``llmgw nodes``.

Both print the node table from the same rows (``fleet.services.nodes.node_rows``,
served as JSON by ``GET /api/v1/nodes/table/``); the columns are defined here once.
"""

NODE_COLUMNS = (
    ("NODE", "node"),
    ("STATE", "state"),
    ("CPU %", "cpu_percent"),
    ("MEM (GB)", "memory_gb"),
    ("GPUS", "gpus"),
    ("ENGINES", "engines"),
    ("SHARDS (READY/ALL)", "shards"),
    ("VLLM BUILD", "vllm_build"),
    ("INSTALLS", "installs"),
)


def lines(rows: list[list[str]]) -> list[str]:
    """``rows`` (the header first) as lines of left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def node_lines(rows: list[dict]) -> list[str]:
    """The node table: one row per node, as ``NodeRowSerializer`` fields."""
    return lines(
        [[h for h, _ in NODE_COLUMNS]] + [[str(r[k]) for _, k in NODE_COLUMNS] for r in rows]
    )
