"""Upstream swap (docs/proxy.md, "Upstream swap"): clients of kmirrord P on cluster A carry on,
with no restart, when P is told to front cluster B instead. B is A's mirror, made by B's own
kmirrord Q with the consumer groups' offsets synced; on the day Q fails over (`kmirror stop`) and
`kmirror swap-upstream` moves P to B. Producers and consumer groups keep running through P the whole
time, librdkafka's (confluent-kafka) and the Java ones (console producer and consumer): after the
swap the producers' records land on B, the consumers rejoin on B and resume at their group's
committed offset there, and every record of B from that offset on reaches the librdkafka one. The
admin endpoint refuses a missing or wrong token, and the new upstream is in upstream_file, so P
comes back to B after a restart."""

import json
import os
import subprocess
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from mirror_cli import Cli, kmirror_bin, wait_states  # noqa: F401
from mirror_data import progress, read_partition, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, wait_until

pytestmark = pytest.mark.proxy

PARTS = 3
TOKEN = "swap-" + uuid.uuid4().hex
NO_ACLS = "TRANSACTIONAL_ID;kmirror-swap-tests-none"


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def group_offsets(bootstrap, group, topic):
    """{partition: committed offset or None}, asked of the cluster by a consumer of the group that
    does not join it (OffsetFetch)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for attempt in range(30):  # NOT_COORDINATOR while a fresh cluster's __consumer_offsets loads
            try:
                got = c.committed([TopicPartition(topic, p) for p in range(PARTS)], timeout=30)
                break
            except KafkaException:
                if attempt == 29:
                    raise
                time.sleep(1)
    finally:
        c.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}


class Load:
    """A producer and a consumer group member through one bootstrap, each in a thread."""

    def __init__(self, bootstrap, topic, group):
        self.topic, self.stop_ev = topic, threading.Event()
        self.delivered, self.failed, self.consumed, self.consumer_errors = [], [], [], []
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                                  "linger.ms": 5, "message.timeout.ms": 120000,
                                  "topic.metadata.refresh.interval.ms": 2000})
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest", "enable.auto.commit": True,
                                  "auto.commit.interval.ms": 500, "topic.metadata.refresh.interval.ms": 2000,
                                  "session.timeout.ms": 10000, "fetch.wait.max.ms": 200})
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self):
        self.consumer.subscribe([self.topic])
        for t in self.threads:
            t.start()
        return self

    def _produce(self):
        i = 0

        def cb(err, msg):
            if err:
                self.failed.append((msg.value(), str(err)))
            else:
                self.delivered.append((time.monotonic(), msg.partition(), msg.offset(), msg.value()))

        while not self.stop_ev.is_set():
            self.producer.produce(self.topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=i % PARTS,
                                  on_delivery=cb)
            i += 1
            self.producer.poll(0.005)
        assert self.producer.flush(60) == 0

    def _consume(self):
        while not self.stop_ev.is_set():
            m = self.consumer.poll(0.2)
            if m is None:
                continue
            if m.error():
                self.consumer_errors.append(str(m.error()))
                continue
            self.consumed.append((time.monotonic(), m.partition(), m.offset(), m.value()))
        self.consumer.close()

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(90)
        assert not any(t.is_alive() for t in self.threads), "a client thread hangs"


class JavaLoad:
    """Kafka's console producer (fed a numbered line every 10 ms) and console consumer (a group
    member printing partition, offset and value) through one bootstrap: the Java clients."""

    def __init__(self, cluster, bootstrap, topic, group):
        self.stop_ev, self.written, self.consumed = threading.Event(), [], []
        self.producer = cluster.popen_tool(
            "console-producer", "--bootstrap-server", bootstrap, "--topic", topic,
            "--producer-property", "acks=all", "--producer-property", "delivery.timeout.ms=120000",
            "--producer-property", "metadata.max.age.ms=2000",
            "--property", "parse.key=true", "--property", "key.separator=:",  # keyed: every partition
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.consumer = cluster.popen_tool(
            "console-consumer", "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
            "--from-beginning", "--consumer-property", "metadata.max.age.ms=2000",
            # Heartbeats far apart: after the swap it fetches from B at A's positions before its
            # group learns it must rejoin there (the race swap_fetch_hold_ms is for, made likely).
            "--consumer-property", "heartbeat.interval.ms=10000",
            "--property", "print.partition=true", "--property", "print.offset=true",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for t in self.threads:
            t.start()

    def _produce(self):
        i = 0
        while not self.stop_ev.is_set() and self.producer.poll() is None:
            v = f"java-{i}"
            self.producer.stdin.write(f"k{i}:{v}\n")
            self.producer.stdin.flush()
            self.written.append((time.monotonic(), v))
            i += 1
            time.sleep(0.01)

    def _consume(self):
        for line in self.consumer.stdout:  # Partition:0<TAB>Offset:12<TAB>value
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3 and parts[0].startswith("Partition:") and parts[1].startswith("Offset:"):
                self.consumed.append((time.monotonic(), int(parts[0][10:]), int(parts[1][7:]), parts[2].encode()))

    def alive(self):
        return self.producer.poll() is None and self.consumer.poll() is None

    def stop(self):
        """Both still running (no client restart, no fatal error): ends them; their stderr."""
        alive = self.alive()
        self.stop_ev.set()
        self.threads[0].join(30)
        self.producer.stdin.close()  # end of input: the console producer flushes and exits
        try:
            self.producer.wait(60)
        except subprocess.TimeoutExpired:
            self.producer.kill()
        self.consumer.terminate()
        self.consumer.wait(30)
        self.threads[1].join(30)
        return alive, self.producer.stderr.read()[-3000:] + self.consumer.stderr.read()[-3000:]


def swap_status(p):
    status, body = p.http("GET", "/admin/upstream", token=TOKEN)
    assert status == 200, (status, body)
    return json.loads(body)


@pytest.fixture
def pq(kmirrord_bin, kmirror_bin, source_cluster, dest_cluster, tmp_path):
    """P in front of A (with upstream_file and an admin token) and Q in front of B; one state topic name."""
    state_topic = unique("__mirror_state_swap")
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # a token file others may read is refused
    q = Proxy(kmirrord_bin, dest_cluster, str(tmp_path), name="kmirrord-swap-q", mirror_state_topic=state_topic).start()
    p = Proxy(kmirrord_bin, source_cluster, str(tmp_path), name="kmirrord-swap-p", mirror_state_topic=state_topic,
              upstream_file=str(tmp_path / "upstream"), admin_token_file=str(token_file),
              drain_interval_ms=500, drain_timeout_ms=5000,
              swap_fetch_hold_ms=30000).start()
    for x, c in ((p, source_cluster), (q, dest_cluster)):
        wait_until(lambda: x.metric("kmirror_upstream_brokers") >= len(c.broker_ids), 30,
                   what=f"{x.name} to learn the brokers")
    yield p, q, Cli(kmirror_bin, q.bootstrap)
    for x in (p, q):
        x.stop()
        reports = x.sanitizer_reports()
        assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])


def test_admin_endpoint_refusals(pq, dest_cluster, tmp_path):
    p, _, cli = pq
    bad = tmp_path / "bad.token"
    bad.write_text("not-the-token\n")
    bad.chmod(0o600)
    admin = f"{p.options['http_listen']}"
    r = cli.run("swap-upstream", "--admin", admin, "--token-file", bad, "--to", dest_cluster.bootstrap, expect=1)
    assert "refused (HTTP 401): wrong bearer token" in r.stderr, r.stderr
    r = cli.run("swap-upstream", "--admin", admin, "--token-file", p.options["admin_token_file"], "--to",
                p.options["upstream"], expect=1)
    assert "HTTP 400" in r.stderr and "already" in r.stderr, r.stderr
    r = cli.run("swap-upstream", "--admin", admin, "--token-file", p.options["admin_token_file"], expect=2)
    assert "--to" in r.stderr, r.stderr
    assert p.http("POST", "/admin/upstream", dest_cluster.bootstrap)[0] == 401
    status, body = p.http("POST", "/admin/upstream", dest_cluster.bootstrap, token="wrong")
    assert status == 401 and "wrong bearer token" in body, (status, body)
    status, body = p.http("POST", "/admin/upstream", "not an address", token=TOKEN)
    assert status == 400 and "upstream" in body, (status, body)
    status, body = p.http("POST", "/admin/upstream", p.options["upstream"], token=TOKEN)
    assert status == 400 and "already" in body, (status, body)
    st = swap_status(p)
    assert st["upstream"] == p.options["upstream"] and st["swapping_to"] is None, st


def late_lines(written, t_drained):
    """The lines of [(time, line)] written from 1 s after the drain to 2 s before the last one."""
    last = written[-1][0] if written else 0
    return [v for t, v in list(written) if t_drained + 1 < t < last - 2]


def test_swap_under_load(pq, source_cluster, dest_cluster):
    p, q, cli = pq
    topic, group, mirror = unique("swap"), unique("swap-group"), unique("swap")
    jtopic, jgroup = unique("swap-java"), unique("swap-java-group")
    source_cluster.create_topic(topic, partitions=PARTS)
    source_cluster.create_topic(jtopic, partitions=PARTS)
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap,
            "--config", "mirror.metadata.refresh.interval.ms=1000", "--config", f"mirror.acl.include={NO_ACLS}",
            "--config", f"mirror.groups.include={group},{jgroup}")
    cli.run("start", "--mirror", mirror, "--topics", f"{topic},{jtopic}")
    wait_states(cli, mirror, {topic: "MIRRORING", jtopic: "MIRRORING"}, timeout=60)

    load = Load(p.bootstrap, topic, group).start()
    java = JavaLoad(source_cluster, p.bootstrap, jtopic, jgroup)
    java_alive, java_err = False, ""
    try:
        # Running through P on A; the mirror follows and the group's offsets reach B.
        wait_until(lambda: len(load.consumed) > 300, 60, what="the consumer to read through P")
        wait_until(lambda: len(java.consumed) > 100, 90, what="the Java consumer to read through P")
        for g, t in ((group, topic), (jgroup, jtopic)):
            wait_until(lambda: None not in group_offsets(dest_cluster.bootstrap, g, t).values(), 60, 0.5,
                       what=f"{g}'s offsets on B")
        # The day: Q fails over (B writable), its last sync done; the group's offsets on B stay put.
        cli.run("stop", "--mirror", mirror, "--topics", f"{topic},{jtopic}")
        wait_states(cli, mirror, {topic: "STOPPED", jtopic: "STOPPED"}, timeout=60)
        time.sleep(3)
        committed_b = group_offsets(dest_cluster.bootstrap, group, topic)
        jcommitted_b = group_offsets(dest_cluster.bootstrap, jgroup, jtopic)
        time.sleep(3)
        assert group_offsets(dest_cluster.bootstrap, group, topic) == committed_b, "B's offsets still move"
        progress(f"{group} committed on B {committed_b}, {jgroup} {jcommitted_b}")

        # kmirror swap-upstream returns once the previous upstream's connections moved.
        t_swap = time.monotonic()
        r = cli.run("swap-upstream", "--admin", p.options["http_listen"], "--token-file",
                    p.options["admin_token_file"], "--to", dest_cluster.bootstrap)
        t_drained = time.monotonic()
        st = swap_status(p)
        assert st["upstream"] == dest_cluster.bootstrap and st["swapping_to"] is None, st
        assert not any(d["connections"] for d in st["draining"]), st
        assert "now fronting" in r.stdout and "now fronting" in st["last_swap"], (r.stdout, st)
        progress(f"swap: {st['last_swap']}; drained after {t_drained - t_swap:.1f}s\n{r.stderr}")
        # Load goes on against B: 300 records written, and read by both consumers, after the swap.
        n_after = len(load.delivered)
        wait_until(lambda: len([d for d in load.delivered if d[0] > t_drained]) > 300, 60,
                   what="the producer to write after the swap")
        wait_until(lambda: len([c for c in load.consumed if c[0] > t_drained]) > 300, 60,
                   what="the consumer to read after the swap")
        wait_until(lambda: len([c for c in java.consumed if c[0] > t_drained + 1]) > 100, 60,
                   what="the Java consumer to read after the swap")
        # The Java producer's lines checked on B below (from 1 s after the drain to 2 s before
        # its last line, which may still be on their way): at least 100 of them.
        wait_until(lambda: len(late_lines(java.written, t_drained)) >= 100, 60,
                   what="the Java producer to write after the swap")
    finally:
        load.stop()
        java_alive, java_err = java.stop()
    assert java_alive, f"a Java client exited during the swap:\n{java_err}"
    assert not load.failed, load.failed[:5]
    progress(f"delivered {len(load.delivered)} ({len(load.delivered) - n_after} after the swap), consumed "
             f"{len(load.consumed)}, consumer errors {load.consumer_errors[:3]}")

    # The producer's records of after the drain are on B, at the offsets it was told.
    ends = watermarks(dest_cluster.bootstrap, topic, PARTS)
    b_log = {part: {r.offset: r.value for r in read_partition(dest_cluster.bootstrap, topic, part, 0, ends[part][1])}
             for part in range(PARTS)}
    late = [d for d in load.delivered if d[0] > t_drained + 1]
    assert late and all(b_log[part].get(off) == val for _, part, off, val in late), \
        [d for d in late if b_log[d[1]].get(d[2]) != d[3]][:5]

    for part in range(PARTS):
        after = [(off, val) for t, pt, off, val in load.consumed if pt == part and t > t_swap]
        # It resumed at the committed offset on B (no reset to the start or the end) ...
        assert all(off >= committed_b[part] for off, _ in after), (part, committed_b[part], after[:5])
        assert (committed_b[part], b_log[part].get(committed_b[part])) in after, (part, committed_b[part], after[:5])
        # ... and read every record of B from there on, with the values B has.
        seen = set(after)
        # (up to the last record read once only B was left: before, A's higher offsets came too)
        tail_end = max(off for t, pt, off, _ in load.consumed if pt == part and t > t_drained + 1)
        missing = [off for off, val in b_log[part].items() if committed_b[part] <= off <= tail_end
                   and (off, val) not in seen]
        assert not missing, (part, missing[:10])

    # The Java clients the same: the console producer's lines of after the drain are on B, the
    # console consumer resumed at its group's committed offset on B and read B's records from there.
    jends = watermarks(dest_cluster.bootstrap, jtopic, PARTS)
    jb_log = {part: {r.offset: r.value for r in read_partition(dest_cluster.bootstrap, jtopic, part, 0,
                                                               jends[part][1])} for part in range(PARTS)}
    on_b = {v for log in jb_log.values() for v in log.values()}
    late_java = [v.encode() for v in late_lines(java.written, t_drained)]
    assert late_java and all(v in on_b for v in late_java), [v for v in late_java if v not in on_b][:5]
    progress(f"Java clients: wrote {len(java.written)}, read {len(java.consumed)}")
    # Its fetches at A's positions (past B's end) that reached B before its group rejoined there
    # were held back as OFFSET_NOT_AVAILABLE (swap_fetch_hold_ms), not reset to the start.
    progress(f"fetches held back as OFFSET_NOT_AVAILABLE: {p.metric('kmirror_fetch_out_of_range_held_total')}")
    for part in range(PARTS):
        after = [(off, val) for t, pt, off, val in java.consumed if pt == part and t > t_swap]
        assert all(off >= jcommitted_b[part] for off, _ in after), (part, jcommitted_b[part], after[:5])
        assert (jcommitted_b[part], jb_log[part].get(jcommitted_b[part])) in after, (part, jcommitted_b[part],
                                                                                     after[:5])

    # Persisted: a restart comes back to B.
    assert (open(p.options["upstream_file"]).read().strip() == f"upstream = {dest_cluster.bootstrap}")
    p.stop()
    p.start()
    wait_until(lambda: p.metric("kmirror_upstream_brokers") >= len(dest_cluster.broker_ids), 30, what="P on B")
    assert swap_status(p)["upstream"] == dest_cluster.bootstrap
    got = read_partition(p.bootstrap, topic, 0, 0, ends[0][1])
    assert [(r.offset, r.value) for r in got] == sorted(b_log[0].items())
