"""The kmirror CLI's --command-config against real kmirrord: SASL (SCRAM-SHA-512, SCRAM-SHA-256 and
PLAIN, Kafka tool properties with a JAAS line) through kmirrord to the destination's SASL listener,
where the destination's ACLs decide each mirror RPC as the CLI's principal; wrong passwords; and
kmirrord's client-facing TLS (security.protocol=SSL and SASL_SSL with ssl.ca.location, hostname
verification, properties kmirror does not take refused with what to use instead); and Java's PKCS12
trust and key stores made with keytool (ssl.truststore.*, ssl.keystore.*), JKS refused with the
command that converts it."""

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid

import pytest

from harness import USERS
from mirror_cli import Cli, kmirror_bin, wait_states  # noqa: F401
from mirror_data import main_release_only
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
# Every command that speaks a mirror RPC.
COMMANDS = ("create", "alter", "delete", "list", "describe", "start", "stop", "pause", "resume",
            "last-mirrored-offsets")


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class SecureCli(Cli):
    """Cli with a --command-config file on every command."""

    def __init__(self, binary, bootstrap, props):
        super().__init__(binary, bootstrap)
        self.props = props

    def run(self, *args, **kw):
        return super().run("--command-config", self.props, *args, **kw)


def write_props(directory, lines):
    path = os.path.join(str(directory), f"client-{uuid.uuid4().hex[:8]}.properties")
    with open(path, "w") as f:
        f.write("".join(ln + "\n" for ln in lines))
    return path


def sasl_props(directory, user, mechanism, password=None, protocol="SASL_PLAINTEXT", extra=()):
    """A Kafka tool properties file: security.protocol, sasl.mechanism and a JAAS line."""
    module = PLAIN if mechanism == "PLAIN" else SCRAM
    pw = USERS[user] if password is None else password
    return write_props(directory, [f"security.protocol={protocol}", f"sasl.mechanism={mechanism}",
                                   f'sasl.jaas.config={module} required username="{user}" password="{pw}";',
                                   *extra])


def one_line_error(r, *needles):
    """r failed with exit 1 and exactly one stderr line containing every needle; returns the line."""
    assert r.returncode == 1, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr:\n{r.stderr}"
    print("refused:", lines[0])  # shown with pytest -s: what a user reads
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ---- SASL through kmirrord to the destination's SASL listener --------------------------------

@pytest.fixture
def sasl_proxy(proxy_factory, dest_cluster3):
    p = proxy_factory(dest_cluster3, upstream=dest_cluster3.sasl_bootstrap,
                      upstream_sasl_mechanism="SCRAM-SHA-512", upstream_sasl_username="admin",
                      upstream_sasl_password=USERS["admin"])
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 3, 60, what="the proxy's login")
    return p


def admin_topic(proxy, topic, partitions=2):
    """Creates topic through the proxy as the super user admin."""
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient(proxy.conf(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                  "sasl.username": "admin", "sasl.password": USERS["admin"]}))
    a.create_topics([NewTopic(topic, partitions, 3)])[topic].result(timeout=60)
    proxy.cluster.wait_topic(topic, partitions)


ALICE_ACL = ["--allow-principal", "User:alice", "--operation", "AlterConfigs", "--operation",
             "DescribeConfigs"]


