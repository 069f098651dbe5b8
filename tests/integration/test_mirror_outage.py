"""A source that is down (issue 29, item 9): kmirrord must not hammer it. Every reconnect backs off
per broker, exponentially with jitter (Kafka's reconnect.backoff.ms / reconnect.backoff.max.ms
defaults, 50 ms to 1 s), repeated failures are logged once with a count, and the mirror recovers
exactly when the source comes back. Before: about 50,000 connection attempts a second, an info
line each (83.5 MB of log in 15 s), and sockets connected to themselves on the broker's port,
which kept the restarted broker from binding it."""
import re
import threading
import time

import pytest

from confluent_kafka import Consumer, Producer, TopicPartition

from harness import KafkaCluster
from mirror_cli import Cli, kmirror_bin, wait_states  # noqa: F401
from mirror_data import (BackgroundProducer, compare_topic, main_release_only, produce_records, read_partition,
                         watermarks)
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, wait_until
from test_mirror_data import _mirror_env, _teardown, unique

pytestmark = main_release_only  # the net layer and the pipeline, the same on every release

DOWN_S = 20


@pytest.fixture(scope="module")
def outage(kmirrord_bin, kmirror_bin, tmp_path_factory):
    """A source and a destination of the module's own: the tests stop their brokers."""
    src, dst = KafkaCluster("outage", brokers=1), KafkaCluster("outage-dst", brokers=1)
    src.start()
    dst.start()
    env = _mirror_env(kmirrord_bin, kmirror_bin, dst, src, str(tmp_path_factory.mktemp("outage")),
                      "kmirrord-outage")
    yield env, src
    try:
        _teardown(env)
    finally:
        src.stop()
        dst.stop()


def outage_counts(side, out, addr):
    """What kmirrord's log (at debug) holds of an outage of side at addr: the connections it opened
    there, and its lines at info or above (printed)."""
    attempts = len(re.findall(rf"client to {re.escape(addr)}: idle -> connecting", out))
    loud = [ln for ln in out.splitlines() if re.search(r" level=(info|warn|error) ", ln)]
    print(f"{side} down {DOWN_S} s: {attempts} connection attempts to {addr}, {len(loud)} lines at info or "
          f"above ({len(out)} bytes at debug)")
    for ln in loud[:30]:
        print("  ", ln[:220])
    return attempts, loud


def test_a_source_that_is_down_is_not_hammered(outage):
    env, src = outage
    topic = unique("down")
    env.source_topic(topic, partitions=2)
    produce_records(env.sb, topic, 100, tag="a", partitions=2)
    env.start(topic)
    env.caught_up(topic, 2)
    (node,) = [n.node_id for n in src.broker_nodes]
    addr = env.sb.split(",")[0]

    mark = len(env.proxy.output())
    src.stop_broker(node)
    time.sleep(DOWN_S / 2)
    # stop --dry-run with the source gone (issue 29, item 3): says so, and gives kmirrord's last
    # figures with their age, quickly.
    t0 = time.monotonic()
    doc, _ = env.cli.json("stop", "--mirror", env.mirror, "--topics", topic, "--dry-run")
    took = time.monotonic() - t0
    print(f"dry run with the source down: {took:.1f} s, {doc['source_error']}")
    assert doc["source_asked"] is False and addr.split(":")[-1] in doc["source_error"], doc
    (t,) = doc["topics"]
    assert [(p["source_end_offset"], p["source_end_asked"], p["records_at_risk"]) for p in t["partitions"]] == \
        [(50, False, 0)] * 2, t
    assert all(p["last_fetched_age_ms"] >= 1000 * DOWN_S / 2 - 2000 for p in t["partitions"]), t
    assert took < 15, took
    text = env.cli.run("stop", "--mirror", env.mirror, "--topics", topic, "--dry-run").stdout
    assert "The source was not asked" in text and "s ago)" in text, text
    time.sleep(DOWN_S / 2)
    out = env.proxy.output()[mark:]
    attempts, loud = outage_counts("source", out, addr)
    # About one attempt a second per client of the source (pipeline, metadata sync, lease), at most.
    assert attempts <= DOWN_S * 8, attempts
    assert len(loud) <= 60, len(loud)
    assert not re.search(r"unexpected correlation id", out)

    src.start_broker(node)
    produce_records(env.sb, topic, 50, start=100, tag="b", partitions=2)
    env.caught_up(topic, 2, timeout=120)
    total, _ = compare_topic(env.pb, env.sb, topic, 2)
    assert total == 150


