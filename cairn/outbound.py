"""The one way Cairn sends an HTTP request to an address someone else chose: runner
webhooks, chat notifications and HTTP provider adapters all go through ``outbound_send``.

A tenant who may name a URL must not reach what only the deployment should reach (Redis on
loopback, a cloud's metadata service, the private network). So a destination is:

- parsed strictly: ``http`` or ``https``, a host, no userinfo (``user:pass@`` would land
  in logs and audit events, and hides the real host from a reader);
- refused by name when it is a cloud metadata name (``metadata.google.internal``, any
  ``.internal`` name) or ``localhost``;
- resolved once, and refused when any address it resolves to is loopback, private,
  link-local, shared (CGNAT), multicast, unspecified, reserved or otherwise not global,
  for IPv4, IPv6 and IPv4 inside IPv6 (mapped, compatible, NAT64, 6to4) alike. Every
  numeric spelling of an address (``2130706433``, ``0x7f.1``, ``127.1``) is read by the
  resolver as what it means, so it is judged as that address;
- connected to at exactly the address that was checked (the Host header and TLS name stay
  the URL's), so a name that resolves elsewhere a moment later (DNS rebinding) cannot move
  the request;
- sent once: redirects are answered as they are, never followed.

``CAIRN_OUTBOUND_ALLOWED_INTERNAL`` lists internal destinations the deployment allows
(a self-hosted receiver, the demo's local publishing service): ``host``, ``host:port``,
``network/prefix`` or ``[v6 address]:port``.

``destination_check`` is the same check alone, for refusing a URL when it is configured
(400) before it is used (and checked again then).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings

MAX_URL_LENGTH = 2000
MAX_ANSWER_BYTES = 1024 * 1024
# Names that are internal by definition, whatever they resolve to here.
_INTERNAL_NAMES = frozenset({"localhost", "metadata", "metadata.goog", "instance-data"})
_INTERNAL_SUFFIXES = (".localhost", ".internal", ".local")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_METADATA = ipaddress.ip_network("169.254.0.0/16")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def url_origin(url: str) -> str:
    """What may be shown or recorded of a URL someone else chose: its scheme and host only
    (a chat or webhook URL may carry a token in its path or query)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}/…" if url else ""


class NotSent(Exception):
    """Nothing reached the destination (refused, unresolvable, the connection refused)."""


class DestinationRefused(NotSent):
    """The destination may not be used; ``str()`` is a sentence for the person who chose it
    (it never repeats a password the URL held)."""


class MaybeSent(Exception):
    """The request may have reached the destination, but no complete answer came back."""


