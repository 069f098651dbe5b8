"""The sync group moves (docs/mirror.md, "The sync group moves"): kmirrords whose sync group cannot be
joined leave it for its next generation, recorded in the state topic, and all of them follow.

Finding 31 of the soak (docs/reliability.md): the destination's group coordinator failed to load the
__consumer_offsets partition of the sync group, answered NOT_COORDINATOR and GROUP_ID_NOT_FOUND for
good, and no kmirrord ran a mirror again. A real broker cannot be made to fail that load on demand;
it gives the same lasting GROUP_ID_NOT_FOUND to a KIP-848 heartbeat when a classic group of another
protocol type holds the name ("Group ... is not a consumer group"), which is what the occupant
below does, over the Kafka protocol, on the real destination."""

import signal
import struct
import threading
import time
import uuid

from confluent_kafka.admin import AdminClient
from harness import kafka_request

from mirror_cli import Cli, kmirror_bin  # noqa: F401
from mirror_data import compare_topic, main_release_only, produce_records, wait_caught_up
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, wait_until
from test_mirror_owners import runners
from test_mirror_robust import asan_kmirrord

# Release-independent: on the pom's release only (mirror_data.ON_MAIN_RELEASE).
pytestmark = main_release_only

MOVE_AFTER_S = 20  # past the first warning (15 s)


def _str(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _nullable(s):
    return struct.pack(">h", -1) if s is None else _str(s)


class _Reader:
    def __init__(self, data):
        self.d, self.i = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.i)
        self.i += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take(">h")
        if n < 0:
            return None
        s = self.d[self.i:self.i + n].decode()
        self.i += n
        return s


class ClassicOccupant:
    """A member of a classic group of protocol type `kmirror-test-occupant`, kept alive by heartbeats:
    JoinGroup v5, SyncGroup v3, Heartbeat v3 and LeaveGroup v3 sent to the group's coordinator
    (harness.kafka_request, a connection per request: a classic member is its member id)."""

    def __init__(self, bootstrap, group):
        self.bootstrap, self.group = bootstrap, group
        self.stopping, self.beats = threading.Event(), 0
        self.member, self.generation = "", -1
        self.thread = None
        self.coordinator = None

    def _call(self, hostport, key, version, body):
        host, port = hostport.rsplit(":", 1)
        return _Reader(kafka_request(host, int(port), key, version, body, timeout=15,
                                     client_id=b"kmirror-test-occupant"))

    def start(self):
        deadline = time.monotonic() + 60
        while True:  # FindCoordinator v2: key, key type 0 (a group)
            r = self._call(self.bootstrap.split(",")[0], 10, 2, _str(self.group) + struct.pack(">b", 0))
            r.take(">i")
            err = r.take(">h")
            r.string()
            r.take(">i")
            host, port = r.string(), r.take(">i")
            if err == 0:
                break
            assert time.monotonic() < deadline, f"FindCoordinator {self.group}: error {err}"
            time.sleep(0.5)
        self.coordinator = f"{host}:{port}"
        for _ in range(2):  # the first join answers MEMBER_ID_REQUIRED (79) with the member id
            body = (_str(self.group) + struct.pack(">ii", 10000, 10000) + _str(self.member) + _nullable(None)
                    + _str("kmirror-test-occupant") + struct.pack(">i", 1) + _str("occupy")
                    + struct.pack(">i", 0))
            r = self._call(self.coordinator, 11, 5, body)
            r.take(">i")
            err, gen = r.take(">h"), r.take(">i")
            r.string()
            r.string()
            self.member = r.string()
            if err == 0:
                self.generation = gen
                break
            assert err == 79, f"JoinGroup {self.group}: error {err}"
        assert self.generation >= 0
        body = (_str(self.group) + struct.pack(">i", self.generation) + _str(self.member) + _nullable(None)
                + struct.pack(">i", 1) + _str(self.member) + struct.pack(">i", 0))
        r = self._call(self.coordinator, 14, 3, body)
        r.take(">i")
        assert r.take(">h") == 0, "SyncGroup"
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()
        return self

    def _beat(self):
        while not self.stopping.wait(1.0):
            r = self._call(self.coordinator, 12, 3, _str(self.group) + struct.pack(">i", self.generation)
                           + _str(self.member) + _nullable(None))
            r.take(">i")
            err = r.take(">h")
            assert err == 0, f"Heartbeat {self.group}: error {err}"
            self.beats += 1

    def stop(self):
        self.stopping.set()
        if self.thread:
            self.thread.join(timeout=10)
        if self.coordinator:
            self._call(self.coordinator, 13, 3,
                       _str(self.group) + struct.pack(">i", 1) + _str(self.member) + _nullable(None))


def metric(proxy, name):
    return proxy.metrics().get(name)