def test_failover_with_the_source_gone_then_failback(outage, kmirrord_bin, kmirror_bin, tmp_path_factory):
    """Issue 29, item 4: the source's broker stopped (the disaster) while a source transaction is
    open and mirrored. `stop` completes within its timeout, every partition STOPPED and writable,
    no transaction of the mirror hanging on the destination, the dry run says the source could not
    be asked. When the source is back, a kmirrord in front of it fails back from the destination's
    kmirrord: only the delta crosses (the records written after the failover) and the old source
    then reads exactly as the destination."""
    env, src = outage
    topic = unique("gone")
    env.source_topic(topic, partitions=2)
    produce_records(env.sb, topic, 40, tag="a", partitions=2)
    tx = Producer({"bootstrap.servers": env.sb, "transactional.id": unique("gone-tx"),
                   "transaction.timeout.ms": 600000})
    tx.init_transactions(30)
    tx.begin_transaction()
    for i in range(6):
        tx.produce(topic, key=f"open-{i}".encode(), value=b"never decided", partition=0)
    assert tx.flush(30) == 0
    env.start(topic)
    wait_until(lambda: [h for _, h in watermarks(env.pb, topic, 2, **{"isolation.level": "read_uncommitted"})]
               == [26, 20], 60, what="the mirror to hold the open transaction's records")
    (node,) = [n.node_id for n in src.broker_nodes]
    src.stop_broker(node)
    try:
        doc, _ = env.cli.json("stop", "--mirror", env.mirror, "--topics", topic, "--dry-run")
        assert doc["source_asked"] is False, doc
        t0 = time.monotonic()
        env.cli.run("stop", "--mirror", env.mirror, "--topics", topic)
        wait_states(env.cli, env.mirror, {topic: "STOPPED"}, timeout=30)
        took = time.monotonic() - t0
        print(f"stop with the source gone: STOPPED after {took:.1f} s")
        hanging = [ln for ln in env.proxy.tool("transactions", "list").stdout.splitlines()
                   if ln.startswith("kmirror/") and "Ongoing" in ln]
        assert not hanging, hanging
        # Writable: the failover's new records (the delta a failback will move).
        produce_records(env.pb, topic, 30, start=500, tag="after", partitions=2)
        after = watermarks(env.pb, topic, 2)
        print("through the destination's kmirrord after the failover:", after)
    finally:
        src.start_broker(node)
    tx.abort_transaction(30)

    # The failback: a kmirrord in front of the old source mirrors the topic from the destination's.
    a = Proxy(kmirrord_bin, src, str(tmp_path_factory.mktemp("outage-a")), name="kmirrord-outage-a",
              log_level="debug", mirror_state_topic="__mirror_state_outage_a").start()
    try:
        cli_a = Cli(kmirror_bin, a.bootstrap)
        back = unique("back")
        cli_a.run("create", "--mirror", back, "--source-bootstrap", env.pb)
        cli_a.run("start", "--mirror", back, "--topics", topic)
        wait_states(cli_a, back, {topic: "MIRRORING"}, timeout=60)
        wait_until(lambda: watermarks(a.bootstrap, topic, 2) == after, 120, what="the failback to catch up")
        for p, (lo, hi) in enumerate(after):
            for iso in ("read_uncommitted", "read_committed"):
                want = [(r.offset, r.key, r.value) for r in
                        read_partition(env.pb, topic, p, lo, hi, **{"isolation.level": iso})]
                got = [(r.offset, r.key, r.value) for r in
                       read_partition(a.bootstrap, topic, p, lo, hi, **{"isolation.level": iso})]
                assert got == want, (p, iso)
        moved = sum(v for name, v in a.metrics().items()
                    if name.startswith("kmirror_mirror_records_total{") and f'mirror="{back}"' in name)
        print(f"failback moved {moved} records")
        # The delta: the 30 written after the failover, and the open transaction's ABORT marker
        # the destination appended in partition 0, the stop point being where it began (offset 20).
        assert moved <= 30 + 6 + 1, moved
        assert moved >= 30, moved
        cli_a.run("stop", "--mirror", back, "--topics", topic)
        wait_states(cli_a, back, {topic: "STOPPED"}, timeout=60)
    finally:
        a.stop()


