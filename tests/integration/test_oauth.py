"""SASL OAUTHBEARER on real Kafka brokers that validate tokens: a source with Kafka's unsecured
validator (unsigned tokens) and a destination with the JWKS validator (RS256 tokens signed by the
harness's issuer, tests/harness/oauth.py, whose key the brokers fetch from it). A mirror from the
one into the other, kmirrord logging in to the destination with a token from a file and to the
source with the mirror's; the kmirror CLI with a token file; an OAUTHBEARER client through
kmirrord authenticating as itself, so the destination's ACLs decide for its own principal; a
token file rewritten before its token expires; and what an expired or refused token says."""

import os
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from harness import USERS, KafkaCluster
from harness.oauth import LOGIN_MODULE, Issuer
from mirror_cli import find_kmirror
from mirror_data import compare_topic, main_release_only, produce_records, read_partition, watermarks
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import Proxy, secret_key_and_file_dir, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

# The confluent-kafka clients that set things up through kmirrord log in as the super user.
ADMIN = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
         "sasl.username": "admin", "sasl.password": USERS["admin"]}
# kmirrord's own connections to the destination close once their token's life is over (KIP-368:
# the broker ends a session that was not re-authenticated); a new connection needs a live token.
REAUTH_MS = 60000


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def issuers():
    unsigned, signed = Issuer().start(), Issuer(signed=True).start()
    yield unsigned, signed
    signed.stop()
    unsigned.stop()


@pytest.fixture(scope="module")
def oauth_clusters(issuers):
    """A source validating unsigned tokens and a destination validating the signed issuer's; the
    principal is the token's sub. kmirrord's principal is a super user of the destination."""
    unsigned, signed = issuers
    # On the source, the tests' own plaintext clients (ANONYMOUS) may do everything; the mirror's
    # OAUTHBEARER login is held to the topic's ACLs.
    src = KafkaCluster("oauth-src", oauth=unsigned, overrides={"super.users": "User:admin;User:ANONYMOUS"})
    dst = KafkaCluster("oauth-dst", oauth=signed, overrides={
        "super.users": "User:admin;User:kmirrord",
        "listener.name.sasl.oauthbearer.connections.max.reauth.ms": REAUTH_MS})
    for c in (src, dst):
        c.start()
    yield src, dst
    for c in (src, dst):
        c.stop()


def oauth_proxy(kmirrord_bin, dst, d, token_file, name, **options):
    key, files = secret_key_and_file_dir(d)
    p = Proxy(kmirrord_bin, dst, str(d), name=name, upstream=dst.sasl_bootstrap,
              upstream_sasl_mechanism="OAUTHBEARER",
              upstream_sasl_oauthbearer_token_endpoint_url=f"file://{token_file}",
              mirror_secret_key_file=str(key), mirror_file_dir=str(files), **options)
    p.files = str(files)
    return p


@pytest.fixture(scope="module")
def proxy(kmirrord_bin, oauth_clusters, issuers, tmp_path_factory):
    """kmirrord in front of the destination's SASL listener, logging in with a token from a file."""
    _, dst = oauth_clusters
    _, signed = issuers
    d = tmp_path_factory.mktemp("oauth-proxy")
    token = signed.write_token(d / "kmirrord.token", "kmirrord")
    p = oauth_proxy(kmirrord_bin, dst, d, token, "kmirrord-oauth").start()
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 60,
               what=lambda: f"kmirrord's OAUTHBEARER login to the destination\n{p.output()[-3000:]}")
    yield p
    p.stop()
    reports = p.sanitizer_reports()
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:50])


def token_props(path, token_file, extra=""):
    """CLI properties for a token file, or (an http URL) a token endpoint."""
    url = token_file if str(token_file).startswith("http") else f"file://{token_file}"
    with open(path, "w") as f:
        f.write("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
                f"sasl.oauthbearer.token.endpoint.url={url}\n"
                f"sasl.jaas.config={LOGIN_MODULE} required{extra};\n")
    return str(path)


