"""Fetch record sets spliced through kmirrord (docs/proxy.md, "Forwarding"): large records and many
small ones consumed through the proxy by confluent-kafka and the Java perf consumer, compared byte
for byte with what was produced, with /metrics showing the bytes went by splice(2); the same over a
TLS listener (no splice, still exact); a mirror topic and a plain one read through one consumer; a
client that reads slowly and one that leaves mid-response, with the proxy serving others meanwhile
and leaking no descriptor."""

import hashlib
import os
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from mirror_cli import kmirror_bin  # noqa: F401
from mirror_data import compare_topic, main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, produce, server_certs, wait_until
from test_mirror_data import _mirror_env, _teardown, unique

pytestmark = pytest.mark.proxy

BIG = 1 << 20  # 1 MiB values


def value_of(i, size):
    """A value of size bytes that differs everywhere between records (a splice that reorders or
    drops a piece shows)."""
    seed = hashlib.sha256(f"rec-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size - 8] + struct.pack(">Q", i)


def spliced(p):
    return p.metric("kmirror_spliced_bytes_total")


def big_topic(cluster, topic, partitions=1):
    cluster.create_topic(topic, partitions=partitions, config={"max.message.bytes": 4 * BIG})


def produce_values(p, topic, n, size, **conf):
    acked = produce(p, topic, n, value=lambda i: value_of(i, size), **conf)
    assert len(acked) == n
    return acked


def consume_all(p, topic, n, **conf):
    c = Consumer(p.conf(**{"group.id": unique("splice"), "auto.offset.reset": "earliest",
                           "enable.auto.commit": False, **conf}))
    got = {}
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 120
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                assert not m.error(), m.error()
                got[m.offset()] = m
    finally:
        c.close()
    return got


def check_exact(got, acked, n, size):
    """Every record at the offset it was acked at, key and value byte for byte."""
    assert len(got) == n
    for i in range(n):
        off = acked[f"key-{i}"][1]
        m = got[off]
        assert m.key() == f"key-{i}".encode()
        assert m.value() == value_of(i, size), f"record {i} (offset {off}) differs"


@pytest.fixture
def plain_proxy(proxy_factory, dest_cluster):
    p = proxy_factory(dest_cluster)
    wait_until(lambda: p.metric("kmirror_upstream_brokers") >= 1, 30, what="the broker's port")
    return p


def test_large_records_spliced(plain_proxy, dest_cluster):
    """40 records of 1 MiB: each Fetch answer's record set is mostly spliced, and every byte arrives."""
    p = plain_proxy
    topic = unique("splice-big")
    big_topic(dest_cluster, topic)
    acked = produce_values(p, topic, 40, BIG, **{"message.max.bytes": 4 * BIG})
    before = spliced(p)
    got = consume_all(p, topic, 40, **{"fetch.max.bytes": 8 * BIG, "max.partition.fetch.bytes": 8 * BIG})
    check_exact(got, acked, 40, BIG)
    moved = spliced(p) - before
    # Record sets, with the partial last batch of each answer that is fetched again.
    print(f"spliced {moved / 1e6:.1f} MB of record sets for {40 * BIG / 1e6:.1f} MB of values")
    assert moved >= 0.8 * 40 * BIG
    assert p.metric("kmirror_splices_total") >= 5


def test_small_records_spliced_java_and_librdkafka(plain_proxy, dest_cluster):
    """100,000 records of 512 B: librdkafka (Fetch passed on untouched) and the Java perf consumer
    (Fetch v16+, walked) both get them all through spliced record sets."""
    p = plain_proxy
    topic = unique("splice-small")
    dest_cluster.create_topic(topic, partitions=1)
    n = 100000
    acked = produce_values(p, topic, n, 512, **{"linger.ms": 50, "batch.size": 1 << 20})
    before = spliced(p)
    got = consume_all(p, topic, n)
    check_exact(got, acked, n, 512)
    by_rdkafka = spliced(p) - before
    assert by_rdkafka >= 0.5 * n * 512, by_rdkafka
    before = spliced(p)
    summary = dest_cluster.consumer_perf_test(topic, n, bootstrap=p.bootstrap)
    assert int(summary["data.consumed.in.nMsg"]) == n
    by_java = spliced(p) - before
    print(f"spliced: librdkafka {by_rdkafka / 1e6:.1f} MB, Java {by_java / 1e6:.1f} MB "
          f"for {n * 512 / 1e6:.1f} MB of values")
    assert by_java >= 0.5 * n * 512, by_java


def test_splice_off_still_exact(proxy_factory, dest_cluster):
    """splice_min_bytes = 0: nothing spliced, the same bytes."""
    p = proxy_factory(dest_cluster, splice_min_bytes=0)
    topic = unique("splice-off")
    big_topic(dest_cluster, topic)
    acked = produce_values(p, topic, 10, BIG, **{"message.max.bytes": 4 * BIG})
    got = consume_all(p, topic, 10, **{"fetch.max.bytes": 8 * BIG, "max.partition.fetch.bytes": 8 * BIG})
    check_exact(got, acked, 10, BIG)
    assert spliced(p) == 0


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return server_certs(tmp_path_factory, "splice")


def test_tls_listener_not_spliced(proxy_factory, dest_cluster, certs):
    """A TLS client listener: the bytes must be encrypted by kmirrord, so nothing is spliced; exact."""
    p = proxy_factory(dest_cluster, tls_cert_file=certs["cert"], tls_key_file=certs["key"])
    topic = unique("splice-tls")
    big_topic(dest_cluster, topic)
    tls = {"security.protocol": "SSL", "ssl.ca.location": certs["ca"]}
    acked = produce_values(p, topic, 12, BIG, **{"message.max.bytes": 4 * BIG}, **tls)
    got = consume_all(p, topic, 12, **{"fetch.max.bytes": 8 * BIG, "max.partition.fetch.bytes": 8 * BIG},
                      **tls)
    check_exact(got, acked, 12, BIG)
    assert spliced(p) == 0


# ---- a raw Fetch client: reads at its own pace, or leaves mid-response --------------------------

def fetch_v4(topic, partition, offset, max_bytes, corr=7):
    """A Fetch v4 request frame (header v1): its response is passed on untouched by the proxy."""
    t = topic.encode()
    body = struct.pack(">iiiib", -1, 500, 1, max_bytes, 0)
    body += struct.pack(">ih", 1, len(t)) + t + struct.pack(">iiqi", 1, partition, offset, max_bytes)
    cid = b"splice-test"
    hdr = struct.pack(">hhih", 1, 4, corr, len(cid)) + cid
    return struct.pack(">i", len(hdr) + len(body)) + hdr + body


def connect(host, port, rcvbuf=None):
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(60)
    s.connect((host, port))
    return s


def read_exact(s, n, pace=None):
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(65536, n - len(out)))
        if not chunk:
            raise AssertionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
        if pace:
            pace(len(out))
    return bytes(out)


