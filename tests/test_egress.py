"""The http step's outbound-address guard (effects/egress.py), against real local servers.

Every refusal test asserts what the servers saw and which TCP connects were attempted, so
a guard that let a request through (or checked only after connecting) fails the test.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from effects.egress import Allowlist, EgressRefused, egress_client, refusal_reason

NOTHING_ALLOWED = Allowlist()
LOOPBACK_ONLY = Allowlist.parse(["127.0.0.1/32"])


@dataclass
class Seen:
    """One request a stub server answered."""

    path: str
    host: str | None
    user_agent: str | None


class _Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.seen: list[Seen] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    """/ answers "stub"; /redirect?to=URL redirects there; /hops/N redirects N times."""

    def do_GET(self) -> None:
        assert isinstance(self.server, _Stub)
        self.server.seen.append(
            Seen(self.path, self.headers.get("Host"), self.headers.get("User-Agent"))
        )
        url = urlsplit(self.path)
        if url.path == "/redirect":
            self._redirect(parse_qs(url.query)["to"][0])
        elif url.path.startswith("/hops/") and int(url.path[6:]) > 0:
            self._redirect(f"/hops/{int(url.path[6:]) - 1}")
        else:
            self._answer(b"stub")

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the test output quiet


def _start(host: str, port: int = 0, tls: ssl.SSLContext | None = None) -> _Stub:
    server = _Stub((host, port))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stop(server: _Stub) -> None:
    server.shutdown()
    server.server_close()


@pytest.fixture
def stub() -> Iterator[_Stub]:
    server = _start("127.0.0.1")
    yield server
    _stop(server)


@pytest.fixture
def second() -> Iterator[_Stub]:
    """Another loopback address (127.0.0.2 reaches lo on Linux), never allowlisted."""
    server = _start("127.0.0.2")
    yield server
    _stop(server)


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every TCP connect the process attempts (httpcore's sockets are socket.socket)."""
    attempted: list[Any] = []
    real_connect = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        attempted.append(address[:2])
        real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempted


@dataclass
class FakeDNS:
    """Answers chosen names with chosen addresses; every other name goes to the real DNS."""

    answers: dict[str, list[str]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    fake = FakeDNS()
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in fake.answers:
            return real_getaddrinfo(host, port, *args, **kwargs)
        fake.asked.append(host)
        # A rebinding resolver: each lookup takes the next answer, the last one repeating.
        answer = fake.answers[host][0]
        if len(fake.answers[host]) > 1:
            fake.answers[host].pop(0)
        return [_addrinfo(address, int(port)) for address in answer.split(",")]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return fake


def _addrinfo(address: str, port: int) -> tuple[Any, ...]:
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))


def _refused(url: str, allow: Allowlist = NOTHING_ALLOWED) -> EgressRefused:
    with egress_client(allow=allow, timeout=3) as client, pytest.raises(EgressRefused) as caught:
        client.get(url)
    return caught.value


# --- refusals -------------------------------------------------------------------------


def test_loopback_literal_is_refused(stub, connects):
    exc = _refused(f"http://127.0.0.1:{stub.port}/")
    assert (exc.host, exc.address, exc.reason) == ("127.0.0.1", "127.0.0.1", "loopback address")
    assert exc.code == "egress_refused"
    assert stub.seen == []
    assert connects == []


def test_localhost_by_name_is_refused_after_dns(stub, connects):
    exc = _refused(f"http://localhost:{stub.port}/")
    assert exc.host == "localhost"
    assert exc.address in {"127.0.0.1", "::1"}  # what the resolver answered, not the name
    assert exc.reason == "loopback address"
    assert stub.seen == []
    assert connects == []


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("10.0.0.1", "private address"),
        ("192.168.1.10", "private address"),
        ("172.16.0.1", "private address"),
        ("169.254.169.254", "link-local/metadata address"),
        ("100.64.0.1", "carrier-grade NAT address"),
        ("[::1]", "loopback address"),
        ("[fd00::1]", "unique-local (private) address"),
    ],
)
def test_private_literal_is_refused_before_connecting(host, reason, connects):
    # These would hang or fail at connect time; refused before any socket connects.
    exc = _refused(f"http://{host}:8080/")
    assert exc.address == host.strip("[]")
    assert exc.reason == reason
    assert connects == []


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        # Linux connects 0.0.0.0 to the local host, and a dual-stack socket reaches
        # 127.0.0.1 through ::ffff:127.0.0.1: both would reach the stub if let through.
        ("0.0.0.0", "unspecified address"),  # noqa: S104 - the address under test
        ("[::ffff:127.0.0.1]", "loopback address (the IPv4-mapped form of 127.0.0.1)"),
    ],
)
def test_aliases_of_the_local_host_are_refused(host, reason, stub, connects):
    exc = _refused(f"http://{host}:{stub.port}/")
    assert exc.reason == reason
    assert stub.seen == []
    assert connects == []


