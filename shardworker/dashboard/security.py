"""Who may use the dashboard, and from where.

* ``TokenAuth``: with a token set, every request (pages, fragments, static files) needs it,
  as ``Authorization: Bearer <token>`` or basic auth with the token as the password (any
  user name: a browser's own login prompt works). Without a token (allowed on a loopback
  bind only) everyone who can reach the port may use it. Secrets are compared with
  ``hmac.compare_digest``.
* ``SameOriginPosts``: a POST (every button that changes a job) must carry an ``Origin`` (or,
  lacking one, a ``Referer``) of this very host, so another site's page cannot press our
  buttons with the browser's cached credentials. Responses also forbid framing and any
  script or style from elsewhere.
* On a loopback bind the app accepts only loopback ``Host`` names (``LOOPBACK_HOSTS``):
  a DNS-rebinding page, whose Origin and Host would both be its own name, is refused.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from urllib.parse import urlsplit

from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError, SimpleUser
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response

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


class TokenAuth(AuthenticationBackend):
    """Everyone when ``token`` is None; otherwise only requests presenting it."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token is not None else None

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
        if self._token is None:
            return AuthCredentials(["authenticated"]), SimpleUser("local")
        given = presented_secret(conn.headers.get("authorization", ""))
        if given is None or not hmac.compare_digest(given.encode(), self._token):
            raise AuthenticationError("the dashboard token is required")
        return AuthCredentials(["authenticated"]), SimpleUser("operator")


def unauthorized(_conn: HTTPConnection, exc: Exception) -> Response:
    return PlainTextResponse(f"401: {exc}", status_code=401, headers={"WWW-Authenticate": REALM, **HEADERS})


def same_origin(request: Request) -> bool:
    """Whether the request's Origin (or Referer) names this host and port, as the browser
    addressed it. The scheme is not compared: behind a TLS proxy the page is https while
    uvicorn sees http, and a page on another host or port is cross-site either way."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False
    return urlsplit(source).netloc.lower() == request.headers.get("host", "").lower()


class SameOriginPosts(BaseHTTPMiddleware):
    """Refuse state-changing requests from other origins; add the security headers."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.method not in SAFE_METHODS and not same_origin(request):
            response: Response = PlainTextResponse("403: cross-site request refused", status_code=403)
        else:
            response = await call_next(request)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response
