"""The kmirror CLI as the integration tests run it: finding the binary, running a command against one
bootstrap address with its exit code checked, and reading mirror states from describe's JSON."""

import json
import os
import subprocess

import pytest

from conftest import find_kmirrord
from proxy_fixtures import wait_until


def find_kmirror():
    """The kmirror binary next to the kmirrord the suite uses (or $KMIRROR)."""
    env = os.environ.get("KMIRROR")
    if env:
        return env
    d = find_kmirrord()
    if d:
        p = os.path.join(os.path.dirname(d), "kmirror")
        if os.access(p, os.X_OK):
            return p
    return None


@pytest.fixture(scope="session")
def kmirror_bin():
    p = find_kmirror()
    if not p:
        pytest.skip("kmirror not built (set KMIRROR or KM_BUILD_DIR)")
    return p


class Cli:
    """Runs kmirror against one bootstrap address and checks its exit code."""

    def __init__(self, binary, bootstrap):
        self.binary = binary
        self.bootstrap = bootstrap

    def run(self, *args, expect=0, output=None, bootstrap=None, timeout=60):
        argv = [self.binary, "--bootstrap-server", bootstrap or self.bootstrap, "--timeout-ms", "20000"]
        if output:
            argv += ["--output", output]
        argv += [str(a) for a in args]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        if expect is not None:
            assert r.returncode == expect, (f"{' '.join(argv)}: exit {r.returncode}, wanted {expect}\n"
                                            f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        return r

    def json(self, *args, expect=0):
        """The one JSON document the command prints (and its CompletedProcess)."""
        r = self.run(*args, expect=expect, output="json")
        lines = r.stdout.splitlines()
        assert len(lines) == 1, f"expected one JSON line, got:\n{r.stdout}"
        return json.loads(lines[0]), r

    def refused(self, code_name, *args, json_too=True):
        """The command exits 1 with one stderr line naming code_name; returns that line (and the
        JSON document's per-topic or top-level error when json_too)."""
        r = self.run(*args, expect=1)
        err = r.stderr.strip().splitlines()
        assert len(err) == 1, f"expected one line on stderr:\n{r.stderr}"
        assert code_name in err[0], err[0]
        doc = None
        if json_too:
            doc, _ = self.json(*args, expect=1)
        return err[0], r.stdout, doc


def described(cli, mirror):
    doc, _ = cli.json("describe", "--mirror", mirror)
    assert len(doc["mirrors"]) == 1 and doc["mirrors"][0]["name"] == mirror, doc
    return doc["mirrors"][0]


def topic_states(cli, mirror):
    """{topic: [partition states in partition order]} from describe --output json."""
    m = described(cli, mirror)
    return {t["name"]: [p["state"] for p in sorted(t["partitions"], key=lambda p: p["partition"])]
            for t in m["topics"]}


def wait_states(cli, mirror, want, timeout=30):
    """Polls describe until every topic in want has all its partitions in the wanted state."""
    def ok():
        st = topic_states(cli, mirror)
        return all(t in st and st[t] and all(s == want[t] for s in st[t]) for t in want) and st
    return wait_until(ok, timeout, 0.2, what=f"{mirror} states {want}")
