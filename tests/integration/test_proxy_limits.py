"""What one client may hold of kmirrord, on real Kafka: idle sockets open no broker connection (a
TLS client's handshake included), the connection caps (all listeners, one source address) refuse
the connection past them at once; the HTTP endpoint caps header size, header count, connections and
the time a request may take, serves the admin routes on admin_listen only when that is set (also
over TLS), and tells an unauthenticated caller nothing about the host (no path, no errno), refusing
a token file that others may read."""

import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import time

import pytest

from mirror_cli import kmirror_bin  # noqa: F401
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, consume, port_block, produce, server_certs, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]  # connection and HTTP limits are kmirrord's own: once, on the suite's release

# Other addresses of the proxy's loopback /24 to connect from (the per-address cap).
SOURCE_A = PROXY_HOST.rsplit(".", 1)[0] + ".3"
SOURCE_B = PROXY_HOST.rsplit(".", 1)[0] + ".4"


def connect(port, source=None, timeout=10.0):
    """A TCP connection to the proxy's host, from source (an address) when given."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if source:
        s.bind((source, 0))
    s.connect((PROXY_HOST, port))
    return s


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def metadata(s, corr=1):
    """Metadata v1 (no topics) on the open connection s (plain or TLS); returns the response body."""
    body = struct.pack(">hhih", 3, 1, corr, 6) + b"limits" + struct.pack(">i", 0)
    s.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", recv_exact(s, 4))[0]
    data = recv_exact(s, size)
    assert struct.unpack_from(">i", data)[0] == corr
    return data[4:]


def closed_by_peer(s, timeout=5.0):
    """True when the proxy closes s (an orderly close or a reset) within timeout; False when it
    stays open."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def rejected(p, reason):
    return p.metric(f'kmirror_connections_rejected_total{{reason="{reason}"}}')


def close_all(socks):
    for s in socks:
        s.close()


# ---- certificates for the TLS listeners ------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return server_certs(tmp_path_factory, "limits")


# ---- Kafka listeners: no broker connection before a request; the connection caps ----------------

def test_idle_flood_opens_no_broker_connection(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster, idle_timeout_ms=4000)
    wait_until(lambda: p.metric("kmirror_upstream_brokers") >= 1, 30, what="the broker's port")
    node = dest_cluster.broker_ids[0]
    dials = p.metric("kmirror_upstream_connects_total")
    # 150 sockets on the bootstrap port and 50 on the broker's that never send a byte.
    socks = [connect(p.port) for _ in range(150)] + [connect(p.broker_port(node)) for _ in range(50)]
    wait_until(lambda: p.metric("kmirror_client_connections") == 200, 20, what="200 client connections")
    # A dial would have been made as each was accepted; none was.
    assert p.metric("kmirror_upstream_connects_total") == dials
    assert p.metric("kmirror_upstream_connections") == 0
    # The first request of one of them dials, once, and is answered through the broker.
    assert metadata(socks[0])
    assert p.metric("kmirror_upstream_connects_total") == dials + 1
    assert p.metric("kmirror_upstream_connections") == 1
    # The idle ones are closed by idle_timeout_ms, as before.
    assert all(closed_by_peer(s, 15) for s in socks[1:])
    assert rejected(p, "idle_timeout") >= 199
    assert p.metric("kmirror_upstream_connects_total") == dials + 1
    close_all(socks)


