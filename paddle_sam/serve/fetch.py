"""The Label Studio backend's one way out to the network: :class:`Fetcher`.

Every request the backend makes on a task's behalf goes through it, with these rules:

- **One pinned origin** (scheme, host, port: Label Studio's address): credentials (the
  ``Authorization`` header) go only there, and never across a redirect: once a redirect
  leaves the pinned origin the request goes on without them.
- **No private targets**: every other host is resolved and each of its addresses checked;
  loopback, private, link-local, shared, reserved, multicast and unspecified addresses are
  refused (also after each redirect) unless ``allow_private``. The connection goes to the
  address that was checked (no second lookup). The pinned origin is always allowed: Label
  Studio often runs on the same machine.
- **A total deadline** per request (connecting, headers and body together; a trickling server
  is cut off at the deadline) and **a byte cap** on the body.
- **Errors say no more than they must**: refused, unreachable, timed out, a non-200 answer
  and too many redirects are one message for addresses other than the pinned origin, so that
  the backend cannot be used to tell open ports from closed ones. Label Studio's own answers
  keep their HTTP status (a token problem must be visible).

Redirects are followed here (at most ``MAX_REDIRECTS``), not by a library, so that each hop
is checked. The standard library's ``http.client`` does the HTTP; proxy variables are not
used (a proxy would connect to addresses this module cannot check).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from .._version import __version__
from .errors import ServiceError

MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
CHUNK = 64 * 1024
NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class Origin:
    """The scheme, host (lower case, IDNA) and port of an address."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = {"http": 80, "https": 443}[self.scheme]
        return f"{self.scheme}://{host}" + ("" if self.port == default else f":{self.port}")


def _bad_url(url: str, why: str) -> ServiceError:
    return ServiceError(400, "invalid_image_url", f"{_shown(url)}: {why}")


def _shown(url: str) -> str:
    """``url`` safe to put in a one-line message (no control characters, at most 200)."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in url[:200])
    return text + ("..." if len(url) > 200 else "")


def split_url(url: str) -> tuple[Origin, str]:
    """The origin of an http(s) address and its request target (path and query, non-ASCII
    percent-encoded); ServiceError 400 for anything else (other schemes, control characters or
    spaces, a user name or password in it, no host, a bad port)."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise _bad_url(url, "the address holds a control character or a space")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _bad_url(url, f"not a valid address ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _bad_url(url, "only http(s) addresses are downloaded")
    if parts.username is not None or parts.password is not None:
        raise _bad_url(url, "an address with a user name or password is not downloaded")
    if not parts.hostname:
        raise _bad_url(url, "the address has no host")
    try:
        host = parts.hostname.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise _bad_url(url, "the host name is not a valid (IDNA) name") from None
    if port is None:
        port = 443 if scheme == "https" else 80
    target = urllib.parse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
    if parts.query:
        target += "?" + urllib.parse.quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
    return Origin(scheme, host, port), target


def origin_of(url: str) -> Origin:
    """The origin of an http(s) address (ServiceError 400 if it is not one)."""
    return split_url(url)[0]


def is_public(address: str) -> bool:
    """Whether an IP address is a public unicast one (IPv4 inside IPv6 judged as IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is None and ip in NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None and not (inner.is_global and not inner.is_multicast):
            return False
    return ip.is_global and not ip.is_multicast


class UpstreamError(ServiceError):
    """Label Studio's own answer was not what was asked for (``upstream_status``: its HTTP
    status, None when it did not answer)."""

    def __init__(self, detail: str, upstream_status: int | None) -> None:
        code = "label_studio_unreachable" if upstream_status is None else "label_studio_error"
        super().__init__(502, code, detail)
        self.upstream_status = upstream_status


class _Failed(Exception):
    """A request that got no usable answer; ``why`` is for the pinned origin's message only."""

    def __init__(self, why: str, status: int | None = None) -> None:
        super().__init__(why)
        self.why, self.status = why, status


