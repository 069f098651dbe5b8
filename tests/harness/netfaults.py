"""Network faults on loopback for the soak and the tests: packet filters (nftables) on the ports of
listeners that only kmirrord uses (a broker's extra listener of its own, KafkaCluster's
extra_listeners). A cut touches nothing else: only `oif lo`, only those ports, in a table of the
caller's own, named after its process so that a table left by a killed run is swept by the next."""
import os
import re
import shutil
import subprocess

PREFIX = "kmfault"


class NetFaults:
    def __init__(self, tag):
        self.table = f"{PREFIX}_{os.getpid()}_{tag}"
        self.ready = False

    @staticmethod
    def available():
        return bool(shutil.which("nft")) and os.geteuid() == 0

    @staticmethod
    def _nft(script):
        r = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"nft: {r.stderr.strip()[:300]}")

    @classmethod
    def sweep(cls):
        """Deletes the tables of processes that are gone (a run killed before its teardown)."""
        r = subprocess.run(["nft", "list", "tables"], text=True, capture_output=True, timeout=30)
        for m in re.finditer(rf"^table inet ({PREFIX}_(\d+)_\w+)$", r.stdout, re.M):
            pid = int(m.group(2))
            try:
                os.kill(pid, 0)
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            cls._nft(f"delete table inet {m.group(1)}\n")

    def setup(self):
        self.sweep()
        self._nft(f"add table inet {self.table}\n"
                  f"add chain inet {self.table} out {{ type filter hook output priority 0; policy accept; }}\n")
        self.ready = True

    def cut(self, ports, reset):
        """Both directions of every connection to these loopback ports: dropped (a silent
        link), or refused with a TCP reset."""
        verdict = "reject with tcp reset" if reset else "drop"
        ps = ", ".join(str(p) for p in sorted(ports))
        self._nft(f"add rule inet {self.table} out oif lo tcp dport {{ {ps} }} {verdict}\n"
                  f"add rule inet {self.table} out oif lo tcp sport {{ {ps} }} {verdict}\n")

    def degrade(self, ports, loss_pct, kbytes_s):
        """A lossy and / or slow link on these ports, both directions: loss_pct % of the packets
        dropped at random, and / or what passes over kbytes_s KB a second dropped (a policer,
        which TCP answers by slowing down). The kernel here has no netem: no added delay but
        what the losses' retransmissions make."""
        ps = ", ".join(str(p) for p in sorted(ports))
        rules = []
        for d in ("dport", "sport"):
            if loss_pct:
                rules.append(f"add rule inet {self.table} out oif lo tcp {d} {{ {ps} }} "
                             f"numgen random mod 100 < {loss_pct} drop\n")
            if kbytes_s:
                rules.append(f"add rule inet {self.table} out oif lo tcp {d} {{ {ps} }} "
                             f"limit rate over {kbytes_s} kbytes/second drop\n")
        self._nft("".join(rules))

    def heal(self):
        self._nft(f"flush chain inet {self.table} out\n")

    def teardown(self):
        if self.ready:
            self._nft(f"delete table inet {self.table}\n")
            self.ready = False
