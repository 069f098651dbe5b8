"""Share groups (KIP-932) on a mirror topic see the source's offsets: a source whose log start was
moved by DeleteRecords before mirroring, mirrored into a destination topic that held (and then
deleted) records of its own, so that every logical offset differs from its physical one. A real
Java KafkaShareConsumer reads the topic through kmirrord; every record's offset, key and value
must be the source's, each once; its acknowledgements must land on the right physical records
(the share group's start offset on the destination reaches the log end, and a second consumer of
the group reads nothing)."""

import base64
import os
import shutil
import subprocess

import pytest
from confluent_kafka import Producer

from harness.kafka_cluster import java_bin
from mirror_cli import kmirror_bin, wait_states  # noqa: F401
from mirror_data import (create_dest_topic, main_release_only, produce_records, progress,
                         read_partition, watermarks)
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until
from test_mirror_data import _mirror_env, _teardown, delete_records, unique

pytestmark = [pytest.mark.proxy, main_release_only]

JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java")
PARTS = 2
RECORDS = 3000          # at the source, spread over the partitions
SOURCE_START = [333, 517]  # the source's log start per partition when mirroring begins (mid-batch)
DEST_OWN = [1000, 250]  # records the destination topic held (and deleted) before mirroring


@pytest.fixture(scope="module")
def share_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path_factory):
    if dest_cluster.version < (4, 4):
        pytest.skip("share groups need share.version, finalized by the 4.4 destination")
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster,
                      str(tmp_path_factory.mktemp("share")), "kmirrord-share")
    yield env
    _teardown(env)


@pytest.fixture(scope="module")
def share_cp(dest_cluster, tmp_path_factory):
    javac = os.path.join(os.path.dirname(os.path.realpath(java_bin())), "javac")
    javac = javac if os.access(javac, os.X_OK) else shutil.which("javac")
    assert javac, "javac not found"
    out = str(tmp_path_factory.mktemp("share-java"))
    subprocess.run([javac, "-d", out, "-cp", os.path.join(dest_cluster.libs, "*"),
                    os.path.join(JAVA_DIR, "ShareRead.java")], check=True, timeout=120)
    return out


def share_read(env, cp, group, topic, expected, idle_ms, reset=False):
    """ShareRead through the proxy: [(partition, offset, delivery count, key, value)] as read."""
    args = [env.pb, group, topic, expected, idle_ms] + (["reset"] if reset else [])
    r = env.dest.run_tool("ShareRead", *args, classpath=[cp], check=False, timeout=300)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines and lines[-1].startswith("DONE "), \
        f"ShareRead exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    errors = [ln for ln in lines if ln.startswith("ACKERR ")]
    assert not errors, f"acknowledgements failed: {errors[:10]}"

    def dec(s):
        return None if s == "-" else b"" if s == "=" else base64.b64decode(s)
    out = []
    for ln in lines:
        if ln.startswith("R "):
            _, p, off, dc, k, v = ln.split(" ")
            out.append((int(p), int(off), int(dc), dec(k), dec(v)))
    assert int(lines[-1].split()[1]) == len(out)
    return out


def share_group_lag(dest, group, topic):
    """{partition: LAG} of the share group, asked of the destination itself: the records from its
    start offset on not yet acknowledged (the start offset itself is persisted lazily, LAG is not)."""
    r = dest.run_tool("org.apache.kafka.tools.consumer.group.ShareGroupCommand",
                      "--bootstrap-server", dest.bootstrap, "--describe", "--group", group, "--offsets",
                      check=False, timeout=120)
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip()]
    head = next((row for row in rows if "PARTITION" in row and "LAG" in row), None)
    assert head, f"share group describe:\n{r.stdout}\n{r.stderr[-2000:]}"
    return {int(row[head.index("PARTITION")]): row[head.index("LAG")]
            for row in rows if len(row) == len(head) and row[head.index("TOPIC")] == topic}


def _produce_own(env, topic):
    """DEST_OWN[p] records of the destination's own in partition p, then deleted (DeleteRecords)."""
    pr = Producer({"bootstrap.servers": env.dest.bootstrap, "acks": "all", "linger.ms": 5})
    for p, n in enumerate(DEST_OWN):
        for i in range(n):
            pr.produce(topic, value=f"own-{p}-{i}".encode(), partition=p)
            if i % 1000 == 0:
                pr.poll(0)
    assert pr.flush(60) == 0
    for p, n in enumerate(DEST_OWN):
        delete_records(env.dest.bootstrap, topic, p, n)
    assert watermarks(env.dest.bootstrap, topic, PARTS) == [(n, n) for n in DEST_OWN]


