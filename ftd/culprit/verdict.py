"""One verdict from a job's hang evidence: *these ranks on these nodes are the culprit*, *job-wide*, or
*unknown* -- and confident only when acting on it (excluding a node) is safe.

Each source of evidence makes at most one claim (a set of ranks, or of nodes, it names), strong or weak:

===================  ======  ==========================================================================
source               weight  claim
===================  ======  ==========================================================================
``process_state``    strong  ranks stopped (SIGSTOP, a debugger), zombie or gone, when they are at most
                             half of the ranks whose state is known and the others (where their stacks
                             are known) wait inside a collective; weak when the others do not
``flight_recorder``  strong  per process group, the ranks whose last issued collective seq is behind the
                             highest any rank issued there (they never reached the collective the
                             others wait in), when they are no more than the ranks ahead; weak when
                             most ranks are behind one (that one may have issued a stray collective)
``stacks``           strong  the ranks whose main thread is *outside* collective communication while the
                             rest wait *inside* one, when they are no more than those inside (with 2
                             ranks, one out and one in is enough); weak otherwise, and weak for a
                             minority waiting in a different collective than the rest (stopped, zombie
                             and gone ranks left out of that count: their stacks are where they froze)
``stacks``           --      every rank outside, all in the same frame: the *job-wide* claim (a shared
                             file system that does not answer, a data loader, a deadlock)
``ras``              weak    the ranks NCCL RAS reports missing: its processes missing or dead
                             (:mod:`ftd.culprit.ras`), mapped to ranks by pid (and node, where pids
                             repeat)
``peer_error``       weak    the nodes (ranks, where known) that other ranks' errors name by address
``last_step``        weak    the ranks whose last reported step is behind the others'
``heartbeat``        weak    the ranks whose last heartbeat is more than 3 times, and 10 s, older
                             than the median rank's (a client's heartbeat thread beats on in a
                             collective; a stopped or dead process's does not)
``unanswered``       weak    nodes that did not answer the collection at all (never enough alone)
===================  ======  ==========================================================================

The fusion:

1. The claims are compared at the rank level, or at the node level for a claim that names only nodes.
   When all of them agree and at least one is strong, the verdict is *culprit*, **confident**.
2. Claims that agree but are all weak: *culprit*, not confident (it is said, nothing acts on it).
3. Claims that disagree: *unknown*, not confident, every claim kept in ``evidence``.
4. Culprits spread over more than half of the job's nodes (and more than one) are not a node fault:
   *job-wide* when the stacks say so, else *unknown*; never confident about a node.
5. No culprit claim and every rank outside in one frame: *job-wide*, confident when every expected rank
   answered with a stack. Everyone inside the same collective at the same seq, and nothing else
   naming anyone: *unknown* ("everyone waits in the same collective").

``why`` is one sentence, ``culprit_nodes`` the nodes of the culprit ranks (or the named nodes),
``unanswered`` the nodes and ranks nobody could look at, ``tree`` the merged main-thread stacks and
``errors`` the bad input met (cut stacks, refused dumps), bounded.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable

import msgspec

from ftd.culprit import stacks as st
from ftd.culprit.evidence import EvidenceItem, JobEvidence, RankEvidence, TreeNode, Verdict, VerdictKind
from ftd.culprit.flight import last_enqueued
from ftd.culprit.ras import RasProcess

MAX_EVIDENCE = 256  # evidence items kept in a verdict
MAX_ERRORS = 64  # error lines kept in a verdict
STALE_BEAT_S = 10.0  # a heartbeat this much older than the median one (and 3 times as old) is stale
_BAD_STATES = ("stopped", "zombie", "gone")
_SOURCE_NAMES = {
    "process_state": "the process states",
    "flight_recorder": "the flight recorder",
    "stacks": "the stacks",
    "ras": "NCCL RAS",
    "peer_error": "peer connection errors",
    "last_step": "the last steps",
    "heartbeat": "the heartbeats",
    "unanswered": "the silent nodes",
}


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """What one source says: the ranks (or only nodes) it names, how strongly, in one phrase."""

    source: str
    strong: bool
    ranks: frozenset[int] = frozenset()
    nodes: frozenset[str] = frozenset()  # for a claim that names only nodes (no ranks known)
    says: str


class _Job:
    """The evidence indexed by rank."""

    def __init__(self, evidence: JobEvidence) -> None:
        self.evidence = evidence
        self.ranks: dict[int, RankEvidence] = {}
        self.node_of: dict[int, str] = {}
        for node, ranks in evidence.expected.items():
            for rank in ranks:
                self.node_of[rank] = node
        for node_evidence in evidence.nodes.values():
            for rank_evidence in node_evidence.ranks:
                self.ranks[rank_evidence.rank] = rank_evidence
                self.node_of.setdefault(rank_evidence.rank, rank_evidence.node or node_evidence.node)
        self.job_nodes = set(evidence.expected) | set(evidence.nodes) | set(evidence.unanswered_nodes)
        self.threads = {
            rank: thread
            for rank, r in self.ranks.items()
            if r.answered and (thread := st.main_thread(r.stacks)) is not None and thread.frames
        }
        self.inside = {rank for rank, thread in self.threads.items() if st.in_collective(thread)}
        self.outside = set(self.threads) - self.inside

    def nodes_of(self, ranks: Iterable[int]) -> list[str]:
        return sorted({self.node_of[r] for r in ranks if r in self.node_of})

    def who(self, ranks: Iterable[int]) -> str:
        ordered = sorted(ranks)
        nodes = self.nodes_of(ordered)
        where = f" on {', '.join(nodes)}" if nodes else ""
        return f"{st.ranks_text(ordered)}{where}"


def _is(ranks: Iterable[int]) -> str:
    return "is" if len(set(ranks)) == 1 else "are"


def _process_state(job: _Job) -> Claim | None:
    known = {rank: r.state for rank, r in job.ranks.items() if r.answered and r.state != "unknown"}
    bad = {rank for rank, state in known.items() if state in _BAD_STATES}
    if not bad or len(bad) == len(known) or len(bad) * 2 > len(known):
        return None
    others = set(known) - bad
    others_seen = others & set(job.threads)
    strong = not others_seen or others_seen <= job.inside
    states = Counter(known[r] for r in bad)
    what = " and ".join(f"{state}" for state in sorted(states))
    if not others_seen:
        rest = "the others are alive"
    elif strong:
        rest = "the others wait inside a collective"
    else:
        rest = "the others are not all in a collective"
    return Claim(
        source="process_state",
        strong=strong,
        ranks=frozenset(bad),
        says=f"{job.who(bad)} {'is' if len(bad) == 1 else 'are'} {what} while {rest}",
    )


def _flight(job: _Job) -> Claim | None:
    per_pg: dict[str, dict[int, int]] = {}
    for rank, r in job.ranks.items():
        if r.flight is None:
            continue
        for pg, seq in last_enqueued(r.flight).items():
            per_pg.setdefault(pg, {})[rank] = seq
    behind: set[int] = set()
    recorded: set[int] = set()
    detail = ""
    for pg in sorted(per_pg):
        seqs = per_pg[pg]
        if len(seqs) < 2:
            continue
        recorded |= set(seqs)
        top = max(seqs.values())
        late = {rank for rank, seq in seqs.items() if seq < top}
        if late:
            behind |= late
            if not detail:
                low = min(seqs[r] for r in late)
                detail = f" (process group {pg}: at collective {low} while others issued {top})"
    if not behind:
        return None
    return Claim(
        source="flight_recorder",
        strong=len(behind) * 2 <= len(recorded),  # behind the others: no more than those ahead
        ranks=frozenset(behind),
        says=f"{job.who(behind)} {_is(behind)} behind in the collective sequence{detail}",
    )


def _stacks(job: _Job) -> tuple[Claim | None, str | None]:
    """The stacks' culprit claim, and the one frame every rank stands in when all are outside."""
    if len(job.threads) < 2:
        return None, None
    inside, outside = job.inside, job.outside
    if inside and outside:
        strong = len(outside) <= len(inside)
        places = Counter(st.place(job.threads[r]) for r in outside)
        where = places.most_common(1)[0][0]
        return (
            Claim(
                source="stacks",
                strong=strong,
                ranks=frozenset(outside),
                says=(
                    f"{job.who(outside)} {'is' if len(outside) == 1 else 'are'} outside any collective "
                    f"(in {where}) while {len(inside)} other{'s' if len(inside) != 1 else ''} wait inside one"
                ),
            ),
            None,
        )
    if outside:
        spots = {st.place(job.threads[r]) for r in outside}
        return None, (spots.pop() if len(spots) == 1 else None)
    groups: dict[str, set[int]] = {}
    for rank in inside - _frozen(job):  # a stopped rank's stack is where it froze, not where it waits
        groups.setdefault(st.collective(job.threads[rank]) or "?", set()).add(rank)
    if len(groups) > 1:
        ordered = sorted(groups.values(), key=len)
        if len(ordered[0]) < len(ordered[-1]):
            minority: set[int] = set().union(*ordered[:-1])
            return (
                Claim(
                    source="stacks",
                    strong=False,
                    ranks=frozenset(minority),
                    says=f"{job.who(minority)} {_is(minority)} in another collective than the rest",
                ),
                None,
            )
    return None, None