@contextlib.contextmanager
def alice_acls(cluster, topics=()):
    """alice may alter and describe the configs of the cluster and of topics. The test bed's
    authorizer has allow.everyone.if.no.acl.found=true: a resource with no ACL at all is open to
    everyone, so these ACLs are also what makes bob (who has none) be refused."""
    cluster.tool("acls", "--add", *ALICE_ACL, "--cluster", admin=True)
    for t in topics:
        cluster.tool("acls", "--add", *ALICE_ACL, "--topic", t, admin=True)
    try:
        yield
    finally:
        cluster.tool("acls", "--remove", "--force", *ALICE_ACL, "--cluster", admin=True)
        for t in topics:
            cluster.tool("acls", "--remove", "--force", *ALICE_ACL, "--topic", t, admin=True)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_sasl_acls_decide_each_command(kmirror_bin, sasl_proxy, dest_cluster3, source_cluster, tmp_path, mechanism):
    p = sasl_proxy
    admin = SecureCli(kmirror_bin, p.bootstrap, sasl_props(tmp_path, "admin", mechanism))
    bob = SecureCli(kmirror_bin, p.bootstrap, sasl_props(tmp_path, "bob", mechanism))
    alice = SecureCli(kmirror_bin, p.bootstrap, sasl_props(tmp_path, "alice", mechanism))
    mirror, m2 = unique("sec"), unique("sec2")
    t1, t2 = unique("sec-a"), unique("sec-b")
    admin_topic(p, t1, 2)
    admin_topic(p, t2, 1)
    # The super user admin (no ACL needed) makes the mirror bob is refused on.
    # a reachable source without these topics: the partitions wait for them while MIRRORING;
    # no ACL sync (its default scope * would delete alice's ACLs, which the source lacks)
    admin.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap,
              "--config", "mirror.acl.include=")
    with alice_acls(dest_cluster3, (t1, t2)):
        # ACLs reach every broker a little later: wait until bob is refused and alice is not.
        wait_until(lambda: bob.run("list", expect=None).returncode == 1 and
                   alice.run("list", expect=None).returncode == 0, 30, 0.5, "the ACLs")
        check_acls(p, bob, alice, mirror, m2, t1, t2)
    assert p.running()


