#!/usr/bin/env python3
"""One produce to a topic through a Python client (confluent-kafka or kafka-python), for
scripts/client-errors: the topic's metadata first, then one record to partition 0; prints what the
application gets.

Usage: produce.py confluent-kafka|kafka-python BOOTSTRAP TOPIC plain|idem
Output, one line each: RESULT OK|ERROR, CLASS (the error's class and, for librdkafka, its name,
code and retriable flag), TEXT (str() of it), MS (send to the result)."""

import sys
import time


def confluent(bootstrap, topic, mode):
    from confluent_kafka import Producer
    conf = {"bootstrap.servers": bootstrap, "message.timeout.ms": 30000, "client.id": "kmirror-client-errors"}
    conf.update({"acks": 1} if mode == "plain" else {"enable.idempotence": True})
    p = Producer(conf)
    p.list_topics(topic, timeout=15)
    got = []
    t0 = time.monotonic()
    p.produce(topic, b"to-mirror", partition=0, on_delivery=lambda err, msg: got.append(err))
    p.flush(60)
    ms = (time.monotonic() - t0) * 1000
    err = got[0] if got else "no delivery report"
    if err is None:
        return None, None, ms
    if isinstance(err, str):
        return "none", err, ms
    return (f"KafkaError {err.name()} ({err.code()}, retriable {err.retriable()}, fatal {err.fatal()})",
            err.str(), ms)


def kafka_python(bootstrap, topic, mode):
    from kafka import KafkaProducer
    conf = {"acks": 1, "enable_idempotence": False} if mode == "plain" else {"enable_idempotence": True, "acks": "all"}
    p = KafkaProducer(bootstrap_servers=bootstrap, client_id="kmirror-client-errors",
                      request_timeout_ms=10000, delivery_timeout_ms=30000, **conf)
    try:
        p.partitions_for(topic)
        t0 = time.monotonic()
        try:
            p.send(topic, b"to-mirror", partition=0).get(timeout=60)
            return None, None, (time.monotonic() - t0) * 1000
        except Exception as e:  # what the application catches
            ms = (time.monotonic() - t0) * 1000
            cls = f"{type(e).__module__}.{type(e).__name__}"
            if hasattr(e, "retriable"):
                cls += f" (retriable {e.retriable})"
            return cls, str(e), ms
    finally:
        p.close(timeout=10)


def main():
    family, bootstrap, topic, mode = sys.argv[1:5]
    cls, text, ms = {"confluent-kafka": confluent, "kafka-python": kafka_python}[family](bootstrap, topic, mode)
    if cls is None:
        print("RESULT OK")
    else:
        print("RESULT ERROR")
        print(f"CLASS {cls}")
        print("TEXT " + str(text).replace("\n", " "))
    print(f"MS {ms:.1f}")


if __name__ == "__main__":
    main()
