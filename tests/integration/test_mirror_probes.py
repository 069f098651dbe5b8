"""Each mirror RPC's authorization covers what kmirrord then does with its own principal: a mirror
whose ACL sync is on needs ALTER on the cluster (kmirrord creates and deletes ACLs), and a start of
a topic the destination lacks needs CREATE on it (kmirrord creates it)."""

import pytest

from harness import USERS  # noqa: F401
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until
from test_mirror_configs import (CLUSTER_AUTHORIZATION_FAILED, START, STOP, TOPIC_AUTHORIZATION_FAILED, Client,
                                 main_release_only, sasl_proxy)  # noqa: F401

pytestmark = [pytest.mark.proxy, main_release_only]

UNKNOWN_CLUSTER_MIRROR = 32002


def logged_in(p):
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 3, 60, what="the proxy's login")
    admin = Client(p.bootstrap, "admin")
    wait_until(lambda: admin.list()[0] == 0, 60, 0.5, "the mirror state to load")
    return admin


def dest_topics(cluster):
    """The destination's topics, asked directly (as the super user: ACLs hide topics from others)."""
    return set(cluster.tool("topics", "--list", admin=True).stdout.split())


def appears(cond, timeout):
    """Whether cond comes true within timeout seconds."""
    try:
        wait_until(cond, timeout, 0.5, "the condition")
        return True
    except Exception:
        return False


def test_acl_sync_needs_alter_on_the_cluster(sasl_proxy, dest_cluster3, source_cluster, topic_name):
    """alice may alter the cluster's configs but not its ACLs: a mirror that would sync ACLs into the
    destination (as kmirrord, creating and deleting them) is refused; one that would not is not."""
    p = sasl_proxy
    admin = logged_in(p)
    base = "acl-" + topic_name.replace("_", "-")[:40]
    # A scope that holds no real binding: the sync, were it to run, changes nothing here.
    scope = "TOPIC;kmirror-probe-test-none"
    acl = ["--allow-principal", "User:alice", "--operation", "AlterConfigs", "--operation", "DescribeConfigs"]
    dest_cluster3.tool("acls", "--add", *acl, "--cluster", admin=True)
    try:
        alice = Client(p.bootstrap, "alice")
        code, msg = alice.create(base + "-sync", {"bootstrap.servers": source_cluster.bootstrap,
                                                  "mirror.acl.include": scope})
        assert code == CLUSTER_AUTHORIZATION_FAILED, (code, msg)
        assert "ACL sync" in msg and "ALTER on the cluster" in msg, msg
        assert admin.alter(base + "-sync", {"mirror.topic.num.partitions": "3"})[0] == UNKNOWN_CLUSTER_MIRROR

        # Without the ACL sync: ALTER_CONFIGS is all it takes.
        assert alice.create(base, {"bootstrap.servers": source_cluster.bootstrap}) == (0, None)
        # Turning the sync on later is the same change, and so is altering a mirror that has it on.
        code, msg = alice.alter(base, {"mirror.acl.include": scope})
        assert code == CLUSTER_AUTHORIZATION_FAILED and "ACL sync" in msg, (code, msg)
        assert admin.alter(base, {"mirror.acl.include": scope}) == (0, None)
        code, msg = alice.alter(base, {"mirror.topic.num.partitions": "3"})
        assert code == CLUSTER_AUTHORIZATION_FAILED and "mirror.acl.include=" + scope in msg, (code, msg)
        # Turning it off needs no more than ALTER_CONFIGS (a NULL value: back to the default).
        assert alice.alter(base, {"mirror.acl.include": None})[0] == 0
        assert alice.delete(base) == (0, None)
        alice.close()
    finally:
        dest_cluster3.tool("acls", "--remove", "--force", *acl, "--cluster", admin=True)
        admin.delete(base)
        admin.delete(base + "-sync")
        admin.close()


def test_start_of_a_missing_topic_needs_create(sasl_proxy, dest_cluster3, source_cluster, topic_name):
    """alice may alter the configs of a topic the destination does not have, but not create it: a
    start of it is refused for that topic and kmirrord creates nothing; with CREATE it starts."""
    p = sasl_proxy
    admin = logged_in(p)
    mirror = "create-" + topic_name.replace("_", "-")[:40]
    topic = topic_name + "-new"
    source_cluster.create_topic(topic, partitions=1)
    assert admin.create(mirror, {"bootstrap.servers": source_cluster.bootstrap}) == (0, None)
    alter = ["--allow-principal", "User:alice", "--operation", "AlterConfigs"]
    create = ["--allow-principal", "User:alice", "--operation", "Create"]
    # An ACL on the cluster, so that allow.everyone.if.no.acl.found does not let CREATE on it through.
    other = ["--allow-principal", "User:bob", "--operation", "Describe"]
    dest_cluster3.tool("acls", "--add", *alter, "--topic", topic, admin=True)
    dest_cluster3.tool("acls", "--add", *other, "--cluster", admin=True)
    added = [(alter, ["--topic", topic]), (other, ["--cluster"])]
    try:
        assert topic not in dest_topics(dest_cluster3)
        alice = Client(p.bootstrap, "alice")
        code, msg, per = alice.topics(START, mirror, [topic])
        if per[topic][0] == 0:
            # Accepted: say what that let alice do through kmirrord.
            created = appears(lambda: topic in dest_topics(dest_cluster3), 30)
            pytest.fail(f"start accepted without CREATE ({per}); created on the destination: {created}")
        assert per[topic][0] == TOPIC_AUTHORIZATION_FAILED, per
        assert "refused CREATE" in per[topic][1] and topic in per[topic][1], per
        # Nothing created, now or by a preparation under way.
        code, msg, per = admin.topics(STOP, mirror, [topic])
        assert per[topic][0] != 0, per  # never started
        assert topic not in dest_topics(dest_cluster3)

        dest_cluster3.tool("acls", "--add", *create, "--topic", topic, admin=True)
        added.append((create, ["--topic", topic]))
        code, msg, per = alice.topics(START, mirror, [topic])
        assert per[topic] == (0, None), per
        wait_until(lambda: topic in dest_topics(dest_cluster3), 60, 0.5, "kmirrord to create the topic")
        code, msg, per = alice.topics(STOP, mirror, [topic])
        assert per[topic] == (0, None), per
        alice.close()
    finally:
        for a, where in added:
            dest_cluster3.tool("acls", "--remove", "--force", *a, *where, admin=True)
        admin.topics(STOP, mirror, [topic])
        admin.close()
