"""Starts and stops real Apache Kafka (KRaft) clusters on free loopback ports for kmirror's tests.

Standard library only. A cluster is either one combined broker+controller node, or one dedicated
controller plus N brokers (so that stopping a broker never touches the quorum). Every node listens on:

  CLIENT    PLAINTEXT        what tests and clients use (principal User:ANONYMOUS)
  SASL      SASL_PLAINTEXT   PLAIN and SCRAM-SHA-256/512 users (admin is the super user)
  INTERNAL  SASL_PLAINTEXT   inter-broker traffic, as the super user admin
  CONTROLLER SASL_PLAINTEXT  KRaft controller traffic, as admin (controller nodes only)

StandardAuthorizer is on with allow.everyone.if.no.acl.found=true, so anonymous clients can do
everything until a test adds ACLs, and the brokers keep working whatever ACLs a test adds.
"""

import atexit
import base64
import ctypes
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid

from . import cds, tool_runner

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FETCH_KAFKA = os.path.join(REPO, "tests", "kafka", "fetch-kafka")

# Users known to every cluster (PLAIN from the JAAS config, SCRAM from the formatted metadata).
SUPER_USER = "admin"
USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}

# Short names for the Java tools, by main class (Kafka 4.x jars). Where a release moved a tool,
# TOOLS_MOVED has the class per version and tool_class() picks the one of the jars in use.
TOOLS = {
    "topics": "org.apache.kafka.tools.TopicCommand",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "configs": "org.apache.kafka.tools.ConfigCommand",
    "acls": "org.apache.kafka.tools.AclCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "features": "org.apache.kafka.tools.FeatureCommand",
    "broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
    "verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "dump-log": "org.apache.kafka.tools.DumpLogSegments",
    "storage": "kafka.tools.StorageTool",
}
# {short name: [(first version with that class, main class), ...]}, newest first; TOOLS holds the
# newest. ConfigCommand and DumpLogSegments moved from the Scala jar (kafka_2.13) to kafka-tools
# after 4.1: 4.1.1 has the old classes, 4.4.0 the new ones; 4.2 is taken as the first release.
TOOLS_MOVED = {
    "configs": [((4, 2), "org.apache.kafka.tools.ConfigCommand"),
                ((0, 0), "kafka.admin.ConfigCommand")],
    "dump-log": [((4, 2), "org.apache.kafka.tools.DumpLogSegments"),
                 ((0, 0), "kafka.tools.DumpLogSegments")],
    # The old sources (3.9.x, 2.8.x): the Scala tools before they moved to kafka-tools.
    "topics": [((3, 5), "org.apache.kafka.tools.TopicCommand"),
               ((0, 0), "kafka.admin.TopicCommand")],
    "console-producer": [((4, 0), "org.apache.kafka.tools.ConsoleProducer"),
                         ((0, 0), "kafka.tools.ConsoleProducer")],
    "console-consumer": [((3, 7), "org.apache.kafka.tools.consumer.ConsoleConsumer"),
                         ((0, 0), "kafka.tools.ConsoleConsumer")],
    "get-offsets": [((3, 5), "org.apache.kafka.tools.GetOffsetShell"),
                    ((0, 0), "kafka.tools.GetOffsetShell")],
}

BROKER_JVM_OPTS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:-UsePerfData",
                   "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true"]
# KM_BROKER_PROFILE=test (the integration suite's conftest sets it): brokers for many short tests
# on two shared cores. C1 only (a 3-broker cluster starts in 7 s instead of 13 and takes a third
# less CPU for the test-sized loads), and the controller's no-op record every 5 s instead of
# every 0.5 s (idle brokers take a third less CPU). The default keeps Kafka's JIT and timings,
# for the benchmarks.
TEST_PROFILE_JVM_OPTS = ["-XX:TieredStopAtLevel=1"]
TEST_PROFILE_PROPERTIES = {"metadata.max.idle.interval.ms": 5000}

# The tool runner (tool_runner.py) lives for the whole session: the full JIT pays off there.
RUNNER_JVM_OPTS = ["-Xmx512m", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Djava.awt.headless=true"]
# Tools are short-lived: C1 only starts them noticeably faster on two cores.
TOOL_JVM_OPTS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
                 "-Djava.awt.headless=true"]


def in_test_profile():
    """KM_BROKER_PROFILE=test: brokers with TEST_PROFILE_JVM_OPTS and TEST_PROFILE_PROPERTIES."""
    return os.environ.get("KM_BROKER_PROFILE") == "test"


class KafkaError(RuntimeError):
    """A cluster did not start, stop or answer as expected."""


def kafka_libs(release=None):
    """Returns the directory of the pinned Kafka jars, fetching them once if missing. release
    ("3.9.2", "2.8.2") asks for another release than the suite's (the old-source tests), fetched
    into the same cache; KM_KAFKA_LIBS only replaces the suite's own release."""
    env = os.environ.get("KM_KAFKA_LIBS")
    if env and release is None:
        return env
    envp = None
    if release is not None:
        envp = dict(os.environ, KM_KAFKA_VERSION=release)
    out = subprocess.run([FETCH_KAFKA], check=True, stdout=subprocess.PIPE, text=True,
                         env=envp).stdout
    return out.strip().splitlines()[-1]


def kafka_version(libs=None):
    """The Kafka release of a libs directory (default: the one in use), as a tuple of ints, read
    from the name of its broker jar (kafka_2.13-X.Y.Z.jar)."""
    libs = libs or kafka_libs()
    for name in sorted(os.listdir(libs)):
        m = re.fullmatch(r"kafka_[0-9.]+-([0-9]+)\.([0-9]+)\.([0-9]+)(?:-.*)?\.jar", name)
        if m:
            return tuple(int(x) for x in m.groups())
    raise KafkaError(f"no kafka_2.13-*.jar in {libs}")


def tool_class(tool, version):
    """The main class of a tool (short name or class) in the given Kafka release."""
    for since, cls in TOOLS_MOVED.get(tool, []):
        if tuple(version) >= since:
            return cls
    return TOOLS.get(tool, tool)


