"""Shared fixtures and helpers for the proxy tests: kmirrord on free ports in front of a real
cluster, a loopback capture of every byte the proxies send to clients, and the leak scanner.

Every proxy of the suite listens on its own loopback address (PROXY_HOST, 127.0.N.2 on test worker
N, 127.0.0.2 in a serial run) while the brokers listen on 127.0.0.1. So one tcpdump filter per
worker, `src host 127.0.N.2`, captures exactly what that worker's proxies send to their clients
(their upstream connections leave from 127.0.0.1), whichever proxy and port, and anything that
reads "127.0.0.1" plus a broker port in that stream is a leak.
Import everything with `from proxy_fixtures import *`.
"""

import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from harness import Daemon, free_port_block, wait_port


def worker_index():
    """0 for a serial run or xdist's gw0, N for gwN: what keeps the workers' addresses apart."""
    w = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(w[2:]) if w.startswith("gw") and w[2:].isdigit() else 0


PROXY_HOST = os.environ.get("KM_PROXY_HOST", f"127.0.{worker_index()}.2")
UPSTREAM_HOST = "127.0.0.1"
BROKER_PORT_COUNT = 8  # node ids 0..7: the suite's clusters use 1..3

__all__ = ["worker_index", "PROXY_HOST", "UPSTREAM_HOST", "Proxy", "Capture", "port_block", "leak_patterns",
           "scan_flows", "wait_until", "proxy_capture", "proxy3_session", "proxy3",
           "proxy_factory", "upstream_ports", "read_pcap_flows", "TcpRelay"]


def secret_key_and_file_dir(d):
    """In directory d (a pathlib.Path): a mirror_secret_key_file (32 random bytes in hex, mode 0600)
    and an empty mirror_file_dir; returns both paths as pathlib.Paths."""
    key = d / "mirror.key"
    key.write_text(os.urandom(32).hex() + "\n")
    os.chmod(key, 0o600)
    files = d / "mirror-files"
    files.mkdir()
    return key, files


def wait_until(pred, timeout=30.0, interval=0.1, what="condition"):
    """Polls pred() until it returns a true value (returned) or the timeout passes (fails). what:
    what is waited for, or a function saying so (called on the timeout: what was seen)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def server_certs(tmp_path_factory, name):
    """A CA and a server certificate for PROXY_HOST (IP SAN) made with the openssl tool, in a fresh
    directory: {"ca", "cert", "key"} file paths, for a TLS client listener. Skips without openssl."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl tool")
    d = str(tmp_path_factory.mktemp(f"{name}-tls"))

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days",
        "2", "-subj", f"/CN=kmirror {name} test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj",
        "/CN=server")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write(f"subjectAltName=IP:{PROXY_HOST},DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return {k: os.path.join(d, f) for k, f in (("ca", "ca.pem"), ("cert", "server.pem"),
                                                ("key", "server.key"))}


def port_block(n, host=PROXY_HOST):
    """First port of n consecutive ports free on host (see free_port_block)."""
    return free_port_block(n, host)