def check_acls(p, bob, alice, mirror, m2, t1, t2):
    # bob has no ACL: each command exits 1 with one line naming the authorization code, table
    # and JSON (whose document carries the same error).
    cluster_refused = {
        "create": ["create", "--mirror", unique("bob"), "--source-bootstrap", "a:1"],
        "alter": ["alter", "--mirror", mirror, "--config", "mirror.topic.num.partitions=3"],
        "delete": ["delete", "--mirror", mirror],
        "list": ["list"],
        "describe": ["describe", "--mirror", mirror],
        "last-mirrored-offsets": ["last-mirrored-offsets", "--mirror", mirror],
    }
    for cmd, args in cluster_refused.items():
        err, out, doc = bob.refused("CLUSTER_AUTHORIZATION_FAILED", *args)
        assert err.startswith(f"kmirror: {cmd}: CLUSTER_AUTHORIZATION_FAILED: "), err
        assert doc["error"]["name"] == "CLUSTER_AUTHORIZATION_FAILED" and doc["error"]["code"] == 31, doc
        assert doc["error"]["message"], doc
    for cmd in ("start", "stop", "pause", "resume"):
        err, out, doc = bob.refused("TOPIC_AUTHORIZATION_FAILED", cmd, "--mirror", mirror, "--topics", t1)
        assert err.startswith(f"kmirror: {cmd}: TOPIC_AUTHORIZATION_FAILED: not authorized to {cmd} "
                              f"mirroring of topic {t1}"), err
        assert doc["topics"][0]["name"] == t1, doc
        assert doc["topics"][0]["error"]["name"] == "TOPIC_AUTHORIZATION_FAILED", doc
        # Two topics: each refused as bob, in the table and the JSON document.
        err, out, doc = bob.refused("TOPIC_AUTHORIZATION_FAILED", cmd, "--mirror", mirror, "--topics", f"{t1},{t2}")
        assert err.startswith(f"kmirror: {cmd}: 2 of 2 topics refused; first: TOPIC_AUTHORIZATION_FAILED: "), err
        assert [ln.split()[:2] for ln in out.splitlines()[1:]] == [
            [t1, "TOPIC_AUTHORIZATION_FAILED"], [t2, "TOPIC_AUTHORIZATION_FAILED"]], out
        assert [(t["name"], t["error"]["code"]) for t in doc["topics"]] == [(t1, 29), (t2, 29)], doc
    assert set(cluster_refused) | {"start", "stop", "pause", "resume"} == set(COMMANDS)

    # alice has AlterConfigs and DescribeConfigs on the cluster and on the topics: each command
    # succeeds, in table and in JSON form.
    r = alice.run("create", "--mirror", m2, "--source-bootstrap", "source.invalid:9092")
    assert r.stdout.strip() == f"Created mirror {m2}."
    doc, _ = alice.json("delete", "--mirror", m2)
    assert doc == {"mirror": m2, "deleted": True}
    doc, _ = alice.json("create", "--mirror", m2, "--source-bootstrap", "source.invalid:9092")
    assert doc["mirror"] == m2 and not doc.get("error"), doc

    r = alice.run("list")
    assert any(ln.split()[:1] == [mirror] for ln in r.stdout.splitlines()), r.stdout
    doc, _ = alice.json("list")
    assert {mirror, m2} <= {m["name"] for m in doc["mirrors"]}, doc

    r = alice.run("alter", "--mirror", mirror, "--config", "mirror.fetch.max.bytes=2097152")
    assert r.stdout.strip() == f"Altered mirror {mirror}."
    doc, _ = alice.json("alter", "--mirror", mirror, "--config", "mirror.fetch.max.bytes=1048576")
    assert doc["mirror"] == mirror and not doc.get("error"), doc

    r = alice.run("start", "--mirror", mirror, "--topics", t1)
    assert r.stdout.split() == ["TOPIC", "RESULT", "MESSAGE", t1, "started", "-"], r.stdout
    doc, _ = alice.json("start", "--mirror", mirror, "--topics", t2)
    assert doc == {"mirror": mirror, "operation": "start", "topics": [{"name": t2, "error": None}]}
    wait_states(alice, mirror, {t1: "MIRRORING", t2: "MIRRORING"})

    r = alice.run("describe", "--mirror", mirror)
    assert r.stdout.splitlines()[0] == f"Mirror: {mirror}"
    rows = [ln.split() for ln in r.stdout.splitlines()]
    assert sorted(row[:3] for row in rows if row and row[0] in (t1, t2)) == sorted(
        [[t1, "0", "MIRRORING"], [t1, "1", "MIRRORING"], [t2, "0", "MIRRORING"]]), r.stdout

    r = alice.run("pause", "--mirror", mirror, "--topics", t1)
    assert r.stdout.split()[3:5] == [t1, "paused"], r.stdout
    doc, _ = alice.json("pause", "--mirror", mirror, "--topics", t2)
    assert doc["topics"] == [{"name": t2, "error": None}], doc
    wait_states(alice, mirror, {t1: "PAUSED", t2: "PAUSED"})
    r = alice.run("resume", "--mirror", mirror, "--topics", t1)
    assert r.stdout.split()[3:5] == [t1, "resumed"], r.stdout
    doc, _ = alice.json("resume", "--mirror", mirror, "--topics", t2)
    assert doc["topics"] == [{"name": t2, "error": None}], doc
    wait_states(alice, mirror, {t1: "MIRRORING", t2: "MIRRORING"})

    r = alice.run("last-mirrored-offsets", "--mirror", mirror, "--topics", t1)
    rows = [ln.split() for ln in r.stdout.splitlines()]
    assert rows[0][:3] == ["TOPIC", "PARTITION", "STATE"]
    assert [row[:3] for row in rows[1:]] == [[t1, "0", "MIRRORING"], [t1, "1", "MIRRORING"]], r.stdout
    doc, _ = alice.json("last-mirrored-offsets", "--mirror", mirror)
    assert sorted(t["name"] for t in doc["topics"]) == sorted([t1, t2]), doc

    r = alice.run("stop", "--mirror", mirror, "--topics", t1)
    assert r.stdout.split()[3:5] == [t1, "stopped"], r.stdout
    doc, _ = alice.json("stop", "--mirror", mirror, "--topics", t2)
    assert doc["topics"] == [{"name": t2, "error": None}], doc
    wait_states(alice, mirror, {t1: "STOPPED", t2: "STOPPED"})
    doc, _ = alice.json("describe", "--mirror", mirror)
    assert doc["mirrors"][0]["name"] == mirror

    r = alice.run("delete", "--mirror", m2)
    assert r.stdout.strip() == f"Deleted mirror {m2}.", r.stdout
    doc, _ = alice.json("delete", "--mirror", mirror)
    assert doc == {"mirror": mirror, "deleted": True}

    assert p.running()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_sasl_wrong_password_fails_at_once(kmirror_bin, sasl_proxy, tmp_path, mechanism):
    p = sasl_proxy
    for props, what in ((sasl_props(tmp_path, "alice", mechanism, password="wrong"), "wrong password"),
                        (sasl_props(tmp_path, "nobody-" + uuid.uuid4().hex[:6], mechanism, password="x"),
                         "unknown user")):
        cli = SecureCli(kmirror_bin, p.bootstrap, props)
        for output in (None, "json"):
            t0 = time.monotonic()
            r = cli.run("list", expect=None, output=output)
            took = time.monotonic() - t0
            line = one_line_error(r, f"cannot connect to {p.bootstrap}", f"SASL {mechanism} failed",
                                  "SASL_AUTHENTICATION_FAILED")
            assert "password" in line or "credentials" in line, (what, line)
            assert USERS["alice"] not in line and 'password="' not in line
            assert took < 10, f"{what}: took {took:.1f}s (the CLI's timeout is 20 s): {line}"
            assert r.stdout == "", r.stdout
    assert p.running()


