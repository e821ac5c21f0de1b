"""The local protocol's messages, pinned byte for byte (both ends build their lines from them)."""

from __future__ import annotations

import msgspec

from ftd.agent.local_api import wire
from ftd.client import protocol
from ftd.events import Directive


def test_client_messages_on_the_wire() -> None:
    assert protocol.encode(protocol.register("j1", 3, 3, 4242)) == (
        b'{"v":1,"op":"register","job":"j1","rank":3,"local_rank":3,"pid":4242,"run":null,'
        b'"startup_timeout_s":null}\n'
    )
    assert protocol.encode(protocol.register("j1", 3, None, 1, "slurm-restart-2", 900.0)) == (
        b'{"v":1,"op":"register","job":"j1","rank":3,"local_rank":null,"pid":1,"run":"slurm-restart-2",'
        b'"startup_timeout_s":900.0}\n'
    )


def test_an_older_clients_register_without_run_still_decodes() -> None:
    msg = wire.decoder.decode(b'{"v":1,"op":"register","job":"j1","rank":3,"local_rank":3,"pid":4242}')
    assert isinstance(msg, wire.Register) and msg.run is None and msg.startup_timeout_s is None


def test_run_id_from_the_environment() -> None:
    assert protocol.run_id({}) is None
    assert protocol.run_id({"SLURM_JOB_ID": "7"}) == "slurm-restart-0"
    assert protocol.run_id({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "3"}) == "slurm-restart-3"
    assert protocol.run_id({"FTD_POD_UID": "abc"}) == "pod-abc"
    assert protocol.run_id({"FTD_RUN": "r9", "SLURM_JOB_ID": "7"}) == "r9"
    assert protocol.encode(protocol.heartbeat(None)) == b'{"v":1,"op":"heartbeat","step":null}\n'
    assert protocol.encode(protocol.ack("d1", ok=True, step=1200, path="/ckpt/1200", reason="")) == (
        b'{"v":1,"op":"ack","directive_id":"d1","ok":true,"step":1200,"path":"/ckpt/1200","reason":""}\n'
    )


def test_agent_messages_on_the_wire() -> None:
    assert wire.OK_REGISTER == b'{"v":1,"op":"ok","re":"register"}\n'
    assert wire.error_line(None, "bad") == b'{"v":1,"op":"error","re":null,"error":"bad"}\n'
    directive = Directive(id="d1", ts=1.5, action="save", job="j1")
    line = wire.line(protocol.directive(msgspec.to_builtins(directive)))
    assert line.startswith(b'{"v":1,"op":"directive","schema":') and line.endswith(b"}\n")
    assert protocol.decode(line) == {"v": 1, "op": "directive", **msgspec.to_builtins(directive)}


def test_decode_refuses_what_is_not_an_object() -> None:
    assert protocol.decode(b"not json") is None
    assert protocol.decode(b"[1, 2]") is None
    assert protocol.decode(b"\xff\xfe") is None
    assert protocol.decode(b'{"op":"ok"}') == {"op": "ok"}
