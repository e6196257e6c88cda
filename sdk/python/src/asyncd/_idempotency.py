"""Idempotency keys derived from payload fields; the Go SDK derives the same keys."""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal
from typing import Any, List


def idempotency_key_from(task_type: str, payload: Any, *fields: str) -> str:
    """Derives an idempotency key from the task type and the named top-level fields of
    ``payload`` (the whole payload when no field is named), so that resubmitting the
    same logical task — after a timeout, a crash, a redelivered message — yields the
    same key and asyncd keeps only the first task.

    The key is the hex SHA-256 of the canonical JSON (see :func:`canonical_json`) of
    ``[task_type, selection]``, selection being ``{field: value, ...}``. It equals Go's
    ``asyncd.IdempotencyKeyFrom`` for the same JSON.
    """
    if not task_type:
        raise ValueError("an idempotency key needs a task type")
    value = _jsonable(payload)
    selection = value
    if fields:
        if not isinstance(value, dict):
            raise ValueError("idempotency key fields named, but the payload is not a JSON object")
        selection = {}
        for f in fields:
            if f not in value:
                raise ValueError(f"idempotency key field {f!r} is not in the payload")
            selection[f] = value[f]
    text = canonical_json([task_type, selection])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> str:
    """Canonical JSON: object keys sorted by code point, no whitespace, integral numbers
    as plain integers (42.0 is 42), other numbers as the shortest round-trip float in
    exponent form (1.5e-07), strings escaped only where JSON requires it."""
    out: List[str] = []
    _write(out, _jsonable(value))
    return "".join(out)


def _jsonable(value: Any) -> Any:
    # A JSON round trip turns tuples into lists and refuses what JSON cannot carry,
    # so the hash covers exactly what would be submitted.
    return json.loads(json.dumps(value, allow_nan=False))


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _write(out: List[str], v: Any) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, str):
        _write_str(out, v)
    elif isinstance(v, int):
        out.append(str(v))
    elif isinstance(v, float):
        out.append(_float(v))
    elif isinstance(v, list):
        out.append("[")
        for i, e in enumerate(v):
            if i:
                out.append(",")
            _write(out, e)
        out.append("]")
    elif isinstance(v, dict):
        out.append("{")
        for i, k in enumerate(sorted(v)):
            if i:
                out.append(",")
            _write_str(out, k)
            out.append(":")
            _write(out, v[k])
        out.append("}")
    else:  # pragma: no cover - _jsonable leaves nothing else
        raise TypeError(f"cannot canonicalize {type(v).__name__}")


def _write_str(out: List[str], s: str) -> None:
    out.append('"')
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')


def _float(f: float) -> str:
    if math.isinf(f) or math.isnan(f):
        raise ValueError("JSON has no infinity or NaN")
    if f.is_integer():
        return str(int(f))
    # repr gives the shortest digits that round-trip; rewrite them in the exponent
    # form Go's strconv.FormatFloat(f, 'e', -1, 64) uses.
    sign, digits, exp = Decimal(repr(f)).as_tuple()
    ds = list(digits)
    while len(ds) > 1 and ds[-1] == 0:
        ds.pop()
        exp += 1  # type: ignore[operator]
    sci = int(exp) + len(ds) - 1
    mant = str(ds[0]) + ("." + "".join(map(str, ds[1:])) if len(ds) > 1 else "")
    return f"{'-' if sign else ''}{mant}e{'-' if sci < 0 else '+'}{abs(sci):02d}"
