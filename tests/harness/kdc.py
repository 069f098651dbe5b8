"""An MIT Kerberos KDC for kmirror's tests: a fresh realm in a temporary directory, on a free
loopback port, run as the calling user. Nothing of the system's configuration is read or changed:
every tool and client is pointed at the realm's own files by KRB5_CONFIG, KRB5_KDC_PROFILE and
KRB5CCNAME (Java by -Djava.security.krb5.conf).

    kdc = Kdc().start()
    keytab = kdc.keytab("kmirrord")            # a principal with a random key, and its keytab
    env = kdc.env()                            # for kmirrord, the CLI, kinit, kcat
    kdc.stop()

Host-based principals are written as the client names the host, never canonicalised: the realm's
krb5.conf sets rdns = false and dns_canonicalize_hostname = false, so a broker reached at
127.0.0.1 is kafka/127.0.0.1@REALM for every client.
"""

import os
import shutil
import subprocess
import tempfile
import threading
import time

from .kafka_cluster import KafkaError, _install_cleanup, _live, _live_lock, _set_pdeathsig, free_port

KDC_BINARIES = ("krb5kdc", "kdb5_util", "kadmin.local", "kinit", "klist")
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def _which(name):
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return None


def available():
    """None when the KDC's tools are installed, else what is missing (scripts/install-deps.sh)."""
    missing = [b for b in KDC_BINARIES if not _which(b)]
    return f"missing {', '.join(missing)} (scripts/install-deps.sh installs MIT Kerberos)" if missing else None


class Kdc:
    """One realm: its database, its KDC process and its principals' keytabs under base_dir."""

    def __init__(self, realm="KMIRROR.TEST", base_dir=None, ticket_lifetime="1h"):
        self.realm = realm
        self.ticket_lifetime = ticket_lifetime
        self._own_dir = base_dir is None
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="kmirror-kdc-")
        self.krb5_conf = os.path.join(self.base_dir, "krb5.conf")
        self.kdc_conf = os.path.join(self.base_dir, "kdc.conf")
        self.log_path = os.path.join(self.base_dir, "kdc.log")
        self.port = None
        self.proc = None
        self._keytabs = {}
        self._lock = threading.Lock()

    # -- configuration -------------------------------------------------------------------------

    def _write_configs(self):
        d = self.base_dir
        with open(self.krb5_conf, "w") as f:
            f.write(f"""[libdefaults]
    default_realm = {self.realm}
    dns_lookup_kdc = false
    dns_lookup_realm = false
    rdns = false
    dns_canonicalize_hostname = false
    udp_preference_limit = 1
    ticket_lifetime = {self.ticket_lifetime}
    forwardable = false
    default_ccache_name = FILE:{d}/ccache-default

[realms]
    {self.realm} = {{
        kdc = 127.0.0.1:{self.port}
    }}

[domain_realm]
    localhost = {self.realm}
""")
        with open(self.kdc_conf, "w") as f:
            f.write(f"""[kdcdefaults]
    kdc_ports = {self.port}
    kdc_tcp_ports = {self.port}

[realms]
    {self.realm} = {{
        database_name = {d}/principal
        key_stash_file = {d}/stash
        acl_file = {d}/kadm5.acl
        max_life = {self.ticket_lifetime}
        max_renewable_life = 0
        supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal
    }}

[logging]
    kdc = FILE:{self.log_path}
    default = FILE:{self.log_path}
""")
        with open(os.path.join(d, "kadm5.acl"), "w") as f:
            f.write("")

    def env(self, ccache=None):
        """Environment for a Kerberos client of this realm (KRB5CCNAME: its own file cache)."""
        e = {"KRB5_CONFIG": self.krb5_conf, "KRB5_KDC_PROFILE": self.kdc_conf,
             "KRB5CCNAME": ccache or f"FILE:{self.base_dir}/ccache-default"}
        return e

    def _run(self, *argv, input=None, timeout=60):
        env = dict(os.environ, **self.env())
        r = subprocess.run([_which(argv[0]) or argv[0], *argv[1:]], input=input, env=env,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise KafkaError(f"kdc: {' '.join(argv)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        return r

    @property
    def java_opts(self):
        """JVM options that make Java's Kerberos use this realm."""
        return [f"-Djava.security.krb5.conf={self.krb5_conf}"]

    def principal(self, name):
        """name@REALM (name unchanged when it has a realm already)."""
        return name if "@" in name else f"{name}@{self.realm}"

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout=30.0, attempts=3):
        why = available()
        if why:
            raise KafkaError(f"kdc: {why}")
        _install_cleanup()
        for attempt in range(attempts):
            self.port = free_port()
            self._write_configs()
            if not os.path.exists(os.path.join(self.base_dir, "principal")):
                self._run("kdb5_util", "create", "-s", "-r", self.realm, "-P", "kmirror-kdc-master")
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(
                [_which("krb5kdc"), "-n", "-r", self.realm], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=dict(os.environ, **self.env()),
                start_new_session=True, preexec_fn=_set_pdeathsig)
            log.close()
            with _live_lock:
                _live.add(self)
            if self._wait_listening(timeout):
                return self
            status = self.proc.poll()
            self.stop(remove=False)
            if attempt == attempts - 1:
                raise KafkaError(f"kdc: krb5kdc did not listen on 127.0.0.1:{self.port} "
                                 f"(exit status {status})\n{self.log_tail()}")
        return self

    def _wait_listening(self, timeout):
        import socket
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, remove=None):
        """Stops the KDC (SIGTERM, then SIGKILL) and removes its directory unless asked not to
        (KM_KEEP_KAFKA_DIRS=1 keeps it, like the clusters')."""
        with _live_lock:
            _live.discard(self)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if remove is None:
            remove = self._own_dir and os.environ.get("KM_KEEP_KAFKA_DIRS") != "1"
        if remove:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no KDC log)"

    # -- principals ----------------------------------------------------------------------------

    def keytab(self, name, path=None):
        """Creates principal name (random key) the first time and returns the path of a keytab
        holding its key; later calls return the same keytab (a new key would make older keytabs,
        and the tickets issued with them, stale). Mode 0600."""
        principal = self.principal(name)
        with self._lock:
            if principal in self._keytabs:
                kt = self._keytabs[principal]
                if path and path != kt:
                    shutil.copyfile(kt, path)
                    os.chmod(path, 0o600)
                    return path
                return kt
            kt = path or os.path.join(self.base_dir,
                                      principal.replace("/", "_").replace("@", "_") + ".keytab")
            self._run("kadmin.local", "-r", self.realm, "-q", f"addprinc -randkey {principal}")
            self._run("kadmin.local", "-r", self.realm, "-q", f"ktadd -k {kt} -norandkey {principal}")
            os.chmod(kt, 0o600)
            self._keytabs[principal] = kt
            return kt

    def set_max_life(self, name, life):
        """The longest ticket the KDC issues to (or for) principal name, e.g. "30 seconds"."""
        self._run("kadmin.local", "-r", self.realm, "-q",
                  f'modprinc -maxlife "{life}" {self.principal(name)}')

    def kinit(self, name, ccache):
        """Tickets for name from its keytab into ccache (a "FILE:..." name)."""
        self._run("kinit", "-k", "-t", self.keytab(name), "-c", ccache, self.principal(name))
        return ccache

    def klist(self, ccache):
        return self._run("klist", "-c", ccache).stdout


__all__ = ["Kdc", "available"]
