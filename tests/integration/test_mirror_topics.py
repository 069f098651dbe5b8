"""Destination topics follow the source: StartMirrorTopics of a topic missing on the destination
creates it with the source's partition count and the configs set on the source topic (minus the
never-copied ones; LogAppendTime becomes CreateTime, compression.type is producer), then the
records produced at the source reach it (read from the destination directly). A topic on neither
side is refused with UNKNOWN_TOPIC_OR_PARTITION naming it; a source that cannot be reached is
answered in time with a message that says so."""

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from mirror_cli import Cli, kmirror_bin, wait_states  # noqa: F401
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def dest_configs(cluster, topic):
    """{name: (value, source)} of a topic as the destination's brokers describe it."""
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = a.describe_configs([res])[res].result(timeout=30)
    return {n: (e.value, e.source) for n, e in entries.items()}


DYNAMIC_TOPIC_CONFIG = 1


def source_of(entry):
    """The ConfigSource number of a (value, source) pair (the client gives an enum or an int)."""
    src = entry[1]
    return int(getattr(src, "value", src))


def partition_count(cluster, topic):
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    md = a.list_topics(topic, timeout=30)
    t = md.topics[topic]
    assert t.error is None, t.error
    return len(t.partitions)


def produce_at(cluster, topic, n, partitions):
    """n records with keys and values, spread over the partitions by hand; {partition: [(k, v)]}."""
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5,
                  "compression.type": "lz4"})
    sent = {i: [] for i in range(partitions)}
    errors = []
    for i in range(n):
        part = i % partitions
        k, v = f"key-{i}".encode(), f"value-{i}-{'x' * (i % 50)}".encode()
        p.produce(topic, key=k, value=v, partition=part,
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
        sent[part].append((k, v))
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    return sent


def read_direct(cluster, topic, partitions, want, timeout=90):
    """Every record of the topic's partitions, read from the cluster itself: {partition: [(k, v)]}."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": unique("direct"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    got = {i: [] for i in range(partitions)}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and sum(len(v) for v in got.values()) < want:
            for m in c.consume(num_messages=500, timeout=0.5):
                if m.error():
                    continue
                got[m.partition()].append((m.key(), m.value()))
    finally:
        c.close()
    return got


def test_start_creates_destination_topic(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    proxy = proxy_factory(dest_cluster)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = unique("follow")
    t, lat = unique("orders"), unique("stamped")
    source_cluster.create_topic(t, partitions=4, config={
        "retention.ms": "7200000", "cleanup.policy": "compact,delete", "max.message.bytes": "2097152",
        "compression.type": "gzip", "min.insync.replicas": "1"})
    source_cluster.create_topic(lat, partitions=2, config={"message.timestamp.type": "LogAppendTime"})
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)

    t0 = time.monotonic()
    r = cli.run("start", "--mirror", mirror, "--topics", f"{t},{lat}")
    took = time.monotonic() - t0
    print(f"start with two topics created took {took:.2f} s\n{r.stdout}")

    # Created with the source's partitions and the configs set on the source topic.
    assert partition_count(dest_cluster, t) == 4
    cfg = dest_configs(dest_cluster, t)
    assert cfg["retention.ms"][0] == "7200000", cfg["retention.ms"]
    assert cfg["cleanup.policy"][0] == "compact,delete", cfg["cleanup.policy"]
    assert cfg["max.message.bytes"][0] == "2097152", cfg["max.message.bytes"]
    # Never recompressed: the destination keeps the source's batches whatever the source topic says.
    assert cfg["compression.type"][0] == "producer", cfg["compression.type"]
    # min.insync.replicas is the destination's own: not set on the topic.
    assert source_of(cfg["min.insync.replicas"]) != DYNAMIC_TOPIC_CONFIG, cfg["min.insync.replicas"]
    for name in ("retention.ms", "cleanup.policy", "max.message.bytes", "compression.type"):
        assert source_of(cfg[name]) == DYNAMIC_TOPIC_CONFIG, (name, cfg[name])
    # LogAppendTime at the source: CreateTime at the destination (the source's timestamps are kept).
    assert partition_count(dest_cluster, lat) == 2
    assert dest_configs(dest_cluster, lat)["message.timestamp.type"][0] == "CreateTime"

    states = wait_states(cli, mirror, {t: "MIRRORING", lat: "MIRRORING"}, timeout=60)
    assert len(states[t]) == 4 and len(states[lat]) == 2, states

    # Records produced at the source reach the destination, partition by partition, in order.
    sent = produce_at(source_cluster, t, 2000, 4)
    got = read_direct(dest_cluster, t, 4, 2000)
    for part in range(4):
        assert got[part] == sent[part], (part, len(got[part]), len(sent[part]))

    # A second start of a created topic is refused by the store as for any mirrored topic.
    err, _, _ = cli.refused("TOPIC_ALREADY_IN_CLUSTER_MIRROR", "start", "--mirror", mirror, "--topics", t,
                            json_too=False)
    assert t in err, err


def test_start_topic_on_neither_side(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    proxy = proxy_factory(dest_cluster)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = unique("nowhere")
    missing, present = unique("ghost"), unique("real")
    source_cluster.create_topic(present, partitions=3)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    doc, r = cli.json("start", "--mirror", mirror, "--topics", f"{missing},{present}", expect=1)
    err = r.stderr.strip()
    assert "UNKNOWN_TOPIC_OR_PARTITION" in err and missing in err and "neither on the destination" in err, err
    topics = {x["name"]: x for x in doc["topics"]}
    e = topics[missing]["error"]
    assert e["code"] == 3 and e["name"] == "UNKNOWN_TOPIC_OR_PARTITION", e
    assert missing in e["message"] and source_cluster.bootstrap in e["message"] and mirror in e["message"], e
    # The other topic of the same request went on: created and started.
    assert topics[present]["error"] is None, topics
    assert partition_count(dest_cluster, present) == 3
    wait_states(cli, mirror, {present: "MIRRORING"}, timeout=60)
    # Nothing was created for the missing one.
    a = AdminClient({"bootstrap.servers": dest_cluster.bootstrap})
    assert missing not in a.list_topics(timeout=30).topics


def test_start_source_unreachable(kmirror_bin, dest_cluster, proxy_factory):
    proxy = proxy_factory(dest_cluster)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = unique("dark")
    t = unique("lost")
    # A port nobody listens on: connections are refused at once, again and again.
    from proxy_fixtures import port_block
    dead = f"127.0.0.1:{port_block(1, '127.0.0.1')}"
    cli.run("create", "--mirror", mirror, "--source-bootstrap", dead)
    t0 = time.monotonic()
    err, _, _ = cli.refused("REQUEST_TIMED_OUT", "start", "--mirror", mirror, "--topics", t, json_too=False)
    took = time.monotonic() - t0
    print(f"answered after {took:.1f} s: {err}")
    assert "cannot be reached" in err and dead in err, err
    assert took < 19, took


def test_start_topics_regex_matches_the_source(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    """The README's example, `start --topics-regex 'orders-.*'`, on a destination that has none of
    them yet: the pattern is matched against the source's topics (a start creates them here), not
    only the destination's. Before: "no destination topic matches". A topic of the source that does
    not match stays out; --topic names one topic as Kafka's tools do."""
    proxy = proxy_factory(dest_cluster)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror, tag = unique("rx"), uuid.uuid4().hex[:8]
    names = [f"orders-{tag}-a", f"orders-{tag}-b", f"other-{tag}"]
    for n in names:
        source_cluster.create_topic(n, partitions=2)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    r = cli.run("start", "--mirror", mirror, "--topics-regex", f"orders-{tag}-.*")
    print(r.stdout)
    wait_states(cli, mirror, {names[0]: "MIRRORING", names[1]: "MIRRORING"}, timeout=60)
    assert partition_count(dest_cluster, names[0]) == 2
    a = AdminClient({"bootstrap.servers": dest_cluster.bootstrap})
    assert names[2] not in a.list_topics(timeout=30).topics
    cli.run("stop", "--mirror", mirror, "--topic", names[0])
    wait_states(cli, mirror, {names[0]: "STOPPED", names[1]: "MIRRORING"}, timeout=60)
