"""The outbound-address guard for the ``http`` effect step.

The http step fetches URLs built from run data, so a run could aim it at the engine's own
network: loopback services, private hosts, or the cloud metadata endpoint that hands out
credentials. Every TCP connection the step's client makes (the first request and every
redirect hop) therefore resolves the host here, refuses when any resolved address is not
public (unless the organisation's allowlist permits it), and then connects to the vetted
address itself, so a second DNS answer can never replace the one that was checked.

What an organisation may allowlist has a ceiling the operator sets
(``WAYMARK_EGRESS_ALLOWABLE``, ``tenant_ceiling``): an entry outside it is refused when saved
(``allowable_entry``) and ignored when used (``Allowlist.for_tenant``), so a row saved before
the ceiling was lowered opens nothing. Cloud metadata and link-local addresses
(``NEVER_OPENABLE``) are refused whatever any allowlist or setting says.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import ipaddress
import itertools
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import httpcore
import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_REASON = "link-local/metadata address"

# Cloud metadata endpoints, named first so the reason says "metadata" even where the
# address also sits in a broader range (fd00:ec2::254 is unique-local, 100.100.100.200 is
# in the carrier-grade NAT block).
_METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)

# What no organisation may ever reach, whatever its allowlist and whatever the operator's
# ceiling: the metadata endpoints hand out the host's cloud credentials, and the link-local
# ranges hold them (and nothing a tenant has a reason to call).
NEVER_OPENABLE: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(net)
    for net in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32")
)

# Checked in order; the first match names the reason. Explicit rather than relying on
# is_private/is_global alone, whose ranges differ between Python patch releases.
_REFUSED: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), reason)
    for net, reason in (
        # Linux connects 0.0.0.0 to the local host, so "this network" is as bad as loopback.
        ("0.0.0.0/8", "unspecified address"),
        ("::/128", "unspecified address"),
        ("127.0.0.0/8", "loopback address"),
        ("::1/128", "loopback address"),
        ("169.254.0.0/16", METADATA_REASON),
        ("fe80::/10", METADATA_REASON),
        ("10.0.0.0/8", "private address"),
        ("172.16.0.0/12", "private address"),
        ("192.168.0.0/16", "private address"),
        ("fc00::/7", "unique-local (private) address"),
        ("fec0::/10", "site-local (private) address"),
        ("100.64.0.0/10", "carrier-grade NAT address"),
        # RFC 8215 local-use NAT64: where the IPv4 part sits depends on the local prefix
        # length, so it cannot be unwrapped; it is private by definition.
        ("64:ff9b:1::/48", "local-use NAT64 address"),
        ("224.0.0.0/4", "multicast address"),
        ("ff00::/8", "multicast address"),
        ("192.0.2.0/24", "documentation address"),
        ("198.51.100.0/24", "documentation address"),
        ("203.0.113.0/24", "documentation address"),
        ("2001:db8::/32", "documentation address"),
        ("3fff::/20", "documentation address"),
        ("198.18.0.0/15", "benchmarking address"),
        ("2001:2::/48", "benchmarking address"),
        # IETF protocol assignments (NAT64 discovery, DS-Lite, dummy addresses); Python
        # 3.11 counts parts of it as global. Its two anycast services are no http target.
        ("192.0.0.0/24", "IETF protocol-assignment address"),
        ("240.0.0.0/4", "reserved address"),  # includes the broadcast 255.255.255.255
    )
)

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

# One DNS label: letters, digits and inner hyphens (host names arrive IDNA-encoded).
_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


class EgressRefused(Exception):
    """The http step may not connect to this address (a step failure, not a retry)."""

    code = "egress_refused"

    def __init__(self, host: str, address: str, reason: str, *, never: bool = False) -> None:
        self.host = host
        self.address = address
        self.reason = reason
        # An organisation's entry opens only what the operator's ceiling also covers: an
        # entry made and still refused is outside it.
        remedy = (
            "no allowlist can open it" if never else "allowlist it for this organisation, "
            "within what the operator allows (WAYMARK_EGRESS_ALLOWABLE), to permit"
        )  # fmt: skip
        super().__init__(f"refused {address} for host {host!r}: {reason} ({remedy})")


@dataclass(frozen=True)
class Allowlist:
    """What one organisation's http steps may reach beyond public addresses."""

    hosts: frozenset[str] = frozenset()  # exact names, or ".suffix" for any subdomain
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        """Build from stored entries: host names, ".suffix", addresses and CIDRs."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for raw in entries:
            parsed = _parse_entry(raw)
            if isinstance(parsed, str):
                hosts.add(parsed)
            else:
                networks.append(parsed)
        return cls(hosts=frozenset(hosts), networks=tuple(networks))

    def permits_host(self, host: str) -> bool:
        # A trailing dot names the same DNS host, so "db.corp." matches "db.corp".
        name = host.lower().rstrip(".")
        if name in self.hosts:
            return True
        return any(entry.startswith(".") and name.endswith(entry) for entry in self.hosts)

    def permits_address(self, address: IPAddress) -> bool:
        # Membership across families is simply False, so mixed lists need no filtering.
        return any(address in network for network in self.networks)

    def covers(self, entry: str | IPNetwork) -> bool:
        """Whether a parsed entry lies wholly inside this list (used as a ceiling): a name
        or ".suffix" under one of its names or suffixes, a network inside one of its own."""
        if isinstance(entry, str):
            # ".corp.example" ends with the ceiling's ".example"; "db.corp" is listed.
            return self.permits_host(entry)
        return any(
            entry.version == network.version and entry.subnet_of(network)  # type: ignore[arg-type]
            for network in self.networks
        )

    def within(self, ceiling: Allowlist) -> Allowlist:
        """The entries the ceiling covers and no never-openable address overlaps: what the
        organisation's rows may open now, however long ago they were saved."""
        return Allowlist(
            hosts=frozenset(host for host in self.hosts if ceiling.covers(host)),
            networks=tuple(
                network
                for network in self.networks
                if ceiling.covers(network) and never_openable_overlap(network) is None
            ),
        )

    @classmethod
    def for_tenant(cls, entries: Iterable[str]) -> Allowlist:
        """An organisation's stored entries as they may be used now: each must still parse
        and lie within the operator's ceiling (``tenant_ceiling``); the others open nothing."""
        kept: list[str] = []
        for entry in entries:
            try:
                _parse_entry(entry)
            except ValueError:
                continue  # saved under older rules: refusing it is the safe reading
            kept.append(entry)
        return cls.parse(kept).within(tenant_ceiling())


