"""Topologies (issue 29, item 8), each mirrored exactly and compared record by record (offsets,
keys, values, headers, timestamps) with the source, at both isolation levels where transactions
are in the topic:

- fan-out: one source into two destinations, a kmirrord in front of each;
- fan-in: two sources into one destination, different topics, two mirrors of one kmirrord;
- a chain A -> B -> C: the second hop's source is B's kmirrord, so C's clients see A's offsets
  (a source log that starts past 0, and transactions, so that offsets and markers must carry).

Three clusters: the session's source (A) and destination (B), and one of the module's own (C)."""
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from harness import KafkaCluster
from mirror_cli import kmirror_bin, wait_states  # noqa: F401
from mirror_data import (compare_topic, create_dest_topic, main_release_only, produce_records, read_partition,
                         wait_caught_up, watermarks)
from proxy_fixtures import *  # noqa: F401,F403
from test_mirror_data import _mirror_env, _teardown, unique

pytestmark = main_release_only  # the pipeline and proxy paths, the same on every release

PARTS = 3


class Via:
    """A source that is a kmirrord (the chain's second hop): only its bootstrap is used."""

    def __init__(self, bootstrap):
        self.bootstrap = bootstrap


@pytest.fixture(scope="module")
def third():
    c = KafkaCluster("third", brokers=1)
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def envs(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, third, tmp_path_factory):
    """kmirrord in front of B mirroring from A, and in front of C mirroring from A."""
    b = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster,
                    str(tmp_path_factory.mktemp("topo-b")), "kmirrord-topo-b")
    c = _mirror_env(kmirrord_bin, kmirror_bin, third, source_cluster,
                    str(tmp_path_factory.mktemp("topo-c")), "kmirrord-topo-c")
    yield b, c
    for e in (b, c):
        _teardown(e)


def transactional_traffic(bootstrap, topic, rounds=6):
    """Committed and aborted transactions and plain records, spread over the partitions."""
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("topo-tx")})
    tx.init_transactions(30)
    for r in range(rounds):
        tx.begin_transaction()
        for i in range(15):
            tx.produce(topic, key=f"t{r}-{i}".encode(), value=b"in a transaction", partition=i % PARTS,
                       headers=[("round", str(r).encode())])
        if r % 3 == 2:
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)
        for i in range(10):
            plain.produce(topic, key=f"p{r}-{i}".encode(), value=b"plain", partition=i % PARTS)
        assert plain.flush(30) == 0


def compare_both(via, source, topic):
    """Both isolation levels, every partition, record by record: via (a kmirrord) against source."""
    marks = watermarks(source, topic, PARTS)
    for iso in ("read_uncommitted", "read_committed"):
        for p, (lo, hi) in enumerate(marks):
            src = [(r.offset, r.key, r.value, r.headers, r.timestamp)
                   for r in read_partition(source, topic, p, lo, hi, **{"isolation.level": iso})]
            got = [(r.offset, r.key, r.value, r.headers, r.timestamp)
                   for r in read_partition(via, topic, p, lo, hi, **{"isolation.level": iso})]
            assert got == src, (iso, p, len(got), len(src))
    return marks


def test_fan_out(envs):
    b, c = envs
    topic = unique("fanout")
    b.source_topic(topic, partitions=PARTS)
    produce_records(b.sb, topic, 600, partitions=PARTS)
    b.start(topic)
    c.start(topic)
    b.caught_up(topic, PARTS)
    c.caught_up(topic, PARTS)
    total_b, _ = compare_topic(b.pb, b.sb, topic, PARTS)
    total_c, _ = compare_topic(c.pb, c.sb, topic, PARTS)
    assert total_b == total_c == 600
    # Both go on with the source.
    produce_records(b.sb, topic, 300, start=600, tag="more", partitions=PARTS)
    b.caught_up(topic, PARTS)
    c.caught_up(topic, PARTS)
    assert compare_topic(b.pb, b.sb, topic, PARTS)[0] == compare_topic(c.pb, c.sb, topic, PARTS)[0] == 900


def test_fan_in(envs, third):
    b, _ = envs
    ta, tc = unique("fanin-a"), unique("fanin-c")
    other = unique("from-c")
    b.cli.run("create", "--mirror", other, "--source-bootstrap", third.bootstrap)
    b.source_topic(ta, partitions=PARTS)
    third.create_topic(tc, partitions=PARTS)
    produce_records(b.sb, ta, 400, partitions=PARTS)
    produce_records(third.bootstrap, tc, 500, partitions=PARTS)
    b.start(ta)
    create_dest_topic(b.dest, third.bootstrap, tc)
    b.cli.run("start", "--mirror", other, "--topics", tc)
    wait_states(b.cli, other, {tc: "MIRRORING"}, timeout=60)
    b.caught_up(ta, PARTS)
    wait_caught_up(b.pb, third.bootstrap, tc, PARTS, timeout=300, stall=60)
    assert compare_topic(b.pb, b.sb, ta, PARTS)[0] == 400
    assert compare_topic(b.pb, third.bootstrap, tc, PARTS)[0] == 500
    b.cli.run("stop", "--mirror", other, "--topics", tc)
    wait_states(b.cli, other, {tc: "STOPPED"}, timeout=60)


def test_chain(envs):
    """A -> B -> C: C's kmirrord mirrors from B's kmirrord, which presents A's offsets."""
    b, c = envs
    topic = unique("chain")
    b.source_topic(topic, partitions=PARTS)
    produce_records(b.sb, topic, 90, partitions=PARTS)
    # A's log starts past 0 (DeleteRecords at 10 in each partition), then transactions.
    admin = AdminClient({"bootstrap.servers": b.sb})
    tps = [TopicPartition(topic, p, 10) for p in range(PARTS)]
    for f in admin.delete_records(tps, request_timeout=30).values():
        f.result(30)
    transactional_traffic(b.sb, topic)
    b.start(topic)
    b.caught_up(topic, PARTS)
    compare_both(b.pb, b.sb, topic)
    # The second hop: a mirror on C's kmirrord whose source is B's kmirrord.
    hop = unique("hop")
    c.cli.run("create", "--mirror", hop, "--source-bootstrap", b.pb)
    create_dest_topic(c.dest, b.pb, topic)
    c.cli.run("start", "--mirror", hop, "--topics", topic)
    wait_states(c.cli, hop, {topic: "MIRRORING"}, timeout=60)
    wait_caught_up(c.pb, b.sb, topic, PARTS, timeout=300, stall=60)
    marks = compare_both(c.pb, b.sb, topic)
    print("A's marks, seen the same through C's kmirrord:", marks)
    assert all(lo == 10 for lo, _ in marks), marks
    assert watermarks(c.pb, topic, PARTS) == marks
    # More at A crosses both hops.
    transactional_traffic(b.sb, topic, rounds=3)
    b.caught_up(topic, PARTS)
    wait_caught_up(c.pb, b.sb, topic, PARTS, timeout=300, stall=60)
    compare_both(c.pb, b.sb, topic)
    c.cli.run("stop", "--mirror", hop, "--topics", topic)
    wait_states(c.cli, hop, {topic: "STOPPED"}, timeout=60)
