"""Transactions through kmirrord: a transactional producer (librdkafka, and the Java client of
the broker's own release) commits some transactions and aborts others, and read_committed
consumers (librdkafka and Java) see exactly the committed records; a consume-transform-produce
loop commits its input offsets inside the transaction."""

import os
import shutil
import subprocess

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from harness import api_versions
from harness.kafka_cluster import java_bin
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, create_topic, produce, wait_until

JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java")

pytestmark = pytest.mark.proxy

PARTITIONS = 3


def read_to_end(proxy, topic, isolation, partitions=PARTITIONS, timeout=60.0):
    """Every record up to the end of each partition (the last stable offset for read_committed),
    read with assign(): returns the values."""
    c = Consumer(proxy.conf(**{"group.id": f"reader-{topic}", "isolation.level": isolation,
                               "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values = []

        def done():
            for m in c.consume(num_messages=1000, timeout=0.3):
                if m.error():
                    raise KafkaException(m.error())
                values.append(m.value().decode())
            pos = {tp.partition: tp.offset for tp in c.position(
                [TopicPartition(topic, p) for p in range(partitions)])}
            return all(pos[p] >= ends[p] for p in range(partitions) if ends[p] > 0)
        wait_until(done, timeout, 0.0, f"{isolation} consumer to reach the end")
        return values
    finally:
        c.close()


def java_read_committed(proxy, topic):
    """The Java console consumer, read_committed, through the proxy: the values it printed."""
    out = proxy.tool("console-consumer", "--topic", topic, "--from-beginning",
                     "--isolation-level", "read_committed", "--timeout-ms", 15000,
                     check=False).stdout
    return sorted(ln for ln in out.splitlines() if ln)


def test_commit_one_abort_another(proxy3, topic_name):
    create_topic(proxy3, topic_name, partitions=PARTITIONS)
    p = Producer(proxy3.conf(**{"transactional.id": f"tx-{topic_name}", "acks": "all",
                                "linger.ms": 5}))
    p.init_transactions(30)
    committed = []
    for tx, n, outcome in (("t1", 100, "commit"), ("t2", 80, "abort"), ("t3", 50, "commit")):
        p.begin_transaction()
        for i in range(n):
            v = f"{tx}-{outcome}-{i}"
            p.produce(topic_name, key=str(i), value=v)
            if outcome == "commit":
                committed.append(v)
        p.flush(30)
        if outcome == "commit":
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)

    got = read_to_end(proxy3, topic_name, "read_committed")
    assert sorted(got) == sorted(committed)
    assert len(got) == 150
    everything = read_to_end(proxy3, topic_name, "read_uncommitted")
    assert len(everything) == 230
    assert sorted(v for v in everything if "-abort-" in v) == sorted(
        f"t2-abort-{i}" for i in range(80))

    # The Java consumer, read_committed, through the proxy: the same 150.
    assert java_read_committed(proxy3, topic_name) == sorted(committed)

    # The transaction coordinator, found through the proxy, knows the producer.
    out = proxy3.tool("transactions", "describe", "--transactional-id",
                      f"tx-{topic_name}").stdout
    assert "CompleteCommit" in out, out


def test_consume_transform_produce(proxy3, topic_name):
    src, dst = topic_name + "-in", topic_name + "-out"
    create_topic(proxy3, src, partitions=PARTITIONS)
    create_topic(proxy3, dst, partitions=PARTITIONS)
    produce(proxy3, src, 500, value=lambda i: f"in-{i}".encode())
    group = f"ctp-{topic_name}"
    c = Consumer(proxy3.conf(**{"group.id": group, "auto.offset.reset": "earliest",
                                "enable.auto.commit": False,
                                "isolation.level": "read_committed"}))
    p = Producer(proxy3.conf(**{"transactional.id": f"ctp-{topic_name}"}))
    p.init_transactions(30)
    c.subscribe([src])
    copied = 0
    try:
        def step():
            nonlocal copied
            msgs = [m for m in c.consume(num_messages=200, timeout=0.5) if not m.error()]
            if not msgs:
                return copied >= 500
            p.begin_transaction()
            for m in msgs:
                p.produce(dst, key=m.key(), value=m.value().replace(b"in-", b"out-"))
            p.send_offsets_to_transaction(c.position(c.assignment()),
                                          c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            copied += len(msgs)
            return copied >= 500
        wait_until(step, 90, 0.0, "the copy loop to copy 500 records")
    finally:
        c.close()
    assert copied == 500
    out = read_to_end(proxy3, dst, "read_committed")
    assert sorted(out) == sorted(f"out-{i}" for i in range(500))
    # The input offsets were committed with the transactions.
    c = Consumer(proxy3.conf(**{"group.id": group}))
    try:
        committed = c.committed([TopicPartition(src, p) for p in range(PARTITIONS)], timeout=15)
        ends = [c.get_watermark_offsets(TopicPartition(src, p), timeout=15)[1]
                for p in range(PARTITIONS)]
    finally:
        c.close()
    assert [tp.offset for tp in committed] == ends


@pytest.fixture(scope="session")
def txn_producer_cp(dest_cluster3, tmp_path_factory):
    """java/TxnProducer.java compiled against the cluster's own Kafka jars: its class directory."""
    javac = os.path.join(os.path.dirname(os.path.realpath(java_bin())), "javac")
    javac = javac if os.access(javac, os.X_OK) else shutil.which("javac")
    assert javac, "javac not found (scripts/install-deps.sh installs a JDK)"
    out = str(tmp_path_factory.mktemp("java-classes"))
    subprocess.run([javac, "-d", out, "-cp", os.path.join(dest_cluster3.libs, "*"),
                    os.path.join(JAVA_DIR, "TxnProducer.java")], check=True, timeout=120)
    return out


JAVA_PLAN = (("commit", 100), ("abort", 80), ("commit", 50), ("abort", 20), ("commit", 30))


def test_java_transactions(proxy3, topic_name, txn_producer_cp):
    """The Java transactional producer of the broker's release, through the proxy, with the
    cluster's transaction.version at 2 (KIP-890 part 2: Produce v12+ adds partitions to the
    transaction itself, EndTxn v5 bumps the epoch every transaction). A proxy that passes
    transaction.version=2 on while offering older Produce/EndTxn versions makes the first commit
    fail with TransactionAbortableException."""
    cluster = proxy3.cluster
    host, port = cluster.broker_address(cluster.broker_ids[0]).split(":")
    broker = api_versions(host, int(port))
    assert broker["finalized_features"].get("transaction.version", (0, 0))[1] == 2, (
        f"the test needs a cluster at transaction.version=2: {broker['finalized_features']}")
    tv = api_versions(PROXY_HOST, proxy3.port)["finalized_features"].get(
        "transaction.version", (0, 0))[1]

    create_topic(proxy3, topic_name, partitions=1)
    plan = ",".join(f"{outcome}:{n}" for outcome, n in JAVA_PLAN)
    r = cluster.run_tool("TxnProducer", proxy3.bootstrap, topic_name, f"jtx-{topic_name}", plan,
                         classpath=[txn_producer_cp], check=False, timeout=240)
    assert r.returncode == 0 and r.stdout.splitlines()[-1:] == ["done"], (
        f"Java transactional producer through the proxy failed (exit {r.returncode}):\n"
        f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    assert r.stdout.splitlines()[:-1] == [f"t{k} {o} {n}" for k, (o, n) in
                                          enumerate(JAVA_PLAN, 1)]

    committed = sorted(f"t{k}-{o}-{i}" for k, (o, n) in enumerate(JAVA_PLAN, 1) if o == "commit"
                       for i in range(n))
    aborted = sorted(f"t{k}-{o}-{i}" for k, (o, n) in enumerate(JAVA_PLAN, 1) if o == "abort"
                     for i in range(n))
    got = read_to_end(proxy3, topic_name, "read_committed", partitions=1)
    assert len(got) == len(committed) == 180
    assert sorted(got) == committed
    assert not set(got) & set(aborted)
    everything = read_to_end(proxy3, topic_name, "read_uncommitted", partitions=1)
    assert sorted(everything) == sorted(committed + aborted)
    assert java_read_committed(proxy3, topic_name) == committed

    # On disk: each transaction's data batches and then its marker (commit or abort). Under
    # transaction version 2 (what the proxy passed on) every transaction ends with an epoch bump,
    # so transaction k is written with the producer's first epoch + k - 1 and its marker with
    # one more; under version 1 the epoch stays the same.
    batches = cluster.segment_batches(topic_name, 0)
    assert all(b["transactional"] for b in batches)
    assert len({b["producer_id"] for b in batches}) == 1
    txns, cur = [], []
    for b in batches:
        cur.append(b)
        if b["control"]:
            txns.append(cur)
            cur = []
    assert not cur and len(txns) == len(JAVA_PLAN)
    epochs = []
    for txn, (_, n) in zip(txns, JAVA_PLAN):
        data, marker = txn[:-1], txn[-1]
        assert sum(b["records"] for b in data) == n
        assert len({b["producer_epoch"] for b in data}) == 1
        epochs.append((data[0]["producer_epoch"], marker["producer_epoch"]))
    first = epochs[0][0]
    if tv >= 2:
        assert epochs == [(first + k, first + k + 1) for k in range(len(JAVA_PLAN))], epochs
    else:
        assert epochs == [(first, first)] * len(JAVA_PLAN), epochs
