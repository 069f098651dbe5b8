"""Failback (docs/mirror.md, "Failback"): cluster A is mirrored into B through B's kmirrord, B
fails over and takes writes, A takes writes of its own that B never saw (the divergent tail); then
A's own kmirrord mirrors the topic back from B's kmirrord. Through A's kmirrord the topic reads
exactly as through B's (same offsets, keys, values, headers, timestamps, both isolation levels),
A's divergent tail is hidden, and only the delta crossed: the records the failback mirror wrote
are B's records after the failover, counted by kmirrord's metrics."""

import uuid

import pytest
from confluent_kafka import KafkaException, Producer

from mirror_cli import Cli, described, kmirror_bin, wait_states  # noqa: F401
from mirror_data import (count_anomalies, create_dest_topic, diff_records, produce_records, progress,
                         read_partition, watermarks)
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, wait_until

pytestmark = pytest.mark.proxy

PARTS = 3


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _proxy(kmirrord_bin, cluster, log_dir, name, state_topic):
    p = Proxy(kmirrord_bin, cluster, log_dir, name=name, log_level="debug",
              mirror_state_topic=state_topic).start()
    wait_until(lambda: p.metric("kmirror_upstream_brokers") >= len(cluster.broker_ids), 30,
               what=f"{name} to learn the brokers")
    return p


@pytest.fixture(scope="module")
def pair(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path_factory):
    """kmirrord in front of B (the destination cluster) and one in front of A (the source)."""
    b = _proxy(kmirrord_bin, dest_cluster, str(tmp_path_factory.mktemp("fb-b")), "kmirrord-fb-b",
               "__mirror_state_fb_b")
    a = _proxy(kmirrord_bin, source_cluster, str(tmp_path_factory.mktemp("fb-a")), "kmirrord-fb-a",
               "__mirror_state_fb_a")
    yield a, b, Cli(kmirror_bin, a.bootstrap), Cli(kmirror_bin, b.bootstrap)
    for p in (a, b):
        p.stop()
        reports = p.sanitizer_reports()
        assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])


