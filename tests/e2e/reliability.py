"""The figures of docs/reliability.md: where the fault tests write them, and how to read them.

Each fault test calls the ``record`` fixture (tests/e2e/conftest.py), which
appends a JSON line to ``reliability.jsonl`` in ``$LLMGW_STATE_DIR``. To refresh
the table after a run, print the latest figure of each row:

    .venv/bin/python -m tests.e2e.reliability $LLMGW_STATE_DIR/reliability.jsonl

and paste each line into the "figure" column of its row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FILE = "reliability.jsonl"

# How each row's figures read in the table.
FIGURES = {
    "1": (
        "{kills} kills: {restarts} restarts, same engine PIDs: {same_engine_pids}, "
        "{engine_processes} engine process; {failed} failed + {broken} broken of {requests} "
        "requests ({streamed} streamed, {rate_per_s}/s); each time registered again "
        "within {register_again_max_s} s"
    ),
    "2": (
        "{duplicates} duplicate engines ({engine_processes} running, same PID: "
        "{same_engine_pids}), {restarts} restarts; {failed} failed + {broken} broken of "
        "{requests} requests ({streamed} streamed); registered again in {register_again_s} s"
    ),
    "3": (
        "cut off {short_cut_s} s: states seen {short_states}, desired sets changed: "
        "{short_desired_changed}; cut off {long_cut_s} s: suspect at {suspect_s} s, states "
        "seen {long_states}, {replacements} replacements, {restarts} restarts, same engine "
        "PIDs: {same_engine_pids}; ready again {ready_again_s} s after it returned"
    ),
    "4": (
        "cut off {cut_s} s: suspect at {suspect_s} s; replacement started at "
        "{replacement_started_s} s, ready at {replacement_ready_s} s; back: ready again in "
        "{ready_again_s} s, its duplicate engine stopped {duplicate_stopped_s} s after it "
        "returned; {failed} failed + {broken} broken of {requests} requests ({clients} "
        "clients giving up after {client_timeout_s} s, {streamed} streamed, "
        "{rate_per_s}/s): {not_ok_before_suspect} sent before its node was "
        "suspect (the cut-off replica's in-flight ones), {not_ok_after_suspect} after"
    ),
    "5": (
        "down {down_s} s: every agent back within {agents_back_max_s} s of the restart; "
        "node states seen: {node_states_seen}; engines the same: {engines_same}, "
        "{restarts} restarts; {failed_while_down} of {requests_sent_while_down} requests "
        "sent while it was down failed (connection refused), first answer "
        "{first_ok_after_up_s} s after it was back; {requests} requests in all, "
        "{failed} failed + {broken} broken"
    ),
    "6": (
        "{cut_nodes} of {nodes} cut off {cut_s} s: replacement paused {paused_after_s} s "
        "after the cut, banner shown: {banner_shown}, llmgw_reconciler_replacement_paused "
        "{paused_metric}; {replacements} replacements, {lost} nodes lost; all back "
        "{back_s} s after their return. 2 of 5 cut off: their replicas replaced at "
        "{two_cut_first_replaced_s} s and {two_cut_second_replaced_s} s, by passes "
        "{two_cut_passes_apart_s} s apart (at most one node per {replace_every_s} s)"
    ),
    "7": (
        "down {down_s} s: requests {ok}/{requests} ok ({success_pct} %; "
        "{ok_while_down}/{requests_while_down} while it was down); both changes made just "
        "before converged {converged_after_up_s} s after it was back; "
        "{agents_registered_again} agents registered again within {agents_back_max_s} s; "
        "node states seen: {node_states_seen}, {nodes_lost} lost; {duplicate_shards} "
        "duplicate shards, {shards_placed} shards placed, {engine_starts} engine starts, "
        "{restarts} restarts"
    ),
    "8": (
        "down {down_s} s: both changes converged {converged_after_up_s} s after Redis was "
        "back; {duplicate_shards} duplicate shards, {shards_placed} shards placed, "
        "{engine_starts} engine starts, {restarts} restarts; API change during the outage "
        "answered in ≤ {api_change_max_s} s; requests {ok}/{requests} ok "
        "({ok_while_down}/{requests_while_down} while Redis was down)"
    ),
    "9": (
        "{changes} desired changes while {followers} pages followed an engine logging "
        "{flood_lines_per_s} lines/s: sync p50 {sync_p50_s} s, p99 {sync_p99_s} s, max "
        "{sync_max_s} s (unloaded p50 {quiet_sync_p50_s} s); {pages} log pages of "
        "{lines_per_page} lines ({mb_followed} MB), outcomes {page_outcomes}; "
        "{replies_dropped:g} replies dropped; log problems {log_problems}; "
        "{failed} failed + {broken} broken of {requests} requests"
    ),
    "10": (
        "{stale_replays} stale replays: {replay_effects} effects, no ack; "
        "{duplicate_replays} duplicates: {duplicate_acks} acks, nothing redone; "
        "{engine_starts_after_restart} engine starts after an agent restart; "
        "a newer version acted: {newer_version_acted}"
    ),
    "11": (
        "{duplicate_shards} duplicate shards ({replicas} replicas, {shards_placed} shards "
        "placed, {engine_starts} engine starts, {restarts} restarts); "
        "{passes_asked_at_once} passes asked at once with {beats} beats and {workers} "
        "workers; after the kill -9 holding the lock, passes resumed in "
        "{passes_resumed_after_kill_s} s"
    ),
    "12": (
        "{failed} failed + {broken} broken of {requests} streamed requests at "
        "{rate_per_s}/s ({clients} clients); drained in {drained_s} s"
    ),
    "13": (
        "both agents registered through the other web process {back_on_other_web_s} s after "
        "the kill; node states seen {node_states_seen}; same engine PIDs: {engines_same}, "
        "{restarts} restarts; {failed} failed + {broken} broken of {requests} requests "
        "({streamed} streamed, {rate_per_s}/s) through the web process that stayed"
    ),
    "14": (
        "two-node llama.cpp (RPC): applied to serving in {apply_to_ready_s} s; follower's "
        "rpc-server killed: serving again as a new group in {rpc_server_killed_to_serving_s} "
        "s; follower's node silent (grace 10 s): serving from another pair in "
        "{follower_node_silent_to_serving_s} s; a node of the group drained: moved in "
        "{drain_s} s, none of {requests_during_drain} requests failed"
    ),
    "15": (
        "one of {replicas} replicas drained: its replacement ready in {replacement_ready_s} "
        "s, the replica stopped {stopped_s} s after the ask, the other untouched: "
        "{other_untouched}; {failed} failed + {broken} broken of {requests} requests "
        "({streamed} streamed, {rate_per_s}/s, {clients} clients)"
    ),
    "16": (
        "a canary at 25 % served {canary_share_percent} % of 400 requests; promoted, the "
        "others replaced in {promoted_s} s; a second canary aborted; {failed} failed + "
        "{broken} broken of {requests} requests ({streamed} streamed, {rate_per_s}/s, "
        "{clients} clients) through all three"
    ),
    "17": (
        "a canary at 25 % whose engine answers 500 to every third request rolled back by "
        "itself {rollback_s} s after its first bad answer, at {canary_requests} canary "
        "answers ({canary_5xx} 5xx); the active profile: {active_failed} failed of "
        "{active_requests}; {failed} failed + {broken} broken of {requests} requests "
        "({streamed} streamed, {rate_per_s}/s, {clients} clients), each a canary's 500"
    ),
    "18": (
        "{engine}: a replacement answering {replaced_s} s after the kill; {failed} failed + "
        "{broken} broken of {requests} requests ({streamed} streamed, {rate_per_s}/s, "
        "{clients} clients retrying every 0.25 s), {ok} answered"
    ),
    "19": (
        "{models} models of {share_gb} GB on one {gpu_gb} GB GPU: {failed} failed of "
        "{requests} requests cycling over them, {woken} answered by a replica woken for "
        "them (wait median {wake_median_s} s, max {wake_max_s} s); most held at once "
        "{peak_gb} GB; an asleep replica's engine killed: answering again {replaced_s} s "
        "after the kill"
    ),
    "20": (
        "an XID 79 on a serving replica's GPU, its engine killed with it: a replacement "
        "ready on a healthy GPU {xid79_s} s after the event; {first_failed} failed or broken "
        "of {first_requests} requests ({clients} streaming clients; at most {in_flight} were "
        "on the dead GPU); the GPU held out until cleared"
    ),
    "21": (
        "an XID 48, then an XID 94 on another GPU, engines still answering: each replica "
        "replaced and drained ({xid48_s} s and {xid94_s} s from the event to the replacement "
        "ready); {later_failed} failed or broken of {later_requests} requests ({clients} "
        "streaming clients)"
    ),
    "22": (
        "{failed} of {gpus} GPUs (40 %) failing in the same second: {drained} drained, "
        "{held} held by the brake with its replica still serving"
    ),
    "23": (
        "a {notice_s} s spot notice from the EC2-shaped stand-in: every replica on the node "
        "replaced and the node emptied {drained_s} s after the notice; {failed} failed + "
        "{broken} broken of {requests} requests ({streamed} streamed, {clients} clients)"
    ),
}


def path(directory: Path) -> Path:
    return directory / FILE


def latest(lines: list[str]) -> dict[str, dict]:
    """The last line recorded for each row."""
    rows: dict[str, dict] = {}
    for line in lines:
        if line.strip():
            entry = json.loads(line)
            rows[entry["row"]] = entry
    return rows


def figure(entry: dict) -> str:
    template = FIGURES.get(entry["row"])
    text = template.format(**entry) if template else json.dumps(entry)
    return f"{text} ({entry['date']})"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    rows = latest(Path(argv[0]).read_text().splitlines())
    for row in sorted(rows, key=int):
        print(f"{row}: {figure(rows[row])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