def test_a_sync_group_that_cannot_be_joined_is_left_for_its_next_generation(kmirror_bin, kmirrord_bin, dest_cluster,
                                                                             source_cluster, proxy_factory, tmp_path):
    tag = uuid.uuid4().hex[:6]
    base = f"__kmirror-sync-t{tag}"
    occupant = ClassicOccupant(dest_cluster.bootstrap, base).start()
    a = None
    try:
        opts = dict(mirror_state_topic=f"__mirror_state_sg_{tag}", mirror_state_partitions=2,
                    mirror_pipelines="owned", mirror_sync_group=base,
                    mirror_sync_group_move_after_s=MOVE_AFTER_S)
        # a under the sanitizers when built (a reload below frees the configuration it started with).
        a = Proxy(asan_kmirrord(kmirrord_bin), dest_cluster, str(tmp_path), name="kmirrord-sg-a", **opts).start()
        b = proxy_factory(dest_cluster, name="kmirrord-sg-b", **opts)
        cli = Cli(kmirror_bin, a.bootstrap)
        mirror, topic = f"sg-{tag}", f"sg-{tag}"
        source_cluster.create_topic(topic, partitions=2)
        produce_records(source_cluster.bootstrap, topic, 2000, tag="r0")
        cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
        cli.run("start", "--mirror", mirror, "--topics", topic)
        t0 = time.monotonic()

        # The group is held: no kmirrord is a member, none runs the mirror, and each says so.
        wait_until(lambda: "has not been a member of its sync group " + base in a.output()
                   and "has not been a member of its sync group " + base in b.output(),
                   timeout=MOVE_AFTER_S + 30, what="both kmirrords warn that they are not in their sync group")
        assert metric(a, "kmirror_mirror_sync_group_joined") == 0
        assert metric(b, "kmirror_mirror_sync_group_joined") == 0
        assert runners([a, b], [mirror], window=1.0) == {mirror: []}
        assert "its coordinator answers GROUP_ID_NOT_FOUND" in a.output()
        assert occupant.beats > 0

        # Then every kmirrord moves to the next generation, the mirror runs in exactly one of them,
        # and every record reads the same through both.
        wait_until(lambda: metric(a, "kmirror_mirror_sync_group_joined") == 1
                   and metric(b, "kmirror_mirror_sync_group_joined") == 1,
                   timeout=MOVE_AFTER_S + 60, what="both kmirrords members of the moved group")
        moved_after = time.monotonic() - t0
        gen = metric(a, "kmirror_mirror_sync_group_generation")
        assert gen >= 1 and metric(b, "kmirror_mirror_sync_group_generation") == gen
        moved = f"{base}.{int(gen)}"
        assert (metric(a, "kmirror_mirror_sync_group_moves_total") or 0) + \
            (metric(b, "kmirror_mirror_sync_group_moves_total") or 0) >= 1
        assert f"every kmirrord moves to the group {moved}" in a.output() + b.output()
        print(f"moved to {moved} {moved_after:.1f} s after the start")
        wait_caught_up(a.bootstrap, source_cluster.bootstrap, topic, 2, timeout=90)
        wait_caught_up(b.bootstrap, source_cluster.bootstrap, topic, 2, timeout=90)
        compare_topic(a.bootstrap, source_cluster.bootstrap, topic, 2)
        compare_topic(b.bootstrap, source_cluster.bootstrap, topic, 2)
        produce_records(source_cluster.bootstrap, topic, 500, tag="r1")
        wait_until(lambda: len(runners([a, b], [mirror], window=1.5)[mirror]) == 1, timeout=30,
                   what="the mirror run by exactly one kmirrord")
        admin = AdminClient({"bootstrap.servers": dest_cluster.bootstrap})
        d = admin.describe_consumer_groups([moved])[moved].result(timeout=10)
        assert len(d.members) == 2, d

        # A reload (SIGHUP) frees the configuration's strings: a stays in the moved group.
        mark = len(a.output())
        a.signal(signal.SIGHUP)
        a.wait_log("configuration reloaded", timeout=15, start=mark)
        time.sleep(3)
        assert metric(a, "kmirror_mirror_sync_group_joined") == 1
        assert metric(a, "kmirror_mirror_sync_group_generation") == gen
        assert "the sync group moves" not in a.output()[mark:], a.output()[mark:]
        d = admin.describe_consumer_groups([moved])[moved].result(timeout=10)
        assert len(d.members) == 2, d

        # A kmirrord started now reads the move in the state and joins the moved group at once.
        c = proxy_factory(dest_cluster, name="kmirrord-sg-c", **opts)
        started = time.monotonic()
        wait_until(lambda: metric(c, "kmirror_mirror_sync_group_joined") == 1, timeout=15,
                   what="c a member of the moved group")
        assert time.monotonic() - started < MOVE_AFTER_S / 2
        assert metric(c, "kmirror_mirror_sync_group_generation") == gen
        assert "has not been a member of its sync group" not in c.output()
        for p in (a, b, c):
            wait_caught_up(p.bootstrap, source_cluster.bootstrap, topic, 2, timeout=90)
            compare_topic(p.bootstrap, source_cluster.bootstrap, topic, 2)
    finally:
        occupant.stop()
        if a:
            a.stop()
            reports = a.sanitizer_reports()
            assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])
