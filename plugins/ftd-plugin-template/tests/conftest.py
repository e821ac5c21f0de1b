"""Make the template's package importable without installing it.

``make test`` collects these tests from the repository root (``testpaths`` in ftd's pyproject.toml),
and ``pytest plugins/ftd-plugin-template/tests`` runs them alone; neither installs the template, so
its ``src/`` goes on ``sys.path`` here. A copy of the template that is ``pip install``-ed imports the
installed package first only if that comes earlier on the path: delete this file in your copy once
you test the installed package.
"""

from __future__ import annotations

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)