def produce(bootstrap, topic, values):
    """Records with the given values round-robin over the partitions; returns how many per partition."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, v in enumerate(values):
        p.produce(topic, value=v, key=f"k{i}".encode(), partition=i % PARTS, headers=[("h", v[:4])])
    assert p.flush(30) == 0


def compare(a_bootstrap, b_bootstrap, topic, marks, isolation):
    for part, (lo, hi) in enumerate(marks):
        src = read_partition(b_bootstrap, topic, part, lo, hi, **{"isolation.level": isolation})
        dst = read_partition(a_bootstrap, topic, part, lo, hi, **{"isolation.level": isolation})
        ndiff, first = diff_records(src, dst)
        counts = count_anomalies(src, dst)
        assert ndiff == 0 and not any(counts.values()), (part, isolation, ndiff, first, counts)


def mirror_total(proxy, mirror, metric="kmirror_mirror_records_total"):
    return sum(v for name, v in proxy.metrics().items()
               if name.startswith(metric + "{") and f'mirror="{mirror}"' in name)


def mirror_into_b(cli_b, b, mirror, source_cluster, dest_cluster, topic):
    """Mirror mirror on B's kmirrord: topic from A, caught up; returns A's watermarks."""
    cli_b.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    create_dest_topic(dest_cluster, source_cluster.bootstrap, topic)
    cli_b.run("start", "--mirror", mirror, "--topics", topic)
    marks_a = watermarks(source_cluster.bootstrap, topic, PARTS)

    def caught_up():
        try:
            return watermarks(b.bootstrap, topic, PARTS) == marks_a
        except KafkaException as e:  # a topic just made: its leader not known everywhere yet (retriable)
            print(f"watermarks through B: {e}")
            return False
    wait_until(caught_up, 120, what="A mirrored into B")
    return marks_a


def test_failback_moves_only_the_delta(pair, source_cluster, dest_cluster):
    a, b, cli_a, cli_b = pair
    topic = unique("fb")
    source_cluster.create_topic(topic, partitions=PARTS)
    produce_records(source_cluster.bootstrap, topic, 3000, "lz4", partitions=PARTS)

    # A -> B, caught up, then the failover: B stops mirroring and takes writes.
    m1 = unique("ab")
    marks_a = mirror_into_b(cli_b, b, m1, source_cluster, dest_cluster, topic)
    cli_b.run("stop", "--mirror", m1, "--topics", topic)
    wait_states(cli_b, m1, {topic: "STOPPED"}, timeout=60)
    produce(b.bootstrap, topic, [f"on-b-after-failover-{i}".encode() for i in range(600)])
    # A's divergent tail: written to A after B's last fetch, never seen by B.
    produce(a.bootstrap, topic, [f"on-a-divergent-{i}".encode() for i in range(90)])
    marks_b = watermarks(b.bootstrap, topic, PARTS)
    assert [h for _, h in marks_b] == [h + 200 for _, h in marks_a]

    # Failback: A's kmirrord mirrors the topic back from B's kmirrord.
    m2 = unique("ba")
    cli_a.run("create", "--mirror", m2, "--source-bootstrap", b.bootstrap)
    # The dry run: per partition, where B stopped, A's end and the divergent records to hide.
    dry, _ = cli_a.json("start", "--mirror", m2, "--topics", topic, "--dry-run")
    parts = sorted(dry["topics"][0]["partitions"], key=lambda p: p["partition"])
    assert dry["topics"][0]["failback"] is True, dry
    assert [p["source_stopped_at"] for p in parts] == [h for _, h in marks_a], parts
    assert [p["end_here"] for p in parts] == [h + 30 for _, h in marks_a], parts
    assert [p["records_hidden"] for p in parts] == [30] * PARTS and dry["total_records_hidden"] == 90, dry
    assert "failback" in cli_a.run("start", "--mirror", m2, "--topics", topic, "--dry-run").stdout
    assert "topics" not in described(cli_a, m2) or not described(cli_a, m2)["topics"]  # nothing started
    cli_a.run("start", "--mirror", m2, "--topics", topic)
    wait_states(cli_a, m2, {topic: "MIRRORING"}, timeout=60)
    wait_until(lambda: watermarks(a.bootstrap, topic, PARTS) == marks_b, 120, what="B mirrored back into A")
    compare(a.bootstrap, b.bootstrap, topic, marks_b, "read_uncommitted")
    compare(a.bootstrap, b.bootstrap, topic, marks_b, "read_committed")
    # Only the delta crossed: B's 600 records after the failover, none of the 3000 before.
    moved, moved_bytes = mirror_total(a, m2), mirror_total(a, m2, "kmirror_mirror_bytes_total")
    first_bytes = mirror_total(b, m1, "kmirror_mirror_bytes_total")
    progress(f"{topic}: failback mirrored {moved} records, {moved_bytes:.0f} bytes (the first mirror "
             f"{mirror_total(b, m1):.0f} records, {first_bytes:.0f} bytes)")
    assert moved == 600, moved
    assert 0 < moved_bytes < first_bytes / 2, (moved_bytes, first_bytes)
    # A's own log still holds its divergent records; through A's kmirrord they are hidden.
    raw = watermarks(source_cluster.bootstrap, topic, PARTS)
    assert [h for _, h in raw] == [h + 30 + 200 for _, h in marks_a]
    seen = [r.value for p in range(PARTS) for r in read_partition(a.bootstrap, topic, p, 0, marks_b[p][1])]
    assert not [v for v in seen if v.startswith(b"on-a-divergent")]
    cli_a.run("stop", "--mirror", m2, "--topics", topic)


def test_reverse_switches_direction(pair, source_cluster, dest_cluster):
    """kmirror reverse on B's kmirrord: promotes A -> B, creates B -> A on A's kmirrord and starts it;
    B's later writes reach A at the same offsets, and nothing before them crosses back."""
    a, b, cli_a, cli_b = pair
    topic = unique("rev")
    source_cluster.create_topic(topic, partitions=PARTS)
    produce(source_cluster.bootstrap, topic, [f"on-a-{i}".encode() for i in range(900)])
    m1, m2 = unique("ab"), unique("ba")
    marks_a = mirror_into_b(cli_b, b, m1, source_cluster, dest_cluster, topic)

    r = cli_b.run("reverse", "--mirror", m1, "--topics", topic, "--peer-bootstrap", a.bootstrap,
                  "--peer-mirror", m2, "--wait-ms", "30000")
    progress(f"{topic}: reverse said:\n{r.stdout}{r.stderr}")
    wait_states(cli_b, m1, {topic: "STOPPED"}, timeout=10)
    wait_states(cli_a, m2, {topic: "MIRRORING"}, timeout=60)
    produce(b.bootstrap, topic, [f"on-b-{i}".encode() for i in range(300)])
    marks_b = watermarks(b.bootstrap, topic, PARTS)
    wait_until(lambda: watermarks(a.bootstrap, topic, PARTS) == marks_b, 120, what="B mirrored back into A")
    compare(a.bootstrap, b.bootstrap, topic, marks_b, "read_committed")
    assert mirror_total(a, m2) == 300
    # Run again: every step is done already; it says so and changes nothing.
    cli_b.run("reverse", "--mirror", m1, "--topics", topic, "--peer-bootstrap", a.bootstrap,
              "--peer-mirror", m2, expect=1)
    assert {p["state"] for t in described(cli_a, m2)["topics"] for p in t["partitions"]} == {"MIRRORING"}
    cli_a.run("stop", "--mirror", m2, "--topics", topic)


