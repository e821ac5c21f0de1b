"""agent.cloud (ftd.config.schema.CloudConfig): off by default, so nothing is polled unless a site
enables a provider; bad values are refused with an error naming the key; the wiring builds the cloud
watcher only when a provider is enabled."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftd.agent.watchers.cloud import CloudWatcher
from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ConfigError, config_from_data
from ftd.config.schema import AgentConfig, CloudConfig


def test_default_polls_nothing() -> None:
    cloud = config_from_data({}).agent.cloud
    assert (cloud.aws, cloud.gcp, cloud.azure) == (False, False, False)
    assert cloud.aws_url == "http://169.254.169.254"
    assert cloud.gcp_url == "http://metadata.google.internal"


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"aws_url": "169.254.169.254"}, "aws_url"),  # no scheme
        ({"gcp_url": "http://metadata.google.internal/computeMetadata"}, "gcp_url"),  # a path
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": 300}, "timeout_s"),
        ({"interval_s": -1}, "interval_s"),
        ({"max_body_bytes": 10}, "max_body_bytes"),
        ({"aws": "yes"}, "aws"),
        ({"spot": True}, "spot"),  # unknown key
    ],
)
def test_bad_values_name_the_key(table: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_data({"agent": {"cloud": table}})
    assert f"agent.cloud.{key}" in str(info.value)


def _watchers(tmp_path: Path, cloud: CloudConfig) -> list[object]:
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "state"),
        socket_path=str(tmp_path / "a.sock"),
        cloud=cloud,
    )
    return list(build_agent(cfg, bus=MemoryBus(MemoryBroker(), client_id="a"), node="n1").watchers)


def test_the_watcher_is_built_only_when_a_provider_is_enabled(tmp_path: Path) -> None:
    assert not [w for w in _watchers(tmp_path, CloudConfig()) if isinstance(w, CloudWatcher)]
    (watcher,) = [w for w in _watchers(tmp_path, CloudConfig(gcp=True)) if isinstance(w, CloudWatcher)]
    assert [e.url for e in watcher.endpoints] == [
        "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
        "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event",
    ]
