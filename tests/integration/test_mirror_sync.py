"""The metadata sync (docs/mirror.md, "Metadata sync") between real clusters, authorizer on both:
topic configs follow the source (a local change on the destination is reverted, never-copied keys
are left alone, compression.type stays producer); partitions added at the source are mirrored at the
source's offsets; a Java consumer group's committed offsets reach the destination, and after a stop
the same group through the proxy resumes exactly at the next record (classic and consumer
protocols); mirror.groups.include / mirror.groups.exclude choose the groups; a group with members on
the destination is skipped and counted, not overwritten, not logged every cycle; ACL bindings inside
mirror.acl.include follow the source and nothing outside it is touched (on a pair of clusters of
their own: the suite's clusters hold other tests' ACLs); describe's metadata_sync and the
kmirror_mirror_sync_* metrics report each step.

Every mirror on the suite's shared clusters is created with an ACL scope that matches no binding
(NO_ACLS): the default `*` would make the destination's ACLs the source's."""

import random
import re
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                   AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions, ResourcePatternType, ResourceType)

from harness import KafkaCluster
from mirror_cli import Cli, described, kmirror_bin, topic_states, wait_states  # noqa: F401
from mirror_data import (compare_topic, main_release_only, produce_records, progress, wait_caught_up,
                         watermarks)
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, wait_until

pytestmark = pytest.mark.proxy

INTERVAL_MS = 2000           # mirror.metadata.refresh.interval.ms of the shared clusters' mirrors
ACL_INTERVAL_MS = 1000       # the ACL tests' mirror: the minimum, to keep six scopes short
KINDS = ("configs", "partitions", "groups", "acls")  # and "topics", off unless mirror.topics.include is set
DYNAMIC_TOPIC_CONFIG = 1


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def cycles(n, interval_ms=INTERVAL_MS):
    """Seconds that cover n whole sync cycles whatever the phase (plus a cycle's own run time)."""
    return n * interval_ms / 1000.0 + 1.5


# ---------------------------------------------------------------------------------------------
# One kmirrord in front of the shared destination for the module (a sync is owned by one kmirrord:
# a second one in front of the same destination could own a test's mirror); each test has mirrors
# and topics of its own.

class SyncEnv:
    def __init__(self, proxy, cli, source, dest):
        self.proxy, self.cli, self.source, self.dest = proxy, cli, source, dest
        self.mirrors = []

    @property
    def pb(self):
        return self.proxy.bootstrap

    @property
    def sb(self):
        return self.source.bootstrap

    def mirror(self, prefix, **options):
        """A new mirror of the source: refresh interval INTERVAL_MS, an ACL scope matching nothing,
        plus options (mirror.* keys with '_' for '.': groups_include=... -> mirror.groups.include)."""
        name = unique(prefix)
        conf = {"mirror.metadata.refresh.interval.ms": str(INTERVAL_MS), "mirror.acl.include": NO_ACLS}
        conf.update({"mirror." + k.replace("_", "."): v for k, v in options.items()})
        args = ["create", "--mirror", name, "--source-bootstrap", self.sb]
        for k, v in conf.items():
            args += ["--config", f"{k}={v}"]
        self.cli.run(*args)
        self.mirrors.append(name)
        return name

    def start(self, mirror, *topics):
        """Starts topics (start creates them on the destination) and waits for MIRRORING."""
        self.cli.run("start", "--mirror", mirror, "--topics", ",".join(topics))
        wait_states(self.cli, mirror, {t: "MIRRORING" for t in topics}, timeout=60)

    def caught_up(self, topic, partitions, timeout=120):
        return wait_caught_up(self.pb, self.sb, topic, partitions, timeout=timeout, stall=60)


# A scope no binding is in (a transactional id nobody uses).
NO_ACLS = "TRANSACTIONAL_ID;kmirror-sync-tests-none"


@pytest.fixture(scope="module")
def senv(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path_factory):
    proxy = Proxy(kmirrord_bin, dest_cluster, str(tmp_path_factory.mktemp("sync")),
                  name="kmirrord-sync", log_level="info").start()
    wait_until(lambda: proxy.metric("kmirror_upstream_brokers") >= len(dest_cluster.broker_ids), 30,
               what="kmirrord to learn the brokers")
    env = SyncEnv(proxy, Cli(kmirror_bin, proxy.bootstrap), source_cluster, dest_cluster)
    yield env
    try:
        if proxy.running():
            # Nothing of this module keeps syncing behind later tests' kmirrords.
            for m in env.mirrors:
                env.cli.run("stop", "--mirror", m, "--topics-regex", ".*", expect=None)
            for m in env.mirrors:
                try:
                    wait_until(lambda: all(p["state"] == "STOPPED" for t in described(env.cli, m)["topics"]
                                           for p in t["partitions"]), 30, 0.5, f"{m} stopped")
                except AssertionError:
                    continue
                env.cli.run("delete", "--mirror", m, expect=None)
    finally:
        proxy.stop()
        _admins.clear()
    reports = proxy.sanitizer_reports()
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])