def test_failback_refuses_a_topic_not_mirrored_from_here(pair, source_cluster, dest_cluster):
    """B's topic came from A's, but A's topic of that name was deleted and written again since: a
    start from B's kmirrord compares the record before B's stop point on both sides, finds them
    different and refuses the failback (FAILED, saying why) instead of keeping A's records as B's."""
    from confluent_kafka.admin import AdminClient
    a, b, cli_a, cli_b = pair
    topic = unique("fbx")
    source_cluster.create_topic(topic, partitions=PARTS)
    produce(source_cluster.bootstrap, topic, [f"first-life-{i}".encode() for i in range(300)])
    m1, m2 = unique("ab"), unique("ba")
    marks_a = mirror_into_b(cli_b, b, m1, source_cluster, dest_cluster, topic)
    cli_b.run("stop", "--mirror", m1, "--topics", topic)
    wait_states(cli_b, m1, {topic: "STOPPED"}, timeout=60)

    admin = AdminClient({"bootstrap.servers": source_cluster.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, 60, what="the topic deleted")
    wait_until(lambda: _create(source_cluster, topic), 60, what="the topic created again")
    produce(source_cluster.bootstrap, topic, [f"second-life-{i}".encode() for i in range(600)])

    cli_a.run("create", "--mirror", m2, "--source-bootstrap", b.bootstrap)
    cli_a.run("start", "--mirror", m2, "--topics", topic)
    wait_states(cli_a, m2, {topic: "FAILED"}, timeout=60)
    errs = {p["last_error"] for t in described(cli_a, m2)["topics"] for p in t["partitions"]}
    assert all(e and "not mirrored from this cluster" in e for e in errs), errs
    # Nothing of A's was hidden or written: its own records read as they are.
    cli_a.run("stop", "--mirror", m2, "--topics", topic)
    wait_states(cli_a, m2, {topic: "STOPPED"}, timeout=60)
    got = read_partition(a.bootstrap, topic, 0, 0, 200)
    assert got and all(r.value.startswith(b"second-life-") for r in got), got[:3]


def _create(cluster, topic):
    try:
        cluster.create_topic(topic, partitions=PARTS)
        return True
    except Exception:  # noqa: BLE001 - the deletion still in progress
        return False