CEILING_SETTING = "WAYMARK_EGRESS_ALLOWABLE"


def tenant_ceiling() -> Allowlist:
    """What organisations may allowlist, from ``settings.EFFECTS["EGRESS_ALLOWABLE"]``
    (read at each use, so a lowered ceiling closes old entries at once)."""
    entries = settings.EFFECTS.get("EGRESS_ALLOWABLE", [])
    try:
        return Allowlist.parse(entries)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{CEILING_SETTING}: {exc}") from None


class NotAllowable(ValueError):
    """An entry an organisation may not allowlist (stable code for the API and admin)."""

    code = "egress_not_allowable"


def allowable_entry(raw: str, ceiling: Allowlist | None = None) -> str:
    """The entry as it is stored (lowercased; an address as its network), once it parses
    (ValueError otherwise) and an organisation may allowlist it (NotAllowable otherwise)."""
    parsed = _parse_entry(raw)
    if not isinstance(parsed, str):
        overlap = never_openable_overlap(parsed)
        if overlap is not None:
            raise NotAllowable(
                f"{raw.strip()!r} reaches {overlap}, a cloud metadata or link-local range: no "
                "organisation may allowlist it, whatever the settings"
            )
    if not (tenant_ceiling() if ceiling is None else ceiling).covers(parsed):
        raise NotAllowable(
            f"{raw.strip()!r} is outside what the operator lets organisations allowlist "
            f"({CEILING_SETTING}); ask the operator to open it"
        )
    return str(parsed)


def normalized_entry(raw: str) -> str:
    """An entry's stored form: lowercased, no trailing dot, an address as its network
    ("127.0.0.1" is "127.0.0.1/32"); ValueError when it is no entry."""
    return str(_parse_entry(raw))


def in_force(entry: str, ceiling: Allowlist | None = None) -> bool:
    """Whether a stored entry opens anything now (it may predate the current ceiling)."""
    try:
        parsed = Allowlist.parse([entry])
    except ValueError:
        return False
    kept = parsed.within(tenant_ceiling() if ceiling is None else ceiling)
    return bool(kept.hosts or kept.networks)