def test_metadata_host_name_is_refused_with_a_clear_message(dns, connects):
    dns.answers["metadata.internal"] = ["169.254.169.254"]
    exc = _refused("http://metadata.internal/latest/meta-data/")
    assert str(exc) == (
        "refused 169.254.169.254 for host 'metadata.internal': link-local/metadata address "
        "(no allowlist can open it)"
    )
    assert dns.asked == ["metadata.internal"]
    assert connects == []


def test_any_refused_answer_refuses_the_host(stub, dns, connects):
    # One public and one loopback answer: connecting "to whichever works" would reach
    # the stub, so one refused address refuses the host.
    dns.answers["mixed.test"] = ["93.184.215.14,127.0.0.1"]
    exc = _refused(f"http://mixed.test:{stub.port}/")
    assert (exc.host, exc.address) == ("mixed.test", "127.0.0.1")
    assert stub.seen == []
    assert connects == []


def test_environment_proxies_do_not_bypass_the_guard(stub, connects, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{stub.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    exc = _refused("http://10.0.0.1/")
    assert exc.address == "10.0.0.1"
    assert stub.seen == []  # the "proxy" was never asked
    assert connects == []


# --- the allowlist --------------------------------------------------------------------


def test_allowlisted_network_reaches_the_stub(stub, connects):
    headers = {"User-Agent": "waymark-egress-test"}
    with egress_client(allow=LOOPBACK_ONLY, timeout=3, headers=headers) as client:
        response = client.get(f"http://127.0.0.1:{stub.port}/")
    assert (response.status_code, response.text) == (200, "stub")
    assert stub.seen == [Seen("/", f"127.0.0.1:{stub.port}", "waymark-egress-test")]
    assert connects == [("127.0.0.1", stub.port)]


def test_allowlisted_host_name_reaches_the_stub(stub, connects):
    with egress_client(allow=Allowlist.parse(["localhost"]), timeout=3) as client:
        response = client.get(f"http://localhost:{stub.port}/")
    assert response.text == "stub"
    assert [seen.host for seen in stub.seen] == [f"localhost:{stub.port}"]
    # The stub listens on IPv4 only; a ::1 answer may be tried (and refused) first.
    assert connects[-1] == ("127.0.0.1", stub.port)


def test_suffix_entry_allows_subdomains_only(stub, dns):
    for name in ("api.corp.test", "corp.test", "evilcorp.test"):
        dns.answers[name] = ["127.0.0.1"]
    allow = Allowlist.parse([".corp.test"])
    with egress_client(allow=allow, timeout=3) as client:
        assert client.get(f"http://api.corp.test:{stub.port}/").text == "stub"
        for name in ("corp.test", "evilcorp.test"):
            with pytest.raises(EgressRefused):
                client.get(f"http://{name}:{stub.port}/")
    assert [seen.host for seen in stub.seen] == [f"api.corp.test:{stub.port}"]


def test_connects_to_the_vetted_address_without_asking_dns_again(stub, second, dns, connects):
    # A rebinding resolver answers 127.0.0.1 (allowlisted), then 127.0.0.2. Resolving
    # again at connect time would reach the second server.
    dns.answers["rebind.test"] = ["127.0.0.1", "127.0.0.2"]
    with egress_client(allow=LOOPBACK_ONLY, timeout=3) as client:
        response = client.get(f"http://rebind.test:{stub.port}/")
    assert response.text == "stub"
    assert dns.asked == ["rebind.test"]
    assert connects == [("127.0.0.1", stub.port)]
    assert [seen.host for seen in stub.seen] == [f"rebind.test:{stub.port}"]  # Host unchanged
    assert second.seen == []


# --- redirects ------------------------------------------------------------------------


def test_redirect_to_a_refused_address_is_refused_on_the_hop(stub, second, connects):
    target = f"http://127.0.0.2:{second.port}/"
    with (
        egress_client(allow=LOOPBACK_ONLY, timeout=3) as client,
        pytest.raises(EgressRefused) as caught,
    ):
        client.get(f"http://127.0.0.1:{stub.port}/redirect", params={"to": target})
    assert (caught.value.address, caught.value.reason) == ("127.0.0.2", "loopback address")
    assert [seen.path.split("?")[0] for seen in stub.seen] == ["/redirect"]
    assert second.seen == []
    assert connects == [("127.0.0.1", stub.port)]


def test_redirects_within_the_limit_are_followed(stub):
    with egress_client(allow=LOOPBACK_ONLY, timeout=3, max_redirects=2) as client:
        response = client.get(f"http://127.0.0.1:{stub.port}/hops/2")
    assert (response.status_code, response.text) == (200, "stub")
    assert [seen.path for seen in stub.seen] == ["/hops/2", "/hops/1", "/hops/0"]


def test_redirects_beyond_the_limit_stop(stub):
    with (
        egress_client(allow=LOOPBACK_ONLY, timeout=3, max_redirects=2) as client,
        pytest.raises(httpx.TooManyRedirects),
    ):
        client.get(f"http://127.0.0.1:{stub.port}/hops/5")
    assert [seen.path for seen in stub.seen] == ["/hops/5", "/hops/4", "/hops/3"]


# --- TLS still verifies the host name -------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for egress.test only (no IP address in it)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = [
        "openssl", "req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=egress.test",
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", str(key), "-out", str(cert),
        "-addext", "subjectAltName=DNS:egress.test",
        "-addext", "basicConstraints=critical,CA:TRUE",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_stub(certificate) -> Iterator[_Stub]:
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(*certificate)
    server = _start("127.0.0.1", tls=server_context)
    yield server
    _stop(server)


def _trusting(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificate[0]))


def test_tls_verifies_the_host_name_not_the_connected_address(tls_stub, certificate, dns):
    # The connect goes to 127.0.0.1, which the certificate does not name; the handshake
    # succeeds only because SNI and verification still use "egress.test".
    dns.answers["egress.test"] = ["127.0.0.1"]
    context = _trusting(certificate)
    with egress_client(allow=LOOPBACK_ONLY, timeout=3, ssl_context=context) as client:
        response = client.get(f"https://egress.test:{tls_stub.port}/")
    assert response.text == "stub"
    assert [seen.host for seen in tls_stub.seen] == [f"egress.test:{tls_stub.port}"]


def test_tls_rejects_a_certificate_for_another_name(tls_stub, certificate, dns):
    dns.answers["other.test"] = ["127.0.0.1"]
    context = _trusting(certificate)
    with (
        egress_client(allow=LOOPBACK_ONLY, timeout=3, ssl_context=context) as client,
        pytest.raises(httpx.ConnectError, match="certificate verify failed"),
    ):
        client.get(f"https://other.test:{tls_stub.port}/")
    assert tls_stub.seen == []


# --- refusal_reason -------------------------------------------------------------------


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "8.8.8.8", "2606:2800::1", "2a00:1450:4001::1"]
)
def test_public_addresses_have_no_refusal_reason(address):
    assert refusal_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "address", ["::ffff:93.184.215.14", "2002:5db8:d70e::1", "64:ff9b::808:808"]
)
def test_wrapped_public_ipv4_has_no_refusal_reason(address):
    assert refusal_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback address"),
        ("127.255.255.254", "loopback address"),
        ("::1", "loopback address"),
        ("10.1.2.3", "private address"),
        ("172.31.255.255", "private address"),
        ("192.168.0.1", "private address"),
        ("169.254.0.1", "link-local/metadata address"),
        ("169.254.169.254", "link-local/metadata address"),
        ("fe80::1", "link-local/metadata address"),
        ("fd00:ec2::254", "link-local/metadata address"),  # not just "unique-local"
        ("100.100.100.200", "link-local/metadata address"),  # not just "carrier-grade NAT"
        ("100.64.0.1", "carrier-grade NAT address"),
        ("100.127.255.254", "carrier-grade NAT address"),
        ("0.0.0.0", "unspecified address"),  # noqa: S104 - the address under test
        ("0.1.2.3", "unspecified address"),
        ("::", "unspecified address"),
        ("224.0.0.1", "multicast address"),
        ("ff02::1", "multicast address"),
        ("240.0.0.1", "reserved address"),
        ("255.255.255.255", "reserved address"),
        ("fc00::1", "unique-local (private) address"),
        ("fd00::1", "unique-local (private) address"),
        ("fec0::1", "site-local (private) address"),
        ("192.0.2.1", "documentation address"),
        ("203.0.113.9", "documentation address"),
        ("2001:db8::1", "documentation address"),
        ("198.18.0.1", "benchmarking address"),
        ("2001:2::1", "benchmarking address"),
        ("192.0.0.8", "IETF protocol-assignment address"),
        ("64:ff9b:1::1", "local-use NAT64 address"),
        ("::7f00:1", "reserved address"),  # the deprecated IPv4-compatible form
        ("100::1", "reserved address"),  # discard prefix
        ("2001::1", "special-purpose (non-global) address"),  # Teredo
        ("::ffff:127.0.0.1", "loopback address (the IPv4-mapped form of 127.0.0.1)"),
        (
            "::ffff:169.254.169.254",
            "link-local/metadata address (the IPv4-mapped form of 169.254.169.254)",
        ),
        ("::ffff:10.0.0.1", "private address (the IPv4-mapped form of 10.0.0.1)"),
        ("2002:7f00:1::", "loopback address (the 6to4 form of 127.0.0.1)"),
        ("2002:a9fe:a9fe::", "link-local/metadata address (the 6to4 form of 169.254.169.254)"),
        ("64:ff9b::7f00:1", "loopback address (the NAT64 form of 127.0.0.1)"),
        ("64:ff9b::a00:1", "private address (the NAT64 form of 10.0.0.1)"),
    ],
)
def test_refusal_reasons(address, reason):
    assert refusal_reason(ipaddress.ip_address(address)) == reason


