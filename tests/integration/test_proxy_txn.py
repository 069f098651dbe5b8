"""Transactions through kmirrord: a transactional producer commits one transaction and aborts
another, and read_committed consumers (librdkafka and Java) see exactly the committed records;
a consume-transform-produce loop commits its input offsets inside the transaction."""

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import create_topic, produce, wait_until

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
    out = proxy3.tool("console-consumer", "--topic", topic_name, "--from-beginning",
                      "--isolation-level", "read_committed", "--timeout-ms", 15000,
                      check=False).stdout
    assert sorted(ln for ln in out.splitlines() if ln) == sorted(committed)

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
