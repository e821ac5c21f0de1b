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
        _coordinator = build(
            config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:")
        )
    provider = atheris.FuzzedDataProvider(data)
    suffix = _SUFFIXES[provider.ConsumeIntInRange(0, len(_SUFFIXES) - 1)]
    node = provider.ConsumeUnicodeNoSurrogates(8) or "n"
    topic = f"ftd/v1/nodes/{node}/{suffix}"
    _coordinator.handle_message(Message(topic, provider.ConsumeBytes(4096)))


TARGETS = {"kmsg": fuzz_kmsg, "bus": fuzz_bus}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