@pytest.fixture
def env(senv):
    """The module's kmirrord; fails the test if it died during it (and restarts it)."""
    if not senv.proxy.running():
        senv.proxy.start()
    yield senv
    assert senv.proxy.running(), f"kmirrord exited during the test:\n{senv.proxy.daemon.tail()}"


# ---------------------------------------------------------------------------------------------
# Helpers: topic configs, group offsets, describe's metadata_sync, /metrics

_admins = {}


def admin(bootstrap):
    """One AdminClient per cluster, kept (a client freed with a request in flight fails it)."""
    if bootstrap not in _admins:
        _admins[bootstrap] = AdminClient({"bootstrap.servers": bootstrap})
    return _admins[bootstrap]


def topic_configs(bootstrap, topic):
    """{name: (value, config source number)} of a topic as the cluster describes it."""
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin(bootstrap).describe_configs([res])[res].result(timeout=30)
    return {n: (e.value, int(getattr(e.source, "value", e.source))) for n, e in entries.items()}


def topic_set(cfg):
    """The configs set on the topic itself (DYNAMIC_TOPIC_CONFIG): {name: value}."""
    return {n: v for n, (v, src) in cfg.items() if src == DYNAMIC_TOPIC_CONFIG}


def alter_topic(bootstrap, topic, set_=None, delete=()):
    """One IncrementalAlterConfigs on the cluster itself: SET the set_ values, DELETE the keys."""
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in (set_ or {}).items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin(bootstrap).incremental_alter_configs([res])[res].result(timeout=30)


def partition_count(bootstrap, topic):
    t = admin(bootstrap).list_topics(topic, timeout=30).topics[topic]
    return 0 if t.error is not None else len(t.partitions)


def group_offsets(bootstrap, group, topic, partitions):
    """{partition: committed offset or None} of a group, asked of the cluster's coordinator."""
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    got = admin(bootstrap).list_consumer_group_offsets([req])[group].result(timeout=30)
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got.topic_partitions}


