"""llmgw-agent: ``python -m agentd --config agent.yaml`` runs the agent;
``python -m agentd discover`` prints what a registration would carry.

Exit status: 0 after an orderly stop (SIGTERM, Ctrl-C), 2 for an invalid
agent.yaml, 3 when the control plane refuses this node (a bad join token, a
revoked credential), which no retry could fix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from agentd import __version__
from agentd.config import ConfigError, load_config

logger = logging.getLogger("agentd")

DEFAULT_CONFIG = os.environ.get("LLMGW_AGENT_CONFIG", "/etc/llmgw/agent.yaml")
EXIT_CONFIG = 2
EXIT_REFUSED = 3


def _parser() -> argparse.ArgumentParser:
    config_help = f"agent.yaml (default: $LLMGW_AGENT_CONFIG or {DEFAULT_CONFIG})"
    # --config is accepted before or after the command; after it, it must not
    # reset what was given before (hence SUPPRESS).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", "-c", default=argparse.SUPPRESS, help=config_help)
    p = argparse.ArgumentParser(prog="llmgw-agent", description="The llmgw node agent.")
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=config_help)
    p.add_argument("--version", action="version", version=f"llmgw-agent {__version__}")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("run", parents=[common], help="run the agent (the default)")
    d = sub.add_parser(
        "discover", parents=[common], help="print the inventory a registration would carry"
    )
    d.add_argument(
        "--no-config",
        action="store_true",
        help="ignore agent.yaml: defaults for everything (no weights dirs)",
    )
    sub.add_parser("check-config", parents=[common], help="validate agent.yaml and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = args.command or "run"
    if command == "discover":
        return _discover(args)
    try:
        cfg = load_config(args.config)
        if command == "check-config":
            print(f"{args.config}: valid (node {cfg.node_id})")
            return 0
        cfg.bearer()  # no join token and no credential yet is a config error, found now
    except ConfigError as exc:
        print(f"llmgw-agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return _run(cfg)


def _discover(args) -> int:
    from agentd.discovery import Machine
    from agentd.nvml import Checks

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.no_config or not Path(args.config).exists():
        from agentd.config import DEFAULT_STATE_DIR, sanitise_node_id

        machine = Machine(state_dir=Path(DEFAULT_STATE_DIR))
        node_id, labels = sanitise_node_id(os.uname().nodename), {}
    else:
        try:
            cfg = load_config(args.config)
        except ConfigError as exc:
            print(f"llmgw-agent: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        machine = Machine(
            state_dir=cfg.state_dir,
            weights_dirs=list(cfg.weights_dirs),
            fabric_name=cfg.fabric_name,
            checks=Checks(**cfg.gpu_checks.model_dump()),
        )
        node_id, labels = cfg.node_id, dict(cfg.labels)
    try:
        inv = machine.inventory(node_id=node_id, labels=labels)
    finally:
        machine.close()
    # Built as the message itself, so what is printed is known to pass the schema.
    from agentd import protocol

    reg = protocol.Register(type="register", **inv)
    json.dump(reg.model_dump(mode="json"), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _run(cfg) -> int:
    from agentd import logs

    logs.setup(cfg.log_path, os.environ.get("LOG_LEVEL", "INFO"))
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    logger.info(
        "llmgw-agent %s starting node=%s control_plane=%s state_dir=%s",
        __version__,
        cfg.node_id,
        ",".join(cfg.urls),
        cfg.state_dir,
    )
    try:
        return asyncio.run(_serve(cfg))
    except KeyboardInterrupt:
        return 0


async def _serve(cfg) -> int:
    from agentd import client
    from agentd.agent import Agent

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agent = Agent(cfg)
    agent.shards = _shards(cfg, agent)
    try:
        await agent.start()
        await client.run(agent, stop)
    except client.Refused as exc:
        logger.error("stopping: %s", exc)
        return EXIT_REFUSED
    except ConfigError as exc:
        logger.error("stopping: %s", exc)
        return EXIT_CONFIG
    finally:
        await agent.close()
    logger.info("stopped; engines keep running")
    return 0


def _shards(cfg, agent):
    """The engine supervisor, its shard events going to the control plane through the agent."""
    from agentd.fetch.fetcher import Fetcher, FetchSettings
    from agentd.supervised import SupervisedShards
    from agentd.supervisor import Supervisor

    fetch = cfg.fetch
    fetcher = Fetcher(
        FetchSettings(
            roots=list(cfg.weights_dirs),
            max_concurrent=fetch.max_concurrent,
            stall_s=fetch.stall_timeout_s,
            ca_file=str(fetch.ca_file) if fetch.ca_file else None,
            hf_endpoint=fetch.hf_endpoint,
            hf_token=fetch.hf_token,
            allow_private_addresses=fetch.allow_private_addresses,
            allow_networks=tuple(fetch.allow_networks),
        )
    )
    return SupervisedShards(
        Supervisor(
            cfg.state_dir,
            port_range=cfg.engine_port_range,
            binaries=dict(cfg.engines.binaries),
            disabled=list(cfg.engines.disabled),
            allow_env=list(cfg.engines.allow_env),
            on_event=agent.on_shard_event,
            fetcher=fetcher,
            gpu_memory=agent.gpu_memory,
            gpu_indices=agent.gpu_indices,
            model_dirs=cfg.local_roots,
            private_paths=cfg.private_paths,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
