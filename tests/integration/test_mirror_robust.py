"""The mirror RPCs under abuse and through the paths the other tests leave out: clients that vanish
while their RPC waits for the authorizing probe or for the store (on an ASan+UBSan kmirrord when one
is built), malformed mirror requests, the legacy AlterConfigs of mirror.name through confluent-kafka,
DescribeConfigs asking for mirror.name by key, the mirror RPCs' own /metrics series, and a
destination without an authorizer."""

import os
import random
import socket
import struct
import threading
import time

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from harness import KafkaCluster
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, Proxy, create_topic, wait_until
from test_mirror_configs import (ALTER, CREATE, DELETE, DESCRIBE, LIST, LMO, PAUSE, RESUME, START, STOP,
                                 TAGS, Client, Reader, carray, cstr, mirror_name_of)

pytestmark = [pytest.mark.proxy, main_release_only]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 29, 31


def asan_kmirrord(fallback):
    """$KM_ASAN_KMIRRORD, else build-asan/kmirrord of this tree (scripts/test builds it), else the
    ordinary binary (then the sanitizer scan finds nothing, but the crash checks still hold)."""
    for path in (os.environ.get("KM_ASAN_KMIRRORD"), os.path.join(REPO, "build-asan", "kmirrord")):
        if path and os.access(path, os.X_OK):
            return path
    return fallback


def frame(body):
    return struct.pack(">i", len(body)) + body


def req(key, version, body, corr=1, flexible=True):
    cid = b"robust"
    h = struct.pack(">hhih", key, version, corr, len(cid)) + cid + (TAGS if flexible else b"")
    return frame(h + body)


def topics_body(mirror, topics):
    return cstr(mirror) + carray([cstr(t) + TAGS for t in topics]) + TAGS


def iac_v1_mirror_name(topic, value):
    """IncrementalAlterConfigs v1 (not flexible): SET mirror.name=value on topic."""
    def s(x):
        b = x.encode()
        return struct.pack(">h", len(b)) + b
    cfg = s("mirror.name") + b"\x00" + s(value)
    res = b"\x02" + s(topic) + struct.pack(">i", 1) + cfg
    return struct.pack(">i", 1) + res + b"\x00"


def sanitizer_free(p):
    reports = p.sanitizer_reports()
    assert reports == [], "\n".join(reports[:40])


@pytest.fixture(scope="module")
def robust(kmirrord_bin, dest_cluster, source_cluster, tmp_path_factory):
    """One kmirrord (ASan build when there is one) in front of the one-broker destination, with a
    mirror and two topics."""
    binary = asan_kmirrord(kmirrord_bin)
    p = Proxy(binary, dest_cluster, str(tmp_path_factory.mktemp("robust")), name="kmirrord-robust",
              log_level="debug").start(timeout=60)
    c = Client(p.bootstrap)
    wait_until(lambda: c.list()[0] == 0, 60, 0.5, "the mirror state to load")
    mirror = f"robust-{random.randrange(1 << 30):x}"
    # a reachable source without the topics: the partitions wait for them while MIRRORING
    assert c.create(mirror, {"bootstrap.servers": source_cluster.bootstrap}) == (0, None)
    topics = [f"{mirror}-a", f"{mirror}-b"]
    for t in topics:
        create_topic(p, t, partitions=2, rf=1)
    c.close()
    yield {"proxy": p, "mirror": mirror, "topics": topics, "binary": binary}
    if p.running():
        p.stop()


def serving(st):
    """kmirrord is alive and a new client gets answers to mirror RPCs."""
    p = st["proxy"]
    assert p.running(), p.daemon.tail()
    c = Client(p.bootstrap)
    try:
        code, msg = c.list()
        assert code == 0, msg
        code, msg = c.describe([st["mirror"]])
        assert code == 0, msg
    finally:
        c.close()


# ---- the mirror RPCs' own metrics series ---------------------------------------------------------

