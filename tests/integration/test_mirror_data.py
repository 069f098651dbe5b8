"""The mirror data plane is exact: records produced at a real source cluster, mirrored by kmirrord
into a real destination, read through the proxy and directly from the source and compared record by
record (offset, key, value, headers, timestamp and its type), and the destination's segment files
compared with the source's batch by batch (records bytes, count, lastOffsetDelta, codec, timestamps).
Sizes: KM_MIRROR_RECORDS (default 50,000; 1,000,000 with KM_LONG=1 or --long), KM_MIRROR_KILLS
(default 3; 10 long). test_exactness_checks_fire runs the comparisons source against source and
against altered copies first, so a failure elsewhere is the mirror's, not the checker's."""

import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from harness.kafka_cluster import java_bin
from mirror_cli import Cli, described, kmirror_bin, wait_states  # noqa: F401
from mirror_data import (Rec, BackgroundProducer, assert_segments_exact, compare_batches,
                         compare_partition, compare_topic, count_anomalies, create_dest_topic,
                         diff_records, env_int,
                         long_run, main_release_only, offsets_for_times, partition_batches,
                         produce_records, progress,
                         read_partition, record, shifted_copy, wait_caught_up, watermarks)
from harness import KafkaCluster
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, wait_until

pytestmark = pytest.mark.proxy

JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java")
READ_ONLY_TOPIC = 44  # POLICY_VIOLATION, the default read_only_error
PARTS = 8
N = env_int("KM_MIRROR_RECORDS", 1_000_000 if long_run() else 50_000)
KILLS = env_int("KM_MIRROR_KILLS", 10 if long_run() else 3)
# Catching up must never stall this long (a mirror that does not move fails fast).
STALL = env_int("KM_MIRROR_STALL_S", 60)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------
# Fixtures: one kmirrord and one mirror per destination for the module (tests use topics of their
# own); the crash test restarts the same kmirrord on the same ports.

class MirrorEnv:
    def __init__(self, proxy, cli, mirror, source, dest):
        self.proxy, self.cli, self.mirror, self.source, self.dest = proxy, cli, mirror, source, dest

    @property
    def pb(self):
        return self.proxy.bootstrap

    @property
    def sb(self):
        return self.source.bootstrap

    def source_topic(self, topic, partitions=PARTS, config=None):
        self.source.create_topic(topic, partitions=partitions, config=config)

    def start(self, topic, dest_config=None):
        """Mirrors topic: the destination topic (until start creates it), start, MIRRORING."""
        create_dest_topic(self.dest, self.sb, topic, config=dest_config)
        self.cli.run("start", "--mirror", self.mirror, "--topics", topic)
        wait_states(self.cli, self.mirror, {topic: "MIRRORING"}, timeout=60)

    def describe(self, topic=None):
        m = described(self.cli, self.mirror)
        return [t for t in m["topics"] if topic is None or t["name"] == topic]

    def partitions(self, topic):
        """describe's partitions of topic, by partition."""
        t = self.describe(topic)
        assert t, f"{topic} not in mirror {self.mirror}"
        return sorted(t[0]["partitions"], key=lambda p: p["partition"])

    def caught_up(self, topic, partitions=PARTS, timeout=600):
        return wait_caught_up(self.pb, self.sb, topic, partitions, timeout=timeout, stall=STALL,
                              describe=lambda: self.partitions(topic))


def _mirror_env(kmirrord_bin, kmirror_bin, dest, source, log_dir, name, **options):
    proxy = Proxy(kmirrord_bin, dest, log_dir, name=name, log_level="debug", **options).start()
    wait_until(lambda: proxy.metric("kmirror_upstream_brokers") >= len(dest.broker_ids), 30,
               what="kmirrord to learn the brokers")
    cli = Cli(kmirror_bin, proxy.bootstrap)
    mirror = unique("exact")
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source.bootstrap)
    return MirrorEnv(proxy, cli, mirror, source, dest)


def _teardown(env):
    try:
        if env.proxy.running():
            env.cli.run("stop", "--mirror", env.mirror, "--topics-regex", ".*", expect=None)
    finally:
        env.proxy.stop()
    reports = env.proxy.sanitizer_reports()
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])


@pytest.fixture(scope="module")
def menv(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path_factory):
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster,
                      str(tmp_path_factory.mktemp("exact")), "kmirrord-exact")
    yield env
    _teardown(env)


@pytest.fixture
def mirror_env(menv):
    """The module's mirror; fails the test if kmirrord died during it (and restarts it)."""
    if not menv.proxy.running():
        menv.proxy.start()
    yield menv
    assert menv.proxy.running(), f"kmirrord exited during the test:\n{menv.proxy.daemon.tail()}"


@pytest.fixture(scope="module")
def menv3(kmirrord_bin, kmirror_bin, dest_cluster3, source_cluster, tmp_path_factory):
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster3, source_cluster,
                      str(tmp_path_factory.mktemp("exact3")), "kmirrord-exact3")
    yield env
    _teardown(env)


@pytest.fixture(scope="module")
def source_cluster3():
    """A 3-broker source of its own, started for the source leader change and stopped with the module
    (the suite's 3-broker cluster is a destination: its addresses must never reach a client)."""
    c = KafkaCluster("source3", brokers=3)
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def menv_src3(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster3, tmp_path_factory):
    """A 3-broker source into the 1-broker destination, with a state topic of its own: one kmirrord
    runs a mirror's pipelines."""
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster3,
                      str(tmp_path_factory.mktemp("exact-src3")), "kmirrord-exact-src3",
                      mirror_state_topic="__mirror_state_src3")
    yield env
    _teardown(env)


# ---------------------------------------------------------------------------------------------
# The checker itself (no kmirrord): equal data passes, altered data fails with the counts.