class Fetcher:
    """GET and POST for the Label Studio backend, under the rules of this module.

    ``origin``: Label Studio's address (its origin is pinned; None: none yet, see :meth:`pin`).
    ``allow_private``: also download from loopback, private and link-local addresses.
    ``deadline_s``: the most one request may take, redirects included. ``max_bytes``: the most
    a body may have.
    """

    def __init__(
        self,
        origin: str | None = None,
        *,
        allow_private: bool = False,
        deadline_s: float = 30.0,
        max_bytes: int = 50 * 2**20,
    ) -> None:
        self.pinned: Origin | None = origin_of(origin) if origin else None
        self.allow_private, self.deadline_s, self.max_bytes = allow_private, deadline_s, max_bytes
        self._ssl = ssl.create_default_context()

    def pin(self, url: str) -> Origin:
        """Pin ``url``'s origin (once: a second call with another origin is a ValueError)."""
        origin = origin_of(url)
        if self.pinned is not None and origin != self.pinned:
            raise ValueError(f"the origin is pinned to {self.pinned}, not {origin}")
        self.pinned = origin
        return origin

    def is_pinned(self, url: str) -> bool:
        try:
            return self.pinned is not None and origin_of(url) == self.pinned
        except ServiceError:
            return False

    # -- requests --

    def get(self, url: str, credentials: Callable[[], str | None] | None = None) -> bytes:
        """The body of ``url`` (a 200 answer), following redirects. ``credentials()`` gives
        the ``Authorization`` value, asked for (and sent) only while the request is on the
        pinned origin. ServiceError: 400 a bad address, 403 a refused address, 413 over the
        byte cap, 502 anything else (one message unless the answer is Label Studio's)."""
        deadline = time.monotonic() + self.deadline_s
        first = url
        with_credentials = credentials is not None
        for _ in range(MAX_REDIRECTS + 1):
            origin, target = split_url(url)
            ours = origin == self.pinned
            headers = {"User-Agent": f"paddle-sam/{__version__}", "Accept": "*/*"}
            if ours and with_credentials:
                auth = credentials()
                if auth:
                    headers["Authorization"] = auth
            else:
                with_credentials = False  # left the pinned origin: never sent again
            try:
                status, location, body = self._request(
                    origin, "GET", target, headers, None, deadline
                )
            except _Failed as exc:
                raise self._failure(first, url, ours, exc) from None
            if status in REDIRECTS and location:
                url = urllib.parse.urljoin(url, location)
                continue
            if status != 200:
                raise self._failure(first, url, ours, _Failed(f"HTTP {status}", status))
            return body
        raise self._failure(first, url, False, _Failed("too many redirects"))

    def post_json(self, url: str, payload: dict) -> dict:
        """POST ``payload`` as JSON to ``url`` on the pinned origin (no redirects followed):
        the answer's JSON object. ServiceError 502 naming the status when it is not one."""
        origin, target = split_url(url)
        if origin != self.pinned:
            raise ValueError(f"{url}: only the pinned origin ({self.pinned}) is posted to")
        headers = {
            "User-Agent": f"paddle-sam/{__version__}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        body = json.dumps(payload).encode()
        deadline = time.monotonic() + self.deadline_s
        try:
            status, _, data = self._request(origin, "POST", target, headers, body, deadline)
            if status != 200:
                raise _Failed(f"HTTP {status}", status)
            answer = json.loads(data)
            if not isinstance(answer, dict):
                raise _Failed("the answer is not a JSON object")
        except (ValueError, RecursionError):
            raise self._failure(url, url, True, _Failed("the answer is not JSON")) from None
        except _Failed as exc:
            raise self._failure(url, url, True, exc) from None
        return answer

    def _failure(self, first: str, url: str, ours: bool, exc: _Failed) -> ServiceError:
        if ours:
            return UpstreamError(f"{_shown(url)}: {exc.why}", exc.status)
        return ServiceError(
            502,
            "download_failed",
            f"{_shown(first)}: could not be downloaded within {self.deadline_s:g} s "
            "(unreachable, refused, too slow, or not a 200 answer)",
        )

    def _addresses(self, origin: Origin) -> list[tuple]:
        """The addresses to connect to, each checked (ServiceError 403 if any is refused)."""
        try:
            infos = socket.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise _Failed("the host name does not resolve") from None
        if origin != self.pinned and not self.allow_private:
            for info in infos:
                address = info[4][0]
                if not is_public(address):
                    raise ServiceError(
                        403,
                        "address_not_allowed",
                        f"{origin}: {origin.host} is at {address}, a loopback, private, "
                        "link-local or reserved address; only Label Studio's own address "
                        f"({self.pinned or 'none pinned yet'}) and public addresses are "
                        "downloaded from (paddle-sam serve --allow-private-urls allows them)",
                    )
        return infos

    def _request(
        self,
        origin: Origin,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        deadline: float,
    ) -> tuple[int, str | None, bytes]:
        """One HTTP exchange: (status, Location, body up to the cap)."""
        infos = self._addresses(origin)
        if time.monotonic() >= deadline:
            raise _Failed("timed out")
        watch = _Watch(deadline)

        def connect(_address, timeout, source_address=None):
            last: OSError | None = None
            for family, kind, proto, _, sockaddr in infos:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock = socket.socket(family, kind, proto)
                try:
                    sock.settimeout(left)
                    sock.connect(sockaddr)
                except OSError as exc:
                    sock.close()
                    last = exc
                    continue
                watch.arm(sock)
                return sock
            raise last or TimeoutError("timed out")

        conn: http.client.HTTPConnection
        if origin.scheme == "https":
            conn = http.client.HTTPSConnection(
                origin.host, origin.port, timeout=self.deadline_s, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(origin.host, origin.port, timeout=self.deadline_s)
        conn._create_connection = connect  # connect to the checked addresses only
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            status = response.status
            if status in REDIRECTS:
                return status, response.getheader("Location"), b""
            if status != 200:
                return status, None, b""
            length = response.getheader("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
                raise self._too_large(origin)
            data = bytearray()
            while True:
                watch.tick(conn.sock)
                piece = response.read1(CHUNK)
                if not piece:
                    break
                data += piece
                if len(data) > self.max_bytes:
                    raise self._too_large(origin)
            if watch.expired():
                raise _Failed(f"no complete answer within {self.deadline_s:g} s")
            return status, None, bytes(data)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if watch.expired():
                raise _Failed(f"no complete answer within {self.deadline_s:g} s") from None
            raise _Failed(_reason(exc)) from None
        finally:
            watch.disarm()
            conn.close()

    def _too_large(self, origin: Origin) -> ServiceError:
        return ServiceError(
            413,
            "image_too_large",
            f"{origin}: the answer is above the limit of {self.max_bytes} bytes",
        )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return f"TLS: {getattr(exc, 'reason', None) or exc}"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.HTTPException):
        return f"not a valid HTTP answer ({type(exc).__name__})"
    return getattr(exc, "strerror", None) or type(exc).__name__


class _Watch:
    """The total deadline of one exchange: a timer that shuts the connection's socket down
    when the deadline passes (a server sending a byte at a time would otherwise keep each
    read alive), and a per-read socket timeout of what is left."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._lock = threading.Lock()
        self._dup: socket.socket | None = None
        self._timer: threading.Timer | None = None
        self._fired = False

    def arm(self, sock: socket.socket) -> None:
        with self._lock:
            # a duplicate of the descriptor, ours until disarm: shutting it down ends the
            # connection however the original is wrapped (TLS) or closed meanwhile
            self._dup = sock.dup()
            self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self._fired = True
            if self._dup is not None:
                try:
                    self._dup.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def tick(self, sock: socket.socket | None) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._fire()
            raise TimeoutError("timed out")
        if sock is not None:
            sock.settimeout(left)

    def expired(self) -> bool:
        return self._fired or time.monotonic() >= self.deadline

    def disarm(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self._dup is not None:
                self._dup.close()
                self._dup = None


__all__ = ["Fetcher", "Origin", "UpstreamError", "is_public", "origin_of", "split_url"]
