"""Hostile and broken input on kmirrord's client ports: random bytes, oversized and negative frame
sizes, TLS and HTTP on a plaintext port, half a frame then a disconnect or a stall, unknown API
keys and versions, malformed bodies. After each, the proxy is alive and still serves a client that
was connected all along and a new one."""

import random
import socket
import ssl
import struct
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, create_topic, wait_until

pytestmark = pytest.mark.proxy

FRAME_TIMEOUT_MS = 3000
MAX_FRAME = 8 << 20


@pytest.fixture(scope="module")
def bad(kmirrord_bin, dest_cluster3, proxy_capture, tmp_path_factory):
    """One proxy for the whole module (short frame timeout, 8 MiB frame cap), a topic, and a
    producer connected before the first bad input and used after each."""
    p = Proxy(kmirrord_bin, dest_cluster3, str(tmp_path_factory.mktemp("badinput")),
              name="kmirrord-badinput", frame_timeout_ms=FRAME_TIMEOUT_MS,
              max_frame_bytes=MAX_FRAME).start()
    topic = f"badinput-{random.randrange(1 << 30):x}"
    create_topic(p, topic, partitions=1)
    producer = Producer(p.conf(**{"acks": "all", "message.timeout.ms": 30000}))
    state = {"proxy": p, "topic": topic, "producer": producer, "sent": 0}
    yield state
    producer.flush(10)
    p.stop()


def header(key, version, corr=7, client_id=b"badinput", flexible=False):
    h = struct.pack(">hhih", key, version, corr, len(client_id)) + client_id
    return h + (b"\x00" if flexible else b"")


def frame(body):
    return struct.pack(">i", len(body)) + body


def exchange(proxy, data, timeout=10.0, close_after_send=False):
    """Sends data on a new connection, then reads until the proxy closes it (or the timeout).
    Returns (bytes received, closed by the proxy, seconds until closed)."""
    s = socket.create_connection((PROXY_HOST, proxy.port), timeout=5)
    t0 = time.monotonic()
    got = b""
    closed = False
    try:
        try:
            s.sendall(data)
        except OSError:
            return got, True, time.monotonic() - t0  # closed while we were still sending
        if close_after_send:
            return got, False, 0.0
        s.settimeout(0.2)
        while time.monotonic() - t0 < timeout:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
    finally:
        s.close()
    return got, closed, time.monotonic() - t0


def rejected(proxy, reason):
    return proxy.metric(f'kmirror_connections_rejected_total{{reason="{reason}"}}')


def assert_serving(state):
    """The proxy is alive, the long-lived producer still delivers, a new client gets metadata."""
    p = state["proxy"]
    assert p.running(), p.daemon.tail()
    errs = []
    state["producer"].produce(state["topic"], b"still-here", on_delivery=lambda e, m: errs.append(e))
    assert state["producer"].flush(30) == 0
    assert errs == [None]
    state["sent"] += 1
    a = AdminClient(p.conf())
    md = a.list_topics(state["topic"], timeout=15)
    assert {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()} == p.advertised()
    assert md.topics[state["topic"]].partitions[0].leader in p.cluster.broker_ids


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_bytes(bad, seed):
    p = bad["proxy"]
    rnd = random.Random(seed)
    data = bytes(rnd.getrandbits(8) for _ in range(65536))
    got, closed, secs = exchange(p, data, timeout=FRAME_TIMEOUT_MS / 1000 + 10)
    assert closed, f"the proxy kept a connection of random bytes open ({len(got)} bytes back)"
    assert got == b""
    assert_serving(bad)


@pytest.mark.parametrize("size,reason", [(MAX_FRAME + 1, "frame_too_large"),
                                         (0x7FFFFFFF, "frame_too_large"),
                                         (-1, "bad_frame_size"), (0, "bad_frame_size")])
def test_oversized_or_bad_frame_size(bad, size, reason):
    p = bad["proxy"]
    before = rejected(p, reason)
    got, closed, secs = exchange(p, struct.pack(">i", size) + header(3, 12, flexible=True))
    assert closed and got == b"" and secs < 5
    wait_until(lambda: rejected(p, reason) == before + 1, 10, what=f"rejected {reason}")
    assert_serving(bad)


