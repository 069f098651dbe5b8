"""The test bed itself: real clusters, and each kind of real client (confluent-kafka, the Java
tools, kcat) producing and consuming keyed, headered, lz4-compressed records through them."""

import json
import os
import re
import shutil
import struct
import sys
import subprocess
import time
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from harness import Daemon, free_port, metadata_brokers, read_batches
from mirror_data import main_release_only

# Release-independent: on the pom's release only (mirror_data.ON_MAIN_RELEASE).
pytestmark = main_release_only

N = 10_000
PARTITIONS = 3


def admin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def create_topic(cluster, topic, partitions=PARTITIONS, config=None):
    rf = min(3, len(cluster.broker_ids))
    a = admin(cluster)
    fs = a.create_topics(
        [NewTopic(topic, partitions, rf, config=config or {})], operation_timeout=30)
    fs[topic].result(timeout=60)
    cluster.wait_topic(topic, partitions)


def consume_all(cluster, topic, expect, group=None, timeout=90.0, extra=None):
    """Reads until expect records arrived (or timeout); returns the messages."""
    conf = {"bootstrap.servers": cluster.bootstrap, "group.id": group or f"g-{topic}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False}
    conf.update(extra or {})
    c = Consumer(conf)
    c.subscribe([topic])
    msgs = []
    deadline = time.monotonic() + timeout
    try:
        while len(msgs) < expect and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=1.0):
                if m.error():
                    raise KafkaException(m.error())
                msgs.append(m)
        if group:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return msgs


def watermarks(cluster, topic, partitions=PARTITIONS):
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "wm"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                for p in range(partitions)]
    finally:
        c.close()


def assert_codec(cluster, topic, codec, partitions=PARTITIONS):
    """Every data batch of the topic, as stored on disk, uses codec."""
    seen = 0
    for p in range(partitions):
        for b in cluster.segment_batches(topic, p):
            if b["control"]:
                continue
            assert b["magic"] == 2
            assert b["codec"] == codec, f"{topic}-{p} batch at {b['base_offset']}: {b['codec']}"
            seen += b["records"]
    assert seen == N


def assert_offsets_contiguous(by_partition):
    """Offsets in each partition are 0..n-1 without gaps or repeats; returns the total."""
    total = 0
    for p, offs in by_partition.items():
        assert sorted(offs) == list(range(len(offs))), f"partition {p} offsets not contiguous"
        total += len(offs)
    return total


# ---------------------------------------------------------------------------------------------

def test_metadata_lists_every_broker(cluster):
    md = admin(cluster).list_topics(timeout=10)
    got = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
    assert got == cluster.broker_addresses
    # The harness's own Metadata request sees the same from every broker.
    for node_id, addr in cluster.broker_addresses.items():
        host, port = addr.rsplit(":", 1)
        brokers, controller = metadata_brokers(host, int(port))
        assert {k: f"{h}:{p}" for k, (h, p) in brokers.items()} == cluster.broker_addresses
        assert controller in cluster.broker_ids


def test_clusters_are_independent(source_cluster, dest_cluster, topic_name):
    assert source_cluster.bootstrap != dest_cluster.bootstrap
    clients = [admin(c) for c in (source_cluster, dest_cluster)]  # alive until answered
    ids = {a.describe_cluster().result(timeout=10).cluster_id for a in clients}
    assert ids == {source_cluster.cluster_id, dest_cluster.cluster_id}
    assert len(ids) == 2
    create_topic(source_cluster, topic_name, partitions=1)
    assert topic_name in admin(source_cluster).list_topics(timeout=10).topics
    assert topic_name not in admin(dest_cluster).list_topics(timeout=10).topics


def test_confluent_kafka_roundtrip(cluster, topic_name):
    create_topic(cluster, topic_name)
    delivered = {}

    def on_delivery(err, msg):
        assert err is None, err
        delivered[msg.key().decode()] = (msg.partition(), msg.offset())

    p = Producer({"bootstrap.servers": cluster.bootstrap, "compression.type": "lz4",
                  "linger.ms": 20, "acks": "all", "enable.idempotence": True})
    for i in range(N):
        p.produce(topic_name, key=f"key-{i}", value=f"value-{i}-" + "x" * (i % 50),
                  headers=[("idx", str(i).encode()), ("client", b"confluent-kafka")],
                  on_delivery=on_delivery)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert len(delivered) == N

    group = f"grp-{topic_name}"
    msgs = consume_all(cluster, topic_name, N, group=group)
    assert len(msgs) == N
    by_partition = defaultdict(list)
    for m in msgs:
        key = m.key().decode()
        i = int(key.split("-")[1])
        assert m.value().decode() == f"value-{i}-" + "x" * (i % 50)
        assert dict(m.headers()) == {"idx": str(i).encode(), "client": b"confluent-kafka"}
        assert delivered[key] == (m.partition(), m.offset())
        by_partition[m.partition()].append(m.offset())
    assert assert_offsets_contiguous(by_partition) == N
    assert len(by_partition) == PARTITIONS  # the default partitioner spread the keys
    wm = watermarks(cluster, topic_name)
    assert [lo for lo, _ in wm] == [0] * PARTITIONS
    assert sum(hi for _, hi in wm) == N
    assert_codec(cluster, topic_name, "lz4")

    # The committed offsets are what the Java group tool reports, with no lag.
    out = cluster.tool("consumer-groups", "--describe", "--group", group).stdout
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(group)]
    assert len(rows) == PARTITIONS
    for row in rows:
        part, current, end, lag = int(row[2]), int(row[3]), int(row[4]), row[5]
        assert current == end == wm[part][1] and lag == "0"