def cli(proxy, props, *args, expect=0):
    argv = [find_kmirror(), "--bootstrap-server", proxy.bootstrap, "--timeout-ms", "20000",
            "--command-config", props, *[str(a) for a in args]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if expect is not None:
        assert r.returncode == expect, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def test_mirror_from_unsecured_source_into_jwks_destination(proxy, oauth_clusters, issuers, tmp_path):
    """The mirror's source connection logs in with the mirror's token file (an unsigned token of
    mirror-reader, the only principal the source's ACLs let read the topic), kmirrord's own
    connections to the destination with its signed token, and the CLI with an operator's: the
    topic is mirrored exactly, and the JAAS line's client secret never shows."""
    src, dst = oauth_clusters
    unsigned, signed = issuers
    p = proxy
    topic, mirror = unique("oauth"), unique("oauth-mirror")
    admin = AdminClient({"bootstrap.servers": src.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=60)
    src.wait_topic(topic, 2)
    assert produce_records(src.bootstrap, topic, 3000, compression="zstd") == 3000
    # Once a topic has ACLs, only the principals they name may use it: the mirror must be mirror-reader.
    for op in ("Read", "Describe", "DescribeConfigs"):
        src.tool("acls", "--add", "--allow-principal", "User:mirror-reader", "--operation", op, "--topic", topic,
                 admin=True)

    reader = unsigned.write_token(os.path.join(p.files, "reader.token"), "mirror-reader")
    mprops = token_props(tmp_path / "mirror.properties", reader, ' clientId="mirror" clientSecret="s3cr3t-oauth"')
    operator = token_props(tmp_path / "operator.properties",
                           signed.write_token(tmp_path / "operator.token", "operator"))
    cli(p, operator, "create", "--mirror", mirror, "--source-bootstrap", src.sasl_bootstrap, "--config-file", mprops)
    cli(p, operator, "start", "--mirror", mirror, "--topics", topic)

    def caught_up():
        s = watermarks(src.bootstrap, topic, 2)
        d = watermarks(p.bootstrap, topic, 2, **ADMIN)
        return s == d and s
    marks = wait_until(caught_up, 90, 1.0, lambda: f"the mirror of {topic}\n{p.output()[-3000:]}")
    total, _ = compare_topic(p.bootstrap, src.bootstrap, topic, 2, marks=marks, proxy_conf=ADMIN)
    assert total == 3000
    r = cli(p, operator, "describe", "--mirror", mirror, "--output", "json")
    assert topic in r.stdout and "MIRRORING" in r.stdout, r.stdout
    assert "s3cr3t-oauth" not in r.stdout and "s3cr3t-oauth" not in p.output()
    assert "SASL OAUTHBEARER" not in p.output(), p.output()[-3000:]


def oauth_client(proxy, issuer, sub):
    """librdkafka's OAUTHBEARER with a token the issuer signs for sub (oauth_cb)."""
    def cb(_config):
        return issuer.token(sub, lifetime=300), time.time() + 300
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "oauth_cb": cb}


def test_client_through_kmirrord_as_itself(proxy, oauth_clusters, issuers):
    """An OAUTHBEARER client's SASL passes through kmirrord unchanged: the destination validates
    alice's own token, and its ACLs (alice may, bob may not) decide, not kmirrord's principal."""
    _, dst = oauth_clusters
    _, signed = issuers
    p = proxy
    topic = unique("oauth-acl")
    admin = AdminClient(p.conf(**ADMIN))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=60)
    dst.wait_topic(topic, 1)
    dst.tool("acls", "--add", "--allow-principal", "User:alice", "--operation", "All", "--topic", topic, admin=True)
    prod = Producer(oauth_client(p, signed, "alice"))
    for i in range(20):
        prod.produce(topic, f"alice-{i}".encode())
    assert prod.flush(30) == 0
    got = read_partition(p.bootstrap, topic, 0, 0, 20, **{k: v for k, v in oauth_client(p, signed, "alice").items()
                                                          if k != "bootstrap.servers"})
    assert [r.value for r in got] == [f"alice-{i}".encode() for i in range(20)]
    # bob's token is good, but the topic's ACLs name only alice: the broker refuses bob himself.
    errors = []
    prod = Producer(dict(oauth_client(p, signed, "bob"), error_cb=errors.append, **{"message.timeout.ms": 8000}))
    delivered = []
    prod.produce(topic, b"bob", on_delivery=lambda err, msg: delivered.append(err))
    prod.flush(20)
    assert delivered and delivered[0] is not None and "AUTHORIZATION" in delivered[0].name(), delivered
    # A token the destination did not issue (unsigned) is refused at login.
    unsigned = Issuer()
    prod = Producer(dict(oauth_client(p, unsigned, "alice"), error_cb=errors.append,
                         **{"message.timeout.ms": 5000}))
    delivered.clear()
    prod.produce(topic, b"x", on_delivery=lambda err, msg: delivered.append(err))
    prod.flush(15)
    assert delivered and delivered[0] is not None, delivered
    assert any("SASL authentication error" in str(e) or "Authentication failed" in str(e) for e in errors), errors


