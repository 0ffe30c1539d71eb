"""Events (``shardworker.send_event``, ``job.send_event``, ``job.wait_event``): their keys and
payloads, checked the same way wherever one is made, before anything is sent.

A key is text of 1 to ``MAX_EVENT_KEY_BYTES`` bytes of UTF-8 that PostgreSQL can store; a
payload is any JSON value (None included) of at most ``MAX_EVENT_BYTES``, encoded as a step's
result is (every integer exact), since it is recorded as the step of each wait it ends.
"""

from __future__ import annotations

from typing import Any

from shardworker.core.limits import MAX_EVENT_BYTES, MAX_EVENT_KEY_BYTES, not_storable_text, too_long
from shardworker.core.model import dumps_exact, has_non_finite
from shardworker.errors import EventError


def check_key(key: Any) -> str:
    """``key`` when it can name events; ``EventError`` saying why not."""
    if not isinstance(key, str) or not key:
        raise EventError(f"an event key must be a non-empty string, not {key!r:.80}")
    why = too_long("event key", key, MAX_EVENT_KEY_BYTES) or not_storable_text("event key", key)
    if why:
        raise EventError(why)
    return key


def payload_json(payload: Any) -> bytes:
    """``payload`` as JSON in UTF-8 bytes; ``EventError`` when it is not JSON PostgreSQL can
    store, or over ``MAX_EVENT_BYTES``."""
    try:
        encoded = dumps_exact(payload)
    except (TypeError, ValueError) as exc:
        raise EventError(f"an event's payload must be JSON-serializable: {exc}") from None
    if len(encoded) > MAX_EVENT_BYTES:
        raise EventError(f"an event's payload is {len(encoded)} bytes of JSON, the limit is {MAX_EVENT_BYTES} "
                         "(shardworker.core.limits.MAX_EVENT_BYTES)")
    if b"null" in encoded and has_non_finite(payload):
        raise EventError("an event's payload holds a float that is not a finite number (nan or infinity)")
    if b"\\u0000" in encoded:
        raise EventError("an event's payload holds a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    return encoded
