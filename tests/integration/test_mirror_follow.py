"""A mirror that follows the source's topics (mirror.topics.include / mirror.topics.exclude,
docs/mirror.md "Metadata sync", step 0), with two kmirrords in front of one destination: a source
topic that matches is started by the metadata sync within one interval, created on the
destination with the source's partitions, mirrored exactly (every record read through each
kmirrord and compared with the source), and shown as started by the pattern; one that the exclude
list names and one that does not match are left alone; a matching topic created
while the mirror runs joins within one interval; a source topic deleted stops its mirror topic
(STOPPED: writable, every mirrored record still there) and the pattern does not start it again."""

import time
import uuid

from confluent_kafka.admin import AdminClient

from mirror_cli import Cli, described, kmirror_bin, wait_states  # noqa: F401
from mirror_data import compare_topic, main_release_only, produce_records, wait_caught_up, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import produce, wait_until

pytestmark = main_release_only  # the sync's Metadata and the store's start, the same on every release

INTERVAL_MS = 2000


def dest_topics(cluster):
    return set(AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=30).topics)


def started_by(cli, mirror):
    return {t["name"]: t["started_by"] for t in described(cli, mirror)["topics"]}


def test_new_source_topics_follow_the_pattern(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    tag = uuid.uuid4().hex[:6]
    opts = dict(mirror_state_topic=f"__mirror_state_fol_{tag}", mirror_state_partitions=2,
                mirror_pipelines="owned")
    a = proxy_factory(dest_cluster, name="kmirrord-fol-a", **opts)
    b = proxy_factory(dest_cluster, name="kmirrord-fol-b", **opts)
    cli_a, cli_b = Cli(kmirror_bin, a.bootstrap), Cli(kmirror_bin, b.bootstrap)
    mirror = f"fol-{tag}"
    first, skipped, other, later = f"fol-{tag}-a", f"fol-{tag}-skip", f"other-{tag}", f"fol-{tag}-b"
    source_cluster.create_topic(first, partitions=3)
    source_cluster.create_topic(skipped, partitions=1)
    source_cluster.create_topic(other, partitions=1)
    produce_records(source_cluster.bootstrap, first, 300, compression="zstd", tag="a", partitions=3)

    cli_a.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap,
              "--config", f"mirror.topics.include=fol-{tag}-.*",
              "--config", f"mirror.topics.exclude=fol-{tag}-skip.*",
              "--config", f"mirror.metadata.refresh.interval.ms={INTERVAL_MS}")
    wait_states(cli_a, mirror, {first: "MIRRORING"}, timeout=60)
    assert partition_count(dest_cluster, first) == 3
    marks = wait_caught_up(a.bootstrap, source_cluster.bootstrap, first, 3, timeout=120)
    n, _ = compare_topic(a.bootstrap, source_cluster.bootstrap, first, 3, marks)
    assert n == 300
    # The instance that did not start it shows the same topic, records and origin.
    wait_until(lambda: watermarks(b.bootstrap, first, 3) == marks, 30, what="kmirrord b shows the mirrored end")
    compare_topic(b.bootstrap, source_cluster.bootstrap, first, 3, marks)
    for cli in (cli_a, cli_b):
        assert started_by(cli, mirror) == {first: "pattern"}
    # The sync's status is its runner's: the instance whose lease holds the mirror's slot.
    def runner_sync():
        for cli in (cli_a, cli_b):
            s = {x["kind"]: x for x in described(cli, mirror)["metadata_sync"]}
            if s["topics"]["is_owner"] and s["topics"]["changes_total"] >= 1:
                return s
        return None
    sync = wait_until(runner_sync, 30, 0.5, what="the instance that runs the mirror's sync")
    assert sync["topics"]["scope"] == f"include fol-{tag}-.*; exclude fol-{tag}-skip.*", sync["topics"]
    assert sync["topics"]["changes_total"] == 1 and sync["topics"]["errors_total"] == 0, sync["topics"]
    text = cli_a.run("describe", "--mirror", mirror).stdout
    assert "Topics: 1 (1 started by mirror.topics.include)" in text, text
    # One kmirrord ran the start (the one running the mirror's sync).
    starts = [p.name for p in (a, b) if f"started topic {first} (it matches mirror.topics.include)" in p.output()]
    assert len(starts) == 1, starts

    # Left alone: excluded, not matching.
    here = dest_topics(dest_cluster)
    assert skipped not in here and other not in here, here

    # A matching topic created while the mirror runs joins within one interval (and the start's own time).
    t0 = time.monotonic()
    source_cluster.create_topic(later, partitions=2)
    produce_records(source_cluster.bootstrap, later, 50, tag="b", partitions=2)
    wait_states(cli_b, mirror, {later: "MIRRORING"}, timeout=30)
    took = time.monotonic() - t0
    print(f"a new source topic was mirroring after {took:.1f} s (interval {INTERVAL_MS / 1000:.0f} s)")
    assert took < INTERVAL_MS / 1000 + 15, took
    marks_b = wait_caught_up(b.bootstrap, source_cluster.bootstrap, later, 2, timeout=120)
    assert compare_topic(b.bootstrap, source_cluster.bootstrap, later, 2, marks_b)[0] == 50

    # The source topic deleted: the mirror topic stops (STOPPED), keeps every record, takes writes,
    # and the pattern does not start it again.
    admin = AdminClient({"bootstrap.servers": source_cluster.bootstrap})
    admin.delete_topics([first])[first].result(30)
    wait_states(cli_a, mirror, {first: "STOPPED", later: "MIRRORING"}, timeout=90)
    assert watermarks(a.bootstrap, first, 3) == marks
    acked = produce(a, first, 5)
    assert len(acked) == 5
    time.sleep(3 * INTERVAL_MS / 1000)
    states = {t["name"]: t["state"] for t in described(cli_b, mirror)["topics"]}
    assert states[first] == "STOPPED", states
    assert started_by(cli_b, mirror)[later] == "pattern"


def partition_count(cluster, topic):
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=30)
    return len(md.topics[topic].partitions)
