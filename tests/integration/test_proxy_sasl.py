"""SASL passed through kmirrord: a proxy in front of the brokers' SASL listener, clients log in
with PLAIN and SCRAM through it as themselves, and the brokers enforce ACLs per principal."""

import pytest
from confluent_kafka import KafkaError, Producer

from harness import USERS
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import consume, produce, wait_until

pytestmark = pytest.mark.proxy


def sasl(user, mech):
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mech,
            "sasl.username": user, "sasl.password": USERS[user]}


@pytest.fixture
def sasl_proxy(proxy_factory, dest_cluster3):
    return proxy_factory(dest_cluster3, upstream=dest_cluster3.sasl_bootstrap,
                         upstream_sasl_mechanism="SCRAM-SHA-512", upstream_sasl_username="admin",
                         upstream_sasl_password=USERS["admin"])


def test_sasl_logins_and_acls_through_the_proxy(sasl_proxy, dest_cluster3, topic_name):
    p = sasl_proxy
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 3, 30,
               what="the proxy's own SCRAM login and metadata")
    admin_conf = sasl("admin", "PLAIN")
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient(p.conf(**admin_conf))
    a.create_topics([NewTopic(topic_name, 1, 3)])[topic_name].result(timeout=60)
    dest_cluster3.wait_topic(topic_name, 1)
    md = a.list_topics(topic_name, timeout=15)
    assert {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()} == p.advertised()
    dest_cluster3.tool("acls", "--add", "--allow-principal", "User:alice", "--operation", "All",
                       "--topic", topic_name, admin=True)
    try:
        for mech in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            acked = produce(p, topic_name, 50, key=lambda i, m=mech: f"{m}-{i}",
                            **sasl("alice", mech))
            assert len(acked) == 50
        msgs = consume(p, topic_name, 150, **sasl("alice", "SCRAM-SHA-256"))
        assert sorted(m.key().decode() for m in msgs) == sorted(
            f"{m}-{i}" for m in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") for i in range(50))

        # bob has no ACL on the topic: the broker refuses him, through the proxy, as himself.
        def bob_refused():
            errs = []
            prod = Producer(p.conf(**sasl("bob", "SCRAM-SHA-512"), **{"message.timeout.ms": 5000}))
            prod.produce(topic_name, b"bob", on_delivery=lambda e, m: errs.append(e))
            prod.flush(20)
            return errs and errs[0] is not None and \
                errs[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        wait_until(bob_refused, 30, 0.5, "bob to be refused")

        # A wrong password fails the login and the proxy stays up.
        bad = dict(sasl("alice", "SCRAM-SHA-256"), **{"sasl.password": "wrong"})
        errs = []
        conf = p.conf(**bad, **{"message.timeout.ms": 5000})
        conf["error_cb"] = errs.append
        prod = Producer(conf)
        prod.produce(topic_name, b"x")
        prod.flush(10)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errs), errs
        assert p.running()
    finally:
        dest_cluster3.tool("acls", "--remove", "--force", "--allow-principal", "User:alice",
                           "--operation", "All", "--topic", topic_name, admin=True)