class Proxy:
    """One kmirrord: a config file (so SIGHUP can reload it), a log file, helpers for clients."""

    def __init__(self, binary, cluster, log_dir, name="kmirrord", upstream=None, **options):
        self.binary = binary
        self.cluster = cluster
        self.name = name
        self.log_dir = log_dir
        base = port_block(BROKER_PORT_COUNT + 2)
        self.port = base
        self.http_port = base + 1
        self.broker_port_base = base + 2
        self.options = {
            "listen": f"{PROXY_HOST}:{self.port}",
            "advertised_host": PROXY_HOST,
            "broker_port_base": self.broker_port_base,
            "broker_port_count": BROKER_PORT_COUNT,
            "upstream": upstream or cluster.bootstrap,
            "http_listen": f"{PROXY_HOST}:{self.http_port}",
            "log_level": "info",
            "metadata_refresh_ms": 5000,
            "drain_interval_ms": 200,
            "drain_timeout_ms": 5000,
        }
        self.options.update(options)
        self.config_path = os.path.join(log_dir, f"{name}.conf")
        self.write_config()
        self.daemon = None
        self.env = None  # extra environment (KRB5_CONFIG for a Kerberos realm)

    # -- lifecycle --------------------------------------------------------------------------

    def write_config(self, options=None, raw=None):
        """Writes the config file from options (default: self.options), or raw text."""
        with open(self.config_path, "w") as f:
            if raw is not None:
                f.write(raw)
            else:
                for k, v in (options or self.options).items():
                    f.write(f"{k} = {v}\n")

    def start(self, timeout=30.0):
        self.daemon = Daemon([self.binary, "--config", self.config_path], self.name, self.log_dir,
                             env=self.env)
        self.daemon.start(port=self.port, host=PROXY_HOST, timeout=timeout)
        return self

    def stop(self, timeout=30.0):
        """SIGTERM (a drain), SIGKILL after timeout; returns the exit status."""
        return self.daemon.stop(timeout=timeout) if self.daemon else None

    def running(self):
        return self.daemon is not None and self.daemon.running()

    def signal(self, sig):
        self.daemon.send_signal(sig)

    def output(self):
        return self.daemon.output() if self.daemon else ""

    def sanitizer_reports(self):
        return self.daemon.sanitizer_reports() if self.daemon else []

    def wait_log(self, pattern, timeout=30.0, start=0):
        """Polls the log (from character offset start) until the regex matches; returns the match."""
        rx = re.compile(pattern)
        return wait_until(lambda: rx.search(self.output(), start), timeout,
                          what=f"log line /{pattern}/ of {self.name}")

    # -- addresses and clients ----------------------------------------------------------------

    @property
    def bootstrap(self):
        return f"{PROXY_HOST}:{self.port}"

    def broker_port(self, node_id):
        return self.broker_port_base + node_id

    def advertised(self):
        """{node_id: "host:port"} the proxy should hand out for the cluster's brokers."""
        return {i: f"{self.options['advertised_host']}:{self.broker_port(i)}"
                for i in self.cluster.broker_ids}

    def conf(self, **extra):
        """librdkafka configuration for a client of this proxy."""
        c = {"bootstrap.servers": self.bootstrap}
        c.update({k.replace("_", "."): v for k, v in extra.items()})
        return c

    def tool(self, tool, *args, **kw):
        """A Kafka Java tool with --bootstrap-server pointing at the proxy."""
        return self.cluster.run_tool(tool, "--bootstrap-server", self.bootstrap, *args, **kw)

    # -- HTTP ---------------------------------------------------------------------------------

    def http_get(self, path, timeout=10.0):
        """(status, body text) of GET path on the HTTP endpoint."""
        url = f"http://{PROXY_HOST}:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def http(self, method, path, body=None, token=None, timeout=10.0):
        """(status, body text) of any request on the HTTP endpoint (token: a bearer token)."""
        url = f"http://{PROXY_HOST}:{self.http_port}{path}"
        req = urllib.request.Request(url, data=body.encode() if body is not None else None, method=method)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self):
        """{metric name with labels: float} from /metrics."""
        status, body = self.http_get("/metrics")
        assert status == 200, body
        out = {}
        for ln in body.splitlines():
            if not ln or ln.startswith("#"):
                continue
            name, _, value = ln.rpartition(" ")
            out[name] = float(value)
        return out

    def metric(self, name, default=0.0):
        return self.metrics().get(name, default)

    def __repr__(self):
        return f"Proxy({self.name}, {self.bootstrap} -> {self.options['upstream']})"


# ---------------------------------------------------------------------------------------------
# Capture: tcpdump on the loopback interface, one pcap file per segment.

class Capture:
    """tcpdump of `tcp and src host HOST` on lo into pcap files, started before any proxy."""

    def __init__(self, out_dir, host=PROXY_HOST, name="capture"):
        self.out_dir = out_dir
        self.host = host
        self.name = name
        self.files = []
        self.proc = None
        self.error = None
        self.stats = []  # tcpdump's closing statistics, one string per segment

    def start(self, timeout=15.0):
        tcpdump = shutil.which("tcpdump")
        if not tcpdump:
            self.error = "tcpdump not installed (scripts/install-deps.sh installs it)"
            return self
        path = os.path.join(self.out_dir, f"{self.name}-{len(self.files)}.pcap")
        self.err_path = path + ".err"
        err = open(self.err_path, "w")
        # -U and --immediate-mode: every packet is written at once (without them the last packets
        # before a stop can be lost); -B: a large kernel buffer (KiB) so bursts from the
        # perf tools are not dropped; -s 0: whole packets.
        self.proc = subprocess.Popen(
            [tcpdump, "-i", "lo", "-n", "-s", "0", "-B", "131072", "-U", "--immediate-mode", "-w", path,
             f"tcp and src host {self.host}"], stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True)
        err.close()
        try:
            wait_until(lambda: self.proc.poll() is not None or "listening on" in self._err(),
                       timeout, 0.05, "tcpdump to listen")
        except AssertionError:
            pass
        if self.proc.poll() is not None or "listening on" not in self._err():
            self.error = f"tcpdump did not start: {self._err().strip()}"
            self._kill()
            return self
        self.files.append(path)
        return self

    def _err(self):
        try:
            with open(self.err_path) as f:
                return f.read()
        except OSError:
            return ""

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self):
        """Stops the current segment; returns tcpdump's statistics text."""
        if self.proc is None:
            return ""
        self._kill()
        text = self._err()
        self.stats.append(text)
        return text

    def dropped(self):
        """Packets tcpdump reported as dropped (kernel and interface), over all segments."""
        total = 0
        for text in self.stats:
            for m in re.finditer(r"(\d+) packets dropped by (kernel|interface)", text):
                total += int(m.group(1))
        return total

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None


