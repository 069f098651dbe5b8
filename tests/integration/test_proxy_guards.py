"""Writes kmirrord must refuse whatever the mirror's state: config requests that do not decode
(fail closed: a broker ignores trailing bytes, so a request kmirrord cannot read could still
reconfigure the state topic), and internal topics (__*, the state topic) as mirror topics, by
StartMirrorTopics and by mirror.name. Each test sends what a client could send through kmirrord
and checks, on the destination itself, that nothing changed."""

import struct
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until
from test_mirror_configs import START, Client

pytestmark = [pytest.mark.proxy, main_release_only]

INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED = 17, 29


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def topic_configs(cluster, topic):
    """The topic's configs as the destination itself says (not through kmirrord)."""
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {k: v.value for k, v in a.describe_configs([res])[res].result(timeout=30).items()}


@pytest.fixture
def guarded(proxy_factory, dest_cluster, source_cluster):
    """A kmirrord with a state topic of its own and one mirror, but no mirrored topic: nothing is
    read-only. Returns (proxy, state topic, mirror)."""
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    mirror = unique("m")
    p = proxy_factory(dest_cluster, mirror_state_topic=state_topic)
    # Until it has read the state (here: found no state topic), kmirrord answers mirror RPCs "loading".
    wait_until(lambda: p.http_get("/readyz")[0] == 200, 60, 0.2, "kmirrord to be ready")
    c = Client(p.bootstrap)
    try:
        code, msg = c.create(mirror, {"bootstrap.servers": source_cluster.bootstrap})
        assert code == 0, msg  # written to the state topic, which exists from then on
    finally:
        c.close()
    return p, state_topic, mirror


# ---- config requests that do not decode fail closed ------------------------------------------

def iac_v0(topic, name, value, trailing=b""):
    """IncrementalAlterConfigs v0 (the version before flexible ones) of one topic config, SET, with bytes after it."""
    t, n, v = topic.encode(), name.encode(), value.encode()
    resource = (struct.pack(">bh", 2, len(t)) + t + struct.pack(">i", 1) + struct.pack(">h", len(n)) + n +
                struct.pack(">bh", 0, len(v)) + v)
    return struct.pack(">i", 1) + resource + b"\x00" + trailing


def iac_answer(r):
    """(error code, message) of the one resource of an IncrementalAlterConfigs v0 answer."""
    r.i32()  # throttle
    assert r.i32() == 1
    code = r.i16()
    ln = r.i16()
    msg = r.take(ln).decode() if ln >= 0 else None
    return code, msg


@pytest.mark.parametrize("trailing", [b"", b"\x00", b"\x01\x02\x03"])
def test_state_topic_config_fails_closed(guarded, dest_cluster, trailing):
    p, state_topic, mirror = guarded
    assert topic_configs(dest_cluster, state_topic)["cleanup.policy"] == "compact"
    c = Client(p.bootstrap)
    try:
        r = c.call(44, 0, iac_v0(state_topic, "cleanup.policy", "delete", trailing), header=1)
        code, msg = iac_answer(r)
        print("answer:", code, msg)
        assert code != 0
    except ConnectionError:
        pass  # closing the connection is failing closed too
    finally:
        c.close()
    assert topic_configs(dest_cluster, state_topic)["cleanup.policy"] == "compact"


# ---- internal topics are never mirror topics -----------------------------------------------

@pytest.fixture
def internal_topic(dest_cluster):
    """A topic named like an internal one (__*), created on the destination itself."""
    name = f"__kmtest_{uuid.uuid4().hex[:8]}"
    a = AdminClient({"bootstrap.servers": dest_cluster.bootstrap})
    a.create_topics([NewTopic(name, 1, 1)], operation_timeout=30)[name].result(timeout=60)
    return name


def test_internal_topics_refused_by_start(guarded, internal_topic, dest_cluster):
    p, state_topic, mirror = guarded
    c = Client(p.bootstrap)
    try:
        # The name alone decides, before any cluster is asked: the last one exists nowhere (nor does the
        # state topic until the first mirror is written), and is refused as internal, not as missing.
        for topic in (internal_topic, state_topic, f"__kmtest_nowhere_{uuid.uuid4().hex[:8]}"):
            code, msg, per = c.topics(START, mirror, [topic])
            tcode, tmsg = per[topic]
            print(f"start {topic}:", tcode, tmsg)
            assert tcode == INVALID_TOPIC_EXCEPTION, (topic, tcode, tmsg)
            assert "internal" in tmsg, tmsg
    finally:
        c.close()


