"""A foreign write on the destination: reconcile checks the tail it resumes after (docs/mirror.md,
"Reconcile"). A record written straight into the mirror topic on the destination while kmirrord is
down must neither show at a source offset nor push a source record out: the partition goes FAILED
with an error that says what happened and what to do. A client's transaction left open on the
topic when it becomes a mirror is waited for: its marker must not land between mirrored batches.
A destination topic that holds records no mirror wrote is started only when the operator says so."""
import signal
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from mirror_cli import kmirror_bin, wait_states  # noqa: F401
from mirror_data import create_dest_topic, main_release_only, produce_records, read_partition, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until
from test_mirror_data import _mirror_env, _teardown, unique

pytestmark = main_release_only  # reconcile's tail check reads batches the same way on every release: once


@pytest.fixture(scope="module")
def fenv(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster, tmp_path_factory):
    env = _mirror_env(kmirrord_bin, kmirror_bin, dest_cluster, source_cluster,
                      str(tmp_path_factory.mktemp("foreign")), "kmirrord-foreign")
    yield env
    _teardown(env)


def source_records(env, topic, end):
    return [(r.offset, r.key, r.value) for r in read_partition(env.sb, topic, 0, 0, end)]


def head_stays_quiet(env, topic, head, seconds=3.0):
    """A librdkafka consumer at the head, for seconds: it reads nothing and gets no error event."""
    c = Consumer(env.proxy.conf(**{"group.id": unique("head"), "enable.auto.commit": False,
                                   "isolation.level": "read_uncommitted"}))
    got, errors = [], []
    fetch = 'kmirror_requests_total{api="Fetch"}'
    before = env.proxy.metric(fetch)
    waits = env.proxy.metric("kmirror_fetch_tail_waits_total")
    try:
        c.assign([TopicPartition(topic, 0, head)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None:
                (errors if m.error() else got).append(m.error() or (m.offset(), m.value()))
        fetches = env.proxy.metric(fetch) - before
        waits = env.proxy.metric("kmirror_fetch_tail_waits_total") - waits
    finally:
        c.close()
    print(f"at the head for {seconds} s: {len(got)} records, errors {errors[:3]}, {fetches:.0f} Fetch requests, "
          f"{waits:.0f} held at the tail")
    assert not got, got
    assert not errors, errors[:3]
    # Each answer is empty at once (the broker has the hidden batch): held 50 ms, not asked again at once
    # (10,848 requests in 3 s without the hold).
    assert fetches <= seconds * 1000 / 50 + 10, fetches


@pytest.mark.parametrize("txn", [False, True], ids=["plain", "transactional"])
def test_foreign_write_on_destination_fails_the_partition(fenv, txn):
    """The foreign record is a plain one, or a client's committed transaction (its batch and its
    COMMIT marker): a transactional batch at the tail is trusted only when its producer is one
    of the partition's carried transactions'."""
    env = fenv
    topic = unique("foreign")
    env.source_topic(topic, partitions=1)
    produce_records(env.sb, topic, 20, tag="a")
    env.start(topic)
    env.caught_up(topic, 1)
    assert watermarks(env.pb, topic, 1)[0][1] == 20

    env.proxy.signal(signal.SIGKILL)
    env.proxy.daemon.proc.wait(timeout=30)
    # A client writes to the mirror topic on the destination itself, past the mirror's last batch.
    if txn:
        p = Producer({"bootstrap.servers": env.dest.bootstrap, "transactional.id": f"foreign-{topic}"})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, key=b"foreign", value=b"written on the destination", partition=0)
        p.commit_transaction(30)
    else:
        p = Producer({"bootstrap.servers": env.dest.bootstrap, "enable.idempotence": False})
        p.produce(topic, key=b"foreign", value=b"written on the destination", partition=0)
        assert p.flush(30) == 0
    produce_records(env.sb, topic, 10, start=20, tag="b")
    env.proxy.start()

    def settled():
        part = env.partitions(topic)[0]
        return part["state"] == "FAILED" or watermarks(env.pb, topic, 1)[0][1] >= 30
    wait_until(settled, 60, 0.2, "the partition to fail or to catch up")
    time.sleep(1.0)  # a mirror that went on would show more now

    # What readers see through kmirrord is the source's, offset for offset.
    hw = watermarks(env.pb, topic, 1)[0][1]
    seen = [(r.offset, r.key, r.value) for r in read_partition(env.pb, topic, 0, 0, hw)]
    src = source_records(env, topic, 30)[:hw]
    assert seen == src, (f"read through kmirrord [0, {hw}) differs from the source: "
                         f"{[s for s in seen if s not in src][:3]} shown, {[s for s in src if s not in seen][:3]} "
                         f"missing")

    part = env.partitions(topic)[0]
    assert part["state"] == "FAILED", part
    err = part["last_error"] or ""
    # A transaction's batch and its COMMIT marker: two offsets, of a producer id the broker gave.
    assert f"destination offsets 20-{21 if txn else 20}" in err and "not written by the mirror" in err, err
    assert ("producer id -1" in err) != txn and "stop and start the topic" in err, err
    assert hw == 20, hw

    # Once the writer is gone, a stop and a start mirror on from there: nothing lost, nothing foreign.
    env.cli.run("stop", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "STOPPED"}, timeout=60)
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    env.caught_up(topic, 1)
    seen = [(r.offset, r.key, r.value) for r in read_partition(env.pb, topic, 0, 0, 30)]
    assert seen == source_records(env, topic, 30)


