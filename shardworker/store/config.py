"""How the store connects: ``StoreConfig``, importable without psycopg (the worker builds it
in the parent before any connection is opened)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoreConfig:
    """Connection settings; every wait is bounded so an outage never hangs a loop."""

    dsn: str
    connect_timeout_s: int = 5
    statement_timeout_s: float = 30.0
    # A connection whose peer stops answering (a black hole) is declared dead after about
    # this long, through TCP keepalives and TCP_USER_TIMEOUT, even mid-statement.
    network_timeout_s: int = 20
    application_name: str = "shardworker"

    def __post_init__(self) -> None:
        if self.connect_timeout_s < 1:
            raise ValueError("connect_timeout_s must be >= 1")
        if self.statement_timeout_s <= 0:
            raise ValueError("statement_timeout_s must be > 0")
        if self.network_timeout_s < 2:
            raise ValueError("network_timeout_s must be >= 2")
