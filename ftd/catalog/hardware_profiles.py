"""Hardware profiles as data: which kind of node this is, and what each kind is expected to do.

What: :func:`load_hardware_catalog` reads ``hardware/profiles.toml`` (the profiles and how a node is
matched to one by its GPU name) and, per concern, ``hardware/<section>.toml`` (``fabric``: counter
thresholds and port rates; ``pair``: expected pair bandwidth; ``versions``: minimum driver and
firmware; ``burn_in``: expected throughput ...). :meth:`HardwareCatalog.section` answers one profile's
values of one section: the section's ``[default]`` table with the profile's own table laid over it.
An operator's TOML file adds profiles (``[profiles.NAME]``) and replaces values
(``[SECTION.PROFILE]``, ``[SECTION.default]``) without editing the package.

Why data: thresholds and expectations differ per hardware generation and per site, and an operator
must be able to read, diff and override them; the checks that use them stay code. An unknown profile
is ``None`` from :meth:`HardwareCatalog.section`, so a caller reports a skipped check with its reason
instead of judging against nothing.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["HardwareCatalog", "HardwareCatalogError", "HardwareProfile", "load_hardware_catalog"]

_PACKAGE = "ftd.catalog"
_DIR = "hardware"


class HardwareCatalogError(ValueError):
    """A profile or section file that does not parse or has the wrong shape; says which file and key."""


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    gpu_names: tuple[str, ...]


@dataclass(frozen=True)
class HardwareCatalog:
    """The profiles and their sections' values (defaults and overrides already merged per section)."""

    profiles: Mapping[str, HardwareProfile]
    sections: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)

    def profile_for_gpu(self, gpu_name: str) -> str | None:
        """The first profile one of whose ``gpu_names`` occurs in ``gpu_name`` (case-insensitive)."""
        wanted = gpu_name.casefold()
        for profile in self.profiles.values():
            if any(name.casefold() in wanted for name in profile.gpu_names):
                return profile.name
        return None

    def section(self, section: str, profile: str | None) -> Mapping[str, Any] | None:
        """``section``'s values for ``profile``: its ``default`` table overlaid with the profile's own.

        ``None`` when the profile is unknown (or ``None``): the caller skips the check and says why.
        A known profile without a table of its own gets the defaults (possibly empty).
        """
        if profile is None or profile not in self.profiles:
            return None
        tables = self.sections.get(section, {})
        return {**tables.get("default", {}), **tables.get(profile, {})}


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HardwareCatalogError(f"{where}: {exc}") from exc


def _profiles(table: Any, where: str) -> dict[str, HardwareProfile]:
    if not isinstance(table, dict):
        raise HardwareCatalogError(f"{where}: profiles: expected a table of profiles")
    out: dict[str, HardwareProfile] = {}
    for name, body in table.items():
        if not isinstance(body, dict):
            raise HardwareCatalogError(f"{where}: profiles.{name}: expected a table")
        names = body.get("gpu_names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise HardwareCatalogError(f"{where}: profiles.{name}.gpu_names: expected a list of names")
        description = body.get("description", "")
        if not isinstance(description, str):
            raise HardwareCatalogError(f"{where}: profiles.{name}.description: expected a string")
        out[name] = HardwareProfile(name=name, description=description, gpu_names=tuple(names))
    return out


def _section_tables(data: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    tables: dict[str, dict[str, Any]] = {}
    for profile, body in data.items():
        if not isinstance(body, dict):
            raise HardwareCatalogError(f"{where}: {profile}: expected a table")
        tables[profile] = body
    return tables


@functools.cache
def _packaged() -> tuple[dict[str, HardwareProfile], dict[str, dict[str, dict[str, Any]]]]:
    folder = resources.files(_PACKAGE).joinpath(_DIR)
    profiles_data = _parse(folder.joinpath("profiles.toml").read_text(encoding="utf-8"), "profiles.toml")
    profiles = _profiles(profiles_data.get("profiles", {}), "profiles.toml")
    sections: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".toml") and entry.name != "profiles.toml":
            data = _parse(entry.read_text(encoding="utf-8"), entry.name)
            sections[entry.name.removesuffix(".toml")] = _section_tables(data, entry.name)
    return profiles, sections


def load_hardware_catalog(overrides: Path | None = None) -> HardwareCatalog:
    """The packaged profiles and sections, with an operator's file (if any) laid over them."""
    profiles, sections = _packaged()
    profiles = dict(profiles)
    merged = {name: {p: dict(t) for p, t in tables.items()} for name, tables in sections.items()}
    if overrides is not None:
        where = str(overrides)
        try:
            text = overrides.read_text(encoding="utf-8")
        except OSError as exc:
            raise HardwareCatalogError(f"{where}: cannot read: {exc.strerror or exc}") from exc
        data = _parse(text, where)
        profiles.update(_profiles(data.pop("profiles", {}), where))
        data.pop("version", None)
        for section, body in data.items():
            if not isinstance(body, dict):
                raise HardwareCatalogError(f"{where}: {section}: expected a table of profiles")
            for profile, values in _section_tables(body, f"{where}: {section}").items():
                merged.setdefault(section, {}).setdefault(profile, {}).update(values)
    return HardwareCatalog(profiles=profiles, sections=merged)