def test_foreign_write_while_paused_stays_hidden(fenv):
    """A record written straight into a paused mirror topic on the destination lies past the
    mirror's tail, which a pause keeps. A librdkafka consumer at the head through kmirrord gets
    answers that hold only that hidden batch: librdkafka doubles its fetch size on each answer that
    yields no record and, once at 1 GiB (ten answers), reports MSG_SIZE_TOO_LARGE ("might be too
    large to fetch"). kmirrord answers such a partition with no records (docs/proxy.md, "A
    partition with nothing visible"): the consumer reads nothing and gets no error. On resume the
    partition fails, as for any foreign write."""
    env = fenv
    topic = unique("paused")
    env.source_topic(topic, partitions=1)
    produce_records(env.sb, topic, 20, tag="a")
    env.start(topic)
    env.caught_up(topic, 1)
    env.cli.run("pause", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "PAUSED"}, timeout=60)
    p = Producer({"bootstrap.servers": env.dest.bootstrap, "enable.idempotence": False})
    p.produce(topic, key=b"foreign", value=b"written on the destination", partition=0)
    assert p.flush(30) == 0
    head_stays_quiet(env, topic, 20)
    assert watermarks(env.pb, topic, 1)[0][1] == 20
    env.cli.run("resume", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "FAILED"}, timeout=60)


def test_transaction_open_at_start_refuses_it(fenv):
    """A client's transaction that holds the partition open while the topic is writable through
    kmirrord: whenever it ends (its producer, or the coordinator at its timeout) the coordinator
    writes its marker into the partition, which after a start would be a read-only mirror topic
    (issue 27, item 5: refusing the EndTxn would not help, the timeout's ABORT marker lands all the
    same). So the start is refused while the transaction is open, naming it; once it has ended the
    start goes through and the mirror is exact."""
    env = fenv
    topic = unique("opentxn")
    env.source_topic(topic, partitions=1)
    produce_records(env.sb, topic, 20, tag="a")
    create_dest_topic(env.dest, env.sb, topic)
    tid = f"open-{topic}"
    p = Producer({"bootstrap.servers": env.pb, "transactional.id": tid, "transaction.timeout.ms": 120000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, key=f"local-{i}".encode(), value=b"written before the start", partition=0)
    assert p.flush(30) == 0

    line = refused_start(env, topic, tid)
    assert "commit or abort" in line, line
    p.commit_transaction(30)  # EndTxn through kmirrord: the COMMIT marker lands at offset 3
    # The records and the marker are no mirror's (test_destination_topic_holding_records_is_adopted_only_when_asked).
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic, "--adopt-existing")
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    produce_records(env.sb, topic, 10, start=20, tag="b")
    env.caught_up(topic, 1, timeout=90)
    seen = [(r.offset, r.key, r.value) for r in read_partition(env.pb, topic, 0, 0, 30)]
    assert seen == source_records(env, topic, 30)
    assert env.partitions(topic)[0]["state"] == "MIRRORING"


def refused_start(env, topic, tid):
    """kmirror start of topic is refused (CONCURRENT_TRANSACTIONS) naming transactional id tid; the
    topic stays out of the mirror (or as it was) and writable. Returns the error line."""
    r = env.cli.run("start", "--mirror", env.mirror, "--topics", topic, expect=1)
    err = r.stderr.strip()
    print(err)
    assert "CONCURRENT_TRANSACTIONS" in err and tid in err and f"{topic}-0" in err, err
    assert not env.describe(topic) or env.partitions(topic)[0]["state"] == "STOPPED", env.describe(topic)
    return err


