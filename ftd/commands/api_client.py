"""How the commands that talk to a running coordinator find it, read its API and send it decisions.

What: :func:`add_target_options` gives a command ``--url``, ``--config`` and ``--timeout``;
:func:`target` resolves them into an :class:`ApiTarget` (base URL, where it came from, the config
when one was read): ``--url``, else ``http://{coordinator.api.host}:{port}`` from ``--config``, else
from ``$FTD_CONFIG``, else from the first of :data:`DEFAULT_CONFIGS` that exists. With none of them
it is a :class:`NoTarget` error naming what to pass: a command never silently reads whatever
listens on some local port. :meth:`ApiTarget.get` reads JSON; :meth:`ApiTarget.post` sends a
mutating call with ``Authorization: Bearer <token>``, the token from ``--token-file``, else the
config's ``coordinator.api.token_file`` (a relative name is the unit's credential: read from
``$CREDENTIALS_DIRECTORY`` when set, else from the config's directory, where the documented install
keeps it: ``/etc/ftd/api-token``). :func:`api_error` turns any failure into one line naming the URL and why.

Why stdlib ``urllib``: these commands must work from any login node with only the base install.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftd.config import Config

#: Where a coordinator's config lives when nothing else says (docs/operators.md's install).
DEFAULT_CONFIGS = ("/etc/ftd/coordinator.toml",)
CONFIG_ENV = "FTD_CONFIG"


class NoTarget(Exception):
    """Nothing says which coordinator to talk to; the message says what to pass."""


class ApiFailure(Exception):
    """The API could not be reached or answered an error; the message names the URL and why."""


def add_target_options(parser: argparse.ArgumentParser, *, token: bool = False) -> None:
    parser.add_argument(
        "--url",
        help="coordinator API base URL (default: from --config, $FTD_CONFIG or /etc/ftd/coordinator.toml)",
    )
    parser.add_argument(
        "--config", metavar="PATH", help="coordinator TOML config (coordinator.api host, port, token_file)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout in seconds (default 5)")
    if token:
        parser.add_argument(
            "--token-file",
            metavar="PATH",
            help="API token file (default: the config's coordinator.api.token_file)",
        )


@dataclass(frozen=True)
class ApiTarget:
    url: str  # base URL, no trailing slash
    origin: str  # what said so: --url, --config PATH, $FTD_CONFIG, a default path
    config: Config | None
    timeout: float
    token_file: str | None = None
    config_path: str | None = None  # the config read, if any

    def get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=self.timeout) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ApiFailure(api_error(exc, self.url)) from None

    def post(self, path: str, body: dict[str, Any]) -> Any:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token()}"}
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ApiFailure(api_error(exc, self.url)) from None

    def token(self) -> str:
        """The bearer token (``--token-file``, else the config's ``coordinator.api.token_file``)."""
        from ftd.config import ConfigError, read_secret_file

        name = self.token_file
        option = "--token-file"
        if name is None and self.config is not None:
            name, option = self.config.coordinator.api.token_file, "coordinator.api.token_file"
            # A credential name (relative) outside the unit: the file beside the config, where the
            # documented install puts what LoadCredential= loads (/etc/ftd/api-token).
            outside_unit = not os.environ.get("CREDENTIALS_DIRECTORY")
            if name and not Path(name).is_absolute() and outside_unit and self.config_path is not None:
                name = str(Path(self.config_path).parent / name)
        if name is None:
            raise ApiFailure(
                "no API token: pass --token-file PATH, or --config with coordinator.api.token_file "
                "(the coordinator refuses decisions without the token)"
            )
        try:
            return read_secret_file(name, option).strip()
        except ConfigError as exc:
            raise ApiFailure(str(exc)) from None


def api_error(exc: BaseException, url: str) -> str:
    """One line: the HTTP status and the API's own ``error``, or why the API could not be reached."""
    if isinstance(exc, urllib.error.HTTPError):
        detail = ""
        with contextlib.suppress(ValueError, AttributeError, OSError):
            detail = str(json.loads(exc.read() or b"{}").get("error") or "")
        return f"{exc.url}: HTTP {exc.code} {exc.reason}" + (f": {detail}" if detail else "")
    reason = getattr(exc, "reason", exc)
    return f"cannot reach the coordinator API at {url}: {reason}"


def _from_config(path: str) -> tuple[str, Config]:
    from ftd.config import load_config

    config = load_config(path)
    api = config.coordinator.api
    host = "127.0.0.1" if api.host in ("0.0.0.0", "::") else api.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{api.port}", config


def target(args: argparse.Namespace, env: dict[str, str] | None = None) -> ApiTarget:
    """The coordinator ``args`` name (see the module docstring); ConfigError for a bad config."""
    env = dict(os.environ) if env is None else env
    timeout = float(getattr(args, "timeout", 5.0))
    token_file = getattr(args, "token_file", None)
    config: Config | None = None
    path = getattr(args, "config", None)
    origin = f"--config {path}"
    if path is None and not getattr(args, "url", None) and env.get(CONFIG_ENV):
        path, origin = env[CONFIG_ENV], f"${CONFIG_ENV} ({env[CONFIG_ENV]})"
    if path is None and not getattr(args, "url", None):
        path = next((p for p in DEFAULT_CONFIGS if Path(p).is_file()), None)
        origin = f"the default config {path}"
    if path is not None:
        url, config = _from_config(path)
    if getattr(args, "url", None):
        return ApiTarget(str(args.url).rstrip("/"), "--url", config, timeout, token_file, path)
    if path is None:
        raise NoTarget(
            "which coordinator? pass --config /etc/ftd/coordinator.toml (its coordinator.api address) or "
            f"--url http://HOST:8787, or set ${CONFIG_ENV}; no {' or '.join(DEFAULT_CONFIGS)} here"
        )
    return ApiTarget(url, origin, config, timeout, token_file, path)


def resolve(args: argparse.Namespace, command: str) -> ApiTarget | int:
    """:func:`target`, or exit code 2 with the problem printed (for a command's ``run``)."""
    import sys

    from ftd.config import ConfigError

    try:
        return target(args)
    except (ConfigError, NoTarget) as exc:
        print(f"ftd {command}: {exc}", file=sys.stderr)
        return 2
