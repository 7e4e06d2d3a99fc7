import os
import signal

import pytest

from agentd import state


@pytest.fixture
def state_dir(tmp_path):
    """A supervisor state dir; every engine still carrying its mark is killed afterwards.

    Engines outlive their supervisor by design, so a test must clean up after itself.
    """
    path = (tmp_path / "agent-state").resolve()
    path.mkdir()
    yield path
    for pid, _env in state.find_marked(path).values():
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
