"""Admin operations through kmirrord with the Java tools and confluent-kafka's admin client:
topics, configs, consumer groups (list, describe, reset offsets) and ACLs (StandardAuthorizer)."""

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation,
                                   AclPermissionType, AdminClient, AlterConfigOpType,
                                   ConfigEntry, ConfigResource, ResourcePatternType,
                                   ResourceType)

from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import consume, create_topic, produce, wait_until

pytestmark = pytest.mark.proxy


def test_java_topics_create_describe_delete(proxy3, topic_name):
    proxy3.tool("topics", "--create", "--topic", topic_name, "--partitions", 4,
                "--replication-factor", 3, "--config", "retention.ms=86400000")
    out = proxy3.cluster.wait_topic(topic_name, 4)
    out = proxy3.tool("topics", "--describe", "--topic", topic_name).stdout
    assert "PartitionCount: 4" in out and "ReplicationFactor: 3" in out
    assert "retention.ms=86400000" in out
    assert topic_name in proxy3.tool("topics", "--list").stdout.split()
    proxy3.tool("topics", "--delete", "--topic", topic_name)
    wait_until(lambda: topic_name not in proxy3.tool("topics", "--list").stdout.split(), 60,
               0.5, "the topic to disappear")


def test_describe_and_alter_configs(proxy3, topic_name):
    create_topic(proxy3, topic_name, partitions=1, config={"cleanup.policy": "compact"})
    proxy3.tool("configs", "--alter", "--entity-type", "topics", "--entity-name", topic_name,
                "--add-config", "max.message.bytes=2000000,retention.ms=3600000")
    out = proxy3.tool("configs", "--describe", "--entity-type", "topics", "--entity-name",
                      topic_name).stdout
    assert "max.message.bytes=2000000" in out and "retention.ms=3600000" in out
    assert "cleanup.policy=compact" in out

    a = AdminClient(proxy3.conf())
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "7200000",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", None,
                    incremental_operation=AlterConfigOpType.DELETE)])
    a.incremental_alter_configs([res])[res].result(timeout=30)
    desc = ConfigResource(ConfigResource.Type.TOPIC, topic_name)

    def applied():
        cfg = a.describe_configs([desc])[desc].result(timeout=15)
        return cfg if cfg["retention.ms"].value == "7200000" else None
    cfg = wait_until(applied, 30, 0.3, "the altered config")
    assert cfg["max.message.bytes"].is_default
    assert cfg["cleanup.policy"].value == "compact"

    # A broker's config, addressed by node id through the proxy.
    broker = str(proxy3.cluster.broker_ids[1])
    bres = ConfigResource(ConfigResource.Type.BROKER, broker)
    bcfg = a.describe_configs([bres])[bres].result(timeout=15)
    assert bcfg["num.io.threads"].value == "2"
    assert bcfg["broker.id"].value == broker


def test_groups_list_describe_reset(proxy3, topic_name):
    create_topic(proxy3, topic_name, partitions=2)
    produce(proxy3, topic_name, 100)
    group = f"grp-{topic_name}"
    assert len(consume(proxy3, topic_name, 100, group=group)) == 100

    assert group in proxy3.tool("consumer-groups", "--list").stdout.split()
    a = AdminClient(proxy3.conf())
    listed = a.list_consumer_groups().result(timeout=30)
    assert group in {g.group_id for g in listed.valid}
    desc = a.describe_consumer_groups([group])[group].result(timeout=30)
    assert desc.group_id == group and desc.members == []
    assert f"{desc.coordinator.host}:{desc.coordinator.port}" == \
        proxy3.advertised()[desc.coordinator.id]

    def offsets():
        out = proxy3.tool("consumer-groups", "--describe", "--group", group).stdout
        rows = [ln.split() for ln in out.splitlines() if ln.startswith(group)]
        return {int(r[2]): (int(r[3]), int(r[4])) for r in rows}
    before = offsets()
    assert sum(cur for cur, _ in before.values()) == 100
    assert all(cur == end for cur, end in before.values())

    out = proxy3.tool("consumer-groups", "--reset-offsets", "--group", group, "--topic",
                      topic_name, "--to-earliest", "--execute").stdout
    assert topic_name in out
    after = offsets()
    assert all(cur == 0 for cur, _ in after.values())
    # The reset is real: the group reads all 100 again.
    assert len(consume(proxy3, topic_name, 100, group=group)) == 100

    proxy3.tool("consumer-groups", "--reset-offsets", "--group", group,
                "--topic", f"{topic_name}:0", "--to-offset", 7, "--execute")
    assert offsets()[0][0] == 7

    a.delete_consumer_groups([group])[group].result(timeout=30)
    assert group not in proxy3.tool("consumer-groups", "--list").stdout.split()


def test_acls(proxy3, topic_name):
    create_topic(proxy3, topic_name, partitions=1)
    produce(proxy3, topic_name, 5)
    # Java tool: an ACL for alice on the topic (anonymous clients then lose the
    # allow-if-no-ACL default on it).
    proxy3.tool("acls", "--add", "--allow-principal", "User:alice", "--operation", "Read",
                "--operation", "Write", "--topic", topic_name)
    a = AdminClient(proxy3.conf())
    flt = AclBindingFilter(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL,
                           None, None, AclOperation.ANY, AclPermissionType.ANY)
    try:
        # The broker that answers may not have it from the metadata log yet (seen under load): asked again.
        wait_until(lambda: all(w in proxy3.tool("acls", "--list", "--topic", topic_name).stdout
                               for w in ("principal=User:alice", "operation=READ")),
                   30, 0.5, "the Java tool listing alice's ACL")

        # The admin client adds and describes one more.
        binding = AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL,
                             "User:bob", "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW)
        a.create_acls([binding])[binding].result(timeout=30)
        # The broker that answers may not have the new ACL from the metadata log yet: poll.
        want = {("User:alice", AclOperation.READ), ("User:alice", AclOperation.WRITE),
                ("User:bob", AclOperation.DESCRIBE)}
        # Not asked once more after that: another broker may answer, without it yet (seen under load).
        def described():
            got = {(b.principal, b.operation) for b in a.describe_acls(flt).result(timeout=30)}
            return got if got == want else None
        assert wait_until(described, 30, 0.3, "the three ACLs described") == want

        # The authorizer now refuses the anonymous producer that comes through the proxy.
        wait_until(lambda: produce_error(proxy3, topic_name) == KafkaError.TOPIC_AUTHORIZATION_FAILED,
                   60, 0.5, "TOPIC_AUTHORIZATION_FAILED")
    finally:
        deleted = a.delete_acls([flt])[flt].result(timeout=30)
    assert len(deleted) == 3
    wait_until(lambda: not a.describe_acls(flt).result(timeout=30), 30, 0.3, "no ACLs left")
    # And allowed again once the ACLs are gone.
    wait_until(lambda: produce_error(proxy3, topic_name) is None, 60, 0.5,
               "produce allowed again")


def produce_error(proxy, topic):
    """The error code of producing one record through the proxy (None when it was acked)."""
    errs = []
    p = Producer(proxy.conf(**{"message.timeout.ms": 5000}))
    p.produce(topic, b"probe", on_delivery=lambda e, m: errs.append(e))
    p.flush(20)
    assert len(errs) == 1
    return errs[0].code() if errs[0] is not None else None