@main_release_only
def test_exactness_checks_fire(source_cluster):
    topic = unique("selfcheck")
    source_cluster.create_topic(topic, partitions=2)
    produce_records(source_cluster.bootstrap, topic, 3000, "lz4", **{"batch.num.messages": 100})
    sb = source_cluster.bootstrap
    total, counts = compare_topic(sb, sb, topic, 2)
    assert total == 3000 and counts == {"lost": 0, "duplicated": 0, "foreign": 0, "reordered": 0,
                                         "moved": 0, "differ": 0}, counts
    lo, hi = watermarks(sb, topic, 2)[0]
    src = read_partition(sb, topic, 0, lo, hi)
    assert len(src) == hi - lo > 100
    # Every field counts.
    for field, val in (("key", b"other"), ("value", b"x"), ("headers", (("a", b"b"),)),
                       ("timestamp", (1, 1)), ("offset", 10 ** 9)):
        alt = list(src)
        alt[5] = alt[5]._replace(**{field: val})
        n, first = diff_records(src, alt)
        assert n == 1 and first.startswith("record #5") and f"{field}: source" in first, first
    # One record lost, one duplicated, two swapped.
    dst = src[:10] + src[11:]
    assert count_anomalies(src, dst)["lost"] == 1
    dst = src[:10] + [src[10]] + src[10:]
    c = count_anomalies(src, dst)
    assert c["duplicated"] == 1 and c["lost"] == 0 and c["reordered"] == 0, c
    dst = src[:10] + [src[11], src[10]] + src[12:]
    c = count_anomalies(src, dst)
    assert c["reordered"] == 1 and c["lost"] == 0 and c["duplicated"] == 0, c
    # A copy one offset on (content right, offsets shifted): every record moved and differs.
    dst = [r._replace(offset=r.offset + 1) for r in src]
    c = count_anomalies(src, dst)
    assert c["moved"] == len(src) and c["lost"] == 0, c
    assert diff_records(src, dst)[0] == len(src)
    assert count_anomalies(src, [Rec(0, b"k", b"v", (), (1, 0))] + src)["foreign"] == 1

    # Segment files: the source against itself is exact; shifted, cut or altered copies are not.
    batches = partition_batches(source_cluster, topic, 0)
    assert len(batches) > 1 and all(b["codec"] == 3 for b in batches)
    assert sum(b["count"] for b in batches) == hi - lo
    assert compare_batches(batches, batches) == []
    assert compare_batches(batches, batches, shift=0) == []
    # A copy stored 7 offsets on is the same with shift -7 (one run), wrong with shift 0.
    moved = shifted_copy(batches, 7)
    assert compare_batches(batches, moved) == []
    probs = compare_batches(batches, moved, shift=0)
    assert probs and "no source batch starts there" in probs[0], probs
    probs = compare_batches(batches, batches[:-1])
    assert probs == [f"1 source batches not in the destination, first at offset "
                     f"{batches[-1]['base']}"], probs
    alt = [dict(b) for b in batches]
    r = bytearray(alt[1]["records"])
    r[len(r) // 2] ^= 1
    alt[1]["records"] = bytes(r)
    alt[2]["max_ts"] += 1
    alt[3]["codec"] = 0
    probs = compare_batches(batches, alt)
    assert len(probs) == 3 and "records bytes differ" in probs[0] and "max_ts" in probs[1] \
        and "codec destination 0 source 3" in probs[2], probs
    # Files of a partition written by another client differ from this one's.
    other = unique("selfcheck-other")
    source_cluster.create_topic(other, partitions=1)
    produce_records(sb, other, 500, "lz4", tag="o")
    assert compare_batches(batches, partition_batches(source_cluster, other, 0))


# ---------------------------------------------------------------------------------------------
# Codecs: all records through confluent-kafka, the segment files, Java and kcat on one partition.

def console_lines(cluster, bootstrap, topic, partition, n):
    out = cluster.run_tool("console-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
                           "--partition", partition, "--offset", "earliest", "--max-messages", n,
                           "--timeout-ms", 60000,
                           "--property", "print.offset=true", "--property", "print.key=true",
                           "--property", "print.headers=true", "--property", "print.timestamp=true",
                           "--property", "print.partition=true", timeout=240).stdout
    return [ln for ln in out.splitlines() if ln.startswith(("CreateTime:", "LogAppendTime:",
                                                            "NO_TIMESTAMP"))]


def kcat_lines(bootstrap, topic, partition):
    r = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", str(partition), "-o",
                        "beginning", "-e", "-q", "-f", "%o\t%k\t%T\t%h\t%S\t%s\n"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=240)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.split(b"\n")[:-1]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i}: source {x[:120]!r} proxy {y[:120]!r}"
    return f"source {len(a)} lines, proxy {len(b)}"


def check_timestamps(env, topic, partitions, probes=8):
    """ListOffsets by timestamp gives the same answers on both sides (earliest and latest are the
    watermarks, compared elsewhere): some records' own timestamps, 0 and an hour ahead."""
    lo, hi = watermarks(env.sb, topic, 1)[0]
    src = read_partition(env.sb, topic, 0, lo, min(hi, lo + 20000))
    rnd = random.Random(topic)
    stamps = [r.timestamp[1] for r in rnd.sample(src, min(probes, len(src)))] if src else []
    stamps += [0, int(time.time() * 1000) + 3_600_000]
    a = offsets_for_times(env.sb, topic, partitions, stamps)
    b = offsets_for_times(env.pb, topic, partitions, stamps)
    assert a == b, f"{topic} ListOffsets by timestamp: source {a}, proxy {b}"
    assert any(o >= 0 for offs in a.values() for o in offs)


@pytest.mark.parametrize("codec", [pytest.param(c, marks=[] if c == "lz4" else [main_release_only])
                                   for c in ("none", "gzip", "snappy", "lz4", "zstd")])