def _frozen(job: _Job) -> set[int]:
    """Ranks whose process is stopped, a zombie or gone: their stacks say where they froze, not where they
    wait, so they are no part of which collective the waiting ranks are in."""
    return {rank for rank, r in job.ranks.items() if r.answered and r.state in _BAD_STATES}


def _ras(job: _Job) -> Claim | None:
    missing: set[int] = set()
    by_pid: dict[int, list[RankEvidence]] = {}
    for r in job.ranks.values():
        if r.pid is not None:
            by_pid.setdefault(r.pid, []).append(r)
    for node in job.evidence.nodes.values():
        if node.ras is not None and node.ras.answered:
            missing |= set(node.ras.missing_ranks)
            named = (_rank_of(proc, by_pid, job) for proc in node.ras.missing)
            missing |= {rank for rank in named if rank is not None}
    if not missing:
        return None
    return Claim(
        source="ras", strong=False, ranks=frozenset(missing), says=f"NCCL RAS misses {job.who(missing)}"
    )


def _rank_of(proc: RasProcess, by_pid: dict[int, list[RankEvidence]], job: _Job) -> int | None:
    """The job's rank a process RAS names is: the one rank with that pid, or, where pids repeat across
    nodes, the one on the node RAS printed (its name, or a name that starts with it and a dot); None
    when it cannot be told (a process of no rank we know, an address for a repeated pid)."""
    ranks = by_pid.get(proc.pid, [])
    if len(ranks) > 1:
        host = proc.host.lower()
        ranks = [
            r
            for r in ranks
            if (node := (r.node or job.node_of.get(r.rank) or "").lower())
            and (host == node or host.startswith(node + ".") or node.startswith(host + "."))
        ]
    return ranks[0].rank if len(ranks) == 1 else None