def test_a_destination_that_is_down_is_not_hammered(outage):
    """The same with the destination's broker stopped: kmirrord's own connections to it (the
    pipelines, the state store's writer and follower, metadata sync, the lease, the proxy's
    metadata) back off too; the mirror goes on exactly once the destination is back."""
    env, src = outage
    topic = unique("dstdown")
    env.source_topic(topic, partitions=2)
    produce_records(env.sb, topic, 100, tag="a", partitions=2)
    env.start(topic)
    env.caught_up(topic, 2)
    dst = env.dest
    (node,) = [n.node_id for n in dst.broker_nodes]
    addr = dst.bootstrap.split(",")[0]
    mark = len(env.proxy.output())
    dst.stop_broker(node)
    try:
        produce_records(env.sb, topic, 50, start=100, tag="b", partitions=2)  # the source goes on
        time.sleep(DOWN_S)
        out = env.proxy.output()[mark:]
    finally:
        dst.start_broker(node)
    attempts, loud = outage_counts("destination", out, addr)
    assert attempts <= DOWN_S * 12, attempts
    assert len(loud) <= 80, len(loud)
    # Nor the source: partitions that cannot write stay in the fetch session at size 0, and the
    # source broker answers at once for their data; the pipeline waits after such an answer (5 ms,
    # doubling while they keep coming, to 100 ms) instead of fetching again at once (before: 79,696
    # Fetches in 20 s; with a fixed 100 ms, 396 partition turns; doubling from 5 ms, 403).
    fetches = len(re.findall(r"READY -> FETCHING", out))
    print(f"partition fetch turns while the destination was down: {fetches}")
    assert fetches <= DOWN_S * 60, fetches
    env.caught_up(topic, 2, timeout=180)
    assert compare_topic(env.pb, env.sb, topic, 2)[0] == 150


class LiveReader:
    """A consumer reading topic from its start for as long as the test runs, as an application
    would (librdkafka, read_committed, no commits): the offsets it read per partition, and when it
    last read one."""

    def __init__(self, bootstrap, topic, partitions):
        self.topic = topic
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("live"),
                           "enable.auto.commit": False, "auto.offset.reset": "earliest",
                           "isolation.level": "read_committed", "fetch.wait.max.ms": 200,
                           "reconnect.backoff.max.ms": 1000})
        self.c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
        self.read = {p: set() for p in range(partitions)}
        self.last_read = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            for m in self.c.consume(num_messages=1000, timeout=0.2):
                if m.error() is None:
                    self.read[m.partition()].add(m.offset())
                    self.last_read = time.monotonic()

    def has_read(self, ends):
        """Whether it read every offset below ends[p] of every partition."""
        return all(self.read[p] >= set(range(end)) for p, end in enumerate(ends))

    def where(self):
        return {p: (len(o), max(o, default=-1)) for p, o in self.read.items()}

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        self.c.close()


def test_consumers_read_on_after_the_destination_restarts(outage):
    """Finding 3 of docs/reliability.md: the destination's only broker killed (SIGKILL) under a live
    load at the source fails the state store's progress write in flight, so the store reads
    __mirror_state back once the broker is there again. A consumer's request that came in during
    that reread waited for the store (correctly: nothing can be translated before it) but was
    never let go when the reread ended: consumers through kmirrord stalled until the next
    disturbance, with no error, on a mirror topic and a plain one alike. They must read on and
    read everything, as a consumer straight on the destination does."""
    env, src = outage
    dst = env.dest
    topic, plain = unique("live"), unique("plain")
    env.source_topic(topic, partitions=2)
    env.start(topic)
    dst.create_topic(plain, partitions=1)
    produce_records(dst.bootstrap, plain, 20, tag="before")
    load = BackgroundProducer(env.sb, topic, rate=300).start()
    readers = [LiveReader(env.pb, topic, 2), LiveReader(env.pb, plain, 1)]
    try:
        wait_until(lambda: all(sum(len(o) for o in r.read.values()) > 0 for r in readers), 60,
                   what="both readers to read through kmirrord")
        time.sleep(2)  # the mirror moving: a progress write every 200 ms
        (node,) = [n.node_id for n in dst.broker_nodes]
        mark = len(env.proxy.output())
        dst.stop_broker(node, kill=True)
        try:
            # The progress write in flight gives up after its retries: the store reads the topic back.
            env.proxy.wait_log(r"Writing __mirror_state\S* failed", timeout=60, start=mark)
        finally:
            dst.start_broker(node)
        back = time.monotonic()
        produce_records(dst.bootstrap, plain, 20, start=20, tag="after")
        time.sleep(3)  # records mirrored after the restart too
        load.stop()
        ends = [hi for _, hi in env.caught_up(topic, 2, timeout=120)]
        want = {topic: ends, plain: [40]}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(r.has_read(want[r.topic]) for r in readers):
            time.sleep(0.2)
        out = env.proxy.output()[mark:]
        waited = len(re.findall(r"waits for the mirror state to load", out))
        print(f"after the restart: {waited} request(s) waited for the mirror state; the mirror caught up "
              f"{time.monotonic() - back:.1f} s after the broker was back")
        stalled = [f"the reader of {r.topic} read {r.where()} (count, last offset) of {want[r.topic]}, "
                   f"nothing for {time.monotonic() - r.last_read:.0f} s" for r in readers
                   if not r.has_read(want[r.topic])]
        assert not stalled, (f"readers through kmirrord stalled after the restart ({waited} request(s) "
                             f"waited for the mirror state to load): " + "; ".join(stalled))
    finally:
        for r in readers:
            r.stop()
        if not load._stop.is_set():
            load.stop()
