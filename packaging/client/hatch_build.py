"""Build hooks of ftd-daemon-client: one version and one copy of ``ftd/client`` (and of the rank
supervisor, ``ftd/supervisor``) for both builds.

From the repository (``make dist``) the sources are ``../../ftd``; from the sdist they are the sdist's
own ``ftd/`` (put there by the sdist build). The wheel gets ``ftd/client`` and ``ftd/supervisor`` only, never
``ftd/__init__.py``: installed beside nothing else, ``ftd`` is a namespace package.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface


def _sources(root: str) -> Path:
    here = Path(root)
    for candidate in (here / ".." / ".." / "ftd", here / "ftd"):
        if (candidate / "client" / "__init__.py").is_file():
            return candidate.resolve()
    raise FileNotFoundError("ftd/client not found beside the build (../../ftd or ./ftd)")


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict[str, Any]) -> None:
        text = (_sources(self.root) / "__init__.py").read_text()
        match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
        if match is None:
            raise ValueError("no __version__ in ftd/__init__.py")
        metadata["version"] = match.group(1)


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        sources = _sources(self.root)
        build_data["force_include"][str(sources / "client")] = "ftd/client"
        # The rank supervisor (python -m ftd.supervisor, issue #24): stdlib + the client, like it.
        build_data["force_include"][str(sources / "supervisor")] = "ftd/supervisor"
        if self.target_name == "sdist":
            build_data["force_include"][str(sources / "__init__.py")] = "ftd/__init__.py"
