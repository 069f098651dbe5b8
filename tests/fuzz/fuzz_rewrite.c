/*
 * libFuzzer harness: the proxy's response rewriters (proxy/rewrite.h) with a fixed rewrite context:
 * Metadata, FindCoordinator, DescribeCluster, DescribeConfigs, DescribeQuorum, ShareFetch,
 * ShareAcknowledge, ApiVersions (against the proxy's own API table), a Produce response's top-level
 * tags found in chains of random sizes, NodeEndpoints tags rewritten (and at the same size), and the
 * host:port sniffing of config values. Whatever the generated decoder accepts must rewrite, the
 * result must decode, and no broker endpoint may be left in it.
 *
 * Input: a rewriter byte, a version byte, 3 bytes seeding the piece sizes (fuzz_split.h), then the
 * response body (Produce: the frame after its size prefix; tags: the section; sniffing: the value).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_split.h"
#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/describe_cluster_response.h"
#include "kmirror/msg/find_coordinator_response.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/msg/produce_response.h"
#include "kmirror/msg/response_header.h"
#include "kmirror/wire.h"
#include "proxy/apis.h"
#include "proxy/rewrite.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HOST "proxy.local"

static km_proxy_apis *apis;

static void die(const char *what, int16_t key, int16_t v)
{
	fprintf(stderr, "fuzz_rewrite: api key %d v%d: %s\n", key, v, what);
	abort();
}

static void learn(void *arg, int32_t node, km_str host, int32_t port, km_str rack)
{
	(void)arg;
	(void)node;
	(void)port;
	if (host.len < 0 || (rack.len >= 0 && !rack.p))
		abort();
}

static km_rewrite_ctx ctx(void)
{
	return (km_rewrite_ctx){.host = HOST, .port_base = 19000, .port_count = 100, .learn = learn, .apis = apis};
}

/* A broker endpoint in a rewritten message: the proxy's, unless the node is none (-1: an error answer). */
static void proxied(int32_t node, km_str host, int32_t port, int16_t key, int16_t v)
{
	if (node < 0)
		return;
	if (!km_str_eq_c(host, HOST) || port != (node < 100 ? 19000 + node : -1))
		die("a broker endpoint is left in the rewritten response", key, v);
}

/* Decode a body of key at v whole; m (struct_size bytes) holds it, borrowing from p and a. */
static bool decode(int16_t key, int16_t v, const uint8_t *p, size_t n, void *m, km_arena *a)
{
	const km_api_codec *c = &km_api_lookup(key)->response;
	km_rd r;
	km_rd_init(&r, p, n);
	c->init(m);
	return c->decode(&r, v, m, a) == KM_OK && r.pos == r.len;
}

/* The endpoints of the rewritten message, where the rewriter's key has them. */
static void check_endpoints(int16_t key, int16_t v, const void *m)
{
	if (key == KM_API_METADATA) {
		const km_metadata_response *x = m;
		for (int32_t i = 0; i < x->brokers.count; i++)
			proxied(x->brokers.items[i].node_id, x->brokers.items[i].host, x->brokers.items[i].port, key, v);
	} else if (key == KM_API_FIND_COORDINATOR) {
		const km_find_coordinator_response *x = m;
		if (v <= 3)
			proxied(x->node_id, x->host, x->port, key, v);
		for (int32_t i = 0; v >= 4 && i < x->coordinators.count; i++)
			proxied(x->coordinators.items[i].node_id, x->coordinators.items[i].host, x->coordinators.items[i].port,
				key, v);
	} else if (key == KM_API_DESCRIBE_CLUSTER) {
		const km_describe_cluster_response *x = m;
		for (int32_t i = 0; i < x->brokers.count; i++)
			proxied(x->brokers.items[i].broker_id, x->brokers.items[i].host, x->brokers.items[i].port, key, v);
	}
}

static void body_rewriter(int16_t key, km_body_rewriter fn, int16_t v, const uint8_t *p, size_t n)
{
	const km_api_codec *c = &km_api_lookup(key)->response;
	void *m = malloc(c->struct_size);
	km_rewrite_ctx rc = ctx();
	km_arena a;
	km_wr out;
	bool in_ok;
	km_err err;

	km_arena_init(&a, 16 << 20);
	km_wr_init(&out);
	err = fn(p, n, v, &rc, &out);
	/* A broker that does not know the version asked answers ApiVersions UNSUPPORTED_VERSION in the v0 layout. */
	if (key == KM_API_API_VERSIONS && n >= 2 && km_be16(p) == KM_KAFKA_UNSUPPORTED_VERSION)
		v = 0;
	in_ok = decode(key, v, p, n, m, &a);
	if (err == KM_ERR_UNSUPPORTED) {
		/* Above the version a hand-written rewriter was checked for: the API table never serves it. */
	} else if (in_ok && err != KM_OK) {
		die("the decoder accepts what the rewriter refuses", key, v);
	} else if (in_ok) {
		if (!decode(key, v, out.buf, out.len, m, &a))
			die("the rewritten response does not decode", key, v);
		check_endpoints(key, v, m);
	}
	km_wr_free(&out);
	km_arena_free(&a);
	free(m);
}

