"""Mirror operations through kmirrord: the mirror RPCs (spoken by a small raw-protocol client
here), mirror.name through stock admin clients (kafka-configs.sh and confluent-kafka's
AdminClient), and the destination's authorizer deciding who may call them (SASL listener)."""

import socket
import struct

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from harness import USERS, uvarint
from mirror_cli import Cli, kmirror_bin, wait_states  # noqa: F401
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import create_topic, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

CREATE, DELETE, LIST, DESCRIBE, ALTER, START, STOP, PAUSE, RESUME, LMO = range(32000, 32010)
TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 29, 31


# ---- a minimal Kafka protocol client (flexible versions only, as the mirror RPCs are) ----------



def cstr(s):
    if s is None:
        return b"\x00"
    b = s.encode()
    return uvarint(len(b) + 1) + b


def carray(items):
    return uvarint(len(items) + 1) + b"".join(items)


TAGS = b"\x00"


class Reader:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, n):
        v = self.b[self.p:self.p + n]
        self.p += n
        return v

    def i16(self):
        return struct.unpack(">h", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def uvarint(self):
        n = shift = 0
        while True:
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    def cstr(self):
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1).decode()

    def tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


class Client:
    """One connection to kmirrord, optionally logged in with SASL PLAIN."""

    def __init__(self, bootstrap, user=None):
        host, port = bootstrap.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=30)
        self.corr = 0
        if user:
            # SaslHandshake v1 (header v1), then SaslAuthenticate v2 (flexible).
            mech = b"PLAIN"
            r = self.call(17, 1, struct.pack(">h", len(mech)) + mech, header=1)
            assert r.i16() == 0
            token = b"\x00" + user.encode() + b"\x00" + USERS[user].encode()
            r = self.call(36, 2, uvarint(len(token) + 1) + token + TAGS)
            assert r.i16() == 0, r.cstr()

    def call(self, key, version, body, header=2):
        self.corr += 1
        cid = b"kmirror-test"
        h = struct.pack(">hhih", key, version, self.corr, len(cid)) + cid + (TAGS if header == 2 else b"")
        frame = h + body
        self.s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", self.recv(4))[0]
        r = Reader(self.recv(size))
        assert r.i32() == self.corr
        if header == 2 and key not in (18,):
            r.tags()
        return r

    def recv(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            if not chunk:
                raise ConnectionError("kmirrord closed the connection")
            b += chunk
        return b

    def close(self):
        self.s.close()

    # -- the RPCs: (error code, message[, per-topic results]) --

    def simple(self, key, body):
        r = self.call(key, 0, body)
        r.i32()
        return r.i16(), r.cstr()

    def create(self, name, configs, validate_only=False):
        cfg = [cstr(k) + cstr(v) + TAGS for k, v in configs.items()]
        return self.simple(CREATE, cstr(name) + carray(cfg) + bytes([validate_only]) + TAGS)

    def delete(self, name):
        return self.simple(DELETE, cstr(name) + TAGS)

    def alter(self, name, configs):
        cfg = [cstr(k) + cstr(v) + TAGS for k, v in configs.items()]
        return self.simple(ALTER, cstr(name) + carray(cfg) + b"\x00" + TAGS)

    def list(self):
        return self.simple(LIST, TAGS)

    def describe(self, names=None):
        arr = b"\x00" if names is None else carray([cstr(n) for n in names])
        return self.simple(DESCRIBE, arr + b"\x00" + TAGS)

    def lmo(self, name):
        return self.simple(LMO, cstr(name) + b"\x00" + TAGS)

    def topics(self, key, mirror, topics):
        r = self.call(key, 0, cstr(mirror) + carray([cstr(t) + TAGS for t in topics]) + TAGS)
        r.i32()
        code, msg = r.i16(), r.cstr()
        r.cstr()
        per = {}
        for _ in range(r.uvarint() - 1):
            name, tcode, tmsg = r.cstr(), r.i16(), r.cstr()
            r.tags()
            per[name] = (tcode, tmsg)
        return code, msg, per


def mirror_name_of(proxy, topic):
    out = proxy.tool("configs", "--describe", "--entity-type", "topics", "--entity-name", topic).stdout
    for part in out.replace(",", " ").split():
        if part.startswith("mirror.name="):
            return part.split("=", 1)[1]
    return None


# ---- mirror.name through stock admin clients --------------------------------------------------

def test_mirror_name_through_kafka_configs_and_admin_client(cluster, source_cluster, proxy_factory, kmirror_bin,
                                                           topic_name):
    p = proxy_factory(cluster)
    c = Client(p.bootstrap)
    cli = Cli(kmirror_bin, p.bootstrap)
    mirror = f"m-{topic_name}"[:60].replace("_", "-")
    try:
        # The mirror itself comes from the kmirror CLI; its topics from stock admin clients.
        # A reachable source without these topics: the partitions wait for them while MIRRORING.
        cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
        t1, t2 = topic_name + "-a", topic_name + "-b"
        create_topic(p, t1, partitions=2, rf=min(3, cluster.n_brokers))
        create_topic(p, t2, partitions=1, rf=min(3, cluster.n_brokers))

        # kafka-configs.sh starts t1 from the mirror; the broker never sees mirror.name.
        p.tool("configs", "--alter", "--entity-type", "topics", "--entity-name", t1,
               "--add-config", f"mirror.name={mirror},retention.ms=3600000")
        assert mirror_name_of(p, t1) == mirror

        def direct_configs():
            return p.cluster.run_tool("configs", "--bootstrap-server", p.cluster.bootstrap, "--describe",
                                      "--entity-type", "topics", "--entity-name", t1).stdout
        # Each broker applies a config change from the metadata log: the one that answers the
        # describe may see it a moment after the alter's answer.
        wait_until(lambda: "retention.ms=3600000" in direct_configs(), 15, 0.2, "retention.ms on the broker")
        assert "mirror.name" not in direct_configs()
        wait_states(cli, mirror, {t1: "MIRRORING"})

        # confluent-kafka's AdminClient starts t2.
        a = AdminClient(p.conf())
        res = ConfigResource(ConfigResource.Type.TOPIC, t2, incremental_configs=[
            ConfigEntry("mirror.name", mirror, incremental_operation=AlterConfigOpType.SET)])
        a.incremental_alter_configs([res])[res].result(timeout=30)
        wait_states(cli, mirror, {t1: "MIRRORING", t2: "MIRRORING"})
        code, msg, per = c.topics(STOP, mirror, ["no-such-topic-x"])
        assert per["no-such-topic-x"][0] != 0 and per["no-such-topic-x"][1]

        # The mirror driver moves PREPARING -> MIRRORING; then .paused pauses.
        def mirroring():
            code, msg, per = c.topics(PAUSE, mirror, [t2])
            return per[t2][0] == 0
        res = ConfigResource(ConfigResource.Type.TOPIC, t1, incremental_configs=[
            ConfigEntry("mirror.name", mirror + ".paused", incremental_operation=AlterConfigOpType.SET)])

        def paused_by_config():
            try:
                a.incremental_alter_configs([res])[res].result(timeout=30)
                return True
            except Exception as e:  # refused while PREPARING: says so
                assert "PREPARING" in str(e) or "MIRRORING" in str(e) or "PAUSING" in str(e), e
                return False
        wait_until(paused_by_config, 30, 0.5, "t1 to pause through mirror.name")
        wait_until(lambda: mirror_name_of(p, t1) == mirror + ".paused", 30, 0.5, "t1 shown paused")
        wait_states(cli, mirror, {t1: "PAUSED"})
        wait_until(mirroring, 30, 0.5, "t2 to pause through PauseMirrorTopics")

        # mirror.name=m resumes; .removed stops; kafka-configs shows each.
        p.tool("configs", "--alter", "--entity-type", "topics", "--entity-name", t1,
               "--add-config", f"mirror.name={mirror}")
        assert mirror_name_of(p, t1) == mirror
        wait_states(cli, mirror, {t1: "MIRRORING"})
        p.tool("configs", "--alter", "--entity-type", "topics", "--entity-name", t1,
               "--add-config", f"mirror.name={mirror}.removed")
        wait_until(lambda: mirror_name_of(p, t1) == mirror + ".removed", 30, 0.5, "t1 stopped")
        wait_states(cli, mirror, {t1: "STOPPED", t2: "PAUSED"})
        # kmirror describe's table shows the same, one row per partition.
        rows = [ln.split() for ln in cli.run("describe", "--mirror", mirror).stdout.splitlines()]
        assert [r[2] for r in rows if r and r[0] == t1] == ["STOPPED", "STOPPED"]

        # An invalid transition through mirror.name fails with the store's message.
        bad = ConfigResource(ConfigResource.Type.TOPIC, t1, incremental_configs=[
            ConfigEntry("mirror.name", mirror + ".paused", incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(Exception) as ei:
            a.incremental_alter_configs([bad])[bad].result(timeout=30)
        assert t1 in str(ei.value)

        # __mirror_state is kmirrord's alone.
        st = ConfigResource(ConfigResource.Type.TOPIC, "__mirror_state", incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(Exception) as ei:
            a.incremental_alter_configs([st])[st].result(timeout=30)
        assert "written and configured only by kmirrord" in str(ei.value)

        # The RPCs: validation errors carry messages.
        code, msg = c.create("", {"bootstrap.servers": "x:1"})
        assert code == 42 and msg == "mirror name is empty"
        code, msg, per = c.topics(START, mirror, [t1, t1])
        assert code == 42 and "more than once" in msg
        code, msg = c.describe([mirror])
        assert code == 0
        code, msg = c.lmo(mirror)
        assert code == 0
    finally:
        c.close()


# ---- authorization by the destination's authorizer ------------------------------------------

@pytest.fixture
def sasl_proxy(proxy_factory, dest_cluster3):
    return proxy_factory(dest_cluster3, upstream=dest_cluster3.sasl_bootstrap,
                         upstream_sasl_mechanism="SCRAM-SHA-512", upstream_sasl_username="admin",
                         upstream_sasl_password=USERS["admin"])


def test_each_rpc_is_authorized_as_the_caller(sasl_proxy, dest_cluster3, source_cluster, topic_name):
    p = sasl_proxy
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 3, 60, what="the proxy's login")
    admin = Client(p.bootstrap, "admin")
    wait_until(lambda: admin.list()[0] == 0, 60, 0.5, "the mirror state to load")
    mirror = "auth-" + topic_name.replace("_", "-")[:40]
    topic = topic_name
    from confluent_kafka.admin import NewTopic
    a = AdminClient(p.conf(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                              "sasl.username": "admin", "sasl.password": USERS["admin"]}))
    a.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=60)
    dest_cluster3.wait_topic(topic, 1)
    assert admin.create(mirror, {"bootstrap.servers": source_cluster.bootstrap}) == (0, None)
    acl = ["--allow-principal", "User:alice", "--operation", "AlterConfigs", "--operation",
           "DescribeConfigs"]
    dest_cluster3.tool("acls", "--add", *acl, "--cluster", admin=True)
    dest_cluster3.tool("acls", "--add", *acl, "--topic", topic, admin=True)
    try:
        bob = Client(p.bootstrap, "bob")
        # each of the ten, refused with its documented code
        assert bob.create(mirror + "-x", {"bootstrap.servers": "a:1"})[0] == CLUSTER_AUTHORIZATION_FAILED
        assert bob.alter(mirror, {"mirror.topic.num.partitions": "3"})[0] == CLUSTER_AUTHORIZATION_FAILED
        code, msg = bob.delete(mirror)
        assert code == CLUSTER_AUTHORIZATION_FAILED and "ALTER_CONFIGS on the cluster" in msg
        code, msg = bob.list()
        assert code == CLUSTER_AUTHORIZATION_FAILED and "DESCRIBE_CONFIGS" in msg
        assert bob.describe()[0] == CLUSTER_AUTHORIZATION_FAILED
        assert bob.lmo(mirror)[0] == CLUSTER_AUTHORIZATION_FAILED
        for key in (START, STOP, PAUSE, RESUME):
            code, msg, per = bob.topics(key, mirror, [topic])
            assert per[topic][0] == TOPIC_AUTHORIZATION_FAILED, (key, per)
            assert topic in per[topic][1]
        bob.close()

        # alice has the ACLs: every RPC gets past the authorizer (and the store answers).
        alice = Client(p.bootstrap, "alice")
        assert alice.list()[0] == 0
        assert alice.describe([mirror])[0] == 0
        assert alice.lmo(mirror)[0] == 0
        code, msg, per = alice.topics(START, mirror, [topic])
        assert per[topic] == (0, None), per
        code, msg, per = alice.topics(RESUME, mirror, [topic])
        assert per[topic][0] not in (0, TOPIC_AUTHORIZATION_FAILED) and per[topic][1]
        code, msg, per = alice.topics(STOP, mirror, [topic])
        assert per[topic] == (0, None), per
        assert alice.alter(mirror, {"mirror.topic.num.partitions": "3"})[0] != CLUSTER_AUTHORIZATION_FAILED
        assert alice.create(mirror + "-2", {"bootstrap.servers": "a:1"}) == (0, None)
        assert alice.delete(mirror + "-2") == (0, None)
        alice.close()
    finally:
        dest_cluster3.tool("acls", "--remove", "--force", *acl, "--cluster", admin=True)
        dest_cluster3.tool("acls", "--remove", "--force", *acl, "--topic", topic, admin=True)
        admin.close()


def test_topic_check_is_matched_by_name(sasl_proxy, dest_cluster3, source_cluster, topic_name):
    """The broker answers the topic probe's resources in its own order (refused ones first), so
    each topic's verdict must be found by its name: alice may alter "mine" only, and a start of
    [mine, theirs] must start mine and refuse theirs, never the other way round."""
    p = sasl_proxy
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 3, 60, what="the proxy's login")
    admin = Client(p.bootstrap, "admin")
    wait_until(lambda: admin.list()[0] == 0, 60, 0.5, "the mirror state to load")
    mirror = "order-" + topic_name.replace("_", "-")[:40]
    mine, theirs = topic_name + "-mine", topic_name + "-theirs"
    from confluent_kafka.admin import NewTopic
    a = AdminClient(p.conf(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                              "sasl.username": "admin", "sasl.password": USERS["admin"]}))
    for t in (mine, theirs):
        a.create_topics([NewTopic(t, 1, 3)])[t].result(timeout=60)
        dest_cluster3.wait_topic(t, 1)
    assert admin.create(mirror, {"bootstrap.servers": source_cluster.bootstrap}) == (0, None)
    acl = ["--allow-principal", "User:alice", "--operation", "AlterConfigs"]
    # theirs has an ACL (bob's), so allow.everyone.if.no.acl.found does not let alice through
    other = ["--allow-principal", "User:bob", "--operation", "AlterConfigs"]
    dest_cluster3.tool("acls", "--add", *acl, "--topic", mine, admin=True)
    dest_cluster3.tool("acls", "--add", *other, "--topic", theirs, admin=True)
    try:
        alice = Client(p.bootstrap, "alice")
        code, msg, per = alice.topics(START, mirror, [mine, theirs])
        assert per[theirs][0] == TOPIC_AUTHORIZATION_FAILED, per
        assert theirs in per[theirs][1], per
        assert per[mine] == (0, None), per
        # theirs never reached the store: a stop by admin finds it not in the mirror
        code, msg, per = admin.topics(STOP, mirror, [theirs, mine])
        assert per[theirs][0] == 32004, per  # TOPIC_NOT_IN_CLUSTER_MIRROR
        assert per[mine] == (0, None), per
        alice.close()
    finally:
        dest_cluster3.tool("acls", "--remove", "--force", *acl, "--topic", mine, admin=True)
        dest_cluster3.tool("acls", "--remove", "--force", *other, "--topic", theirs, admin=True)
        admin.close()