def read_frame(s, pace=None):
    size = struct.unpack(">i", read_exact(s, 4))[0]
    return read_exact(s, size, pace)


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_slow_reader_and_leaver(plain_proxy, dest_cluster):
    """A client takes a 24 MiB Fetch answer slowly (its socket full, the range waiting with bytes in
    the pipe) while another consumer is served; its answer equals the broker's own, byte for byte.
    A client that leaves 200 KB into such an answer closes its session: the proxy goes on serving,
    and its descriptors (sockets and the pipe) are back to what they were."""
    p = plain_proxy
    topic = unique("splice-slow")
    big_topic(dest_cluster, topic)
    acked = produce_values(p, topic, 24, BIG, **{"message.max.bytes": 4 * BIG})
    req = fetch_v4(topic, 0, 0, 32 * BIG)
    host, port = dest_cluster.bootstrap.split(",")[0].rsplit(":", 1)
    d = connect(host, int(port))
    d.sendall(req)
    direct = read_frame(d)
    d.close()
    assert len(direct) > 24 * BIG

    pid = p.daemon.proc.pid
    fds0 = open_fds(pid)
    before = spliced(p)
    s = connect(PROXY_HOST, p.port, rcvbuf=65536)
    s.sendall(req)
    served = []

    def pace(n):
        # Stops twice for a while; meanwhile another client is served in full.
        if not served and n >= 2 * BIG:
            time.sleep(1.0)
            served.append(len(consume_all(p, topic, 24, **{"fetch.max.bytes": 8 * BIG,
                                                             "max.partition.fetch.bytes": 8 * BIG})))
        elif len(served) == 1 and n >= 10 * BIG:
            time.sleep(1.0)
            served.append(True)
    via = read_frame(s, pace)
    s.close()
    assert served and served[0] == 24
    assert via == direct, "the proxy's answer differs from the broker's"
    assert spliced(p) - before >= 20 * BIG

    # A client that leaves mid-answer.
    s = connect(PROXY_HOST, p.port, rcvbuf=65536)
    s.sendall(req)
    read_exact(s, 200000)
    s.close()
    wait_until(lambda: p.metric("kmirror_client_connections") == 0, 30, what="the session to close")
    wait_until(lambda: open_fds(pid) <= fds0, 30, what=f"kmirrord's descriptors back to {fds0}")
    # And serves the next client in full.
    got = consume_all(p, topic, 24, **{"fetch.max.bytes": 8 * BIG, "max.partition.fetch.bytes": 8 * BIG})
    check_exact(got, acked, 24, BIG)
    assert p.running()