@dataclass(frozen=True)
class Destination:
    """A checked destination: where to connect (``address``) and what to ask for."""

    scheme: str
    host: str  # as the URL names it: the Host header and the TLS server name
    port: int
    target: str  # path and query
    address: str  # the resolved address that was checked; the only one connected to

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class _Allowed:
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    name: str | None
    port: int | None

    def admits(self, host: str, address: IPAddress | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.name is not None:
            return self.name == host
        return address is not None and address in self.network


def _allowed_entry(text: str) -> _Allowed:
    """``host``, ``host:port``, ``network/prefix``, ``[v6]:port`` or a bare IPv6 address."""
    text = text.strip().lower()
    port = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = int(port_text)
    else:
        host = text
    try:
        return _Allowed(ipaddress.ip_network(host, strict=False), None, port)
    except ValueError:
        return _Allowed(None, host.rstrip("."), port)


def _allowlist() -> list[_Allowed]:
    entries = settings.CAIRN_OUTBOUND_ALLOWED_INTERNAL
    if isinstance(entries, str):
        entries = entries.split(",")
    return [_allowed_entry(entry) for entry in entries if entry.strip()]


def address_problem(address: IPAddress) -> str | None:
    """Why a request may not go to ``address`` (a phrase), or None for a global address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            problem = address_problem(embedded)
            return f"{problem} (written as an IPv6 address)" if problem else None
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if isinstance(address, ipaddress.IPv4Address) and address in _METADATA:
        return "a link-local address (where cloud metadata services answer)"
    if address.is_link_local:
        return "a link-local address"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if address.is_reserved or not address.is_global:
        return "a reserved address"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, NAT64 or 6to4)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _IPV4_COMPATIBLE or any(address in net for net in _NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (numeric spellings included, as the system reads
    them). The one place a name is resolved: tests replace it to play a DNS server."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def destination_check(url: object) -> Destination:
    """Parse, resolve and check ``url``; raise DestinationRefused with a sentence."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise DestinationRefused(
            f"The URL must be an http(s) URL of at most {MAX_URL_LENGTH} characters."
        )
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise DestinationRefused("The URL may not contain spaces or control characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise DestinationRefused("The URL is not a valid http(s) URL (check its host and port).")
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise DestinationRefused("The URL must start with http:// or https://.")
    if "@" in parts.netloc:
        raise DestinationRefused(
            "The URL may not carry a user name or password (user:pass@host); name the host "
            "alone, and let the signature prove who is calling."
        )
    host = (parts.hostname or "").rstrip(".")
    if not host or "%" in host:
        raise DestinationRefused("The URL names no host.")
    try:
        host.encode("ascii") if host.isascii() else host.encode("idna")
    except UnicodeError:
        raise DestinationRefused("The URL's host is not a valid name.")
    port = port or (443 if scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    allowlist = _allowlist()
    if _internal_name(host) and not any(a.admits(host, None, port) for a in allowlist):
        raise DestinationRefused(
            f"{host} names an internal service; Cairn sends nothing there. A deployment "
            "allows internal destinations in CAIRN_OUTBOUND_ALLOWED_INTERNAL."
        )
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError):
        raise DestinationRefused(f"{host} cannot be resolved to an address.")
    if not addresses:
        raise DestinationRefused(f"{host} cannot be resolved to an address.")
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        problem = address_problem(address)
        if problem and not any(a.admits(host, address, port) for a in allowlist):
            said = host if host == text else f"{host} resolves to {text}, which"
            raise DestinationRefused(
                f"{said} is {problem}; Cairn sends nothing there. A deployment allows "
                "internal destinations in CAIRN_OUTBOUND_ALLOWED_INTERNAL."
            )
    return Destination(scheme, host, port, target, addresses[0])


def _internal_name(host: str) -> bool:
    name = host.lower()
    return name in _INTERNAL_NAMES or name.endswith(_INTERNAL_SUFFIXES)


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the checked address; the Host header stays the URL's host."""

    def __init__(self, destination: Destination, timeout: float) -> None:
        super().__init__(destination.host, destination.port, timeout=timeout)
        self._address = destination.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """As _PinnedHTTP, with TLS verified against the URL's host name."""

    def __init__(self, destination: Destination, timeout: float) -> None:
        super().__init__(
            destination.host,
            destination.port,
            timeout=timeout,
            context=ssl.create_default_context(),
        )
        self._address = destination.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def outbound_send(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
    max_answer_bytes: int = MAX_ANSWER_BYTES,
) -> Answer:
    """Send one request to ``url`` after ``destination_check``; return the answer as it came
    (a 3xx included: redirects are never followed).

    Raises DestinationRefused (a NotSent saying why the destination is refused), NotSent
    (unresolvable, or the connection refused or failing before the request was written)
    or MaybeSent (the connection broke or timed out after the request may have arrived)."""
    destination = destination_check(url)
    kind = _PinnedHTTPS if destination.scheme == "https" else _PinnedHTTP
    connection = kind(destination, timeout)
    try:
        try:
            connection.connect()
        except (OSError, ssl.SSLError) as error:
            raise NotSent(f"{destination.origin}: {_say(error)}")
        try:
            connection.request(method, destination.target, body=body, headers=headers or {})
            answer = connection.getresponse()
            data = answer.read(max_answer_bytes)
        except (OSError, http.client.HTTPException) as error:
            raise MaybeSent(f"{destination.origin}: {_say(error)}")
        return Answer(answer.status, {k.lower(): v for k, v in answer.getheaders()}, data)
    finally:
        connection.close()


def _say(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:300] if text != type(error).__name__ else text