def test_mirror_codecs(mirror_env, codec):
    env = mirror_env
    topic = unique(f"codec-{codec}")
    env.source_topic(topic)
    t0 = time.monotonic()
    half = N // 2
    produce_records(env.sb, topic, half, codec)
    env.start(topic)
    produce_records(env.sb, topic, N - half, codec, start=half)
    progress(f"{topic}: {N} records produced in {time.monotonic() - t0:.1f}s")
    marks = env.caught_up(topic)
    assert sum(hi - lo for lo, hi in marks) == N
    t1 = time.monotonic()
    total, counts = compare_topic(env.pb, env.sb, topic, PARTS, marks)
    progress(f"{topic}: {total} records equal through the proxy ({counts}) in "
             f"{time.monotonic() - t1:.1f}s")
    assert total == N
    # The proxy's watermarks are the source's.
    assert watermarks(env.pb, topic, PARTS) == marks
    assert_segments_exact(env.source, env.dest, topic, PARTS)
    check_timestamps(env, topic, PARTS)
    # Other client families on one partition, for one codec (a JVM start costs seconds).
    if codec == "zstd":
        n0 = marks[0][1] - marks[0][0]
        src = console_lines(env.source, env.sb, topic, 0, n0)
        dst = console_lines(env.source, env.pb, topic, 0, n0)
        assert len(src) == n0 and src == dst, "Java console consumer: " + first_diff(src, dst)
        progress(f"{topic}-0: {n0} records the same through the Java console consumer")
        if shutil.which("kcat"):
            src, dst = kcat_lines(env.sb, topic, 0), kcat_lines(env.pb, topic, 0)
            assert len(src) == n0 and src == dst, "kcat: " + first_diff(src, dst)
            progress(f"{topic}-0: {n0} records the same through kcat")
    if codec == "gzip":
        # kafka-python: a third family, with its own protocol code (not librdkafka, not the JVM);
        # gzip is the codec it decodes without extra modules.
        src, dst = kafka_python_records(env.sb, topic, 1, marks[1]), kafka_python_records(env.pb, topic, 1, marks[1])
        assert len(src) == marks[1][1] - marks[1][0] and src == dst, "kafka-python: " + first_diff(src, dst)
        progress(f"{topic}-1: {len(src)} records the same through kafka-python")


def kafka_python_records(bootstrap, topic, partition, mark):
    """(offset, key, value, headers, timestamp, timestamp type) of [lo, hi) read with kafka-python."""
    import kafka  # kafka-python: scripts/install-deps.sh installs it
    lo, hi = mark
    c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                            consumer_timeout_ms=20000)
    tp = kafka.TopicPartition(topic, partition)
    c.assign([tp])
    c.seek(tp, lo)
    out = []
    try:
        for m in c:
            if m.offset >= hi:
                break
            out.append((m.offset, m.key, m.value, list(m.headers or []), m.timestamp, m.timestamp_type))
            if m.offset == hi - 1:
                break
    finally:
        c.close()
    return out


# ---------------------------------------------------------------------------------------------
# Group offsets

def group_rows(cluster, bootstrap, group, topic):
    """{partition: (current, log-end, lag)} from kafka-consumer-groups --describe."""
    out = cluster.run_tool("consumer-groups", "--bootstrap-server", bootstrap, "--describe",
                           "--group", group, timeout=120).stdout
    rows = {}
    for ln in out.splitlines():
        f = ln.split()
        if len(f) >= 6 and f[1] == topic:
            rows[int(f[2])] = (f[3], f[4], f[5])
    return rows


def test_mirror_group_offset(mirror_env):
    env = mirror_env
    topic = unique("group")
    env.source_topic(topic, partitions=3)
    produce_records(env.sb, topic, 3000, "lz4", partitions=3)
    env.start(topic)
    marks = env.caught_up(topic, 3)
    group = unique("g")
    commit = [TopicPartition(topic, p, lo + (hi - lo) // 3 + p) for p, (lo, hi) in enumerate(marks)]
    for b in (env.pb, env.sb):  # the same group name on each cluster
        c = Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=commit, asynchronous=False)
        c.close()
    firsts = {}
    for b in (env.pb, env.sb):
        c = Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False,
                      "auto.offset.reset": "latest"})
        c.assign([TopicPartition(topic, p) for p in range(3)])  # from the committed offsets
        got = {}
        deadline = time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            for m in c.consume(100, timeout=1):
                if not m.error():
                    got.setdefault(m.partition(), (m.offset(), m.key(), m.value(), m.headers()))
        c.close()
        firsts[b] = got
    for tp in commit:
        s, d = firsts[env.sb].get(tp.partition), firsts[env.pb].get(tp.partition)
        assert s is not None and s[0] == tp.offset, s
        assert d == s, f"{topic}-{tp.partition} from committed {tp.offset}: proxy {d}, source {s}"
    src = group_rows(env.source, env.sb, group, topic)
    dst = group_rows(env.source, env.pb, group, topic)
    assert len(src) == 3 and dst == src, f"consumer-groups --describe: proxy {dst}, source {src}"
    for p, (lo, hi) in enumerate(marks):
        assert src[p] == (str(commit[p].offset), str(hi), str(hi - commit[p].offset))


# ---------------------------------------------------------------------------------------------
# Read-only, then writable after a stop, continuing the source's offsets

@pytest.fixture(scope="module")
def ro_producer_cp(dest_cluster, tmp_path_factory):
    javac = os.path.join(os.path.dirname(os.path.realpath(java_bin())), "javac")
    javac = javac if os.access(javac, os.X_OK) else shutil.which("javac")
    assert javac, "javac not found"
    out = str(tmp_path_factory.mktemp("exact-java"))
    subprocess.run([javac, "-d", out, "-cp", os.path.join(dest_cluster.libs, "*"),
                    os.path.join(JAVA_DIR, "ReadOnlyProducer.java")], check=True, timeout=120)
    return out


def java_produce(env, cp, topic, other):
    r = env.dest.run_tool("ReadOnlyProducer", env.pb, "plain", topic, other, classpath=[cp],
                          check=False, timeout=180)
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert "MIRROR" in lines, r.stdout + r.stderr[-3000:]
    return lines


