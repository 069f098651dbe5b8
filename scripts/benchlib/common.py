"""What the sections of scripts/bench share: the earlier benchmark scripts loaded as modules (bp:
scripts/bench-proxy, bm: scripts/bench-mirror, mm2: scripts/bench-mm2) and the run's context."""

import importlib.machinery
import importlib.util
import os
import shlex
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))


def _load(name):
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), os.path.join(REPO, "scripts", name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


mm2 = _load("bench-mm2")
bm = mm2.bm
bp = mm2.bp


class Ctx:
    """One run of the suite: quick or full, where it writes, the binaries, and the commands each
    section ran (each number in the report names the command it came from)."""

    def __init__(self, quick, out, kmirrord, before=None):
        self.quick = quick
        self.out = out
        self.kmirrord = kmirrord
        self.before = before  # an earlier kmirrord the sections that compare run too (--before)
        self.kmirror = os.path.join(os.path.dirname(kmirrord), "kmirror")
        self.commands = {}
        self.t0 = time.monotonic()

    def log(self, section, *msg):
        print(f"[{time.monotonic() - self.t0:7.1f} s] {section}:", *msg, flush=True)

    def command(self, section, what, argv):
        """Records a command as run (argv: a list), for the report; returns it as one string."""
        text = " ".join(shlex.quote(str(x)) for x in argv)
        self.commands.setdefault(section, []).append((what, text))
        return text

    def png(self, name):
        """Where a section writes its plot (the report links it by file name)."""
        return os.path.join(self.out, name)


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display on a build machine)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def md_table(head, rows):
    """A markdown table: head a list of column titles (a leading ':' right-aligns), rows lists."""
    out = ["| " + " | ".join(h.lstrip(":") for h in head) + " |",
           "|" + "|".join(" ---: " if h.startswith(":") else " --- " for h in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