def test_mirror_rpcs_have_their_own_metrics(robust):
    p = robust["proxy"]
    before = p.metrics()

    def m(name, snap=None):
        return (snap if snap is not None else p.metrics()).get(name, 0.0)
    c = Client(p.bootstrap)
    try:
        assert c.create(robust["mirror"] + "-metrics", {"bootstrap.servers": "x.invalid:1"}) == (0, None)
        assert c.delete(robust["mirror"] + "-metrics") == (0, None)
        code, msg, per = c.topics(STOP, robust["mirror"], ["no-such-topic-metrics"])
        assert per["no-such-topic-metrics"][0] != 0
        code, msg = c.delete("no-such-mirror-metrics")
        assert code != 0 and msg
    finally:
        c.close()
    after = p.metrics()
    assert m('kmirror_requests_total{api="CreateMirror"}', after) == m('kmirror_requests_total{api="CreateMirror"}', before) + 1
    assert m('kmirror_requests_total{api="DeleteMirror"}', after) == m('kmirror_requests_total{api="DeleteMirror"}', before) + 2
    assert m('kmirror_requests_total{api="StopMirrorTopics"}', after) >= m('kmirror_requests_total{api="StopMirrorTopics"}', before) + 1
    # answered locally, so their latency is kmirrord's own
    assert m('kmirror_request_latency_seconds_count{api="CreateMirror"}', after) >= 1
    stop_err = [k for k, v in after.items() if k.startswith('kmirror_mirror_rpc_errors_total{api="StopMirrorTopics"')]
    assert stop_err and sum(after[k] for k in stop_err) >= 1, stop_err
    del_err = {k: v for k, v in after.items() if k.startswith('kmirror_mirror_rpc_errors_total{api="DeleteMirror"')}
    assert 'kmirror_mirror_rpc_errors_total{api="DeleteMirror",error="UNKNOWN_CLUSTER_MIRROR"}' in del_err, del_err


# ---- clients that vanish while their RPC waits ---------------------------------------------------

def test_client_gone_while_rpc_waits(robust):
    """Many connections send mirror RPCs (several in flight on each) and close at once or after a
    few milliseconds, some with a reset: the probe's answer or the store's result then finds the
    session gone. kmirrord must stay up, report nothing under ASan, and keep answering."""
    p, mirror, topics = robust["proxy"], robust["mirror"], robust["topics"]
    failures = []
    mark = len(p.output())
    sent_before = p.metric('kmirror_requests_total{api="StartMirrorTopics"}')

    def one(rnd, i):
        kinds = [
            req(START, 0, topics_body(mirror, topics), corr=1),
            req(STOP, 0, topics_body(mirror, topics), corr=2),
            req(PAUSE, 0, topics_body(mirror, topics[:1]), corr=3),
            req(CREATE, 0, cstr(f"{mirror}-g{i}") + carray([cstr("bootstrap.servers") + cstr("x.invalid:1") + TAGS])
                + b"\x00" + TAGS, corr=4),
            req(DELETE, 0, cstr(f"{mirror}-g{i}") + TAGS, corr=5),
            req(DESCRIBE, 0, b"\x00\x00" + TAGS, corr=6),
            req(44, 1, iac_v1_mirror_name(topics[1], mirror if rnd.random() < 0.5 else mirror + ".removed"),
                corr=7, flexible=False),
        ]
        data = b"".join(rnd.sample(kinds, rnd.randint(1, len(kinds))))
        s = socket.create_connection((PROXY_HOST, p.port), timeout=10)
        try:
            if rnd.random() < 0.5:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            s.sendall(data)
            # at once, or about when the probe (forwarded to the controller) or the store answers
            delay = rnd.choice([0, 0.001, 0.01]) if rnd.random() < 0.4 else rnd.uniform(0.01, 0.25)
            if delay:
                time.sleep(delay)
        except OSError as e:
            failures.append(repr(e))
        finally:
            s.close()

    def worker(seed):
        rnd = random.Random(seed)
        for i in range(30):
            one(rnd, seed * 100 + i)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:5]
    # kmirrord read them (not just the kernel), and some answers found their session gone
    wait_until(lambda: p.metric('kmirror_requests_total{api="StartMirrorTopics"}') >= sent_before + 20, 30, 0.2,
               "kmirrord to read the StartMirrorTopics requests")
    p.wait_log(r"answer to api key 320\d\d dropped: KM_ERR_CLOSED", timeout=30, start=mark)
    # Every session is gone again (probes and store results have found them closed).
    wait_until(lambda: p.metric("kmirror_client_connections") == 0, 30, 0.2, "the connections to close")
    time.sleep(1)  # store writes still under way land now
    assert p.running(), p.daemon.tail()
    sanitizer_free(p)
    serving(robust)
    # The topic operations still work, and each topic is in a state the machine knows.
    c = Client(p.bootstrap)
    try:
        def stopped():
            code, msg, per = c.topics(STOP, mirror, topics)
            # stopped now, or not in the mirror any more (never started, or stopped before)
            return all(per[t][0] in (0, 32004) or "STOPPED" in (per[t][1] or "") for t in topics)
        wait_until(stopped, 30, 0.5, "the topics to stop")
        code, msg, per = c.topics(START, mirror, topics)
        assert all(per[t] == (0, None) for t in topics), per
    finally:
        c.close()


