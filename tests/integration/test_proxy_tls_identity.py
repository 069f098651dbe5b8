"""Client identities through kmirrord on a destination that authenticates by certificate.

kmirrord's own connections (state, metadata, pipelines) present upstream_tls_cert_file; a client
session must never present it: on a listener with ssl.client.auth, the broker would take every
client of kmirrord, unauthenticated ones included, for kmirrord's principal, which the hardening
guide makes a super user. A real broker with an SSL listener (ssl.client.auth=requested, PKCS12
keystore, PEM truststore), the standard authorizer, kmirrord's certificate CN=kmirrord a super
user and ANONYMOUS denied on one topic: a client through kmirrord must be refused there."""

import os
import shutil
import subprocess
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from harness import KafkaCluster
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

TOPIC_AUTHORIZATION_FAILED = 29
PASSWORD = "kmirror-test"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def issue(d, name, subject, ext):
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", subject, cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(ext)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, the broker's certificate (PKCS12, IP SAN 127.0.0.1) and kmirrord's client certificate."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl tool")
    d = str(tmp_path_factory.mktemp("mtls"))
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=kmirror test mtls ca", cwd=d)
    issue(d, "broker", "/CN=broker", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    issue(d, "kmirrord", "/CN=kmirrord", "extendedKeyUsage=clientAuth\n")
    openssl("pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-out", "broker.p12",
            "-passout", f"pass:{PASSWORD}", cwd=d)
    return {k: os.path.join(d, v) for k, v in (("ca", "ca.pem"), ("broker", "broker.p12"),
                                                ("cert", "kmirrord.pem"), ("key", "kmirrord.key"))}


@pytest.fixture(scope="module")
def mtls_cluster(pki):
    """One broker with an MTLS listener (SSL, client certificates requested) next to the harness's own."""
    listener = "listener.name.mtls."
    c = KafkaCluster("mtls", brokers=1, extra_listeners={"MTLS": {1: "127.0.0.1:0"}}, overrides={
        "listener.security.protocol.map": "CLIENT:PLAINTEXT,SASL:SASL_PLAINTEXT,INTERNAL:SASL_PLAINTEXT,"
                                          "CONTROLLER:SASL_PLAINTEXT,MTLS:SSL",
        listener + "ssl.client.auth": "requested",
        listener + "ssl.keystore.type": "PKCS12",
        listener + "ssl.keystore.location": pki["broker"],
        listener + "ssl.keystore.password": PASSWORD,
        listener + "ssl.key.password": PASSWORD,
        listener + "ssl.truststore.type": "PEM",
        listener + "ssl.truststore.location": pki["ca"],
        "super.users": "User:admin;User:CN=kmirrord",
    })
    node = c.nodes[1]
    c.extra_listeners["MTLS"] = {1: f"127.0.0.1:{node.extra_ports['MTLS']}"}
    c.start()
    yield c, f"127.0.0.1:{node.extra_ports['MTLS']}"
    c.stop()


def end_offset(cluster, topic):
    """The topic's end offset, read as the super user (ANONYMOUS is denied on it)."""
    conf = cluster.client_props(user="admin")
    conf["group.id"] = f"wm-{uuid.uuid4().hex[:6]}"
    c = Consumer(conf)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        c.close()


def test_client_sessions_do_not_present_kmirrords_certificate(proxy_factory, mtls_cluster, pki):
    cluster, mtls = mtls_cluster
    topic = f"guarded-{uuid.uuid4().hex[:8]}"
    cluster.tool("topics", "--create", "--topic", topic, "--partitions", "1", admin=True)
    cluster.tool("acls", "--add", "--deny-principal", "User:ANONYMOUS", "--operation", "All", "--topic", topic,
                 admin=True)
    p = proxy_factory(cluster, upstream=mtls, upstream_tls="true", upstream_tls_ca_file=pki["ca"],
                      upstream_tls_cert_file=pki["cert"], upstream_tls_key_file=pki["key"])
    # kmirrord's own connections authenticate as CN=kmirrord (a super user): its state store loads.
    wait_until(lambda: p.http_get("/healthz")[0] == 200, 60, 0.5, "kmirrord ready over the MTLS listener")
    errors = []
    pr = Producer(p.conf(**{"message.timeout.ms": 15000, "retries": 0}))
    pr.produce(topic, b"written as whom?", on_delivery=lambda err, m: errors.append(err))
    pr.flush(30)
    print("a client without a certificate, through kmirrord:", errors)
    assert end_offset(cluster, topic) == 0, "the client wrote with kmirrord's identity"
    assert errors and errors[0] is not None and errors[0].code() == TOPIC_AUTHORIZATION_FAILED, errors
