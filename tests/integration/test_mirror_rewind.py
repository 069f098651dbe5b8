"""A consumer through kmirrord is never sent back below what it read (docs/reliability.md, Findings,
item 2). Two kmirrords share their ports (listen_reuseport) and a state topic: a runs the mirror
(mirror_pipelines = all), b follows it (none), and shows each partition only up to the progress a
persisted, a few hundred milliseconds behind what a served. A librdkafka consumer (read_committed,
never committing) reads the mirror topic at its head through a while the source takes records; a
is killed with -9, so the consumer reconnects, to b, and validates its position there (KIP-320:
a lost connection makes librdkafka forget the leader's epoch, and learning it again sends
OffsetForLeaderEpoch). Then a starts again and b stops (the consumer goes back to a), and the
round twice more. The consumer must never be served an offset at or below one it already read, and
must read every record. Before the fix b answered OffsetForLeaderEpoch with its own tail, below the
consumer's position, and librdkafka took that for a truncated log and fetched again from there."""
import logging
import os
import signal
import threading
import uuid

from confluent_kafka import Consumer, TopicPartition

from mirror_cli import Cli, kmirror_bin, wait_states  # noqa: F401
from mirror_data import BackgroundProducer, main_release_only, wait_caught_up, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until

pytestmark = main_release_only  # the proxy's translation, the same on every release

PARTS = 2
RATE = 2000  # records a second at the source, in bursts of 100: the runner's tail moves every 50 ms
ROUNDS = 3
OFLE = 'kmirror_requests_total{api="OffsetForLeaderEpoch"}'


def metric(proxy, name):
    """A metric of proxy, 0 while its HTTP endpoint is not up yet (its Kafka port, shared, answers
    before it does)."""
    try:
        return proxy.metric(name)
    except OSError:
        return 0


class HeadReader:
    """A consumer at the head of topic from a thread: the highest offset it read per partition,
    every offset it read, and each record served at or below one already read (a rewind). The
    client's own log (debug fetch, topic) goes to log_path."""

    def __init__(self, bootstrap, topic, log_path):
        logger = logging.getLogger(f"rewind-{uuid.uuid4().hex[:6]}")
        logger.propagate = False
        h = logging.FileHandler(log_path)
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(h)
        logger.setLevel(logging.DEBUG)
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rewind-{uuid.uuid4().hex[:6]}",
                           "logger": logger, "debug": "fetch,topic", "enable.auto.commit": False,
                           "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                           "reconnect.backoff.max.ms": 200, "fetch.wait.max.ms": 100})
        self.c.assign([TopicPartition(topic, p, 0) for p in range(PARTS)])
        self.last = {p: -1 for p in range(PARTS)}
        self.seen = {p: set() for p in range(PARTS)}
        self.rewinds = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            for m in self.c.consume(num_messages=1000, timeout=0.2):
                if m.error():
                    continue
                p, o = m.partition(), m.offset()
                if o <= self.last[p]:
                    self.rewinds.append((p, self.last[p], o))
                self.last[p] = max(self.last[p], o)
                self.seen[p].add(o)

    def count(self):
        return sum(len(s) for s in self.seen.values())

    def stop(self):
        self._stop.set()
        self._t.join(30)
        self.c.close()


def test_no_rewind_when_the_consumer_moves_to_a_follower(kmirror_bin, dest_cluster, source_cluster, proxy_factory,
                                                         tmp_path):
    tag = uuid.uuid4().hex[:6]
    opts = dict(mirror_state_topic=f"__mirror_state_rw_{tag}", listen_reuseport="true", log_level="debug")
    a = proxy_factory(dest_cluster, name="kmirrord-rw-a", mirror_pipelines="all", **opts)
    cli = Cli(kmirror_bin, a.bootstrap)
    mirror = topic = f"rewind-{tag}"
    source_cluster.create_topic(topic, partitions=PARTS)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    cli.run("start", "--mirror", mirror, "--topics", topic)
    wait_states(cli, mirror, {topic: "MIRRORING"}, timeout=60)
    load = BackgroundProducer(source_cluster.bootstrap, topic, tag="rw", rate=RATE).start()
    reader = HeadReader(a.bootstrap, topic, os.path.join(str(tmp_path), "reader.log"))
    try:
        wait_until(lambda: reader.count() > 1000, 60, 0.2, "the reader to read through a")
        b = proxy_factory(dest_cluster, name="kmirrord-rw-b", start=False, listen=a.options["listen"],
                          broker_port_base=a.broker_port_base, mirror_pipelines="none", **opts)
        b.port, b.broker_port_base = a.port, a.broker_port_base
        behind = []  # per round: b showed less than the reader had read when it came to b
        for k in range(ROUNDS):
            # b joins a's ports; the reader's connections stay on a (b was not listening when they
            # were made), b follows the state.
            b.start()
            wait_until(lambda: metric(b, "kmirror_state_mirror_topics") >= 1, 30, 0.2, "b to know the mirror")
            n = reader.count()
            wait_until(lambda: reader.count() > n + 500, 30, 0.1, "the reader to read on through a")
            # a is killed as it serves the reader new records: its tail has just moved, and the
            # progress that would take b's there is written up to 200 ms later.
            n, asked = reader.count(), metric(b, OFLE)
            wait_until(lambda: reader.count() > n, 10, 0.001, "new records through a")
            a.signal(signal.SIGKILL)
            a.daemon.proc.wait(timeout=30)
            # The reader reconnects, to b, and validates its position there.
            wait_until(lambda: metric(b, OFLE) >= asked + PARTS, 30, 0.05, "the reader to validate at b")
            at = dict(reader.last)
            shown = [hi for _, hi in watermarks(b.bootstrap, topic, PARTS)]  # b's alone: a is down
            behind.append(any(shown[p] <= at[p] for p in range(PARTS)))
            a.start()
            wait_until(lambda: all(reader.last[p] > at[p] + 100 for p in range(PARTS)), 60, 0.2,
                       "the reader to read on after a is back")
            print(f"round {k + 1}: the reader at {at} when it came to b, which showed up to {shown}; "
                  f"rewinds so far: {len(reader.rewinds)} {reader.rewinds[:5]}")
            b.stop()  # the reader goes back to a
            n = reader.count()
            wait_until(lambda: reader.count() > n + 500, 30, 0.1, "the reader to read on through a alone")
        sent = load.stop()
        marks = wait_caught_up(a.bootstrap, source_cluster.bootstrap, topic, PARTS, timeout=120, stall=60)
        wait_until(lambda: all(reader.last[p] >= marks[p][1] - 1 for p in range(PARTS)), 60, 0.2,
                   "the reader to reach the end")
    finally:
        load.stop()
        reader.stop()
    print(f"{sent} records; reader at {reader.last}; rewinds: {len(reader.rewinds)} {reader.rewinds[:10]}")
    # Not vacuous: the reader came to b ahead of what b showed.
    assert any(behind), "b was never behind the reader when it came to b"
    assert not reader.rewinds, (f"{len(reader.rewinds)} records served again below what the reader had read "
                                f"(partition, highest read, served): {reader.rewinds[:10]}")
    for p in range(PARTS):
        lo, hi = marks[p]
        missing = set(range(lo, hi)) - reader.seen[p]
        assert not missing, f"partition {p}: {len(missing)} offsets never read, first {min(missing)}"
    assert watermarks(a.bootstrap, topic, PARTS) == marks
