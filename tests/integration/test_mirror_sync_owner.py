"""One kmirrord per mirror runs its metadata sync (docs/mirror.md, "One kmirrord per mirror"): two
kmirrords in front of one destination agree through the destination's consumer group
__kmirror-sync; describe through each says which one syncs, exactly one does, and when it stops the
other takes over and the sync goes on."""

import re
import time
import uuid

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from mirror_cli import Cli, kmirror_bin  # noqa: F401
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until

# Release-independent: on the pom's release only (mirror_data.ON_MAIN_RELEASE).
pytestmark = main_release_only


def set_source_config(cluster, topic, name, value):
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    r = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([r])[r].result(timeout=30)


def dest_config(cluster, topic, name):
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    r = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return a.describe_configs([r])[r].result(timeout=30)[name].value


def owner_flags(cli, mirror):
    """{kind: is_owner} as this kmirrord's describe reports them ({} before its first look)."""
    d, _ = cli.json("describe", "--mirror", mirror)
    return {s["kind"]: s["is_owner"] for s in d["mirrors"][0].get("metadata_sync", [])}


def sync_group_settled(cluster, members):
    """__kmirror-sync has that many members, each holding exactly its target assignment."""
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    d = a.describe_consumer_groups(["__kmirror-sync"])["__kmirror-sync"].result(timeout=10)

    def parts(assignment):
        return sorted((tp.topic, tp.partition) for tp in (assignment.topic_partitions if assignment else []))
    return len(d.members) == members and all(
        m.target_assignment is not None and parts(m.assignment) == parts(m.target_assignment)
        for m in d.members)


def test_one_kmirrord_syncs_a_mirror(kmirror_bin, dest_cluster, source_cluster, proxy_factory):
    mirror, topic = f"own-{uuid.uuid4().hex[:8]}", f"owned-{uuid.uuid4().hex[:8]}"
    a = proxy_factory(dest_cluster, name="kmirrord-a")
    cli_a = Cli(kmirror_bin, a.bootstrap)
    # No records: the two kmirrords' pipelines (each runs one: a known limit) have nothing to write.
    source_cluster.create_topic(topic, partitions=2, config={"retention.ms": "7200000"})
    cli_a.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap,
              "--config", "mirror.metadata.refresh.interval.ms=1000")
    cli_a.run("start", "--mirror", mirror, "--topics", topic)
    # b reads the mirror from __mirror_state at its start.
    b = proxy_factory(dest_cluster, name="kmirrord-b")
    cli_b = Cli(kmirror_bin, b.bootstrap)

    def owners():
        fa, fb = owner_flags(cli_a, mirror), owner_flags(cli_b, mirror)
        if len(fa) != 5 or len(fb) != 5:  # topics, configs, partitions, groups, acls
            return None
        assert len(set(fa.values())) == 1 and len(set(fb.values())) == 1, (fa, fb)
        return fa["configs"], fb["configs"]

    # The group settled with these two as its only members, each holding partitions of its own
    # (a member of an earlier kmirrord, killed or not yet expired, holds its share until its
    # session times out: with a counted as one of "two members" it moved partitions from a as
    # it went), then exactly one owns the mirror...
    joined = "mirrors: this kmirrord runs the mirrors of its state topic partitions"
    wait_until(lambda: joined in a.output() and joined in b.output()
               and sync_group_settled(dest_cluster, 2), timeout=60,
               what="__kmirror-sync with a and b as its two members, at their target assignments")
    # A member's assignment in the description leaves out what it still has to revoke, so the two
    # can look settled a heartbeat (5 s) before the last partition moves: one owner, unchanged over
    # more than a heartbeat, is the settled state.
    def stable_owner(window=6.0):
        first, t0 = owners(), time.monotonic()
        while time.monotonic() - t0 < window:
            time.sleep(0.5)
            if owners() != first:
                return None
        return first if first in ((True, False), (False, True)) else None
    wait_until(stable_owner, timeout=90, interval=0, what="exactly one owner, unchanged over a heartbeat")
    # ...and it stays so: the group does not flap (checked over a few heartbeats).
    first = owners()
    # What each logged before it settled does not count: alone in the group, a synced every
    # mirror until b joined, whichever of them ends up owning this one.
    settled = {a.name: len(a.output()), b.name: len(b.output())}
    for _ in range(10):
        time.sleep(0.5)
        assert owners() == first
    owner, other = (a, b) if first[0] else (b, a)
    print(f"owner {owner.name}, other {other.name}")

    set_source_config(source_cluster, topic, "retention.ms", "3600000")
    wait_until(lambda: dest_config(dest_cluster, topic, "retention.ms") == "3600000", timeout=20,
               what="retention.ms synced by the owner")
    assert "metadata sync runs in this kmirrord now" in owner.output()
    assert f"{mirror}: metadata sync runs in this kmirrord now" not in other.output()[settled[other.name]:]

    # The owner stops (it leaves the group): the other takes the mirror over and syncs it.
    owner.stop()
    other_cli = cli_b if other is b else cli_a
    wait_until(lambda: owner_flags(other_cli, mirror).get("configs") is True, timeout=30,
               what="the other kmirrord owns the mirror")
    set_source_config(source_cluster, topic, "retention.ms", "1800000")
    wait_until(lambda: dest_config(dest_cluster, topic, "retention.ms") == "1800000", timeout=20,
               what="retention.ms synced by the new owner")


def test_two_kmirrords_running_every_mirror_say_so(proxy_factory, dest_cluster, source_cluster, kmirror_bin):
    """mirror_pipelines = all (the default) is for a kmirrord alone: two of them in front of one
    state topic both write every mirror. Each says so within a report interval once the state topic
    exists (a mirror is created), naming the other and what to set; with mirror_pipelines = owned
    on both, neither does."""
    state = f"__mirror_state_alone_{uuid.uuid4().hex[:6]}"
    a = proxy_factory(dest_cluster, name="kmirrord-all-a", mirror_state_topic=state)
    b = proxy_factory(dest_cluster, name="kmirrord-all-b", mirror_state_topic=state)
    Cli(kmirror_bin, a.bootstrap).run("create", "--mirror", f"alone-{uuid.uuid4().hex[:6]}", "--source-bootstrap",
                                      source_cluster.bootstrap)
    warn = "runs every mirror (mirror_pipelines = all) while kmirrord "
    for p, other in ((a, b), (b, a)):
        line = p.wait_log(re.escape(warn) + r"\S+@\S+:" + str(other.http_port) + r" \(mirror_pipelines = all",
                          timeout=40)
        assert "set mirror_pipelines = owned on every one" in p.output(), line
    state = f"__mirror_state_owned_{uuid.uuid4().hex[:6]}"
    c = proxy_factory(dest_cluster, name="kmirrord-owned-c", mirror_state_topic=state, mirror_pipelines="owned")
    d = proxy_factory(dest_cluster, name="kmirrord-owned-d", mirror_state_topic=state, mirror_pipelines="owned")
    Cli(kmirror_bin, c.bootstrap).run("create", "--mirror", f"owned-{uuid.uuid4().hex[:6]}", "--source-bootstrap",
                                      source_cluster.bootstrap)
    # Each checks after each of its reports (1 s after its load, then every 10 s): by then the
    # other's first report is in its view.
    time.sleep(13)
    assert not any(warn in p.output() for p in (c, d))