def test_cli_token_errors(proxy, issuers, tmp_path):
    """A token the CLI cannot use is one line saying what to do, before any connection; a token the
    broker refuses is one line with the broker's words and its status."""
    unsigned, signed = issuers
    p = proxy
    expired = signed.write_token(tmp_path / "expired.token", "operator", exp=int(time.time()) - 60)
    cases = [
        (token_props(tmp_path / "a.properties", expired), 2,
         ["sasl.oauthbearer.token.endpoint.url", "expired at", "write a fresh token there"]),
        (token_props(tmp_path / "b.properties", tmp_path / "missing.token"), 2,
         ["cannot read", "missing.token", "No such file or directory"]),
        (token_props(tmp_path / "c.properties", unsigned.write_token(tmp_path / "unsigned.token", "operator")), 1,
         ["SASL OAUTHBEARER failed: SASL_AUTHENTICATION_FAILED", "the broker refused the token: status "
          "invalid_token"]),
    ]
    for props, code, needles in cases:
        r = cli(p, props, "list", expect=code)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        for n in needles:
            assert n in lines[0], (n, lines[0])
    # A mirror's token file must be inside mirror_file_dir, and be a file URL.
    ok = token_props(tmp_path / "ok.properties", signed.write_token(tmp_path / "ok.token", "operator"))
    for name, url, want in (("outside", f"file://{expired}", "mirror_file_dir"),
                            ("ldap", "ldap://idp.invalid/token", "is not file:///PATH")):
        props = tmp_path / f"mirror-{name}.properties"
        props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
                         f"sasl.oauthbearer.token.endpoint.url={url}\n")
        r = cli(p, ok, "create", "--mirror", unique("refused"), "--source-bootstrap", "127.0.0.1:9",
                "--config-file", props, expect=1)
        assert "INVALID_CLUSTER_MIRROR_CONFIG" in r.stderr and want in r.stderr, r.stderr


def test_token_file_rewritten_before_expiry(kmirrord_bin, oauth_clusters, issuers, tmp_path):
    """kmirrord starts on a token that lives 12 s; before it expires an agent writes the next one.
    The broker gives the sessions the token's life, and kmirrord's connections authenticate again
    in place (KIP-368) with the file's new token before it ends: none is closed by the broker, no
    login fails, and it stays connected."""
    _, dst = oauth_clusters
    _, signed = issuers
    token = tmp_path / "kmirrord.token"
    signed.write_token(token, "kmirrord", lifetime=12)
    born = time.time()
    # A state topic of its own: the module's kmirrord does not run this one's mirrors.
    p = oauth_proxy(kmirrord_bin, dst, tmp_path, token, "kmirrord-oauth-refresh",
                    mirror_state_topic="__mirror_state_refresh", mirror_sync_group="__kmirror-sync-refresh")
    p.options["metadata_refresh_ms"] = 1000
    p.write_config()
    p.start()
    try:
        wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 30,
                   what=lambda: f"kmirrord's first login\n{p.output()[-3000:]}")
        time.sleep(max(0.0, born + 6 - time.time()))
        mark = len(p.output())
        signed.write_token(token, "kmirrord", lifetime=600)
        # Past the first token's end: the connections that used it authenticated again in time.
        time.sleep(max(0.0, born + 16 - time.time()))
        closed = [ln for ln in p.output()[mark:].splitlines() if "closed by peer" in ln]
        assert not closed, "the broker closed connections whose session ended:\n" + "\n".join(closed[:5])
        # The first token is dead now. A mirror created through kmirrord is written to the state
        # topic over kmirrord's own connection, authenticated with the new one.
        src, _ = oauth_clusters
        plain, pw = tmp_path / "admin.properties", USERS["admin"]
        plain.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                         "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                         f'username="admin" password="{pw}";\n')
        mirror = unique("after-expiry")
        cli(p, str(plain), "create", "--mirror", mirror, "--source-bootstrap", src.bootstrap)
        r = cli(p, str(plain), "describe", "--mirror", mirror)
        assert mirror in r.stdout, r.stdout
        assert p.metric("kmirror_upstream_brokers") == 1
        out = p.output()
        assert "SASL OAUTHBEARER failed" not in out and "expired at" not in out, out[-3000:]
        assert p.running()
    finally:
        p.stop()
    assert not p.sanitizer_reports()


