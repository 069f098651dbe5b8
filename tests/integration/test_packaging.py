"""Packaging: `make install` (DESTDIR, prefix) puts the programs, both man pages, the sample config
(kept on reinstall) and the systemd unit in place; the installed kmirrord accepts the installed
config; the man pages render without warnings; systemd-analyze verifies the unit and rates its
hardening. The container: scripts/container-build builds and stages what the image holds and starts
kmirrord as the image does, in front of a real destination cluster, where a real client produces and
consumes through it; docker-compose.yml's kmirrord agrees with the config file it mounts. Also
--check-config on the binary: missing files named, the loopback warning."""

import os
import re
import shutil
import subprocess

import pytest
import yaml

from harness import Daemon
from mirror_data import main_release_only
from proxy_fixtures import PROXY_HOST, Proxy, consume, create_topic, produce, wait_until

pytestmark = [pytest.mark.proxy, main_release_only]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "container-build")
PREFIX = "/opt/kmirror"
SYSCONFDIR = "/etc/opt/kmirror"
QUIET = dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="100")


@pytest.fixture(scope="module")
def build_dir(kmirrord_bin):
    """The build directory of the kmirrord under test (its Makefile is what `make install` runs)."""
    d = os.path.dirname(os.path.abspath(kmirrord_bin))
    if not os.path.isfile(os.path.join(d, "Makefile")):
        pytest.skip(f"{kmirrord_bin} is not in an automake build directory")
    return d


def run(argv, **kw):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, **kw)


