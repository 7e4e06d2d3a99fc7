"""The range of TCP ports engines listen on: its default, and the one way to read and check it.

Both ends use it: the agent (``engine_port_range`` in agent.yaml), and the
control plane, which picks each shard's port from the range
(``LLMGW_SHARD_PORT_RANGE``, or a node's ``llmgw.io/ports`` label).
"""

DEFAULT_PORT_RANGE = (30000, 30999)
# A node's own range, as the control plane reads it from the node's labels.
PORTS_LABEL = "llmgw.io/ports"
LOWEST, HIGHEST = 1024, 65535


def check_port_range(lo: int, hi: int) -> tuple[int, int]:
    """(lo, hi) if it is a range of unprivileged ports, low first; ValueError otherwise."""
    if not LOWEST <= lo <= hi <= HIGHEST:
        raise ValueError(f"port range {lo}-{hi} must lie within {LOWEST}-{HIGHEST}, low first")
    return lo, hi


def parse_port_range(text: str) -> tuple[int, int]:
    """``"30000-30999"`` as (30000, 30999); ValueError naming the problem otherwise."""
    try:
        lo, hi = (int(p) for p in str(text).split("-", 1))
    except ValueError:
        raise ValueError(f"port range '{text}' is not LO-HI, e.g. 30000-30999") from None
    return check_port_range(lo, hi)


def format_port_range(ports: tuple[int, int]) -> str:
    return f"{ports[0]}-{ports[1]}"