# --- Allowlist.parse ------------------------------------------------------------------


def test_allowlist_parse_reads_every_kind_of_entry():
    allow = Allowlist.parse(
        ["Internal.Example.COM", ".corp.test", " db.corp. ", "10.0.0.0/8", "127.0.0.1", "::1"]
    )
    assert allow.hosts == {"internal.example.com", ".corp.test", "db.corp"}
    assert allow.networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("", "empty allowlist entry"),
        ("   ", "empty allowlist entry"),
        ("http://example.com", "not a URL"),
        ("example.com/path", "not a valid CIDR network"),
        ("example.com:8080", "is not a host name"),
        ("10.0.0.0/33", "not a valid CIDR network"),
        ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
        ("*.example.com", "write '.example.com'"),
        ("exa mple.com", "is not a host name"),
        ("-bad.example", "is not a host name"),
        ("a..b", "is not a host name"),
        (".", "is not a host name"),
        ("x" * 64 + ".com", "is not a host name"),
        ("fe80::1%eth0", "zone"),
        ("999.1.1.1", "neither a valid IP address nor a host name"),
        ("10.1.2", "neither a valid IP address nor a host name"),
    ],
)
def test_allowlist_parse_rejects_garbage(entry, message):
    with pytest.raises(ValueError, match=message):
        Allowlist.parse(["example.org", entry])