/* A top-level tagged-field section that parses to exactly len bytes, NodeEndpoints (tag 0) the proxy's. */
static void check_tags(const uint8_t *p, size_t len)
{
	km_rd r;
	uint32_t n, tag, sz;
	km_rd_init(&r, p, len);
	if (!km_rd_uvarint(&r, "tags", &n))
		die("tags: no count", 0, 0);
	for (uint32_t i = 0; i < n; i++) {
		km_rd sub;
		int32_t cnt;
		if (!km_rd_uvarint(&r, "tag", &tag) || !km_rd_uvarint(&r, "size", &sz) || !km_rd_sub(&r, "data", sz, &sub))
			die("tags: a field runs past the section", 0, 0);
		if (tag != 0)
			continue;
		if (!km_rd_array_len(&sub, "node_endpoints", true, false, 8, &cnt))
			die("tags: NodeEndpoints does not parse", 0, 0);
		for (int32_t j = 0; j < cnt; j++) {
			int32_t node, port;
			km_str host, rack;
			uint32_t tn, tt, ts;
			if (!km_rd_i32(&sub, "node_id", &node) || !km_rd_string(&sub, "host", true, false, &host) ||
			    !km_rd_i32(&sub, "port", &port) || !km_rd_string(&sub, "rack", true, true, &rack) ||
			    !km_rd_uvarint(&sub, "tags", &tn))
				die("tags: a node endpoint does not parse", 0, 0);
			for (uint32_t k = 0; k < tn; k++)
				if (!km_rd_uvarint(&sub, "tag", &tt) || !km_rd_uvarint(&sub, "size", &ts) ||
				    !km_rd_skip(&sub, "data", ts))
					die("tags: a node endpoint's tags do not parse", 0, 0);
			proxied(node, host, port, 0, 0);
		}
	}
	if (r.pos != r.len)
		die("tags: bytes after the section", 0, 0);
}

static void tags(const uint8_t *p, size_t n)
{
	km_rewrite_ctx rc = ctx();
	uint8_t *same = malloc(n ? n : 1);
	km_wr out;
	km_wr_init(&out);
	if (km_rewrite_node_endpoint_tags(p, n, &rc, &out) == KM_OK)
		check_tags(out.buf, out.len);
	km_wr_free(&out);
	rc = ctx();
	if (km_rewrite_node_endpoint_tags_same_size(p, n, &rc, same) == KM_OK)
		check_tags(same, n);
	free(same);
}

/* The top-level tags of a Produce response frame held in chains: where the codec says they are. */
static void produce_tags(int16_t v, const uint8_t *p, size_t n, km_fuzz_rng *g)
{
	struct evbuffer *in = evbuffer_new();
	km_produce_response m;
	km_response_header h;
	uint8_t pre[4] = {0, 0, 0, 0};
	size_t tags_off = 0;
	km_arena a;
	km_rd r;
	bool ok;
	km_err rc;

	km_put_be32(pre, (uint32_t)n);
	km_fuzz_add_chain(in, pre, 4);
	km_fuzz_add_split(in, g, p, n);
	rc = km_rewrite_produce_top_tags(in, 0, 4 + n, v, &tags_off);
	km_arena_init(&a, 16 << 20);
	km_rd_init(&r, p, n);
	km_response_header_init(&h);
	km_produce_response_init(&m);
	ok = km_response_header_decode(&r, 1, &h, &a) == KM_OK && km_produce_response_decode(&r, v, &m, &a) == KM_OK &&
	     r.pos == r.len;
	if (ok && rc != KM_OK)
		die("the decoder accepts a Produce response whose tags are not found", KM_API_PRODUCE, v);
	if (rc == KM_OK) {
		uint8_t *flat = evbuffer_pullup(in, -1);
		if (tags_off < 8 || tags_off > 4 + n)
			die("Produce tags outside the frame", KM_API_PRODUCE, v);
		tags(flat + tags_off, 4 + n - tags_off);
	}
	km_arena_free(&a);
	evbuffer_free(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct {
		int16_t key;
		km_body_rewriter fn;
	} rewriters[] = {
		{KM_API_METADATA, km_rewrite_metadata},
		{KM_API_FIND_COORDINATOR, km_rewrite_find_coordinator},
		{KM_API_DESCRIBE_CLUSTER, km_rewrite_describe_cluster},
		{KM_API_DESCRIBE_CONFIGS, km_rewrite_describe_configs},
		{KM_API_DESCRIBE_QUORUM, km_rewrite_describe_quorum},
		{KM_API_SHARE_FETCH, km_rewrite_share_fetch},
		{KM_API_SHARE_ACKNOWLEDGE, km_rewrite_share_acknowledge},
		{KM_API_API_VERSIONS, km_rewrite_api_versions},
	};
	const size_t nrw = sizeof(rewriters) / sizeof(rewriters[0]);
	km_fuzz_rng g;
	size_t op;

	if (!apis) {
		km_log_set_level(KM_LOG_ERROR); /* the rewriters warn about every malformed input */
		if (!(apis = km_proxy_apis_new()))
			abort();
	}
	if (size < 5 || size > (1u << 20))
		return 0;
	op = data[0] % (nrw + 3);
	km_fuzz_rng_init(&g, data + 2);
	if (op < nrw) {
		const km_api_info *api = km_api_lookup(rewriters[op].key);
		int16_t v = (int16_t)(api->min_version + data[1] % (api->max_version - api->min_version + 1));
		body_rewriter(rewriters[op].key, rewriters[op].fn, v, data + 5, size - 5);
	} else if (op == nrw) {
		produce_tags((int16_t)(9 + data[1] % 5), data + 5, size - 5, &g);
	} else if (op == nrw + 1) {
		tags(data + 5, size - 5);
	} else {
		char *s = malloc(size - 5 + 1);
		memcpy(s, data + 5, size - 5);
		(void)km_rewrite_value_has_endpoint((km_str){s, (int32_t)(size - 5)});
		free(s);
	}
	return 0;
}
