"""PKCS12 trust and key stores on every side, against real brokers that require client certificates.

The source's and the destination's brokers have an SSL listener with their own PKCS12 keystore and
a keytool PKCS12 truststore. The source requires a client certificate (ssl.client.auth=required):
the mirror presents the one in its ssl.keystore.* (the store inside mirror_file_dir, its password a
sealed secret). The destination requests one and lets only kmirrord's certificate (CN=kmirrord, a
super user) write the mirror topics: kmirrord's own connections present the one in
upstream_tls_keystore_file, client sessions none. kmirrord's listener speaks TLS from
tls_keystore_file and requires client certificates verified against tls_truststore_file; clients
and the kmirror CLI present theirs from PKCS12 stores. Two kmirrords run in front of the
destination with the same settings. A wrong password, a JKS store and a PEM file where a store is
expected are refused with one line that says what to do."""

import os
import shutil
import subprocess
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from harness import KafkaCluster, pki as pki_mod
from mirror_cli import find_kmirror
from mirror_data import compare_topic, main_release_only, produce_records, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, secret_key_and_file_dir, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

PW = "kmirror-store-pw"


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    why = pki_mod.available()
    if why:
        pytest.skip(why)
    p = pki_mod.Pki(tmp_path_factory.mktemp("stores"))
    server = "extendedKeyUsage=serverAuth\n"
    client = "extendedKeyUsage=clientAuth\n"
    p.broker = p.keystore("broker", "/CN=broker", f"subjectAltName=IP:127.0.0.1\n{server}", PW)
    p.listener = p.keystore("listener", "/CN=kmirrord-listener",
                            f"subjectAltName=IP:{PROXY_HOST},DNS:localhost\n{server}", PW)
    p.kmirrord = p.keystore("kmirrord", "/CN=kmirrord", client, PW)
    p.mirror = p.keystore("mirror", "/CN=mirror-reader", client, PW)
    p.app = p.keystore("app", "/CN=app", client, PW)
    p.trust = p.truststore("trust.p12", PW)
    p.jks = p.truststore("trust.jks", PW, kind="JKS")
    return p


def mtls_cluster(name, p, client_auth, supers):
    """One broker with an MTLS listener (SSL, PKCS12 keystore and truststore) beside the harness's own."""
    listener = "listener.name.mtls."
    c = KafkaCluster(name, brokers=1, extra_listeners={"MTLS": {1: "127.0.0.1:0"}}, overrides={
        "listener.security.protocol.map": "CLIENT:PLAINTEXT,SASL:SASL_PLAINTEXT,INTERNAL:SASL_PLAINTEXT,"
                                          "CONTROLLER:SASL_PLAINTEXT,MTLS:SSL",
        listener + "ssl.client.auth": client_auth,
        listener + "ssl.keystore.type": "PKCS12",
        listener + "ssl.keystore.location": p.broker,
        listener + "ssl.keystore.password": PW,
        listener + "ssl.key.password": PW,
        listener + "ssl.truststore.type": "PKCS12",
        listener + "ssl.truststore.location": p.trust,
        listener + "ssl.truststore.password": PW,
        "super.users": supers,
    })
    node = c.nodes[1]
    c.extra_listeners["MTLS"] = {1: f"127.0.0.1:{node.extra_ports['MTLS']}"}
    c.mtls = c.extra_listeners["MTLS"][1]
    return c


@pytest.fixture(scope="module")
def clusters(pki):
    src = mtls_cluster("p12-src", pki, "required", "User:admin")
    dst = mtls_cluster("p12-dst", pki, "requested", "User:admin;User:CN=kmirrord")
    # One after the other from this thread: a broker dies with the thread that started it.
    for c in (src, dst):
        c.start()
    # Only kmirrord's certificate writes the mirror topics; clients without one do all else.
    for acl in (("--allow-principal", "User:ANONYMOUS", "--operation", "All"),
                ("--deny-principal", "User:ANONYMOUS", "--operation", "Write")):
        dst.tool("acls", "--add", *acl, "--resource-pattern-type", "prefixed", "--topic", "p12-", admin=True)
    yield src, dst
    for c in (src, dst):
        c.stop()


