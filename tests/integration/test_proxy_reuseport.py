"""Several kmirrord processes on one host serve the same ports (listen_reuseport, SO_REUSEPORT;
docs/operations.md, "Several instances"): the second one starts on the first one's listen and
broker ports only with the option, and clients of the shared address carry on through kill -9 of
either process: the producer (librdkafka, idempotent) sees no failed delivery, and a consumer group
reads every acknowledged record."""

import signal
import socket
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]


def sharing(proxy_factory, cluster, first, name, **options):
    """A kmirrord on first's listen and broker ports (its own HTTP port), started."""
    p = proxy_factory(cluster, name=name, start=False, listen=f"{PROXY_HOST}:{first.port}",
                      broker_port_base=first.broker_port_base, **options)
    p.port, p.broker_port_base = first.port, first.broker_port_base
    p.start()
    return p


def test_second_process_needs_the_option(proxy_factory, dest_cluster):
    a = proxy_factory(dest_cluster, name="kmirrord-a")
    b = sharing(proxy_factory, dest_cluster, a, "kmirrord-b")
    wait_until(lambda: not b.running(), 10, 0.1, "kmirrord-b to exit")
    out = b.output()
    assert "Address already in use" in out and "listen_reuseport = true" in out, b.daemon.tail()
    assert a.running()


def test_clients_carry_on_through_kill9(proxy_factory, dest_cluster):
    a = proxy_factory(dest_cluster, name="kmirrord-a", listen_reuseport="true")
    b = sharing(proxy_factory, dest_cluster, a, "kmirrord-b", listen_reuseport="true")
    b.wait_log(r"listening on .*\(bootstrap\)")
    topic = f"shared-{uuid.uuid4().hex[:8]}"
    create_topic(a, topic, partitions=3, rf=1)
    acked, failed = [], []
    stop = threading.Event()

    def produce():
        p = Producer({"bootstrap.servers": a.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "reconnect.backoff.max.ms": 200})

        def cb(err, msg):
            (failed if err else acked).append(err or msg.value())
        i = 0
        while not stop.is_set():
            p.produce(topic, f"v-{i}".encode(), callback=cb)
            i += 1
            p.poll(0.005)
        p.flush(60)
    t = threading.Thread(target=produce)
    t.start()
    try:
        wait_until(lambda: len(acked) > 200, 30, 0.1, "records acknowledged through the shared ports")
        # Both processes take connections: the kernel spreads them (by the connection's addresses;
        # 16 more make one process taking all of them a 1-in-30,000 chance).
        for _ in range(16):
            socket.create_connection((PROXY_HOST, a.port), timeout=5).close()
        def accepted():
            return {p.name: p.metric("kmirror_client_connections_total") for p in (a, b)}
        wait_until(lambda: all(n > 0 for n in accepted().values()), 10, 0.1, "connections accepted by both")
        print("connections accepted:", accepted())
        for victim, name in ((a, "a"), (b, "b")):
            before = len(acked)
            victim.signal(signal.SIGKILL)
            wait_until(lambda: not victim.running(), 10, 0.05, f"{name} killed")
            wait_until(lambda: len(acked) > before + 200, 60, 0.1, f"records acknowledged after the kill of {name}")
            log_at = len(victim.output())
            victim.start()  # on the same ports again, with the option
            victim.wait_log(r"listening on .*\(bootstrap\)", start=log_at)
            time.sleep(1)
    finally:
        stop.set()
        t.join(120)
    assert not failed, failed[:5]
    want = set(acked)
    c = Consumer({"bootstrap.servers": a.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 90
    while set(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    assert want <= set(got), f"{len(want - set(got))} acknowledged records not read"
    assert len(got) == len(set(got)), "a record was read twice"
    print(f"{len(acked)} records acknowledged through two processes on shared ports, two kill -9s, none lost")
