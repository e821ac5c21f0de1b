"""Reading a request and writing an answer: JSON responses, and path, query and body validation.

Every problem with a request becomes an :class:`ApiError` (status, sentence naming the field); the
application's error middleware turns it into ``{"error": ...}`` with that status.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from ftd.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")

# Helpers


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


_encoder = msgspec.json.Encoder()


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=_encoder.encode(data), status=status, content_type="application/json", headers=headers
    )


def validation_message(exc: msgspec.DecodeError, where: str) -> str:
    text = str(exc)
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return f"{where}: not valid JSON ({text})"
    text = re.sub(r"\$\.?", "", text)  # "Expected `int`, got `str` - at `$.limit`" -> "... at `limit`"
    return f"{where}: {text}"


def path_param(request: web.Request, name: str, type_: Any) -> Any:
    value = request.match_info[name]
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError:
        raise ApiError(400, f"path parameter {name!r}: {value[:80]!r} is not a valid {name}") from None


def read_query(request: web.Request, type_: type[T]) -> T:
    data: dict[str, str] = {}
    for key in request.query:
        values = request.query.getall(key)
        if len(values) > 1:
            raise ApiError(400, f"query parameter {key!r} given {len(values)} times")
        data[key] = values[0]
    try:
        query = msgspec.convert(data, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise ApiError(400, validation_message(exc, "query")) from None
    # Lax conversion reads the text "null" as None for an optional parameter: a parameter that is
    # given must have a value (``?state=null`` is not "no state filter").
    for key in data:
        if getattr(query, key, "") is None:
            raise ApiError(400, f"query parameter {key!r}: {data[key]!r} is not a value")
    return query


async def read_body(request: web.Request, type_: type[T], *, required: bool) -> T:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise ApiError(400, "request body: a JSON object is required")
        raw = b"{}"
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.DecodeError as exc:
        raise ApiError(400, validation_message(exc, "request body")) from None
