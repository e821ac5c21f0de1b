"""The files, directories and rules a config names, checked as the daemon that uses them would.

What: :func:`check_references` returns a :class:`~ftd.config.errors.Problem` (at the option's
dotted path) for each one a daemon could not use:

- both daemons: ``bus.ca_file`` (loads as a CA bundle, when ``bus.tls``), ``bus.cert_file`` and
  ``bus.key_file`` (both or neither, with ``bus.tls``; readable; the pair loads; the certificate is
  valid now, not expired), ``bus.password_file`` (readable, not empty), and for an agent
  ``agent.pair_tests.key_file`` (likewise);
- the agent (role ``"agent"``): ``agent.kmsg_path`` (a readable character device, FIFO or file),
  ``agent.state_dir`` and the directory of ``agent.socket_path`` (writable, or creatable: the agent
  makes them), ``agent.socket_path`` itself (a socket if anything), ``agent.socket_group`` (a group
  name that exists here), ``agent.logs.patterns_file``
  (loads as a pattern table), every ``agent.fs.mounts[].path`` (``statvfs`` works). Followed logs
  (``agent.logs.paths``) are not checked: they appear when training starts;
- the coordinator (role ``"coordinator"``): the directory of ``coordinator.ledger_path``
  (writable or creatable) and the ledger file if it exists; every ``coordinator.rule_dirs`` entry
  (a readable directory, each rule file in it imports) and each ``coordinator.rules_file`` entry
  (a readable pack, or a directory of ``*.toml`` packs; every pack loads, every problem listed with
  its file; no rule name in two packs), through the coordinator's own loaders; the names in
  ``disabled_rules`` and ``policy.dry_run_rules`` (a rule must exist, or a typo leaves it enabled
  or acting for real); with ``scheduler = "slurm"`` the ``slurm.scontrol`` executable and
  ``slurm.slurm_conf``; with
  ``"kubernetes"`` its ``token_file`` and a ``ca_file`` set in the file (the in-cluster default may
  be absent: system CAs are used then); ``api.token_file`` (API enabled) and ``notify.url_file``;
  with a PostgreSQL ledger, the HA standby's login (``coordinator.ha.standby_cert_file`` and
  ``standby_key_file`` by the bus's rules, ``standby_password_file`` readable).

Secret files (``password_file``, ``token_file``, ``url_file``) are read with
:func:`~ftd.config.credentials.read_secret_file`, the daemons' own reader. A relative secret name is
resolved against ``$CREDENTIALS_DIRECTORY``, which systemd sets only inside the service: outside
it (``in_service=False``: ``ftd check-config``) such a name cannot be read; :func:`deferred_credentials`
lists them so the caller can say so, and the installed unit must load each as a credential from a
readable file (:mod:`.units`).

Why here: ``ftd check-config`` and both daemons' start-up run these same checks
(:mod:`.check`), so a file that passes the check does not stop a daemon, and a daemon that will not
start says why the way ``check-config`` does, every problem at once. Why above :mod:`ftd.config`:
the checks consult the daemons' own loaders (the log pattern table of :mod:`ftd.catalog`, the
coordinator's rule loaders in :mod:`.rules`), and the config package is a ground floor that every
daemon imports, so it must not import them back. The path tests themselves
(:mod:`ftd.config.paths`) and the secret reader stay with the config.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path

from ftd.catalog.hardware_profiles import HardwareCatalogError, load_hardware_catalog
from ftd.catalog.log_patterns import load_patterns
from ftd.commands.config_check.found import Found
from ftd.commands.config_check.rules import check_rules
from ftd.commands.config_check.units import unit_credential_problems
from ftd.config import paths
from ftd.config.credentials import STANDBY_OPTIONS, read_secret_file, standby_bus
from ftd.config.errors import ConfigError, Problem
from ftd.config.schema import BusConfig, Config, KubernetesConfig

__all__ = ["ROLES", "check_references", "deferred_credentials"]

#: The daemons a config serves; each checks the bus and its own section.
ROLES = ("agent", "coordinator")


def check_references(
    config: Config,
    *,
    roles: Iterable[str] = ROLES,
    in_service: bool = True,
    unknown: Collection[str] = (),
) -> list[Problem]:
    """Every problem with the files, directories and rules ``config`` names for ``roles`` (see the
    module docstring). ``in_service=False`` skips the relative secret names only the service can
    resolve (:func:`deferred_credentials`). ``unknown``: options whose value was invalid and left
    out (:func:`~ftd.config.validate.valid_part`); checks that depend on them are skipped."""
    found = Found(unknown)
    wanted = set(roles)
    bus = config.bus
    if bus.tls and bus.ca_file is not None:
        found.check("bus.ca_file", bus.ca_file, paths.ca_bundle_problem, "bus.tls")
    _client_certificate(bus, found, config.agent.resolved_node() if "agent" in wanted else None)
    if "agent" in wanted:
        _agent(config, found)
    if "coordinator" in wanted:
        standby, _ = standby_bus(config)
        if config.coordinator.ha.ledger == "postgresql" and standby is not None:
            at = {field: f"coordinator.ha.{option}" for option, field in STANDBY_OPTIONS.items()}
            _client_certificate(standby, found, None, lambda key: at.get(key, f"bus.{key}"))
        _coordinator(config, found)
        check_rules(config, found)
    if config.hardware.catalog and found.known("hardware.catalog"):
        found.check("hardware.catalog", config.hardware.catalog, _hardware_catalog_problem)
    deferred = set() if in_service else set(deferred_credentials(config, wanted))
    for option, name in _secrets(config, wanted):
        if option not in deferred and found.known(option):
            try:
                read_secret_file(name, option)
            except ConfigError as exc:
                found.problems.extend(exc.problems)
    if deferred:  # outside the service: the installed unit must provide them as credentials
        named = [(option, name) for option, name in _secrets(config, wanted) if option in deferred]
        found.problems.extend(unit_credential_problems(named, sorted(wanted)))
    order = {section: i for i, section in enumerate(("bus", *ROLES))}  # the tables' order in a file
    return sorted(found.problems, key=lambda p: order.get(p.path.split(".")[0], len(order)))


def _hardware_catalog_problem(path: str) -> str | None:
    """The operator's hardware catalog as both daemons load it: unreadable or malformed is a problem
    (its file and key), so a check that needs a profile is never judged against nothing."""
    try:
        load_hardware_catalog(Path(path))
    except HardwareCatalogError as exc:
        return str(exc)
    return None


def _client_certificate(
    bus: BusConfig, found: Found, node: str | None, option: Callable[[str], str] = "bus.{}".format
) -> None:
    """``bus.cert_file`` / ``bus.key_file`` (mutual TLS): both or neither, with ``tls``, each a
    readable file, and the pair loads as the daemon loads it (a key that does not match is named).
    For an agent (``node`` given) the certificate's CN must be the node name: the broker takes the CN
    as the identity its ACL grants ``ftd/v1/nodes/<CN>/...``, so any other CN silently drops every
    event the agent publishes. ``option(key)``: the dotted path problems are reported at (the HA
    standby's login is a ``BusConfig`` derived from ``coordinator.ha.standby_*``)."""
    if bus.cert_file is None and bus.key_file is None:
        return
    cert_option, key_option = option("cert_file"), option("key_file")
    for at, value, other, missing in (
        (cert_option, bus.cert_file, bus.key_file, key_option),
        (key_option, bus.key_file, bus.cert_file, cert_option),
    ):
        if value is not None and other is None:
            found.problems.append(Problem(at, f"is set but {missing} is not: mutual TLS needs both"))
        if value is not None and not bus.tls:
            found.problems.append(Problem(at, "is set but bus.tls is not true; set tls = true"))
    if not bus.tls or bus.cert_file is None or bus.key_file is None:
        return
    cert_ok = found.check(cert_option, bus.cert_file, paths.file_problem, "bus.tls")
    key_ok = found.check(key_option, bus.key_file, paths.file_problem, "bus.tls")
    if cert_ok and key_ok:
        import ssl  # not at module level: ``import ftd.config`` stays light

        try:
            ssl.create_default_context().load_cert_chain(bus.cert_file, bus.key_file)
        except (ssl.SSLError, OSError) as exc:
            reason = f"does not load with {key_option} {bus.key_file}: {exc}"
            found.problems.append(Problem(cert_option, reason))
            return
        if (invalid := _validity_problem(bus.cert_file)) is not None:
            found.problems.append(Problem(cert_option, invalid))
        cn = _common_name(bus.cert_file)
        if node is not None and cn is not None and cn != node and found.known("agent.node"):
            reason = f"its CN is {cn!r} but this agent's node is {node!r}: the broker would know it as {cn!r}"
            found.problems.append(Problem(cert_option, reason))


def _validity_problem(path: str, now: float | None = None) -> str | None:
    """Why the PEM certificate at ``path`` is not valid at ``now`` (expired, or not yet valid): the
    broker refuses the TLS handshake then, and the daemon never connects. None when valid or when
    its dates cannot be read that way (the load above already reported a certificate that does not
    parse)."""
    import ssl
    import time

    try:
        decoded = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
        not_before = ssl.cert_time_to_seconds(decoded["notBefore"])
        not_after = ssl.cert_time_to_seconds(decoded["notAfter"])
    except Exception:
        return None
    at = time.time() if now is None else now
    if at > not_after:
        return f"{path} expired on {decoded['notAfter']}: the broker refuses it (renew it)"
    if at < not_before:
        return f"{path} is not valid before {decoded['notBefore']} (check this host's clock)"
    return None


def _common_name(path: str) -> str | None:
    """The subject CN of the PEM certificate at ``path`` (None when it cannot be read that way)."""
    import ssl

    try:  # CPython's own PEM decoder (no third-party X.509 parser needed); private, hence guarded
        subject = ssl._ssl._test_decode_cert(path)["subject"]  # type: ignore[attr-defined]
    except Exception:
        return None
    names = [value for rdn in subject for key, value in rdn if key == "commonName"]
    return str(names[-1]) if names else None


def deferred_credentials(config: Config, roles: Iterable[str] = ROLES) -> list[str]:
    """The secret options whose relative name only resolves inside the service: set, relative, and
    ``$CREDENTIALS_DIRECTORY`` unset here."""
    if os.environ.get("CREDENTIALS_DIRECTORY"):
        return []
    return [
        option for option, name in _secrets(config, set(roles)) if not Path(name).expanduser().is_absolute()
    ]


def _secrets(config: Config, roles: Collection[str]) -> Iterator[tuple[str, str]]:
    """(option, file name) of each secret file the daemons of ``roles`` read."""
    if config.bus.password_file is not None:
        yield "bus.password_file", config.bus.password_file
    pair_tests = config.agent.pair_tests
    if "agent" in roles and pair_tests.enabled and pair_tests.key_file:
        yield "agent.pair_tests.key_file", pair_tests.key_file
    if "coordinator" in roles:
        coordinator = config.coordinator
        if coordinator.api.enabled and coordinator.api.token_file is not None:
            yield "coordinator.api.token_file", coordinator.api.token_file
        if coordinator.notify.url_file is not None:
            yield "coordinator.notify.url_file", coordinator.notify.url_file
        for i, dest in enumerate(coordinator.notify.destinations):
            if dest.url_file is not None:
                yield f"coordinator.notify.destinations[{i}].url_file", dest.url_file
        ha = coordinator.ha
        if ha.ledger == "postgresql" and ha.standby_password_file is not None:
            yield "coordinator.ha.standby_password_file", ha.standby_password_file


def _agent(config: Config, found: Found) -> None:
    agent = config.agent
    found.check("agent.kmsg_path", agent.kmsg_path, paths.kernel_log_problem)
    found.check("agent.state_dir", agent.state_dir, paths.writable_dir_problem)
    found.check("agent.socket_path", agent.socket_path, paths.socket_problem)
    if isinstance(agent.socket_group, str) and not agent.socket_group.isdecimal():
        found.check("agent.socket_group", agent.socket_group, _group_problem)
    patterns = agent.logs.patterns_file
    if patterns is not None and found.check("agent.logs.patterns_file", patterns, paths.file_problem):
        found.check("agent.logs.patterns_file", patterns, _patterns_problem)
    for i, mount in enumerate(agent.fs.mounts):
        found.check(f"agent.fs.mounts[{i}].path", mount.path, paths.statvfs_problem)


def _group_problem(group: str) -> str | None:
    """The agent chowns its socket to this group at start and stops when the name is unknown."""
    import grp

    try:
        grp.getgrnam(group)
    except KeyError:
        return f"no group named {group!r} on this host (create it: groupadd --system {group})"
    return None


def _patterns_problem(path: str) -> str | None:
    try:
        load_patterns(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return str(exc)
    return None


def _coordinator(config: Config, found: Found) -> None:
    cfg = config.coordinator
    found.check("coordinator.ledger_path", cfg.ledger_path, paths.database_problem)
    if cfg.scheduler == "slurm" and cfg.slurm.enabled:
        needs = ("coordinator.scheduler", "coordinator.slurm.enabled")
        found.check("coordinator.slurm.scontrol", cfg.slurm.scontrol, paths.command_problem, *needs)
        if cfg.slurm.slurm_conf is not None:
            found.check("coordinator.slurm.slurm_conf", cfg.slurm.slurm_conf, paths.file_problem, *needs)
    if cfg.scheduler == "kubernetes":
        kube = cfg.kubernetes
        if kube.token_file is not None:
            found.check("coordinator.kubernetes.token_file", kube.token_file, paths.file_problem)
        # the in-cluster default CA may be absent: the scheduler then uses the system CAs
        if kube.ca_file is not None and (
            kube.ca_file != KubernetesConfig().ca_file or Path(kube.ca_file).exists()
        ):
            found.check("coordinator.kubernetes.ca_file", kube.ca_file, paths.ca_bundle_problem)