def test_tls_handshake_alone_opens_no_broker_connection(proxy_factory, dest_cluster, certs, topic_name):
    p = proxy_factory(dest_cluster, tls_cert_file=certs["cert"], tls_key_file=certs["key"])
    ctx = ssl.create_default_context(cafile=certs["ca"])
    dials = p.metric("kmirror_upstream_connects_total")
    # Ten TLS clients that finish the handshake with kmirrord and send nothing.
    socks = [ctx.wrap_socket(connect(p.port), server_hostname=PROXY_HOST) for _ in range(10)]
    wait_until(lambda: p.metric("kmirror_client_connections") == 10, 20, what="10 TLS connections")
    assert p.metric("kmirror_upstream_connects_total") == dials
    # The first decrypted request dials; a TLS client works end to end.
    assert metadata(socks[0])
    assert p.metric("kmirror_upstream_connects_total") == dials + 1
    tls = {"security.protocol": "SSL", "ssl.ca.location": certs["ca"]}
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(p.conf(**tls))
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(timeout=60)
    dest_cluster.wait_topic(topic_name, 1)
    produce(p, topic_name, 20, **tls)
    assert len(consume(p, topic_name, 20, **tls)) == 20
    close_all(socks)


def test_max_connections(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster, max_connections=5)
    node = dest_cluster.broker_ids[0]
    wait_until(lambda: p.metric("kmirror_upstream_brokers") >= 1, 30, what="the broker's port")
    # The cap is over every Kafka listener: 3 on the bootstrap port, 2 on the broker's.
    socks = [connect(p.port) for _ in range(3)] + [connect(p.broker_port(node)) for _ in range(2)]
    wait_until(lambda: p.metric("kmirror_client_connections") == 5, 20, what="5 client connections")
    for port in (p.port, p.broker_port(node)):
        extra = connect(port)
        assert closed_by_peer(extra), "a connection past max_connections stayed open"
        extra.close()
    assert rejected(p, "max_connections") == 2
    assert p.metric("kmirror_client_connections") == 5
    # The five are served; once one closes, a new one is too.
    assert metadata(socks[0])
    socks.pop().close()
    wait_until(lambda: p.metric("kmirror_client_connections") == 4, 20, what="one connection gone")
    s = connect(p.port)
    assert metadata(s)
    assert rejected(p, "max_connections") == 2
    close_all(socks + [s])


def test_max_connections_per_ip(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster, max_connections_per_ip=3)
    a = [connect(p.port, SOURCE_A) for _ in range(3)]
    wait_until(lambda: p.metric("kmirror_client_connections") == 3, 20, what="3 connections from A")
    extra = connect(p.port, SOURCE_A)
    assert closed_by_peer(extra), "a 4th connection from one address stayed open"
    extra.close()
    assert rejected(p, "max_connections_per_ip") == 1
    # Another address has its own three.
    b = [connect(p.port, SOURCE_B) for _ in range(3)]
    for s in (a[0], b[0], b[2]):
        assert metadata(s)
    assert rejected(p, "max_connections_per_ip") == 1
    # A's connections closing gives A room again.
    a.pop().close()
    wait_until(lambda: p.metric("kmirror_client_connections") == 5, 20, what="one of A's gone")
    s = connect(p.port, SOURCE_A)
    assert metadata(s)
    assert rejected(p, "max_connections_per_ip") == 1
    close_all(a + b + [s])


# ---- the HTTP endpoint -------------------------------------------------------------------------

