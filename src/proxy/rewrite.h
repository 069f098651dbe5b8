/* Proxy-internal: the API table and the response rewriters that replace broker endpoints with the proxy's own. */
#ifndef KMIRROR_PROXY_REWRITE_H
#define KMIRROR_PROXY_REWRITE_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/buffer.h>

#include "kmirror/api.h"
#include "kmirror/error.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/wire.h"

/* What a rewriter puts in place of a broker endpoint, and where it reports the brokers it saw. */
typedef struct km_rewrite_ctx {
	const char *host;       /* advertised host */
	int32_t port_base;      /* node N -> port_base + N */
	int32_t port_count;     /* node ids >= port_count have no port */
	void (*learn)(void *arg, int32_t node_id, km_str host, int32_t port, km_str rack);
	void *arg;
	const struct km_proxy_apis *apis; /* what the proxy serves (ApiVersions) */
	int rewritten;          /* out: number of endpoints replaced */
} km_rewrite_ctx;

/*
 * The highest version each hand-written rewriter was written for: the API table serves no newer
 * one, so a new Kafka release's new version waits until its layout is checked here.
 */
#define KM_REWRITE_METADATA_MAX_VERSION 13
#define KM_REWRITE_FIND_COORDINATOR_MAX_VERSION 6
#define KM_REWRITE_DESCRIBE_CLUSTER_MAX_VERSION 2

/* The client-facing port of a node, or -1 when it has none. */
int32_t km_rewrite_port(const km_rewrite_ctx *ctx, int32_t node_id);

/*
 * Rewriters over a response body (after the response header): write the new body to out.
 * KM_ERR_DECODE on malformed input, KM_ERR_UNSUPPORTED on a version they do not know.
 */
km_err km_rewrite_metadata(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);
km_err km_rewrite_find_coordinator(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);
km_err km_rewrite_describe_cluster(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);
/*
 * DescribeConfigs: in BROKER and BROKER_LOGGER results, advertised.listeners becomes the proxy's
 * endpoint for the node; listeners, *.listeners, controller.quorum.* and any value holding a
 * host:port become null and sensitive (synonym values: null). Other resources are left alone.
 */
km_err km_rewrite_describe_configs(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);
/* DescribeQuorum: every controller node keeps its id but loses its listeners (v2). */
km_err km_rewrite_describe_quorum(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);
/* ShareFetch and ShareAcknowledge: NodeEndpoints become the proxy's, as in Metadata. */
km_err km_rewrite_share_fetch(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);
km_err km_rewrite_share_acknowledge(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);
/* Whether a config value holds something shaped like host:port (name, dotted or [v6] host; 1-5 digit port). */
bool km_rewrite_value_has_endpoint(km_str v);
/*
 * ApiVersions: keep only keys in ctx->apis, each narrowed to the common version range; add the APIs
 * the proxy answers itself; lower or drop finalized and supported features whose protocol needs a
 * version that is not offered (km_feature_needs).
 */
km_err km_rewrite_api_versions(const uint8_t *body, size_t len, int16_t version, km_rewrite_ctx *ctx, km_wr *out);

/* A feature level and an API version its protocol needs: a client that sees the level uses that version. */
typedef struct km_feature_need {
	const char *feature;
	int16_t level;
	int16_t api_key;
	int16_t min_version;
} km_feature_need;
extern const km_feature_need km_feature_needs[];
extern const size_t km_feature_needs_count;
/* The broker-style answer to a too-new ApiVersions request: a v0 body, error UNSUPPORTED_VERSION. */
void km_api_versions_unsupported_body(km_wr *out);

/*
 * Produce responses (v9+): walk the frame in buf (frame_start: its size prefix), pulled up to its
 * end (answers are small), and return the offset of the top-level tagged-field section. (Fetch has
 * its walker, which never pulls up: kmirror/fetch.h.)
 */
km_err km_rewrite_produce_top_tags(struct evbuffer *buf, size_t frame_start, size_t frame_end, int16_t version,
				   size_t *tags_off);
/* Rewrite the NodeEndpoints (tag 0) in a top-level tagged-field section; other tags are copied. */
km_err km_rewrite_node_endpoint_tags(const uint8_t *tags, size_t len, km_rewrite_ctx *ctx, km_wr *out);
/*
 * The same, but the result has exactly len bytes (written to out), so a frame whose size prefix is
 * already sent stays valid: a shorter result is padded with an unknown tagged field (clients skip
 * those); when the rewritten endpoints would be longer, NodeEndpoints is dropped and padded instead
 * (the client then refreshes metadata, as before KIP-951). Never leaves a real address.
 */
km_err km_rewrite_node_endpoint_tags_same_size(const uint8_t *tags, size_t len, km_rewrite_ctx *ctx, uint8_t *out);

#endif
