"""ApiVersions through kmirrord: the API versions the proxy offers are the intersection of the
broker's and the codec's (Kafka 4.4's message definitions), and every finalized feature level it
passes on is backed by the API versions it offers. A client reads transaction.version=2 as "use
Produce v12+ and EndTxn v5, skip AddPartitionsToTxn", so a proxy that passes that level on while
offering less breaks Java transactional producers on their first commit."""

import glob
import json
import os
import re

import pytest

from harness import api_versions
from proxy_fixtures import *  # noqa: F401,F403
from proxy_fixtures import PROXY_HOST

pytestmark = pytest.mark.proxy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
API_TABLE = os.path.join(REPO, "src", "codec", "gen", "api_table.c")
# Kafka's message definitions, where configure finds them (next to the source tree).
MESSAGES = os.environ.get("KM_KAFKA_MESSAGES") or next(
    (d for d in (os.path.join(REPO, "..", "shared", "kafka-protocol", "message"),
                 os.path.join(REPO, "..", "..", "shared", "kafka-protocol", "message"))
     if os.path.isdir(d)), None)
needs_messages = pytest.mark.skipif(MESSAGES is None, reason="no ../shared/kafka-protocol/message")

# API keys by name (the ones the requirements below name).
PRODUCE, ADD_PARTITIONS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 0, 24, 26, 28
CONSUMER_GROUP_HEARTBEAT = 68
SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 78, 79
STREAMS_GROUP_HEARTBEAT = 88

# (feature, from level, [(api key, lowest max version the proxy must offer)]): what a client
# does at that feature level needs these versions (the definitions' comments, e.g. ProduceRequest
# "Version 12 is the same as version 11 (KIP-890)", EndTxnRequest "Version 5 enables bumping epoch
# on every transaction (KIP-890 Part 2)").
REQUIREMENTS = [
    # (AddPartitionsToTxn v5 is KIP-890's too, but "versions 3 and below will be exclusively used
    # by clients and versions 4 and above will be used by brokers": the proxy offers clients v0-3.)
    ("transaction.version", 2, [(PRODUCE, 12), (END_TXN, 5), (TXN_OFFSET_COMMIT, 5)]),
    ("group.version", 1, [(CONSUMER_GROUP_HEARTBEAT, 0)]),
    ("share.version", 1, [(SHARE_GROUP_HEARTBEAT, 0), (SHARE_FETCH, 0), (SHARE_ACKNOWLEDGE, 0)]),
    ("streams.version", 1, [(STREAMS_GROUP_HEARTBEAT, 0)]),
]

# The newest versions of Kafka 4.4's definitions, which the codec is generated from.
CODEC_NEWEST = {"Fetch": 18, "Metadata": 13, "Produce": 13, "ListOffsets": 11,
                "OffsetCommit": 10, "OffsetFetch": 10}


def _json(path):
    with open(path) as f:
        return json.loads(re.sub(r"^\s*//.*$", "", f.read(), flags=re.M))


def codec_table(kafka_only=True):
    """{api key: (name, min, max)} of the codec's APIs served on a broker listener, read from its
    generated table (src/codec/gen/api_table.c); with kafka_only, only Kafka's own APIs (those of
    its definitions, when they are at hand), not kmirror's."""
    with open(API_TABLE) as f:
        text = f.read()
    out = {}
    for row in re.finditer(r"\.api_key = (\d+),\s*\.name = \"(\w+)\",\s*\.min_version = (\d+),"
                           r"\s*\.max_version = (\d+),(.*?)\.listeners = ([^,]*),", text, re.S):
        if "KM_API_LISTENER_BROKER" in row.group(6):
            out[int(row.group(1))] = (row.group(2), int(row.group(3)), int(row.group(4)))
    assert out, f"no API rows in {API_TABLE}"
    if kafka_only and MESSAGES:
        kafka = definitions_table()
        out = {k: v for k, v in out.items() if k in kafka}
    return out


def definitions_table():
    """The same, from Kafka's JSON definitions (requests served on a broker listener)."""
    out = {}
    for path in glob.glob(os.path.join(MESSAGES, "*Request.json")):
        m = _json(path)
        if m.get("type") != "request" or "broker" not in m.get("listeners", []):
            continue
        lo, _, hi = m["validVersions"].partition("-")
        out[m["apiKey"]] = (m["name"][:-len("Request")], int(lo), int(hi or lo))
    return out


# Where the proxy serves less than the codec knows (docs/proxy.md's API table): OffsetCommit and
# OffsetFetch by topic name only, so that a group's offsets outlive an upstream swap.
PROXY_MAX = {8: 9, 9: 9, 24: 3}  # AddPartitionsToTxn v4+ is the brokers' own
# What only brokers send each other (WriteTxnMarkers, the share coordinator's state APIs): not offered.
BROKERS_ONLY = {27, 83, 84, 85, 86, 87}


