"""The real agent process against a real web process: an XID the NVML double raises, a
thermal slowdown, and a spot notice from a stand-in metadata service, each reaching the
control plane's rows."""

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.agent import nvml_data
from tests.agent.cloud_metadata import CloudMetadata
from tests.factories import join_token
from tests.processes import start_agent, start_web, wait_until, write_config

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def web(transactional_db, tmp_path):
    server = start_web(tmp_path, LLMGW_HEARTBEAT_INTERVAL_S="0.5")
    yield server
    server.stop()


def rewrite(path: Path, spec: dict) -> None:
    """Whole, with a newer mtime, so the agent's double never reads half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec))
    stamp = max(time.time_ns(), path.stat().st_mtime_ns + 1_000_000)
    os.utime(tmp, ns=(stamp, stamp))
    tmp.replace(path)


def _gpu(node_id, index):
    from fleet.models import GPU

    return GPU.objects.filter(node_id=node_id, index=index).first()


def _node(node_id):
    from fleet.models import Node

    return Node.objects.filter(pk=node_id).first()


def test_an_xid_a_slowdown_and_a_spot_notice_reach_the_control_plane(web, tmp_path):
    from django.utils import timezone

    # given: a two-GPU node (the NVML double) whose agent asks an AWS-shaped stand-in
    _, secret = join_token(uses=1)
    spec = nvml_data.hgx(count=2)
    nvml_file = nvml_data.write(tmp_path / "nvml.json", spec)
    with CloudMetadata() as cloud:
        config = write_config(
            tmp_path,
            web.ws_url,
            join_token=secret,
            node_id="gpu-xid-01",
            notice={"source": "aws", "url": cloud.url, "poll_interval_s": 0.2},
        )
        agent = start_agent(config, nvml_file)
        try:
            wait_until(lambda: _gpu("gpu-xid-01", 1), what="the GPUs registered", proc=agent)
            assert _gpu("gpu-xid-01", 1).health == "healthy"

            # when: the driver says GPU 1 fell off the bus
            raised = time.monotonic()
            spec["events"] = [{"gpu": 1, "type": "xid", "xid": 79}]
            rewrite(nvml_file, spec)

            # then: its row is failed, with NVIDIA's words and the count, within seconds
            gpu = wait_until(
                lambda: (g := _gpu("gpu-xid-01", 1)) and g.fault == "failed" and g,
                what="GPU 1's fault",
                proc=agent,
            )
            assert time.monotonic() - raised < 10
            assert gpu.health == "failed"
            assert gpu.fault_reason == "XID 79: GPU has fallen off the bus"
            assert gpu.xids == {"79": 1}
            assert _gpu("gpu-xid-01", 0).health == "healthy"
            assert "GPU 1: XID 79 (GPU has fallen off the bus): fail" in agent.output()

            # when: GPU 0 slows itself for heat; then: degraded, saying why
            spec["gpus"][0]["clocks_event_reasons"] = ["hw_thermal_slowdown"]
            rewrite(nvml_file, spec)
            gpu0 = wait_until(
                lambda: (g := _gpu("gpu-xid-01", 0)) and g.slowdowns and g,
                what="GPU 0's slowdown",
                proc=agent,
            )
            assert gpu0.slowdowns == ["HW Thermal Slowdown"]
            assert gpu0.health == "degraded"
            assert gpu0.health_reason == "clocks slowed: HW Thermal Slowdown"

            # when: EC2 reclaims the instance in two minutes
            said = timezone.now()
            deadline = said + timedelta(seconds=120)
            cloud.aws_action = {
                "action": "terminate",
                "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }

            # then: the node has notice, drains, and says why
            node = wait_until(
                lambda: (n := _node("gpu-xid-01")) and n.notice_deadline and n,
                what="the node's notice",
                proc=agent,
            )
            assert abs((node.notice_deadline - deadline).total_seconds()) < 3
            assert node.notice_source == "aws"
            assert node.notice_reason == "spot instance-action terminate"
            assert node.draining and node.cordoned

            assert agent.terminate() == 0
        finally:
            agent.kill()
