"""One kmirrord runs each mirror's pipelines (mirror_pipelines = owned; docs/mirror.md, "One
kmirrord per mirror"): two kmirrords share a state topic of their own and the destination's group
__kmirror-sync. Four mirrors, one per state topic partition: each runs in exactly one of them (its
Fetch requests to the source come from one instance only), both run some, and every record reads
the same through both, at its source offset. When one stops (SIGTERM, it leaves the group) or dies
(kill -9: the group expires it after its session timeout), the other runs every mirror and
mirrors on, exactly; when it comes back, the mirrors are shared again, handed over with nothing
lost or seen twice. Whichever kmirrord writes a partition, it writes as the mirror's one writer
(transactional id kmirror/<mirror>/writer), each reconcile at its next epoch: on the destination's
segments every data batch has the same producer id, epochs never go back, so the broker refuses a
former owner's older epoch once the new owner wrote. An owner paused (SIGSTOP) past its session: the other takes its mirrors over;
resumed, it stops its pipelines before writing anything (its lease is stale)."""

import contextlib
import os
import signal
import socket
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient
from harness import KafkaCluster
from harness.kafka_shim import not_coordinator_heartbeat, shimmed_cluster
from harness.netfaults import NetFaults

from mirror_cli import Cli, kmirror_bin  # noqa: F401
from mirror_data import compare_topic, main_release_only, partition_batches, produce_records, wait_caught_up
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, wait_until

# Release-independent: on the pom's release only (mirror_data.ON_MAIN_RELEASE).
pytestmark = main_release_only

SLOTS = 4       # partitions of the state topic: the lease's unit
PARTS = 2       # partitions of each mirrored topic
N = 1000        # records per topic and round


def slot(name):
    """The state topic partition whose owner runs mirror `name` (FNV-1a 64, as kmirrord's lease)."""
    h = 14695981039346656037
    for b in name.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % SLOTS


def mirror_names(tag):
    """One mirror name per slot."""
    names, i = {}, 0
    while len(names) < SLOTS:
        n = f"own-{tag}-{i}"
        names.setdefault(slot(n), n)
        i += 1
    return [names[k] for k in range(SLOTS)]


def fetches(proxy, mirror):
    """Fetch requests this kmirrord's pipeline of mirror sent to the source so far."""
    if not proxy.running():
        return 0
    try:
        m = proxy.metrics()
    except OSError:  # starting (a process sharing its ports answers for it already): nothing run yet
        return 0
    return sum(v for k, v in m.items()
               if k.startswith("kmirror_mirror_fetch_requests_total{") and f'mirror="{mirror}"' in k)


def runners(proxies, mirrors, window=2.0):
    """{mirror: [names of the kmirrords whose pipeline fetched for it within the window]}."""
    before = {(p.name, m): fetches(p, m) for p in proxies for m in mirrors}
    time.sleep(window)
    return {m: [p.name for p in proxies if fetches(p, m) > before[(p.name, m)]] for m in mirrors}


def group_members(cluster, state_topic):
    """Members of __kmirror-sync assigned partitions of state_topic, and whether each holds its target."""
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    d = a.describe_consumer_groups(["__kmirror-sync"])["__kmirror-sync"].result(timeout=10)
    out = []
    for m in d.members:
        mine = sorted(tp.partition for tp in (m.assignment.topic_partitions if m.assignment else [])
                      if tp.topic == state_topic)
        target = sorted(tp.partition for tp in (m.target_assignment.topic_partitions
                                                 if m.target_assignment else []) if tp.topic == state_topic)
        if mine or target:
            out.append((mine, target))
    return out


def settled(cluster, state_topic, members):
    try:
        ms = group_members(cluster, state_topic)
    except Exception as e:  # the group's coordinator moving or loading: asked again
        print(f"describe __kmirror-sync: {e}")
        return False
    return len(ms) == members and all(a == t for a, t in ms) and sum(len(a) for a, _ in ms) == SLOTS