# ---- malformed mirror requests -------------------------------------------------------------------

def exchange(p, data, timeout=10.0):
    """Send data on a new connection and read until kmirrord closes it or the timeout:
    (bytes received, closed, seconds)."""
    s = socket.create_connection((PROXY_HOST, p.port), timeout=5)
    t0 = time.monotonic()
    got, closed = b"", False
    try:
        s.sendall(data)
        s.settimeout(0.2)
        while time.monotonic() - t0 < timeout:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                if got:
                    break  # answered: done (the connection may stay open, as a broker's does)
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


MALFORMED = {
    # the topic array promises a name whose bytes are not there
    "start-truncated": (req(START, 0, cstr("m") + b"\x02" + b"\x20abc"), "malformed mirror request"),
    # an array count of about 2^31 in a short frame
    "start-huge-array": (req(START, 0, cstr("m") + b"\xff\xff\xff\xff\x07" + TAGS), "malformed mirror request"),
    "create-huge-configs": (req(CREATE, 0, cstr("m") + b"\xff\xff\xff\xff\x0f" + b"\x00" + TAGS),
                            "malformed mirror request"),
    # a string length far past the frame
    "describe-huge-string": (req(DESCRIBE, 0, b"\x02\xff\xff\xff\x7f" + b"\x00" + TAGS), "malformed mirror request"),
    # version 1 of an RPC that has only version 0
    "start-version-1": (req(START, 1, topics_body("m", ["t"])), "unsupported request: api key 32005 version 1"),
    "list-version-1": (req(LIST, 1, TAGS), "unsupported request: api key 32002 version 1"),
    # request header v1 (no tagged fields) where v2 is due: the body is read one byte late
    "start-header-v1": (req(START, 0, topics_body("m", ["t"]), flexible=False), None),
    # ... here the name's bytes read as a tag whose size runs past the frame
    "lmo-header-v1": (req(LMO, 0, cstr("mm") + b"\x00" + TAGS, flexible=False), "malformed mirror request header"),
    # trailing bytes after a whole body
    "list-trailing": (req(LIST, 0, TAGS + b"\x00\x00\x00"), "malformed mirror request"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_mirror_request(robust, name):
    p = robust["proxy"]
    data, logged = MALFORMED[name]
    mark = len(p.output())
    got, closed, secs = exchange(p, data, timeout=10)
    assert secs < 9, f"{name}: neither answered nor closed"
    if closed:
        assert got == b"", got
        # the close is explained in the log
        pat = logged or "malformed mirror request|malformed request header|unsupported request"
        assert "KM_ERR_NOMEM" not in p.output()[mark:]
        p.wait_log(pat, timeout=10, start=mark)
    else:
        # answered: one whole frame with the request's correlation id and an error
        (size,) = struct.unpack_from(">i", got, 0)
        assert size == len(got) - 4
        r = Reader(got[4:])
        assert r.i32() == 1
        assert logged is None, f"{name}: answered where a close was expected"
    serving(robust)


# ---- mirror.name through the legacy AlterConfigs and DescribeConfigs by key ----------------------

def broker_configs(cluster, topic):
    out = cluster.run_tool("configs", "--bootstrap-server", cluster.bootstrap, "--describe",
                           "--entity-type", "topics", "--entity-name", topic).stdout
    return out


def test_legacy_alter_configs_mirror_name(robust):
    """confluent-kafka's alter_configs is the legacy AlterConfigs: mirror.name=m starts, .paused
    pauses; the other configs of the request are the broker's (checked on the broker) until the
    topic is mirrored, then refused (the metadata sync's)."""
    p, mirror = robust["proxy"], robust["mirror"]
    topic = f"{mirror}-legacy"
    create_topic(p, topic, partitions=1, rf=1)
    a = AdminClient(p.conf())

    def alter(value, extra):
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"mirror.name": value, **extra})
        a.alter_configs([res])[res].result(timeout=30)

    alter(mirror, {"retention.ms": "3600000"})
    assert mirror_name_of(p, topic) == mirror
    out = broker_configs(p.cluster, topic)
    assert "retention.ms=3600000" in out and "mirror.name" not in out, out

    # While mirrored, its configs are the metadata sync's: other configs with mirror.name are refused, whole.
    with pytest.raises(Exception) as ei:
        alter(mirror + ".paused", {"retention.ms": "7200000", "cleanup.policy": "delete"})
    assert "its configs follow its source topic's" in str(ei.value), ei.value

    def paused():
        try:
            alter(mirror + ".paused", {})
            return True
        except Exception as e:  # pause only from MIRRORING: refused while PREPARING, saying so
            assert "PREPARING" in str(e), e
            return False
    wait_until(paused, 30, 0.5, "the legacy AlterConfigs to pause the topic")
    assert mirror_name_of(p, topic) == mirror + ".paused"
    # mirror.name alone: the topic's other configs are left as they are (no empty set replaces them)
    out = broker_configs(p.cluster, topic)
    assert "retention.ms=3600000" in out and "mirror.name" not in out, out
    alter(mirror, {})
    assert mirror_name_of(p, topic) == mirror
    assert "retention.ms=3600000" in broker_configs(p.cluster, topic)

    # a mirror that does not exist fails the resource with the store's message
    with pytest.raises(Exception) as ei:
        alter("no-such-mirror-legacy", {})
    assert "'no-such-mirror-legacy' does not exist" in str(ei.value), ei.value
    c = Client(p.bootstrap)
    try:
        code, msg, per = c.topics(STOP, mirror, [topic])
        assert per[topic] == (0, None), per
    finally:
        c.close()


