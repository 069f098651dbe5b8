#!/usr/bin/env bash
# Installs everything kmirror's build, tests and benchmarks need on Debian 12. Idempotent.
set -euo pipefail

DEBIAN_PACKAGES=(
	build-essential autoconf automake libtool pkg-config
	libevent-dev libssl-dev libsasl2-dev libsasl2-modules sasl2-bin
	libzstd-dev liblz4-dev zlib1g-dev libsnappy-dev uthash-dev libcmocka-dev
	clang llvm libclang-rt-14-dev
	openjdk-17-jdk-headless maven
	python3 python3-pip python3-venv
	kcat openssl procps iproute2 valgrind curl tcpdump groff-base
	# tests/integration/test_packaging.py: systemd-analyze (verify and security --offline, no
	# systemd as PID 1 needed), man for the man pages' warnings, PyYAML for docker-compose.yml.
	systemd man-db python3-yaml
	# tests/integration/test_observability.py: a real Prometheus and promtool.
	prometheus
	# scripts/soak: network cuts between kmirrord and a cluster (packet filters on loopback ports).
	nftables
	# SASL GSSAPI: the GSS-API headers kmirror builds against; the tests' own MIT KDC (krb5kdc,
	# kdb5_util, kadmin.local), kinit/klist, and cyrus-sasl's GSSAPI plugin for kcat's librdkafka.
	libkrb5-dev krb5-kdc krb5-admin-server krb5-user libsasl2-modules-gssapi-mit
)
PYTHON_PACKAGES=(pytest confluent-kafka)

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A JDK of 17 or newer from elsewhere (e.g. /usr/lib/jvm) also does; javac compiles the Java test clients.
if command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; then
	missing=("${missing[@]/openjdk-17-jdk-headless/}")
fi
if command -v mvn >/dev/null 2>&1; then
	missing=("${missing[@]/maven/}")
fi
read -r -a missing <<<"${missing[*]:-}"
if [ "${#missing[@]}" -gt 0 ]; then
	echo "install-deps: installing Debian packages: ${missing[*]}"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO="sudo"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

pymissing=()
python3 -c 'import pytest' 2>/dev/null || pymissing+=(pytest)
python3 -c 'import confluent_kafka' 2>/dev/null || pymissing+=(confluent-kafka)
# A third client family (pure Python, its own protocol code): the mirror tests read through the proxy with it too.
python3 -c 'import kafka' 2>/dev/null || pymissing+=(kafka-python)
# The integration suite runs on every core with it (worker_sched.py is written against its 3.x API).
python3 -c 'import xdist' 2>/dev/null || pymissing+=("pytest-xdist>=3.5,<4")
# test_observability.py reads the alert rules (docs/prometheus/*.yml) with it.
python3 -c 'import yaml' 2>/dev/null || pymissing+=(pyyaml)
# tests/harness/oauth.py signs the OAUTHBEARER tests' RS256 tokens and serves their key's JWKS with it.
python3 -c 'import cryptography' 2>/dev/null || pymissing+=(cryptography)
# scripts/bench draws its plots with it.
python3 -c 'import matplotlib' 2>/dev/null || pymissing+=(matplotlib)
if [ "${#pymissing[@]}" -gt 0 ]; then
	echo "install-deps: installing Python packages: ${pymissing[*]}"
	python3 -m pip install -q "${pymissing[@]}" 2>/dev/null ||
		python3 -m pip install -q --break-system-packages "${pymissing[@]}"
fi
echo "install-deps: all dependencies present"