def commit_offsets(bootstrap, group, topic, offsets):
    """Commits {partition: offset} for group (a consumer's commit without joining)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def wait_value(get, pred, timeout, what):
    """Polls get() until pred holds for its value; returns that value."""
    box = {}

    def ok():
        box["v"] = get()
        return pred(box["v"])
    wait_until(ok, timeout, 0.3, what)
    return box["v"]


def sync_status(cli, mirror):
    """{kind: describe's metadata_sync entry} of a mirror."""
    m = described(cli, mirror)
    assert "metadata_sync" in m, f"describe of {mirror} has no metadata_sync: {sorted(m)}"
    out = {e["kind"]: e for e in m["metadata_sync"]}
    assert set(out) == set(KINDS) | {"topics"}, m["metadata_sync"]
    return out


METRIC = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def sync_series(proxy, mirror):
    """[(name, {label: value}, value)] of the kmirror_mirror_sync_* series of a mirror."""
    out = []
    for key, value in proxy.metrics().items():
        m = METRIC.match(key)
        if not m or not m.group(1).startswith("kmirror_mirror_sync_"):
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        if labels.get("mirror") == mirror:
            out.append((m.group(1), labels, value))
    return out


def produce_numbered(bootstrap, topic, partitions, per_partition, start=0):
    """per_partition records to each partition of a new topic, value f"p{p}-o{offset}" (the topic's
    first record of a partition is at offset 0, so the value names where it must be read), in
    batches of 10 records."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "batch.num.messages": 10})
    errors = []
    for i in range(start, start + per_partition):
        for part in range(partitions):
            p.produce(topic, key=f"k{i}".encode(), value=f"p{part}-o{i}".encode(), partition=part,
                      on_delivery=lambda err, msg: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]


# ---------------------------------------------------------------------------------------------
# 1. Topic configs

def test_topic_configs_follow_the_source(env):
    mirror = env.mirror("cfg")
    t = unique("cfg")
    env.source.create_topic(t, partitions=1, config={"retention.ms": "3600000"})
    env.start(mirror, t)
    assert topic_set(topic_configs(env.dest.bootstrap, t)).get("retention.ms") == "3600000"
    # The timing below is the interval's: first this kmirrord owns the mirror and has synced it once
    # (a kmirrord an earlier test killed holds its group partitions until its session times out).
    wait_until(lambda: sync_status(env.cli, mirror)["configs"]["last_sync_time_ms"] > 0, 60, 0.5,
               f"a first sync of {mirror}")

    # Changes at the source reach the destination within an interval (the change can come just
    # after a cycle read the source: up to one more interval, plus the cycle's own time).
    alter_topic(env.sb, t, {"retention.ms": "7200000", "cleanup.policy": "compact",
                            "max.message.bytes": "2097152", "compression.type": "gzip",
                            "message.timestamp.type": "LogAppendTime",
                            "message.timestamp.after.max.ms": "86400000"})
    t0 = time.monotonic()
    want = {"retention.ms": "7200000", "cleanup.policy": "compact", "max.message.bytes": "2097152"}

    def followed():
        s = topic_set(topic_configs(env.dest.bootstrap, t))
        return all(s.get(k) == v for k, v in want.items()) and s
    dst = wait_until(followed, 30, 0.2, f"the source's new configs of {t} on the destination")
    took = time.monotonic() - t0
    progress(f"{t}: the source's config change on the destination after {took:.1f}s")
    assert took <= cycles(1) + INTERVAL_MS / 1000.0, f"took {took:.1f}s with an interval of {INTERVAL_MS} ms"
    cfg = topic_configs(env.dest.bootstrap, t)
    # compression.type stays producer, LogAppendTime is CreateTime, a never-copied key stays out.
    assert cfg["compression.type"][0] == "producer", cfg["compression.type"]
    assert cfg["message.timestamp.type"][0] == "CreateTime", cfg["message.timestamp.type"]
    assert "message.timestamp.after.max.ms" not in dst, dst
    assert "min.insync.replicas" not in dst, dst

    # Local changes on the destination (on the cluster itself, not through the proxy) are reverted:
    # a value the source sets is set back, a key the source does not set is deleted, compression
    # goes back to producer; a never-copied key set there (min.insync.replicas) is left alone.
    alter_topic(env.dest.bootstrap, t, {"retention.ms": "1000", "segment.ms": "3600000",
                                        "compression.type": "gzip", "min.insync.replicas": "1"})
    t0 = time.monotonic()

    def reverted():
        # min.insync.replicas stays: until it shows, the broker's answer predates the change itself
        # (a DescribeConfigs right after the IncrementalAlterConfigs can still show the old set).
        s = topic_set(topic_configs(env.dest.bootstrap, t))
        return (s.get("min.insync.replicas") == "1" and s.get("retention.ms") == "7200000" and
                "segment.ms" not in s and s.get("compression.type") == "producer") and s
    dst = wait_until(reverted, 30, 0.2, f"the local changes of {t} reverted")
    progress(f"{t}: local changes reverted after {time.monotonic() - t0:.1f}s")
    assert dst.get("min.insync.replicas") == "1", dst

    # A key the source stops setting is deleted on the destination too.
    alter_topic(env.sb, t, delete=["max.message.bytes"])
    wait_until(lambda: "max.message.bytes" not in topic_set(topic_configs(env.dest.bootstrap, t)), 30, 0.2,
               f"max.message.bytes of {t} deleted on the destination")

    # Stable over more cycles: nothing flaps, the never-copied key is still the destination's.
    time.sleep(cycles(2))
    s = topic_set(topic_configs(env.dest.bootstrap, t))
    assert s.get("min.insync.replicas") == "1", s
    assert s.get("retention.ms") == "7200000" and s.get("cleanup.policy") == "compact", s
    assert s.get("compression.type") == "producer" and "max.message.bytes" not in s, s
    assert "message.timestamp.after.max.ms" not in s, s
    # The source is only read.
    src = topic_set(topic_configs(env.sb, t))
    assert src.get("compression.type") == "gzip" and "min.insync.replicas" not in src, src

    # unclean.leader.election.enable=true at the source: a warning, once (not every cycle).
    alter_topic(env.sb, t, {"unclean.leader.election.enable": "true"})
    line = f"source topic {t} has unclean.leader.election.enable=true"
    env.proxy.wait_log(re.escape(line), timeout=30)
    time.sleep(cycles(2))
    assert env.proxy.output().count(line) == 1, env.proxy.output().count(line)


# ---------------------------------------------------------------------------------------------
# 2. Partitions

def test_partitions_added_at_the_source_are_mirrored(env):
    mirror = env.mirror("grow")
    t = unique("grow")
    env.source.create_topic(t, partitions=2)
    produce_records(env.sb, t, 400, "lz4", partitions=2)
    env.start(mirror, t)
    env.caught_up(t, 2)
    assert partition_count(env.dest.bootstrap, t) == 2

    admin(env.sb).create_partitions([NewPartitions(t, 4)])[t].result(timeout=60)
    wait_until(lambda: partition_count(env.sb, t) == 4, 30, 0.2, f"{t} grown at the source")
    t0 = time.monotonic()
    # Records to every partition, the new ones included.
    produce_records(env.sb, t, 800, "lz4", start=400, partitions=4)
    wait_until(lambda: partition_count(env.dest.bootstrap, t) == 4, 60, 0.5,
               f"{t} grown to 4 partitions on the destination")
    progress(f"{t}: 4 partitions on the destination after {time.monotonic() - t0:.1f}s")
    # The store holds the new partitions (they join in PREPARING) and mirrors them.
    wait_until(lambda: (lambda st: len(st.get(t, [])) == 4 and set(st[t]) == {"MIRRORING"})(
        topic_states(env.cli, mirror)), 60, 0.3, f"4 partitions of {t} MIRRORING")
    marks = env.caught_up(t, 4)
    assert all(hi - lo > 0 for lo, hi in marks[2:]), marks
    # Read through the proxy at the source's offsets, record by record, old and new partitions.
    total, counts = compare_topic(env.pb, env.sb, t, 4, marks)
    assert total == 1200, (total, counts)
    assert watermarks(env.pb, t, 4) == marks


# ---------------------------------------------------------------------------------------------
# 3. Consumer group offsets

def console_consume(cluster, bootstrap, topic, group, protocol, max_messages, from_beginning, extra=()):
    """A Java console consumer in group (group.protocol as given) reading max_messages records;
    returns [(partition, offset, value)] in the order printed."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
            "--consumer-property", f"group.protocol={protocol}", "--max-messages", max_messages,
            "--timeout-ms", 20000, "--property", "print.partition=true",
            "--property", "print.offset=true"]
    if from_beginning:
        args.append("--from-beginning")
    for p in extra:
        args += ["--consumer-property", p]
    r = cluster.run_tool("console-consumer", *args, timeout=180, check=False)
    out = []
    for ln in r.stdout.splitlines():
        f = ln.split("\t")
        if len(f) == 3 and f[0].startswith("Partition:") and f[1].startswith("Offset:"):
            out.append((int(f[0][10:]), int(f[1][7:]), f[2]))
    return out, r


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_java_group_offsets_then_resume_after_stop(env, protocol):
    mirror = env.mirror(f"grp-{protocol}")
    t, group = unique(f"grp-{protocol}"), unique(f"java-{protocol}")
    parts, per = 2, 200
    env.source.create_topic(t, partitions=parts)
    produce_numbered(env.sb, t, parts, per)
    env.start(mirror, t)
    marks = env.caught_up(t, parts)
    assert marks == [(0, per)] * parts, marks

    # A Java consumer of the group at the source reads part of the topic and commits on close
    # (small fetches and polls: it stops inside the partitions, not at an end).
    got, r = console_consume(env.source, env.sb, t, group, protocol, 60, True,
                             ["max.poll.records=10", "max.partition.fetch.bytes=512"])
    assert len(got) == 60, r.stdout[-2000:] + r.stderr[-3000:]
    committed = wait_value(lambda: group_offsets(env.sb, group, t, parts),
                           lambda o: None not in o.values(), 30, f"{group}'s commits at the source")
    progress(f"{group} ({protocol}): committed at the source {committed}")
    assert sum(committed.values()) >= 60 and any(0 < o < per for o in committed.values()), committed

    # The committed offsets appear on the destination (asked of the destination cluster itself).
    t0 = time.monotonic()
    wait_until(lambda: group_offsets(env.dest.bootstrap, group, t, parts) == committed, 30, 0.5,
               f"{group}'s offsets {committed} on the destination")
    progress(f"{group}: on the destination after {time.monotonic() - t0:.1f}s")

    # Failover: stop the topic, then the same group through the proxy resumes at the next record.
    env.cli.run("stop", "--mirror", mirror, "--topics", t)
    wait_states(env.cli, mirror, {t: "STOPPED"}, timeout=60)
    rest = sum(per - o for o in committed.values())
    got, r = console_consume(env.dest, env.pb, t, group, protocol, rest, False)
    diag = r.stdout[-2000:] + r.stderr[-3000:]
    where = [(p, o) for p, o, _ in got]
    assert len(where) == len(set(where)), f"records read twice: {diag}"
    for p in range(parts):
        offs = sorted(o for q, o, _ in got if q == p)
        assert offs == list(range(committed[p], per)), (
            f"{t}-{p}: resumed at {offs[:3]}..{offs[-3:]} ({len(offs)} records), committed "
            f"{committed[p]}, end {per}\n{diag}")
    assert all(v == f"p{p}-o{o}" for p, o, v in got), [x for x in got if x[2] != f"p{x[0]}-o{x[1]}"][:5]
    # The group's offsets through the proxy are now its own (the end).
    assert group_offsets(env.dest.bootstrap, group, t, parts) == {p: per for p in range(parts)}