def produce_one(bootstrap, topic, value):
    got = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 30000,
                  "retries": 0})
    p.produce(topic, value=value, key=b"after-stop", partition=0,
              on_delivery=lambda e, m: got.append((e, m.offset())))
    p.flush(60)
    assert got, "no delivery report"
    return got[0]


def test_mirror_readonly_then_stop(mirror_env, ro_producer_cp):
    env = mirror_env
    topic, other = unique("ro"), unique("ro-other")
    env.source_topic(topic, partitions=2)
    env.dest.create_topic(other, partitions=1)
    produce_records(env.sb, topic, 1000, "snappy", partitions=2)
    env.start(topic)
    marks = env.caught_up(topic, 2)
    err, _ = produce_one(env.pb, topic, b"refused")
    assert err is not None and err.code() == READ_ONLY_TOPIC, err
    lines = java_produce(env, ro_producer_cp, topic, other)
    assert lines["MIRROR"].startswith("ERROR ") and "read-only" in lines["MIRROR"], lines
    assert lines["OTHER"].startswith("OK "), lines
    assert watermarks(env.pb, topic, 2) == marks  # nothing landed

    env.cli.run("stop", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "STOPPED"}, timeout=60)
    end = watermarks(env.sb, topic, 2)[0][1]
    err, off = produce_one(env.pb, topic, b"after-stop-librdkafka")
    assert err is None, err
    assert off == end, f"first record after the stop at {off}; the source's next offset is {end}"
    lines = java_produce(env, ro_producer_cp, topic, other)
    assert lines["MIRROR"] == f"OK partition=0 offset={end + 1}", lines
    recs = read_partition(env.pb, topic, 0, end, end + 2)
    assert [(r.offset, r.value) for r in recs] == [(end, b"after-stop-librdkafka"),
                                                  (end + 1, b"to-mirror")], recs
    # The mirrored part reads as it did.
    total, _ = compare_topic(env.pb, env.sb, topic, 2, marks)
    assert total == 1000
    assert watermarks(env.pb, topic, 2)[0] == (marks[0][0], end + 2)


# ---------------------------------------------------------------------------------------------
# Pause and resume

@main_release_only
def test_mirror_live_tail_java_consumer(mirror_env):
    """A Java consumer tailing a mirror topic through the proxy while the mirror writes it gets every
    record once: a batch the pipeline has written but not yet mapped (hidden, at the tail of a Fetch
    answer) must not send the consumer's position back (it takes the last batch's end as its
    position), which made it read the answer again (duplicates, scripts/benchlib/latency.py)."""
    env = mirror_env
    topic = unique("tail")
    parts, n = 4, 4000
    env.source_topic(topic, partitions=parts)
    env.start(topic)
    out = {}

    def consume(group):
        out["r"] = env.dest.run_tool(
            "console-consumer", "--bootstrap-server", env.pb, "--topic", topic, "--from-beginning",
            "--max-messages", n, "--timeout-ms", 60000, "--group", group,
            "--property", "print.partition=true", "--property", "print.offset=true",
            timeout=240, check=False)
    group = unique("tail")
    t = threading.Thread(target=consume, args=(group,))
    t.start()
    # The consumer up and tailing (its group stable, every partition assigned) before the records come.
    admin = AdminClient({"bootstrap.servers": env.pb})

    def tailing():
        d = admin.describe_consumer_groups([group])[group].result(timeout=10)
        return sum(len(m.assignment.topic_partitions) for m in d.members) == parts
    wait_until(lambda: not t.is_alive() or tailing(), 60, 0.2, "the Java consumer to join")
    p = Producer({"bootstrap.servers": env.sb, "linger.ms": 5, "acks": "all"})
    for i in range(n):  # about 500 records a second, so the consumer is at the tail throughout
        p.produce(topic, f"tail-{i}".encode(), partition=i % parts)
        if i % 10 == 9:
            p.poll(0)
            time.sleep(0.02)
    assert p.flush(60) == 0
    t.join(300)
    r = out["r"]
    got = [ln.split("\t") for ln in r.stdout.splitlines() if ln.startswith("Partition:")]
    where = [(a, b) for a, b, _ in got]
    values = [v for _, _, v in got]
    dup = len(where) - len(set(where))
    assert dup == 0, f"{dup} records read twice through the proxy, e.g. " + str(
        [w for w in where if where.count(w) > 1][:6])
    assert sorted(values) == sorted(f"tail-{i}" for i in range(n)), r.stderr[-2000:]


