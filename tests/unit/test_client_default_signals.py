"""Client: the default signal handling (issue #37 item 4) and the Slurm wait's setting.

``Client()`` in the main thread takes SIGTERM (save then stop) and SIGUSR1 (save) only where their
handler is still ``SIG_DFL``; a handler the user installed stays, ``$FTD_SIGNALS=0`` and
``signals=False`` turn it off, another thread installs nothing. What a SIGTERM does to a whole
process (the second one's default action, the wait for Slurm at exit) is in
tests/integration/test_client_sigterm.py.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.client import Client
from ftd.client.client import TERM_WAIT_DEFAULT_S, TERM_WAIT_ENV, term_wait_s
from tests.properties import examples

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(autouse=True)
def default_handlers() -> Iterator[None]:
    """Each test starts with SIGTERM/SIGUSR1 at SIG_DFL and leaves them so."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    for s in before:
        signal.signal(s, signal.SIG_DFL)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def offline(tmp_path: Path, **kw: object) -> Client:
    return Client(job="j1", rank=0, socket_path=str(tmp_path / "absent.sock"), connect=False, **kw)  # type: ignore[arg-type]


def test_by_default_sigterm_is_a_save_then_a_stop(tmp_path: Path) -> None:
    client = offline(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert not client.should_save() and not client.should_stop()
    before = time.time()
    os.kill(os.getpid(), signal.SIGTERM)
    assert client.should_save() and client.should_stop()
    assert client.stop_reason == "SIGTERM"
    assert client.sigterm_at is not None and before <= client.sigterm_at <= time.time()
    client.ack_saved(7, "/ckpt/7")
    assert not client.should_save() and client.should_stop()  # the stop stays; the save was answered


def test_by_default_sigusr1_is_a_save_only(tmp_path: Path) -> None:
    client = offline(tmp_path)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert client.should_save() and not client.should_stop()
    assert client.sigterm_at is None


def test_a_handler_the_user_installed_is_kept(tmp_path: Path) -> None:
    seen: list[int] = []

    def mine(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(signal.SIGTERM, mine)
    client = offline(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL  # SIGUSR1 was free: taken
    os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGTERM]
    assert not client.should_save() and not client.should_stop()


def test_a_second_client_leaves_the_first_ones_handler(tmp_path: Path) -> None:
    first = offline(tmp_path)
    handler = signal.getsignal(signal.SIGTERM)
    second = offline(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is handler
    os.kill(os.getpid(), signal.SIGTERM)
    assert first.should_stop() and not second.should_stop()


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_ftd_signals_0_turns_the_default_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("FTD_SIGNALS", value)
    offline(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_signals_false_installs_nothing(tmp_path: Path) -> None:
    offline(tmp_path, signals=False)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_another_thread_installs_nothing(tmp_path: Path) -> None:
    taken: list[list[int]] = []
    client = offline(tmp_path, signals=False)
    thread = threading.Thread(target=lambda: taken.append(client.install_default_signal_handlers()))
    thread.start()
    thread.join()
    assert taken == [[]]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        (None, TERM_WAIT_DEFAULT_S),
        ("", TERM_WAIT_DEFAULT_S),
        ("0", 0.0),
        ("45.5", 45.5),
        ("-3", 0.0),
        ("soon", TERM_WAIT_DEFAULT_S),
        ("nan", TERM_WAIT_DEFAULT_S),
        ("1e9", 86400.0),
    ],
)
def test_term_wait_setting(monkeypatch: pytest.MonkeyPatch, raw: str | None, seconds: float) -> None:
    if raw is None:
        monkeypatch.delenv(TERM_WAIT_ENV, raising=False)
    else:
        monkeypatch.setenv(TERM_WAIT_ENV, raw)
    assert term_wait_s() == seconds


@pytest.mark.property
@settings(max_examples=examples(300))
@given(
    st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20)
)
def test_term_wait_never_raises_and_stays_in_range(raw: str) -> None:
    old = os.environ.get(TERM_WAIT_ENV)
    os.environ[TERM_WAIT_ENV] = raw
    try:
        value = term_wait_s()
    finally:
        if old is None:
            del os.environ[TERM_WAIT_ENV]
        else:
            os.environ[TERM_WAIT_ENV] = old
    assert not math.isnan(value) and 0.0 <= value <= 86400.0


def test_an_explicit_client_never_chains_to_a_closed_clients_default(tmp_path: Path) -> None:
    # Found by the suite: a default client's handler, left behind closed, was chained by a later
    # Client(signals=True) and gave SIGTERM's default action, killing the process.
    first = offline(tmp_path)
    first.close()
    second = offline(tmp_path, signals=True)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert second.should_save() and second.should_stop()
    finally:
        second.uninstall_signal_handlers()


def test_a_sigterm_between_should_save_and_should_stop_is_saved_in_the_next_step(tmp_path: Path) -> None:
    """The README loop asks should_save() then should_stop() each step: a SIGTERM landing between the
    two used to leave the loop unsaved (steps lost since the last checkpoint); now the loop saves in
    the next step and stops there."""
    client = offline(tmp_path)
    saved: list[int] = []
    step = 0
    for step in range(1, 6):
        if client.should_save():
            saved.append(step)
            client.ack_saved(step, f"/ckpt/{step}")
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # after this step's should_save(), before should_stop()
        if client.should_stop():
            break
    assert saved == [3] and step == 3


def test_a_loop_that_never_asks_should_save_still_stops_at_once(tmp_path: Path) -> None:
    client = offline(tmp_path)
    os.kill(os.getpid(), signal.SIGTERM)
    assert client.should_stop()