def proxy_options(pki, dst, files, key):
    return dict(upstream=dst.mtls, upstream_tls="true",
                upstream_tls_truststore_file=pki.trust, upstream_tls_truststore_password=PW,
                upstream_tls_keystore_file=pki.kmirrord, upstream_tls_keystore_password=PW,
                tls_keystore_file=pki.listener, tls_keystore_password=PW,
                tls_truststore_file=pki.trust, tls_truststore_password=PW, tls_client_auth="required",
                mirror_secret_key_file=key, mirror_file_dir=files, mirror_pipelines="owned")


@pytest.fixture(scope="module")
def setup(pki, tmp_path_factory):
    """The mirror's files (its stores, in mirror_file_dir) and kmirrord's secret key."""
    key, files = secret_key_and_file_dir(tmp_path_factory.mktemp("p12-proxy"))
    for f in (pki.mirror, pki.trust, pki.jks, pki.path("mirror.pem")):
        shutil.copy(f, files)
    return str(files), str(key)


def client_conf(pki, bootstrap, **extra):
    """A librdkafka client of kmirrord's TLS listener, its certificate from a PKCS12 keystore."""
    return {"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": pki.ca,
            "ssl.keystore.location": pki.app, "ssl.keystore.password": PW, **extra}


def cli(bootstrap, props, *args, expect=0):
    argv = [find_kmirror(), "--bootstrap-server", bootstrap, "--timeout-ms", "20000", "--command-config", props,
            *[str(a) for a in args]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if expect is not None:
        assert r.returncode == expect, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def write(path, lines):
    with open(path, "w") as f:
        f.write("".join(ln + "\n" for ln in lines))
    return str(path)


def test_pkcs12_everywhere(proxy_factory, clusters, pki, setup, tmp_path):
    src, dst = clusters
    files, key = setup
    opts = proxy_options(pki, dst, files, key)
    a = proxy_factory(dst, name="kmirrord-a", **opts)
    b = proxy_factory(dst, name="kmirrord-b", **opts)
    for p in (a, b):
        wait_until(lambda: p.http_get("/readyz")[0] == 200, 60, 0.5,
                   f"{p.name} ready over the destination's MTLS listener\n{p.output()[-3000:]}")

    topic, mirror = unique("p12"), unique("p12-mirror")
    admin = AdminClient({"bootstrap.servers": src.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=60)
    src.wait_topic(topic, 2)
    assert produce_records(src.bootstrap, topic, 2000, compression="zstd") == 2000

    operator = write(tmp_path / "operator.properties",
                     ["security.protocol=SSL", f"ssl.truststore.location={pki.trust}", "ssl.truststore.type=PKCS12",
                      f"ssl.truststore.password={PW}", f"ssl.keystore.location={pki.app}",
                      "ssl.keystore.type=PKCS12", f"ssl.keystore.password={PW}"])
    store = lambda name: os.path.join(files, os.path.basename(name))  # noqa: E731
    mirror_tls = ["security.protocol=SSL", f"ssl.truststore.location={store(pki.trust)}",
                  "ssl.truststore.type=PKCS12", f"ssl.truststore.password={PW}",
                  f"ssl.keystore.location={store(pki.mirror)}", "ssl.keystore.type=PKCS12",
                  f"ssl.keystore.password={PW}", f"ssl.key.password={PW}"]

    # Mistakes are refused at create, one line naming the store and what to do; no password echoed.
    for name, lines, needles in (
            ("wrong-pw", [ln if "password" not in ln or "truststore" in ln else ln.split("=")[0] + "=nope"
                          for ln in mirror_tls],
             ("PKCS12 keystore", store(pki.mirror), "wrong password")),
            ("jks", [ln if not ln.startswith("ssl.truststore.location") else
                     f"ssl.truststore.location={store(pki.jks)}" for ln in mirror_tls],
             ("JKS keystore", "keytool -importkeystore", "-deststoretype PKCS12")),
            ("pem", [ln if not ln.startswith("ssl.keystore.location") else
                     f"ssl.keystore.location={store(pki.path('mirror.pem'))}" for ln in mirror_tls],
             ("is a PEM file", "ssl.keystore.type=PEM")),
            ("both", [*mirror_tls, f"ssl.ca.location={store(pki.trust)}"], ("keep one",))):
        r = cli(a.bootstrap, operator, "create", "--mirror", f"{mirror}-{name}", "--source-bootstrap", src.mtls,
                "--config-file", write(tmp_path / f"{name}.properties", lines), expect=1)
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and "INVALID_CLUSTER_MIRROR_CONFIG" in err[0], r.stderr
        assert all(n in err[0] for n in needles), (needles, err[0])
        assert "nope" not in r.stderr and PW not in r.stderr, r.stderr

    cli(a.bootstrap, operator, "create", "--mirror", mirror, "--source-bootstrap", src.mtls, "--config-file",
        write(tmp_path / "mirror.properties", mirror_tls))
    cli(b.bootstrap, operator, "start", "--mirror", mirror, "--topics", topic)

    def caught_up(p):
        s = watermarks(src.bootstrap, topic, 2)
        d = watermarks(p.bootstrap, topic, 2, **client_conf(pki, p.bootstrap))
        return s == d and s
    for p in (a, b):
        try:
            marks = wait_until(lambda: caught_up(p), 90, 1.0, f"the mirror of {topic} through {p.name}")
            total, _ = compare_topic(p.bootstrap, src.bootstrap, topic, 2, marks=marks,
                                     proxy_conf=client_conf(pki, p.bootstrap, debug="broker,fetch,protocol"))
        except AssertionError:
            print("source", watermarks(src.bootstrap, topic, 2), "destination", watermarks(dst.bootstrap, topic, 2),
                  {q.name: watermarks(q.bootstrap, topic, 2, **client_conf(pki, q.bootstrap)) for q in (a, b)})
            print(a.output()[-6000:], "\n-----\n", b.output()[-6000:])
            raise
        assert total == 2000
    r = cli(a.bootstrap, operator, "describe", "--mirror", mirror)
    assert topic in r.stdout and "MIRRORING" in r.stdout, r.stdout
    assert PW not in r.stdout

    # kmirrord requires a client certificate: a client without one is refused in the handshake.
    c = Consumer({"bootstrap.servers": a.bootstrap, "security.protocol": "SSL", "ssl.ca.location": pki.ca,
                  "group.id": unique("nocert")})
    try:
        with pytest.raises(Exception):
            c.list_topics(timeout=5)
    finally:
        c.close()


@pytest.mark.parametrize("option, value, needles", [
    ("upstream_tls_keystore_password", "wrong", ("PKCS12 keystore", "kmirrord.p12", "wrong password")),
    ("tls_keystore_file", "trust.jks", ("JKS keystore", "keytool -importkeystore", "-deststoretype PKCS12")),
    ("tls_truststore_file", "ca.pem", ("is a PEM file",)),
])
def test_bad_stores_stop_kmirrord_at_start(proxy_factory, clusters, pki, setup, option, value, needles):
    """kmirrord does not start on a store it cannot use, and says which and why in one line."""
    _, dst = clusters
    files, key = setup
    opts = proxy_options(pki, dst, files, key)
    opts[option] = value if option.endswith("password") else pki.path(value)
    p = proxy_factory(dst, name=f"kmirrord-bad-{option}", start=False, **opts)
    with pytest.raises(Exception):
        p.start(timeout=10)
    out = p.output()
    assert all(n in out for n in needles), (needles, out[-2000:])
    assert PW not in out and "wrong" not in out.replace("wrong password", "")
