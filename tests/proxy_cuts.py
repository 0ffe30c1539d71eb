"""The fault proxy's cut rules (``tests.proxy.PgProxy.cut_on_query`` and ``cut_after``):
where a chunk of client bytes is cut, and what happens to the server's reply after an
"after" or a "commit" cut. A base of ``tests.proxy_loop.ProxyLoop``, on the proxy's loop."""

from __future__ import annotations

from tests.pg_wire import Conn, CutRule, summary

REPLY_WAIT_S = 5.0  # "after" cuts: RST anyway if the server has not answered by then


class CutRules:
    """The rules' side of the proxy loop (which sets ``_cut_rules`` and ``_cut_after``)."""

    _cut_rules: list[CutRule]
    _cut_after: tuple[int, int] | None  # (n bytes, times left)

    def _event(self, kind: str, conn: int, detail: str = "") -> None:
        raise NotImplementedError

    def _reset(self, conn: Conn, why: str) -> None:
        raise NotImplementedError

    def _cut_point(self, conn: Conn, data: bytes, statements: list[tuple[int, int, bytes]]
                   ) -> tuple[int, str, str] | None:
        """Where to cut this chunk, if a rule fires: (bytes to forward first, its rule's when, why)."""
        for start, end, query in statements:
            for rule in self._cut_rules:
                if all(n in query for n in rule.needles):
                    rule.times -= 1
                    self._cut_rules = [r for r in self._cut_rules if r.times > 0]
                    text = summary(query)
                    if rule.when == "before":
                        return max(0, start), "before", f"before execute of: {text}"
                    if rule.when == "commit":
                        return len(data), "commit", f"after the transaction of: {text}"
                    # Still waiting for its Sync: the rest of this chunk is its pipeline too.
                    pending = conn.parser.unsynced and start >= conn.parser.pending_start
                    return len(data) if pending else end, "after", f"after execute of: {text}"
        if self._cut_after is not None:
            n_bytes, times = self._cut_after
            carried = conn.c2s_bytes - conn.cut_base
            if carried >= n_bytes:
                self._cut_after = (n_bytes, times - 1) if times > 1 else None
                return len(data) - (carried - n_bytes), "before", f"after {n_bytes} bytes"
        return None

    def _swallow_reply(self, conn: Conn, kinds: bytes) -> None:
        """Drop the server's reply to an executed statement; reset once ReadyForQuery came."""
        conn.reply_kinds += kinds
        if b"Z" in kinds:
            committed = conn.backend.statuses.endswith(b"I") and b"E" not in conn.reply_kinds
            shown = conn.reply_kinds.decode(errors="replace")
            shown = shown if len(shown) < 12 else f"{shown[:4]}...{shown[-4:]} ({len(shown)} messages)"
            self._event("cut", conn.id, f"{conn.awaiting_reply}; server replied {shown} (committed={committed})")
            self._reset(conn, "")

    def _transaction_ended(self, conn: Conn, kinds: bytes) -> bool:
        """A "commit" cut: once the matched statement's transaction ends (a ReadyForQuery
        idle), drop that reply and reset; True then."""
        conn.reply_kinds += kinds
        if b"I" not in conn.backend.statuses:
            return False
        committed = b"E" not in conn.reply_kinds
        self._event("cut", conn.id, f"{conn.cut_at_commit}; its reply dropped (committed={committed})")
        self._reset(conn, "")
        return True

    def _reply_timeout(self, conn: Conn) -> None:
        if not conn.closed and conn.awaiting_reply:
            self._event("cut", conn.id, f"{conn.awaiting_reply}; no reply within {REPLY_WAIT_S}s")
            self._reset(conn, "")