def _peers(job: _Job) -> Claim | None:
    ranks: set[int] = set()
    nodes: set[str] = set()
    for blame in job.evidence.peer_blames:
        if blame.node is None:
            continue
        nodes.add(blame.node)
        if blame.rank is not None:
            ranks.add(blame.rank)
    if not nodes:
        return None
    names = ", ".join(sorted(nodes))
    if ranks and set(job.nodes_of(ranks)) == nodes:
        return Claim(
            source="peer_error",
            strong=False,
            ranks=frozenset(ranks),
            says=f"other ranks' connection errors name {job.who(ranks)}",
        )
    return Claim(
        source="peer_error",
        strong=False,
        nodes=frozenset(nodes),
        says=f"other ranks' connection errors name {names}",
    )


def _last_step(job: _Job) -> Claim | None:
    steps = {rank: r.last_step for rank, r in job.ranks.items() if r.last_step is not None}
    if len(steps) < 2:
        return None
    top = max(steps.values())
    late = {rank for rank, step in steps.items() if step < top}
    if not late or len(late) * 2 > len(steps):
        return None
    return Claim(
        source="last_step",
        strong=False,
        ranks=frozenset(late),
        says=f"{job.who(late)} reported an older step than the others' {top}",
    )


def _heartbeat(job: _Job) -> Claim | None:
    """Ranks whose last heartbeat is far older than the others' (a client's heartbeat thread goes on
    beating while its rank waits in a collective; a stopped or dead process's does not)."""
    ages = {rank: r.beat_age_s for rank, r in job.ranks.items() if r.beat_age_s is not None}
    if len(ages) < 2:
        return None
    median = statistics.median(ages.values())
    limit = max(3 * median, median + STALE_BEAT_S)
    stale = {rank for rank, age in ages.items() if age > limit}
    if not stale or len(stale) * 2 > len(ages):
        return None
    return Claim(
        source="heartbeat",
        strong=False,
        ranks=frozenset(stale),
        says=f"{job.who(stale)} stopped sending heartbeats long before the others ({median:.0f} s ago)",
    )