def make_install(build_dir, destdir, target="install"):
    r = run(["make", "-C", build_dir, target, f"DESTDIR={destdir}", f"prefix={PREFIX}",
             f"sysconfdir={SYSCONFDIR}"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def installed(build_dir, tmp_path_factory):
    dest = str(tmp_path_factory.mktemp("destdir"))
    make_install(build_dir, dest)
    return dest


def at(dest, path):
    return os.path.join(dest, path.lstrip("/"))


def unit_path(dest):
    found = [os.path.join(d, f) for d, _, fs in os.walk(dest) for f in fs if f == "kmirrord.service"]
    assert len(found) == 1, found
    return found[0]


def test_make_install_places_every_file(installed):
    want = {f"{PREFIX}/bin/kmirrord": 0o755, f"{PREFIX}/bin/kmirror": 0o755,
            f"{PREFIX}/share/man/man1/kmirror.1": 0o644, f"{PREFIX}/share/man/man8/kmirrord.8": 0o644,
            f"{SYSCONFDIR}/kmirror/kmirrord.conf": 0o644}
    for path, mode in want.items():
        assert os.path.isfile(at(installed, path)), path
        assert os.stat(at(installed, path)).st_mode & 0o777 == mode, path
    with open(at(installed, f"{SYSCONFDIR}/kmirror/kmirrord.conf")) as f, \
            open(os.path.join(REPO, "conf", "kmirrord.conf")) as g:
        assert f.read() == g.read()
    # The unit names this install's paths: make install's prefix and sysconfdir, not configure's.
    unit = open(unit_path(installed)).read()
    assert unit_path(installed) == at(installed, f"{PREFIX}/lib/systemd/system/kmirrord.service")
    assert f"ExecStart={PREFIX}/bin/kmirrord --config {SYSCONFDIR}/kmirror/kmirrord.conf\n" in unit
    assert not re.search(r"@\w+@", unit)
    # The installed binaries run, and the installed daemon accepts the installed sample.
    r = run([at(installed, f"{PREFIX}/bin/kmirrord"), "--config",
             at(installed, f"{SYSCONFDIR}/kmirror/kmirrord.conf"), "--check-config"])
    assert (r.returncode, r.stdout, r.stderr) == (0, "configuration ok\n", "")
    r = run([at(installed, f"{PREFIX}/bin/kmirror"), "--version"])
    assert r.returncode == 0 and r.stdout.startswith("kmirror ")


def test_reinstall_keeps_the_config_uninstall_removes_the_rest(build_dir, tmp_path):
    dest = str(tmp_path / "d")
    make_install(build_dir, dest)
    conf = at(dest, f"{SYSCONFDIR}/kmirror/kmirrord.conf")
    with open(conf, "a") as f:
        f.write("log_level = debug\n")
    edited = open(conf).read()
    out = make_install(build_dir, dest)
    assert "keeping" in out and open(conf).read() == edited
    make_install(build_dir, dest, "uninstall")
    left = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs)
    assert left == [os.path.relpath(conf, dest)]
    # An unedited sample goes with the rest.
    os.unlink(conf)
    make_install(build_dir, dest)
    make_install(build_dir, dest, "uninstall")
    assert not [f for _, _, fs in os.walk(dest) for f in fs]


@pytest.mark.parametrize("page", ["man1/kmirror.1", "man8/kmirrord.8"])
def test_man_pages_render_without_warnings(installed, page):
    path = at(installed, f"{PREFIX}/share/man/{page}")
    r = run(["groff", "-man", "-ww", "-z", path], env=QUIET)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    # man's own rendering at a terminal's width (kmirror.1's long JSON lines warn "cannot adjust
    # line" there: not a markup error, and its page is checked by groff above).
    if shutil.which("man") and page.endswith("kmirrord.8"):
        r = run(["man", "--warnings", "-l", path], env=QUIET)
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        assert "SYNOPSIS" in r.stdout
    if page.endswith("kmirrord.8"):
        text = open(path).read()
        for section in ("SYNOPSIS", "OPTIONS", "SIGNALS", "FILES", "HTTP ENDPOINTS", "EXIT STATUS",
                        "EXAMPLES", "SEE ALSO"):
            assert f".SH {section}" in text, section
        for words in ("SIGHUP", "SIGTERM", "/healthz", "/metrics", "docs/configuration.md", "--config-doc"):
            assert words in text.replace("\\-", "-"), words


def verifiable_unit(installed, tmp_path):
    """The installed unit with its programs at their DESTDIR place: systemd-analyze verify checks
    that ExecStart's binary exists. The man pages of Documentation= are found through MANPATH."""
    unit = open(unit_path(installed)).read().replace(f"{PREFIX}/bin/", at(installed, f"{PREFIX}/bin/"))
    path = tmp_path / "kmirrord.service"
    path.write_text(unit)
    env = dict(QUIET, MANPATH=at(installed, f"{PREFIX}/share/man"), SYSTEMD_LOG_COLOR="0")
    return str(path), env


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing (scripts/install-deps.sh)")
def test_systemd_unit_verifies_and_is_hardened(installed, tmp_path):
    path, env = verifiable_unit(installed, tmp_path)
    r = run(["systemd-analyze", "verify", path], env=env)
    # verify exits 0 on unknown keys and bad values too: it only prints them.
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
    unit = open(path).read()
    opts = dict(ln.split("=", 1) for ln in unit.splitlines() if "=" in ln and not ln.startswith("#"))
    assert opts["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert opts["KillSignal"] == "SIGTERM" and opts["Restart"] == "on-failure"
    assert opts["Type"] in ("simple", "exec")
    # kmirrord drains over drain_timeout_ms (default 30 s) before it exits: systemd must wait longer.
    stop = int(re.fullmatch(r"(\d+)s", opts["TimeoutStopSec"]).group(1))
    assert stop > 30
    # Twice max_connections (10000) file descriptors and more.
    assert int(opts["LimitNOFILE"]) > 2 * 10000
    assert opts["RestrictAddressFamilies"] == "AF_INET AF_INET6 AF_UNIX"
    assert opts["CapabilityBoundingSet"] == "" and opts["DynamicUser"] == "yes"
    # systemd's own rating of the sandbox (0 best, 10 worst; "OK" is below 5).
    r = run(["systemd-analyze", "security", "--offline=true", path], env=env)
    m = re.search(r"Overall exposure level for kmirrord.service: (\d+\.\d)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 2.0, r.stdout

    # The check sees a broken unit (its negative control).
    bad = tmp_path / "bad" / "kmirrord.service"
    bad.parent.mkdir()
    bad.write_text(unit.replace("ProtectHome=yes", "ProtectHome=bogus"))
    r = run(["systemd-analyze", "verify", str(bad)], env=env)
    assert "bogus" in r.stdout + r.stderr


def test_check_config_names_missing_files_and_warns_on_loopback(kmirrord_bin, tmp_path):
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o600)
    r = run([kmirrord_bin, "--upstream", "k:9092", "--listen", "127.0.0.1:9092", "--admin-token-file", token,
             "--tls-cert-file", tmp_path / "missing.pem", "--tls-key-file", tmp_path, "--upstream-file",
             tmp_path / "no" / "upstream", "--check-config"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"tls_cert_file {tmp_path}/missing.pem: No such file or directory" in r.stderr
    assert f"tls_key_file {tmp_path}: is a directory, not a file" in r.stderr
    assert f"upstream_file {tmp_path}/no/upstream: its directory {tmp_path}/no: No such file" in r.stderr
    assert "admin_token_file" not in r.stderr
    assert "configuration ok" not in r.stdout

    # Valid but likely wrong: accepted with a warning; ":PORT" is every address.
    r = run([kmirrord_bin, "--upstream", "k:9092", "--listen", ":9092", "--http-listen", ":9644",
             "--advertised-host", "localhost", "--check-config"])
    assert (r.returncode, r.stdout) == (0, "configuration ok\n")
    assert "warning: advertised_host localhost is a loopback address but listen 0.0.0.0:9092" in r.stderr
    r = run([kmirrord_bin, "--upstream", "k:9092", "--http-listen", ":9644", "--print-config"])
    assert "http_listen = 0.0.0.0:9644\n" in r.stdout


def test_check_config_reads_secret_files_as_the_start_does(kmirrord_bin, tmp_path):
    """A secret file that opens but that the start would refuse (its mode, its contents) fails the
    check too: under the systemd unit a check that passed and a start that fails is a restart loop."""
    key = tmp_path / "mirror.key"
    key.write_text("short\n")
    key.chmod(0o644)
    base = [kmirrord_bin, "--upstream", "k:9092", "--listen", "127.0.0.1:9092", "--check-config"]
    r = run(base + ["--mirror-secret-key-file", key])
    assert r.returncode == 2 and "(mode 0644): run chmod 600" in r.stderr, r.stderr
    key.chmod(0o600)
    r = run(base + ["--mirror-secret-key-file", key])
    assert r.returncode == 2 and "not a key (32 raw bytes or 64 hex digits expected)" in r.stderr, r.stderr
    key.write_text("ab" * 32 + "\n")
    pw = tmp_path / "password"
    pw.write_text("\n")
    pw.chmod(0o600)
    r = run(base + ["--mirror-secret-key-file", key, "--upstream-sasl-mechanism", "PLAIN",
                    "--upstream-sasl-username", "u", "--upstream-sasl-password-file", pw])
    assert r.returncode == 2 and f"upstream_sasl_password_file {pw}: is empty" in r.stderr, r.stderr
    pw.write_text("secret\n")
    r = run(base + ["--mirror-secret-key-file", key, "--upstream-sasl-mechanism", "PLAIN",
                    "--upstream-sasl-username", "u", "--upstream-sasl-password-file", pw])
    assert (r.returncode, r.stdout) == (0, "configuration ok\n"), r.stderr


# ---- the container ------------------------------------------------------------------------------

def compose_config():
    """The compose file's kmirrord service, and the options of the config file it mounts."""
    with open(os.path.join(REPO, "docker-compose.yml")) as f:
        compose = yaml.safe_load(f)
    svc = compose["services"]["kmirrord"]
    mounts = {}
    for v in svc["volumes"]:
        host, target, *mode = v.split(":")
        mounts[target] = (host, mode)
    config_path = svc["command"][svc["command"].index("--config") + 1]
    host_dir, mode = mounts[os.path.dirname(config_path)]
    assert mode == ["ro"]
    conf_file = os.path.normpath(os.path.join(REPO, host_dir, os.path.basename(config_path)))
    options = {}
    for ln in open(conf_file):
        if ln.strip() and not ln.lstrip().startswith("#"):
            k, v = ln.split("=", 1)
            options[k.strip()] = v.strip()
    return compose, svc, conf_file, options


def published(svc):
    """{container port: host port} of the service's published ports (ranges expanded)."""
    out = {}
    for p in svc["ports"]:
        host, container = str(p).split(":")
        hs, cs = [list(map(int, x.split("-"))) for x in (host, container)]
        hs, cs = range(hs[0], hs[-1] + 1), range(cs[0], cs[-1] + 1)
        assert len(hs) == len(cs), p
        out.update(zip(cs, hs))
    return out


def test_compose_kmirrord_agrees_with_its_config(kmirrord_bin):
    compose, svc, conf_file, opts = compose_config()
    assert svc["build"] in (".", {"context": "."}) and os.path.isfile(os.path.join(REPO, "Dockerfile"))
    assert conf_file == os.path.join(REPO, "conf", "compose", "kmirrord.conf")
    ports = published(svc)
    listen_port = int(opts["listen"].rsplit(":", 1)[1])
    http_port = int(opts["http_listen"].rsplit(":", 1)[1])
    assert listen_port in ports and http_port in ports
    # Clients connect to exactly the broker port kmirrord hands out: published under the same number.
    base, count = int(opts["broker_port_base"]), int(opts["broker_port_count"])
    for port in range(base, base + count):
        assert ports.get(port) == port, port
    assert set(ports) == {listen_port, http_port, *range(base, base + count)}
    # Listening on every container address (published ports arrive there), advertised to the host.
    assert opts["listen"].split(":")[0] in ("0.0.0.0", "") and opts["http_listen"].split(":")[0] in ("0.0.0.0", "")
    assert opts["advertised_host"] == "localhost"
    # The upstream is the destination service on its in-network listener.
    host, port = opts["upstream"].split(":")
    dest = compose["services"][host]
    env = dest["environment"]
    assert f"PLAINTEXT://{host}:{port}" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert host in svc["depends_on"]
    # upstream_file's directory is a volume (written by a swap, kept across container restarts).
    assert any(v.split(":")[1] == os.path.dirname(opts["upstream_file"]) for v in svc["volumes"])
    # The file is a valid configuration (its loopback advertised_host is warned about: by design).
    r = run([kmirrord_bin, "--config", conf_file, "--upstream-file", "", "--check-config"])
    assert r.returncode == 0, r.stderr
    # The Dockerfile builds and starts with the script, and exposes what compose publishes.
    dockerfile = open(os.path.join(REPO, "Dockerfile")).read()
    assert "RUN scripts/container-build build" in dockerfile
    assert re.search(r'ENTRYPOINT \["container-build", "start"\]', dockerfile)
    assert re.search(r"FROM debian:12\S* AS build", dockerfile) and "USER kmirror" in dockerfile
    expose = re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1).split()
    assert {str(listen_port), str(http_port), f"{base}-{base + count - 1}"} == set(expose)
    assert f"http://127.0.0.1:{http_port}/healthz" in dockerfile


def test_container_build_and_start(build_dir, dest_cluster, tmp_path, topic_name):
    stage = tmp_path / "stage"
    r = run([SCRIPT, "build", build_dir, stage])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for path in ("usr/bin/kmirrord", "usr/bin/kmirror", "etc/kmirror/kmirrord.conf", "usr/share/man/man8/kmirrord.8"):
        assert (stage / path).is_file(), path
    assert (stage / "etc/kmirror/kmirrord.conf").read_text() == \
        open(os.path.join(REPO, "conf", "compose", "kmirrord.conf")).read()

    # Ports and addresses of this machine; the rest of the container's config as it is.
    p = Proxy(str(stage / "usr/bin/kmirrord"), dest_cluster, str(tmp_path), name="container")
    env = {"KM_ROOT": str(stage), "KMIRRORD_UPSTREAM": dest_cluster.bootstrap,
           "KMIRRORD_LISTEN": p.bootstrap, "KMIRRORD_ADVERTISED_HOST": PROXY_HOST,
           "KMIRRORD_BROKER_PORT_BASE": str(p.broker_port_base),
           "KMIRRORD_HTTP_LISTEN": f"{PROXY_HOST}:{p.http_port}",
           "KMIRRORD_UPSTREAM_FILE": str(tmp_path / "upstream"), "KMIRRORD_DRAIN_TIMEOUT_MS": "2000"}
    p.daemon = Daemon([SCRIPT, "start"], "container", str(tmp_path), env=env)
    try:
        p.daemon.start(port=p.port, host=PROXY_HOST)
        # The staged binary with the staged config (its log level, its broker port count).
        out = run(["cat", f"/proc/{p.daemon.pid}/cmdline"]).stdout.split("\0")
        assert out[:3] == [str(stage / "usr/bin/kmirrord"), "--config", str(stage / "etc/kmirror/kmirrord.conf")]
        assert ["--upstream", dest_cluster.bootstrap] == out[out.index("--upstream"):out.index("--upstream") + 2]
        wait_until(lambda: p.http_get("/healthz")[0] == 200, 60, what="/healthz 200")
        create_topic(p, topic_name, partitions=1, rf=1)
        produce(p, topic_name, 20)
        got = consume(p, topic_name, 20)
        assert sorted(m.value().decode() for m in got) == sorted(f"value-{i}" for i in range(20))
        assert p.metric("kmirror_responses_rewritten_total") > 0
    finally:
        assert p.daemon.stop(timeout=30) == 0, p.daemon.tail()