def read_pcap_flows(paths):
    """Reassembles the TCP payload of every connection in the pcap files.

    Returns {(src, sport, dst, dport, n): bytes} (n counts the connections that reused one
    address/port 4-tuple) and a list of problems (truncated packets, holes in a stream): the
    scan is only complete when that list is empty. A connection whose SYN is not in the capture
    began before it (another run's proxy on the same address): it is reassembled from its
    lowest sequence number, best effort, and not reported."""
    conns = {}    # (4-tuple, n) -> {"isn": seq or None, "segs": [(seq, payload)]}
    current = {}  # 4-tuple -> n of its latest connection
    problems = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if len(data) < 24:
            problems.append(f"{path}: no pcap header")
            continue
        magic = data[:4]
        if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
            endian = "<"
        elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
            endian = ">"
        else:
            problems.append(f"{path}: not a pcap file")
            continue
        linktype = struct.unpack_from(endian + "I", data, 20)[0]
        pos = 24
        while pos + 16 <= len(data):
            _, _, incl, orig = struct.unpack_from(endian + "IIII", data, pos)
            pos += 16
            pkt = data[pos:pos + incl]
            pos += incl
            if len(pkt) < incl:
                break  # the last record of a file still being written
            if incl < orig:
                problems.append(f"{path}: packet cut to {incl} of {orig} bytes")
                continue
            if linktype == 1:  # Ethernet (what lo reports)
                if len(pkt) < 14 or struct.unpack_from(">H", pkt, 12)[0] != 0x0800:
                    continue
                ip = pkt[14:]
            elif linktype == 113:  # Linux cooked
                ip = pkt[16:]
            else:
                problems.append(f"{path}: link type {linktype}")
                break
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            ihl = (ip[0] & 15) * 4
            total = struct.unpack_from(">H", ip, 2)[0]
            tcp = ip[ihl:total]
            if len(tcp) < 20:
                continue
            sport, dport, seq = struct.unpack_from(">HHI", tcp, 0)
            thl = (tcp[12] >> 4) * 4
            flags = tcp[13]
            tup = (socket.inet_ntoa(ip[12:16]), sport, socket.inet_ntoa(ip[16:20]), dport)
            if flags & 0x02:  # SYN: a new connection; its payload starts at seq + 1
                n = current[tup] = current.get(tup, -1) + 1
                conns[tup + (n,)] = {"isn": seq, "segs": []}
                continue
            payload = tcp[thl:]
            if not payload:
                continue
            if tup not in current:
                current[tup] = 0
                conns[tup + (0,)] = {"isn": None, "segs": []}
            conns[tup + (current[tup],)]["segs"].append((seq, payload))
    flows = {}
    for key, c in conns.items():
        parts = c["segs"]
        if not parts:
            flows[key] = b""
            continue
        start = (c["isn"] + 1) if c["isn"] is not None else min(s for s, _ in parts)
        rel = []
        for s, p in parts:
            off = (s - start) & 0xFFFFFFFF
            if off >= 1 << 31:  # before the start: a keepalive probe (seq - 1), nothing new
                if len(p) > 1 and c["isn"] is not None:
                    problems.append(f"{key}: {len(p)} bytes before the stream start")
                continue
            rel.append((off, p))
        rel.sort(key=lambda x: x[0])
        out = bytearray()
        for off, p in rel:
            if off > len(out):
                if c["isn"] is not None:
                    problems.append(f"{key}: {off - len(out)} bytes missing at offset {len(out)}")
                if off - len(out) > 1 << 26:
                    break  # not one stream: do not fill gigabytes
                out += b"\0" * (off - len(out))
            if off + len(p) > len(out):
                out += p[len(out) - off:]
        flows[key] = bytes(out)
    return flows, problems


