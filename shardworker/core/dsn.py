"""DSNs in messages: ``redact_dsn`` hides a password wherever a DSN is shown or logged."""

from __future__ import annotations

import re


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***``, for messages and logs."""
    # URL form: the password runs from the first ':' after the user to the last '@' before
    # the host, so a password holding '@' is hidden whole.
    dsn = re.sub(r"(://[^:/@]*:)[^/]*@", r"\1***@", dsn)
    # key=value form: a quoted value may hold doubled or escaped quotes.
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.|'')*'|\S+)", r"\1***", dsn, flags=re.IGNORECASE)
