"""The whole check of a config file, shared by ``ftd check-config`` and the daemons' start-up.

What: :func:`check_config_file` validates a file (through :mod:`ftd.config`) and checks what it
names for the daemons it serves: files, directories and secrets (:mod:`.references`), the pattern
table and the rules, each through the loader the daemon itself uses (:mod:`.rules`); problems are
gathered in one :class:`~.found.Found` (:mod:`.found`) and raised together.

Why a floor above :mod:`ftd.config`: checking what a file names means running the daemons' loaders
(the coordinator's rule loaders, the catalog's pattern table), and the config package sits below
every daemon, so it cannot import them. The commands that need the full check (``check-config``,
``agent``, ``coordinator``) live on this floor already.
"""

from __future__ import annotations

from ftd.commands.config_check.check import Checked, check_config_file, roles_in
from ftd.commands.config_check.references import ROLES, check_references, deferred_credentials

__all__ = ["ROLES", "Checked", "check_config_file", "check_references", "deferred_credentials", "roles_in"]
