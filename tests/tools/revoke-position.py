#!/usr/bin/env python3
"""A read_committed librdkafka member that commits position() in its revocation skips committed
records, on a lone Kafka broker with no kmirror in the path (docs/reliability.md, finding 8).

close() serves the operations fetched and not yet returned: it drops the records and moves the
position past each transaction marker among them, so the revocation it calls commits an offset
past records the member never got. The soak's members commit what they read instead.

    KM_KAFKA_CACHE=.cache/kafka KM_BROKER_PROFILE=test tests/tools/revoke-position.py \
        [position|read] [classic|consumer] [seconds]

position: commit position() in on_revoke (records are skipped); read: commit the last offset read
+ 1 (none are). Prints the committed records, those read and those never read."""
import os
import random
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from harness.kafka_cluster import KafkaCluster  # noqa: E402


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "position"
    proto = sys.argv[2] if len(sys.argv) > 2 else "classic"
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 60
    if mode not in ("position", "read") or proto not in ("classic", "consumer"):
        sys.exit(__doc__)
    cl = KafkaCluster(name="revoke-position", brokers=1)
    cl.start()
    try:
        topic = "t-" + uuid.uuid4().hex[:6]
        admin = AdminClient({"bootstrap.servers": cl.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
        stop = threading.Event()

        def produce():  # small transactions, one after the other
            p = Producer({"bootstrap.servers": cl.bootstrap, "transactional.id": "tx-" + topic, "linger.ms": 5})
            p.init_transactions()
            while not stop.is_set():
                p.begin_transaction()
                for _ in range(random.randint(1, 8)):
                    p.produce(topic, value=b"x" * 50, partition=0)
                p.commit_transaction()
                time.sleep(0.005)
        th = threading.Thread(target=produce)
        th.start()
        read, last, skipped_by = set(), {}, []
        t_end = time.time() + seconds
        while time.time() < t_end:  # a member that reads 0.5 to 1.5 s, then closes
            def on_revoke(c, tps):
                if mode == "position":
                    offs = [tp for tp in c.position(tps) if tp.offset >= 0]
                else:
                    offs = [TopicPartition(tp.topic, tp.partition, last[(tp.topic, tp.partition)] + 1)
                            for tp in tps if (tp.topic, tp.partition) in last]
                for tp in (c.commit(offsets=offs, asynchronous=False) or []) if offs else []:
                    skipped_by.append((tp.offset, last.get((tp.topic, tp.partition))))
            c = Consumer({"bootstrap.servers": cl.bootstrap, "group.id": "g-" + topic, "group.protocol": proto,
                          "enable.auto.commit": False, "auto.offset.reset": "earliest",
                          "isolation.level": "read_committed", "fetch.wait.max.ms": 200})
            c.subscribe([topic], on_revoke=on_revoke)
            until = time.time() + random.uniform(0.5, 1.5)
            while time.time() < until:
                for m in c.consume(num_messages=1000, timeout=0.2):
                    if m.error() is None:
                        read.add(m.offset())
                        last[(m.topic(), m.partition())] = m.offset()
            c.close()
        stop.set()
        th.join()
        c = Consumer({"bootstrap.servers": cl.bootstrap, "group.id": "all-" + topic, "enable.auto.commit": False,
                      "isolation.level": "read_committed"})
        c.assign([TopicPartition(topic, 0, 0)])
        committed, idle = set(), 0
        while idle < 5:
            ms = c.consume(num_messages=10000, timeout=1.0)
            idle = 0 if ms else idle + 1
            committed.update(m.offset() for m in ms if m.error() is None)
        c.close()
        hi = max(read) if read else -1
        never = sorted(o for o in committed if o <= hi and o not in read)
        past = [(o, r) for o, r in skipped_by if r is not None and any(r < x < o for x in never)]
        print(f"{mode} ({proto} protocol): {len(committed)} committed records, {len(read)} read, "
              f"{len(never)} never read up to offset {hi}: {never[:20]}; revocation commits past "
              f"records never read (committed, last read): {past[:10]}")
        return 1 if never else 0
    finally:
        cl.stop()


if __name__ == "__main__":
    sys.exit(main())
