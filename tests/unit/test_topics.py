"""Topic builders and MQTT wildcard matching (checked against a brute-force reference)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftd.bus import topics

level = st.sampled_from(["a", "b", "node-1", "xid", ""])
topic_st = st.lists(level, min_size=1, max_size=5).map("/".join)
pattern_st = st.lists(st.sampled_from(["a", "b", "node-1", "xid", "", "+"]), min_size=1, max_size=5).flatmap(
    lambda ls: st.sampled_from(["/".join(ls), "/".join([*ls, "#"])])
)


def reference(pattern: str, topic: str) -> bool:
    """Straightforward recursive definition of MQTT 3.1.1 §4.7 matching."""

    def rec(p: list[str], t: list[str]) -> bool:
        if not p:
            return not t
        if p[0] == "#":
            return True
        if not t:
            return False
        return (p[0] == "+" or p[0] == t[0]) and rec(p[1:], t[1:])

    return rec(pattern.split("/"), topic.split("/"))


@given(pattern_st, topic_st)
def test_matching_agrees_with_reference(pattern: str, topic: str) -> None:
    assert topics.matches(pattern, topic) == reference(pattern, topic)


@given(topic_st)
def test_hash_matches_everything_and_exact_matches_itself(topic: str) -> None:
    assert topics.matches("#", topic)
    assert topics.matches(topic, topic)


def test_dollar_topics_are_not_matched_by_wildcards() -> None:
    assert not topics.matches("#", "$SYS/broker/uptime")
    assert not topics.matches("+/broker/uptime", "$SYS/broker/uptime")
    assert topics.matches("$SYS/#", "$SYS/broker/uptime")


def test_builders_and_subscription_patterns_agree() -> None:
    assert topics.matches(topics.ALL_NODE_EVENTS, topics.node_event("node-1", "xid"))
    assert topics.matches(topics.ALL_NODE_STATUS, topics.node_status("node-1"))
    assert topics.matches(topics.ALL_NODE_JOBS, topics.node_job("node-1", "1001"))
    assert topics.matches(topics.ALL_NODE_ACKS, topics.node_acks("node-1"))
    # A job's directives go to each node it runs on, never to a topic every node reads.
    assert topics.job_directives_for(["node-2", "node-1", "node-2"]) == [
        "ftd/v1/nodes/node-1/directives/jobs",
        "ftd/v1/nodes/node-2/directives/jobs",
    ]
    assert topics.job_directives_for([]) == []
    assert not topics.matches(topics.node_directives("node-1"), topics.node_job_directives("node-1"))
    assert not topics.matches(topics.ALL_NODE_JOBS, topics.node_job_directives("node-1"))
    assert not topics.matches(topics.ALL_NODE_EVENTS, topics.node_status("node-1"))
    assert topics.parse(topics.node_event("node-1", "xid")) == ("nodes", "node-1", "events", "xid")


@pytest.mark.parametrize("bad", ["", "a/b", "+", "#", "x#", "a\x00", "n" * 129])
def test_builders_reject_names_that_would_change_the_topic_structure(bad: str) -> None:
    with pytest.raises(topics.TopicError):
        topics.node_event(bad, "xid")


def test_parse_rejects_foreign_topics() -> None:
    with pytest.raises(topics.TopicError):
        topics.parse("other/v1/nodes/x/status")
