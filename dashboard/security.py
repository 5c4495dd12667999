"""Headers and checks that keep a dashboard left open safe: the pages' Content Security
Policy, and the websocket's same-origin check (scheme, host and port, not host alone)."""
from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import validate_host

# Pages load only their own scripts and styles (plotly.js is served from static/);
# plotly sets inline styles on its SVG, hence 'unsafe-inline' for styles only.
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
               "img-src 'self' data: blob:; connect-src 'self'; font-src 'self' data:; "
               "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
# The self-contained HTML report inlines plotly.js and its data: inline scripts, nothing else.
REPORT_POLICY = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
                 "img-src data: blob:; font-src data:; base-uri 'none'; form-action 'none'")


class ContentSecurityPolicyMiddleware:
    """Adds PAGE_POLICY to every HTML answer that did not set a policy of its own.

    Sync and async capable, like Django's own: a sync-only middleware makes Django run the
    whole chain in a thread per request and reach the (async) API views back through
    AsyncToSync - a thread hop each way, and a request in flight at shutdown left its thread
    waiting forever on the stopped loop, which held runlab's exit until it was killed."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        return self._with_policy(self.get_response(request))

    async def _acall(self, request):
        return self._with_policy(await self.get_response(request))

    @staticmethod
    def _with_policy(response):
        if response.get("Content-Type", "").startswith("text/html"):
            response.headers.setdefault("Content-Security-Policy", PAGE_POLICY)
        return response


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_PAGE_SCHEME = {"ws": "http", "wss": "https"}


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"//{netloc}")
        return (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        return None


class SameOriginWebsocketValidator:
    """A browser's websocket must come from a page of this very site: the Origin's scheme
    matches the socket's (http for ws, https for wss), its host and port equal the Host the
    browser connected to, and that host is one of ALLOWED_HOSTS. Clients that send no
    Origin are scripts, not browsers riding a victim's cookie: they pass on to token auth."""

    def __init__(self, application):
        self.application = application

    def allowed(self, scope) -> bool:
        headers = dict(scope.get("headers") or ())
        origin = headers.get(b"origin")
        if origin is None:
            return True
        try:
            parsed = urlsplit(origin.decode("latin1"))
        except ValueError:
            return False
        socket_scheme = scope.get("scheme", "ws")
        if parsed.scheme != _PAGE_SCHEME.get(socket_scheme, "http"):
            return False
        origin_at = _host_port(parsed.netloc, parsed.scheme)
        host_at = _host_port(headers.get(b"host", b"").decode("latin1"), socket_scheme)
        allowed_hosts = settings.ALLOWED_HOSTS or (["localhost", "127.0.0.1", "[::1]"] if settings.DEBUG else [])
        return (origin_at is not None and origin_at == host_at
                and validate_host(origin_at[0], allowed_hosts))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not self.allowed(scope):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