def describe_configs_v4(c, topic, keys):
    """DescribeConfigs v4 of one topic, asking for keys (None: all): {name: (value, read_only)}."""
    karr = b"\x00" if keys is None else carray([cstr(k) for k in keys])
    body = carray([b"\x02" + cstr(topic) + karr + TAGS]) + b"\x00\x00" + TAGS
    r = c.call(32, 4, body)
    r.i32()
    out = {}
    for _ in range(r.uvarint() - 1):
        code, msg = r.i16(), r.cstr()
        assert code == 0, msg
        r.take(1)
        assert r.cstr() == topic
        for _ in range(r.uvarint() - 1):
            name, value = r.cstr(), r.cstr()
            read_only = r.take(1) != b"\x00"
            r.take(2)  # source, sensitive
            for _ in range(r.uvarint() - 1):  # synonyms
                r.cstr(), r.cstr(), r.take(1), r.tags()
            r.take(1)
            r.cstr()
            r.tags()
            out[name] = (value, read_only)
        r.tags()
    return out


def test_describe_configs_by_key_shows_mirror_name(robust):
    p, mirror, topics = robust["proxy"], robust["mirror"], robust["topics"]
    c = Client(p.bootstrap)
    try:
        code, msg, per = c.topics(START, mirror, [topics[0]])
        assert per[topics[0]][0] == 0 or "PREPARING" in per[topics[0]][1] or "MIRRORING" in per[topics[0]][1]
        got = describe_configs_v4(c, topics[0], ["mirror.name"])
        assert got == {"mirror.name": (mirror, True)}, got
        got = describe_configs_v4(c, topics[0], ["mirror.name", "retention.ms"])
        assert set(got) == {"mirror.name", "retention.ms"} and got["mirror.name"][0] == mirror, got
        got = describe_configs_v4(c, topics[0], ["retention.ms"])
        assert set(got) == {"retention.ms"}, got
        assert describe_configs_v4(c, topics[0], None)["mirror.name"][0] == mirror
    finally:
        c.close()
    # kafka-configs.sh --describe (Java Admin) shows it too
    assert mirror_name_of(p, topics[0]) == mirror