def test_java_console_roundtrip(cluster, topic_name):
    cluster.tool("topics", "--create", "--topic", topic_name, "--partitions", PARTITIONS,
                 "--replication-factor", min(3, len(cluster.broker_ids)))
    cluster.wait_topic(topic_name, PARTITIONS)
    # headers TAB key TAB value, headers as k:v,k:v (the console producer's defaults).
    lines = "".join(f"idx:{i},client:java\tkey-{i}\tvalue-{i}\n" for i in range(N))
    cluster.tool("console-producer", "--topic", topic_name, "--compression-codec", "lz4",
                 "--property", "parse.key=true", "--property", "parse.headers=true",
                 "--producer-property", "acks=all", "--producer-property", "linger.ms=20",
                 input=lines)
    out = cluster.tool("console-consumer", "--topic", topic_name, "--from-beginning",
                       "--max-messages", N, "--timeout-ms", 60000,
                       "--property", "print.key=true",
                       "--property", "print.headers=true",
                       "--property", "print.offset=true",
                       "--property", "print.partition=true").stdout
    rows = [ln.split("\t") for ln in out.splitlines() if ln.startswith("Partition:")]
    assert len(rows) == N
    by_partition = defaultdict(list)
    keys = set()
    for part, off, headers, key, value in rows:
        i = int(key.split("-")[1])
        assert value == f"value-{i}"
        assert headers == f"idx:{i},client:java"
        by_partition[int(part.split(":")[1])].append(int(off.split(":")[1]))
        keys.add(key)
    assert len(keys) == N
    assert assert_offsets_contiguous(by_partition) == N
    assert_codec(cluster, topic_name, "lz4")

    # The same records as seen by librdkafka.
    msgs = consume_all(cluster, topic_name, N)
    assert len(msgs) == N
    assert all(dict(m.headers())["client"] == b"java" for m in msgs)


def test_java_perf_tools(cluster, topic_name):
    cluster.create_topic(topic_name, partitions=PARTITIONS)
    out = cluster.run_tool("producer-perf-test", "--topic", topic_name, "--num-records", N,
                           "--record-size", 200, "--throughput", -1, "--producer-props",
                           f"bootstrap.servers={cluster.bootstrap}", "compression.type=lz4",
                           "acks=all").stdout
    final = [ln for ln in out.splitlines() if "records sent" in ln][-1]
    assert int(final.split()[0]) == N
    assert_codec(cluster, topic_name, "lz4")
    assert sum(hi for _, hi in watermarks(cluster, topic_name)) == N
    summary = cluster.consumer_perf_test(topic_name, N)
    assert int(summary["data.consumed.in.nMsg"]) == N
    assert float(summary["data.consumed.in.MB"]) == pytest.approx(N * 200 / 1048576, 0.01)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat_roundtrip(cluster, topic_name):
    create_topic(cluster, topic_name)
    # Compressible values: librdkafka sends a batch uncompressed when lz4 would not make it
    # smaller, which a batch of one short record (the tail of a linger) would otherwise hit.
    pad = "x" * 200
    lines = "".join(f"key-{i}\tvalue-{i}{pad}\n" for i in range(N))
    subprocess.run(["kcat", "-P", "-b", cluster.bootstrap, "-t", topic_name, "-z", "lz4",
                    "-K", "\t", "-H", "client=kcat", "-H", "run=testbed",
                    "-X", "linger.ms=20"], input=lines, text=True, check=True, timeout=120)
    r = subprocess.run(["kcat", "-C", "-b", cluster.bootstrap, "-t", topic_name, "-o",
                        "beginning", "-e", "-J", "-c", str(N)], stdout=subprocess.PIPE,
                       text=True, check=True, timeout=120)
    recs = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(recs) == N
    by_partition = defaultdict(list)
    for rec in recs:
        i = int(rec["key"].split("-")[1])
        assert rec["payload"] == f"value-{i}{pad}"
        assert rec["headers"] == ["client", "kcat", "run", "testbed"]
        by_partition[rec["partition"]].append(rec["offset"])
    assert len({rec["key"] for rec in recs}) == N
    assert assert_offsets_contiguous(by_partition) == N
    assert_codec(cluster, topic_name, "lz4")

    md = json.loads(subprocess.run(["kcat", "-L", "-J", "-b", cluster.bootstrap, "-t",
                                    topic_name], stdout=subprocess.PIPE, text=True,
                                   check=True, timeout=30).stdout)
    assert sorted(b["id"] for b in md["brokers"]) == cluster.broker_ids
    parts = md["topics"][0]["partitions"]
    assert len(parts) == PARTITIONS
    assert all(len(p["replicas"]) == min(3, len(cluster.broker_ids)) for p in parts)