def _unanswered(job: _Job) -> tuple[Claim | None, list[str]]:
    unanswered = sorted(set(job.evidence.unanswered_nodes))
    lines = list(unanswered)
    for node, ranks in sorted(job.evidence.expected.items()):
        if node in unanswered:
            continue
        for rank in ranks:
            r = job.ranks.get(rank)
            if r is None or not r.answered:
                lines.append(f"{node} rank {rank}")
    if not unanswered:
        return None, lines
    return (
        Claim(
            source="unanswered",
            strong=False,
            nodes=frozenset(unanswered),
            says=f"{', '.join(unanswered)} did not answer the collection",
        ),
        lines,
    )


def _nodes(claim: Claim, job: _Job) -> frozenset[str]:
    return claim.nodes if claim.nodes else frozenset(job.nodes_of(claim.ranks))


def _agree(claims: list[Claim], job: _Job) -> bool:
    with_ranks = [c.ranks for c in claims if c.ranks]
    if with_ranks and any(r != with_ranks[0] for r in with_ranks):
        return False
    node_sets = {_nodes(c, job) for c in claims}
    return len(node_sets) == 1


def _evidence(claims: list[Claim], job: _Job) -> list[EvidenceItem]:
    items: list[EvidenceItem] = []
    for claim in claims:
        if claim.ranks:
            for rank in sorted(claim.ranks):
                items.append(
                    EvidenceItem(source=claim.source, says=claim.says, node=job.node_of.get(rank), rank=rank)
                )
        elif claim.nodes:
            for node in sorted(claim.nodes):
                items.append(EvidenceItem(source=claim.source, says=claim.says, node=node))
        else:
            items.append(EvidenceItem(source=claim.source, says=claim.says))
    if job.inside and job.outside:
        items.append(
            EvidenceItem(
                source="stacks",
                says=f"{st.ranks_text(sorted(job.inside))} wait inside a collective",
                against=False,
            )
        )
    return items[:MAX_EVIDENCE]


def _errors(job: _Job) -> list[str]:
    out: list[str] = []
    for name, node in sorted(job.evidence.nodes.items()):
        out.extend(f"{name}: {source}: {why}" for source, why in sorted(node.errors.items()))
        for r in node.ranks:
            out.extend(f"{name} rank {r.rank}: {source}: {why}" for source, why in sorted(r.errors.items()))
    if len(out) > MAX_ERRORS:
        out = [*out[: MAX_ERRORS - 1], f"{len(out) - MAX_ERRORS + 1} more errors not listed"]
    return out


def fuse(evidence: JobEvidence) -> Verdict:
    """Draw one verdict from a job's evidence (the rules are in the module docstring). Never raises on
    odd evidence: a problem is said in ``errors`` and the verdict is *unknown*."""
    try:
        return _fuse(evidence)
    except Exception as exc:  # a verdict must come back, even from evidence no rule foresaw
        return Verdict(
            job=getattr(evidence, "job", ""),
            kind="unknown",
            confident=False,
            why="The evidence could not be read, so no culprit is named.",
            errors=[f"fuse failed: {type(exc).__name__}: {exc}"[:512]],
        )