def test_kmirrord_token_checks(kmirrord_bin, issuers, tmp_path):
    """kmirrord checks its token file as a secret file and for a live token: --check-config and the
    start say what is wrong in one line, before any connection."""
    _, signed = issuers
    good = signed.write_token(tmp_path / "good.token", "kmirrord")

    def run(url, *extra):
        argv = [kmirrord_bin, "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:9",
                "--upstream-sasl-mechanism", "OAUTHBEARER", *(["--upstream-sasl-oauthbearer-token-endpoint-url",
                                                               url] if url else []), *extra]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    r = run(f"file://{good}", "--check-config")
    assert r.returncode == 0, r.stderr
    expired = signed.write_token(tmp_path / "expired.token", "kmirrord", exp=int(time.time()) - 5)
    for url, needles in ((f"file://{expired}", ["upstream_sasl_oauthbearer_token_endpoint_url", "expired at",
                                                "write a fresh token there"]),
                         (None, ["needs upstream_sasl_oauthbearer_token_endpoint_url file:///"]),
                         ("ldap://idp.invalid/token", ["needs upstream_sasl_oauthbearer_token_endpoint_url"]),
                         ("https://idp.invalid/token", ["goes with upstream_sasl_oauthbearer_client_id"])):
        for extra in (("--check-config",), ()):
            r = run(url, *extra)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and lines and all(n in lines[-1] for n in needles), r.stderr
    os.chmod(good, 0o644)
    r = run(f"file://{good}", "--check-config")
    assert r.returncode == 2 and "chmod 600" in r.stderr, r.stderr