def test_describe_configs(cluster, topic_name):
    create_topic(cluster, topic_name, config={"retention.ms": "3600000",
                                              "cleanup.policy": "compact"})
    cluster.tool("configs", "--alter", "--entity-type", "topics", "--entity-name", topic_name,
                 "--add-config", "max.message.bytes=2000000", admin=True)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    deadline = time.monotonic() + 30
    a = admin(cluster)
    while True:
        cfg = a.describe_configs([res])[res].result(timeout=10)
        if cfg["max.message.bytes"].value == "2000000" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert cfg["retention.ms"].value == "3600000"
    assert cfg["cleanup.policy"].value == "compact"
    assert cfg["max.message.bytes"].value == "2000000"
    assert cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not cfg["retention.ms"].is_default
    assert cfg["segment.bytes"].is_default

    out = cluster.tool("configs", "--describe", "--entity-type", "topics", "--entity-name",
                       topic_name).stdout
    assert "retention.ms=3600000" in out and "max.message.bytes=2000000" in out

    # The broker's static settings written by the harness are what the broker reports.
    broker = str(cluster.broker_ids[0])
    bres = ConfigResource(ConfigResource.Type.BROKER, broker)
    bcfg = a.describe_configs([bres])[bres].result(timeout=10)
    assert bcfg["num.io.threads"].value == "2"
    assert bcfg["num.io.threads"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert bcfg["authorizer.class.name"].value.endswith("StandardAuthorizer")
    assert bcfg["offsets.topic.replication.factor"].value == str(min(3, len(cluster.broker_ids)))


def test_authorizer_and_sasl(cluster, topic_name):
    create_topic(cluster, topic_name, partitions=1)
    # Once a topic has an ACL, anonymous clients lose the allow-if-no-ACL default on it.
    cluster.tool("acls", "--add", "--allow-principal", "User:alice", "--operation", "All",
                 "--topic", topic_name, admin=True)
    try:
        p = Producer({"bootstrap.servers": cluster.bootstrap, "message.timeout.ms": 10000})
        errors = []
        p.produce(topic_name, b"denied", on_delivery=lambda err, msg: errors.append(err))
        p.flush(30)
        assert errors and errors[0] is not None
        assert errors[0].name() == "TOPIC_AUTHORIZATION_FAILED"

        for mech in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            conf = cluster.client_props(user="alice", mechanism=mech)
            assert conf["sasl.password"] == "alice-secret"
            p = Producer(conf)
            results = []
            p.produce(topic_name, mech.encode(), on_delivery=lambda e, m: results.append(e))
            p.flush(30)
            assert results == [None], mech
        out = cluster.tool("acls", "--list", "--topic", topic_name, admin=True).stdout
        assert "principal=User:alice" in out
    finally:
        cluster.tool("acls", "--remove", "--force", "--allow-principal", "User:alice",
                     "--operation", "All", "--topic", topic_name, admin=True)

    def anonymous_sum():
        # The ACL's removal reaches each broker on its own time: until then the anonymous client
        # is not shown the topic ("Unknown partition").
        try:
            return sum(hi for _, hi in watermarks(cluster, topic_name, 1))
        except KafkaException:
            return None
    deadline, total = time.monotonic() + 30, anonymous_sum()
    while total is None and time.monotonic() < deadline:
        time.sleep(0.5)
        total = anonymous_sum()
    assert total == 3


def test_stop_and_start_one_broker(dest_cluster3, topic_name):
    c = dest_cluster3
    create_topic(c, topic_name, partitions=1)
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
    for i in range(100):
        p.produce(topic_name, key=str(i), value=b"before")
    assert p.flush(30) == 0
    leader = admin(c).list_topics(topic_name, timeout=10).topics[topic_name].partitions[0].leader
    c.stop_broker(leader)
    try:
        deadline = time.monotonic() + 60
        while True:
            md = admin(c).list_topics(topic_name, timeout=10).topics[topic_name].partitions[0]
            if md.leader not in (leader, -1) and leader not in md.isrs:
                break
            assert time.monotonic() < deadline, f"leadership did not move: {md}"
            time.sleep(0.2)
        for i in range(100):
            p.produce(topic_name, key=str(i), value=b"after")
        assert p.flush(60) == 0
    finally:
        c.start_broker(leader)
    deadline = time.monotonic() + 60
    while len(admin(c).list_topics(topic_name, timeout=10)
              .topics[topic_name].partitions[0].isrs) < 3:
        assert time.monotonic() < deadline, "restarted broker did not rejoin the ISR"
        time.sleep(0.2)
    msgs = consume_all(c, topic_name, 200)
    assert [m.value() for m in msgs] == [b"before"] * 100 + [b"after"] * 100
    assert [m.offset() for m in msgs] == list(range(200))


# ---------------------------------------------------------------------------------------------
# Helpers that need no cluster.

def test_daemon_helper_waits_stops_and_scans(tmp_path):
    port = free_port()
    d = Daemon([sys.executable, "-m", "http.server", port, "--bind", "127.0.0.1"], "web",
               str(tmp_path)).start(port=port, timeout=20)
    assert d.running()
    assert d.stop() == -15 and not d.running()
    bad = Daemon([sys.executable, "-c", "import sys; sys.stderr.write("
                  "'x.c:1:2: runtime error: signed integer overflow\\n')"], "bad", str(tmp_path))
    assert bad.start().proc.wait(timeout=20) == 0
    assert bad.stop() == 0
    assert len(bad.sanitizer_reports()) == 1
    with pytest.raises(Exception, match="did not listen"):
        Daemon([sys.executable, "-c", "pass"], "quits", str(tmp_path)).start(port=free_port(),
                                                                            timeout=5)


DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


def test_golden_frames_match_their_index():
    golden = os.path.join(DATA, "golden")
    with open(os.path.join(golden, "index.tsv")) as f:
        rows = [ln.rstrip("\n").split("\t") for ln in f][1:]
    assert len(rows) > 100
    sessions = {r[0].split("/")[0] for r in rows}
    assert {"confluent-admin", "confluent-producer-lz4", "confluent-producer-zstd",
            "confluent-consumer-classic", "java-topics", "java-console-producer",
            "java-console-consumer"} <= sessions
    reqs = {}
    for name, key, ver, corr, direction, _conn in rows:
        with open(os.path.join(golden, name), "rb") as f:
            frame = f.read()
        if direction == "req":
            assert struct.unpack_from(">hhi", frame) == (int(key), int(ver), int(corr)), name
            assert name.endswith(f"-{key}-v{ver}-req.bin")
            reqs[name[:-len("req.bin")]] = int(corr)
        else:
            assert struct.unpack_from(">i", frame)[0] == int(corr), name
            assert reqs[name[:-len("resp.bin")]] == int(corr)
    keys = {int(r[1]) for r in rows}
    assert {0, 1, 3, 18, 19, 32} <= keys  # produce, fetch, metadata, api versions, create, configs
    # Kafka 4.4.0's clients, where the versions moved on: Produce 13, Fetch 18, ListOffsets 11,
    # Metadata 13, OffsetCommit/OffsetFetch 10, ApiVersions 5, EndTxn 5, KIP-848 and share groups.
    new = {(int(r[1]), int(r[2])) for r in rows if r[0].split("/")[0].endswith("-4.4.0")}
    assert {(0, 13), (1, 18), (2, 11), (3, 13), (8, 10), (9, 10), (18, 5), (26, 5), (68, 1),
            (76, 1), (78, 2), (79, 2)} <= new
    with open(os.path.join(golden, "README.txt")) as f:
        readme = f.read()
    for session in sessions:
        assert re.search(rf"^  {re.escape(session)} ", readme, re.M), session


@pytest.mark.parametrize("client", ["java", "librdkafka"])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_golden_batches_hold_what_the_readme_says(client, codec):
    batches = list(read_batches(os.path.join(DATA, "batches", f"{client}-{codec}.log")))
    assert sum(b["records"] for b in batches) == 50
    assert all(b["codec"] == codec and b["magic"] == 2 and not b["transactional"]
               for b in batches)
    assert batches[0]["base_offset"] == 0
    for a, b in zip(batches, batches[1:]):
        assert b["base_offset"] == a["base_offset"] + a["last_offset_delta"] + 1


def test_golden_transactions():
    batches = list(read_batches(os.path.join(DATA, "batches", "librdkafka-txn.log")))
    assert [(b["base_offset"], b["records"], b["control"]) for b in batches] == [
        (0, 10, False), (10, 1, True), (11, 10, False), (21, 1, True), (22, 10, False),
        (32, 1, True)]
    assert all(b["transactional"] for b in batches)
    java = list(read_batches(os.path.join(DATA, "batches", "java-txn.log")))
    assert sum(b["records"] for b in java if not b["control"]) == 30
    assert java[-1]["control"] and all(b["transactional"] for b in java)