def test_group_include_exclude(env):
    s = uuid.uuid4().hex[:8]
    mirror = env.mirror("gfilter", groups_include=f"fi-{s}-.*,also-{s}", groups_exclude=f"fi-{s}-ex-.*")
    t = unique("gfilter")
    env.source.create_topic(t, partitions=2)
    produce_records(env.sb, t, 200, "none", partitions=2)
    env.start(mirror, t)
    env.caught_up(t, 2)
    synced = [f"fi-{s}-in", f"fi-{s}-in-ex-2", f"also-{s}"]      # matched by an include, by no exclude
    left = [f"fi-{s}-ex-1",                                      # include and exclude: exclude wins
            f"x-fi-{s}-in", f"also-{s}-2", f"other-{s}"]         # no include matches the whole name
    offsets = {0: 17, 1: 23}
    for g in synced + left:
        commit_offsets(env.sb, g, t, offsets)
    for g in synced:
        wait_until(lambda: group_offsets(env.dest.bootstrap, g, t, 2) == offsets, 30, 0.5,
                   f"group {g} synced")
    time.sleep(cycles(2))
    for g in left:
        assert group_offsets(env.dest.bootstrap, g, t, 2) == {0: None, 1: None}, f"group {g} was synced"


class ActiveMember:
    """A consumer of group through the proxy: subscribed to topic, polling in a thread, auto commit
    off; commits `offsets` itself once it has its assignment."""

    def __init__(self, bootstrap, group, topic, offsets):
        self.conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 30000}
        self.topic, self.offsets = topic, offsets
        self.assigned = threading.Event()
        self.committed = threading.Event()
        self.stop_ = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        c = Consumer(self.conf)
        try:
            c.subscribe([self.topic], on_assign=lambda cons, tps: tps and self.assigned.set())
            while not self.stop_.is_set():
                c.poll(0.2)
                if self.assigned.is_set() and not self.committed.is_set():
                    c.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in self.offsets.items()],
                             asynchronous=False)
                    self.committed.set()
        except Exception as e:  # noqa: BLE001 - reported by stop()
            self.error = e
        finally:
            c.close()

    def start(self):
        self.thread.start()
        assert self.committed.wait(60), f"the member did not join and commit: {self.error}"
        return self

    def stop(self):
        self.stop_.set()
        self.thread.join(60)
        assert self.error is None, self.error