def test_internal_topics_refused_by_mirror_name(guarded, internal_topic):
    p, state_topic, mirror = guarded
    a = AdminClient(p.conf())
    for topic, code in ((internal_topic, INVALID_TOPIC_EXCEPTION), (state_topic, TOPIC_AUTHORIZATION_FAILED)):
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("mirror.name", mirror, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as e:
            a.incremental_alter_configs([res])[res].result(timeout=30)
        print(f"mirror.name on {topic}:", e.value)
        assert e.value.args[0].code() == code, e.value


# ---- the state topic is kmirrord's alone, whatever is read-only ------------------------------

def watermarks(cluster, topic):
    """[(low, high)] of every partition, as the destination itself says."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique("wm")})
    found = []

    def read():
        # A topic created a moment ago may not have its leader in every broker's metadata yet.
        try:
            found[:] = [c.get_watermark_offsets(TopicPartition(topic, i), timeout=30)
                        for i in range(partition_count(cluster, topic))]
            return True
        except KafkaException as e:
            if e.args[0].code() not in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                                        KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise
            return False
    try:
        wait_until(read, 30, 0.2, f"the watermarks of {topic}")
        return found
    finally:
        c.close()


def forged_since(cluster, topic, before):
    """The records of topic past the marks `before` whose value is b"forged" (kmirrord's own records
    land there too: its instance record every 10 s, docs/state.md, "Instances")."""
    from confluent_kafka import Consumer, TopicPartition
    after = watermarks(cluster, topic)
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique("forged"),
                  "enable.auto.commit": False})
    found, want = [], sum(hi - b for (_, b), (_, hi) in zip(before, after))
    try:
        c.assign([TopicPartition(topic, i, b) for i, (_, b) in enumerate(before) if after[i][1] > b])
        deadline = time.monotonic() + 30
        got = 0
        while got < want and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            got += 1
            if m.value() == b"forged":
                found.append((m.partition(), m.offset(), m.key()))
        assert got >= want, f"read {got} of the {want} records written since"
        return found
    finally:
        c.close()


def partition_count(cluster, topic):
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    md = a.list_topics(topic, timeout=30).topics[topic]
    assert md.error is None, md.error
    return len(md.partitions)


def test_state_topic_produce_refused_by_name(guarded, dest_cluster):
    """A forged keyed record through kmirrord (librdkafka: Produce by topic name), nothing read-only."""
    from confluent_kafka import Producer
    p, state_topic, mirror = guarded
    before = watermarks(dest_cluster, state_topic)
    errors = []
    pr = Producer(p.conf(**{"message.timeout.ms": 15000, "retries": 0}))
    pr.produce(state_topic, key=f"mirror/{mirror}".encode(), value=b"forged",
               on_delivery=lambda err, msg: errors.append(err))
    pr.flush(30)
    print("delivery:", errors)
    assert errors and errors[0] is not None and errors[0].code() == TOPIC_AUTHORIZATION_FAILED, errors
    assert not forged_since(dest_cluster, state_topic, before)


def test_state_topic_produce_refused_by_id(guarded, dest_cluster):
    """The same with the Java producer, which names the topic by its id (Produce v13)."""
    p, state_topic, mirror = guarded
    before = watermarks(dest_cluster, state_topic)
    r = p.tool("console-producer", "--topic", state_topic, "--property", "parse.key=true",
               "--producer-property", "delivery.timeout.ms=15000", "--producer-property", "request.timeout.ms=10000",
               input=f"mirror/{mirror}\tforged\n", check=False, timeout=120)
    print(r.stdout[-2000:], r.stderr[-2000:])
    assert not forged_since(dest_cluster, state_topic, before)
    p.wait_log(r"refused Produce v13 .* on topic id ")  # the Java client's log is quiet here; kmirrord's says it


def test_state_topic_admin_refused(guarded, dest_cluster):
    """DeleteRecords, CreatePartitions and DeleteTopics on the state topic, nothing read-only."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import NewPartitions
    p, state_topic, mirror = guarded
    before, nparts = watermarks(dest_cluster, state_topic), partition_count(dest_cluster, state_topic)
    a = AdminClient(p.conf())
    # (A compacted topic's records cannot be deleted by any client: the broker answers POLICY_VIOLATION
    # itself, so DeleteRecords is checked for "refused", the other two for kmirrord's refusal.)
    end = TopicPartition(state_topic, 0, before[0][1])
    with pytest.raises(KafkaException) as e:
        a.delete_records([end])[end].result(timeout=30)
    print("DeleteRecords", e.value)
    calls = {
        "CreatePartitions": lambda: a.create_partitions([NewPartitions(state_topic, nparts + 1)])[state_topic].result(
            timeout=30),
        "DeleteTopics": lambda: a.delete_topics([state_topic], operation_timeout=30)[state_topic].result(timeout=30),
    }
    for what, call in calls.items():
        with pytest.raises(KafkaException) as e:
            call()
        print(what, e.value)
        assert e.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED, (what, e.value)
    # Nothing deleted (kmirrord's own records may have moved the high watermarks meanwhile).
    assert [lo for lo, _ in watermarks(dest_cluster, state_topic)] == [lo for lo, _ in before]
    assert partition_count(dest_cluster, state_topic) == nparts


def test_state_topic_create_refused(proxy_factory, dest_cluster):
    """A client creating the state topic (before kmirrord has) with a policy of its choosing."""
    from confluent_kafka.admin import NewTopic as NT
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    p = proxy_factory(dest_cluster, mirror_state_topic=state_topic)
    a = AdminClient(p.conf())
    with pytest.raises(KafkaException) as e:
        a.create_topics([NT(state_topic, 1, 1, config={"cleanup.policy": "delete"})],
                        operation_timeout=30)[state_topic].result(timeout=30)
    print(e.value)
    assert e.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED, e.value
    md = AdminClient({"bootstrap.servers": dest_cluster.bootstrap}).list_topics(timeout=30)
    assert state_topic not in md.topics


# ---- nothing passes before the state has loaded ---------------------------------------------

def leader_of(cluster, topic):
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=30).topics[topic]
    return md.partitions[0].leader if md.error is None and 0 in md.partitions else -1