# ---- a mirror topic and a plain topic through one consumer --------------------------------------

@pytest.fixture(scope="module")
def senv(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path_factory):
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster,
                      str(tmp_path_factory.mktemp("splice-mirror")), "kmirrord-splice")
    yield env
    _teardown(env)


@main_release_only
def test_mirror_and_plain_topic_one_consumer(senv, dest_cluster):
    """The mirror topic's batches are translated (offsets are the source's), the plain topic's record
    sets spliced, in the answers of one consumer's session; every record exact."""
    env = senv
    mtopic, ptopic = unique("splice-mirrored"), unique("splice-plain")
    env.source_topic(mtopic, partitions=1)
    from confluent_kafka import Producer
    sp = Producer({"bootstrap.servers": env.sb, "linger.ms": 20, "batch.size": 1 << 20})
    for i in range(3000):
        sp.produce(mtopic, key=f"m-{i}".encode(), value=value_of(i, 2000), partition=0)
    assert sp.flush(60) == 0
    env.start(mtopic)
    env.caught_up(mtopic, 1)
    dest_cluster.create_topic(ptopic, partitions=1)
    acked = produce_values(env.proxy, ptopic, 20000, 512, **{"linger.ms": 50, "batch.size": 1 << 20})
    before = spliced(env.proxy)
    c = Consumer(env.proxy.conf(**{"group.id": unique("splice-both"), "auto.offset.reset": "earliest",
                                   "enable.auto.commit": False}))
    got = {mtopic: {}, ptopic: {}}
    try:
        c.assign([TopicPartition(mtopic, 0, 0), TopicPartition(ptopic, 0, 0)])
        deadline = time.monotonic() + 120
        while (len(got[mtopic]) < 3000 or len(got[ptopic]) < 20000) and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                assert not m.error(), m.error()
                got[m.topic()][m.offset()] = m
    finally:
        c.close()
    assert sorted(got[mtopic]) == list(range(3000))  # the source's offsets
    for i in range(3000):
        assert got[mtopic][i].key() == f"m-{i}".encode() and got[mtopic][i].value() == value_of(i, 2000)
    check_exact(got[ptopic], acked, 20000, 512)
    assert spliced(env.proxy) - before >= 0.5 * 20000 * 512
    total, _ = compare_topic(env.pb, env.sb, mtopic, 1)
    assert total == 3000