def test_group_with_members_on_the_destination_is_skipped(env):
    mirror = env.mirror("active")
    t = unique("active")
    active, control = unique("active-g"), unique("control-g")
    env.source.create_topic(t, partitions=2)
    produce_records(env.sb, t, 400, "none", partitions=2)
    env.start(mirror, t)
    env.caught_up(t, 2)
    log_from = len(env.proxy.output())

    # The active group has a member through the proxy that committed offsets of its own.
    own = {0: 5, 1: 6}
    member = ActiveMember(env.pb, active, t, own).start()
    try:
        assert group_offsets(env.dest.bootstrap, active, t, 2) == own
        src_active, src_control = {0: 150, 1: 160}, {0: 40, 1: 50}
        commit_offsets(env.sb, active, t, src_active)
        commit_offsets(env.sb, control, t, src_control)
        # The cycles run: the group without members is synced...
        wait_until(lambda: group_offsets(env.dest.bootstrap, control, t, 2) == src_control, 30, 0.5,
                   f"group {control} synced")
        # ...and over a few more the active one keeps its members' offsets and is counted as skipped.
        time.sleep(cycles(3))
        assert group_offsets(env.dest.bootstrap, active, t, 2) == own
        st = sync_status(env.cli, mirror)["groups"]
        assert st["skipped"] >= 1 and st["last_sync_time_ms"] > 0, st
        lines = [ln for ln in env.proxy.output()[log_from:].splitlines() if active in ln]
        noisy = [ln for ln in lines if "level=warn" in ln or "level=error" in ln]
        assert len(noisy) <= 2, "\n".join(noisy[:10])
        progress(f"{active}: skipped ({st}); {len(lines)} log lines name it")
    finally:
        member.stop()
    # Once its member left (the group is Empty), the next cycles sync it.
    wait_until(lambda: group_offsets(env.dest.bootstrap, active, t, 2) == src_active, 60, 0.5,
               f"group {active} synced after its member left")


