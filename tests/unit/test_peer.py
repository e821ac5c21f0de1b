"""ftd.agent.peer: the parsers of /proc (properties) and identify() over a /proc laid out in a directory."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ftd.agent.peer import (
    ProcFs,
    identify,
    parent_pid,
    parse_environ,
    peer_cred,
    pod_uid_from_cgroup,
    slurm_job_from_cgroup,
    slurmstepd_job,
)

TRUSTED = frozenset({0})
UID = 1000
POD = "1c2a3b4d-5e6f-4a1b-8c9d-0e1f2a3b4c5d"
segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12).filter(
    lambda s: "job_" not in s and "pod" not in s
)


def test_slurm_job_from_cgroup_v1_and_v2() -> None:
    v1 = "12:pids:/slurm/uid_1000/job_123/step_0/task_0\n4:memory:/slurm/uid_1000/job_123/step_0\n"
    v2 = "0::/system.slice/slurmstepd.scope/job_456/step_batch/user/task_0\n"
    assert slurm_job_from_cgroup(v1) == "123"
    assert slurm_job_from_cgroup(v2) == "456"
    assert slurm_job_from_cgroup("0::/user.slice/job_12x/a\n0::/\n") is None
    assert slurm_job_from_cgroup("4:memory:/process_api/13ee\n") is None


@given(
    st.integers(min_value=1, max_value=10**9), st.lists(segment, max_size=4), st.lists(segment, max_size=4)
)
def test_slurm_job_anywhere_in_the_path(job: int, before: list[str], after: list[str]) -> None:
    path = "/".join(["", *before, f"job_{job}", *after])
    assert slurm_job_from_cgroup(f"0::{path}\n") == str(job)
    assert slurm_job_from_cgroup(f"0::{'/'.join(['', *before, *after])}\n") is None


def test_pod_uid_from_both_cgroup_drivers() -> None:
    cgroupfs = f"0::/kubepods/burstable/pod{POD}/0123abcd\n"
    systemd = (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/x\n"
    )
    assert pod_uid_from_cgroup(cgroupfs) == POD
    assert pod_uid_from_cgroup(systemd) == POD
    assert pod_uid_from_cgroup(f"0::/user.slice/pod{POD}\n") is None  # not under kubepods


def test_slurmstepd_command_lines() -> None:
    assert slurmstepd_job(b"slurmstepd: [123.batch]\x00") == "123"
    assert slurmstepd_job(b"slurmstepd: [77.0]") == "77"
    assert slurmstepd_job(b"slurmstepd: [77.extern]") == "77"
    assert slurmstepd_job(b"python\x00slurmstepd: [1.batch]") is None
    assert slurmstepd_job(b"slurmstepd: [abc.batch]") is None


names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=10)
values = st.text(alphabet=st.characters(blacklist_characters="\x00", codec="utf-8"), max_size=20)


@given(st.dictionaries(names, values, max_size=8))
def test_parse_environ_round_trip(env: dict[str, str]) -> None:
    raw = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    assert parse_environ(raw) == env


@given(st.text(max_size=30), st.integers(min_value=0, max_value=2**22))
def test_parent_pid_survives_any_command_name(comm: str, ppid: int) -> None:
    assert parent_pid(f"42 ({comm}) S {ppid} 42 42 0 -1") == ppid


def test_peer_cred_of_a_real_socket_pair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        cred = peer_cred(a)
    assert cred is not None and (cred.pid, cred.uid, cred.gid) == (os.getpid(), os.getuid(), os.getgid())


# --- identify over a fake /proc --------------------------------------------------------------------


def make(root: Path, pid: int, ppid: int, *, cgroup: str = "0::/\n", cmdline: bytes = b"python\0",
         environ: bytes | None = b"", owner: int | None = None) -> None:  # fmt: skip
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (x) S {ppid} 1 1 0")
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(cmdline)
    (d / "status").write_text(f"Name:\tx\nNSpid:\t{pid}\n")
    if environ is not None:
        (d / "environ").write_bytes(environ)
    if owner is not None:
        os.chown(d, owner, owner)


def test_identify_prefers_the_job_cgroup(tmp_path: Path) -> None:
    make(tmp_path, 10, 1, cgroup="4:memory:/slurm/uid_1000/job_5/step_0\n", environ=b"SLURM_JOB_ID=6\0")
    ident = identify(10, UID, trusted_uids=TRUSTED, proc=ProcFs(tmp_path))
    assert (ident.source, ident.jobs, ident.any_job) == ("cgroup", frozenset({"5"}), False)


def test_identify_by_slurmstepd_ancestry_owned_by_root_only(tmp_path: Path) -> None:
    make(tmp_path, 20, 1, cmdline=b"slurmstepd: [7.batch]\0")
    make(tmp_path, 21, 20, cmdline=b"/bin/bash\0")
    make(tmp_path, 22, 21, environ=b"FTD_JOB=8\0")
    ident = identify(22, UID, trusted_uids=TRUSTED, proc=ProcFs(tmp_path))
    assert (ident.source, ident.jobs) == ("slurmstepd", frozenset({"7"}))
    # A user's own process named like a step daemon proves nothing.
    make(tmp_path, 30, 1, cmdline=b"slurmstepd: [9.batch]\0", owner=UID)
    make(tmp_path, 31, 30, environ=b"FTD_JOB=9\0", owner=UID)
    forged = identify(31, UID, trusted_uids=TRUSTED, proc=ProcFs(tmp_path))
    # ... and job 9 has no real slurmstepd here, so the environment (logged as such) is all there is.
    assert (forged.source, forged.jobs) == ("environ", frozenset({"9"}))


def test_identify_environ_refuses_a_slurm_job_running_here(tmp_path: Path) -> None:
    make(tmp_path, 20, 1, cmdline=b"slurmstepd: [7.batch]\0")
    make(tmp_path, 40, 1, environ=b"SLURM_JOB_ID=7\0FTD_JOB=7\0")
    ident = identify(40, UID, trusted_uids=TRUSTED, proc=ProcFs(tmp_path))
    assert ident.source == "environ" and ident.jobs == frozenset() and not ident.allows("7")
    assert "run under Slurm here" in ident.detail


def test_identify_pod_trusted_uid_and_unknown(tmp_path: Path) -> None:
    make(tmp_path, 50, 1, cgroup=f"0::/kubepods/besteffort/pod{POD}/c1\n", environ=b"FTD_JOB=train-a\0")
    pod = identify(50, 0, trusted_uids=TRUSTED, proc=ProcFs(tmp_path))  # even as root: the pod decides
    assert (pod.source, pod.jobs, pod.pod_uid, pod.any_job) == ("pod", frozenset({"train-a"}), POD, False)
    make(tmp_path, 60, 1)
    trusted = identify(60, 0, trusted_uids=TRUSTED, proc=ProcFs(tmp_path))
    assert trusted.source == "trusted_uid" and trusted.allows("anything")
    make(tmp_path, 70, 1, environ=None)
    unknown = identify(70, UID, trusted_uids=TRUSTED, proc=ProcFs(tmp_path))
    assert unknown.source == "unknown" and not unknown.jobs and "CAP_SYS_PTRACE" in unknown.detail
    assert identify(99999, UID, trusted_uids=TRUSTED, proc=ProcFs(tmp_path)).jobs == frozenset()
