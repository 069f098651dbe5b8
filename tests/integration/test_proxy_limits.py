"""What one client may hold of kmirrord, on real Kafka: idle sockets open no broker connection (a
TLS client's handshake included), the connection caps (all listeners, one source address) refuse
the connection past them at once; the HTTP endpoint caps header size, header count, connections and
the time a request may take, serves the admin routes on admin_listen only when that is set (also
over TLS), and tells an unauthenticated caller nothing about the host (no path, no errno), refusing
a token file that others may read."""

import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import time

import pytest

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, consume, port_block, produce, wait_until

pytestmark = pytest.mark.proxy

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
    """A CA and a server certificate for PROXY_HOST (IP SAN), made with the openssl tool."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl tool")
    d = str(tmp_path_factory.mktemp("limits-tls"))

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days",
        "2", "-subj", "/CN=kmirror limits test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj",
        "/CN=server")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write(f"subjectAltName=IP:{PROXY_HOST},DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return {k: os.path.join(d, f) for k, f in (("ca", "ca.pem"), ("cert", "server.pem"),
                                                ("key", "server.key"))}


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
