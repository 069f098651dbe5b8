# kmirrord in a container (Debian 12). Build: docker build -t kmirror . ; run with docker-compose.yml
# or: docker run -p 39092:9092 -p 39100-39109:39100-39109 -p 9644:9644 -e KMIRRORD_UPSTREAM=kafka:9092 kmirror
# Both stages run scripts/container-build, the same commands tests/integration/test_packaging.py runs
# (docs/install.md, "Container").

FROM debian:12-slim AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	build-essential autoconf automake libtool pkg-config \
	libevent-dev libssl-dev libsasl2-dev libkrb5-dev libzstd-dev liblz4-dev zlib1g-dev libsnappy-dev uthash-dev \
	libcmocka-dev \
	&& rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/container-build build /src/build-container /staging

FROM debian:12-slim
# The runtime libraries only, and curl for the health check.
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	libevent-2.1-7 libevent-openssl-2.1-7 libevent-pthreads-2.1-7 libssl3 libzstd1 liblz4-1 zlib1g \
	libsnappy1v5 libgssapi-krb5-2 libkrb5-3 ca-certificates curl \
	&& rm -rf /var/lib/apt/lists/* \
	&& useradd --system --user-group --home-dir /var/lib/kmirror --create-home --shell /usr/sbin/nologin kmirror
COPY --from=build /staging/ /
COPY --from=build /src/scripts/container-build /usr/local/bin/container-build
USER kmirror
WORKDIR /var/lib/kmirror
# Bootstrap (listen), broker node N on 39100 + N (broker_port_base), HTTP (/metrics, /healthz).
EXPOSE 9092 39100-39109 9644
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
	CMD curl -fsS http://127.0.0.1:9644/healthz || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["container-build", "start"]
CMD ["--config", "/etc/kmirror/kmirrord.conf"]
