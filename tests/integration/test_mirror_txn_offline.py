"""A carried transaction ended while its destination partition had no leader (docs/reliability.md,
finding 4). The transaction coordinator writes a transaction's markers through each partition's
leader, and skips a partition that has none ("likely deleted already"): the mirror's records stay
in a transaction open on that partition, holding its last stable offset, though the coordinator
counts it ended. The mirror's fence (InitProducerId) then aborts nothing there, and the same
producer's next marker on the partition decided those records with its own transaction's: a
COMMIT made the copy the mirror had hidden and written again a committed duplicate for every
reader of the destination's brokers. Now each of the partition's transactional ids aborts an empty
transaction there after the fence, which closes it.

A destination of three brokers of the module's own (a broker is stopped), the partition on one
replica, led by a broker that is not the mirror's transaction coordinator."""
import pytest

from harness import KafkaCluster
from mirror_data import main_release_only, read_partition, record
from mirror_cli import kmirror_bin, wait_states  # noqa: F401
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until
from test_mirror_txn import (COMMITTED, UNCOMMITTED, _move_leader, _txn_env, compare, ends,
                             list_transactions, txn_coordinator, txn_producer, unique)

pytestmark = main_release_only  # the coordinator's marker rule, the same on every release here


@pytest.fixture(scope="module")
def oenv(kmirrord_bin, kmirror_bin, source_cluster, tmp_path_factory):
    dest = KafkaCluster("txnoffline", brokers=3)
    dest.start()
    try:
        yield from _txn_env(kmirrord_bin, kmirror_bin, dest, source_cluster, tmp_path_factory, "txnoff")
    finally:
        dest.stop()


def leader_of(cluster, topic):
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=15)
    return md.topics[topic].partitions[0].leader


def skipped(cluster, topic):
    """A broker's log says it skipped the topic's partition while sending transaction markers."""
    for node in cluster.nodes.values():
        try:
            with open(node.log_path, errors="replace") as f:
                if any("Couldn't find leader endpoint" in ln and f"{topic}-0" in ln for ln in f):
                    return True
        except FileNotFoundError:
            pass
    return False


def test_transaction_ended_while_its_partition_is_offline_leaves_no_committed_copy(oenv):
    env = oenv
    if not env.proxy.running():
        env.proxy.start()
    topic = unique("txnoff")
    env.source.create_topic(topic, partitions=1)
    env.dest.create_topic(topic, partitions=1, replication_factor=1)
    src = txn_producer(env.sb, "txo")

    def produce(tag, base):
        for i in range(base, base + 5):
            k, v, h, _ = record(i, tag)
            src.produce(topic, value=v, key=k, headers=h, partition=0)
        src.flush(30)

    src.begin_transaction()
    produce("a", 0)
    src.commit_transaction(30)  # source: records 0-4, COMMIT at 5
    env.cli.run("start", "--mirror", env.mirror, "--topics", topic)
    wait_states(env.cli, env.mirror, {topic: "MIRRORING"}, timeout=60)
    wait_until(lambda: ends(env.pb, topic, COMMITTED, parts=1) == ends(env.sb, topic, COMMITTED, parts=1), 60,
               what="the first transaction mirrored")
    tids = [t for t, _ in list_transactions(env) if f"/{env.mirror}/{topic}/0/" in t]
    assert tids, f"no transactional id of the mirror for {topic}-0: {list_transactions(env)}"
    coords = {txn_coordinator(env.dest.bootstrap, t)[0] for t in tids}
    leader = leader_of(env.dest, topic)
    if leader in coords:  # the partition moves to a broker that coordinates none of its ids
        to = next(b for b in sorted(env.dest.broker_ids) if b not in coords)
        _move_leader(env.dest, topic, 0, [to])
        wait_until(lambda: leader_of(env.dest, topic) == to, 60, what=f"{topic}-0 led by broker {to}")
        leader = to
    # A second transaction at the source, its records mirrored into an open destination transaction.
    before = ends(env.dest.bootstrap, topic, UNCOMMITTED, parts=1)[0][1]
    src.begin_transaction()
    produce("b", 6)
    wait_until(lambda: ends(env.dest.bootstrap, topic, UNCOMMITTED, parts=1)[0][1] >= before + 5, 60,
               what=lambda: f"the open transaction's 5 records on the destination after {before}: its end "
                            f"{ends(env.dest.bootstrap, topic, UNCOMMITTED, parts=1)}, the source's "
                            f"{ends(env.sb, topic, UNCOMMITTED, parts=1)}, leader {leader}, coordinators {coords}")
    # Its partition offline, the source commits: the mirror's EndTxn is taken, its marker skipped.
    env.dest.stop_broker(leader)
    wait_until(lambda: leader_of(env.dest, topic) == -1, 60, what=f"{topic}-0 without a leader")
    src.commit_transaction(30)
    wait_until(lambda: skipped(env.dest, topic), 60, what="the coordinator to skip the offline partition's marker")
    env.dest.start_broker(leader)
    # The source's ten records through kmirrord at both isolation levels, and on the destination
    # read directly, read_committed: exactly the source's ten, none twice.
    src_marks = ends(env.sb, topic, COMMITTED, parts=1)
    wait_until(lambda: ends(env.pb, topic, COMMITTED, parts=1) == src_marks, 150,
               what=f"the mirror's last stable offset at the source's {src_marks}")
    assert compare(env, topic, COMMITTED, src_marks) == 10
    assert compare(env, topic, UNCOMMITTED, ends(env.sb, topic, UNCOMMITTED, parts=1)) == 10
    end = ends(env.dest.bootstrap, topic, COMMITTED, parts=1)[0][1]
    direct = read_partition(env.dest.bootstrap, topic, 0, 0, end, **{"isolation.level": COMMITTED})
    keys = [r.key for r in direct]
    assert len(direct) == 10 and len(set(keys)) == 10, (
        f"the destination's brokers show {len(direct)} committed records ({len(keys) - len(set(keys))} twice) "
        f"where the source has 10: {keys}")
    assert f"{topic}-0: a transaction is still open" in env.proxy.output(), "the closing was not what fixed it"
