"""Coverage-guided fuzzing (atheris/libFuzzer) of what ftd reads from outside.

    python tests/fuzz/fuzz_inputs.py kmsg -dict=tests/fuzz/kmsg.dict CORPUS_DIR -atheris_runs=200000

(copy tests/fuzz/corpus_kmsg/ to CORPUS_DIR first: libFuzzer adds what it finds to the corpus dir.)
    python tests/fuzz/fuzz_inputs.py bus  -max_total_time=300

Targets:
* ``kmsg`` — the kernel-log parser (:class:`ftd.agent.kmsg_parse.KmsgParser`) on arbitrary bytes
  decoded as the watcher decodes them, line by line, with state carried across lines: it must never
  raise.
* ``bus`` — the coordinator's message handling on an arbitrary topic suffix and payload: every bad
  input is counted, none escapes as an exception.
* ``culprit`` — the hang-evidence parsers (issue #33) on arbitrary bytes: a py-spy dump (text or
  JSON), a flight-recorder dump and a log line that may name a peer; each answers, none raises.

Any exception is a crash libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["ftd"]):  # coverage of ftd's code, not its dependencies
    from ftd.agent.kmsg_parse import KmsgParser
    from ftd.bus.base import Message
    from ftd.bus.memory import MemoryBroker, MemoryBus
    from ftd.config import ApiConfig, Config, CoordinatorConfig
    from ftd.coordinator.daemon import Coordinator
    from ftd.coordinator.ledger.sqlite import Ledger
    from ftd.coordinator.wiring import build
    from ftd.culprit.flight import parse_flight_json
    from ftd.culprit.peers import parse_peer_error
    from ftd.culprit.stacks import merge_tree, parse_py_spy, render_tree

_parser = KmsgParser()
_SUFFIXES = ("events/xid", "events/batch", "status", "jobs/7", "acks", "events/ecc", "directives", "x")


def fuzz_kmsg(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    for number, line in enumerate(text.split("\n"), 1):
        _parser.feed(line, number)
    _parser.flush()


_coordinator: Coordinator | None = None


def fuzz_bus(data: bytes) -> None:
    global _coordinator
    if _coordinator is None:
        config = Config(
            coordinator=CoordinatorConfig(
                ledger_path=":memory:", scheduler="none", api=ApiConfig(enabled=False)
            )
        )
        _coordinator = build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))
    provider = atheris.FuzzedDataProvider(data)
    suffix = _SUFFIXES[provider.ConsumeIntInRange(0, len(_SUFFIXES) - 1)]
    node = provider.ConsumeUnicodeNoSurrogates(8) or "n"
    topic = f"ftd/v1/nodes/{node}/{suffix}"
    _coordinator.handle_message(Message(topic, provider.ConsumeBytes(4096)))


def fuzz_culprit(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    threads, problems = parse_py_spy(text)
    assert isinstance(problems, list)
    render_tree(merge_tree({0: threads, 1: threads[:1]}))
    record, error = parse_flight_json(data)
    assert (record is None) != (error == "")
    parse_peer_error(text)


TARGETS = {"kmsg": fuzz_kmsg, "bus": fuzz_bus, "culprit": fuzz_culprit}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