def test_each_mirror_runs_in_one_kmirrord(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    tag = uuid.uuid4().hex[:6]
    state_topic = f"__mirror_state_own_{tag}"
    opts = dict(mirror_state_topic=state_topic, mirror_state_partitions=SLOTS, mirror_pipelines="owned")
    a = proxy_factory(dest_cluster, name="kmirrord-own-a", **opts)
    b = proxy_factory(dest_cluster, name="kmirrord-own-b", **opts)
    proxies = [a, b]
    cli = Cli(kmirror_bin, a.bootstrap)
    mirrors = mirror_names(tag)
    topics = [f"owned-{tag}-{i}" for i in range(SLOTS)]
    for m, t in zip(mirrors, topics):
        source_cluster.create_topic(t, partitions=PARTS)
        produce_records(source_cluster.bootstrap, t, N, tag="r0")
        cli.run("create", "--mirror", m, "--source-bootstrap", source_cluster.bootstrap)
        cli.run("start", "--mirror", m, "--topics", t)
    wait_until(lambda: settled(dest_cluster, state_topic, 2), timeout=60,
               what="a and b members of __kmirror-sync, each at its target assignment")
    rounds = [0]

    def exact(through, what):
        """A round of records at the source; every topic caught up and exact through each of `through`."""
        rounds[0] += 1
        for t in topics:
            produce_records(source_cluster.bootstrap, t, N, tag=f"r{rounds[0]}")
        for p in through:
            for t in topics:
                wait_caught_up(p.bootstrap, source_cluster.bootstrap, t, PARTS, timeout=120, stall=60)
                compare_topic(p.bootstrap, source_cluster.bootstrap, t, PARTS)
        print(f"{what}: exact through {[p.name for p in through]}")

    def owners_settle(live):
        """Every mirror run by exactly one of live, the same over more than a heartbeat (5 s): the
        group's description can look settled while a member still has a partition to revoke."""
        last = [None]

        def ok():
            r = runners(live, mirrors, window=1.5)
            if not all(len(v) == 1 for v in r.values()):
                last[0] = None
                return None
            if r != last[0]:
                last[0] = r
                time.sleep(4.5)
                return None
            return r
        return wait_until(ok, timeout=90, interval=0, what=f"every mirror run by exactly one of {[p.name for p in live]}")

    exact(proxies, "both running")
    r = owners_settle(proxies)
    print("runners:", r)
    assert {n for v in r.values() for n in v} == {a.name, b.name}, f"one kmirrord runs every mirror: {r}"
    owned = {p.name: p.metric("kmirror_mirrors_owned") for p in proxies}
    assert owned == {p.name: float(sum(v == [p.name] for v in r.values())) for p in proxies}, (owned, r)
    # describe through either names the runner of each mirror (<host>@<HTTP listener>).
    names = {p.name: f"{socket.gethostname()}@{PROXY_HOST}:{p.http_port}" for p in proxies}
    want = {m: names[v[0]] for m, v in r.items()}

    def described_owners(p):
        doc, _ = Cli(kmirror_bin, p.bootstrap).json("describe")
        return {m["name"]: m["owner"] for m in doc["mirrors"] if m["name"] in want}
    wait_until(lambda: all(described_owners(p) == want for p in proxies), 30, 0.5,
               what=f"describe through a and b naming the runners {want}")
    out = cli.run("describe", "--mirror", mirrors[0]).stdout
    assert f"Run by: {want[mirrors[0]]}" in out, out
    # list through either shows both instances as each reported itself (every 10 s): what it runs.
    runs = {names[p.name]: sorted(m for m, v in r.items() if v == [p.name]) for p in proxies}

    def listed(p):
        doc, _ = Cli(kmirror_bin, p.bootstrap).json("list")
        return {i["id"]: (sorted(set(i["owned_mirrors"]) & set(mirrors)), i["is_self"], i["pipelines"])
                for i in doc["instances"] if i["id"] in runs}
    wait_until(lambda: all(listed(p) == {n: (runs[n], n == names[p.name], "owned") for n in runs} for p in proxies),
               30, 1.0, what=f"list through a and b showing both instances running {runs}")
    doc, _ = Cli(kmirror_bin, b.bootstrap).json("list")
    mine = [i for i in doc["instances"] if i["id"] in runs]
    print("instances:", mine)
    assert all(0 <= i["report_age_ms"] < 15000 and i["state_delay_ms"] >= -1 for i in mine), mine
    out = cli.run("list").stdout
    assert all(n in out for n in runs) and "(this one)" in out, out

    # SIGTERM a: it leaves the group, b runs every mirror at once.
    gained = b.metric('kmirror_mirror_handovers_total{direction="gained"}')
    a.stop()
    r = owners_settle([b])
    assert all(v == [b.name] for v in r.values()), r
    assert b.metric("kmirror_mirrors_owned") == SLOTS
    assert b.metric('kmirror_mirror_handovers_total{direction="gained"}') == gained + owned[a.name]
    exact([b], "a stopped")

    # a comes back: the mirrors are shared again, handed over from b.
    a.start()
    wait_until(lambda: settled(dest_cluster, state_topic, 2), timeout=60, what="a back in the group")
    r = owners_settle(proxies)
    assert {n for v in r.values() for n in v} == {a.name, b.name}, r
    exact(proxies, "a back")
    handed = sum(a.output().count(f"mirror {m}: its pipeline runs in this kmirrord now (group __kmirror-sync)") for m in mirrors)
    print(f"mirrors handed back to a: {handed}")

    # SIGSTOP of a past its session timeout (10 s on the test brokers): b takes its mirrors over and
    # mirrors on; after SIGCONT a finds its lease stale and writes nothing more.
    a_owned = [m for m, v in r.items() if v == [a.name]]
    assert a_owned, r

    def batches(p):
        m = p.metrics()
        return sum(v for k, v in m.items() if k.startswith("kmirror_mirror_batches_total{")
                   and any(f'mirror="{x}"' in k for x in a_owned))
    mark = len(a.output())
    a.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        r = owners_settle([b])
        print(f"b runs a's mirrors {a_owned} {time.monotonic() - t0:.1f} s after a's SIGSTOP")
        for t in topics:
            produce_records(source_cluster.bootstrap, t, N, tag="paused")
        time.sleep(2)
    finally:
        a.signal(signal.SIGCONT)
    for m in a_owned:
        a.wait_log(rf"mirror {m}: its pipeline stops here", timeout=15, start=mark)
    before = batches(a)
    time.sleep(3)
    assert batches(a) == before, "a wrote batches of its former mirrors after SIGCONT"
    wait_until(lambda: settled(dest_cluster, state_topic, 2), timeout=60, what="a back in the group after SIGCONT")
    r = owners_settle(proxies)
    print("runners after SIGCONT:", r)
    exact(proxies, "a paused and resumed")

    # kill -9 of a: the group expires it (its session timeout), b takes its mirrors over.
    a_owned = [m for m, v in r.items() if v == [a.name]] or a_owned
    a.signal(signal.SIGKILL)
    a.daemon.proc.wait(timeout=30)
    t0 = time.monotonic()
    r = owners_settle([b])
    print(f"b runs a's mirrors {a_owned} {time.monotonic() - t0:.1f} s after a's kill -9")
    exact([b], "a killed")
    for m in a_owned:
        assert f"mirror {m}: its pipeline runs in this kmirrord now (group __kmirror-sync)" in b.output(), m

    # On disk: one writer per mirror, whichever kmirrord wrote, its epochs never going back.
    for t in topics:
        for part in range(PARTS):
            data = [x for x in partition_batches(dest_cluster, t, part) if not x["control"] and not x["txn"]]
            pids = {x["pid"] for x in data}
            epochs = [x["pepoch"] for x in data]
            assert len(pids) == 1, f"{t}-{part}: data batches of producer ids {sorted(pids)}"
            assert epochs == sorted(epochs), f"{t}-{part}: epochs go back: {epochs}"
            print(f"{t}-{part}: {len(data)} batches, producer id {pids.pop()}, epochs {sorted(set(epochs))}")


def test_restart_takes_its_own_place(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    """A kmirrord killed with -9 and started again with the same configuration is the same member of
    __kmirror-sync (its member id comes from its instance name, HTTP listener and state topic): it
    takes its earlier life's place and runs its mirrors again at once, not after the group has
    expired the dead member (the session timeout: 10 s on the test brokers, 45 s by default). Kafka
    4.4's coordinator takes the rejoin of a known member id at epoch 0; one that fences it is
    answered by heartbeating at the epoch ConsumerGroupDescribe shows for it."""
    tag = uuid.uuid4().hex[:6]
    state_topic = f"__mirror_state_own_{tag}"
    a = proxy_factory(dest_cluster, name="kmirrord-own-solo", mirror_state_topic=state_topic,
                      mirror_state_partitions=SLOTS, mirror_pipelines="owned")
    cli = Cli(kmirror_bin, a.bootstrap)
    mirror, topic = f"solo-{tag}", f"solo-{tag}"
    source_cluster.create_topic(topic, partitions=PARTS)
    produce_records(source_cluster.bootstrap, topic, N, tag="s0")
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    cli.run("start", "--mirror", mirror, "--topics", topic)
    wait_caught_up(a.bootstrap, source_cluster.bootstrap, topic, PARTS, timeout=120, stall=60)

    a.signal(signal.SIGKILL)
    a.daemon.proc.wait(timeout=30)
    produce_records(source_cluster.bootstrap, topic, N, tag="s1")
    t0 = time.monotonic()
    a.start()
    wait_caught_up(a.bootstrap, source_cluster.bootstrap, topic, PARTS, timeout=120, stall=60)
    took = time.monotonic() - t0
    print(f"restarted and caught up in {took:.1f} s")
    assert took < 8, f"{took:.1f} s: the restart waited for the group to expire its earlier life"
    compare_topic(a.bootstrap, source_cluster.bootstrap, topic, PARTS)


def at_head(inst, topic, offset, seconds=2.0):
    """(records, error events) a librdkafka consumer through inst gets from offset on within seconds."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer(inst.conf(**{"group.id": f"head-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                              "isolation.level": "read_uncommitted"}))
    got, errors = [], []
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None:
                (errors if m.error() else got).append(m.error() or (m.offset(), m.value()))
    finally:
        c.close()
    return got, errors


def steady_delays(source_cluster, topic, start, owner, follower, rate=100, seconds=6.0):
    """Records produced at rate for seconds, read at the head through owner and follower; prints the
    follower's delay behind the owner per record (p50, p99, max) and returns how many were produced."""
    import threading
    from confluent_kafka import Consumer, Producer, TopicPartition
    seen = {owner.name: {}, follower.name: {}}
    stop = threading.Event()

    def read(inst):
        c = Consumer(inst.conf(**{"group.id": f"lag-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                                  "fetch.wait.max.ms": 100}))
        c.assign([TopicPartition(topic, 0, start)])
        try:
            while not stop.is_set():
                m = c.poll(0.05)
                if m is not None and not m.error():
                    seen[inst.name].setdefault(m.offset(), time.monotonic())
        finally:
            c.close()
    threads = [threading.Thread(target=read, args=(i,)) for i in (owner, follower)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # both consumers assigned and at the head
    p = Producer({"bootstrap.servers": source_cluster.bootstrap, "linger.ms": 0})
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        p.produce(topic, f"lag-{n}".encode(), partition=0)
        p.poll(0)
        n += 1
        time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
    p.flush(30)
    wait_until(lambda: all(len(v) >= n for v in seen.values()), 60, 0.2, "both to read every record")
    stop.set()
    for t in threads:
        t.join(30)
    d = sorted(seen[follower.name][o] - seen[owner.name][o] for o in range(start, start + n))
    q = lambda f: d[min(len(d) - 1, int(f * len(d)))] * 1000
    print(f"follower behind owner over {n} records at {rate}/s: p50 {q(0.5):.0f} ms, p99 {q(0.99):.0f} ms, "
          f"max {d[-1] * 1000:.0f} ms")
    assert q(0.99) < 2000, d[-10:]
    return n


def test_follower_shows_only_the_owners_progress(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    """An instance that does not run a mirror shows its partitions up to the progress the owner
    persisted, never past it (docs/state.md, "What a reader is shown"). First the follower keeps up
    as the owner mirrors on (the progress reaches it). Then a record written straight into the
    paused mirror topic on the destination lies past the mirror's tail: the owner hides it (its
    pipeline holds the tail); the follower used to extend the open run over it and show it at the
    next source offset, with the high watermark one past it."""
    from confluent_kafka import Producer
    from mirror_cli import wait_states
    from mirror_data import read_partition, watermarks
    tag = uuid.uuid4().hex[:6]
    state_topic = f"__mirror_state_own_{tag}"
    opts = dict(mirror_state_topic=state_topic, mirror_state_partitions=1, mirror_pipelines="owned")
    a = proxy_factory(dest_cluster, name="kmirrord-prog-a", **opts)
    cli = Cli(kmirror_bin, a.bootstrap)
    mirror, topic = f"prog-{tag}", f"prog-{tag}"
    source_cluster.create_topic(topic, partitions=1)
    produce_records(source_cluster.bootstrap, topic, 20, tag="p0")
    cli.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    cli.run("start", "--mirror", mirror, "--topics", topic)
    wait_caught_up(a.bootstrap, source_cluster.bootstrap, topic, 1, timeout=120, stall=60)
    b = proxy_factory(dest_cluster, name="kmirrord-prog-b", **opts)
    wait_until(lambda: len(runners([a, b], [mirror], window=1.5)[mirror]) == 1 and
               a.metric("kmirror_mirrors_owned") + b.metric("kmirror_mirrors_owned") == 1, 60,
               what="one of a and b running the mirror")
    r = runners([a, b], [mirror], window=1.5)
    owner, follower = (a, b) if r[mirror] == [a.name] else (b, a)
    produce_records(source_cluster.bootstrap, topic, 20, start=20, tag="p1")
    for inst in (owner, follower):
        wait_caught_up(inst.bootstrap, source_cluster.bootstrap, topic, 1, timeout=60, stall=30)
        compare_topic(inst.bootstrap, source_cluster.bootstrap, topic, 1)
    # How far behind the owner the follower shows records: a steady 100 records a second for 6 s,
    # read at the head through both; the delay is the progress interval (200 ms) plus a follow round.
    end = 40 + steady_delays(source_cluster, topic, 40, owner, follower)
    for inst in (owner, follower):
        wait_caught_up(inst.bootstrap, source_cluster.bootstrap, topic, 1, timeout=60, stall=30)
    cli.run("pause", "--mirror", mirror, "--topics", topic)
    wait_states(cli, mirror, {topic: "PAUSED"}, timeout=60)
    p = Producer({"bootstrap.servers": dest_cluster.bootstrap, "enable.idempotence": False})
    p.produce(topic, key=b"foreign", value=b"written on the destination", partition=0)
    assert p.flush(30) == 0
    time.sleep(1.0)  # the follower's follow rounds and metadata have seen whatever they will
    src = [(x.offset, x.value) for x in read_partition(source_cluster.bootstrap, topic, 0, 0, end)]
    for inst in (follower, owner):
        hw = watermarks(inst.bootstrap, topic, 1)[0][1]
        seen = [(x.offset, x.value) for x in read_partition(inst.bootstrap, topic, 0, 0, end)]
        past = at_head(inst, topic, end)
        print(f"{inst.name} ({'owner' if inst is owner else 'follower'}): high watermark {hw}, "
              f"{len(seen)} records, past them {past}")
        assert hw == end and seen == src and past == ([], []), (inst.name, hw, seen[-2:], past)


def test_paused_owners_queued_state_writes_are_dropped(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    """An owner of six mirrors paused with state writes queued (its progress, every 200 ms per mirror, waiting
    behind one the destination has not answered yet) wakes after the other kmirrord took its mirrors
    over and mirrored on. Its queued writes must not land after the new owner's (docs/state.md,
    "Writes of a former owner"): a progress behind the new owner's would move the mirror's last
    mirrored offset back, and every instance that does not run the mirror would show the mirror
    topic up to that older offset (a high watermark going back) until the next record moves it.
    Whether writes are queued at the pause depends on timing (a's log says how many it dropped: 5,
    0, 4 in three runs with six mirrors); a kmirrord without the check failed here, with three
    mirrors, two of them ending at 2,400 through a against 8,000 through b."""
    from mirror_data import BackgroundProducer, watermarks
    tag = uuid.uuid4().hex[:6]
    state_topic = f"__mirror_state_own_{tag}"
    opts = dict(mirror_state_topic=state_topic, mirror_state_partitions=1, mirror_pipelines="owned")
    a = proxy_factory(dest_cluster, name="kmirrord-stale-a", **opts)
    cli = Cli(kmirror_bin, a.bootstrap)
    mirrors = [f"stale-{tag}-{i}" for i in range(6)]
    for m in mirrors:
        source_cluster.create_topic(m, partitions=1)
        cli.run("create", "--mirror", m, "--source-bootstrap", source_cluster.bootstrap)
        cli.run("start", "--mirror", m, "--topics", m)
    bg = [BackgroundProducer(source_cluster.bootstrap, m, tag="s", rate=200).start() for m in mirrors]
    try:
        wait_until(lambda: all(watermarks(a.bootstrap, m, 1)[0][1] > 300 for m in mirrors), 60,
                   what="a mirroring the topics")
        b = proxy_factory(dest_cluster, name="kmirrord-stale-b", **opts)
        wait_until(lambda: all(v == [a.name] for v in runners([a, b], mirrors, window=1.0).values()), 60,
                   what="a running the mirrors, b beside it")
        broker = dest_cluster.nodes[dest_cluster.broker_ids[0]].pid
        # The destination stops answering: a's progress writes queue behind the one in flight.
        os.kill(broker, signal.SIGSTOP)
        try:
            time.sleep(1.5)
            a.signal(signal.SIGSTOP)
        finally:
            os.kill(broker, signal.SIGCONT)
        mark = len(a.output())
        try:
            wait_until(lambda: all(v == [b.name] for v in runners([b], mirrors, window=1.0).values()), 90,
                       what="b running a's mirrors")
            time.sleep(2.0)
        finally:
            for p in bg:
                p.stop()
        for m in mirrors:
            wait_caught_up(b.bootstrap, source_cluster.bootstrap, m, 1, timeout=120, stall=60)
        time.sleep(1.0)  # b's last progress written
        ends = {m: watermarks(b.bootstrap, m, 1)[0][1] for m in mirrors}
    finally:
        a.signal(signal.SIGCONT)
    time.sleep(3.0)  # a wakes, retires, its queued writes come up, it follows b's state
    dropped = [ln for ln in a.output()[mark:].splitlines() if "its pipeline's write is dropped" in ln]
    seen = {m: watermarks(a.bootstrap, m, 1)[0][1] for m in mirrors}
    print(f"after a's wake: b's ends {ends}, through a {seen}; dropped by a: {len(dropped)}")
    assert seen == ends, f"through the former owner the mirrors end at {seen}, not at the new owner's {ends}"
    assert seen == {m: watermarks(b.bootstrap, m, 1)[0][1] for m in mirrors}


def _owner_then_other(kmirror_bin, dst, source_cluster, proxy_factory, kind, partitions, rate, state_partitions,
                      a_opts=None, source_bootstrap=None):
    """A mirror of one topic (partitions partitions) started through kmirrord-<kind>-a under a load
    of rate records a second at the source (the mirror reads it at source_bootstrap, by default the
    cluster's own); kmirrord-<kind>-b started beside it once a runs the mirror. Returns (a, b,
    cli_a, cli_b, mirror, load): the caller stops the load."""
    from mirror_data import BackgroundProducer
    tag = uuid.uuid4().hex[:6]
    opts = dict(mirror_state_topic=f"__mirror_state_{kind}_{tag}", mirror_state_partitions=state_partitions,
                mirror_pipelines="owned")
    a = proxy_factory(dst, name=f"kmirrord-{kind}-a", **opts, **(a_opts or {}))
    m = f"{kind}-{tag}"
    source_cluster.create_topic(m, partitions=partitions)
    cli_a = Cli(kmirror_bin, a.bootstrap)
    cli_a.run("create", "--mirror", m, "--source-bootstrap", source_bootstrap or source_cluster.bootstrap)
    cli_a.run("start", "--mirror", m, "--topics", m)
    bg = BackgroundProducer(source_cluster.bootstrap, m, tag=kind[0], rate=rate).start()
    try:
        wait_until(lambda: runners([a], [m], window=1.0)[m] == [a.name], 60, what="a running the mirror")
        b = proxy_factory(dst, name=f"kmirrord-{kind}-b", **opts)
        wait_until(lambda: runners([a, b], [m], window=1.0)[m] == [a.name], 60, what="a running it, b beside it")
    except BaseException:
        bg.stop()
        raise
    return a, b, cli_a, Cli(kmirror_bin, b.bootstrap), m, bg


def _own_listener(cluster, name):
    """cluster's brokers' extra listener name (a KafkaCluster made with extra_listeners={name: {}}),
    advertised at its own ports; returns those ports."""
    cluster.extra_listeners[name] = {n.node_id: f"127.0.0.1:{n.extra_ports[name]}" for n in cluster.broker_nodes}
    return [n.extra_ports[name] for n in cluster.broker_nodes]


@contextlib.contextmanager
def _cuttable_owner(kmirror_bin, source_cluster, proxy_factory, kind, rate, source_bootstrap=None):
    """A 1-broker destination of its own with a listener for kmirrord a alone (UP_A), so that its
    packets can be dropped (NetFaults); a runs a mirror of one 1-partition topic under rate records
    a second at the source (_owner_then_other), b beside it. Yields (dst, net, a_ports, a, b, cli_b,
    m, bg), a mirroring past rate records; the caller stops the load."""
    from mirror_data import watermarks
    tag = uuid.uuid4().hex[:6]
    dst = KafkaCluster(f"owners-{kind}-{tag}", brokers=1, extra_listeners={"UP_A": {}})
    a_ports = _own_listener(dst, "UP_A")
    net = NetFaults(tag)
    dst.start()
    try:
        net.setup()
        a, b, _, cli_b, m, bg = _owner_then_other(kmirror_bin, dst, source_cluster, proxy_factory, kind, 1, rate, 1,
                                                  a_opts={"upstream": ",".join(f"127.0.0.1:{p}" for p in a_ports)},
                                                  source_bootstrap=source_bootstrap)
        try:
            wait_until(lambda: watermarks(a.bootstrap, m, 1)[0][1] > rate, 60, what="a mirroring the topic")
        except BaseException:
            bg.stop()
            raise
        yield dst, net, a_ports, a, b, cli_b, m, bg
    finally:
        try:
            net.teardown()
        finally:
            dst.stop()


@pytest.mark.skipif(not NetFaults.available(),
                    reason="network cuts need nft and root (scripts/install-deps.sh installs nftables)")
def test_former_owners_write_after_a_cut_does_not_undo_the_new_owners(kmirror_bin, source_cluster, proxy_factory):
    """The owner of a mirror is cut from the destination (its packets dropped) with a progress
    write in flight. The other kmirrord takes the mirror over and mirrors to the source's end; then
    the link comes back. The former owner's write reaches the broker after the new owner's last
    progress (the kernel retransmits the request, or the store retries it: the soak's finding 14,
    docs/reliability.md). Nothing may leave that older progress standing: every instance that does
    not run the mirror shows what the record says, and a mirror that moves no more writes no more.
    Before the fix, the former owner showed the mirror topic ending where it was cut, for good."""
    from mirror_data import watermarks
    with _cuttable_owner(kmirror_bin, source_cluster, proxy_factory, "cut", 300) as (_, net, a_ports, a, b, _, m, bg):
        try:
            net.cut(a_ports, reset=False)
            t0 = time.monotonic()
            wait_until(lambda: runners([b], [m], window=1.0)[m] == [b.name], 60, what="b running the mirror")
            print(f"b runs the mirror {time.monotonic() - t0:.1f} s into the cut")
        finally:
            bg.stop()
        wait_caught_up(b.bootstrap, source_cluster.bootstrap, m, 1, timeout=60, stall=30)
        end = watermarks(source_cluster.bootstrap, m, 1)[0][1]
        time.sleep(1.5)  # b's last progress written
        mark = len(a.output())
        # Long enough for a's request to time out while cut, as in the soak (kmirrord's 30 s).
        time.sleep(max(0.0, 32.0 - (time.monotonic() - t0)))
        net.heal()
        print(f"healed {time.monotonic() - t0:.1f} s after the cut; the source ends at {end}")
        # a's requests come through (retransmitted, or retried), it follows b's state.
        time.sleep(8.0)
        seen = []
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            seen.append(watermarks(a.bootstrap, m, 1)[0][1])
            if seen[-1] == end and len(seen) > 3 and seen[-3:] == [end] * 3:
                break
            time.sleep(1.0)
        print(f"through the former owner after the heal: {seen}")
        print("\n".join(ln for ln in a.output()[mark:].splitlines() if "__mirror_state_cut" in ln)[-2000:])
        assert seen[-1] == end, (f"through the former owner the mirror ends at {seen[-1]}, not at the new "
                                 f"owner's {end}")
        assert watermarks(b.bootstrap, m, 1)[0][1] == end


@pytest.mark.skipif(not NetFaults.available(),
                    reason="network cuts need nft and root (scripts/install-deps.sh installs nftables)")
def test_former_owners_late_write_is_hidden_when_it_gets_the_mirror_back(kmirror_bin, proxy_factory):
    """The soak's finding 32 (docs/reliability.md). The owner a is cut from the destination with
    Produce requests of the mirror in its socket, and the source from both kmirrords (the mirror
    reads it on a listener of its own). b takes the mirror over and reconciles: its writer, the
    mirror's producer at the next epoch, is persisted to start at the destination's end, but b has
    nothing to write. The link comes back and the kernel delivers a's requests: the broker appends
    them after b's start (b wrote nothing with the new epoch that would fence them). Then b stops
    and a gets the mirror back. Those batches are the mirror's own producer's at an older epoch:
    an earlier writer's, not a client's. Before the fix, a's reconcile took them for a foreign
    write and FAILED the partition; now they are hidden and mirrored again, and every record reads
    the same through a as at the source."""
    from mirror_cli import topic_states
    from mirror_data import watermarks
    tag = uuid.uuid4().hex[:6]
    src = KafkaCluster(f"owners-late-src-{tag}", brokers=1, extra_listeners={"MIRROR": {}})
    src_ports = _own_listener(src, "MIRROR")
    src_net = NetFaults(f"s{tag}")
    src.start()
    try:
        src_net.setup()
        with _cuttable_owner(kmirror_bin, src, proxy_factory, "late", 500,
                             source_bootstrap=f"127.0.0.1:{src_ports[0]}") as (dst, net, a_ports, a, b, cli_b, m, bg):
            try:
                net.cut(a_ports, reset=False)
                t0 = time.monotonic()
                time.sleep(0.3)  # a fetches on meanwhile: its Produce requests wait in the cut link
            finally:
                bg.stop()
            src_net.cut(src_ports, reset=False)
            mark_b = len(b.output())
            wait_until(lambda: "resumes at offset" in b.output()[mark_b:], 60, what="b reconciled the mirror")
            held = watermarks(dst.bootstrap, m, 1)[0][1]
            print(f"b reconciled {time.monotonic() - t0:.1f} s into the cut; the destination ends at {held}")
            time.sleep(max(0.0, 20.0 - (time.monotonic() - t0)))
            net.heal()
            # The kernel's next retransmission of a's requests (its backoff doubles: 12.6 s, then 25.4 s).
            time.sleep(max(0.0, 36.0 - (time.monotonic() - t0)))
            late = watermarks(dst.bootstrap, m, 1)[0][1] - held
            print(f"healed; {late} offset(s) of a's landed after b's start at {held}")
            assert late > 0, "a's held requests did not land: the test did not set up the race"
            mark_a = len(a.output())
            b.stop()
            wait_until(lambda: "its pipeline runs in this kmirrord now" in a.output()[mark_a:], 60,
                       what="a running the mirror again")
            wait_until(lambda: any(w in a.output()[mark_a:] for w in ("resumes at offset", "not written by the mirror")),
                       30, what="a's reconcile")
            time.sleep(1.0)  # a FAILED partition is persisted
            print("\n".join(ln for ln in a.output()[mark_a:].splitlines() if m in ln)[-3000:])
            cli_a = Cli(kmirror_bin, a.bootstrap)
            assert topic_states(cli_a, m)[m] == ["MIRRORING"], "a took its own late batches for a foreign write"
            src_net.heal()
            wait_caught_up(a.bootstrap, src.bootstrap, m, 1, timeout=60, stall=30)
            end = watermarks(src.bootstrap, m, 1)[0][1]
            total, _ = compare_topic(a.bootstrap, src.bootstrap, m, 1, marks=[(0, end)])
            assert total == end
    finally:
        try:
            src_net.teardown()
        finally:
            src.stop()


@pytest.mark.skipif(not NetFaults.available(),
                    reason="network cuts need nft and root (scripts/install-deps.sh installs nftables)")
def test_former_owners_write_held_in_a_cut_lands_nowhere_after_a_stop(kmirror_bin, source_cluster, proxy_factory):
    """The owner of a moving mirror is cut from the destination (its packets dropped) with Produce
    requests of the mirror in its socket; the topic is stopped through the other kmirrord, which
    takes the mirror over, finds the partition STOPPING and settles it. Then the link comes back and
    the kernel delivers the former owner's requests. They must not land after the stop point: local
    records written after the stop would follow them, and a start would hide more than was written
    here (the soak's finding 27, docs/reliability.md). Before the fix they landed: the stop had
    written nothing with the new epoch of the mirror's writer, so the broker took the older one.
    When the cut also holds a progress write of the former owner, it lands late the same way; it
    used to take the new owner's settle away and move the stop point back to that progress, and
    the dry run then counted the mirrored records past it too (finding 29)."""
    from mirror_cli import described, topic_states
    from mirror_data import read_partition, watermarks
    with _cuttable_owner(kmirror_bin, source_cluster, proxy_factory, "seal", 500) as (dst, net, a_ports, a, b, cli_b,
                                                                                     m, bg):
        try:
            net.cut(a_ports, reset=False)
            t0 = time.monotonic()
            cli_b.run("stop", "--mirror", m, "--topics", m)
            time.sleep(2.0)  # a fetches on meanwhile: its Produce requests wait in the cut link
        finally:
            bg.stop()
        # b settles it once a's session has expired and the mirror is b's.
        wait_until(lambda: topic_states(cli_b, m)[m] == ["STOPPED"], 90, what="the stop settled by b")
        (t,) = [t for t in described(cli_b, m)["topics"] if t["name"] == m]
        (stopped,) = [p["mirrored_offset"] for p in t["partitions"]]
        raw = watermarks(dst.bootstrap, m, 1)[0][1]
        print(f"b settled the stop at {stopped} {time.monotonic() - t0:.1f} s into the cut; the destination "
              f"ends at {raw}")
        mark = len(a.output())
        time.sleep(max(0.0, 20.0 - (time.monotonic() - t0)))
        net.heal()
        # The kernel's next retransmission of a's requests (its backoff doubles: 12.6 s, then 25.4 s).
        time.sleep(max(0.0, 36.0 - (time.monotonic() - t0)))
        late = watermarks(dst.bootstrap, m, 1)[0][1] - raw
        print(f"healed; {late} offset(s) written on the destination since the stop settled")
        print("\n".join(ln for ln in a.output()[mark:].splitlines() if m in ln)[-3000:])
        assert watermarks(b.bootstrap, m, 1)[0][1] == stopped, "readers through b see past the stop point"
        assert late == 0, f"{late} offset(s) of the former owner landed after the stop at {stopped}"
        # The one destination offset past the stop point is the seal, which b's writer wrote.
        (seal,) = read_partition(dst.bootstrap, m, 0, stopped, stopped + 1)
        assert raw == stopped + 1 and seal.key.startswith(b"kmirror.seal/"), (raw, seal)
        # What a drill writes here now follows the stop point, and a start would hide exactly that.
        produce_records(b.bootstrap, m, 3, start=1000, tag="local", partitions=1)
        assert watermarks(b.bootstrap, m, 1)[0][1] == stopped + 3
        dry = Cli(kmirror_bin, b.bootstrap).json("start", "--dry-run", "--mirror", m, "--topics", m)[0]
        (dt,) = dry["topics"]
        assert [p["records_hidden"] for p in dt["partitions"]] == [3], dt


def test_owner_whose_heartbeats_are_refused_claims_nothing_while_it_looks_for_the_coordinator(
        kmirror_bin, source_cluster, proxy_factory):
    """The soak's finding 36 (docs/reliability.md). The owner's heartbeats are answered
    NOT_COORDINATOR (a shim in front of its own listener answers them: the destination's coordinator
    answers the other kmirrord, which a broker does not do on demand for one member), so its lease
    goes to look for the coordinator, again and again, and no heartbeat of its is answered. It lets go
    of the mirror 1.5 heartbeat intervals after the last answer, and the group gives the mirror to
    the other kmirrord at its session timeout. It must claim nothing back, neither its metadata sync
    nor its pipeline (a stop's transition read meanwhile), until a heartbeat says the mirror is its
    own. Before the fix the silence counted only in the heartbeat phase: each lookup made it an
    owner again on its old assignment: its metadata sync ran on beside b's, and in the soak a stop
    read then resumed its pipeline beside the new owner's, whose late batches broke the stop (a seal
    inside the mirrored records)."""
    from mirror_cli import described, topic_states
    from mirror_data import watermarks
    tag = uuid.uuid4().hex[:6]
    dst, shim = shimmed_cluster(f"owners-shim-{tag}", "UP_A")  # a's connections all go through the shim
    dst.start()
    try:
        a, b, _, cli_b, m, bg = _owner_then_other(kmirror_bin, dst, source_cluster, proxy_factory, "shim", 1, 300, 1,
                                                  a_opts={"upstream": f"127.0.0.1:{shim.port}"})
        try:
            wait_until(lambda: watermarks(a.bootstrap, m, 1)[0][1] > 300, 60, what="a mirroring the topic")
            mark = len(a.output())
            shim.answer(68, not_coordinator_heartbeat)  # ConsumerGroupHeartbeat
            t0 = time.monotonic()
            wait_until(lambda: "its pipeline stops here" in a.output()[mark:], 20,
                       what="a letting go of the mirror")
            wait_until(lambda: runners([b], [m], window=1.0)[m] == [b.name], 60, what="b running the mirror")
            print(f"b runs the mirror {time.monotonic() - t0:.1f} s after a's heartbeats were refused")
        finally:
            bg.stop()
        # A transition a reads while it looks for the coordinator.
        cli_b.run("stop", "--mirror", m, "--topics", m)
        wait_until(lambda: topic_states(cli_b, m)[m] == ["STOPPED"], 60, what="the stop settled by b")
        time.sleep(max(0.0, 25.0 - (time.monotonic() - t0)))
        print("\n".join(ln for ln in a.output()[mark:].splitlines() if "comp=mirror" in ln)[-4000:])
        after = a.output()[mark:].split("its pipeline stops here", 1)[1]
        claims = [ln for ln in after.splitlines()
                  if "metadata sync runs in this kmirrord now" in ln or "its pipeline runs in this kmirrord" in ln
                  or "resumes at offset" in ln]
        refused = shim.answered[68]
        shim.answer(68, None)
        assert refused >= 3, f"only {refused} heartbeat(s) of a were refused: the test did not set up the fault"
        assert "metadata sync moved to another kmirrord" in a.output()[mark:], \
            "a's metadata sync ran on, beside b's, with no heartbeat of a answered"
        assert not claims, f"a, with no heartbeat answered, took the mirror back: {claims[:3]}"
        # The stop point holds through both, and every record before it is the source's.
        (t,) = [t for t in described(cli_b, m)["topics"] if t["name"] == m]
        (stopped,) = [p["mirrored_offset"] for p in t["partitions"]]
        for p in (a, b):
            wait_until(lambda: watermarks(p.bootstrap, m, 1)[0][1] == stopped, 30,
                       what=f"{p.name} showing the stop point {stopped}")
        total, _ = compare_topic(b.bootstrap, source_cluster.bootstrap, m, 1, marks=[(0, stopped)])
        assert total == stopped
    finally:
        try:
            dst.stop()
        finally:
            shim.stop()


def test_stop_through_the_other_kmirrord_is_not_undone(kmirror_bin, dest_cluster3, source_cluster, proxy_factory):
    """A stop sent to the kmirrord that does not run the mirror, while the mirror moves (its owner
    writes its progress every 200 ms): the stop is acknowledged, so it must happen. Before the fix,
    the owner's progress write rewrote the partition's whole record from a view that had not seen
    the stop yet, and the partition went back to MIRRORING (the soak's finding 11,
    docs/reliability.md): the stop lost, the next start refused. Rounds of stop and start through
    the other kmirrord; each stop must reach STOPPED on both, and stay there."""
    from mirror_cli import topic_states
    a, b, cli_a, cli_b, m, bg = _owner_then_other(kmirror_bin, dest_cluster3, source_cluster, proxy_factory, "stop",
                                                  4, 2000, SLOTS)
    try:
        for rnd in range(8):
            wait_until(lambda: set(topic_states(cli_b, m)[m]) == {"MIRRORING"}, 60, what=f"round {rnd}: mirroring")
            time.sleep(0.5 + 0.3 * rnd)  # the owner's progress moving, written at various phases
            cli_b.run("stop", "--mirror", m, "--topics", m)
            _stop_stands(cli_a, cli_b, m, rnd)
            # Where the stop left each partition (a drill's start hides what was written after it) is
            # the destination's end: every record mirrored before the stop counts. What the map hides
            # is a stop's seal each (a stop settled before the writer's epoch wrote: the mirror may
            # have moved from a to b with a round's start): the destination holds the records up to
            # the stop point and those, nothing else.
            from mirror_cli import described
            from mirror_data import watermarks
            ends = [hi for _, hi in watermarks(dest_cluster3.bootstrap, m, 4)]
            for c in (cli_a, cli_b):
                (t,) = [t for t in described(c, m)["topics"] if t["name"] == m]
                parts = sorted(t["partitions"], key=lambda p: p["partition"])
                stopped = [p["mirrored_offset"] for p in parts]
                held = [p["mirrored_offset"] + (p.get("records_hidden") or 0) for p in parts]
                assert held == ends, (f"round {rnd}: stopped at {stopped}, {[p.get('records_hidden') for p in parts]} "
                                      f"hidden, the destination ends at {ends}")
                assert [hi for _, hi in watermarks(c.bootstrap, m, 4)] == stopped, f"round {rnd}"
            cli_b.run("start", "--mirror", m, "--topics", m)
    finally:
        bg.stop()


def _stop_stands(cli_a, cli_b, m, rnd):
    """A stop of topic m just acknowledged: it settles STOPPED through both kmirrords and stays
    there; a partition seen PREPARING or MIRRORING again past a follower's lag means it was undone."""
    from mirror_cli import topic_states
    t0 = time.monotonic()
    seen = []
    while time.monotonic() - t0 < 30:
        st = [tuple(topic_states(c, m)[m]) for c in (cli_a, cli_b)]
        seen.append(st)
        if all(set(s) == {"STOPPED"} for s in st):
            break
        undone = any("MIRRORING" in s or "PREPARING" in s for s in st)
        assert not (undone and time.monotonic() - t0 > 0.5), \
            f"round {rnd}: the stop was acknowledged and then undone (states through a and b): {st}"
        time.sleep(0.1)
    print(f"round {rnd}: {time.monotonic() - t0:.1f} s, last seen {seen[-1]}")
    if not all(set(s) == {"STOPPED"} for s in seen[-1]):
        from mirror_cli import described
        (t,) = [t for t in described(cli_b, m)["topics"] if t["name"] == m]
        print([(p["partition"], p["state"], p.get("last_error")) for p in t["partitions"] if p["state"] != "STOPPED"])
    wait_until(lambda: all(set(topic_states(c, m)[m]) == {"STOPPED"} for c in (cli_a, cli_b)), 60,
               what=f"round {rnd}: stopped")
    time.sleep(1.0)
    assert all(set(topic_states(c, m)[m]) == {"STOPPED"} for c in (cli_a, cli_b)), f"round {rnd}: undone later"


def test_stop_right_after_a_start_through_the_other_kmirrord_is_not_undone(kmirror_bin, dest_cluster3,
                                                                            source_cluster, proxy_factory):
    """A start through the kmirrord that does not run the mirror, then a stop through it a moment
    later, while the owner reconciles the partitions the start gave it: the owner persisted each
    partition's writer by rewriting the partition's record from its view, which had not seen the
    stop yet, and the partition went back to PREPARING, then MIRRORING: the stop, acknowledged, was
    lost, and the next start refused (the soak's finding 24, docs/reliability.md). Rounds with the
    stop at various delays after the start; each stop must settle STOPPED on both and stay."""
    from mirror_cli import topic_states
    a, b, cli_a, cli_b, m, bg = _owner_then_other(kmirror_bin, dest_cluster3, source_cluster, proxy_factory, "rstop",
                                                  8, 2000, SLOTS)
    try:
        wait_until(lambda: set(topic_states(cli_b, m)[m]) == {"MIRRORING"}, 60, what="mirroring")
        cli_b.run("stop", "--mirror", m, "--topics", m)
        _stop_stands(cli_a, cli_b, m, "first")
        for rnd in range(12):
            cli_b.run("start", "--mirror", m, "--topics", m)
            time.sleep(0.04 * rnd)  # the stop lands at various phases of the owner's reconciles
            cli_b.run("stop", "--mirror", m, "--topics", m)
            _stop_stands(cli_a, cli_b, m, rnd)
    finally:
        bg.stop()


def _killed_then_stopped(victim, cli, m):
    """The kmirrord running mirror m killed -9, then topic m stopped through another one (cli)."""
    victim.signal(signal.SIGKILL)
    victim.daemon.proc.wait(timeout=30)
    cli.run("stop", "--mirror", m, "--topics", m)


def _stopped_at_the_destinations_end(dest_cluster, proxy, cli, m, partitions=2):
    """Mirror m's topic m settles STOPPED (through proxy) at the destination's end: its stop point,
    the mirrored offset of each partition, is where the mirrored records end there, and readers
    through proxy see the topic end at it. The one destination offset past it is the stop's seal
    (the new owner settled the stop before any batch of its writer's epoch was in: docs/mirror.md,
    "The stop's seal"), hidden from readers through kmirrord."""
    from mirror_cli import described, topic_states
    from mirror_data import read_partition, watermarks
    wait_until(lambda: set(topic_states(cli, m)[m]) == {"STOPPED"}, 90, 0.2, what=f"the stop settled by {proxy.name}")
    ends = [hi for _, hi in watermarks(dest_cluster.bootstrap, m, partitions)]
    (t,) = [t for t in described(cli, m)["topics"] if t["name"] == m]
    stopped = [p["mirrored_offset"] for p in sorted(t["partitions"], key=lambda p: p["partition"])]
    print(f"stopped at {stopped}; the destination ends at {ends}")
    assert stopped == [e - 1 for e in ends], f"the stop point {stopped} is not below the seal at the end {ends}"
    for i, at in enumerate(stopped):
        (seal,) = read_partition(dest_cluster.bootstrap, m, i, at, at + 1)
        assert seal.offset == at and seal.key.startswith(b"kmirror.seal/"), seal
    assert [hi for _, hi in watermarks(proxy.bootstrap, m, partitions)] == stopped


def test_stop_settled_by_the_new_owner_keeps_the_destinations_end(kmirror_bin, dest_cluster, source_cluster,
                                                                  proxy_factory):
    """The owner of a moving mirror is killed -9; a stop comes through the other kmirrord before it
    takes the mirror over, so the new owner finds the partitions STOPPING and settles them. It used
    to settle them at the persisted progress, which lags the killed owner's last writes (up to a
    progress interval): the stop point, the mirrored offset of a STOPPED partition, was below the
    destination's end, and a start after it (a drill's) hid records that were mirrored (the soak's
    finding 17, docs/reliability.md). It asks the destination's end first now."""
    a, b, cli_a, cli_b, m, bg = _owner_then_other(kmirror_bin, dest_cluster, source_cluster, proxy_factory, "stopk",
                                                  2, 3000, 1)
    try:
        time.sleep(2.0)
        _killed_then_stopped(a, cli_b, m)
    finally:
        bg.stop()
    _stopped_at_the_destinations_end(dest_cluster, b, cli_b, m)


def test_stop_settled_by_a_former_owner_that_gets_the_mirror_back_keeps_the_destinations_end(
        kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    """kmirrord a ran a mirror, was paused (SIGSTOP) past its session, so b took the mirror over and
    mirrored on; resumed, a stopped its pipeline (retired: it stays, its partitions reset). Then b
    was killed -9 under load and a stop came through a before a had the mirror back. Gaining it, a
    handed the STOPPING partitions to its retired pipeline, whose partitions, known to it from its
    earlier life, were idle: they settled at once at the persisted progress, which lags b's last
    writes, a stop point below the destination's end (the soak's finding 21, docs/reliability.md).
    A partition a pipeline takes on in a new life reconciles before it settles, as on a restart."""
    a, b, cli_a, cli_b, m, bg = _owner_then_other(kmirror_bin, dest_cluster, source_cluster, proxy_factory, "stopr",
                                                  2, 3000, 1)
    try:
        mark = len(a.output())
        a.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: runners([b], [m], window=1.0)[m] == [b.name], 60, what="b running the mirror")
            time.sleep(2.0)
        finally:
            a.signal(signal.SIGCONT)
        a.wait_log(rf"mirror {m}: its pipeline stops here", timeout=15, start=mark)
        time.sleep(1.0)
        _killed_then_stopped(b, cli_a, m)
    finally:
        bg.stop()
    _stopped_at_the_destinations_end(dest_cluster, a, cli_a, m)


def test_a_record_right_after_a_hole_shows_at_its_offset_through_the_other_kmirrord(kmirror_bin, dest_cluster,
                                                                                    source_cluster, proxy_factory):
    """The source's last batch is a hole for the mirror (a COMMIT marker with no record of its
    transaction, source offset 8): the runner's tail moved past it, to logical 9 at destination
    offset 8, and its progress said 9. The run that says so (logical 9 at 8) was written only with
    the next batch, so the other kmirrord mapped the progress with the runs it had (logical 0 at 0):
    offset 9 at destination offset 9, past the destination's end, and the next record, at 8, one
    early until the run reached it (the soak's finding 25, docs/reliability.md). A reader through the
    other kmirrord waits at offset 9 (its end) while the next record is written: it must get it
    there, with no error before."""
    from confluent_kafka import Consumer, TopicPartition
    from mirror_data import record, watermarks
    from test_mirror_txn import commit_nothing
    tag = uuid.uuid4().hex[:6]
    opts = dict(mirror_state_topic=f"__mirror_state_hole_{tag}", mirror_state_partitions=SLOTS,
                mirror_pipelines="owned")
    m = f"hole-{tag}"
    source_cluster.create_topic(m, partitions=1)
    produce_records(source_cluster.bootstrap, m, 8, partitions=1)
    a = proxy_factory(dest_cluster, name="kmirrord-hole-a", **opts)
    cli_a = Cli(kmirror_bin, a.bootstrap)
    cli_a.run("create", "--mirror", m, "--source-bootstrap", source_cluster.bootstrap)
    cli_a.run("start", "--mirror", m, "--topics", m)
    wait_until(lambda: runners([a], [m], window=1.0)[m] == [a.name], 60, what="a running the mirror")
    b = proxy_factory(dest_cluster, name="kmirrord-hole-b", **opts)
    wait_until(lambda: watermarks(b.bootstrap, m, 1)[0][1] == 8, 60, what="8 records through b")
    commit_nothing(source_cluster.bootstrap, f"hole-txn-{tag}", m, 0)  # source offset 8: a hole
    wait_until(lambda: watermarks(b.bootstrap, m, 1)[0][1] == 9, 60,
               what=lambda: f"the hole through b (a: {watermarks(a.bootstrap, m, 1)}, b: {watermarks(b.bootstrap, m, 1)})")
    time.sleep(1.0)  # every progress past the hole written
    runs, progress = _runs_and_progress(dest_cluster, opts["mirror_state_topic"], m)
    print(f"runs (logical, physical): {runs}; progress: {progress}")
    assert progress != 9 or (9, 8) in runs, (f"the progress past the hole (9) is persisted, the run that maps it "
                                            f"(9 at 8) is not: {runs}")
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"hole-{tag}", "enable.auto.commit": False,
                  "auto.offset.reset": "error", "fetch.wait.max.ms": 10, "isolation.level": "read_committed"})
    got, errors = [], []
    try:
        c.assign([TopicPartition(m, 0, 9)])
        for x in c.consume(num_messages=100, timeout=2.0):  # the fetcher at 9, the end through b, waiting
            (errors if x.error() else got).append(x.error() or (x.offset(), x.value()))
        produce_records(source_cluster.bootstrap, m, 1, start=9, partitions=1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not got and not errors:
            for x in c.consume(num_messages=100, timeout=0.05):
                (errors if x.error() else got).append(x.error() or (x.offset(), x.value()))
    finally:
        c.close()
    assert not errors, f"reading at the end through the other kmirrord after the hole: {errors[:3]}"
    assert got and got[0] == (9, record(9, "r")[1]), (f"the first record through the other kmirrord after the "
                                                     f"hole: {got[:1]}, not source offset 9 at 9")


def _runs_and_progress(cluster, state_topic, m):
    """Partition 0 of mirror m's topic m in the state topic, read raw: its runs (logical start,
    physical start) and its last progress (LastMirroredOffset of its last progress record)."""
    import struct
    from confluent_kafka import Consumer, TopicPartition

    def text(b, pos):
        (n,) = struct.unpack_from(">h", b, pos)
        return b[pos + 2:pos + 2 + n].decode(), pos + 2 + n

    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"st-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    runs, progress = set(), None
    try:
        parts = c.list_topics(state_topic, timeout=15).topics[state_topic].partitions
        c.assign([TopicPartition(state_topic, p, 0) for p in parts])
        left, deadline = set(parts), time.monotonic() + 60
        while left and time.monotonic() < deadline:
            x = c.poll(1.0)
            if x is None:
                continue
            if x.error():
                left.discard(x.partition())
                continue
            k, v = x.key(), x.value()
            (kind,) = struct.unpack_from(">h", k, 0)
            if kind not in (2, 4) or v is None:
                continue
            mirror, pos = text(k, 2)
            topic, pos = text(k, pos)
            (part,) = struct.unpack_from(">i", k, pos)
            if (mirror, topic, part) != (m, m, 0):
                continue
            if kind == 2:  # a run: key's LogicalStart; value: version, PhysicalStart
                runs.add((struct.unpack_from(">q", k, pos + 4)[0], struct.unpack_from(">q", v, 2)[0]))
            else:  # a progress: value: version, TopicId, StateChangeTimeMs, LastMirroredOffset
                progress = struct.unpack_from(">q", v, 2 + 16 + 8)[0]
        assert not left, f"{state_topic} not read to its end: {left}"
    finally:
        c.close()
    return sorted(runs), progress