def never_openable(address: IPAddress) -> bool:
    """Whether ``address`` (or the IPv4 address a wrapped IPv6 form reaches) is one that no
    allowlist may open."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None and never_openable(embedded[1]):
            return True
    return any(address in network for network in NEVER_OPENABLE)


def never_openable_overlap(network: IPNetwork) -> IPNetwork | None:
    """The never-openable range an allowlist network would reach, if any: directly, or
    through an IPv6 form that wraps an IPv4 address (mapped, 6to4, NAT64)."""
    for closed in NEVER_OPENABLE:
        for form in (closed, *_wrapped_forms(closed)):
            if form.version == network.version and form.overlaps(network):
                return closed
    return None


def _wrapped_forms(network: IPNetwork) -> tuple[ipaddress.IPv6Network, ...]:
    """The IPv6 networks whose addresses connect to ``network``'s IPv4 addresses (the forms
    ``_embedded_ipv4`` unwraps); none for an IPv6 network."""
    if not isinstance(network, ipaddress.IPv4Network):
        return ()
    v4, bits = int(network.network_address), network.prefixlen
    mapped = int(ipaddress.IPv6Address("::ffff:0:0")) | v4
    sixtofour = (0x2002 << 112) | (v4 << 80)
    nat64 = int(_NAT64.network_address) | v4
    return (
        ipaddress.IPv6Network((mapped, 96 + bits)),
        ipaddress.IPv6Network((sixtofour, 16 + bits)),
        ipaddress.IPv6Network((nat64, 96 + bits)),
    )


def _parse_entry(raw: str) -> str | IPNetwork:
    entry = raw.strip().lower()
    if not entry:
        raise ValueError("empty allowlist entry")
    if "://" in entry:
        raise ValueError(f"{raw!r}: give the host name alone, not a URL")
    if "%" in entry:
        # ip_network accepts "fe80::1%eth0" but matching ignores the zone; say so instead.
        raise ValueError(f"{raw!r}: addresses with a zone (%...) are not supported")
    if "/" in entry:
        return _parse_network(entry)
    try:
        return ipaddress.ip_network(entry)  # a bare address: its /32 or /128
    except ValueError:
        pass
    if entry.startswith("*."):
        raise ValueError(f"{raw!r}: write {entry[1:]!r} to allow every subdomain")
    name = entry.rstrip(".")
    labels = name.removeprefix(".").split(".")
    if len(name) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels):
        raise ValueError(
            f"{raw!r} is not a host name, '.suffix', IP address or CIDR network "
            "(use the xn-- form for international names, and no scheme, port or path)"
        )
    if labels[-1].isdigit():
        # "10.1.2" or "999.1.1.1": a mistyped address, not a name DNS could hold.
        raise ValueError(f"{raw!r} is neither a valid IP address nor a host name")
    return name


def _parse_network(entry: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(entry)
    except ValueError as exc:
        # Name the usual mistake (host bits set) instead of the bare library message.
        try:
            fixed = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"{entry!r} is not a valid CIDR network: {exc}") from None
        raise ValueError(f"{entry!r} has host bits set; did you mean {fixed}?") from None


def refusal_reason(address: IPAddress) -> str | None:
    """Why the http step may not connect to ``address``, or None when it is public."""
    if address in _METADATA:
        return METADATA_REASON
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            # The socket reaches the IPv4 address inside, so judge that address.
            form, inner = embedded
            reason = refusal_reason(inner)
            return None if reason is None else f"{reason} (the {form} form of {inner})"
    for network, reason in _REFUSED:
        if address in network:
            return reason
    if address.is_reserved:
        return "reserved address"
    if not address.is_global:
        return "special-purpose (non-global) address"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", address.ipv4_mapped
    if address.sixtofour is not None:
        return "6to4", address.sixtofour
    if address in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


class CallDeadline:
    """The whole of a call bounded, not only each wait within it: httpx's timeouts bound a
    connect and each read, so a host that trickles a byte at a time could keep a call (and
    the worker's slot) for ever. When ``seconds`` have passed since the client was made,
    every socket it opened is shut down, which ends whatever read or write is under way.
    Shut down through a duplicate of each socket's descriptor: TLS wraps the socket in
    another object, but the kernel's socket is the same."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.passed = False
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._at = time.monotonic() + seconds
        _DEADLINES.add(self, self._at)

    def left(self) -> float:
        """Seconds until the call's time is up (0 once it is)."""
        return max(0.0, self._at - time.monotonic())

    def watch(self, stream: httpcore.NetworkStream) -> None:
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            self.watch_socket(sock)

    def watch_socket(self, sock: socket.socket) -> None:
        with self._lock:
            duplicate = socket.socket(fileno=os.dup(sock.fileno()))
            if self.passed:
                _shut(duplicate)
            self._sockets.append(duplicate)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def expire(self) -> None:
        """The time is up (the deadlines' thread): shut the call's sockets, unless it ended."""
        with self._lock:
            if self._closed:
                return
            self.passed = True
            for sock in self._sockets:
                _shut(sock)


class _Deadlines:
    """One thread per process that expires every call's deadline when its time comes: a
    timer thread per call cost a thread's start on every outside call. A call that ends
    first stays queued until its time, and is then passed over (``expire`` does nothing)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, CallDeadline]] = []
        self._order = itertools.count()  # ties in time never compare two deadlines
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, deadline: CallDeadline, at: float) -> None:
        with self._changed:
            heapq.heappush(self._due, (at, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():  # first call, or forked
                self._thread = threading.Thread(target=self._run, name="call-deadlines",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            if self._due[0][2] is deadline:  # sooner than the thread is waiting for
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    left = self._due[0][0] - time.monotonic() if self._due else None
                    self._changed.wait(left)
                _, _, deadline = heapq.heappop(self._due)
            deadline.expire()


_DEADLINES = _Deadlines()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed at the other end
        sock.shutdown(socket.SHUT_RDWR)


class _GuardedBackend(httpcore.SyncBackend):
    """httpcore's network backend, but every TCP connect is resolved and vetted here."""

    def __init__(self, allow: Allowlist, deadline: CallDeadline | None = None) -> None:
        self._allow = allow
        self._deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        # The name resolved within the call's time too (a connect's timeout, the call's whole).
        bounds = [] if timeout is None else [timeout]
        if self._deadline is not None:
            bounds.append(self._deadline.left())
        addresses = vet_host(host, port, self._allow, within=min(bounds, default=None))
        last_error: httpcore.ConnectError | None = None
        for address in addresses:
            # An IP literal: the parent's create_connection does no DNS lookup for it.
            try:
                stream = super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                # Refused or unreachable fails fast; try the next vetted address as
                # create_connection would. A timeout propagates so the caller's bound holds.
                last_error = exc
                continue
            if self._deadline is not None:
                self._deadline.watch(stream)
            return stream
        assert last_error is not None  # _resolve never returns an empty list
        raise last_error


def vet_host(host: str, port: int, allow: Allowlist, *, within: float | None = None) -> list[str]:
    """The host's addresses, resolved once, when none of them is refused for ``allow``;
    raises EgressRefused (or httpcore.ConnectError when the name does not resolve, within
    ``within`` seconds: ``RESOLVE_SECONDS`` when None). A client must then connect to one of
    these addresses itself, as the httpx transport here and the email provider's VettedSMTP
    do: one that resolves the name again could be handed another answer (DNS rebinding).
    """
    addresses = _resolve(host, port, RESOLVE_SECONDS if within is None else within)
    # Refuse if ANY answer is refused: otherwise a name answering with one public and one
    # private address would reach the private one whenever it came first.
    host_allowed = allow.permits_host(host)
    for text in addresses:
        address = ipaddress.ip_address(text)
        reason = refusal_reason(address)
        if reason is None:
            continue
        if never_openable(address):  # an allowlisted name answering 169.254.169.254 too
            raise EgressRefused(host, text, reason, never=True)
        if not (host_allowed or allow.permits_address(address)):
            raise EgressRefused(host, text, reason)
    return addresses


class ResolveTimeout(httpcore.ConnectError):
    """A name that did not resolve within the call's time: nothing was sent, and trying
    again later is as good as ever. The message starts with the stable code, dns_timeout."""


def _resolve(host: str, port: int, within: float) -> list[str]:
    """The host's addresses (an IP literal resolves to itself), in the resolver's order,
    within ``within`` seconds (ResolveTimeout after them)."""
    try:
        infos = _getaddrinfo_within(host, port, within)
    except (OSError, UnicodeError) as exc:
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
    # dict.fromkeys drops duplicates but keeps the order. IPv6 answers may carry a zone
    # ("fe80::1%eth0"), which ip_address accepts and the connect needs.
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise httpcore.ConnectError(f"no addresses for {host!r}")
    return addresses


# A name's resolution (getaddrinfo) has no timeout of its own: a slow resolver, or a domain
# whose name servers answer slowly on purpose, would hold the calling thread past its call's
# deadline (and a webhook sender past its organisation's share of the senders). So a name is
# resolved on a resolver thread and waited for only as long as the call has left; the thread
# finishes the lookup on its own. At most RESOLVERS lookups are under way at once in a
# process: a call finding none free within its time fails the same way.
RESOLVE_SECONDS = 30.0  # a resolution's bound when the caller gives none
RESOLVERS = 32
_resolvers = threading.BoundedSemaphore(RESOLVERS)


def _getaddrinfo_within(host: str, port: int, within: float) -> list[tuple[Any, ...]]:
    try:
        ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        pass
    else:  # an address: getaddrinfo asks no resolver for it
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    started = time.monotonic()
    if not _resolvers.acquire(timeout=max(within, 0.0)):
        raise ResolveTimeout(f"dns_timeout: no resolver free within {within:.3g} s for {host!r}")
    lookup: concurrent.futures.Future[list[tuple[Any, ...]]] = concurrent.futures.Future()

    def resolve() -> None:
        try:
            lookup.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # handed to the caller, who may be gone
            lookup.set_exception(exc)
        finally:
            _resolvers.release()

    try:
        threading.Thread(target=resolve, name="egress-resolve", daemon=True).start()
    except BaseException:
        _resolvers.release()
        raise
    left = max(0.0, within - (time.monotonic() - started))
    try:
        return lookup.result(timeout=left)
    except concurrent.futures.TimeoutError:
        raise ResolveTimeout(
            f"dns_timeout: {host!r} did not resolve within {within:.3g} s"
        ) from None


class _GuardedTransport(httpx.HTTPTransport):
    """httpx's transport with its connection pool rebuilt on the guarded backend.

    httpx 0.28 has no public parameter for httpcore's network_backend, so the pool the
    parent built is replaced; the check below makes an httpx that renames ``_pool`` fail
    here, loudly, rather than send unguarded requests.
    """

    def __init__(
        self, allow: Allowlist, ssl_context: ssl.SSLContext, deadline: CallDeadline | None = None
    ) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        self.deadline = deadline
        if not isinstance(getattr(self, "_pool", None), httpcore.ConnectionPool):
            raise RuntimeError("this httpx version cannot take the egress guard")
        limits = httpx.Limits()
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,  # TLS still verifies (and sends SNI for) the host name
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedBackend(allow, deadline),
        )

    def close(self) -> None:
        super().close()
        if self.deadline is not None:
            self.deadline.close()