def upstream_ports(clusters):
    """Every port any node of the clusters listens on (client, SASL, internal, controller)."""
    ports = set()
    for c in clusters:
        for n in c.nodes.values():
            for p in (n.client_port, n.sasl_port, n.internal_port, n.controller_port):
                if p:
                    ports.add(p)
    return ports


def leak_patterns(ports, upstream_host=UPSTREAM_HOST, proxy_host=PROXY_HOST):
    """A regex matching an upstream address in client-bound bytes, in any form Kafka or a log
    message would carry it:

    * a host string followed by a big-endian int32 port (how every Kafka broker endpoint is
      encoded), for the upstream host, the proxy's host and "localhost" (a port left unrewritten
      behind a rewritten host is as much a leak), with any of the upstream ports;
    * a Kafka-encoded upstream host string (int16 or compact length) followed by any int32 port
      0..65535: a broker endpoint of the upstream, whichever port;
    * "host:port" in text."""
    alts = []
    port_bytes = b"|".join(re.escape(struct.pack(">i", p)) for p in sorted(ports))
    for h in {upstream_host, proxy_host, "localhost"}:
        alts.append(re.escape(h.encode()) + b"(?:" + port_bytes + b")")
        alts.append(re.escape(h.encode()) + b":(?:" +
                    b"|".join(str(p).encode() for p in sorted(ports)) + b")(?![0-9])")
    hb = upstream_host.encode()
    enc = re.escape(struct.pack(">h", len(hb))) + b"|" + re.escape(bytes([len(hb) + 1]))
    alts.append(b"(?:" + enc + b")" + re.escape(hb) + b"\x00\x00[\x00-\xff]{2}")
    return LeakPattern(re.compile(b"|".join(alts)), {upstream_host, proxy_host, "localhost"})


class LeakPattern:
    """leak_patterns' regex, searched only where one of its host strings occurs: every form starts
    with the host or at most 2 bytes (a length) before it. Python's regex engine tries every
    alternative at every byte (about 10 MB/s here); bytes.find runs at memory speed, and a worker's
    capture is hundreds of MB."""

    LEAD = 2

    def __init__(self, regex, hosts):
        self.regex = regex
        self.hosts = [h.encode() for h in hosts]

    def finditer(self, data):
        starts = set()
        for h in self.hosts:
            i = data.find(h)
            while i >= 0:
                starts.update(range(max(0, i - self.LEAD), i + 1))
                i = data.find(h, i + 1)
        end = 0
        for at in sorted(starts):
            if at < end:
                continue  # inside the last match: leftmost, non-overlapping, as re.finditer
            m = self.regex.match(data, at)
            if m:
                end = m.end()
                yield m


def scan_flows(flows, pattern, context=24):
    """Every match of pattern (leak_patterns') in the flows: a list of (flow, offset, matched bytes,
    context)."""
    hits = []
    for key, data in flows.items():
        for m in pattern.finditer(data):
            a = max(0, m.start() - context)
            hits.append((key, m.start(), m.group(0), data[a:m.end() + context]))
    return hits


