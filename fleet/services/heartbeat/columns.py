"""The load columns, named once for both heartbeat writers.

Each is (column, PostgreSQL array type). The names are the fields of
``protocol.Load`` (less its shards) and ``protocol.ShardLoad``, which are also
the columns of ``NodeLoad`` and ``ShardLoad``; tests/consumer/test_heartbeat_writes.py
checks the three agree.
"""

NODE_LOAD = (
    ("cpu_percent", "float8"),
    ("cpu_count", "integer"),
    ("load1", "float8"),
    ("load5", "float8"),
    ("load15", "float8"),
    ("memory_used_bytes", "bigint"),
    ("memory_available_bytes", "bigint"),
)
SHARD_LOAD = (
    ("cpu_cores", "float8"),
    ("rss_bytes", "bigint"),
    ("gpu_memory_mb", "integer"),
)
