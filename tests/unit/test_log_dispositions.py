"""Restart or stop (issue #23 part 3): the training-log signatures of failures that would fail again,
their regexes (right lines, wrong lines, linear time, never a crash) and the rule that stops such a
job at once instead of restarting it into a loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.catalog.log_patterns import LogPattern, dispositions, load_patterns, parse_patterns
from ftd.cli import main
from ftd.events import Event, Kind, make_event
from ftd.rules import app_faults
from ftd.testing import evaluate_rule, view_with
from tests.properties import examples

PATTERNS = load_patterns()
STOPS = sorted(dispositions())
SCENARIOS = Path(__file__).resolve().parents[1] / "replay" / "scenarios"


def first_match(line: str) -> str | None:
    """The pattern the log watcher gives a line: the first that matches."""
    return next((p.name for p in PATTERNS if p.regex.search(line)), None)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ValueError: invalid config option pipeline_stages_per_node", "config_error"),
        ("omegaconf.errors.ConfigAttributeError: Missing key optimizer", "config_error"),
        ("train.py: error: unrecognized arguments: --lr-warmup 10", "config_error"),
        ("ValueError: invalid argument: micro_batch_size must be positive", "argument_error"),
        ("ModuleNotFoundError: No module named 'apex'", "import_error"),
        ("FileNotFoundError: shard '/data/s7.bin' missing (No such file or directory)", "path_not_found"),
        ("checkpoint format version mismatch: saved by 0.9, read by 1.2", "checkpoint_mismatch"),
        (
            "RuntimeError: Error(s) in loading state_dict for GPT: Missing key(s) in state_dict: 'x'",
            "checkpoint_mismatch",
        ),
        ("size mismatch for embed.weight: copying a param with shape [50304, 4096]", "shape_mismatch"),
        ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x4096 and 2048x4096)", "shape_mismatch"),
        ("iteration 1200 | lm loss: nan | grad norm: 12.1", "nan_or_inf"),
        ("loss: inf", "nan_or_inf"),
        ("gradient = NaN", "nan_or_inf"),
        ("block 17 (attention) produced a non-finite activation", "nan_or_inf"),
        (
            "slurmstepd: error: *** JOB 4242 ON gpu-a01 CANCELLED AT 2026-03-02T09:00:00 DUE TO TIME"
            " LIMIT ***",
            "time_limit",
        ),
        ("the scheduler ended our allocation: wall-time limit expired after 48h", "time_limit"),
        # what stays as it was: CUDA first, then the new signatures
        ("RuntimeError: CUDA error: invalid argument", "cuda_error"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
        ("OSError: [Errno 28] No space left on device", "disk_full"),
        # lines that look alike but are no failure
        ("INFO:gunicorn.error: booting worker with pid 4412", None),
        ("INFO loaded the checkpoint's metadata from step 1200", None),
        ("gradient health report every 50 steps: all finite", None),
        ("configured wall-time limit is 12:30:00", None),
        ("training has 45 minutes remaining before the time limit", None),
        ("loss: 2.3104 | infeasible steps skipped: 0", None),
        ("config loaded from /etc/train.yaml", None),
    ],
)
def test_each_signature_matches_its_lines_and_not_their_lookalikes(line: str, expected: str | None) -> None:
    assert first_match(line) == expected


def test_the_stop_signatures_are_the_catalogs_and_the_restart_ones_keep_their_policy() -> None:
    assert STOPS == [
        "argument_error",
        "checkpoint_mismatch",
        "config_error",
        "import_error",
        "nan_or_inf",
        "path_not_found",
        "shape_mismatch",
        "time_limit",
    ]
    assert "cuda_oom" not in dispositions()  # an OOM may be fragmentation: the crash-loop policy decides


def test_a_table_with_a_bad_disposition_is_refused_with_the_entry_named() -> None:
    table = '[[pattern]]\nname = "x"\nregex = "x"\ndisposition = "retry"\n'
    with pytest.raises(ValueError, match=r"pattern\[0\] \(x\): disposition must be one of restart, stop"):
        parse_patterns(table, "t.toml")


@settings(max_examples=examples(200))
@given(st.text(max_size=300))
def test_no_signature_regex_raises_on_any_text(text: str) -> None:
    for pattern in PATTERNS:
        if pattern.name in STOPS:
            pattern.regex.search(text)


@settings(max_examples=examples(100))
@given(st.sampled_from(STOPS), st.text(alphabet=" \t:=-", max_size=40), st.text(max_size=40))
def test_a_signature_line_is_found_whatever_surrounds_it(name: str, pad: str, tail: str) -> None:
    line = {
        "config_error": "invalid configuration",
        "argument_error": "ValueError: invalid value",
        "import_error": "ImportError: cannot import name 'x'",
        "path_not_found": "No such file or directory",
        "checkpoint_mismatch": "incompatible checkpoint",
        "shape_mismatch": "shape mismatch",
        "nan_or_inf": "loss = nan",
        "time_limit": "time limit exceeded",
    }[name]
    pattern = next(p for p in PATTERNS if p.name == name)
    assert pattern.regex.search(f"[rank3]:{pad}{line}{pad} {tail}")


NEEDLED = [p for p in PATTERNS if p.needles]


@pytest.mark.parametrize("pattern", NEEDLED, ids=[p.name for p in NEEDLED])
def test_every_match_of_a_pattern_holds_one_of_its_needles(pattern: LogPattern) -> None:
    """The needles only skip lines the regex would not match: whatever the regex matches (Hypothesis
    writes matching strings from the regex itself) contains one of them."""

    @settings(max_examples=examples(300), deadline=None)
    @given(st.from_regex(pattern.regex))
    def check(line: str) -> None:
        low = line.lower()
        assert any(n in low for n in pattern.needles), line

    check()


def test_the_needles_pass_over_nccl_info_lines() -> None:
    info = "gpu-a01:1234:1300 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"
    assert [p.name for p in NEEDLED if any(n in info.lower() for n in p.needles)] == []


# Linear time: tests/unit/test_kmsg_linear.py times every row of the table on 64 KiB adversarial
# lines built from each pattern (the conformance suite's test), these included.


# --- the rule --------------------------------------------------------------------------------------


def line_event(node: str, pattern: str, text: str, ts: float, **extra: object) -> Event:
    data = {"file": f"/logs/{node}.out", "line": 7, "offset": 700, "pattern": pattern, "text": text, **extra}
    return make_event(node, Kind.LOG_PATTERN, severity="error", source="logs", data=data, ts=ts)


def test_a_config_error_stops_the_job_at_once_with_its_evidence_and_notifies_once() -> None:
    view = view_with(jobs={"j1": ["n1", "n2"]})
    text = "ValueError: invalid config option pipeline_stages_per_node"
    events = [line_event("n1", "config_error", text, 100.0), line_event("n2", "config_error", text, 100.4)]
    actions = evaluate_rule(app_faults, events, view)
    assert [(a.kind, a.target) for a in actions] == [("checkpoint_restart", "j1"), ("notify", "n1")]
    stop, note = actions
    assert stop.params["save"] is False and stop.params["requeue"] is False
    assert stop.params["signature"] == "log config_error" and stop.params["line"] == text
    assert stop.params["file"] == "/logs/n1.out" and "delay_s" not in stop.params
    assert "would fail again" in stop.reason and text in stop.reason
    assert note.params["job"] == "j1" and text in note.reason


def test_it_stops_again_when_the_resubmitted_job_fails_the_same_way_never_restarts() -> None:
    view = view_with(jobs={"j1": ["n1"]})
    text = "checkpoint format version mismatch: saved by 0.9, read by 1.2"
    events = [line_event("n1", "checkpoint_mismatch", text, t) for t in (100.0, 900.0, 1700.0, 2500.0)]
    actions = evaluate_rule(app_faults, events, view)
    kinds = [(a.kind, a.params.get("requeue")) for a in actions if a.kind == "checkpoint_restart"]
    assert kinds == [("checkpoint_restart", False)] * 4  # four stops, not three restarts and a notify


def test_an_operators_table_can_say_restart_or_stop_in_the_event() -> None:
    view = view_with(jobs={"j1": ["n1"]})
    own = line_event("n1", "site_license_error", "license server refused", 100.0, disposition="stop")
    [stop, _] = evaluate_rule(app_faults, own, view)
    assert stop.params["requeue"] is False
    soft = line_event("n1", "nan_or_inf", "loss: nan", 200.0, disposition="restart")
    assert evaluate_rule(app_faults, soft, view) == []  # not an application pattern it restarts


def test_the_replayed_reasons_say_stop_and_no_save(capsys: pytest.CaptureFixture[str]) -> None:
    """What ``ftd rules test`` shows an operator: the signature and line of a stop, the missing save."""
    for name, jobs, needle in (
        ("app_config_error", ["48300=gpu-d01,gpu-d02", "48301=gpu-d03", "48302=gpu-d04"], "would fail again"),
        ("save_readonly", ["48500=gpu-f01,gpu-f02"], "no save: the checkpoint directory of job 48500"),
    ):
        argv = ["rules", "test", "--events", str(SCENARIOS / f"{name}.jsonl"), "--json", "--no-entry-points"]
        for job in jobs:
            argv += ["--job", job]
        assert main(argv) == 0
        doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert needle in doc["actions"][0]["reason"], doc["actions"][0]["reason"]
