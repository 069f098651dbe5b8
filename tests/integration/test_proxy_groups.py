"""Consumer groups through kmirrord: members joining and leaving (rebalances) with the classic
protocol and with the KIP-848 consumer protocol, for confluent-kafka and the Java consumer."""

import pytest
from confluent_kafka import Consumer, KafkaException

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import create_topic, produce, wait_until

pytestmark = pytest.mark.proxy

PARTITIONS = 6


class Member:
    """One confluent-kafka group member, polled by the test (no threads)."""

    def __init__(self, proxy, group, topic, protocol):
        conf = proxy.conf(**{"group.id": group, "auto.offset.reset": "earliest",
                             "enable.auto.commit": False, "group.protocol": protocol})
        self.c = Consumer(conf)
        self.c.subscribe([topic])
        self.values = []
        self.closed = False

    def poll(self):
        for m in self.c.consume(num_messages=500, timeout=0.2):
            if m.error():
                raise KafkaException(m.error())
            self.values.append(m.value().decode())
        if self.values:
            try:
                self.c.commit(asynchronous=True)
            except KafkaException:
                pass  # nothing new to commit, or a rebalance in progress: the next one does
        return self

    def partitions(self):
        return {tp.partition for tp in self.c.assignment()}

    def close(self):
        if not self.closed:
            self.c.close()
            self.closed = True


def poll_until(members, pred, timeout=60.0, what="assignment"):
    def step():
        for m in members:
            m.poll()
        return pred()
    return wait_until(step, timeout, 0.0, what)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_rebalances(proxy3, topic_name, protocol):
    create_topic(proxy3, topic_name, partitions=PARTITIONS)
    first = {f"a-{i}" for i in range(600)}
    produce(proxy3, topic_name, 600, value=lambda i: f"a-{i}".encode())
    group = f"grp-{topic_name}"
    a = Member(proxy3, group, topic_name, protocol)
    b = None
    try:
        # One member: it owns every partition and reads everything.
        poll_until([a], lambda: a.partitions() == set(range(PARTITIONS)), what="A owns all")
        poll_until([a], lambda: first <= set(a.values), what="A reads the first records")

        # A second member joins: the partitions are split between them, without overlap.
        b = Member(proxy3, group, topic_name, protocol)

        def split():
            pa, pb = a.partitions(), b.partitions()
            return pa and pb and not (pa & pb) and (pa | pb) == set(range(PARTITIONS))
        poll_until([a, b], split, what="A and B share the partitions")
        second = {f"b-{i}" for i in range(600)}
        produce(proxy3, topic_name, 600, value=lambda i: f"b-{i}".encode())
        poll_until([a, b], lambda: second <= set(a.values) | set(b.values),
                   what="both members read the second records")
        assert any(v.startswith("b-") for v in a.values)
        assert any(v.startswith("b-") for v in b.values)

        # The group as the Java tool sees it through the proxy: two members.
        out = proxy3.tool("consumer-groups", "--describe", "--group", group, "--members").stdout
        rows = [ln.split() for ln in out.splitlines() if ln.startswith(group)]
        assert len(rows) == 2, out

        # A leaves: B takes over every partition and reads what comes next.
        a.close()
        poll_until([b], lambda: b.partitions() == set(range(PARTITIONS)), what="B owns all")
        third = {f"c-{i}" for i in range(600)}
        produce(proxy3, topic_name, 600, value=lambda i: f"c-{i}".encode())
        poll_until([b], lambda: third <= set(b.values), what="B reads the third records")
    finally:
        a.close()
        if b:
            b.close()
    # Nothing produced was missed by the group (at-least-once across the rebalances).
    assert first | second | third <= set(a.values) | set(b.values)

    # The group's protocol is the one asked for, as the broker reports it through the proxy.
    out = proxy3.tool("consumer-groups", "--list", "--type").stdout
    row = next(ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0] == group)
    assert row[1].lower() == protocol, out


def test_java_consumer_protocol_group(proxy3, topic_name):
    """The Java consumer with group.protocol=consumer reads a topic and commits its offsets."""
    create_topic(proxy3, topic_name, partitions=PARTITIONS)
    produce(proxy3, topic_name, 2000)
    group = f"grp-{topic_name}"
    out = proxy3.tool("console-consumer", "--topic", topic_name, "--group", group,
                      "--consumer-property", "group.protocol=consumer", "--from-beginning",
                      "--max-messages", 2000, "--timeout-ms", 60000,
                      "--property", "print.key=true").stdout
    keys = [ln.split("\t")[0] for ln in out.splitlines() if ln.startswith("key-")]
    assert sorted(keys) == sorted(f"key-{i}" for i in range(2000))
    out = proxy3.tool("consumer-groups", "--describe", "--group", group).stdout
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(group)]
    assert len(rows) == PARTITIONS
    # group, topic, partition, current offset, log end offset, lag
    assert sum(int(r[3]) for r in rows) == 2000
    assert all(r[5] == "0" for r in rows)