def test_share_consumer_sees_source_offsets(share_env, share_cp):
    env = share_env
    topic = unique("share")
    env.source_topic(topic, partitions=PARTS)
    produce_records(env.sb, topic, RECORDS, "lz4", partitions=PARTS,
                    **{"linger.ms": 1, "batch.num.messages": 50})
    for p, start in enumerate(SOURCE_START):
        delete_records(env.sb, topic, p, start)
    # The destination topic holds records of its own first, gone (deleted) before mirroring begins:
    # the mirror's records land after them, at physical offsets that are not the source's.
    create_dest_topic(env.dest, env.sb, topic)
    _produce_own(env, topic)
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    marks = env.caught_up(topic, PARTS)
    assert [lo for lo, _ in marks] == SOURCE_START
    physical = watermarks(env.dest.bootstrap, topic, PARTS)
    progress(f"{topic}: source (logical) {marks}, destination (physical) {physical}")
    # The mirror writes the source's batches whole (the one holding the log start too) and moves
    # the destination's log start after it: the same records, nowhere at the same offsets.
    assert all(ph[0] != lo and ph[1] - ph[0] == hi - lo and ph[0] >= own
               for ph, own, (lo, hi) in zip(physical, DEST_OWN, marks)), (physical, marks)
    assert watermarks(env.pb, topic, PARTS) == marks

    group = unique("share-g")
    total = sum(hi - lo for lo, hi in marks)
    got = share_read(env, share_cp, group, topic, total, 3000, reset=True)
    problems = []
    for p, (lo, hi) in enumerate(marks):
        src = {r.offset: (r.key, r.value) for r in read_partition(env.sb, topic, p, lo, hi)}
        mine = [r for r in got if r[0] == p]
        offsets = [r[1] for r in mine]
        if len(set(offsets)) != len(offsets):
            problems.append(f"p{p}: {len(offsets) - len(set(offsets))} records delivered twice")
        if sorted(set(offsets)) != sorted(src):
            missing = sorted(set(src) - set(offsets))
            extra = sorted(set(offsets) - set(src))
            problems.append(f"p{p}: offsets differ from the source's: {len(missing)} missing "
                            f"(first {missing[:5]}), {len(extra)} not the source's (first {extra[:5]})")
        wrong = [r[1] for r in mine if r[1] in src and (r[3], r[4]) != src[r[1]]]
        if wrong:
            problems.append(f"p{p}: {len(wrong)} records with another key or value than the source's "
                            f"at their offset (first {wrong[:5]})")
        if any(r[2] != 1 for r in mine):
            problems.append(f"p{p}: delivery counts {sorted(set(r[2] for r in mine))}, wanted 1")
    assert not problems, "\n".join(problems)
    progress(f"{topic}: {len(got)} records through a share consumer, the source's offsets, keys and values")

    # Nothing is left for another member of the group: every record was acknowledged (a record
    # whose acknowledgement missed it would come back after its lock, or at once on close).
    again = share_read(env, share_cp, group, topic, 0, 5000)
    assert again == [], f"a second consumer of the group read {len(again)} records: {again[:5]}"
    # And the acknowledgements landed on the right (physical) records: asked of the destination
    # itself, the group has nothing unacknowledged left (acknowledgements of the logical offsets
    # as they came would have hit other records, or none, and left the real ones acquired).
    lag = share_group_lag(env.dest, group, topic)
    assert lag == {p: "0" for p in range(PARTS)}, f"share group lag on the destination: {lag}"


SHARE_TOOL = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"


def share_start_offsets(cluster, group, topic):
    """{partition: start offset} of a share group, asked of the cluster itself ({} before it has any)."""
    r = cluster.run_tool(SHARE_TOOL, "--bootstrap-server", cluster.bootstrap, "--describe", "--group", group,
                         "--offsets", check=False, timeout=120)
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip()]
    head = next((row for row in rows if "PARTITION" in row and "START-OFFSET" in row), None)
    if not head:
        return {}
    col = head.index("START-OFFSET")
    return {int(row[head.index("PARTITION")]): int(row[col])
            for row in rows if len(row) == len(head) and row[head.index("TOPIC")] == topic
            and row[col].lstrip("-").isdigit()}


def test_share_group_start_offsets_synced(share_env):
    """The metadata sync copies a share group's start offsets (docs/mirror.md, "Metadata sync"):
    set on the source, they appear on the destination translated to its physical offsets, so that
    the same position in the source's log is meant."""
    env = share_env
    env.cli.run("alter", "--mirror", env.mirror, "--config", "mirror.metadata.refresh.interval.ms=1000")
    topic = unique("share-sync")
    env.source_topic(topic, partitions=PARTS)
    produce_records(env.sb, topic, RECORDS, "lz4", partitions=PARTS, **{"linger.ms": 1, "batch.num.messages": 50})
    for p, start in enumerate(SOURCE_START):
        delete_records(env.sb, topic, p, start)
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    marks = env.caught_up(topic, PARTS)
    physical = watermarks(env.dest.bootstrap, topic, PARTS)
    assert [lo for lo, _ in marks] == SOURCE_START
    # The source's log starts at SOURCE_START, the destination's at its own offsets: a logical
    # offset L is physical ph_lo + (L - SOURCE_START) (no holes in between).
    group, at = unique("share-sync-g"), 1000
    env.source.run_tool(SHARE_TOOL, "--bootstrap-server", env.sb, "--reset-offsets", "--group", group,
                        "--topic", topic, "--to-offset", str(at), "--execute", timeout=120)
    assert share_start_offsets(env.source, group, topic) == {p: at for p in range(PARTS)}
    want = {p: physical[p][0] + at - SOURCE_START[p] for p in range(PARTS)}
    assert want != {p: at for p in range(PARTS)}  # the translation is visible
    wait_until(lambda: share_start_offsets(env.dest, group, topic) == want, timeout=60,
               interval=1.0, what=f"the share group's start offsets {want} on the destination")
