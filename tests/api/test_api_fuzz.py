"""The management API against its own OpenAPI schema, with every schemathesis check.

schemathesis reads /api/schema/ from a real Daphne and sends what it generates
from it, valid and invalid, to every operation with an operator's manage key
against a small fleet: examples, coverage, fuzzing and stateful sequences. Every
check is on, so the test fails if the API answers 5xx, a status or content type
the schema does not document, a body that breaks its response schema, accepts
a request the schema forbids or refuses one it allows, ignores a missing or
wrong key, or keeps answering for something it deleted.

Bounded (``MAX_EXAMPLES`` an operation, one seed) to keep it near a minute;
``LLMGW_FUZZ_EXAMPLES`` and ``LLMGW_FUZZ_SEED`` widen or vary a run by hand.
tests/api/fuzz_hooks.py makes the valid cases valid where no schema can say
how (ids that exist, parallelism that adds up).
"""

import os
import re
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model

from fleet.models import ApiKeyScope
from fleet.services import api_keys
from tests.factories import LLAMACPP_CPU, add_model, add_node, add_replica
from tests.processes import start_web
from tests.processes.base import ROOT, subprocess_env

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

MAX_EXAMPLES = int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "10"))
SEED = os.environ.get("LLMGW_FUZZ_SEED", "20261201")


@pytest.fixture
def fleet_and_key():
    # given a small fleet: a node, a model with a replica on it, and an operator's key
    add_node("gpu-01", as_reported=True)
    model = add_model("qwen-7b", **LLAMACPP_CPU)
    add_replica(model, model.active_profile, ["gpu-01"])
    user = get_user_model().objects.create_superuser("fuzz", "fuzz@example.com", "x")
    _, secret = api_keys.create_api_key("fuzz", scope=ApiKeyScope.MANAGE, user=user)
    return model, secret


def test_the_api_does_what_its_schema_says(fleet_and_key, tmp_path):
    model, secret = fleet_and_key
    # The ignored-auth check sends unknown keys on purpose: lockout after five
    # (a 429 the schema documents) would stop the run, so this server allows more.
    server = start_web(tmp_path, LOGIN_FAILURE_LIMIT="1000000")
    try:
        # when schemathesis runs every phase with every check
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "run",
                f"{server.url}/api/schema/",
                "--header",
                f"Authorization: Bearer {secret}",
                "--checks",
                "all",
                "--max-examples",
                str(MAX_EXAMPLES),
                "--seed",
                SEED,
                # Deadlines that bound a wait and never judge speed (no timed assertion
                # in this suite): schemathesis's own 10 s, for an answer and for the
                # response-time check of --checks all, were each crossed once (11.3 and
                # 11.6 s, a PUT and a 400), on two busy cores, about 90 s into a run
                # whose longest e2e scenarios (real vLLM among them) began beside it.
                "--request-timeout",
                "60",
                "--max-response-time",
                "60",
                # One worker: the shared machine has two cores, and runs stay reproducible.
                "--workers",
                "1",
                # The API refuses NUL in any text (PostgreSQL cannot store it), a rule
                # the schema leaves unsaid rather than put a pattern on every string.
                "--generation-allow-x00",
                "false",
                "--generation-database",
                "none",
                "--no-color",
            ],
            cwd=tmp_path,
            env=subprocess_env(
                SCHEMATHESIS_HOOKS="tests.api.fuzz_hooks",
                LLMGW_FUZZ_MODEL_ID=model.pk,
                PYTHONPATH=str(ROOT),
            ),
            capture_output=True,
            text=True,
            # A bound on a hung run, never a judge of speed: alone it takes about
            # 250 s (180 s of CPU) on a 2-core machine half as fast as CI's usual
            # one, and beside the longest scenarios there it ran past 600 s twice.
            timeout=1200,
            check=False,
        )
    finally:
        server.stop()
    output = done.stdout + done.stderr
    # The figures (cases generated, operations, phases) and any warnings, for the log.
    warnings = output.find("=== WARNINGS ===")
    print(output[warnings if warnings >= 0 else output.find("=== SUMMARY ===") :])

    # then nothing failed, and every operation was tried
    assert done.returncode == 0, f"schemathesis found the API and its schema apart:\n{output}"
    selected = re.search(r"Selected: (\d+)/(\d+)", output)
    tested = re.search(r"Tested: (\d+)", output)
    assert selected and tested, output
    assert selected[1] == selected[2] == tested[1], output