def test_tls_on_plaintext_port(bad):
    p = bad["proxy"]
    before = rejected(p, "tls_on_plaintext")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((PROXY_HOST, p.port), timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with ctx.wrap_socket(raw, server_hostname="kafka") as tls:
            tls.do_handshake()
    raw.close()
    wait_until(lambda: rejected(p, "tls_on_plaintext") == before + 1, 10, what="tls rejection")
    assert "TLS ClientHello" in p.output()
    assert_serving(bad)


def test_http_on_kafka_port(bad):
    p = bad["proxy"]
    before = rejected(p, "http_on_kafka_port")
    got, closed, _ = exchange(p, b"GET /metrics HTTP/1.1\r\nHost: kafka\r\n\r\n")
    assert closed and b"kmirror_" not in got
    wait_until(lambda: rejected(p, "http_on_kafka_port") == before + 1, 10, what="http rejection")
    assert_serving(bad)


def test_half_frame_then_disconnect(bad):
    p = bad["proxy"]
    open_before = p.metric("kmirror_client_connections")
    body = header(3, 12, flexible=True) + b"\x01" * 200
    exchange(p, struct.pack(">i", len(body)) + body[:60], close_after_send=True)
    # The session is freed: the open-connection gauge comes back to where it was.
    wait_until(lambda: p.metric("kmirror_client_connections") <= open_before, 10,
               what="the half-frame session to be closed")
    assert_serving(bad)


def test_half_frame_then_stall(bad):
    p = bad["proxy"]
    before = rejected(p, "frame_timeout")
    body = header(3, 12, flexible=True) + b"\x01" * 200
    got, closed, secs = exchange(p, struct.pack(">i", len(body)) + body[:5],
                                 timeout=FRAME_TIMEOUT_MS / 1000 + 10)
    assert closed and got == b""
    assert secs >= FRAME_TIMEOUT_MS / 1000 - 0.5
    assert rejected(p, "frame_timeout") == before + 1
    assert_serving(bad)


@pytest.mark.parametrize("key,version", [(999, 0), (-5, 0), (32767, 3), (3, 99), (0, 99),
                                         (1, -1)], ids=lambda v: str(v))
def test_unknown_api_key_or_version(bad, key, version):
    p = bad["proxy"]
    before = rejected(p, "bad_request_header")
    got, closed, secs = exchange(p, frame(header(key, version) + b"\x00" * 32))
    assert closed and got == b"", got
    assert secs < 5
    assert rejected(p, "bad_request_header") == before + 1
    assert_serving(bad)


def test_too_new_api_versions_is_answered(bad):
    """A too-new ApiVersions gets the broker-style UNSUPPORTED_VERSION answer, not a close."""
    p = bad["proxy"]
    s = socket.create_connection((PROXY_HOST, p.port), timeout=10)
    try:
        s.sendall(frame(header(18, 99, corr=4242, flexible=True) + b"\x00\x00\x00"))
        size = struct.unpack(">i", recv_exact(s, 4))[0]
        assert 0 < size < 10000
        data = recv_exact(s, size)
    finally:
        s.close()
    corr, err = struct.unpack_from(">ih", data, 0)
    assert (corr, err) == (4242, 35)  # UNSUPPORTED_VERSION
    (n,) = struct.unpack_from(">i", data, 6)
    keys = {struct.unpack_from(">hhh", data, 10 + 6 * i) for i in range(n)}
    assert any(k == 18 and lo == 0 and hi >= 3 for k, lo, hi in keys)
    assert_serving(bad)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


MALFORMED = {
    # Produce v9: the transactional id's compact length promises bytes the frame does not have.
    "produce-truncated": frame(header(0, 9, flexible=True) + b"\x40"),
    # Produce v3: a negative string length that is not -1.
    "produce-bad-string": frame(header(0, 3) + struct.pack(">h", -7) + b"\x00" * 10),
    # The client id claims 30000 bytes in a 40-byte frame.
    "header-client-id": frame(struct.pack(">hhih", 3, 12, 1, 30000) + b"x" * 30),
    # A frame too short for a request header.
    "header-short": frame(b"\x00\x03\x00"),
    # Metadata v12 with a body of garbage: the broker cannot parse it and closes.
    "metadata-garbage": frame(header(3, 12, flexible=True) +
                              bytes(random.Random(9).getrandbits(8) for _ in range(300))),
    # CreateTopics v5 whose topic array length is enormous.
    "createtopics-huge-array": frame(header(19, 5, flexible=True) + b"\xff\xff\xff\xff\x0f"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_body(bad, name):
    p = bad["proxy"]
    got, closed, secs = exchange(p, MALFORMED[name], timeout=15)
    assert closed, f"{name}: connection left open"
    assert secs < 12
    # Whatever the broker made of it, nothing but whole frames reached the client.
    pos = 0
    while pos < len(got):
        (size,) = struct.unpack_from(">i", got, pos)
        assert 0 < size <= len(got) - pos - 4
        pos += 4 + size
    assert_serving(bad)


def test_badinput_proxy_exits_cleanly(bad):
    """Last in the module: every record the long-lived producer sent arrived, and the proxy
    drains and exits 0 without a sanitizer report."""
    p = bad["proxy"]
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer(p.conf(**{"group.id": "badinput-check"}))
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(bad["topic"], 0), timeout=15)
    finally:
        c.close()
    assert hi - lo == bad["sent"]
    bad["producer"].flush(10)
    assert p.stop() == 0, p.daemon.tail()
    assert p.sanitizer_reports() == []