def test_mirror_pause_resume(mirror_env):
    env = mirror_env
    topic = unique("pause")
    parts = 4
    env.source_topic(topic, partitions=parts)
    produce_records(env.sb, topic, 4000, "gzip", partitions=parts)
    env.start(topic)
    marks = env.caught_up(topic, parts)
    env.cli.run("pause", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "PAUSED"}, timeout=60)
    paused = watermarks(env.pb, topic, parts)
    assert paused == marks
    more = 2000
    produce_records(env.sb, topic, more, "gzip", start=4000, partitions=parts)
    src = watermarks(env.sb, topic, parts)
    assert sum(h for _, h in src) - sum(h for _, h in marks) == more
    problems = []  # checked to the end, so one run shows every difference

    def describe_paused():
        return [{k: d[k] for k in ("partition", "state", "source_log_end_offset",
                                   "mirrored_offset", "lag")} for d in env.partitions(topic)]
    want = [{"partition": p, "state": "PAUSED", "source_log_end_offset": src[p][1],
             "mirrored_offset": marks[p][1], "lag": src[p][1] - marks[p][1]} for p in range(parts)]
    try:
        wait_until(lambda: describe_paused() == want, 30, 0.5, "describe's lag while paused")
    except AssertionError:
        problems.append(f"describe while paused:\n got  {describe_paused()}\n want {want}")
    time.sleep(2)
    got = watermarks(env.pb, topic, parts)
    if got != paused:
        problems.append(f"the proxy's high watermarks moved while paused: {paused} -> {got}")
    env.cli.run("resume", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    marks = env.caught_up(topic, parts)
    total, counts = compare_topic(env.pb, env.sb, topic, parts, marks)
    assert total == 4000 + more, counts
    try:
        wait_until(lambda: sum(p["lag"] for p in env.partitions(topic)) == 0, 30, 0.5,
                   "describe's lag back to 0")
    except AssertionError:
        problems.append(f"describe after resume: {describe_paused()}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# Compacted source, moved log start, LogAppendTime

def compact_key(i):
    """Every third record has a key of its own (kept by the cleaner wherever it is: gaps inside
    batches), except in the second round, whose records all share 200 keys written again in the
    third (its batches go whole: gaps between batches)."""
    return f"u-{i}".encode() if i % 3 == 0 and not 3000 <= i < 6000 else \
        f"ck-{(i * 7) % 200}".encode()


def wait_compacted(cluster, topic, want, timeout=150):
    """Waits until the cleaner is done: every partition holds want[p] records (one per key), so
    the source no longer changes under the comparison; returns the batches per partition."""
    def done():
        bs = [partition_batches(cluster, topic, p) for p in range(len(want))]
        return [sum(b["count"] for b in x) for x in bs] == want and bs
    try:
        return wait_until(done, timeout, 1.0, f"the cleaner to compact {topic}")
    except AssertionError as e:
        counts = [sum(b["count"] for b in partition_batches(cluster, topic, p))
                  for p in range(len(want))]
        raise AssertionError(f"{e}: records {counts}, wanted {want}") from None


@main_release_only
def test_mirror_compacted(mirror_env):
    env = mirror_env
    topic = unique("compact")
    parts, rounds, per = 2, 3, 3000
    env.source_topic(topic, partitions=parts, config={
        "cleanup.policy": "compact", "segment.ms": 2000, "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": 0, "delete.retention.ms": 0})
    p = Producer({"bootstrap.servers": env.sb, "linger.ms": 5, "compression.type": "lz4",
                  "batch.num.messages": 200})
    keys = [set() for _ in range(parts)]
    for rnd in range(rounds):
        for i in range(rnd * per, (rnd + 1) * per):
            _, value, headers, _ = record(i, "c")
            p.produce(topic, key=compact_key(i), value=value, headers=headers, partition=i % parts)
            keys[i % parts].add(compact_key(i))
        p.flush(60)
        time.sleep(2.5)  # past segment.ms: the next write rolls the segment
    for q in range(parts):
        p.produce(topic, key=b"roll", value=b"roll", partition=q)
    p.flush(60)
    batches = wait_compacted(env.source, topic, [len(k) + 1 for k in keys])
    for q, bs in enumerate(batches):
        inside = sum(1 for b in bs if b["count"] != b["lod"] + 1)
        between = sum(1 for a, b in zip(bs, bs[1:]) if b["base"] != a["base"] + a["lod"] + 1)
        assert inside and between, f"partition {q}: {inside} gaps inside, {between} between"
    env.start(topic)
    marks = env.caught_up(topic, parts)
    total, counts = compare_topic(env.pb, env.sb, topic, parts, marks)
    progress(f"{topic}: {total} records left by the cleaner equal through the proxy ({counts})")
    assert total == sum(len(k) + 1 for k in keys)
    check_timestamps(env, topic, parts)
    pm = watermarks(env.pb, topic, parts)
    assert pm == marks, f"watermarks: proxy {pm}, source {marks}"


def delete_records(bootstrap, topic, partition, offset):
    a = AdminClient({"bootstrap.servers": bootstrap})
    fs = a.delete_records([TopicPartition(topic, partition, offset)], operation_timeout=30)
    for f in fs.values():
        f.result(timeout=60)


@main_release_only
@pytest.mark.parametrize("when", ["before", "during"])
def test_mirror_log_start_moved(mirror_env, when):
    env = mirror_env
    topic = unique(f"logstart-{when}")
    parts = 2
    env.source_topic(topic, partitions=parts)
    produce_records(env.sb, topic, 4000, "none", partitions=parts, **{"linger.ms": 1,
                                                                      "batch.num.messages": 50})
    if when == "before":
        # Mid-batch on partition 0 (batches of up to 50), a batch boundary on neither.
        delete_records(env.sb, topic, 0, 333)
        delete_records(env.sb, topic, 1, 1017)
        env.start(topic)
    else:
        env.start(topic)
        env.caught_up(topic, parts)
        env.cli.run("pause", "--mirror", env.mirror, "--topics", topic)
        wait_states(env.cli, env.mirror, {topic: "PAUSED"}, timeout=60)
        produce_records(env.sb, topic, 4000, "none", start=4000, partitions=parts,
                        **{"linger.ms": 1, "batch.num.messages": 50})
        # Retention (here DeleteRecords) overtakes the paused mirror on partition 0: a hole of
        # the records it had not mirrored yet; on partition 1 only mirrored records go.
        delete_records(env.sb, topic, 0, 3111)
        delete_records(env.sb, topic, 1, 1017)
        env.cli.run("resume", "--mirror", env.mirror, "--topics", topic)
    marks = env.caught_up(topic, parts)
    # The destination's log start follows the source's right after the batches holding it are
    # in (asynchronous, like the source's own retention): give it a moment, then compare all.
    deadline = time.time() + 15
    while time.time() < deadline and [lo for lo, _ in watermarks(env.pb, topic, parts)] != [lo for lo, _ in marks]:
        time.sleep(0.2)
    # From the source's log start on, the same records.
    total, counts = compare_topic(env.pb, env.sb, topic, parts, marks)
    assert total == sum(hi - lo for lo, hi in marks)
    problems = []  # checked to the end, so one run shows every difference
    try:
        check_timestamps(env, topic, parts)
    except AssertionError as e:
        problems.append(str(e).splitlines()[0])
    if when == "during":
        skipped = {k: v for k, v in env.proxy.metrics().items()
                   if k.startswith("kmirror_mirror_skipped_records_total") and topic in k}
        if sum(skipped.values()) != 3111 - 2000:
            problems.append(f"skipped records metric {skipped}, wanted {3111 - 2000} in all")
        doc, _ = env.cli.json("describe", "--mirror", env.mirror, "--topics", topic)
        holes = [p["skipped_records"] for t in doc["mirrors"][0]["topics"] for p in t["partitions"]]
        if sum(holes) != 3111 - 2000:
            problems.append(f"describe's skipped records {holes}, wanted {3111 - 2000} in all")
    pm = watermarks(env.pb, topic, parts)
    if [lo for lo, _ in pm] != [lo for lo, _ in marks]:
        problems.append(f"earliest offsets: proxy {pm}, source {marks}")
    assert not problems, "\n".join(problems)


@main_release_only
def test_mirror_log_append_time(mirror_env):
    env = mirror_env
    topic = unique("lat")
    parts = 2
    env.source_topic(topic, partitions=parts, config={"message.timestamp.type": "LogAppendTime"})
    produce_records(env.sb, topic, 3000, "lz4", partitions=parts)
    env.start(topic)
    produce_records(env.sb, topic, 1000, "lz4", start=3000, partitions=parts)
    marks = env.caught_up(topic, parts)
    src = read_partition(env.sb, topic, 0, *marks[0])
    assert src and all(r.timestamp[0] == 2 for r in src)  # TIMESTAMP_LOG_APPEND_TIME
    total, counts = compare_topic(env.pb, env.sb, topic, parts, marks)
    assert total == 4000
    check_timestamps(env, topic, parts)
    # On disk the payload is the source's and MaxTimestamp its append time; the destination (a
    # CreateTime topic) holds CreateTime batches whose baseTimestamp puts the largest record at the
    # append time (docs/mirror.md, "LogAppendTime sources"): the proxy sets the bit back.
    assert all(b["log_append"] for b in partition_batches(env.source, topic, 0))
    assert not any(b["log_append"] for b in partition_batches(env.dest, topic, 0))
    assert_segments_exact(env.source, env.dest, topic, parts,
                          fields=("count", "lod", "codec", "max_ts"))


# ---------------------------------------------------------------------------------------------
# Fetch sessions (KIP-227)

def fetch_requests(env, mirror=None):
    """{kind: Fetch requests the mirror (the module's by default) sent} from /metrics."""
    out = {"full": 0.0, "incremental": 0.0, "side": 0.0}
    for k, v in env.proxy.metrics().items():
        if k.startswith("kmirror_mirror_fetch_requests_total") and f'mirror="{mirror or env.mirror}"' in k:
            out[k.split('kind="')[1].split('"')[0]] += v
    return out


@main_release_only
def test_mirror_fetch_sessions(mirror_env):
    """The mirror fetches in sessions: after the first full Fetch every one is incremental, while
    partitions come and go (a pause of some, a resume) and every record still arrives exactly; with
    mirror.fetch.sessions=false every Fetch is full again."""
    env = mirror_env
    topic = unique("sess")
    parts = 6
    env.source_topic(topic, partitions=parts)
    produce_records(env.sb, topic, 3000, "lz4", partitions=parts)
    before = fetch_requests(env)
    env.start(topic)
    produce_records(env.sb, topic, 3000, "lz4", start=3000, partitions=parts)
    env.caught_up(topic, parts)
    # Partitions leave the session (paused) and come back (resumed) while data flows.
    env.cli.run("pause", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "PAUSED"}, timeout=60)
    produce_records(env.sb, topic, 2000, "lz4", start=6000, partitions=parts)
    env.cli.run("resume", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    marks = env.caught_up(topic, parts)
    mid = fetch_requests(env)
    full, incr = mid["full"] - before["full"], mid["incremental"] - before["incremental"]
    side = mid["side"] - before["side"]
    progress(f"{topic}: {full:.0f} full, {incr:.0f} incremental and {side:.0f} side Fetch requests")
    # Side Fetches (no session) take the partitions that become ready while the session's Fetch waits.
    assert incr >= 3 and incr + side >= 10 and incr > 5 * full, (before, mid)
    total, _ = compare_topic(env.pb, env.sb, topic, parts, marks)
    assert total == 8000
    altered = fetch_requests(env)
    env.cli.run("alter", "--mirror", env.mirror, "--config", "mirror.fetch.sessions=false")
    try:
        # The pipeline reads its options every second: once it has, every Fetch is a full one.
        wait_until(lambda: fetch_requests(env)["full"] >= altered["full"] + 2, 30, 0.2,
                   "the pipeline to fetch without sessions")
        start = fetch_requests(env)
        produce_records(env.sb, topic, 2000, "lz4", start=8000, partitions=parts)
        marks = env.caught_up(topic, parts)
        end = fetch_requests(env)
        assert end["incremental"] == start["incremental"], (start, end)
        assert end["full"] > start["full"], (start, end)
    finally:
        env.cli.run("alter", "--mirror", env.mirror, "--config", "mirror.fetch.sessions=true")
    total, _ = compare_topic(env.pb, env.sb, topic, parts, marks)
    assert total == 10000
    assert_segments_exact(env.source, env.dest, topic, parts)


@main_release_only
def test_mirror_fetch_groups(kmirrord_bin, kmirror_bin, tmp_path):
    """A source broker that leads more than 1,000 of a pipeline's partitions is fetched in groups of
    at most 1,000, each in a session of its own on a connection of its own (docs/mirror.md, "Fetch
    groups"): 1,100 partitions on the one source broker make two sessions, on lanes 1 and 2, the
    Fetches are incremental after the first ones, and the mirror is exact through a catch-up and a
    live load. (Before groups such a broker was fetched without a session: no incremental Fetch.)
    Clusters of its own: 2,200 partitions on the suite's brokers would weigh on every test after it."""
    tag = uuid.uuid4().hex[:6]
    src, dst = KafkaCluster(f"groups-src-{tag}", brokers=1), KafkaCluster(f"groups-dst-{tag}", brokers=1)
    env = None
    try:
        src.start()
        dst.start()
        env = _mirror_env(kmirrord_bin, kmirror_bin, dst, src, str(tmp_path), "kmirrord-groups")
        _fetch_groups(env)
    finally:
        if env is not None:
            _teardown(env)
        dst.stop()
        src.stop()


def _fetch_groups(env):
    topic, parts, mirror = unique("groups"), 1100, env.mirror
    env.source_topic(topic, partitions=parts)
    produce_records(env.sb, topic, 2 * parts, "lz4", partitions=parts)
    create_dest_topic(env.dest, env.sb, topic)
    # A loaded destination may elect 1,100 leaders after start's 15 s bound: start again, as an
    # operator would, on that refusal only.
    for _ in range(6):
        r = env.cli.run("start", "--mirror", mirror, "--topics", topic, expect=None)
        if r.returncode == 0 or "REQUEST_TIMED_OUT" not in r.stdout:
            break
        progress(f"start of {topic} refused REQUEST_TIMED_OUT, again")
    assert r.returncode == 0, r.stdout + r.stderr
    wait_states(env.cli, mirror, {topic: "MIRRORING"}, timeout=180)
    env.caught_up(topic, parts)
    before = fetch_requests(env, mirror)
    bg = BackgroundProducer(env.sb, topic, rate=2000).start()
    time.sleep(5)
    bg.stop()
    assert not bg.errors, bg.errors[:5]
    marks = env.caught_up(topic, parts)
    after = fetch_requests(env, mirror)
    lanes = set(re.findall(r"fetch session \d+ with source broker \d+ \(lane (\d+)\)", env.proxy.output()))
    incr = after["incremental"] - before["incremental"]
    progress(f"{topic}: {2 * parts + bg.acked} records, sessions on lanes {sorted(lanes)}, {incr:.0f} "
             f"incremental, {after['full'] - before['full']:.0f} full and "
             f"{after['side'] - before['side']:.0f} side Fetches under the load")
    assert lanes == {"1", "2"}, lanes  # lane 0 stays the pipeline's Metadata and ListOffsets
    assert incr >= 10 and incr > after["full"] - before["full"], (before, after)
    # Exact: the segments batch for batch, and whole partitions read both ways.
    assert_segments_exact(env.source, env.dest, topic, parts)
    for part in (0, 555, parts - 1):
        n, _ = compare_partition(env.pb, env.sb, topic, part, 0, marks[part][1])
        assert n == marks[part][1] - marks[part][0]


@main_release_only
def test_mirror_side_fetches(mirror_env):
    """Partitions that become ready while the pipeline's main Fetch to their broker long-polls go
    at once in a side Fetch on a second connection (docs/mirror.md, "Side Fetches"): under a live
    load of 8 partitions there are such Fetches, and the mirror is exact."""
    env = mirror_env
    topic = unique("side")
    env.source_topic(topic)
    env.start(topic)
    before = fetch_requests(env)
    bg = BackgroundProducer(env.sb, topic, rate=1000).start()
    time.sleep(8)
    bg.stop()
    assert not bg.errors, bg.errors[:5]
    marks = env.caught_up(topic)
    after = fetch_requests(env)
    side = after["side"] - before["side"]
    progress(f"{topic}: {bg.acked} records, {side:.0f} side Fetches, "
             f"{after['incremental'] - before['incremental']:.0f} incremental")
    assert side > 0, (before, after)
    total, _ = compare_topic(env.pb, env.sb, topic, PARTS, marks)
    assert total == bg.acked
    assert_segments_exact(env.source, env.dest, topic, PARTS)


def fetches_ahead(env):
    """Partitions the mirror fetched while their last batches were still written, from /metrics."""
    return sum(v for k, v in env.proxy.metrics().items()
               if k.startswith("kmirror_mirror_fetches_ahead_total") and f'mirror="{env.mirror}"' in k)


@main_release_only
def test_mirror_fetch_ahead(mirror_env):
    """A partition whose fetched batches are all sent is fetched again while they are written
    (docs/mirror.md, "Fetching ahead"): through a catch-up and then a live load of 8 partitions
    such Fetches happen, and the mirror is exact through the proxy and on the segments."""
    env = mirror_env
    topic = unique("ahead")
    env.source_topic(topic)
    produce_records(env.sb, topic, 20000, "lz4")
    before = fetches_ahead(env)
    env.start(topic)
    bg = BackgroundProducer(env.sb, topic, rate=1000).start()
    time.sleep(6)
    bg.stop()
    assert not bg.errors, bg.errors[:5]
    marks = env.caught_up(topic)
    ahead = fetches_ahead(env) - before
    progress(f"{topic}: {20000 + bg.acked} records, {ahead:.0f} partitions fetched ahead")
    assert ahead > 0
    total, _ = compare_topic(env.pb, env.sb, topic, PARTS, marks)
    assert total == 20000 + bg.acked
    assert_segments_exact(env.source, env.dest, topic, PARTS)


def produce_requests(env):
    """{lane: Produce requests the mirror sent on it} from /metrics."""
    out = {}
    for k, v in env.proxy.metrics().items():
        if k.startswith("kmirror_mirror_produce_requests_total") and f'mirror="{env.mirror}"' in k:
            lane = k.split('lane="')[1].split('"')[0]
            out[lane] = out.get(lane, 0.0) + v
    return out


@main_release_only
def test_mirror_write_lanes(mirror_env):
    """A topic's partitions are written on several connections to the destination broker (lanes,
    docs/mirror.md): with 8 partitions on one broker every one of the 4 lanes carries Produce
    requests, and the mirror stays exact."""
    env = mirror_env
    topic = unique("lanes")
    before = produce_requests(env)
    env.source_topic(topic)
    produce_records(env.sb, topic, 4000, "lz4")
    env.start(topic)
    produce_records(env.sb, topic, 4000, "lz4", start=4000)
    marks = env.caught_up(topic)
    after = produce_requests(env)
    used = {lane: after[lane] - before.get(lane, 0.0) for lane in after}
    progress(f"{topic}: Produce requests per lane {used}")
    assert len(used) == 4 and all(n > 0 for n in used.values()), (before, after)
    total, _ = compare_topic(env.pb, env.sb, topic, PARTS, marks)
    assert total == 8000
    assert_segments_exact(env.source, env.dest, topic, PARTS)


# ---------------------------------------------------------------------------------------------
# kill -9 during mirroring under load

def test_mirror_kill9(mirror_env):
    env = mirror_env
    topic = unique("kill9")
    env.source_topic(topic)
    rnd = random.Random()
    pre = N // 2
    produce_records(env.sb, topic, pre, "lz4", **{"enable.idempotence": True})
    env.start(topic)
    bg = BackgroundProducer(env.sb, topic, "lz4", tag="bg", rate=max(2000, N // 40)).start()
    t0 = time.monotonic()
    try:
        for k in range(KILLS):
            time.sleep(rnd.uniform(0.5, 4.0))
            before = sum(h for _, h in watermarks(env.pb, topic, PARTS))
            env.proxy.signal(signal.SIGKILL)
            env.proxy.daemon.proc.wait(timeout=30)
            time.sleep(rnd.uniform(0.0, 1.0))
            env.proxy.start()
            progress(f"{topic}: kill {k + 1}/{KILLS} at {before} mirrored records "
                     f"({time.monotonic() - t0:.1f}s, source producer at {bg.next})")
        time.sleep(1.0)
    finally:
        produced = bg.stop()
    progress(f"{topic}: {pre + produced} records produced, kills done")
    marks = env.caught_up(topic, PARTS)
    assert sum(hi - lo for lo, hi in marks) == pre + produced
    total, counts = compare_topic(env.pb, env.sb, topic, PARTS, marks, check=False)
    progress(f"{topic}: after {KILLS} kills: {total} records, lost {counts['lost']}, duplicated "
             f"{counts['duplicated']}, reordered {counts['reordered']}, foreign {counts['foreign']}"
             f", at another offset {counts['moved']}, differing {counts['differ']}")
    assert (counts["lost"], counts["duplicated"], counts["reordered"], counts["foreign"]) == \
        (0, 0, 0, 0), counts
    assert counts["differ"] == 0, counts
    assert_segments_exact(env.source, env.dest, topic, PARTS)


# ---------------------------------------------------------------------------------------------
# A destination leader change (3 brokers) during mirroring

def mirrored(env, topic, parts):
    """Records readable through the proxy (the sum of its high watermarks)."""
    return sum(hi for _, hi in watermarks(env.pb, topic, parts))


def mirrored_more(env, topic, parts, past, what):
    """Waits until more than past records are readable through the proxy: the mirror goes on."""
    wait_until(lambda: mirrored(env, topic, parts) > past, 60, 0.2, f"the mirror to go on ({what})")


@main_release_only
def test_mirror_dest_leader_change(menv3):
    env = menv3
    topic = unique("leader")
    parts = 3
    env.source_topic(topic, partitions=parts)
    pre = N // 10
    produce_records(env.sb, topic, pre, "zstd", partitions=parts)
    env.start(topic)
    bg = BackgroundProducer(env.sb, topic, "zstd", tag="lc", rate=2000).start()
    leader = None
    try:
        mirrored_more(env, topic, parts, pre, "the live records")
        md = AdminClient({"bootstrap.servers": env.dest.bootstrap}).list_topics(topic, timeout=15)
        leader = md.topics[topic].partitions[0].leader
        env.dest.stop_broker(leader)  # SIGTERM: leadership moves to another broker
        mirrored_more(env, topic, parts, mirrored(env, topic, parts) + 2000, "broker stopped")
        env.dest.start_broker(leader)
        mirrored_more(env, topic, parts, mirrored(env, topic, parts) + 1000, "broker back")
    finally:
        produced = bg.stop()
    marks = env.caught_up(topic, parts)
    assert sum(hi - lo for lo, hi in marks) == pre + produced
    total, counts = compare_topic(env.pb, env.sb, topic, parts, marks, check=False)
    progress(f"{topic}: leader {leader} stopped and started: {counts}")
    assert counts == {"lost": 0, "duplicated": 0, "foreign": 0, "reordered": 0, "moved": 0,
                      "differ": 0}, counts


# ---------------------------------------------------------------------------------------------
# A source leader change (3 brokers) during mirroring

@main_release_only
def test_mirror_source_leader_change(menv_src3):
    env = menv_src3
    topic = unique("srcleader")
    parts = 3
    env.source.create_topic(topic, partitions=parts, replication_factor=3)
    pre = N // 10
    produce_records(env.sb, topic, pre, "lz4", partitions=parts)
    env.start(topic)
    bg = BackgroundProducer(env.sb, topic, "lz4", tag="slc", rate=2000).start()
    leader = None
    try:
        mirrored_more(env, topic, parts, pre, "the live records")
        md = AdminClient({"bootstrap.servers": env.sb}).list_topics(topic, timeout=15)
        leader = md.topics[topic].partitions[0].leader
        env.source.stop_broker(leader)  # SIGTERM: the source's leadership moves, the mirror follows
        mirrored_more(env, topic, parts, mirrored(env, topic, parts) + 3000, "source broker stopped")
        env.source.start_broker(leader)
        mirrored_more(env, topic, parts, mirrored(env, topic, parts) + 1000, "source broker back")
    finally:
        produced = bg.stop()
    marks = env.caught_up(topic, parts)
    assert sum(hi - lo for lo, hi in marks) == pre + produced
    total, counts = compare_topic(env.pb, env.sb, topic, parts, marks, check=False)
    progress(f"{topic}: source leader {leader} stopped and started: {counts}")
    assert counts == {"lost": 0, "duplicated": 0, "foreign": 0, "reordered": 0, "moved": 0,
                      "differ": 0}, counts