def test_robust_proxy_exits_cleanly(robust):
    """Last in the module: kmirrord drains and exits 0 with no sanitizer report."""
    p = robust["proxy"]
    assert p.stop() == 0, p.daemon.tail()
    sanitizer_free(p)


# ---- a destination without an authorizer ---------------------------------------------------------

@pytest.fixture(scope="module")
def noauth_cluster():
    """A one-node destination with no authorizer at all (authorizer.class.name empty)."""
    c = KafkaCluster("noauth", brokers=1, overrides={"authorizer.class.name": ""})
    c.start()
    yield c
    c.stop()


def test_no_authorizer_allows_every_rpc(kmirrord_bin, noauth_cluster, source_cluster, tmp_path):
    cl = noauth_cluster
    # there really is no authorizer: the broker refuses to list ACLs
    r = cl.run_tool("acls", "--bootstrap-server", cl.bootstrap, "--list", check=False)
    said = r.stdout + r.stderr
    assert r.returncode != 0 or "No Authorizer" in said or "Security features are disabled" in said, said
    p = Proxy(kmirrord_bin, cl, str(tmp_path), name="kmirrord-noauth").start(timeout=60)
    try:
        c = Client(p.bootstrap)
        wait_until(lambda: c.list()[0] == 0, 60, 0.5, "the mirror state to load")
        topic = "noauth-t"
        create_topic(p, topic, partitions=1, rf=1)
        # a reachable source without the topic: the partition waits for it while MIRRORING
        assert c.create("na", {"bootstrap.servers": source_cluster.bootstrap}) == (0, None)
        # past the authorizer: the store judges the option (this one is fixed at creation)
        code, msg = c.alter("na", {"mirror.topic.num.partitions": "3"})
        assert code not in (TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED) and "authoriz" not in (msg or ""), msg
        assert c.list()[0] == 0 and c.describe(["na"])[0] == 0 and c.lmo("na")[0] == 0
        code, msg, per = c.topics(START, "na", [topic])
        assert per[topic] == (0, None), per

        def paused():
            code, msg, per = c.topics(PAUSE, "na", [topic])
            return per[topic][0] == 0
        wait_until(paused, 30, 0.5, "the topic to pause")
        code, msg, per = c.topics(RESUME, "na", [topic])
        assert per[topic] == (0, None), per
        code, msg, per = c.topics(STOP, "na", [topic])
        assert per[topic] == (0, None), per
        # The stop answers once STOPPING is persisted; the delete waits for STOPPED (its refusal says so).
        wait_until(lambda: c.delete("na") == (0, None), 30, 0.2, "the mirror deleted once its topic is STOPPED")
        errs = {k: v for k, v in p.metrics().items() if k.startswith("kmirror_mirror_rpc_errors_total")}
        assert not any("AUTHORIZATION" in k for k in errs), errs
        c.close()
    finally:
        p.stop()
        sanitizer_free(p)
