"""Many partitions started at once: every one of them settles MIRRORING and mirrors.

A start of 3,000 partitions used to overflow the state store's queue (1,000 changes): every
partition's reconcile persisted its writer at the same time, the refused ones started over (a
warning each, again and again), and the PREPARING -> MIRRORING transitions the store refused were
dropped, so those partitions stayed PREPARING for good (at 10,000 partitions, 9,508 of them). Now
reconciles run a window at a time and a refused transition is written again."""

import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_cli import Cli, kmirror_bin, topic_states  # noqa: F401
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until

pytestmark = main_release_only  # the pipeline's and the store's own pacing, the same on every release

TOPICS = 300
PARTITIONS = 10


def produce_each(p, topics, value):
    """One record into every partition, each delivery seen: a failed one is produced again (at
    most three times), so that every partition's end is one more after it."""
    todo = [(t, part) for t in topics for part in range(PARTITIONS)]
    for _ in range(3):
        failed = []

        def report(err, msg):
            if err is not None:
                failed.append(((msg.topic(), msg.partition()), err.name()))
        for t, part in todo:
            p.produce(t, value=value, partition=part, on_delivery=report)
        assert p.flush(120) == 0
        if not failed:
            return
        print(f"produce {value!r}: {len(failed)} deliveries failed ({sorted({e for _, e in failed})}), again")
        todo = [tp for tp, _ in failed]
    raise AssertionError(f"{len(todo)} deliveries of {value!r} failed three times: {failed[:5]}")


def test_many_partitions_all_settle_and_mirror(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    proxy = proxy_factory(dest_cluster)
    cli = Cli(kmirror_bin, proxy.bootstrap)
    tag = uuid.uuid4().hex[:6]
    mirror = f"many-{tag}"
    topics = [f"many-{tag}-{i:03d}" for i in range(TOPICS)]
    admin = AdminClient({"bootstrap.servers": source_cluster.bootstrap})
    for i in range(0, TOPICS, 40):
        futs = admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics[i:i + 40]],
                                   operation_timeout=60, request_timeout=120)
        for f in futs.values():
            f.result()
    # A created topic's partitions reach the source broker's metadata a while after the creation
    # answers (the broker makes 3,000 logs first): produce and start only once all of them lead.
    def led():
        md = admin.list_topics(timeout=30)
        return all(t in md.topics and len(md.topics[t].partitions) == PARTITIONS and
                   all(pm.leader >= 0 for pm in md.topics[t].partitions.values()) for t in topics)
    wait_until(led, 120, 1.0, what="every source partition led in the source's metadata")
    # One record in every partition before the start, one after it settles.
    p = Producer({"bootstrap.servers": source_cluster.bootstrap, "acks": "all", "linger.ms": 20})
    produce_each(p, topics, b"before")
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    t0 = time.monotonic()
    ask = list(topics)
    while ask:  # a start waits 15 s at most for the destination's new leaders: the rest again
        r = cli.run("--timeout-ms", "300000", "start", "--mirror", mirror, "--topics", ",".join(ask), expect=None,
                    timeout=320)
        # Retriable answers (the start's deadline, a destination write that went unanswered under
        # load, a topic just created that the source's metadata does not show yet) are asked again,
        # as an operator would; anything else is printed for the failure.
        ask = [ln.split()[0] for ln in r.stdout.splitlines()
               if ln.split() and ln.split()[0] in topics and any(
                   e in ln for e in ("REQUEST_TIMED_OUT", "MIRROR_STATE_UNAVAILABLE", "UNKNOWN_TOPIC_OR_PARTITION"))]
        other = [ln for ln in r.stdout.splitlines()
                 if ln.split() and ln.split()[0] in topics and ln.split()[0] not in ask and "_" in ln]
        if ask or other:
            kinds = sorted({e for ln in r.stdout.splitlines() for e in ln.split() if e.isupper() and "_" in e})
            print(f"start: {len(ask)} topics asked again ({kinds}); other answers: {other[:10]}")
        assert time.monotonic() - t0 < 300, r.stdout[-2000:]

    def settled():
        st = topic_states(cli, mirror)
        n = sum(1 for t in topics for s in st.get(t, []) if s == "MIRRORING")
        return n == TOPICS * PARTITIONS and n
    wait_until(settled, 240, 1.0, what=f"all {TOPICS * PARTITIONS} partitions MIRRORING")
    took = time.monotonic() - t0
    produce_each(p, topics, b"after")

    # Every partition's two records through kmirrord (its high watermarks are the source's).
    c = AdminClient(proxy.conf())

    def ends(client):
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec
        req = {TopicPartition(t, part): OffsetSpec.latest() for t in topics for part in range(PARTITIONS)}
        out = {}
        for tp, f in client.list_offsets(req, request_timeout=60).items():
            try:
                out[(tp.topic, tp.partition)] = f.result().offset
            except Exception:  # noqa: BLE001 - not there yet
                out[(tp.topic, tp.partition)] = -1
        return out
    # The source's own ends first: a loaded 3-broker source may answer a partition's end late.
    want = wait_until(lambda: (lambda w: w if set(w.values()) == {2} else None)(ends(admin)), 60, 1.0,
                      what=lambda: f"the source's ends at 2: {sorted(set(ends(admin).values()))}")
    wait_until(lambda: ends(c) == want, 120, 1.0, what="every partition's records through kmirrord")
    log = proxy.output()
    print(f"{TOPICS * PARTITIONS} partitions MIRRORING {took:.1f} s after the start; "
          f"store refusals in the log: {log.count('state store is busy')}")
    assert "could not move" not in log, [ln for ln in log.splitlines() if "could not move" in ln][:3]