def java_bin():
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    path = shutil.which("java")
    if not path:
        raise KafkaError("java not found (run scripts/install-deps.sh)")
    return path


# Ports handed out, shared by every test process on the machine (the workers of a parallel run,
# a second run beside it): a registry file under an exclusive lock, one "port pid" line each.
# Lines of processes that are gone are dropped; a port stays taken for as long as its process lives.
PORT_REGISTRY = os.environ.get("KM_PORT_REGISTRY",
                               os.path.join(tempfile.gettempdir(), "kmirror-ports.registry"))
_ports_lock = threading.Lock()


class _PortRegistry:
    """The registry, locked and read on entry; take() reserves, written back on exit."""

    def __enter__(self):
        _ports_lock.acquire()
        try:
            self.f = open(PORT_REGISTRY, "a+")
            fcntl.flock(self.f, fcntl.LOCK_EX)
            self.f.seek(0)
            self.taken, self.lines, alive = set(), [], {}
            for line in self.f.read().splitlines():
                try:
                    port, pid = (int(x) for x in line.split())
                except ValueError:
                    continue
                if pid not in alive:
                    alive[pid] = pid == os.getpid() or _pid_alive(pid)
                if alive[pid]:
                    self.taken.add(port)
                    self.lines.append(line)
            return self
        except BaseException:
            _ports_lock.release()
            raise

    def take(self, ports):
        self.taken.update(ports)
        self.lines += [f"{p} {os.getpid()}" for p in ports]

    def __exit__(self, *exc):
        try:
            self.f.seek(0)
            self.f.truncate()
            self.f.write("".join(ln + "\n" for ln in self.lines))
            self.f.flush()
        finally:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()
            _ports_lock.release()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host="127.0.0.1"):
    """A loopback port that is free now and not handed out before by any test process alive
    (PORT_REGISTRY).

    Taken at random below the kernel's ephemeral range when there is room, so that the outgoing
    connections of everything else on the machine cannot grab it before the broker binds it;
    start() still retries with new ports if a broker finds its port taken."""
    low = _ephemeral_low()
    with _PortRegistry() as reg:
        for attempt in range(200):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, random.randrange(10000, low) if low > 12000 and attempt < 150
                            else 0))
                except OSError:
                    continue
                port = s.getsockname()[1]
            if port not in reg.taken:
                reg.take([port])
                return port
    raise KafkaError("no free port")


def free_port_block(n, host="127.0.0.1"):
    """First of n consecutive ports free on host now, below the ephemeral range, none of them
    handed out before (by free_port or here) to a test process alive: one registry for both, so
    a proxy's listener never shares a port number with a broker of the same run or of another
    worker, on any loopback address (the leak scan matches port numbers, and a client would be
    told of either)."""
    low = min(_ephemeral_low(), 65536) - n - 1
    with _PortRegistry() as reg:
        for _ in range(500):
            base = random.randrange(10000, max(low, 10001))
            want = range(base, base + n)
            if any(p in reg.taken for p in want):
                continue
            socks = []
            try:
                for p in want:
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    socks.append(s)
                    s.bind((host, p))
            except OSError:
                continue
            finally:
                for s in socks:
                    s.close()
            reg.take(want)
            return base
    raise KafkaError("no free port block")


