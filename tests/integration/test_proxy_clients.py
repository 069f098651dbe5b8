"""Real clients through kmirrord in front of the 3-broker cluster, bootstrapped only with the
proxy's address: the Java console and perf tools, confluent-kafka's producer, consumer and admin
client, idempotent producers, and kcat's metadata listing."""

import json
import shutil
import subprocess
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, consume, create_topic, produce, wait_until

pytestmark = pytest.mark.proxy

N = 3000


def contiguous(by_partition):
    """Offsets per partition are 0..n-1; returns the total."""
    total = 0
    for p, offs in by_partition.items():
        assert sorted(offs) == list(range(len(offs))), f"partition {p}: offsets not contiguous"
        total += len(offs)
    return total


def test_metadata_names_only_proxy_ports(proxy3):
    """Every broker the admin client learns is the proxy's port for that node id."""
    a = AdminClient(proxy3.conf())  # kept alive until its futures are answered
    md = a.list_topics(timeout=15)
    got = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
    assert got == proxy3.advertised()
    assert set(got) == set(proxy3.cluster.broker_ids)
    assert md.controller_id in proxy3.cluster.broker_ids
    desc = a.describe_cluster().result(timeout=15)
    assert desc.cluster_id == proxy3.cluster.cluster_id
    assert {n.id: f"{n.host}:{n.port}" for n in desc.nodes} == proxy3.advertised()
    assert f"{desc.controller.host}:{desc.controller.port}" == \
        proxy3.advertised()[desc.controller.id]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat_lists_only_proxy_addresses(proxy3, topic_name):
    create_topic(proxy3, topic_name, partitions=3)
    r = subprocess.run(["kcat", "-L", "-J", "-b", proxy3.bootstrap], stdout=subprocess.PIPE,
                       text=True, check=True, timeout=60)
    md = json.loads(r.stdout)
    brokers = {b["id"]: b["name"] for b in md["brokers"]}
    assert brokers == proxy3.advertised()
    assert all(name.startswith(PROXY_HOST + ":") for name in brokers.values())
    assert topic_name in {t["topic"] for t in md["topics"]}
    # The plain text listing too: no line names an address other than the proxy's.
    text = subprocess.run(["kcat", "-L", "-b", proxy3.bootstrap], stdout=subprocess.PIPE,
                          text=True, check=True, timeout=60).stdout
    lines = [ln for ln in text.splitlines() if " at " in ln]
    assert len(lines) == 3
    for ln in lines:
        node = int(ln.split("broker")[1].split()[0])
        assert f"at {proxy3.advertised()[node]}" in ln, ln
    assert not any(addr in text for addr in proxy3.cluster.broker_addresses.values())


def test_java_console_producer_and_consumer(proxy3, topic_name):
    proxy3.tool("topics", "--create", "--topic", topic_name, "--partitions", 3,
                "--replication-factor", 3)
    proxy3.cluster.wait_topic(topic_name, 3)
    lines = "".join(f"idx:{i}\tkey-{i}\tvalue-{i}\n" for i in range(N))
    proxy3.tool("console-producer", "--topic", topic_name, "--compression-codec", "lz4",
                "--property", "parse.key=true", "--property", "parse.headers=true",
                "--producer-property", "acks=all", "--producer-property", "linger.ms=20",
                input=lines)
    out = proxy3.tool("console-consumer", "--topic", topic_name, "--from-beginning",
                      "--max-messages", N, "--timeout-ms", 60000,
                      "--property", "print.key=true", "--property", "print.headers=true",
                      "--property", "print.offset=true",
                      "--property", "print.partition=true").stdout
    rows = [ln.split("\t") for ln in out.splitlines() if ln.startswith("Partition:")]
    assert len(rows) == N
    by_partition = defaultdict(list)
    for part, off, headers, key, value in rows:
        i = int(key.split("-")[1])
        assert value == f"value-{i}" and headers == f"idx:{i}"
        by_partition[int(part.split(":")[1])].append(int(off.split(":")[1]))
    assert contiguous(by_partition) == N
    assert len(by_partition) == 3
    # What the console producer stored is what the brokers hold.
    stored = sum(b["records"] for p in range(3) for b in proxy3.cluster.segment_batches(topic_name, p)
                 if not b["control"])
    assert stored == N


