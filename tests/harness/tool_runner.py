"""Runs Kafka's Java tools inside one long-lived JVM per Kafka release (ToolRunner.java beside this
file), so a tool run costs its own work, not a JVM start (2 to 4 s each on two cores).

`run(libs, main, args, input, timeout)` returns a subprocess.CompletedProcess like subprocess.run
with text=True, or None when the runner cannot take the call (it is busy with another thread's
run, or could not start): the caller then starts a JVM of its own. A run that outlasts its
timeout kills the runner (the next call starts a new one) and raises subprocess.TimeoutExpired,
as subprocess.run does. A run that leaves threads alive behind it (a client it did not close)
retires its runner, so nothing of one run can reach the next. KM_TOOL_RUNNER=0 turns it off.
"""

import hashlib
import os
import struct
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "ToolRunner.java")
MAGIC = 0x4B4D5452

_runners = {}
_runners_lock = threading.Lock()
stats = {"runs": 0, "fallbacks": 0, "starts": 0, "retired": 0, "seconds": 0.0}


def enabled():
    return os.environ.get("KM_TOOL_RUNNER", "1") != "0"


def _javac(java):
    javac = os.path.join(os.path.dirname(os.path.realpath(java)), "javac")
    return javac if os.access(javac, os.X_OK) else None


def _compiled(java, libs):
    """Directory holding ToolRunner.class for this source, compiled once (beside the jars)."""
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    out = os.path.join(os.path.dirname(os.path.abspath(libs)), f"toolrunner-{digest}")
    if os.path.exists(os.path.join(out, "ToolRunner.class")):
        return out
    javac = _javac(java)
    if javac is None:
        return None
    tmp = f"{out}.tmp-{os.getpid()}-{threading.get_ident()}"
    os.makedirs(tmp, exist_ok=True)
    r = subprocess.run([javac, "-nowarn", "-d", tmp, SOURCE], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE} failed:\n{r.stdout}")
    try:
        os.rename(tmp, out)  # atomic: another worker may have won the race, which is as good
    except OSError:
        pass
    return out


class Runner:
    """One JVM running tools for one classpath (a release's jars)."""

    def __init__(self, java, libs, jvm_opts, log4j, log_path, preexec):
        self.java, self.libs, self.log_path = java, libs, log_path
        self.lock = threading.Lock()
        cp = _compiled(java, libs)
        if cp is None:
            raise RuntimeError("no javac next to java")
        cmd = [java] + list(jvm_opts) + [
            "-Djava.security.manager=allow", "--add-opens", "java.base/java.lang=ALL-UNNAMED",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp", os.pathsep.join([cp, os.path.join(libs, "*")]), "ToolRunner"]
        self.err = open(log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, start_new_session=True, preexec_fn=preexec)
        stats["starts"] += 1
        if self._read_int() != MAGIC:
            self.close()
            raise RuntimeError(f"the tool runner did not start (log: {log_path})")

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.proc.stdout.read(n - len(buf))
            if not chunk:
                raise EOFError("the tool runner exited")
            buf += chunk
        return buf

    def _read_int(self):
        return struct.unpack(">i", self._read(4))[0]

    def alive(self):
        return self.proc.poll() is None

    def call(self, main, args, stdin, timeout):
        """(status, stdout, stderr, leaked threads); kills the runner on timeout."""
        frame = b""
        strings = [main, stdin or ""] + [str(a) for a in args]
        for s in strings:
            b = s.encode()
            frame += struct.pack(">i", len(b)) + b
        self.proc.stdin.write(struct.pack(">i", len(strings)) + frame)
        self.proc.stdin.flush()
        result = {}

        def read():
            try:
                status = self._read_int()
                out = self._read(self._read_int())
                err = self._read(self._read_int())
                result["r"] = (status, out.decode(errors="replace"),
                               err.decode(errors="replace"), self._read_int())
            except (EOFError, OSError, ValueError) as e:
                result["e"] = e
        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            self.close()
            t.join(5)
            raise subprocess.TimeoutExpired([main] + list(args), timeout)
        if "e" in result:
            self.close()
            raise RuntimeError(f"the tool runner died running {main} (log: {self.log_path}): "
                               f"{result['e']}")
        return result["r"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.err.close()


def run(java, libs, main, args, stdin=None, timeout=180, jvm_opts=(), log4j=None,
        log_dir=None, preexec=None):
    """The tool's CompletedProcess, or None if the caller must start a JVM of its own."""
    if not enabled():
        return None
    key = (java, os.path.abspath(libs))
    with _runners_lock:
        runner = _runners.get(key)
        if runner is not None and not runner.alive():
            runner = None
        if runner is None:
            try:
                runner = Runner(java, libs, jvm_opts, log4j,
                                os.path.join(log_dir or "/tmp", f"toolrunner-{os.getpid()}.log"),
                                preexec)
            except (OSError, RuntimeError, EOFError):
                stats["fallbacks"] += 1
                return None
            _runners[key] = runner
    if not runner.lock.acquire(blocking=False):
        stats["fallbacks"] += 1  # another thread's run is in there: a JVM of its own
        return None
    t0 = time.monotonic()
    try:
        status, out, err, leaked = runner.call(main, args, stdin, timeout)
        if leaked:
            with _runners_lock:
                if _runners.get(key) is runner:
                    del _runners[key]
            stats["retired"] += 1
            runner.close()
    finally:
        runner.lock.release()
        stats["runs"] += 1
        stats["seconds"] += time.monotonic() - t0
    return subprocess.CompletedProcess([main] + [str(a) for a in args], status, out, err)


def close_all():
    with _runners_lock:
        runners = list(_runners.values())
        _runners.clear()
    for r in runners:
        r.close()