def egress_client(
    *,
    allow: Allowlist,
    timeout: httpx.Timeout | float,
    max_redirects: int = 5,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    deadline: CallDeadline | None = None,
) -> httpx.Client:
    """An httpx client whose every connection, redirects included, passes the guard.

    ``ssl_context`` defaults to httpx's (certifi) trust store; pass one to trust a private
    CA. Certificate and host name verification are never switched off here.

    A followed redirect keeps the request's headers except Authorization on a hop to another
    origin (httpx's rule): a credential in any other header would travel on. The providers
    therefore never follow redirects (``providers.http.send`` passes follow_redirects=False);
    a caller that does must not put credentials in its headers.
    """
    if ssl_context is None:
        ssl_context = httpx.create_ssl_context(trust_env=False)
    return httpx.Client(
        # One transport for every URL and hop; closing the client ends the deadline's timer.
        transport=_GuardedTransport(allow, ssl_context, deadline),
        timeout=timeout,
        follow_redirects=True,
        max_redirects=max_redirects,
        # Only the codings answers.read_capped decompresses (within its cap): httpx would
        # offer br and zstd too when their packages happen to be installed.
        headers={"Accept-Encoding": "gzip, deflate", **(headers or {})},
        # No proxy from the environment: the explicit transport already rules that out in
        # httpx 0.28; saying so here keeps it true if that ever changes.
        trust_env=False,
    )
