"""The torch helper follows the client's save_at_step: a pending save directive that asks for a later
step is not a reason to save yet (it was, before: the helper looked at the directive alone)."""

from __future__ import annotations

import pytest


class WaitingClient:
    """A client with a save directive pending for ``save_at``: should_save only from that step."""

    def __init__(self, save_at: int) -> None:
        self.save_at = save_at
        self.step = 0
        self.acks: list[int] = []

    def heartbeat(self, step: int | None = None) -> None:
        self.step = step or 0

    def should_save(self) -> bool:
        return not self.acks and self.step >= self.save_at

    @property
    def save_directive_pending(self) -> bool:
        return not self.acks

    def should_stop(self) -> bool:
        return False

    def ack_saved(self, step: int, path: str | None = None) -> None:
        self.acks.append(step)


def test_the_agreed_save_waits_for_the_step_the_coordinator_chose() -> None:
    # here, not at module level: collection skips the import
    pytest.importorskip("torch", reason="pip install 'ftd-daemon[torch]'")
    from ftd.client.torch import TorchCoordinator

    client = WaitingClient(save_at=5)
    coord = TorchCoordinator(client)  # type: ignore[arg-type]
    saved = []
    for step in range(1, 9):
        client.heartbeat(step)
        save, _ = coord.agree(step)
        if save:
            saved.append(step)
            coord.saved(step, f"/ckpt/{step}")
    assert saved == [5] and client.acks == [5]
