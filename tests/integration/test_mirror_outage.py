"""A source that is down (issue 29, item 9): kmirrord must not hammer it. Every reconnect backs off
per broker, exponentially with jitter (Kafka's reconnect.backoff.ms / reconnect.backoff.max.ms
defaults, 50 ms to 1 s), repeated failures are logged once with a count, and the mirror recovers
exactly when the source comes back. Before: about 50,000 connection attempts a second, an info
line each (83.5 MB of log in 15 s), and sockets connected to themselves on the broker's port,
which kept the restarted broker from binding it."""
import re
import time

import pytest

from confluent_kafka import Producer

from harness import KafkaCluster
from mirror_cli import Cli, kmirror_bin, wait_states  # noqa: F401
from mirror_data import compare_topic, main_release_only, produce_records, read_partition, watermarks
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