def expected_offer(broker_apis, codec):
    """What the proxy should offer: per API both sides know, the overlap of the two ranges, under
    PROXY_MAX, but for the APIs only brokers send. SaslHandshake is shown from v0 although the
    proxy refuses a v0 request (the unframed SASL of old clients): librdkafka 2.0 looks for v1
    support only in a range that starts at v0."""
    out = {}
    for key, (blo, bhi) in broker_apis.items():
        if key not in codec or key in BROKERS_ONLY:
            continue
        lo = max(blo, codec[key][1])
        hi = min(bhi, codec[key][2], PROXY_MAX.get(key, 32767))
        if lo <= hi:
            out[key] = (lo, hi)
    return out


def check_features(broker, proxy):
    """The rules for the finalized features of one proxy answer against the broker's."""
    bf, pf = broker["finalized_features"], proxy["finalized_features"]
    # Passed on unchanged, lowered, or dropped; never raised and never invented.
    assert set(pf) <= set(bf), f"features the broker does not have: {set(pf) - set(bf)}"
    for name, (lo, hi) in pf.items():
        assert hi <= bf[name][1], f"{name} raised from {bf[name][1]} to {hi}"
        assert lo <= hi, f"{name}: min level {lo} above max level {hi}"
    # A level passed on is backed by the versions offered.
    for feature, level, needs in REQUIREMENTS:
        passed = pf.get(feature, (0, 0))[1]
        if passed < level:
            continue
        for key, version in needs:
            offered = proxy["apis"].get(key)
            assert offered and offered[1] >= version, (
                f"{feature}={passed} passed on, but the proxy offers api key {key} "
                f"{'v%d-%d' % offered if offered else 'not at all'}, the feature needs v{version}+")


def test_codec_is_kafka_44():
    newest = {name: hi for name, _, hi in codec_table().values()}
    assert {k: newest[k] for k in CODEC_NEWEST} == CODEC_NEWEST


@needs_messages
def test_codec_table_is_the_definitions():
    """Every Kafka API of the definitions is in the codec, with the same versions."""
    assert codec_table() == definitions_table()


@pytest.mark.parametrize("version", [3, 4])
def test_versions_and_features_agree(proxy3, version):
    cluster = proxy3.cluster
    codec = codec_table()
    ports = [("bootstrap", proxy3.port, cluster.broker_ids[0])] + [
        (f"broker {i}", proxy3.broker_port(i), i) for i in cluster.broker_ids]
    brokers = {}
    for i in cluster.broker_ids:
        host, port = cluster.broker_address(i).split(":")
        brokers[i] = api_versions(host, int(port), version=version)
        assert brokers[i]["error"] == 0
    # The brokers of one cluster agree, so the bootstrap port may go to any of them.
    for i in cluster.broker_ids:
        assert brokers[i]["apis"] == brokers[cluster.broker_ids[0]]["apis"]
        assert brokers[i]["finalized_features"] == brokers[cluster.broker_ids[0]][
            "finalized_features"]
    for what, port, node in ports:
        broker = brokers[node]
        proxy = api_versions(PROXY_HOST, port, version=version)
        assert proxy["error"] == 0, what
        # Keys outside Kafka's APIs (kmirror's own RPCs) are not Kafka's to judge.
        offered = {k: v for k, v in proxy["apis"].items() if k in codec}
        want = expected_offer(broker["apis"], codec)
        diff = {k: (codec[k][0], offered.get(k), want.get(k)) for k in set(offered) | set(want)
                if offered.get(k) != want.get(k)}
        assert not diff, f"{what}: (api, offered, broker ∩ codec) differ: {diff}"
        for name, newest in CODEC_NEWEST.items():
            key = next(k for k, v in codec.items() if v[0] == name)
            assert offered[key][1] == min(newest, broker["apis"][key][1], PROXY_MAX.get(key, 32767)), (what, name)
        assert broker["finalized_epoch"] >= 0 and broker["finalized_features"], broker
        check_features(broker, proxy)
        # The epoch follows the metadata log (it moves on as topics come and go), so it is only
        # checked to be a valid one: finalized features with epoch -1 would be ignored.
        if proxy["finalized_features"]:
            assert proxy["finalized_epoch"] >= 0, what


@needs_messages
def test_requirement_table_matches_definitions():
    """The numbers of the table are the definitions' own: the versions named exist, and the
    comments of the transaction.version ones name KIP-890."""
    codec = codec_table()
    for _, _, needs in REQUIREMENTS:
        for key, version in needs:
            assert key in codec and codec[key][2] >= version, (key, version)
    for key, version in REQUIREMENTS[0][2]:
        name = codec[key][0]
        with open(os.path.join(MESSAGES, f"{name}Request.json")) as f:
            text = f.read()
        assert re.search(rf"//\s*Version {version} .*KIP-890", text), (name, version)
    assert codec[STREAMS_GROUP_HEARTBEAT][0] == "StreamsGroupHeartbeat"
    assert [codec[k][0] for k in (SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE)] == [
        "ShareGroupHeartbeat", "ShareFetch", "ShareAcknowledge"]
    assert codec[CONSUMER_GROUP_HEARTBEAT][0] == "ConsumerGroupHeartbeat"
