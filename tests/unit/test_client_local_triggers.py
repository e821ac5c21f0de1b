"""Client: signals, kill/save switch files, the memory guard and the automatic deadline nack."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ftd.agent.local_api import LocalApi
from ftd.client import DEADLINE_REASON, Client
from tests.unit.helpers import Recorder, until
from tests.unit.test_client import clients, connected, directive

__all__ = ["clients"]  # a fixture, imported for pytest (api, rec, sockdir come from conftest.py)


def offline(tmp_path: Path, **kw: object) -> Client:
    return Client(job="j1", rank=0, socket_path=str(tmp_path / "absent.sock"), connect=False, **kw)  # type: ignore[arg-type]


def test_sigusr1_saves_sigterm_stops_and_previous_handlers_are_chained(tmp_path: Path) -> None:
    seen: list[int] = []
    old_usr1 = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    old_term = signal.getsignal(signal.SIGTERM)
    client = offline(tmp_path, signals=True)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert client.should_save() and not client.should_stop()
        assert seen == [signal.SIGUSR1]  # the handler installed before ours still ran
        assert client.wait(1.0) == "save"
        client.ack_saved(5)
        assert not client.should_save()
        os.kill(os.getpid(), signal.SIGTERM)  # the default action would kill pytest: not chained
        time.sleep(0.01)
        # a save then a stop: the stop shows once the loop asked for the save (it had asked before)
        assert not client.should_stop() and client.should_save()
        client.ack_saved(6)
        assert client.should_stop() and client.stop_reason == "SIGTERM"
    finally:
        client.uninstall_signal_handlers()
        assert signal.getsignal(signal.SIGTERM) == old_term
        signal.signal(signal.SIGUSR1, old_usr1)


def test_signal_handlers_only_from_the_main_thread(tmp_path: Path) -> None:
    client = offline(tmp_path)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(client.install_signal_handlers()))
    thread.start()
    thread.join()
    assert result == [False]
    assert signal.getsignal(signal.SIGUSR1) is not client._on_signal


def test_kill_switch_file_stops_even_before_the_first_step(tmp_path: Path) -> None:
    stop_file = tmp_path / "STOP"
    stop_file.touch()
    client = offline(tmp_path, stop_file=str(stop_file))
    assert client.should_stop() and client.stop_reason == "stop_file"

    late = offline(tmp_path, stop_file=str(tmp_path / "LATER"), switch_poll_s=0.0)
    assert not late.should_stop()
    (tmp_path / "LATER").touch()
    assert late.should_stop()


def test_save_switch_file_saves_once_and_is_removed_by_the_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_file = tmp_path / "SAVE"
    monkeypatch.setenv("FTD_SAVE_FILE", str(save_file))
    client = offline(tmp_path, switch_poll_s=0.0)
    assert client.save_file == str(save_file) and not client.should_save()
    save_file.touch()
    assert client.should_save() and not client.save_directive_pending
    client.ack_saved(10, "/ckpt/10")
    assert not save_file.exists() and not client.should_save()
    save_file.touch()  # a new request: one more save
    assert client.should_save()
    client.nack("disk full")  # answered either way: removed, no save per step forever
    assert not save_file.exists() and not client.should_save()


def test_switch_files_are_polled_not_stat_per_call(tmp_path: Path) -> None:
    client = offline(tmp_path, stop_file=str(tmp_path / "STOP"), switch_poll_s=60.0)
    (tmp_path / "STOP").touch()
    assert not client.should_stop()  # next poll in a minute: the hot path stays attribute reads


def test_memory_guard_sets_save_and_stop_above_the_threshold(tmp_path: Path) -> None:
    client = offline(tmp_path)
    assert client.memory_guard(max_rss_fraction=0.99) is False
    assert 0 < client.memory_report["host"]["fraction"] < 0.99
    assert not client.should_save() and not client.should_stop()
    assert client.memory_guard(max_rss_fraction=0.0) is True  # any use is "too much"
    assert client.should_save() and client.should_stop() and client.stop_reason == "memory"


async def test_an_unanswered_save_is_nacked_at_its_deadline(
    api: LocalApi, rec: Recorder, clients: list[Client]
) -> None:
    client = await connected(clients, api)
    await api.deliver(directive("d-late", deadline_s=0.3))
    await api.deliver(directive("d-open"))  # no deadline: stays pending
    await until(lambda: client.should_save())
    client.heartbeat(7)
    await until(lambda: len(rec.acks) == 1, within=3.0)
    ack = rec.acks[0]
    assert (ack.directive_id, ack.ok, ack.reason) == ("d-late", False, DEADLINE_REASON)
    assert client.should_save() and client.save_directive_pending  # d-open is still wanted
    client.ack_saved(8, "/ckpt/8")
    await until(lambda: len(rec.acks) == 2)
    assert (rec.acks[1].directive_id, rec.acks[1].ok) == ("d-open", True)
    assert not client.should_save()