def test_partition_added_to_a_transaction_without_records_refuses_the_start(fenv):
    """The same with a transaction that has added the partition (AddPartitionsToTxn) but written
    nothing to it yet: the partition's log shows nothing (its last stable offset is its end), only
    the transaction coordinator knows. librdkafka adds a partition as soon as a message is queued
    for it and sends the message only after linger.ms. Without the refusal the start went through
    and the transaction's ABORT marker landed in the mirror topic on the destination."""
    env = fenv
    topic = unique("addedtxn")
    env.source_topic(topic, partitions=1)
    produce_records(env.sb, topic, 20, tag="a")
    create_dest_topic(env.dest, env.sb, topic)
    tid = f"added-{topic}"
    p = Producer({"bootstrap.servers": env.pb, "transactional.id": tid, "transaction.timeout.ms": 120000,
                  "linger.ms": 60000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, key=b"held", value=b"queued, not sent", partition=0)
    time.sleep(2.0)  # AddPartitionsToTxn is sent at once; the Produce waits for linger.ms
    assert watermarks(env.dest.bootstrap, topic, 1)[0][1] == 0
    refused_start(env, topic, tid)
    p.abort_transaction(30)  # the ABORT marker lands at offset 0, the topic still writable
    wait_until(lambda: watermarks(env.dest.bootstrap, topic, 1)[0][1] == 1, 30, what="the abort marker")
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic, "--adopt-existing")  # the marker is no mirror's
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    env.caught_up(topic, 1, timeout=90)
    seen = [(r.offset, r.key, r.value) for r in read_partition(env.pb, topic, 0, 0, 20)]
    assert seen == source_records(env, topic, 20)


def test_destination_topic_holding_records_is_adopted_only_when_asked(fenv):
    """Issue 29, item 7: a start of a destination topic that already holds records no mirror here
    wrote (and that is no failback) would hide them from every reader through kmirrord and give
    their offsets to the source's records. It is refused, naming what is there and what to do, and
    loses nothing: the records stay readable through kmirrord and the topic writable. With
    --adopt-existing the start goes through: the source's records take offsets 0 on, exactly, and
    the local records stay in the destination's log (hidden from readers through kmirrord)."""
    env = fenv
    topic = unique("held")
    env.source_topic(topic, partitions=2)
    produce_records(env.sb, topic, 20, tag="src")
    create_dest_topic(env.dest, env.sb, topic)
    p = Producer({"bootstrap.servers": env.pb})
    for i in range(5):
        p.produce(topic, key=f"local-{i}".encode(), value=b"written here before any mirror", partition=1)
    assert p.flush(30) == 0

    dry = env.cli.run("start", "--mirror", env.mirror, "--topics", topic, "--dry-run").stdout
    print(dry)
    rows = [line.split() for line in dry.splitlines() if line.startswith(topic)]
    assert [r[1] for r in rows] == ["0", "1"] and rows[1][-2:] == ["5", "5"], rows
    assert all("refused (records here)" in line for line in dry.splitlines() if line.startswith(topic)), dry
    r = env.cli.run("start", "--mirror", env.mirror, "--topics", topic, expect=1)
    err = r.stderr.strip()
    print(err)
    assert "TOPIC_ALREADY_EXISTS" in err and "5 offset(s)" in err and "partition 1: offsets 0 to 4" in err, err
    assert "--adopt-existing" in err, err
    assert not env.describe(topic), env.describe(topic)
    local = [(m.offset, m.key) for m in read_partition(env.pb, topic, 1, 0, 5)]
    assert local == [(i, f"local-{i}".encode()) for i in range(5)], local
    p.produce(topic, key=b"local-5", value=b"still writable", partition=1)
    assert p.flush(30) == 0

    dry = env.cli.run("start", "--mirror", env.mirror, "--topics", topic, "--dry-run", "--adopt-existing").stdout
    print(dry)
    assert "refused (records here)" not in dry and "Total: 6 records here would be hidden" in dry, dry
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic, "--adopt-existing")
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    env.caught_up(topic, 2, timeout=90)
    total = 0
    for part in range(2):
        end = watermarks(env.sb, topic, 2)[part][1]
        seen, src = read_partition(env.pb, topic, part, 0, end), read_partition(env.sb, topic, part, 0, end)
        assert seen == src, (part, seen[:3], src[:3])
        total += len(src)
    assert total == 20
    # The local records are still on the destination, under the mirrored ones' offsets.
    kept = [m.key for m in read_partition(env.dest.bootstrap, topic, 1, 0, 6)]
    assert kept == [f"local-{i}".encode() for i in range(6)], kept


