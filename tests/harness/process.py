"""Runs a daemon under test (kmirrord) for integration tests: started with its output in a file,
ready when its port accepts, stopped by pid, its stderr scanned for sanitizer reports."""

import os
import re
import signal
import socket
import subprocess
import time

from .kafka_cluster import KafkaError, _install_cleanup, _live, _live_lock, _set_pdeathsig

# What AddressSanitizer, LeakSanitizer, UndefinedBehaviorSanitizer and ThreadSanitizer print.
SANITIZER_RE = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error: |"
                          r"WARNING: ThreadSanitizer|SUMMARY: (Address|Undefined|Thread|Leak)")


def wait_port(host, port, timeout=30.0, proc=None):
    """Polls until host:port accepts a connection; fails early if proc exits."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


class Daemon:
    """One process: argv, output to <log_dir>/<name>.log (stdout and stderr together)."""

    def __init__(self, argv, name, log_dir, env=None, cwd=None):
        self.argv = [str(a) for a in argv]
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.env = dict(os.environ, **(env or {}))
        # Sanitizer reports must not be lost to an early exit, and must be in the log.
        self.env.setdefault("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1")
        self.env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        self.cwd = cwd
        self.proc = None
        os.makedirs(log_dir, exist_ok=True)

    def start(self, port=None, host="127.0.0.1", timeout=30.0):
        """Starts the process; with port, waits until it accepts connections there."""
        _install_cleanup()
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                     start_new_session=True, preexec_fn=_set_pdeathsig)
        out.close()
        with _live_lock:
            _live.add(self)
        if port is not None and not wait_port(host, port, timeout, self.proc):
            status = self.proc.poll()
            self.stop()
            raise KafkaError(f"{self.name} did not listen on {host}:{port} "
                             f"(exit status {status})\n{self.tail()}")
        return self

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        if self.running():
            self.proc.send_signal(sig)

    def stop(self, timeout=15.0):
        """SIGTERM, SIGKILL after timeout; returns the exit status (negative: killed by signal)."""
        with _live_lock:
            _live.discard(self)
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def output(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, lines=40):
        return "".join(self.output().splitlines(True)[-lines:])

    def sanitizer_reports(self):
        """Lines of the output where a sanitizer reported something."""
        return [ln for ln in self.output().splitlines() if SANITIZER_RE.search(ln)]

    def __repr__(self):
        return f"Daemon({self.name}, pid={self.pid})"


__all__ = ["Daemon", "wait_port", "SANITIZER_RE"]