def test_sasl_properties_refused_before_connecting(kmirror_bin, sasl_proxy, tmp_path):
    """Properties that cannot work are refused with exit 2 and one line, before any connection."""
    p = sasl_proxy
    cases = [
        ([f"security.protocol=SASL_PLAINTEXT",
          f'sasl.jaas.config={SCRAM} required username="alice" password="x";'],
         "sasl.mechanism is required"),
        (["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=GSSAPI",
          f'sasl.jaas.config={SCRAM} required username="alice" password="x";'],
         "GSSAPI takes com.sun.security.auth.module.Krb5LoginModule"),
        (["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
          f'sasl.jaas.config={SCRAM} required username="alice" password="x";'],
         "does not match"),
        (["security.protocol=PLAINTEXT", "sasl.mechanism=PLAIN"], "need security.protocol SASL_PLAINTEXT"),
        (["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=SCRAM-SHA-512",
          f'sasl.jaas.config={SCRAM} required username="alice" password="x"'],
         "missing ';'"),
        (["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=SCRAM-SHA-512",
          "sasl.kerberos.service.name=kafka"], "sasl.kerberos.* properties are for sasl.mechanism=GSSAPI"),
    ]
    for lines, why in cases:
        cli = SecureCli(kmirror_bin, p.bootstrap, write_props(tmp_path, lines))
        r = cli.run("list", expect=2)
        assert r.stderr.count("\n") == 1 and why in r.stderr, (lines, r.stderr)
    # A password never shows in an error about the file.
    cli = SecureCli(kmirror_bin, p.bootstrap, write_props(
        tmp_path, ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
                   f'sasl.jaas.config={SCRAM} required username="alice" password="hunter2-secret";']))
    r = cli.run("list", expect=2)
    assert "hunter2-secret" not in r.stderr


# ---- TLS: kmirrord's client-facing listener -----------------------------------------------------