# ---------------------------------------------------------------------------------------------
# Status: describe's metadata_sync and /metrics

def test_sync_status_in_describe_and_metrics(env):
    mirror = env.mirror("status")
    t = unique("status")
    env.source.create_topic(t, partitions=3)
    t_ms = int(time.time() * 1000)
    env.start(mirror, t)

    st = wait_value(lambda: sync_status(env.cli, mirror),
                    lambda st: all(st[k]["last_sync_time_ms"] >= t_ms for k in KINDS), 30,
                    f"a whole sync cycle of {mirror}")
    for k in KINDS:
        e = st[k]
        assert e["is_owner"] is True, e
        for f in ("compared", "changes_last_cycle", "changes_total", "skipped", "errors_total"):
            assert isinstance(e[f], int) and e[f] >= 0, (k, f, e)
        assert e["errors_total"] == 0 and e["last_error"] is None, e
    assert st["configs"]["compared"] >= 1 and st["partitions"]["compared"] >= 1, st

    # A change at the source is counted by the configs step, then a quiet cycle makes none.
    before = st["configs"]["changes_total"]
    alter_topic(env.sb, t, {"retention.ms": "5400000"})
    wait_until(lambda: topic_set(topic_configs(env.dest.bootstrap, t)).get("retention.ms") == "5400000",
               30, 0.2, f"retention.ms of {t} synced")
    st = wait_value(lambda: sync_status(env.cli, mirror), lambda s: s["configs"]["changes_total"] > before,
                    15, "the configs step to count the change")
    # The cycle after the change made none (the change was counted once).
    st = wait_value(lambda: sync_status(env.cli, mirror), lambda s: s["configs"]["changes_last_cycle"] == 0,
                    15, "a cycle without changes")
    total = st["configs"]["changes_total"]
    assert total > before, st["configs"]
    time.sleep(cycles(1))
    assert sync_status(env.cli, mirror)["configs"]["changes_total"] == total  # nothing flaps

    series = sync_series(env.proxy, mirror)
    kinds = {labels.get("kind") for _, labels, _ in series}
    assert kinds >= set(KINDS), f"kmirror_mirror_sync_* series of {mirror}: {series}"


# ---------------------------------------------------------------------------------------------
# 4. ACLs, on two clusters of their own

RULES = {
    "topic-orders": "TOPIC;orders.*",
    "alice": "*;*;*;*;User:alice",
    "app-regex": "*;*;*;*;User:app-.*",
    "topic-read-allow": "TOPIC;*;READ;ALLOW",
    "group-consumer-bob": "GROUP;consumer-.*;READ;ALLOW;User:bob",
    "two-rules": "TOPIC;orders.*,*;*;*;*;User:alice",
}
PRINCIPALS = ["User:alice", "User:alice2", "User:bob", "User:app-1", "User:myapp-1", "User:carol"]
OPS = {"TOPIC": ["READ", "WRITE", "DESCRIBE"], "GROUP": ["READ", "DESCRIBE"],
       "TRANSACTIONAL_ID": ["WRITE", "DESCRIBE"]}


def acl_resources(s):
    """(type, name, pattern type) of the bindings: every rule's boundaries (literal and prefixed
    names, names a regex matches only in part, other types under the same name)."""
    return [("TOPIC", f"orders-{s}", "LITERAL"), ("TOPIC", f"orders-{s}-", "PREFIXED"),
            ("TOPIC", f"my-orders-{s}", "LITERAL"), ("TOPIC", f"payments-{s}", "LITERAL"),
            ("GROUP", f"consumer-{s}", "LITERAL"), ("GROUP", f"consumer-{s}-", "PREFIXED"),
            ("GROUP", f"consumer-{s}-b", "LITERAL"), ("GROUP", f"my-consumer-{s}", "LITERAL"),
            ("GROUP", f"orders-{s}", "LITERAL"),
            ("TRANSACTIONAL_ID", f"tx-{s}", "LITERAL"), ("TRANSACTIONAL_ID", f"orders-tx-{s}", "PREFIXED")]