class _Base(msgspec.Struct, frozen=True, kw_only=True):
    """What every verdict of one job carries whatever its kind."""

    job: str
    evidence: list[EvidenceItem]
    unanswered: list[str]
    tree: TreeNode | None
    errors: list[str]

    def verdict(
        self,
        kind: VerdictKind,
        why: str,
        *,
        confident: bool = False,
        ranks: list[int] | None = None,
        nodes: list[str] | None = None,
        first: EvidenceItem | None = None,
    ) -> Verdict:
        items = [first, *self.evidence] if first is not None else self.evidence
        return Verdict(
            job=self.job,
            kind=kind,
            confident=confident,
            why=why,
            culprit_ranks=ranks or [],
            culprit_nodes=nodes or [],
            evidence=items[:MAX_EVIDENCE],
            unanswered=self.unanswered,
            tree=self.tree,
            errors=self.errors,
        )


def _fuse(evidence: JobEvidence) -> Verdict:
    job = _Job(evidence)
    stack_claim, common_place = _stacks(job)
    unanswered_claim, unanswered = _unanswered(job)
    claims = [
        c
        for c in (
            _process_state(job),
            _flight(job),
            stack_claim,
            _ras(job),
            _peers(job),
            _last_step(job),
            _heartbeat(job),
            unanswered_claim,
        )
        if c is not None
    ]
    tree = (
        st.merge_tree({rank: r.stacks for rank, r in job.ranks.items() if r.answered}) if job.ranks else None
    )
    base = _Base(
        job=evidence.job,
        evidence=_evidence(claims, job),
        unanswered=unanswered,
        tree=tree,
        errors=_errors(job),
    )
    everyone_seen = bool(job.node_of) and set(job.node_of) <= set(job.threads)

    if common_place is not None and not any(c.strong for c in claims):
        says = f"every rank ({len(job.outside)}) is outside collective communication, all in {common_place}"
        return base.verdict(
            "job_wide",
            f"Job-wide: {says}, so no single node is to blame.",
            confident=everyone_seen and not claims,
            first=EvidenceItem(source="stacks", says=says),
        )
    if not claims:
        if job.threads and not job.outside and len(job.threads) >= 2:
            why = "Unknown: every rank waits in the same collective and no source names anyone."
        elif not job.ranks:
            why = "Unknown: no rank's evidence came back."
        else:
            why = "Unknown: no source of evidence names any rank or node."
        return base.verdict("unknown", why)
    if not _agree(claims, job):
        parts = "; ".join(f"{c.source}: {c.says}" for c in claims)
        return base.verdict("unknown", f"Unknown: the sources disagree ({parts}).")
    ranks = sorted(set().union(*(c.ranks for c in claims)))
    nodes = sorted(_nodes(claims[0], job))
    if len(nodes) > 1 and len(nodes) * 2 > len(job.job_nodes):
        kind: VerdictKind = "job_wide" if common_place is not None else "unknown"
        return base.verdict(
            kind,
            f"{'Job-wide' if kind == 'job_wide' else 'Unknown'}: the ranks named ({st.ranks_text(ranks)}) "
            f"span {len(nodes)} of {len(job.job_nodes)} nodes, which is no node fault.",
            ranks=ranks,
        )
    strong = [c for c in claims if c.strong]
    lead = strong[0] if strong else claims[0]
    others = [_SOURCE_NAMES.get(c.source, c.source) for c in claims if c is not lead]
    agree = f"; confirmed by {', '.join(others)}" if others else ""
    hedge = "" if strong else " (weak evidence only, so nothing acts on it)"
    return base.verdict(
        "culprit", f"Culprit{hedge}: {lead.says}{agree}.", confident=bool(strong), ranks=ranks, nodes=nodes
    )