def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, kmirrord's certificate for PROXY_HOST (IP SAN) and one for another name only, and an
    unrelated CA: PEM files made with the openssl tool."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl tool")
    d = str(tmp_path_factory.mktemp("cli-tls"))
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN=kmirror test {ca}", cwd=d)
    for name, san in (("server", f"IP:{PROXY_HOST},DNS:localhost"), ("wrong-host", "DNS:elsewhere.invalid")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    out = {k: os.path.join(d, f"{k}.pem") for k in ("ca", "other-ca", "server", "wrong-host")}
    out.update({f"{k}-key": os.path.join(d, f"{k}.key") for k in ("server", "wrong-host")})
    return out


def tls_proxy(proxy_factory, cluster, certs, cert="server", **options):
    return proxy_factory(cluster, tls_cert_file=certs[cert], tls_key_file=certs[f"{cert}-key"], **options)


def test_tls_command_config(kmirror_bin, proxy_factory, dest_cluster, source_cluster, certs, tmp_path):
    p = tls_proxy(proxy_factory, dest_cluster, certs)
    ssl = SecureCli(kmirror_bin, p.bootstrap,
                    write_props(tmp_path, ["security.protocol=SSL", f"ssl.ca.location={certs['ca']}"]))
    mirror = unique("tls")
    t = unique("tls-t")
    dest_cluster.create_topic(t, partitions=1)
    r = ssl.run("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    assert r.stdout.strip() == f"Created mirror {mirror}."
    doc, _ = ssl.json("list")
    assert mirror in {m["name"] for m in doc["mirrors"]}
    assert any(ln.split()[:1] == [mirror] for ln in ssl.run("list").stdout.splitlines())
    doc, _ = ssl.json("start", "--mirror", mirror, "--topics", t)
    assert doc["topics"] == [{"name": t, "error": None}]
    wait_states(ssl, mirror, {t: "MIRRORING"})
    r = ssl.run("describe", "--mirror", mirror)
    assert r.stdout.splitlines()[0] == f"Mirror: {mirror}"
    ssl.run("stop", "--mirror", mirror, "--topics", t)
    wait_states(ssl, mirror, {t: "STOPPED"})
    doc, _ = ssl.json("delete", "--mirror", mirror)
    assert doc == {"mirror": mirror, "deleted": True}

    # Failures are one line, exit 1, and quick (the timeout is 20 s).
    def fails(lines, *needles):
        cli = SecureCli(kmirror_bin, p.bootstrap, write_props(tmp_path, lines))
        t0 = time.monotonic()
        r = cli.run("list", expect=None)
        line = one_line_error(r, *needles)
        assert time.monotonic() - t0 < 10, line
        return line

    # A CA that did not sign kmirrord's certificate; no CA (the system store does not know it).
    fails(["security.protocol=SSL", f"ssl.ca.location={certs['other-ca']}"],
          f"cannot connect to {p.bootstrap}", "TLS handshake failed", "certificate verify failed")
    fails(["security.protocol=SSL"], "TLS handshake failed", "certificate verify failed",
          "unable to get local issuer certificate")
    # A CA file that is not there: a mistake in the properties (exit 2), named, before connecting.
    cli = SecureCli(kmirror_bin, p.bootstrap,
                    write_props(tmp_path, ["security.protocol=SSL", f"ssl.ca.location={tmp_path}/nope.pem"]))
    r = cli.run("list", expect=2)
    assert r.stderr.count("\n") == 1 and f"ssl.ca.location {tmp_path}/nope.pem: No such file" in r.stderr, r.stderr
    # A file that is not PEM: OpenSSL's reason, one line.
    fails(["security.protocol=SSL", f"ssl.ca.location={cli.props}"], "TLS setup: cannot load CA file")
    # Plaintext against the TLS listener: kmirrord closes it; not a hang, and a hint.
    plain = Cli(kmirror_bin, p.bootstrap)
    t0 = time.monotonic()
    r = plain.run("list", expect=None)
    one_line_error(r, f"cannot connect to {p.bootstrap}", "during ApiVersions", "security.protocol=SSL")
    assert time.monotonic() - t0 < 10
    # TLS against a plaintext listener.
    q = proxy_factory(dest_cluster, name="kmirrord-plain")
    cli = SecureCli(kmirror_bin, q.bootstrap,
                    write_props(tmp_path, ["security.protocol=SSL", f"ssl.ca.location={certs['ca']}"]))
    t0 = time.monotonic()
    r = cli.run("list", expect=None)
    one_line_error(r, f"cannot connect to {q.bootstrap}", "TLS handshake", "not a TLS listener?")
    assert time.monotonic() - t0 < 10

    # Properties kmirror does not take, or not together: refused before connecting, naming what to use instead.
    for lines, needles in (
            (["security.protocol=SSL", "sasl.kerberos.service.name=kafka"],
             ("sasl.* properties need security.protocol SASL_PLAINTEXT or SASL_SSL",)),
            (["security.protocol=SSL", f"ssl.ca.location={certs['ca']}",
              "ssl.truststore.location=/etc/kafka/truststore.p12", "ssl.truststore.password=changeit"],
             ("ssl.ca.location and ssl.truststore.*", "keep one")),
            (["security.protocol=SSL", "ssl.key.password=secret-key-pw"], ("unencrypted PEM key",))):
        cli = SecureCli(kmirror_bin, p.bootstrap, write_props(tmp_path, lines))
        r = cli.run("list", expect=2)
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and all(n in err[0] for n in needles), r.stderr
        assert "changeit" not in r.stderr and "secret-key-pw" not in r.stderr


def test_tls_hostname_verification(kmirror_bin, proxy_factory, dest_cluster, certs, tmp_path):
    """A certificate for another name is refused unless ssl.endpoint.identification.algorithm is
    empty, as with Kafka's clients."""
    p = tls_proxy(proxy_factory, dest_cluster, certs, cert="wrong-host")
    strict = SecureCli(kmirror_bin, p.bootstrap,
                       write_props(tmp_path, ["security.protocol=SSL", f"ssl.ca.location={certs['ca']}"]))
    r = strict.run("list", expect=None)
    one_line_error(r, "TLS handshake failed", "certificate verify failed", "IP address mismatch")
    loose = SecureCli(kmirror_bin, p.bootstrap,
                      write_props(tmp_path, ["security.protocol=SSL", f"ssl.ca.location={certs['ca']}",
                                             "ssl.endpoint.identification.algorithm="]))
    doc, _ = loose.json("list")
    assert "mirrors" in doc


# ---- Java key and trust stores, made with keytool ----------------------------------------------

def _keytool(*args, cwd):
    subprocess.run(["keytool", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def stores(certs):
    """keytool's stores around the test CA: a PKCS12 truststore by -importcert (a certificate bag
    with Java's trusted-key-usage attribute and no key), the same as JKS, one whose certificates
    are neither encrypted nor MACed (read without a password), and a PKCS12 client keystore whose
    key's certificate the CA signed."""
    if not shutil.which("keytool"):
        pytest.skip("no keytool")
    d = os.path.dirname(certs["ca"])
    pw = ("-storepass", "changeit")
    plain = ("-J-Dkeystore.pkcs12.certProtectionAlgorithm=NONE", "-J-Dkeystore.pkcs12.macAlgorithm=NONE")
    for name, kind, extra in (("trust.p12", "PKCS12", ()), ("trust.jks", "JKS", ()),
                              ("trust-plain.p12", "PKCS12", plain)):
        _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", certs["ca"], "-keystore", name,
                 "-storetype", kind, *pw, *extra, cwd=d)
    ks = ("-keystore", "client.p12", "-storetype", "PKCS12", *pw)
    _keytool("-genkeypair", "-alias", "client", "-keyalg", "RSA", "-keysize", "2048", "-dname", "CN=kmirror-cli",
             "-validity", "2", *ks, cwd=d)
    _keytool("-certreq", "-alias", "client", "-file", "client.csr", *ks, cwd=d)
    _openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "client.pem", "-days", "2", cwd=d)
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem", *ks, cwd=d)
    _keytool("-importcert", "-alias", "client", "-file", "client.pem", *ks, cwd=d)
    return {k: os.path.join(d, k) for k in ("trust.p12", "trust.jks", "trust-plain.p12", "client.p12")}


def test_java_stores(kmirror_bin, proxy_factory, dest_cluster, certs, stores, tmp_path):
    """A Kafka client.properties with keytool's PKCS12 stores: the truststore's CA (no
    ssl.ca.location; the system store does not know it) verifies kmirrord, the keystore's key and
    certificate pass its tls_client_auth=required. A JKS store is refused with the keytool command
    that converts it, before any connection; a wrong password is refused naming the file."""
    p = tls_proxy(proxy_factory, dest_cluster, certs, tls_ca_file=certs["ca"], tls_client_auth="required")
    trust = ["security.protocol=SSL", f"ssl.truststore.location={stores['trust.p12']}", "ssl.truststore.type=PKCS12",
             "ssl.truststore.password=changeit"]
    keys = [f"ssl.keystore.location={stores['client.p12']}", "ssl.keystore.type=PKCS12",
            "ssl.keystore.password=changeit", "ssl.key.password=changeit"]

    def cli(lines, bootstrap=p.bootstrap):
        return SecureCli(kmirror_bin, bootstrap, write_props(tmp_path, lines))

    doc, _ = cli(trust + keys).json("list")
    assert "mirrors" in doc
    # A truststore given without its password: its certificates are read when they are not encrypted.
    doc, _ = cli(["security.protocol=SSL", f"ssl.truststore.location={stores['trust-plain.p12']}", *keys]).json("list")
    assert "mirrors" in doc
    # kmirrord asks for a certificate: without the keystore the same connection fails.
    one_line_error(cli(trust).run("list", expect=None), f"cannot connect to {p.bootstrap}")

    # Refused while the TLS context is set up, so the same with an address where nothing listens.
    with socket.socket() as s:
        s.bind((PROXY_HOST, 0))
        nowhere = f"{PROXY_HOST}:{s.getsockname()[1]}"
    jks = stores["trust.jks"]
    for bootstrap in (p.bootstrap, nowhere):
        line = one_line_error(cli(["security.protocol=SSL", f"ssl.truststore.location={jks}",
                                   "ssl.truststore.password=changeit", *keys], bootstrap).run("list", expect=None),
                              f"the truststore {jks} is a JKS keystore",
                              f"keytool -importkeystore -srckeystore {jks} -destkeystore {jks[:-4]}.p12 "
                              "-deststoretype PKCS12")
        assert "cannot connect" not in line and "changeit" not in line
    for lines, store in ((["security.protocol=SSL", f"ssl.truststore.location={stores['trust.p12']}",
                           "ssl.truststore.password=wrong-pw", *keys], f"PKCS12 truststore {stores['trust.p12']}"),
                         ([*trust, f"ssl.keystore.location={stores['client.p12']}", "ssl.keystore.password=wrong-pw"],
                          f"PKCS12 keystore {stores['client.p12']}")):
        line = one_line_error(cli(lines).run("list", expect=None), f"cannot open the {store}: wrong password? "
                              "(mac verify failure)")
        assert "wrong-pw" not in line


@pytest.fixture
def sasl_tls_proxy(proxy_factory, dest_cluster3, certs):
    p = tls_proxy(proxy_factory, dest_cluster3, certs, upstream=dest_cluster3.sasl_bootstrap,
                  upstream_sasl_mechanism="SCRAM-SHA-512", upstream_sasl_username="admin",
                  upstream_sasl_password=USERS["admin"])
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 3, 60, what="the proxy's login")
    return p


def test_sasl_ssl(kmirror_bin, sasl_tls_proxy, source_cluster, certs, tmp_path):
    p = sasl_tls_proxy
    ca = [f"ssl.ca.location={certs['ca']}"]
    admin = SecureCli(kmirror_bin, p.bootstrap, sasl_props(tmp_path, "admin", "SCRAM-SHA-512", protocol="SASL_SSL",
                                                           extra=ca))
    bob = SecureCli(kmirror_bin, p.bootstrap, sasl_props(tmp_path, "bob", "SCRAM-SHA-512", protocol="SASL_SSL",
                                                         extra=ca))
    mirror = unique("sslsasl")
    doc, _ = admin.json("create", "--mirror", mirror, "--source-bootstrap", source_cluster.bootstrap)
    assert doc["mirror"] == mirror
    assert mirror in admin.run("list").stdout
    with alice_acls(p.cluster):
        wait_until(lambda: bob.run("list", expect=None).returncode == 1, 30, 0.5, "the ACLs")
        bob.refused("CLUSTER_AUTHORIZATION_FAILED", "describe", "--mirror", mirror)
    admin.run("delete", "--mirror", mirror)
    # A wrong password over TLS: the same one-line SASL error.
    wrong = SecureCli(kmirror_bin, p.bootstrap, sasl_props(tmp_path, "admin", "SCRAM-SHA-512", password="nope",
                                                           protocol="SASL_SSL", extra=ca))
    one_line_error(wrong.run("list", expect=None), "SASL SCRAM-SHA-512 failed", "SASL_AUTHENTICATION_FAILED")
    # SASL_PLAINTEXT against the TLS listener fails, quickly.
    plain = SecureCli(kmirror_bin, p.bootstrap, sasl_props(tmp_path, "admin", "SCRAM-SHA-512"))
    t0 = time.monotonic()
    one_line_error(plain.run("list", expect=None), f"cannot connect to {p.bootstrap}")
    assert time.monotonic() - t0 < 10