# --- the whole call bounded -------------------------------------------------------------------


def test_a_host_that_trickles_its_answer_is_given_up_on_at_the_calls_timeout() -> None:
    """A byte every 0.1 s: each read gets something long before its read timeout, so only a
    bound on the whole call ends it early (the host hangs up after 30 s)."""
    from effects.providers.base import Ambiguous, ConnectionInfo
    from effects.providers.http import send

    from .stubs import Tarpit

    conn = ConnectionInfo(None, "", "http", "", {}, "", timeout_seconds=1.0,
                          allow=Allowlist.parse(["127.0.0.1/32"]))  # fmt: skip
    with Tarpit(trickle=0.1) as trickle:
        hang_up = threading.Timer(30, trickle.hang_up)
        hang_up.start()
        try:
            with pytest.raises(Ambiguous, match=r"no answer in time \(within 1 s\)"):
                send(conn, "GET", trickle.url + "/slow")
            assert trickle.still_open() == 0  # the client gave up, long before the hang-up
        finally:
            hang_up.cancel()


def test_a_mail_server_that_trickles_its_greeting_is_given_up_on_at_the_calls_timeout() -> None:
    from effects.providers.base import Ambiguous, ConnectionInfo, Request
    from effects.providers.email import EmailProvider

    from .stubs.tarpit import SMTP_GREETING, Tarpit

    with Tarpit(trickle=0.05, endless=SMTP_GREETING) as server:
        port = int(server.url.rsplit(":", 1)[1])
        options = {"host": "127.0.0.1", "port": port}
        allow = Allowlist.parse(["127.0.0.1/32"])
        conn = ConnectionInfo(None, "", "email", "", options, "", timeout_seconds=1.0, allow=allow)
        request = Request(payload={"to": "a@example.com", "subject": "s", "body": "b"}, summary={})
        hang_up = threading.Timer(30, server.hang_up)
        hang_up.start()
        try:
            with pytest.raises(Ambiguous, match=r"no answer in time \(within 1 s\)"):
                EmailProvider().call(request, "k", conn)
            assert server.still_open() == 0  # given up on, long before the hang-up
        finally:
            hang_up.cancel()