def rule_match(spec, b):
    """Whether binding b = (type, name, pattern, principal, host, operation, permission) is in the
    scope spec: some comma-separated rule type;name;operation;permission;principal matches it
    (`*` any, trailing fields omitted, names and principals regexes of the whole value)."""
    rtype, name, _, principal, _, op, perm = b
    for rule in spec.split(","):
        f = (rule.split(";") + ["*"] * 5)[:5]
        if ((f[0] == "*" or f[0].upper() == rtype) and (f[1] == "*" or re.fullmatch(f[1], name)) and
                (f[2] == "*" or f[2].upper() == op) and (f[3] == "*" or f[3].upper() == perm) and
                (f[4] == "*" or re.fullmatch(f[4], principal))):
            return True
    return False


def expected_dest(spec, source, dest0):
    """The destination after a sync with scope spec: in scope it is the source's, outside it is as
    it was."""
    return {b for b in dest0 if not rule_match(spec, b) or b in source} | \
        {b for b in source if rule_match(spec, b)}


def acl_sides(s):
    """(source bindings, destination bindings before the sync): every binding of the resources
    placed on the source only, the destination only or both, so that for every rule there are
    bindings to create, to delete and to keep in scope, and bindings on either side outside it
    (the seed is the first that covers them all: the same for any suffix)."""
    universe = [(rt, name, pat, pr, "*", op, perm)
                for rt, name, pat in acl_resources(s) for op in OPS[rt]
                for perm in ("ALLOW", "DENY") for pr in PRINCIPALS]
    for seed in range(1000):
        rnd = random.Random(seed)
        side = {b: rnd.choice(("source", "dest", "both")) for b in universe}
        src = {b for b in universe if side[b] in ("source", "both")}
        dst = {b for b in universe if side[b] in ("dest", "both")}
        ok = True
        for spec in RULES.values():
            ins = {b for b in universe if rule_match(spec, b)}
            out = set(universe) - ins
            if not (ins & (src - dst) and ins & (dst - src) and ins & src & dst and
                    out & (src - dst) and out & (dst - src)):
                ok = False
                break
        if ok:
            return src, dst
    raise AssertionError("no seed places the bindings on every side of every rule")


def to_binding(b):
    rt, name, pat, pr, host, op, perm = b
    return AclBinding(ResourceType[rt], name, ResourcePatternType[pat], pr, host, AclOperation[op],
                      AclPermissionType[perm])


def acl_set(bootstrap):
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                           AclPermissionType.ANY)
    return {(b.restype.name, b.name, b.resource_pattern_type.name, b.principal, b.host, b.operation.name,
             b.permission_type.name) for b in admin(bootstrap).describe_acls(flt).result(timeout=30)}


def set_acls(bootstrap, bindings):
    """Makes the cluster's ACLs exactly bindings (every ACL of these clusters is this module's)."""
    a = admin(bootstrap)
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                           AclPermissionType.ANY)
    a.delete_acls([flt])[flt].result(timeout=30)
    if bindings:
        for f in a.create_acls([to_binding(b) for b in sorted(bindings)]).values():
            f.result(timeout=30)
    wait_until(lambda: acl_set(bootstrap) == set(bindings), 30, 0.3, "the ACLs in place")


def acl_diff(got, want):
    extra, missing = sorted(got - want), sorted(want - got)
    return f"{len(extra)} unexpected (first {extra[:4]}), {len(missing)} missing (first {missing[:4]})"


class AclEnv:
    pass


@pytest.fixture(scope="module")
def acl_env(kmirrord_bin, kmirror_bin, tmp_path_factory):
    """Two 1-broker clusters of this module (a scope like `*` would delete the shared destination's
    ACLs), kmirrord in front of the destination, one mirror with a topic started."""
    # Started one after the other from this thread: a broker dies with the thread that started it.
    clusters = []
    proxy = None
    try:
        for name in ("aclsrc", "acldst"):
            clusters.append(KafkaCluster(name, brokers=1).start())
        e = AclEnv()
        e.source, e.dest = clusters
        e.suffix = uuid.uuid4().hex[:8]
        e.src_acls, e.dst_acls = acl_sides(e.suffix)
        set_acls(e.source.bootstrap, e.src_acls)
        proxy = Proxy(kmirrord_bin, e.dest, str(tmp_path_factory.mktemp("aclsync")), name="kmirrord-acl",
                      log_level="info").start()
        wait_until(lambda: proxy.metric("kmirror_upstream_brokers") >= 1, 30,
                   what="kmirrord to learn the broker")
        e.proxy, e.cli = proxy, Cli(kmirror_bin, proxy.bootstrap)
        e.mirror = unique("acl")
        e.cli.run("create", "--mirror", e.mirror, "--source-bootstrap", e.source.bootstrap,
                  "--config", f"mirror.metadata.refresh.interval.ms={ACL_INTERVAL_MS}",
                  "--config", f"mirror.acl.include={NO_ACLS}")
        topic = f"aclmirror-{e.suffix}"  # no binding names it
        e.source.create_topic(topic, partitions=1)
        e.cli.run("start", "--mirror", e.mirror, "--topics", topic)
        wait_states(e.cli, e.mirror, {topic: "MIRRORING"}, timeout=60)
        yield e
    finally:
        if proxy is not None:
            proxy.stop()
        for c in clusters:
            _admins.pop(c.bootstrap, None)
            c.stop()
    reports = proxy.sanitizer_reports() if proxy else []
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])


