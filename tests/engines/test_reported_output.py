"""What the control plane hears of an engine's output: a few lines, each cleaned and cut,
about 1 KiB in all, and never the bytes of a file the engine read. The rules as a table;
then real processes: the fake engine flooding long lines before it crashes, and real
llama.cpp given a text file for weights."""

import sys

import pytest

from agentd.shardlog import REPORT_CHARS, REPORT_LINE_CHARS, REPORT_LINES, clean_line, reportable
from tests.engines.helpers import Recorder, desired, fake_supervisor, profile, shard


@pytest.mark.parametrize(
    "line, shown",
    [
        ("llama_model_load: error loading model", "llama_model_load: error loading model"),
        ("\x1b[31mERROR\x1b[0m engine died", "ERROR engine died"),  # terminal colours
        ("bell\x07 and nul\x00 and del\x7f", "bell and nul and del"),
        ("  padded\r", "padded"),
        (
            "gguf_init_from_file_impl: invalid magic characters: 'root', expected 'GGUF'",
            "gguf_init_from_file_impl: invalid magic characters: (the file's first bytes, "
            "not shown), expected 'GGUF'",
        ),
        (  # a quote among the bytes read changes nothing
            "gguf_init_from_file_impl: invalid magic characters: 'a'b,', expected 'GGUF'",
            "gguf_init_from_file_impl: invalid magic characters: (the file's first bytes, "
            "not shown), expected 'GGUF'",
        ),
        ("x" * 1000, "x" * (REPORT_LINE_CHARS - 1) + "…"),
    ],
)
def test_a_line_is_cleaned_and_cut(line, shown):
    assert clean_line(line) == shown


def test_the_newest_lines_that_fit_are_kept_in_order():
    many = [f"line {i}" for i in range(100)]
    assert reportable(many) == [f"line {i}" for i in range(100 - REPORT_LINES, 100)]

    long = [f"{i} " + "y" * 500 for i in range(20)] + ["", "the end"]
    kept = reportable(long)
    assert kept[-1] == "the end" and kept[-2].startswith("19 ")
    assert sum(map(len, kept)) <= REPORT_CHARS
    assert all(len(line) <= REPORT_LINE_CHARS for line in kept)


@pytest.mark.live
async def test_an_engine_flooding_long_lines_before_it_crashes_is_reported_bounded(state_dir):
    # given: an engine writing 5,000-byte lines, fast, then crashing
    args = ["--log-flood", "200", "--log-flood-line-bytes", "5000", "--crash-after", "1"]
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec)
    await sup.start()
    try:
        await sup.apply(desired(1, shard(args=args)))
        failed = await rec.wait_for("r1-s0", "failed", timeout=30)
    finally:
        await sup.close()

    # then: its failure carries its last words, bounded; the log file keeps everything
    assert failed.last_output[-1] == "fake engine: crashing with exit code 3"
    assert len(failed.last_output) <= REPORT_LINES
    assert all(len(line) <= REPORT_LINE_CHARS for line in failed.last_output)
    assert sum(map(len, failed.last_output)) <= REPORT_CHARS
    assert (state_dir / "shards" / "r1-s0.log").stat().st_size > 50 * 5000


@pytest.mark.live
async def test_llama_cpp_given_a_text_file_reports_its_failure_without_the_files_bytes(
    state_dir, tmp_path
):
    # given: a text file under the node's roots, named as a model's weights
    secret = tmp_path / "notes.gguf"
    secret.write_text("SEKRIT-token-0123456789\n" * 200)
    prof = profile("llamacpp", model_path=str(secret))
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, binaries={"llamacpp": sys.executable})
    await sup.start()
    try:
        # when: llama.cpp (llama-cpp-python's server) tries to load it
        await sup.apply(desired(1, shard("t-s0", engine="llamacpp", profile=prof)))
        failed = await rec.wait_for("t-s0", "failed", timeout=120)
    finally:
        await sup.close()

    # then: the engine quoted the file's first bytes in its log; the report, bounded,
    # leaves them out
    log = (state_dir / "shards" / "t-s0.log").read_text().splitlines()
    assert any("invalid magic characters: 'SEKR'" in line for line in log)
    assert "SEKR" not in "\n".join([failed.error, *failed.last_output])
    assert sum(map(len, failed.last_output)) <= REPORT_CHARS
    # and so would any report of its output, however long: the engine's own line is
    # the one the rule recognises
    everything = reportable(log, max_lines=len(log), max_chars=10**6)
    assert "SEKR" not in "\n".join(everything)
    assert any("(the file's first bytes, not shown)" in line for line in everything)


@pytest.mark.live
async def test_an_adapter_llama_cpp_cannot_load_is_failed_in_its_words_bounded(state_dir, tmp_path):
    from agentd import protocol
    from agentd.tinygguf import write as write_tiny_model
    from tests.engines.helpers import adapters_reported

    # given: the tiny model, and a text file under the node's roots named as its adapter
    model = write_tiny_model(tmp_path / "tiny.gguf")
    notes = tmp_path / "notes.gguf"
    notes.write_text("SEKRIT-token-0123456789\n" * 200)
    prof = profile("llamacpp", model_path=str(model), max_adapters=1)
    spec = shard("t-s0", engine="llamacpp", profile=prof, startup_timeout_s=120).model_copy(
        update={"adapters": [protocol.AdapterSpec(name="notes", source=str(notes))]}
    )
    rec = Recorder()
    sup = fake_supervisor(state_dir, rec, binaries={"llamacpp": sys.executable})
    await sup.start()
    try:
        # when: llama-server starts with it, and exits
        await sup.apply(desired(1, spec))
        await adapters_reported(rec, lambda a: a.get("notes") == "failed", timeout=120)
        await rec.wait_for("t-s0", "ready", timeout=120)
    finally:
        await sup.close()

    # then: the adapter is failed with the engine's reason, bounded, without the file's
    # bytes the engine quoted in its log; the shard serves without it
    (notes_status,) = [a for a in rec.events[-1].adapters if a.name == "notes"]
    assert "failed to load lora adapter" in notes_status.error, notes_status.error
    assert "SEKR" not in notes_status.error and len(notes_status.error) <= REPORT_CHARS
    assert "'SEKR'" in (state_dir / "shards" / "t-s0.log").read_text()
