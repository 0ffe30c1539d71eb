"""``shardworker dashboard``: serve the web dashboard with uvicorn.

It binds 127.0.0.1 unless told otherwise, and refuses (one line, exit 2) to bind anything
that is not loopback without a token: the page can retry and cancel jobs, and pause, resume
and limit queues. On loopback without a token every account of the machine can reach it: it
shows them the pages, and its buttons need the token it keeps in its outbox directory
(``security.keep_action_token``), which it prints at start.
"""

from __future__ import annotations

import socket
import sys

import click

from shardworker.cli.common import (
    LOOPBACK_HOSTS,
    dsn_option,
    is_loopback,
    one_line_errors,
    outbox_dir_option,
    resolve_dsn,
)
from shardworker.errors import ConfigError


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a port in use is one line and exit 1."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def _usage_error(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback needs --token.")
@click.option("--port", type=click.IntRange(min=1, max=65535), default=8080, show_default=True, help="TCP port.")
@click.option("--token", envvar="SHARDWORKER_DASHBOARD_TOKEN", default=None,
              help="Secret every request must present, as a Bearer token or a basic-auth password "
                   "(env SHARDWORKER_DASHBOARD_TOKEN, which keeps it out of ps).")
@dsn_option
@outbox_dir_option
@one_line_errors
def dashboard(host: str, port: int, token: str | None, dsn: str | None, outbox_dir: str) -> None:
    """Web dashboard: queues (counts, pause, resume, limits), throughput, workers, failed jobs
    with retry and cancel. Without --token, the buttons need the token it keeps in the
    outbox directory (dashboard-token) and prints at start."""
    if token is not None and not token.strip():
        _usage_error("--token is empty")
    loopback = is_loopback(host)
    if not loopback and not token:
        _usage_error(f"--host {host} is reachable from other machines: set --token "
                     "(or SHARDWORKER_DASHBOARD_TOKEN), or bind 127.0.0.1")
    import uvicorn

    from shardworker.core.dsn import redact_dsn
    from shardworker.dashboard.app import create_app
    from shardworker.dashboard.security import keep_action_token

    dsn = resolve_dsn(dsn)
    action_token, token_file = keep_action_token(outbox_dir) if not token else (None, "")
    # On loopback, the Host names a browser on this machine uses: the usual ones and the
    # address bound (127.0.0.2 answers its own URL); a rebinding page's name is refused.
    allowed = [*LOOPBACK_HOSTS, host] if loopback else None
    app = create_app(dsn, token=token, action_token=action_token, allowed_hosts=allowed,
                     token_hint=f"printed when the dashboard started, and kept in {token_file}")
    sock = _listen(host, port)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"dashboard on http://{shown}:{port}/ (database {redact_dsn(dsn)}"
               f"{'; token required' if token else ''})", err=True)
    if action_token:
        click.echo(f"its buttons ask for this token (any user name; kept in {token_file}): {action_token}", err=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False)
    uvicorn.Server(config).run(sockets=[sock])