def test_requests_wait_for_the_state(proxy_factory, dest_cluster3, source_cluster):
    """A kmirrord whose store cannot load (the state topic's only replica is on a stopped broker)
    must not let a Produce to a mirror topic through: it waits, and /readyz and /healthz say why.
    Once the broker is back the store loads and the same Produce is refused as read-only."""
    from confluent_kafka import Producer
    cluster = dest_cluster3
    state_topic = f"__mirror_state_{uuid.uuid4().hex[:8]}"
    opts = dict(mirror_state_topic=state_topic, mirror_state_partitions=1, mirror_state_replication_factor=1)
    mirror, ro = unique("m"), unique("ro")
    p1 = proxy_factory(cluster, **opts)
    c = Client(p1.bootstrap)
    try:
        # Its store loads first (a new state topic on three brokers): COORDINATOR_LOAD_IN_PROGRESS
        # until then, asked again as a client would.
        out = []
        wait_until(lambda: out.append(c.create(mirror, {"bootstrap.servers": source_cluster.bootstrap})) or
                   out[-1][0] != 14, 60, 0.5, what=lambda: f"the create past the store's load: {out[-1:]}")
        code, msg = out[-1]
        assert code == 0, msg
        wait_until(lambda: leader_of(cluster, state_topic) >= 0, 30, what="the state topic's leader")
        held = leader_of(cluster, state_topic)
        others = [b for b in cluster.broker_ids if b != held]
        src = AdminClient({"bootstrap.servers": source_cluster.bootstrap})
        src.create_topics([NewTopic(ro, 1, 1)], operation_timeout=30)[ro].result(timeout=60)
        cluster.tool("topics", "--create", "--topic", ro, "--replica-assignment", ":".join(map(str, others)))
        wait_until(lambda: leader_of(cluster, ro) in others, 30, what="the mirror topic's leader")
        code, msg, per = c.topics(START, mirror, [ro])
        assert per[ro][0] == 0, per
    finally:
        c.close()
    p1.stop()

    def produce_one(proxy):
        errors = []
        pr = Producer(proxy.conf(**{"message.timeout.ms": 8000, "request.timeout.ms": 5000, "retries": 0}))
        pr.produce(ro, b"a write through kmirrord", on_delivery=lambda err, m: errors.append(err))
        pr.flush(30)
        return errors[0] if errors else "no delivery report"

    cluster.stop_broker(held)
    try:
        p2 = proxy_factory(cluster, **opts)
        err = produce_one(p2)
        print("before the state loaded:", err)
        assert err is not None, "a Produce to a mirror topic passed before the state had loaded"
        assert watermarks(cluster, ro) == [(0, 0)]
        for path in ("/readyz", "/healthz"):
            status, body = p2.http_get(path)
            print(path, status, body)
            assert status == 503 and "mirror state" in body, (path, status, body)
    finally:
        cluster.start_broker(held)
    wait_until(lambda: p2.http_get("/readyz")[0] == 200, 120, 0.5, "kmirrord to be ready")
    err = produce_one(p2)
    print("after:", err)
    assert err is not None and err.code() not in (-185, -192), err  # refused by kmirrord, not a timeout
    assert watermarks(cluster, ro) == [(0, 0)]