def new_cluster_id():
    """A random KRaft cluster id (base64url of a UUID). One that starts with '-' would be taken for
    an option by the storage tool's `-t`, so draw again."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _set_pdeathsig():
    # The broker dies with the process that started it, even if that one is SIGKILLed.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _pid_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_pid(pid, marker, timeout=20.0):
    """SIGTERM, then SIGKILL after timeout; only if the process's command line contains marker
    (so a recycled pid is never hit). Returns True if a process was stopped."""
    if not _pid_alive(pid) or marker not in _pid_cmdline(pid):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        while _pid_alive(pid):
            time.sleep(0.05)
    return True


# ---------------------------------------------------------------------------------------------
# A minimal Kafka client: Metadata v1 for readiness (enough to see registered brokers), and
# ApiVersions v3+ for the tests of the versions and features a proxy offers.

def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return buf


def uvarint(n):
    """n as an unsigned varint (the flexible versions' lengths and counts)."""
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def kafka_request(host, port, api_key, version, body, flexible=False, timeout=5.0,
                  correlation_id=7, client_id=b"kmirror-harness"):
    """Sends one request (header v1, or v2 when flexible) and returns the response after its
    correlation id (a v0 response header; flexible responses other than ApiVersions start with
    their header's tagged fields)."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    if flexible:
        header += b"\0"  # no tagged fields
    frame = header + body
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        if size < 4 or size > 1 << 20:
            raise ConnectionError(f"bad response size {size} for api key {api_key}")
        data = _recv_exact(s, size)
    if struct.unpack_from(">i", data)[0] != correlation_id:
        raise ConnectionError(f"wrong correlation id in the response to api key {api_key}")
    return data[4:]


def metadata_brokers(host, port, timeout=5.0):
    """Sends Metadata v1 (all topics) and returns ({node_id: (host, port)}, controller_id)."""
    data = kafka_request(host, port, 3, 1, struct.pack(">i", 0), timeout=timeout)
    if len(data) < 4:
        raise ConnectionError("short metadata response")
    pos = 0
    (n,) = struct.unpack_from(">i", data, pos)
    pos += 4
    brokers = {}
    for _ in range(n):
        node_id, hlen = struct.unpack_from(">ih", data, pos)
        pos += 6
        bhost = data[pos:pos + hlen].decode()
        pos += hlen
        (bport, rlen) = struct.unpack_from(">ih", data, pos)
        pos += 6 + max(rlen, 0)
        brokers[node_id] = (bhost, bport)
    (controller,) = struct.unpack_from(">i", data, pos)
    return brokers, controller


class _Reader:
    """Kafka's primitive types, enough for ApiVersions v3+ (compact arrays, tagged fields)."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def unpack(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v if len(v) > 1 else v[0]

    def uvarint(self):
        shift = value = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def compact_string(self):
        n = self.uvarint() - 1
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def tagged_fields(self):
        """{tag: raw bytes}"""
        out = {}
        for _ in range(self.uvarint()):
            tag, size = self.uvarint(), self.uvarint()
            out[tag] = self.data[self.pos:self.pos + size]
            self.pos += size
        return out


def _compact_string(s):
    b = s.encode()
    return bytes([len(b) + 1]) + b


def api_versions(host, port, version=4, timeout=5.0):
    """Sends ApiVersions (v3 or later: finalized features come back) and returns a dict:
    error, apis {key: (min, max)}, supported_features {name: (min, max)}, finalized_epoch and
    finalized_features {name: (min level, max level)}."""
    body = _compact_string("kmirror-harness") + _compact_string("1") + b"\0"
    r = _Reader(kafka_request(host, port, 18, version, body, flexible=True, timeout=timeout))
    out = {"error": r.unpack(">h"), "apis": {}, "supported_features": {},
           "finalized_epoch": -1, "finalized_features": {}}
    if out["error"]:
        return out
    for _ in range(r.uvarint() - 1):
        key, lo, hi = r.unpack(">hhh")
        r.tagged_fields()
        out["apis"][key] = (lo, hi)
    out["throttle_ms"] = r.unpack(">i")
    tags = r.tagged_fields()
    if r.pos != len(r.data):
        raise ConnectionError(f"{len(r.data) - r.pos} bytes after the ApiVersions response")

    def features(raw, flip):
        f = _Reader(raw)
        got = {}
        for _ in range(f.uvarint() - 1):
            name = f.compact_string()
            a, b = f.unpack(">hh")
            f.tagged_fields()
            got[name] = (b, a) if flip else (a, b)
        return got
    if 0 in tags:
        out["supported_features"] = features(tags[0], False)   # MinVersion, MaxVersion
    if 1 in tags:
        out["finalized_epoch"] = struct.unpack(">q", tags[1])[0]
    if 2 in tags:
        out["finalized_features"] = features(tags[2], True)    # MaxVersionLevel, MinVersionLevel
    return out


# ---------------------------------------------------------------------------------------------
# Record batches on disk: enough to assert which codec a producer used.

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def read_batches(path):
    """Yields the v2 batch headers of a segment file as dicts."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 61 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if length <= 0 or pos + 12 + length > len(data):
            break
        (epoch, magic, crc, attrs, last_delta, first_ts, max_ts, pid, pepoch, seq,
         count) = struct.unpack_from(">ibIhiqqqhii", data, pos + 12)
        yield {
            "base_offset": base_offset, "length": length, "leader_epoch": epoch, "magic": magic,
            "crc": crc, "attributes": attrs, "codec": CODECS.get(attrs & 7, str(attrs & 7)),
            "transactional": bool(attrs & 0x10), "control": bool(attrs & 0x20),
            "last_offset_delta": last_delta, "first_timestamp": first_ts,
            "max_timestamp": max_ts, "producer_id": pid, "producer_epoch": pepoch,
            "base_sequence": seq, "records": count,
        }
        pos += 12 + length


# ---------------------------------------------------------------------------------------------

_live = set()
_live_lock = threading.Lock()
_handlers_installed = False


def _stop_all_live():
    with _live_lock:
        clusters = list(_live)
    for c in clusters:
        try:
            c.stop()
        except Exception:  # keep going: the point is to leave nothing behind
            pass


def _on_signal(signum, frame):
    _stop_all_live()
    prev = _prev_handlers.get(signum)
    if callable(prev):
        prev(signum, frame)
    # KeyboardInterrupt, not SystemExit: pytest aborts the whole session on it (and runs the
    # fixtures' teardown) instead of recording one failed test and carrying on.
    raise KeyboardInterrupt(f"signal {signum}")


_prev_handlers = {}


def _install_cleanup():
    """Stops every attached cluster at interpreter exit and on SIGTERM/SIGHUP/SIGINT."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_stop_all_live)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        prev = signal.getsignal(sig)
        _prev_handlers[sig] = prev if callable(prev) and prev not in (
            signal.default_int_handler,) else None
        signal.signal(sig, _on_signal)


class ZooKeeperNode:
    """The ZooKeeper server of a cluster on a release that runs on ZooKeeper (2.8.x, an old
    source): ZooKeeperServerMain from the org.apache.zookeeper:zookeeper jar that release depends
    on, standalone, on a free loopback port, with its admin server (Jetty, port 8080) off."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.dir = os.path.join(cluster.base_dir, "zookeeper")
        self.data_dir = os.path.join(self.dir, "data")
        self.config_path = os.path.join(self.dir, "zoo.cfg")
        self.log_path = os.path.join(self.dir, "zookeeper.log")
        self.out_path = os.path.join(self.dir, "zookeeper.out")
        self.host = "127.0.0.1"
        self.port = free_port()
        self.proc = None
        self.pid = None

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def running(self):
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and _pid_alive(self.pid)

    def start(self, timeout=60.0):
        os.makedirs(self.data_dir, exist_ok=True)
        with open(self.config_path, "w") as f:
            f.write(f"dataDir={self.data_dir}\nclientPort={self.port}\n"
                    f"clientPortAddress={self.host}\ntickTime=2000\nmaxClientCnxns=0\n"
                    "admin.enableServer=false\n")
        log4j = os.path.join(self.dir, "log4j2.properties")
        with open(log4j, "w") as f:
            f.write(f"status = error\nappender.file.type = File\nappender.file.name = FILE\n"
                    f"appender.file.fileName = {self.log_path}\n"
                    "appender.file.layout.type = PatternLayout\n"
                    "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
                    "rootLogger.level = WARN\nrootLogger.appenderRef.file.ref = FILE\n")
        args = [java_bin(), "-Xms32m", "-Xmx128m", "-XX:+UseSerialGC", "-XX:-UsePerfData",
                "-XX:TieredStopAtLevel=1", f"-Dlog4j2.configurationFile={log4j}",
                "-Dzookeeper.admin.enableServer=false",
                f"-Dkmirror.cluster={self.cluster.name}",
                "-cp", os.path.join(self.cluster.libs, "*"),
                "org.apache.zookeeper.server.ZooKeeperServerMain", self.config_path]
        out = open(self.out_path, "ab")
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir,
            start_new_session=True,
            preexec_fn=_set_pdeathsig if self.cluster.attached else None)
        out.close()
        self.pid = self.proc.pid
        # Ready when it accepts connections (the brokers' client retries until then anyway).
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                raise KafkaError(f"{self.cluster.name}: zookeeper exited "
                                 f"(status {self.proc.poll()})\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise KafkaError(f"{self.cluster.name}: zookeeper not listening after "
                                 f"{timeout:.0f}s\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self):
        if self.pid is not None:
            kill_pid(self.pid, self.config_path, timeout=10.0)
            if self.proc:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self.proc = None
        self.pid = None

    def log_tail(self, lines=40):
        out = []
        for path in (self.log_path, self.out_path):
            try:
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-lines:]
            except OSError:
                continue
            if tail:
                out.append(f"--- {path} (last {len(tail)} lines) ---\n" + "".join(tail))
        return "\n".join(out) or f"(no log in {self.dir})"


class KafkaNode:
    """One JVM of a cluster: its id, roles, ports, directories and process."""

    def __init__(self, cluster, node_id, roles):
        self.cluster = cluster
        self.node_id = node_id
        self.roles = roles
        self.dir = os.path.join(cluster.base_dir, f"node-{node_id}")
        self.data_dir = os.path.join(self.dir, "data")
        self.config_path = os.path.join(self.dir, "server.properties")
        self.log_path = os.path.join(self.dir, "server.log")
        self.out_path = os.path.join(self.dir, "server.out")
        self.host = "127.0.0.1"
        self.is_broker = "broker" in roles
        self.is_controller = "controller" in roles
        self.client_port = free_port() if self.is_broker else None
        self.sasl_port = free_port() if self.is_broker else None
        self.internal_port = free_port() if self.is_broker else None
        self.controller_port = free_port() if self.is_controller else None
        self.extra_ports = {name: free_port() for name in cluster.extra_listeners} if self.is_broker else {}
        self.proc = None
        self.pid = None
        self.wanted = False  # should be running (false after stop_broker)

    @property
    def address(self):
        return f"{self.host}:{self.client_port}"

    @property
    def sasl_address(self):
        return f"{self.host}:{self.sasl_port}"

    def running(self):
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and _pid_alive(self.pid)

    def log_tail(self, lines=40):
        out = []
        for path in (self.log_path, self.out_path):
            try:
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-lines:]
            except OSError:
                continue
            if tail:
                out.append(f"--- {path} (last {len(tail)} lines) ---\n" + "".join(tail))
        return "\n".join(out) or f"(no log in {self.dir})"


class KafkaCluster:
    """A KRaft cluster of real Kafka brokers on loopback ports.

    brokers=1 gives one combined broker+controller (node id 1); brokers=N>1 gives a controller
    (node id 1000) and brokers 1..N. release ("3.9.2", "2.8.2") runs another Kafka release than
    the suite's, with its own jars (fetched into the same cache); a release before 3.0 runs in
    ZooKeeper mode instead: a ZooKeeper server (`cluster.zookeeper`) and brokers 1..N, no
    controller node, the ZooKeeper AclAuthorizer and only PLAIN on the SASL listener. overrides are extra broker properties; advertise maps a
    broker id to the "host:port" its CLIENT listener advertises (e.g. a recording relay).
    extra_listeners maps a listener name to {broker id: "host:port" it advertises}: each broker
    gets one more PLAINTEXT listener on a port of its own (node.extra_ports[name]), advertising
    another address (a relay in front of that port), while CLIENT stays direct (KRaft only).
    attached=True ties the JVMs to this process (killed with it, stopped at exit); the shell
    entry point uses attached=False and stops clusters from a state file instead.
    """

    CONTROLLER_ID = 1000

    def __init__(self, name="kafka", brokers=1, base_dir=None, overrides=None, advertise=None,
                 jvm_opts=None, attached=True, keep_dir=None, release=None, extra_listeners=None,
                 kerberos=None, oauth=None):
        self.name = name
        # A harness.kdc.Kdc: the SASL listener offers GSSAPI too, as kafka/127.0.0.1@REALM.
        self.kerberos = kerberos
        # A harness.oauth.Issuer: the SASL listener offers OAUTHBEARER too, validating its tokens
        # (unsigned ones with Kafka's unsecured validator, signed ones against its JWKS).
        self.oauth = oauth
        self.extra_listeners = dict(extra_listeners or {})
        self.n_brokers = brokers
        self.overrides = dict(overrides or {})
        self.advertise = dict(advertise or {})
        self.jvm_opts = list(jvm_opts or BROKER_JVM_OPTS + (
            TEST_PROFILE_JVM_OPTS if in_test_profile() else []))
        if kerberos is not None:
            self.jvm_opts = self.jvm_opts + kerberos.java_opts
        if oauth is not None:
            self.jvm_opts = self.jvm_opts + oauth.java_opts
        self.attached = attached
        self.keep_dir = (os.environ.get("KM_KEEP_KAFKA_DIRS") == "1") if keep_dir is None else keep_dir
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix=f"kmirror-{name}-")
        os.makedirs(self.base_dir, exist_ok=True)
        self.libs = kafka_libs(release)
        self.version = kafka_version(self.libs)
        # 2.x has KRaft only as an early-access preview: an old source of that age runs on
        # ZooKeeper, as it would in the field.
        self.zk_mode = self.version < (3, 0)
        self.zookeeper = None
        self.cluster_id = new_cluster_id()
        self.nodes = {}
        self._make_nodes()
        self.started = False
        self._formatted = False

    def _make_nodes(self):
        """(Re)creates the node objects with fresh ports."""
        self.nodes = {}
        if self.zk_mode:
            self.zookeeper = ZooKeeperNode(self)
            for i in range(1, self.n_brokers + 1):
                self.nodes[i] = KafkaNode(self, i, ("broker",))
            return
        if self.n_brokers == 1:
            self.nodes[1] = KafkaNode(self, 1, ("broker", "controller"))
        else:
            self.nodes[self.CONTROLLER_ID] = KafkaNode(self, self.CONTROLLER_ID, ("controller",))
            for i in range(1, self.n_brokers + 1):
                self.nodes[i] = KafkaNode(self, i, ("broker",))

    # -- addresses -----------------------------------------------------------------------------

    @property
    def broker_nodes(self):
        return [n for n in self.nodes.values() if n.is_broker]

    @property
    def broker_ids(self):
        return sorted(n.node_id for n in self.broker_nodes)

    @property
    def bootstrap(self):
        """Comma-separated CLIENT (PLAINTEXT) addresses of all brokers."""
        return ",".join(n.address for n in self.broker_nodes)

    @property
    def sasl_bootstrap(self):
        return ",".join(n.sasl_address for n in self.broker_nodes)

    def broker_address(self, node_id):
        return self.nodes[node_id].address

    @property
    def broker_addresses(self):
        return {n.node_id: n.address for n in self.broker_nodes}

    @property
    def controller_address(self):
        n = next(n for n in self.nodes.values() if n.is_controller)
        return f"{n.host}:{n.controller_port}"

    def client_props(self, user=None, mechanism="PLAIN"):
        """librdkafka (confluent-kafka) client config; SASL over the SASL listener if user is given."""
        if user is None:
            return {"bootstrap.servers": self.bootstrap}
        props = {
            "bootstrap.servers": self.sasl_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": USERS[user],
        }
        return props

    def command_config(self, user=SUPER_USER, mechanism="PLAIN"):
        """Path of a Java client properties file that logs in as user over the SASL listener."""
        path = os.path.join(self.base_dir, f"client-{user}-{mechanism.lower()}.properties")
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        with open(path, "w") as f:
            f.write("security.protocol=SASL_PLAINTEXT\n")
            f.write(f"sasl.mechanism={mechanism}\n")
            f.write(f'sasl.jaas.config={module} required username="{user}" '
                    f'password="{USERS[user]}";\n')
        return path

    # -- configuration -------------------------------------------------------------------------

    def _jaas(self, with_users):
        users = " ".join(f'user_{u}="{p}"' for u, p in USERS.items()) if with_users else ""
        return ('org.apache.kafka.common.security.plain.PlainLoginModule required '
                f'username="{SUPER_USER}" password="{USERS[SUPER_USER]}" {users};')

    def _zk_properties(self, node):
        """A ZooKeeper-mode broker (release 2.x): the same listeners minus CONTROLLER, SASL with
        PLAIN only (SCRAM users would live in ZooKeeper), the ZooKeeper ACL authorizer."""
        rf = min(3, self.n_brokers)
        adv_client = self.advertise.get(node.node_id, node.address)
        p = {
            "broker.id": node.node_id,
            "log.dirs": node.data_dir,
            "zookeeper.connect": self.zookeeper.address,
            "zookeeper.connection.timeout.ms": 30000,
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
            "super.users": f"User:{SUPER_USER}",
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.replica.fetchers": 1,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "listeners": f"CLIENT://{node.host}:{node.client_port},"
                         f"SASL://{node.host}:{node.sasl_port},"
                         f"INTERNAL://{node.host}:{node.internal_port}",
            "advertised.listeners": f"CLIENT://{adv_client},SASL://{node.sasl_address},"
                                    f"INTERNAL://{node.host}:{node.internal_port}",
            "listener.security.protocol.map": "CLIENT:PLAINTEXT,SASL:SASL_PLAINTEXT,"
                                              "INTERNAL:SASL_PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.internal.plain.sasl.jaas.config": self._jaas(True),
            "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl.plain.sasl.jaas.config": self._jaas(True),
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 5,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min(2, rf),
            "transaction.state.log.num.partitions": 5,
            "default.replication.factor": rf,
            "min.insync.replicas": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            "log.flush.offset.checkpoint.interval.ms": 5000,
        }
        p.update(self.overrides)
        return p

    def _properties(self, node):
        if self.zk_mode:
            return self._zk_properties(node)
        rf = min(3, self.n_brokers)
        controllers = [n for n in self.nodes.values() if n.is_controller]
        p = {
            "node.id": node.node_id,
            "process.roles": ",".join(node.roles),
            "log.dirs": node.data_dir,
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.bootstrap.servers": ",".join(
                f"{c.host}:{c.controller_port}" for c in controllers),
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": self._jaas(True),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
            "super.users": f"User:{SUPER_USER}",
            # Two cores shared by many JVMs: few threads everywhere.
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.replica.fetchers": 1,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "controller.quorum.fetch.timeout.ms": 10000,
        }
        if in_test_profile():
            p.update(TEST_PROFILE_PROPERTIES)
        if node.is_broker:
            listeners = [f"CLIENT://{node.host}:{node.client_port}",
                         f"SASL://{node.host}:{node.sasl_port}",
                         f"INTERNAL://{node.host}:{node.internal_port}"]
            adv_client = self.advertise.get(node.node_id, node.address)
            advertised = [f"CLIENT://{adv_client}", f"SASL://{node.sasl_address}",
                          f"INTERNAL://{node.host}:{node.internal_port}"]
            for name, adv in self.extra_listeners.items():
                listeners.append(f"{name}://{node.host}:{node.extra_ports[name]}")
                advertised.append(f"{name}://{adv[node.node_id]}")
            p.update({
                "inter.broker.listener.name": "INTERNAL",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
                "listener.name.internal.plain.sasl.jaas.config": self._jaas(True),
                "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                "listener.name.sasl.plain.sasl.jaas.config": self._jaas(True),
                "listener.name.sasl.scram-sha-256.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "listener.name.sasl.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "offsets.topic.replication.factor": rf,
                "offsets.topic.num.partitions": 5,
                "transaction.state.log.replication.factor": rf,
                "transaction.state.log.min.isr": min(2, rf),
                "transaction.state.log.num.partitions": 5,
                "share.coordinator.state.topic.replication.factor": rf,
                "share.coordinator.state.topic.min.isr": min(2, rf),
                "share.coordinator.state.topic.num.partitions": 3,
                "default.replication.factor": rf,
                "min.insync.replicas": 1,
                "group.initial.rebalance.delay.ms": 0,
                # A member killed by a test (kmirrord's __kmirror-sync lease, KIP-848 consumers) is
                # expired in 10 s rather than 45: the next one in the suite takes its partitions.
                "group.consumer.min.session.timeout.ms": 6000,
                "group.consumer.session.timeout.ms": 10000,
                "auto.create.topics.enable": "true",
                "delete.topic.enable": "true",
                "log.flush.offset.checkpoint.interval.ms": 5000,
            })
        else:
            listeners, advertised = [], []
        if node.is_controller:
            listeners.append(f"CONTROLLER://{node.host}:{node.controller_port}")
            advertised.append(f"CONTROLLER://{node.host}:{node.controller_port}")
        p["listeners"] = ",".join(listeners)
        p["advertised.listeners"] = ",".join(advertised)
        p["listener.security.protocol.map"] = ("CLIENT:PLAINTEXT,SASL:SASL_PLAINTEXT,"
                                               "INTERNAL:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT" +
                                               "".join(f",{n}:PLAINTEXT" for n in self.extra_listeners))
        if node.is_broker and self.kerberos is not None:
            p.update(self._gssapi_properties())
        if node.is_broker and self.oauth is not None:
            p.update(self.oauth.broker_properties())
            p["listener.name.sasl.sasl.enabled.mechanisms"] += ",OAUTHBEARER"
        if node.is_broker:
            p.update(self.overrides)
        return p

    KERBEROS_SERVICE = "kafka"

    @property
    def kerberos_principal(self):
        """The brokers' service principal: the host clients reach them at, never canonicalised."""
        return self.kerberos.principal(f"{self.KERBEROS_SERVICE}/127.0.0.1")

    def _gssapi_properties(self):
        keytab = self.kerberos.keytab(self.kerberos_principal)
        return {
            "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,GSSAPI",
            "listener.name.sasl.gssapi.sasl.jaas.config":
                "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
                f'storeKey=true keyTab="{keytab}" principal="{self.kerberos_principal}";',
            "sasl.kerberos.service.name": self.KERBEROS_SERVICE,
        }

    def gssapi_command_config(self, name, path=None):
        """A Java client properties file that logs in as Kerberos principal name (keytab made by
        the KDC) over the SASL listener."""
        keytab = self.kerberos.keytab(name)
        path = path or os.path.join(self.base_dir, f"client-{name.replace('/', '_')}-gssapi.properties")
        with open(path, "w") as f:
            f.write("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\n"
                    f"sasl.kerberos.service.name={self.KERBEROS_SERVICE}\n"
                    "sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required "
                    f'useKeyTab=true storeKey=true keyTab="{keytab}" '
                    f'principal="{self.kerberos.principal(name)}";\n')
        return path

    def _write_log4j(self, node):
        # Quiet: INFO to the node's file (readiness and post-mortems), nothing on the console.
        path = os.path.join(node.dir, "log4j2.properties")
        with open(path, "w") as f:
            f.write(f"""status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {node.log_path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
logger.kafka_log.name = org.apache.kafka.storage.internals.log
logger.kafka_log.level = WARN
logger.zk.name = org.apache.kafka.clients.NetworkClient
logger.zk.level = WARN
logger.cfg.name = org.apache.kafka.common.config.AbstractConfig
logger.cfg.level = WARN
""")
        return path

    def _write_config(self, node):
        os.makedirs(node.dir, exist_ok=True)
        with open(node.config_path, "w") as f:
            for k, v in self._properties(node).items():
                f.write(f"{k}={v}\n")

    def _format(self, node):
        args = ["format", "-t", self.cluster_id, "-c", node.config_path, "--ignore-formatted"]
        if node.is_controller:
            args.append("--standalone")
            for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                for user, pw in USERS.items():
                    args += ["--add-scram", f"{mech}=[name={user},password={pw}]"]
        r = self.run_tool("storage", *args, timeout=120, check=False)
        if r.returncode != 0:
            raise KafkaError(f"{self.name}: formatting node {node.node_id} failed:\n"
                             f"{r.stdout}{r.stderr}")

    def _tool_log4j(self):
        path = os.path.join(self.base_dir, "tools-log4j2.properties")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("status = error\nappender.err.type = Console\nappender.err.name = ERR\n"
                        "appender.err.target = SYSTEM_ERR\nappender.err.layout.type = PatternLayout\n"
                        "appender.err.layout.pattern = [%d] %p %m (%c)%n\n"
                        # The tool runner swaps System.err for each run: follow it.
                        "appender.err.follow = true\n"
                        "rootLogger.level = WARN\nrootLogger.appenderRef.err.ref = ERR\n")
        return path

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout=180.0, attempts=3):
        """Formats (first time) and starts every node, then waits until all brokers serve metadata.
        If a port was taken meanwhile by someone else, starts over on new ports."""
        if self.attached:
            _install_cleanup()
            with _live_lock:
                _live.add(self)
        self.started = True
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
                break
            except KafkaError as e:
                if "Address already in use" not in str(e) or attempt == attempts - 1:
                    # Keep the logs of a cluster that would not start.
                    self.keep_dir = True
                    self.stop()
                    raise KafkaError(f"{e}\n(logs kept in {self.base_dir})") from None
                self._kill_nodes()
                for node in self.nodes.values():
                    shutil.rmtree(node.dir, ignore_errors=True)
                if self.zookeeper is not None:
                    shutil.rmtree(self.zookeeper.dir, ignore_errors=True)
                self._make_nodes()
                self._formatted = False
            except BaseException:
                self.stop()
                raise
        self._write_state()
        return self

    def _start_once(self, timeout):
        if self.zk_mode and not self.zookeeper.running():
            self.zookeeper.start()
            # ZooKeeper mode has no storage formatting.
            self._formatted = True
            for node in self.nodes.values():
                self._write_config(node)
                self._write_log4j(node)
        if not self._formatted:
            for node in self.nodes.values():
                self._write_config(node)
                self._write_log4j(node)
            # One node after the other, in the tool runner (a fraction of a second each).
            for node in self.nodes.values():
                self._format(node)
            self._formatted = True
        for node in self.nodes.values():
            self._spawn(node)
        self.wait_ready(timeout)
        if any(getattr(n, "records_cds", False) for n in self.nodes.values()):
            cds.make_archive(java_bin(), self.libs, preexec=_set_pdeathsig)

    def _spawn(self, node):
        node.wanted = True
        if node.running():
            return
        cds_opts, node.records_cds = cds.broker_opts(java_bin(), self.libs)
        args = [java_bin()] + self.jvm_opts + cds_opts + [
            f"-Dlog4j2.configurationFile={os.path.join(node.dir, 'log4j2.properties')}",
            f"-Dkafka.logs.dir={node.dir}",
            f"-Dkmirror.cluster={self.name}",
            "-cp", os.path.join(self.libs, "*"), "kafka.Kafka", node.config_path]
        out = open(node.out_path, "ab")
        node.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=node.dir,
            start_new_session=True, preexec_fn=_set_pdeathsig if self.attached else None)
        out.close()
        node.pid = node.proc.pid
        node.started_at = time.monotonic()
        with open(os.path.join(node.dir, "pid"), "w") as f:
            f.write(f"{node.pid}\n")

    def _log_has(self, node, text, paths=None):
        for path in paths or (node.log_path, node.out_path):
            try:
                with open(path, errors="replace") as f:
                    if text in f.read():
                        return True
            except OSError:
                pass
        return False

    def wait_ready(self, timeout=180.0, node_ids=None):
        """Polls until every (given) broker answers Metadata listing all running brokers."""
        deadline = time.monotonic() + timeout
        wanted = [self.nodes[i] for i in (node_ids or self.nodes) if self.nodes[i].wanted]
        while True:
            dead = [n for n in wanted if not n.running()]
            if dead:
                n = dead[0]
                why = ", Address already in use" if (
                    self._log_has(n, "Address already in use") or
                    self._log_has(n, "BindException")) else ""
                raise KafkaError(f"{self.name}: node {n.node_id} exited "
                                 f"(status {n.proc.poll() if n.proc else '?'}{why})\n"
                                 f"{n.log_tail()}")
            expect = {n.node_id for n in self.broker_nodes if n.wanted}
            pending = None
            for n in wanted:
                if not n.is_broker:
                    # A dedicated controller is ready once it logs that it started.
                    if not self._log_has(n, "Kafka Server started"):
                        pending = (n, "not started")
                        break
                    continue
                try:
                    brokers, _ = metadata_brokers(n.host, n.client_port, timeout=2.0)
                except (OSError, struct.error) as e:
                    pending = (n, f"metadata: {e}")
                    break
                if set(brokers) != expect:
                    pending = (n, f"sees brokers {sorted(brokers)}, want {sorted(expect)}")
                    break
            if pending is None:
                return
            if time.monotonic() > deadline:
                n, why = pending
                raise KafkaError(f"{self.name}: node {n.node_id} not ready after {timeout:.0f}s "
                                 f"({why})\n{n.log_tail()}")
            time.sleep(0.25)

    def stop_broker(self, node_id, kill=False, timeout=30.0):
        """Stops one node (SIGTERM, or SIGKILL with kill=True); its data stays for start_broker."""
        node = self.nodes[node_id]
        node.wanted = False
        if node.pid is None:
            return
        if kill:
            try:
                os.kill(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if node.proc:
                node.proc.wait()
        else:
            kill_pid(node.pid, node.config_path, timeout)
            if node.proc:
                try:
                    node.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        node.proc = None
        node.pid = None

    def start_broker(self, node_id, timeout=120.0):
        """Restarts a node stopped by stop_broker and waits until the cluster sees it again."""
        node = self.nodes[node_id]
        self._spawn(node)
        self.wait_ready(timeout)

    def _kill_nodes(self):
        order = sorted(self.nodes.values(), key=lambda n: n.is_controller and not n.is_broker)
        for node in order:
            node.wanted = False
        # SIGTERM all brokers at once, then wait: a clean shutdown takes a few seconds each.
        for node in order:
            if node.pid is not None and node.running() and not (
                    node.is_controller and not node.is_broker):
                try:
                    os.kill(node.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for node in order:
            if node.pid is not None:
                kill_pid(node.pid, node.config_path, timeout=20.0)
                if node.proc:
                    try:
                        node.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                node.proc = None
                node.pid = None
        # ZooKeeper mode: the brokers are down, now their ZooKeeper.
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def stop(self):
        """Stops every node (brokers first, then the controller) and removes the data unless kept."""
        self._kill_nodes()
        with _live_lock:
            _live.discard(self)
        if self.started and self._own_dir and not self.keep_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        self.started = False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- state file (for the shell entry point) --------------------------------------------------

    def state(self):
        return {
            "name": self.name, "base_dir": self.base_dir, "cluster_id": self.cluster_id,
            "bootstrap": self.bootstrap, "sasl_bootstrap": self.sasl_bootstrap,
            "brokers": {str(k): v for k, v in self.broker_addresses.items()},
            "nodes": {str(n.node_id): {"pid": n.pid, "config": n.config_path, "log": n.log_path,
                                       "roles": list(n.roles)} for n in self.nodes.values()},
            "libs": self.libs,
            "zookeeper": ({"address": self.zookeeper.address, "pid": self.zookeeper.pid,
                           "config": self.zookeeper.config_path} if self.zookeeper else None),
        }

    def _write_state(self):
        with open(os.path.join(self.base_dir, "cluster.json"), "w") as f:
            json.dump(self.state(), f, indent=1)

    # -- tools ---------------------------------------------------------------------------------

    def run_tool(self, tool, *args, input=None, timeout=180, check=True, env=None,
                 jvm_opts=None, classpath=()):
        """Runs a Kafka Java tool (short name from TOOLS or a main class) and returns the
        CompletedProcess (text). Raises KafkaError with its output when check and it fails.
        jvm_opts replaces the quick-start defaults (e.g. a full JIT for perf tools in benchmarks);
        classpath entries come before the Kafka jars (e.g. a test's own compiled classes)."""
        main = tool_class(tool, self.version)
        r = None
        if jvm_opts is None and not classpath and env is None:
            r = tool_runner.run(java_bin(), self.libs, main, args, stdin=input, timeout=timeout,
                                jvm_opts=RUNNER_JVM_OPTS, log4j=self._tool_log4j(),
                                preexec=_set_pdeathsig)
        if r is None:  # a JVM of its own
            cmd = [java_bin()] + list(TOOL_JVM_OPTS if jvm_opts is None else jvm_opts) + [
                "-Dlog4j2.configurationFile=" + self._tool_log4j(),
                "-cp", os.pathsep.join(list(classpath) + [os.path.join(self.libs, "*")]),
                main] + [str(a) for a in args]
            r = subprocess.run(cmd, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=timeout, env=env)
        if check and r.returncode != 0:
            raise KafkaError(f"{tool} {' '.join(map(str, args))} exited {r.returncode}\n"
                             f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")
        return r

    def popen_tool(self, tool, *args, **popen_kw):
        """A Kafka Java tool left running (subprocess.Popen, text): clients that must live through
        something, as run_tool's with the quick-start JVM options."""
        cmd = [java_bin()] + list(TOOL_JVM_OPTS) + [
            "-Dlog4j2.configurationFile=" + self._tool_log4j(),
            "-cp", os.path.join(self.libs, "*"), tool_class(tool, self.version)] + [str(a) for a in args]
        return subprocess.Popen(cmd, text=True, **popen_kw)

    def tool(self, tool, *args, admin=False, **kw):
        """run_tool with --bootstrap-server added (and --command-config for the super user)."""
        extra = ["--bootstrap-server", self.sasl_bootstrap if admin else self.bootstrap]
        if admin:
            extra += ["--command-config", self.command_config()]
        return self.run_tool(tool, *extra, *args, **kw)

    def consumer_perf_test(self, topic, records, bootstrap=None, timeout_ms=60000):
        """Runs consumer-perf-test for records records (against bootstrap, default the cluster)
        and returns its summary as {column: text}: data.consumed.in.nMsg, data.consumed.in.MB, ..."""
        # Kafka 4.2 renamed --messages to --num-records (the old name prints a warning).
        count_opt = "--num-records" if self.version >= (4, 2) else "--messages"
        out = self.run_tool("consumer-perf-test", "--bootstrap-server", bootstrap or self.bootstrap,
                            "--topic", topic, count_opt, records, "--timeout", timeout_ms
                            ).stdout.strip().splitlines()
        # A CSV header (start.time, end.time, data.consumed.in.MB, ...) and one summary line.
        if len(out) != 2 or not out[0].startswith("start.time"):
            raise KafkaError("consumer-perf-test printed more or less than its summary:\n" +
                             "\n".join(out))
        return dict(zip((c.strip() for c in out[0].split(",")),
                        (v.strip() for v in out[1].split(","))))

    def create_topic(self, topic, partitions=1, replication_factor=None, config=None):
        rf = replication_factor or min(3, self.n_brokers)
        args = ["--create", "--topic", topic, "--partitions", partitions,
                "--replication-factor", rf]
        for k, v in (config or {}).items():
            args += ["--config", f"{k}={v}"]
        self.tool("topics", *args)
        self.wait_topic(topic, partitions)

    def wait_topic(self, topic, partitions, timeout=60.0):
        """Polls until every broker's metadata lists the topic's partitions with leaders."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.tool("topics", "--describe", "--topic", topic, check=False)
            leaders = [ln for ln in r.stdout.splitlines()
                       if "Partition:" in ln and "Leader: none" not in ln and "Leader: -1" not in ln]
            if r.returncode == 0 and len(leaders) >= partitions:
                return r.stdout
            if time.monotonic() > deadline:
                raise KafkaError(f"topic {topic} not ready: {r.stdout}{r.stderr}")
            time.sleep(0.2)

    # -- data on disk --------------------------------------------------------------------------

    def partition_dirs(self, topic, partition):
        """The partition's log directories on every node that holds a replica."""
        out = []
        for n in self.broker_nodes:
            d = os.path.join(n.data_dir, f"{topic}-{partition}")
            if os.path.isdir(d):
                out.append(d)
        return out

    def segment_batches(self, topic, partition):
        """Batch headers of the partition's first segment on its first replica."""
        dirs = self.partition_dirs(topic, partition)
        if not dirs:
            raise KafkaError(f"no replica of {topic}-{partition} on disk")
        segs = sorted(f for f in os.listdir(dirs[0]) if f.endswith(".log"))
        out = []
        for s in segs:
            out.extend(read_batches(os.path.join(dirs[0], s)))
        return out

    def __repr__(self):
        return f"KafkaCluster({self.name}, brokers={self.n_brokers}, bootstrap={self.bootstrap})"


def stop_from_state(base_dir, timeout=20.0):
    """Stops a detached cluster started elsewhere, from its cluster.json; returns pids stopped."""
    with open(os.path.join(base_dir, "cluster.json")) as f:
        st = json.load(f)
    stopped = []
    nodes = sorted(st["nodes"].values(), key=lambda n: n["roles"] == ["controller"])
    for n in nodes:
        if n["pid"] and _pid_alive(n["pid"]) and n["config"] in _pid_cmdline(n["pid"]):
            os.kill(n["pid"], signal.SIGTERM)
    for n in nodes:
        if n["pid"] and kill_pid(n["pid"], n["config"], timeout):
            stopped.append(n["pid"])
    zk = st.get("zookeeper")
    if zk and zk["pid"] and kill_pid(zk["pid"], zk["config"], timeout):
        stopped.append(zk["pid"])
    return stopped