def http_raw(port, data, timeout=10.0, host=PROXY_HOST):
    """Sends data on a new connection to the HTTP port and reads until the proxy closes it;
    returns (status code or None, the whole answer)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(data)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    finally:
        s.close()
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", got)
    return (int(m.group(1)) if m else None), got


def test_http_header_caps(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster)
    # 64 KiB of one header: over http_max_header_bytes (8192 by default).
    status, answer = http_raw(p.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 +
                              b"\r\nConnection: close\r\n\r\n")
    assert status is not None and 400 <= status < 500, answer[:200]
    # 100 small headers: over http_max_headers (64 by default).
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(100))
    status, answer = http_raw(p.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many +
                              b"Connection: close\r\n\r\n")
    assert status == 431, answer[:200]
    assert p.metric('kmirror_http_rejected_total{reason="too_many_headers"}') == 1
    # The daemon is up and still answers an ordinary request.
    assert p.running()
    assert p.http_get("/metrics")[0] == 200
    status, _ = http_raw(p.http_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status in (200, 503)


def test_http_slow_request_closed(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster, http_request_timeout_ms=2000)
    # One that never finishes its headers, one byte every 300 ms (never silent long enough for a
    # timeout between two reads), and one that sends nothing at all.
    slow = socket.create_connection((PROXY_HOST, p.http_port), timeout=10)
    idle = socket.create_connection((PROXY_HOST, p.http_port), timeout=10)
    t0 = time.monotonic()
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    closed_after = None
    while time.monotonic() - t0 < 15:
        try:
            slow.sendall(b"X")
        except OSError:
            closed_after = time.monotonic() - t0
            break
        time.sleep(0.3)
    assert closed_after is not None, "a request trickling in was not closed"
    assert closed_after < 6, closed_after
    assert closed_by_peer(idle, 5), "a connection that sends nothing was not closed"
    slow.close()
    idle.close()
    assert p.metric('kmirror_http_rejected_total{reason="request_timeout"}') >= 2
    assert p.running()


def test_http_connection_cap(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster, http_max_connections=3, http_request_timeout_ms=60000)
    held = [socket.create_connection((PROXY_HOST, p.http_port), timeout=10) for _ in range(3)]
    extra = socket.create_connection((PROXY_HOST, p.http_port), timeout=10)
    t0 = time.monotonic()
    assert closed_by_peer(extra, 5), "a connection past http_max_connections stayed open"
    assert time.monotonic() - t0 < 2
    extra.close()
    # The held ones still work (keep-alive: the answer leaves the connection open).
    held[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert re.match(rb"HTTP/1\.1 (200|503) ", held[0].recv(4096))
    close_all(held)
    wait_until(lambda: p.metric('kmirror_http_rejected_total{reason="max_connections"}') == 1, 10,
               what="the refusal counted")
    wait_until(lambda: p.metric("kmirror_http_connections") == 1, 10,  # the one asking
               what="the held connections gone")


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "admin-secret-dir" / "admin.token"
    path.parent.mkdir()
    path.write_text("s3cret-t0ken\n")
    path.chmod(0o600)
    return path


def test_admin_routes_on_admin_listen_only(proxy_factory, dest_cluster, token_file, certs, kmirror_bin):
    admin_port = port_block(1)
    p = proxy_factory(dest_cluster, admin_listen=f"{PROXY_HOST}:{admin_port}",
                      admin_token_file=str(token_file))
    tok = "s3cret-t0ken"
    # http_listen: no admin route, even with the token; the public routes are there.
    assert p.http("GET", "/admin/upstream", token=tok)[0] == 404
    assert p.http("POST", "/admin/upstream", dest_cluster.bootstrap, token=tok)[0] == 404
    assert p.http_get("/metrics")[0] == 200
    # admin_listen: the admin routes, and nothing else.
    status, answer = http_raw(admin_port, b"GET /admin/upstream HTTP/1.1\r\nHost: x\r\n"
                              b"Authorization: Bearer " + tok.encode() + b"\r\nConnection: close\r\n\r\n")
    assert status == 200 and b'"upstream"' in answer, answer
    status, _ = http_raw(admin_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 404
    p.stop()

    # The same over TLS: HTTPS answers, plain HTTP gets nothing.
    tls_port = port_block(1)
    q = proxy_factory(dest_cluster, name="kmirrord-admin-tls", admin_listen=f"{PROXY_HOST}:{tls_port}",
                      admin_token_file=str(token_file), admin_tls_cert_file=certs["cert"],
                      admin_tls_key_file=certs["key"], upstream_file=str(token_file.parent / "upstream"))
    ctx = ssl.create_default_context(cafile=certs["ca"])
    with ctx.wrap_socket(socket.create_connection((PROXY_HOST, tls_port), timeout=10),
                         server_hostname=PROXY_HOST) as s:
        s.sendall(b"GET /admin/upstream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tok.encode() +
                  b"\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"upstream"' in answer, answer
    status, answer = http_raw(tls_port, b"GET /admin/upstream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                              tok.encode() + b"\r\nConnection: close\r\n\r\n")
    assert status is None and b"upstream" not in answer
    assert q.http("GET", "/admin/upstream", token=tok)[0] == 404
    # kmirror swap-upstream speaks HTTPS with --admin-ca: its request reaches the swap's checks.
    swap = [kmirror_bin, "swap-upstream", "--admin", f"{PROXY_HOST}:{tls_port}", "--token-file", str(token_file),
            "--to", q.options["upstream"], "--timeout-ms", "10000"]
    r = subprocess.run(swap + ["--admin-ca", certs["ca"]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "refused (HTTP 400)" in r.stderr and "already" in r.stderr, r.stderr
    r = subprocess.run(swap, capture_output=True, text=True, timeout=60)  # plain HTTP: no answer
    assert r.returncode == 1 and "HTTP 4" not in r.stderr, r.stderr


# What strerror says for the errors a token file can meet.
ERRNO_TEXTS = ("No such file", "Permission denied", "Is a directory", "Not a directory", "errno")


def assert_says_nothing(body, path):
    for leak in [str(path), str(path.parent), path.name, "admin-secret-dir", "/tmp", *ERRNO_TEXTS]:
        assert leak not in body, f"{leak!r} in the answer: {body!r}"


def reload_with(p, **options):
    ok = p.metric('kmirror_config_reloads_total{result="ok"}')
    p.options.update(options)
    p.write_config()
    p.signal(signal.SIGHUP)
    wait_until(lambda: p.metric('kmirror_config_reloads_total{result="ok"}') == ok + 1, 15, what="reload")


def test_unauthenticated_callers_learn_nothing(proxy_factory, dest_cluster, token_file):
    missing = token_file.parent / "missing.token"
    p = proxy_factory(dest_cluster, admin_token_file=str(missing))
    # The token file is missing: refused, with neither its path nor errno in the answer.
    for token in (None, "s3cret-t0ken", "wrong"):
        status, body = p.http("GET", "/admin/upstream", token=token)
        assert status in (401, 403), (status, body)
        assert_says_nothing(body, missing)
    # The log has both, for the operator.
    p.wait_log(re.escape(str(missing)) + r".*No such file or directory")
    # A directory where the token file should be.
    reload_with(p, admin_token_file=str(token_file.parent))
    status, body = p.http("POST", "/admin/upstream", dest_cluster.bootstrap, token="s3cret-t0ken")
    assert status in (401, 403), (status, body)
    assert_says_nothing(body, token_file)
    # A good file: no token, or a wrong one, is refused without a word about the file.
    reload_with(p, admin_token_file=str(token_file))
    for token in (None, "wrong"):
        status, body = p.http("GET", "/admin/upstream", token=token)
        assert status == 401, (status, body)
        assert_says_nothing(body, token_file)
    assert p.http("GET", "/admin/upstream", token="s3cret-t0ken")[0] == 200
    assert p.metric('kmirror_http_rejected_total{reason="unauthorized"}') >= 6


def test_token_file_readable_by_others_is_refused(proxy_factory, dest_cluster, token_file):
    token_file.chmod(0o644)
    p = proxy_factory(dest_cluster, admin_token_file=str(token_file))
    status, body = p.http("GET", "/admin/upstream", token="s3cret-t0ken")
    assert status == 403, (status, body)
    assert_says_nothing(body, token_file)
    p.wait_log(r"chmod 600 " + re.escape(str(token_file)))
    token_file.chmod(0o640)
    assert p.http("GET", "/admin/upstream", token="s3cret-t0ken")[0] == 403
    token_file.chmod(0o600)
    assert p.http("GET", "/admin/upstream", token="s3cret-t0ken")[0] == 200