class TcpRelay:
    """A plain TCP relay (no rewriting) on host:port to a target: the negative control of the
    leak scan (what a proxy that forgets to rewrite would send)."""

    def __init__(self, host, target):
        self.host = host
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.threads = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.target, timeout=10)
            except OSError:
                c.close()
                continue
            for a, b in ((c, u), (u, c)):
                t = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                t.start()

    @staticmethod
    def _pipe(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.stopped = True
        self.sock.close()


# ---------------------------------------------------------------------------------------------
# Fixtures

# Test modules import these fixtures, and pytest makes one fixture definition per importing
# module: a session fixture would then run once per module. The objects themselves are therefore
# kept here, once per process, and every definition hands out the same ones.
_session = {}
_session_lock = threading.Lock()


@pytest.fixture(scope="session")
def proxy_capture(tmp_path_factory):
    """The capture of everything every proxy of the session sends to its clients."""
    with _session_lock:
        cap = _session.get("capture")
        if cap is None:
            cap = _session["capture"] = Capture(str(tmp_path_factory.mktemp("capture"))).start()
    yield cap
    cap.stop()


class _SessionProxy:
    """Holds the session's proxy in front of the 3-broker cluster; restarts it when a test
    stopped it (the final test stops it to check its exit and sanitizer output)."""

    def __init__(self, binary, cluster, log_dir):
        self.binary, self.cluster, self.log_dir = binary, cluster, log_dir
        self.proxy = None
        self.all = []

    def get(self):
        if self.proxy is None or not self.proxy.running():
            # It hosts no mirror of its own: it follows __mirror_state on the shared destination,
            # where the tests' own kmirrords run their mirrors, and must not run their pipelines.
            self.proxy = Proxy(self.binary, self.cluster, self.log_dir,
                               name=f"kmirrord-session-{len(self.all) + 1}", mirror_pipelines="none").start()
            self.all.append(self.proxy)
            # Ready once the proxy has learnt every broker from its own Metadata request.
            wait_until(lambda: self.proxy.metric("kmirror_upstream_brokers") >=
                       len(self.cluster.broker_ids), 30, what="proxy to learn the brokers")
        return self.proxy


@pytest.fixture(scope="session")
def proxy3_session(kmirrord_bin, dest_cluster3, proxy_capture, tmp_path_factory):
    with _session_lock:
        holder = _session.get("proxy3")
        if holder is None:
            holder = _session["proxy3"] = _SessionProxy(
                kmirrord_bin, dest_cluster3, str(tmp_path_factory.mktemp("proxy3")))
    yield holder
    if holder.proxy is not None:
        holder.proxy.stop()


@pytest.fixture
def proxy3(proxy3_session):
    """The session's kmirrord in front of dest_cluster3 (3 brokers); the test fails if the proxy
    died during it."""
    p = proxy3_session.get()
    yield p
    assert p.running(), f"kmirrord exited during the test:\n{p.daemon.tail()}"


@pytest.fixture
def proxy_factory(kmirrord_bin, proxy_capture, tmp_path):
    """start(cluster, **options) -> a started Proxy of this test; stopped at the end, and any
    sanitizer report in its output fails the test."""
    started = []

    def start(cluster, name=None, start=True, **options):
        p = Proxy(kmirrord_bin, cluster, str(tmp_path), name=name or f"kmirrord-{len(started)}",
                  **options)
        started.append(p)
        return p.start() if start else p

    yield start
    reports = []
    for p in started:
        p.stop()
        reports += [f"{p.name}: {ln}" for ln in p.sanitizer_reports()]
    if reports:
        pytest.fail("sanitizer reports:\n" + "\n".join(reports[:50]), pytrace=False)


# ---------------------------------------------------------------------------------------------
# Client helpers (confluent-kafka through a proxy)

def create_topic(proxy, topic, partitions=3, rf=3, config=None):
    """Creates a topic with the admin client through the proxy, and waits for its leaders."""
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient(proxy.conf())
    a.create_topics([NewTopic(topic, partitions, rf, config=config or {})],
                    operation_timeout=30)[topic].result(timeout=60)
    proxy.cluster.wait_topic(topic, partitions)


def produce(proxy, topic, n, value=lambda i: f"value-{i}".encode(), key=lambda i: f"key-{i}",
            **conf):
    """Produces n records through the proxy; returns {key: (partition, offset)} of the acked."""
    from confluent_kafka import Producer
    acked = {}
    errors = []

    def cb(err, msg):
        if err:
            errors.append(err)
        else:
            acked[msg.key().decode()] = (msg.partition(), msg.offset())
    c = proxy.conf(**{"acks": "all", "linger.ms": 10})
    c.update(conf)
    p = Producer(c)
    for i in range(n):
        p.produce(topic, key=key(i), value=value(i), on_delivery=cb)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:5]
    return acked


def consume(proxy, topic, expect, group=None, timeout=90.0, idle=None, **conf):
    """Reads through the proxy until expect records arrived (or, with idle, until nothing came
    for idle seconds); returns the messages."""
    from confluent_kafka import Consumer, KafkaException
    c = proxy.conf(**{"group.id": group or f"g-{topic}-{random.randrange(1 << 30)}",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.update(conf)
    cons = Consumer(c)
    cons.subscribe([topic])
    msgs = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if expect is not None and len(msgs) >= expect:
                break
            if idle is not None and msgs and time.monotonic() - last > idle:
                break
            for m in cons.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    raise KafkaException(m.error())
                msgs.append(m)
                last = time.monotonic()
        if group and msgs:
            cons.commit(asynchronous=False)
    finally:
        cons.close()
    return msgs


__all__ += ["create_topic", "produce", "consume"]
