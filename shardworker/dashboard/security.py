"""Who may use the dashboard, and from where.

* ``TokenAuth``: with a token set, every request (pages, fragments, static files) needs it,
  as ``Authorization: Bearer <token>`` or basic auth with the token as the password (any
  user name: a browser's own login prompt works). Without one (allowed on a loopback bind
  only) every account on the machine can reach the port: it may read the pages, and only
  a request presenting the action token (``keep_action_token``: made at the first start,
  printed, kept in the outbox directory, 0600) may press a button. Secrets are compared
  with ``hmac.compare_digest``.
* ``GuardedPosts``: a POST (every button that changes a job or a queue) must carry an
  ``Origin`` (or, lacking one, a ``Referer``) of this very host, so another site's page
  cannot press our buttons with the browser's cached credentials, and must be allowed to
  act (a 401 with a basic-auth challenge otherwise: the browser asks for the token and sends
  the form again). A script (curl, a deploy job) may instead send the token as
  ``Authorization: Bearer <token>``, with no Origin: a browser never attaches a Bearer
  header on its own, and another site's script could send one only through a CORS
  preflight that this app never grants. Responses also forbid framing and any script or
  style from elsewhere.
* On a loopback bind the app accepts only loopback ``Host`` names (``LOOPBACK_HOSTS``):
  a DNS-rebinding page, whose Origin and Host would both be its own name, is refused.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
from urllib.parse import urlsplit

from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError, SimpleUser
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp

from outbox import atomic_write, ensure_dir, read_small

REALM = 'Basic realm="shardworker dashboard", charset="UTF-8"'
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def presented_secret(authorization: str) -> str | None:
    """The token in a Bearer header, or the password of a Basic one; None otherwise."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon else None


ACTION_TOKEN_FILE = "dashboard-token"


def keep_action_token(outbox_dir: str) -> tuple[str, str]:
    """The token that lets a request press the buttons of a dashboard without ``--token``, and
    the file that keeps it: ``dashboard-token`` in ``outbox_dir`` (made 0700 if missing, and
    refused, ``OutboxUntrusted``, when another account owns it or may write to it), 0600. The
    first start makes it; later ones read it again, so a browser that has it keeps working."""
    ensure_dir(outbox_dir)
    path = os.path.join(outbox_dir, ACTION_TOKEN_FILE)
    try:
        kept = read_small(path).decode("ascii", "replace").strip()
    except FileNotFoundError:
        kept = ""
    if len(kept) >= 32 and kept.isascii() and kept.replace("-", "").replace("_", "").isalnum():
        return kept, path
    token = secrets.token_urlsafe(32)
    atomic_write(outbox_dir, ACTION_TOKEN_FILE, f"{token}\n".encode())
    return token, path


class TokenAuth(AuthenticationBackend):
    """With ``token``, only requests presenting it, and they may act. Without, everyone may
    read, and a request presenting ``action_token`` may act too (the scope ``act``)."""

    def __init__(self, token: str | None, action_token: str | None = None) -> None:
        self._token = token.encode() if token is not None else None
        self._action_token = action_token.encode() if action_token is not None else None

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
        given = presented_secret(conn.headers.get("authorization", ""))
        if self._token is None:
            acts = given is not None and self._action_token is not None and \
                hmac.compare_digest(given.encode(), self._action_token)
            return AuthCredentials(["authenticated", "act"] if acts else ["authenticated"]), SimpleUser("local")
        if given is None or not hmac.compare_digest(given.encode(), self._token):
            raise AuthenticationError("the dashboard token is required")
        return AuthCredentials(["authenticated", "act"]), SimpleUser("operator")


def unauthorized(_conn: HTTPConnection, exc: Exception) -> Response:
    return PlainTextResponse(f"401: {exc}", status_code=401, headers={"WWW-Authenticate": REALM, **HEADERS})


def bearer(request: Request) -> bool:
    """Whether the request presents a Bearer token (set by a script, never by a browser on its own)."""
    return request.headers.get("authorization", "").partition(" ")[0].lower() == "bearer"


CROSS_SITE = ("403: cross-site request refused: a button's POST must carry an Origin (or Referer) of this "
              "dashboard, as its page's forms do; a script sends the token as 'Authorization: Bearer TOKEN' instead")


def same_origin(request: Request) -> bool:
    """Whether the request's Origin (or Referer) names this host and port, as the browser
    addressed it. The scheme is not compared: behind a TLS proxy the page is https while
    uvicorn sees http, and a page on another host or port is cross-site either way."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False
    return urlsplit(source).netloc.lower() == request.headers.get("host", "").lower()


class GuardedPosts(BaseHTTPMiddleware):
    """Refuse state-changing requests from other origins, and from requests that may not act
    (saying where the token is: ``token_hint``); add the security headers."""

    def __init__(self, app: ASGIApp, token_hint: str) -> None:
        super().__init__(app)
        self.token_hint = token_hint

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response: Response
        if request.method in SAFE_METHODS or (bearer(request) and "act" in request.auth.scopes):
            response = await call_next(request)
        elif not same_origin(request):
            response = PlainTextResponse(CROSS_SITE, status_code=403)
        elif "act" not in request.auth.scopes:
            response = unauthorized(request, AuthenticationError(
                f"the dashboard's buttons need its token ({self.token_hint}): give it as the password, "
                "with any user name"))
        else:
            response = await call_next(request)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response
