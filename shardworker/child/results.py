"""What a handler's or a step's result must be to be stored: JSON that PostgreSQL's jsonb
holds, within ``shardworker.core.limits.MAX_RESULT_BYTES``. Running the code again would compute
the same unstorable value, so the callers fail for good (a result) or fail the attempt (a step)."""

from __future__ import annotations

import orjson

from shardworker.core.limits import MAX_RESULT_BYTES
from shardworker.core.model import dumps_exact, has_non_finite


class Unstorable(ValueError):
    """Why a result cannot be stored, in one line."""


def storable_json(value: object) -> bytes:
    """``value`` as JSON in UTF-8 bytes (orjson's, carried as they are to PostgreSQL), or
    ``Unstorable`` saying why it cannot be stored."""
    try:
        encoded = dumps_exact(value)
    except orjson.JSONEncodeError as exc:
        raise Unstorable(f"result is not JSON-serializable: {exc}") from None
    if len(encoded) > MAX_RESULT_BYTES:
        raise Unstorable(f"result too large: {len(encoded)} bytes of JSON, the limit is {MAX_RESULT_BYTES} "
                         "(shardworker.core.limits.MAX_RESULT_BYTES)")
    if b"null" in encoded and has_non_finite(value):  # orjson writes nan and infinity as null
        raise Unstorable("result holds a float that is not a finite number (nan or infinity), which JSON cannot hold")
    if b"\\u0000" in encoded:
        raise Unstorable("result holds a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    return encoded
