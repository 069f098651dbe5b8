"""One upstream broker stops while clients produce (acks=all, replication factor 3) and consume
through kmirrord: leadership moves, both carry on through the proxy, and no acknowledged record
is lost. The broker is started again afterwards for the tests that follow."""

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import consume, create_topic, wait_until

pytestmark = pytest.mark.proxy

PARTITIONS = 3


class Load:
    """A producer and a consumer thread running through the proxy until stopped."""

    def __init__(self, proxy, topic):
        self.proxy, self.topic = proxy, topic
        self.acked = []          # sequence numbers, in acknowledgement order
        self.errors = []
        self.consumed = set()
        self.consume_errors = []
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _produce(self):
        p = Producer(self.proxy.conf(**{"acks": "all", "enable.idempotence": True,
                                        "linger.ms": 5, "message.timeout.ms": 120000}))

        def cb(err, msg):
            with self.lock:
                if err:
                    self.errors.append(err)
                else:
                    self.acked.append(int(msg.value()))
        seq = 0
        while not self.stop_flag.is_set():
            for _ in range(20):
                p.produce(self.topic, key=str(seq % 97), value=str(seq), on_delivery=cb)
                seq += 1
            p.poll(0.02)  # about 1000 records a second
        p.flush(120)
        self.produced = seq

    def _consume(self):
        c = Consumer(self.proxy.conf(**{"group.id": f"load-{self.topic}",
                                        "auto.offset.reset": "earliest"}))
        c.subscribe([self.topic])
        try:
            while not self.stop_flag.is_set():
                for m in c.consume(num_messages=500, timeout=0.2):
                    if m.error():
                        if not m.error().retriable():
                            self.consume_errors.append(m.error())
                        continue
                    with self.lock:
                        self.consumed.add(int(m.value()))
        finally:
            c.close()

    def n_acked(self):
        with self.lock:
            return len(self.acked)

    def max_consumed(self):
        with self.lock:
            return max(self.consumed, default=-1)

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(180)


def leaders(admin, topic):
    md = admin.list_topics(topic, timeout=15).topics[topic]
    return {p.id: (p.leader, set(p.isrs)) for p in md.partitions.values()}


def test_broker_stops_under_load(proxy3, topic_name):
    cluster = proxy3.cluster
    create_topic(proxy3, topic_name, partitions=PARTITIONS,
                 config={"min.insync.replicas": "2"})
    admin = AdminClient(proxy3.conf())
    load = Load(proxy3, topic_name).start()
    stopped = None
    try:
        wait_until(lambda: load.n_acked() >= 2000 and load.max_consumed() >= 1000, 90, 0.1,
                   "the load to run")
        stopped = leaders(admin, topic_name)[0][0]
        acked_at_stop = load.n_acked()
        consumed_at_stop = load.max_consumed()
        cluster.stop_broker(stopped)
        # Leadership moves away from the stopped broker, as seen through the proxy.
        wait_until(lambda: all(ld not in (stopped, -1) and stopped not in isr
                               for ld, isr in leaders(admin, topic_name).values()),
                   60, 0.3, "leadership to move")
        # Production and consumption carry on through the proxy.
        wait_until(lambda: load.n_acked() >= acked_at_stop + 3000, 90, 0.1,
                   "acks after the broker stopped")
        wait_until(lambda: load.max_consumed() >= consumed_at_stop + 3000, 90, 0.1,
                   "consumption after the broker stopped")
        assert proxy3.running()
    finally:
        load.stop()
        if stopped is not None:
            cluster.start_broker(stopped)
    wait_until(lambda: all(len(isr) == 3 for _, isr in leaders(admin, topic_name).values()),
               120, 0.5, "the restarted broker to rejoin every ISR")
    assert not load.errors, load.errors[:5]
    assert not load.consume_errors, load.consume_errors[:5]
    acked = set(load.acked)
    assert len(acked) == len(load.acked)  # idempotence: nothing acknowledged twice
    # Every acknowledged record is there, read back through the proxy.
    msgs = consume(proxy3, topic_name, len(acked), timeout=120, idle=10)
    got = {int(m.value()) for m in msgs}
    missing = acked - got
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:10]}"
    assert len(msgs) == len(got), "duplicates in the log"
    # The consumer that ran through the outage saw records from before and after the stop.
    assert min(load.consumed) == 0 and max(load.consumed) > consumed_at_stop + 3000
