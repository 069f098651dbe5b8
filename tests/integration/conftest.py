"""Fixtures of the integration suite: real Kafka clusters (session-scoped, started on first use,
stopped at session end or on interruption) and the kmirrord binary for proxy tests."""

import os
import shutil
import sys
import uuid

import pytest

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS_DIR)
sys.path.insert(0, TESTS_DIR)

# Brokers tuned for many short tests on two cores (harness.kafka_cluster.in_test_profile).
os.environ.setdefault("KM_BROKER_PROFILE", "test")

from harness import Daemon, KafkaCluster  # noqa: E402

# pytest-xdist, when installed, runs the suite on several workers (`-n 2`) with the suite's own
# scheduler (worker_sched.py: whole modules, longest first, the leak scan last on every worker).
try:
    import xdist  # noqa: F401
    pytest_plugins = ["worker_sched"]
except ImportError:
    pass


from proxy_fixtures import proxy_capture  # noqa: E402,F401  (for the fixture below)


@pytest.fixture(scope="session", autouse=True)
def _capture_from_the_start(request):
    """When the leak scan is among the tests, its capture runs from the session's (the worker's)
    start, so it sees every proxy of the session whichever module comes first."""
    if any(os.path.basename(item.nodeid.split("::", 1)[0]) == "test_proxy_zz_leaks.py"
           for item in request.session.items):
        request.getfixturevalue("proxy_capture")


def pytest_generate_tests(metafunc):
    """A test asking for `per_worker` runs once per worker, as that worker's (worker_sched.py);
    in a serial run once, as "main"."""
    if "per_worker" in metafunc.fixturenames:
        n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
        ids = [f"gw{i}" for i in range(n)] or ["main"]
        metafunc.parametrize("per_worker", ids, ids=ids)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="the issue's full sizes (KM_LONG=1): 1,000,000 records, 10 kills")


def pytest_configure(config):
    if config.getoption("--long"):
        os.environ["KM_LONG"] = "1"  # read by test modules at import (mirror_data.long_run)


def _cluster(name, brokers):
    cluster = KafkaCluster(name, brokers=brokers)
    cluster.start()
    return cluster


@pytest.fixture(scope="session")
def source_cluster():
    """Single-node KRaft cluster playing the mirror source."""
    c = _cluster("source", 1)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def dest_cluster():
    """Single-node KRaft cluster playing the destination."""
    c = _cluster("dest", 1)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def dest_cluster3():
    """Destination with a dedicated controller and three brokers (ids 1, 2, 3)."""
    c = _cluster("dest3", 3)
    yield c
    c.stop()


# Old releases playing the mirror source (the proposal promises any Kafka from 2.1): the newest
# 3.9.x (KRaft) and 2.8.x (ZooKeeper) that Maven Central serves, fetched into the jar cache on
# first use; KM_OLD_SOURCE_39 / KM_OLD_SOURCE_28 pick another patch release.
OLD_SOURCES = {"3.9": os.environ.get("KM_OLD_SOURCE_39", "3.9.2"),
               "2.8": os.environ.get("KM_OLD_SOURCE_28", "2.8.2")}


@pytest.fixture(scope="session")
def source_cluster_39():
    """Single-node KRaft source cluster on Kafka 3.9.x."""
    c = KafkaCluster("source39", brokers=1, release=OLD_SOURCES["3.9"])
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def source_cluster_28():
    """Single-broker source cluster on Kafka 2.8.x with its ZooKeeper server."""
    c = KafkaCluster("source28", brokers=1, release=OLD_SOURCES["2.8"])
    c.start()
    yield c
    c.stop()


@pytest.fixture(params=["dest_cluster", "dest_cluster3"], ids=["1broker", "3brokers"])
def cluster(request):
    """Runs a test once on the single-node and once on the three-broker cluster (the latter on the
    pom's release only: mirror_data.ON_MAIN_RELEASE)."""
    from mirror_data import skip_3brokers_off_main_release
    if request.param == "dest_cluster3":
        skip_3brokers_off_main_release()
    return request.getfixturevalue(request.param)


@pytest.fixture
def topic_name(request):
    """A topic name unique to the test (and its parameters)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60].strip("-")
    return f"{base}-{uuid.uuid4().hex[:6]}"


def find_kmirrord():
    """Path of the kmirrord binary: $KMIRRORD, $KM_BUILD_DIR, the source tree, or build*/ dirs."""
    env = os.environ.get("KMIRRORD")
    if env:
        return env if os.access(env, os.X_OK) else None
    candidates = []
    if os.environ.get("KM_BUILD_DIR"):
        candidates.append(os.path.join(os.environ["KM_BUILD_DIR"], "kmirrord"))
    candidates.append(os.path.join(REPO, "kmirrord"))
    for parent in (REPO, os.path.dirname(REPO)):
        try:
            names = sorted(os.listdir(parent))
        except OSError:
            continue
        candidates += [os.path.join(parent, d, "kmirrord") for d in names if d.startswith("build")]
    found = [p for p in candidates if os.path.isfile(p) and os.access(p, os.X_OK)]
    if not found:
        return shutil.which("kmirrord")
    return max(found, key=os.path.getmtime)  # the freshest build


@pytest.fixture(scope="session")
def kmirrord_bin():
    path = find_kmirrord()
    if not path:
        pytest.skip("kmirrord not built (set KMIRRORD or KM_BUILD_DIR)")
    return path


@pytest.fixture
def daemons(tmp_path):
    """Starts daemons for one test: start(argv, name=..., port=...) -> harness.Daemon. At the end
    of the test they are stopped, and any sanitizer report in their output fails the test."""
    started = []

    def start(argv, name="kmirrord", port=None, env=None, timeout=30.0):
        d = Daemon(argv, name, str(tmp_path), env=env)
        started.append(d)
        return d.start(port=port, timeout=timeout)

    yield start
    reports = []
    for d in started:
        d.stop()
        reports += [f"{d.name}: {ln}" for ln in d.sanitizer_reports()]
    if reports:
        pytest.fail("sanitizer reports:\n" + "\n".join(reports[:50]), pytrace=False)


# Seconds per module (setup, call and teardown of its tests, on whichever worker), written to
# $KM_MODULE_TIMES_OUT at the end of a run: scripts/test keeps them in build/, and
# module_times.json (the scheduler's order, longest first) is refreshed from them by hand.
_module_seconds = {}


def pytest_runtest_logreport(report):
    mod = os.path.basename(report.nodeid.split("::", 1)[0])
    _module_seconds[mod] = _module_seconds.get(mod, 0.0) + (report.duration or 0.0)


def pytest_sessionfinish(session):
    out = os.environ.get("KM_MODULE_TIMES_OUT")
    if out and _module_seconds and not os.environ.get("PYTEST_XDIST_WORKER"):
        import json
        with open(out, "w") as f:
            json.dump({k: round(v, 1) for k, v in sorted(_module_seconds.items())}, f, indent=1)
    from harness import tool_runner
    stats_out = os.environ.get("KM_TOOL_STATS_OUT")
    if stats_out and tool_runner.stats["runs"]:
        import json
        with open(stats_out, "a") as f:
            f.write(json.dumps(dict(tool_runner.stats, worker=os.environ.get(
                "PYTEST_XDIST_WORKER", "main"))) + "\n")