# ---- resources: what a client can make kmirrord do before it is authorized ------------------

def test_mirror_rpc_names_checked_in_linear_time(guarded):
    """DescribeMirrors naming 60,000 distinct topics (a 0.5 MB frame, under the mirror RPC cap):
    the duplicate check runs before the request is authorized, so it must not be quadratic (1.8
    billion comparisons before); kmirrord answers at once and serves other connections meanwhile."""
    import time
    from test_mirror_configs import DESCRIBE, carray, cstr
    p, state_topic, mirror = guarded
    names = [cstr(f"t{i:05d}") for i in range(60000)]
    body = carray([cstr(mirror)]) + carray(names) + b"\x00"
    c = Client(p.bootstrap)
    try:
        t0 = time.monotonic()
        r = c.call(DESCRIBE, 0, body)
        elapsed = time.monotonic() - t0
        r.i32()
        print(f"DescribeMirrors with {len(names)} topics answered in {elapsed * 1000:.0f} ms: error {r.i16()}")
    finally:
        c.close()
    assert elapsed < 2.0, f"{elapsed:.1f} s for the check of {len(names)} names"


@pytest.mark.parametrize("key,size,option", [(36, 600 * 1024, "max_auth_frame_bytes"),
                                             (32003, 2 * 1024 * 1024, "max_local_frame_bytes")])
def test_small_requests_have_small_frames(guarded, key, size, option):
    """A SaslAuthenticate over 512 KiB (what a broker takes before authentication) and a mirror RPC
    over 1 MiB (kmirrord reads and decodes it itself) close the connection at their header: the
    rest of the frame is never read or buffered."""
    import socket as sk
    p, state_topic, mirror = guarded
    host, port = p.bootstrap.rsplit(":", 1)
    s = sk.create_connection((host, int(port)), timeout=10)
    try:
        cid = b"kmirror-test"
        head = struct.pack(">hhih", key, 2 if key == 36 else 0, 1, len(cid)) + cid + b"\x00"
        s.sendall(struct.pack(">i", len(head) + size) + head + bytes(1024))  # the head the proxy reads first
        s.settimeout(10)
        try:
            closed = s.recv(1) == b""
        except ConnectionResetError:
            closed = True
        except sk.timeout:
            closed = False
    finally:
        s.close()
    assert closed, f"a {size}-byte frame of api key {key} was taken"
    p.wait_log(rf"request frame of {size + len(head)} bytes is over {option}")


def test_mirror_files_confined(proxy_factory, dest_cluster, source_cluster, tmp_path):
    """A mirror's ssl.*.location values are files kmirrord reads with its own rights, chosen by
    whoever may create a mirror: only files inside mirror_file_dir are taken (links and .. resolved)."""
    inside = tmp_path / "mirror-files"
    inside.mkdir()
    ca = inside / "ca.pem"
    ca.write_text("not read by this test\n")
    (tmp_path / "elsewhere.pem").write_text("x\n")
    bare = proxy_factory(dest_cluster, name="kmirrord-nodir", mirror_state_topic=f"__mirror_state_{uuid.uuid4().hex[:8]}")
    confined = proxy_factory(dest_cluster, name="kmirrord-dir", mirror_file_dir=str(inside),
                             mirror_state_topic=f"__mirror_state_{uuid.uuid4().hex[:8]}")
    cases = [(bare, str(ca), False), (confined, "/etc/passwd", False),
             (confined, f"{inside}/../elsewhere.pem", False), (confined, str(ca), True)]
    for p, path, ok in cases:
        c = Client(p.bootstrap)
        try:
            code, msg = c.create(unique("files"), {"bootstrap.servers": source_cluster.bootstrap,
                                                   "security.protocol": "SSL", "ssl.ca.location": path},
                                 validate_only=True)
        finally:
            c.close()
        print(f"{p.name} ssl.ca.location={path}: {code} {msg}")
        assert (code == 0) == ok, (path, code, msg)
        if not ok:
            assert "mirror_file_dir" in msg, msg