def test_java_perf_tools(proxy3, topic_name):
    proxy3.tool("topics", "--create", "--topic", topic_name, "--partitions", 3,
                "--replication-factor", 3)
    proxy3.cluster.wait_topic(topic_name, 3)
    out = proxy3.cluster.run_tool(
        "producer-perf-test", "--topic", topic_name, "--num-records", 20000, "--record-size", 200,
        "--throughput", -1, "--producer-props", f"bootstrap.servers={proxy3.bootstrap}",
        "acks=all", "compression.type=lz4").stdout
    final = [ln for ln in out.splitlines() if "records sent" in ln][-1]
    assert int(final.split()[0]) == 20000
    summary = proxy3.cluster.consumer_perf_test(topic_name, 20000, bootstrap=proxy3.bootstrap)
    assert int(summary["data.consumed.in.nMsg"]) == 20000
    assert float(summary["data.consumed.in.MB"]) == pytest.approx(20000 * 200 / 1048576, 0.01)
    c = Consumer(proxy3.conf(**{"group.id": "wm"}))
    try:
        hw = sum(c.get_watermark_offsets(TopicPartition(topic_name, p), timeout=10)[1]
                 for p in range(3))
    finally:
        c.close()
    assert hw == 20000


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_confluent_producer_and_consumer(proxy3, topic_name, idempotent):
    create_topic(proxy3, topic_name, partitions=3)
    acked = produce(proxy3, topic_name, N,
                    value=lambda i: f"value-{i}-".encode() + b"x" * (i % 300),
                    **{"enable.idempotence": idempotent, "compression.type": "zstd"})
    assert len(acked) == N
    group = f"grp-{topic_name}"
    msgs = consume(proxy3, topic_name, N, group=group)
    assert len(msgs) == N
    by_partition = defaultdict(list)
    for m in msgs:
        key = m.key().decode()
        i = int(key.split("-")[1])
        assert m.value() == f"value-{i}-".encode() + b"x" * (i % 300)
        assert acked[key] == (m.partition(), m.offset())
        by_partition[m.partition()].append(m.offset())
    assert contiguous(by_partition) == N
    # Idempotence really went through the proxy: the brokers stored batches with a producer id
    # (InitProducerId answered through the proxy), and none without.
    pids = {b["producer_id"] for p in range(3)
            for b in proxy3.cluster.segment_batches(topic_name, p)}
    if idempotent:
        assert -1 not in pids and len(pids) == 1
    else:
        assert pids == {-1}
    # The group's committed offsets, read back through the proxy, are the log end offsets.
    c = Consumer(proxy3.conf(**{"group.id": group}))
    try:
        committed = c.committed([TopicPartition(topic_name, p) for p in range(3)], timeout=15)
    finally:
        c.close()
    assert sorted(tp.offset for tp in committed) == sorted(len(v) for v in by_partition.values())


def test_confluent_admin(proxy3, topic_name):
    a = AdminClient(proxy3.conf())
    fs = a.create_topics([NewTopic(topic_name, 2, 3, config={"retention.ms": "7200000"})])
    fs[topic_name].result(timeout=60)
    proxy3.cluster.wait_topic(topic_name, 2)
    a.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(timeout=60)
    proxy3.cluster.wait_topic(topic_name, 4)
    md = a.list_topics(topic_name, timeout=15).topics[topic_name]
    assert len(md.partitions) == 4
    assert all(len(p.replicas) == 3 and p.leader in proxy3.cluster.broker_ids
               for p in md.partitions.values())
    desc = a.describe_topics(TopicCollection([topic_name]))[topic_name].result(timeout=15)
    for p in desc.partitions:
        assert f"{p.leader.host}:{p.leader.port}" == proxy3.advertised()[p.leader.id]
        for r in p.replicas:
            assert f"{r.host}:{r.port}" == proxy3.advertised()[r.id]
    a.delete_topics([topic_name], operation_timeout=30)[topic_name].result(timeout=60)
    wait_until(lambda: topic_name not in a.list_topics(timeout=15).topics, 60,
               what="topic deletion")