def test_token_command(kmirrord_bin, oauth_clusters, issuers, tmp_path):
    """kmirrord's token from a command (upstream_sasl_oauthbearer_token_command, here one that
    prints what an agent keeps in a file): checked at start, run again off the loop as 80% of a
    token's 12 s life passes, and its next token authenticates kmirrord's connections again in
    place: none closed, no failed login. A command that fails or prints no token is refused at
    start in one line; a mirror's configuration cannot name one."""
    _, dst = oauth_clusters
    _, signed = issuers
    agent = tmp_path / "agent.token"
    signed.write_token(agent, "kmirrord", lifetime=12)
    born = time.time()
    runs = tmp_path / "runs"
    key, files = secret_key_and_file_dir(tmp_path)
    p = Proxy(kmirrord_bin, dst, str(tmp_path), name="kmirrord-oauth-cmd", upstream=dst.sasl_bootstrap,
              upstream_sasl_mechanism="OAUTHBEARER",
              upstream_sasl_oauthbearer_token_command=f"echo run >> {runs}; cat {agent}",
              mirror_secret_key_file=str(key), mirror_file_dir=str(files),
              mirror_state_topic="__mirror_state_cmd", mirror_sync_group="__kmirror-sync-cmd")
    p.start()
    try:
        wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 30,
                   what=lambda: f"kmirrord's login with the command's token\n{p.output()[-3000:]}")
        mark = len(p.output())
        time.sleep(max(0.0, born + 5 - time.time()))
        signed.write_token(agent, "kmirrord", lifetime=600)
        time.sleep(max(0.0, born + 16 - time.time()))
        closed = [ln for ln in p.output()[mark:].splitlines() if "closed by peer" in ln]
        assert not closed, "the broker closed connections whose session ended:\n" + "\n".join(closed[:5])
        assert len(runs.read_text().splitlines()) >= 3, "the command was not run again for the next token"
        plain = tmp_path / "admin.properties"
        plain.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                         "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                         f'username="admin" password="{USERS["admin"]}";\n')
        src, _ = oauth_clusters
        mprops = tmp_path / "mirror.properties"
        mprops.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
                          "sasl.oauthbearer.token.command=cat /etc/passwd\n")
        r = cli(p, str(plain), "create", "--mirror", unique("cmd"), "--source-bootstrap", src.sasl_bootstrap,
                "--config-file", mprops, expect=None)
        assert r.returncode != 0 and "sasl.oauthbearer.token.command" in r.stderr, r.stderr
        assert p.metric("kmirror_upstream_brokers") == 1
        out = p.output()
        assert "SASL OAUTHBEARER failed" not in out and "token command" not in out, out[-3000:]
    finally:
        p.stop()
    assert not p.sanitizer_reports()

    def check(command):
        argv = [kmirrord_bin, "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:9", "--upstream-sasl-mechanism",
                "OAUTHBEARER", "--upstream-sasl-oauthbearer-token-command", command, "--check-config"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    for command, needle in (("exit 4", "'exit 4' exited with status 4"),
                            ("echo hello", "it must print the access token (a JWT)"),
                            ("sleep 30", "printed no token in 10 s")):
        r = check(command)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and lines and "upstream_sasl_oauthbearer_token_command" in lines[-1] \
            and needle in lines[-1], r.stderr
    assert check(f"cat {agent}").returncode == 0


def requests_of(issuer, client):
    return [scope for cid, scope in issuer.token_requests if cid == client]


def cc_proxy(kmirrord_bin, dst, issuer, d, name, client):
    """kmirrord logging in to the destination with tokens from issuer's endpoint for client."""
    secret = d / f"{client}.secret"
    secret.write_text(issuer.clients[client][0] + "\n")
    os.chmod(secret, 0o600)
    key, files = secret_key_and_file_dir(d)
    p = Proxy(kmirrord_bin, dst, str(d), name=name, upstream=dst.sasl_bootstrap,
              upstream_sasl_mechanism="OAUTHBEARER", upstream_sasl_oauthbearer_token_endpoint_url=issuer.token_url,
              upstream_sasl_oauthbearer_client_id=client, upstream_sasl_oauthbearer_client_secret_file=str(secret),
              upstream_sasl_oauthbearer_scope="kafka mirror",
              # A state topic of its own: the module's kmirrord does not run these mirrors.
              mirror_state_topic="__mirror_state_cc", mirror_sync_group="__kmirror-sync-cc",
              mirror_secret_key_file=str(key), mirror_file_dir=str(files)).start()
    wait_until(lambda: p.metric("kmirror_upstream_brokers") == 1, 30,
               what=lambda: f"kmirrord's login with a token from the endpoint\n{p.output()[-3000:]}")
    return p


def test_client_credentials(kmirrord_bin, oauth_clusters, issuers, tmp_path):
    """KIP-768's client-credentials grant against the harness's token endpoints: kmirrord's own
    connections (a client secret file, a scope), a mirror's source (the client of its sealed
    sasl.jaas.config, its secret from Kafka 4.1's sasl.oauthbearer.client.credentials.client.secret,
    which wins) and the CLI (its JAAS line); a wrong secret is one line with the endpoint's
    answer. Then a kmirrord whose tokens live 8 s asks for new ones as they end, and its connections
    authenticate again in place with them (KIP-368): none is closed, and it still reads its state."""
    src, dst = oauth_clusters
    unsigned, signed = issuers
    signed.clients.update({"kmirrord-cc": ("kmirrord-secret", "kmirrord", 300),
                           "kmirrord-short": ("short-secret", "kmirrord", 8),
                           "operator-cc": ("operator-secret", "operator", 300)})
    unsigned.clients["mirror-cc"] = ("mirror-secret", "mirror-cc", 300)
    p = cc_proxy(kmirrord_bin, dst, signed, tmp_path, "kmirrord-oauth-cc", "kmirrord-cc")
    try:
        assert requests_of(signed, "kmirrord-cc")[0] == "kafka mirror"
        operator = token_props(tmp_path / "operator.properties", signed.token_url,
                               ' clientId="operator-cc" clientSecret="operator-secret"')
        # A mirror whose source logs in with its own client (unsigned tokens: the source's validator).
        topic, mirror = unique("oauth-cc"), unique("oauth-cc-mirror")
        admin = AdminClient({"bootstrap.servers": src.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=60)
        src.wait_topic(topic, 1)
        assert produce_records(src.bootstrap, topic, 500) == 500
        for op in ("Read", "Describe", "DescribeConfigs"):
            src.tool("acls", "--add", "--allow-principal", "User:mirror-cc", "--operation", op, "--topic", topic,
                     admin=True)
        mprops = tmp_path / "mirror.properties"
        # Kafka 4.1's property for the secret (KIP-1139), over the JAAS line's stale one: it wins.
        mprops.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
                          f"sasl.oauthbearer.token.endpoint.url={unsigned.token_url}\n"
                          f'sasl.jaas.config={LOGIN_MODULE} required clientId="mirror-cc" '
                          'clientSecret="stale-secret";\n'
                          "sasl.oauthbearer.client.credentials.client.secret=mirror-secret\n")
        cli(p, operator, "create", "--mirror", mirror, "--source-bootstrap", src.sasl_bootstrap,
            "--config-file", mprops)
        cli(p, operator, "start", "--mirror", mirror, "--topics", topic)

        def caught_up():
            s = watermarks(src.bootstrap, topic, 1)
            return s if s == watermarks(p.bootstrap, topic, 1, **ADMIN) else None
        marks = wait_until(caught_up, 90, 1.0, lambda: f"the mirror of {topic}\n{p.output()[-3000:]}")
        total, _ = compare_topic(p.bootstrap, src.bootstrap, topic, 1, marks=marks, proxy_conf=ADMIN)
        assert total == 500
        assert requests_of(unsigned, "mirror-cc") and requests_of(signed, "operator-cc")
        assert "mirror-secret" not in cli(p, operator, "describe", "--mirror", mirror, "--output", "json").stdout
        cli(p, operator, "stop", "--mirror", mirror, "--topics", topic)
        # A wrong secret: the endpoint's answer, in one line.
        bad = token_props(tmp_path / "bad.properties", signed.token_url, ' clientId="operator-cc" clientSecret="nope"')
        r = cli(p, bad, "list", expect=1)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "answered HTTP 401: invalid_client: bad client id or secret" in lines[0], r.stderr
        assert "SASL OAUTHBEARER failed" not in p.output(), p.output()[-3000:]
    finally:
        p.stop()
    assert not p.sanitizer_reports()

    d = tmp_path / "short"
    d.mkdir()
    p = cc_proxy(kmirrord_bin, dst, signed, d, "kmirrord-oauth-short", "kmirrord-short")
    try:
        wait_until(lambda: len(requests_of(signed, "kmirrord-short")) >= 3, 40, 0.5,
                   lambda: f"kmirrord's later token requests\n{p.output()[-3000:]}")
        # Each token's session ended while kmirrord ran: its connections authenticated again in
        # place with the endpoint's next token (KIP-368), none closed by the broker.
        closed = [ln for ln in p.output().splitlines() if "closed by peer" in ln]
        assert not closed, "the broker closed connections whose session ended:\n" + "\n".join(closed[:5])
        r = cli(p, operator, "describe", "--mirror", mirror)
        assert "STOPPED" in r.stdout, r.stdout
        assert p.metric("kmirror_upstream_brokers") == 1
        assert "SASL OAUTHBEARER failed" not in p.output(), p.output()[-3000:]
    finally:
        p.stop()
    assert not p.sanitizer_reports()
