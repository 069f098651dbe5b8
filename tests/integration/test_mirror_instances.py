"""Three kmirrords in front of a 3-broker destination, a and b sharing their ports (listen_reuseport)
and c on its own, all with mirror_pipelines = owned and one state topic (docs/operations.md,
"Several instances"). A mirror of 16 partitions under a steady source load; through them, a
librdkafka producer (on a and b's shared ports), a Java producer (kafka-producer-perf-test, on c)
and a consumer group (librdkafka, on c) reading the mirror topic. The instance that runs the
mirror is killed with -9 at a random moment, KILLS times (3 by default, 8 with the long run), and started again each
time: another takes the mirror over. Then a rolling restart of the three (SIGTERM, start again,
one after the other) under the same load. Afterwards every record reads through every instance at its
source offset, the destination's segment files equal the source's, the producers saw no failed
delivery (only retriable errors, which they retry), and the consumer group read every offset of
every partition, resuming at its committed offsets (never skipping one), with no error event."""

import random
import re
import signal
import subprocess
import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError

from mirror_cli import Cli, kmirror_bin  # noqa: F401
from mirror_data import (BackgroundProducer, assert_segments_exact, compare_topic, env_int, long_run,
                         main_release_only, wait_caught_up, watermarks)
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, wait_until
from test_mirror_owners import runners

pytestmark = main_release_only

PARTS = 16
KILLS = env_int("KM_INSTANCE_KILLS", 8 if long_run() else 3)
RATE = env_int("KM_INSTANCE_RATE", 4000 if long_run() else 1500)


class GroupReader:
    """A consumer group member reading topic through bootstrap from a thread, committing as it
    goes; keeps every (partition, offset) it read."""

    def __init__(self, bootstrap, topic):
        self.seen = {p: set() for p in range(PARTS)}
        self.errors = []
        self._stop = threading.Event()
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"inst-{uuid.uuid4().hex[:6]}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": True,
                            "auto.commit.interval.ms": 500, "reconnect.backoff.max.ms": 500})
        self._c.subscribe([topic])
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            m = self._c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF and not m.error().retriable():
                    self.errors.append(m.error())
                continue
            self.seen[m.partition()].add(m.offset())

    def count(self):
        return sum(len(s) for s in self.seen.values())

    def stop(self):
        self._stop.set()
        self._t.join(30)
        self._c.close()


def test_kill9_of_the_owner(kmirror_bin, dest_cluster3, source_cluster, proxy_factory):
    tag = uuid.uuid4().hex[:6]
    opts = dict(mirror_state_topic=f"__mirror_state_inst_{tag}", mirror_state_partitions=4,
                mirror_pipelines="owned", listen_reuseport="true")
    a = proxy_factory(dest_cluster3, name="kmirrord-inst-a", **opts)
    b = proxy_factory(dest_cluster3, name="kmirrord-inst-b", start=False, listen=f"{PROXY_HOST}:{a.port}",
                      broker_port_base=a.broker_port_base, **opts)
    b.port, b.broker_port_base = a.port, a.broker_port_base
    b.start()
    c = proxy_factory(dest_cluster3, name="kmirrord-inst-c", **opts)
    instances = [a, b, c]
    cli = Cli(kmirror_bin, c.bootstrap)
    mirror, topic, plain = f"inst-{tag}", f"inst-{tag}", f"inst-plain-{tag}"
    source_cluster.create_topic(topic, partitions=PARTS)
    dest_cluster3.create_topic(plain, partitions=6)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    cli.run("start", "--mirror", mirror, "--topics", topic)

    load = BackgroundProducer(source_cluster.bootstrap, topic, rate=RATE, tag="load").start()
    through = BackgroundProducer(a.bootstrap, plain, rate=500, tag="client").start()
    java = dest_cluster3.popen_tool(
        "producer-perf-test", "--topic", plain, "--num-records", "1000000000", "--record-size", "200",
        "--throughput", "300", "--producer-props", f"bootstrap.servers={c.bootstrap}", "acks=all",
        "delivery.timeout.ms=120000", "reconnect.backoff.max.ms=500",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reader = GroupReader(c.bootstrap, topic)
    rnd = random.Random(tag)
    takeovers = []
    try:
        wait_until(lambda: reader.count() > 1000, 90, 0.5, "the group reading the mirror through c")
        for k in range(KILLS):
            live = [p for p in instances if p.running()]
            r = wait_until(lambda: (lambda x: x if len(x[mirror]) == 1 else None)(runners(live, [mirror], 1.0)),
                           60, 0, f"one instance running {mirror} (round {k + 1})")
            owner = next(p for p in instances if p.name == r[mirror][0])
            time.sleep(rnd.uniform(0.0, 3.0))  # a random moment of the owner's work
            owner.signal(signal.SIGKILL)
            owner.daemon.proc.wait(timeout=30)
            t0 = time.monotonic()
            others = [p for p in instances if p is not owner]
            r = wait_until(lambda: (lambda x: x if len(x[mirror]) == 1 else None)(runners(others, [mirror], 1.0)),
                           60, 0, f"another instance taking {mirror} over from {owner.name}")
            takeovers.append((owner.name, r[mirror][0], round(time.monotonic() - t0, 1)))
            print(f"round {k + 1}: {owner.name} killed, {r[mirror][0]} runs {mirror} after {takeovers[-1][2]} s")
            owner.start()
        # A rolling restart of the three, under the same load: each drains (SIGTERM: its listeners
        # close, its clients move over, it leaves the group) and comes back.
        for p in instances:
            t0 = time.monotonic()
            p.stop()
            p.start()
            print(f"rolling restart: {p.name} back after {time.monotonic() - t0:.1f} s")
            time.sleep(2)
        time.sleep(3)
    finally:
        sent = load.stop()
        client_sent = through.stop()
        java.terminate()
        out, _ = java.communicate(timeout=60)
    print(f"takeovers: {takeovers}; source records {sent}, through kmirrord {client_sent}")
    # The Java producer reported no failed send: perf-test prints a failed send's exception at the
    # start of a line (WARN lines of reconnects are retriable: they are not failures).
    failures = re.findall(r"^(?:org\.apache\.kafka\.\S+Exception|java\.\S+Exception)[^\n]*", out, re.M)
    assert not failures, failures[:5]
    assert re.search(r"^\d+ records sent", out, re.M), out[-2000:]

    marks = watermarks(source_cluster.bootstrap, topic, PARTS)
    for p in instances:
        wait_caught_up(p.bootstrap, source_cluster.bootstrap, topic, PARTS, timeout=180, stall=60)
        compare_topic(p.bootstrap, source_cluster.bootstrap, topic, PARTS, marks=marks)
    assert_segments_exact(source_cluster, dest_cluster3, topic, PARTS)
    wait_until(lambda: all(len(reader.seen[p]) >= marks[p][1] - marks[p][0] for p in range(PARTS)), 120, 0.5,
               "the group to read every record")
    reader.stop()
    # A consumer at the head while a new owner hides what the killed one left used to get
    # MSG_SIZE_TOO_LARGE events (answers of hidden batches only; docs/proxy.md, "A partition with
    # nothing visible"): no error event at all now.
    print(f"consumer error events: {len(reader.errors)} {[e.str() for e in reader.errors[:3]]}")
    assert not reader.errors, reader.errors[:5]
    for part in range(PARTS):
        lo, hi = marks[part]
        missing = set(range(lo, hi)) - reader.seen[part]
        assert not missing, f"partition {part}: the group skipped {len(missing)} offsets, first {min(missing)}"