@main_release_only  # the ACL RPCs are the same on every release: once, on the suite's own
@pytest.mark.parametrize("rule", list(RULES), ids=list(RULES))
def test_acls_follow_the_source_in_scope(acl_env, rule):
    e = acl_env
    spec = RULES[rule]
    # From the same start for every scope: out of scope, the destination's own set put back.
    e.cli.run("alter", "--mirror", e.mirror, "--config", f"mirror.acl.include={NO_ACLS}")
    time.sleep(cycles(2, ACL_INTERVAL_MS))  # a cycle with the last scope has finished
    set_acls(e.dest.bootstrap, e.dst_acls)
    want = expected_dest(spec, e.src_acls, e.dst_acls)
    created = want - e.dst_acls
    deleted = e.dst_acls - want
    assert created and deleted, (len(created), len(deleted))

    e.cli.run("alter", "--mirror", e.mirror, "--config", f"mirror.acl.include={spec}")
    t0 = time.monotonic()
    try:
        wait_until(lambda: acl_set(e.dest.bootstrap) == want, 20, 0.3, f"the destination's ACLs for {spec}")
    except AssertionError:
        raise AssertionError(f"scope {spec}: destination {acl_diff(acl_set(e.dest.bootstrap), want)}; "
                             f"{len(created)} to create, {len(deleted)} to delete") from None
    progress(f"{spec}: {len(created)} created, {len(deleted)} deleted in {time.monotonic() - t0:.1f}s")
    # Settled: further cycles change nothing; the source is only read.
    time.sleep(cycles(2, ACL_INTERVAL_MS))
    got = acl_set(e.dest.bootstrap)
    assert got == want, f"scope {spec} after more cycles: destination {acl_diff(got, want)}"
    assert acl_set(e.source.bootstrap) == e.src_acls


@main_release_only
def test_acls_are_not_synced_by_default(acl_env):
    """A mirror created without mirror.acl.include creates and deletes no ACL on the destination
    (the destination's own bindings stay, the source's are not copied), and describe says so."""
    e = acl_env
    e.cli.run("alter", "--mirror", e.mirror, "--config", f"mirror.acl.include={NO_ACLS}")
    time.sleep(cycles(2, ACL_INTERVAL_MS))  # a cycle with the last scope has finished
    set_acls(e.dest.bootstrap, e.dst_acls)
    mirror = unique("acldefault")
    e.cli.run("create", "--mirror", mirror, "--source-bootstrap", e.source.bootstrap,
              "--config", f"mirror.metadata.refresh.interval.ms={ACL_INTERVAL_MS}")
    topic = f"acldefault-{e.suffix}"
    e.source.create_topic(topic, partitions=1)
    try:
        e.cli.run("start", "--mirror", mirror, "--topics", topic)
        wait_states(e.cli, mirror, {topic: "MIRRORING"}, timeout=60)
        t_ms = int(time.time() * 1000)
        st = wait_value(lambda: sync_status(e.cli, mirror), lambda s: s["acls"]["last_sync_time_ms"] >= t_ms, 30,
                        f"a whole sync cycle of {mirror}")
        time.sleep(cycles(2, ACL_INTERVAL_MS))
        got = acl_set(e.dest.bootstrap)
        assert got == e.dst_acls, f"default scope: destination {acl_diff(got, e.dst_acls)}"
        st = sync_status(e.cli, mirror)
        print("describe:", st["acls"])
        assert st["acls"]["scope"] == "off" and st["acls"]["changes_total"] == 0, st["acls"]
    finally:
        e.cli.run("stop", "--mirror", mirror, "--topics", topic, expect=None)
        wait_until(lambda: e.cli.run("delete", "--mirror", mirror, expect=None).returncode == 0, 30,
                   what=f"mirror {mirror} deleted")