def test_restart_shows_no_more_than_before_reconcile(fenv):
    """A kmirrord started again holds each partition's tail while reconcile works out where the
    mirror stands. It used to unset it meanwhile, so its readers were shown whatever the open run
    mapped on the destination: here a client's transaction left open on the mirror topic (which
    reconcile waits for, then hides), shown as mirrored offsets 20 to 24 until reconcile had decided.
    In the soak the same window showed a COMMIT marker that reconcile then hid, and a reader there was
    sent back to offset 0 (docs/reliability.md, finding 7). Now it shows the persisted progress
    until reconcile has decided."""
    env = fenv
    topic = unique("foreignopen")
    env.source_topic(topic, partitions=1)
    produce_records(env.sb, topic, 20, tag="a")
    env.start(topic)
    env.caught_up(topic, 1)
    time.sleep(1.0)  # the progress persisted (every 200 ms)
    env.proxy.signal(signal.SIGKILL)
    env.proxy.daemon.proc.wait(timeout=30)
    p = Producer({"bootstrap.servers": env.dest.bootstrap, "transactional.id": f"open-{topic}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, key=b"foreign", value=b"open on the destination %d" % i, partition=0)
    assert p.flush(30) == 0
    unc = {"isolation.level": "read_uncommitted"}
    assert watermarks(env.dest.bootstrap, topic, 1, **unc)[0][1] == 25
    env.proxy.start()
    try:
        shown = set()
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            try:
                shown.add(watermarks(env.pb, topic, 1, **unc)[0][1])
            except Exception:  # noqa: BLE001 - kmirrord still loading its state
                pass
            time.sleep(0.1)
        assert shown == {20}, f"high watermarks shown while reconcile waits for the open transaction: {shown}"
    finally:
        p.abort_transaction(30)
    produce_records(env.sb, topic, 5, start=20, tag="b")

    def settled():
        part = env.partitions(topic)[0]
        return part["state"] == "FAILED" or watermarks(env.pb, topic, 1)[0][1] >= 25
    wait_until(settled, 60, 0.2, "the partition to fail or to catch up")
    hw = watermarks(env.pb, topic, 1)[0][1]
    seen = [(r.offset, r.key, r.value) for r in read_partition(env.pb, topic, 0, 0, hw)]
    assert seen == source_records(env, topic, 25)[:hw]


def test_late_transaction_of_another_kmirrord_is_fenced_not_waited_for(fenv):
    """A transaction of one of the mirror's transactional ids of another kmirrord, begun on the
    destination partition after this kmirrord listed the mirror's ids (a former owner's late
    write: its AddPartitionsToTxn and Produce held in a cut link or a paused process) and left
    open. It holds the partition's LSO; it is not a client's, so reconcile must not wait for it
    as for one (up to the transaction's timeout, here 120 s): the ids are listed again, it is
    fenced (aborted) and hidden, and the mirror goes on, every record at its source offset."""
    env = fenv
    topic = unique("late-tid")
    env.source_topic(topic, partitions=1)
    produce_records(env.sb, topic, 20, tag="a")
    env.start(topic)
    env.caught_up(topic, 1)
    # The partition has reconciled and listed the mirror's transactional ids long before this one exists.
    tid = f"kmirror/kmirrord-gone/{env.mirror}/{topic}/0/0"
    p = Producer({"bootstrap.servers": env.dest.bootstrap, "transactional.id": tid,
                  "transaction.timeout.ms": 120000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, key=b"late", value=b"a former owner's late write", partition=0)
    p.flush(30)
    # The mirror's next batch lands after it, where it was not planned: reconcile.
    produce_records(env.sb, topic, 10, start=20, tag="b")
    t0 = time.monotonic()
    try:
        env.caught_up(topic, 1, timeout=60)
    finally:
        err = env.partitions(topic)[0].get("last_error") or ""
        print(f"{time.monotonic() - t0:.1f} s; last error: {err}")
    assert "not the mirror's" not in err, err
    seen = [(r.offset, r.key, r.value) for r in read_partition(env.pb, topic, 0, 0, 30)]
    assert seen == source_records(env, topic, 30)
    assert env.proxy.wait_log(rf"{topic}-0: fencing \d+ transactional id\(s\)", timeout=5)
    # The late transaction was aborted by the fence: its producer can no longer commit it.
    with pytest.raises(KafkaException):
        p.commit_transaction(30)
