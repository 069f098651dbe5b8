/* Unit tests for response rewriting: Metadata, FindCoordinator, DescribeCluster, ApiVersions, Produce/Fetch NodeEndpoints. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/fetch.h"
#include "kmirror/msg/api_versions_response.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/net.h"
#include "proxy/apis.h"
#include "proxy/rewrite.h"
#include "unit_doc.h"
#include "unit_fetch.h"

static km_proxy_apis *apis; /* the proxy's table, for ApiVersions */

typedef struct learned {
	int n;
	int32_t node[8];
	char host[8][64];
	int32_t port[8];
} learned;

static void learn(void *arg, int32_t node, km_str host, int32_t port, km_str rack)
{
	learned *l = arg;
	if (l->n < 8) {
		l->node[l->n] = node;
		snprintf(l->host[l->n], sizeof(l->host[0]), "%.*s", host.len, host.p);
		l->port[l->n] = port;
		l->n++;
	}
}

static km_rewrite_ctx ctx_for(learned *l)
{
	km_rewrite_ctx c = {.host = "proxy.local", .port_base = 19000, .port_count = 100, .learn = learn, .arg = l,
			    .apis = apis};
	memset(l, 0, sizeof(*l));
	return c;
}

static void tags0(km_wr *w, bool flex)
{
	if (flex)
		km_wr_uvarint(w, 0);
}

/* A Metadata response body with two brokers and one topic (fields per version, as the broker writes them). */
static void metadata_body(km_wr *w, int16_t v, const char *h1, const char *h2)
{
	bool flex = v >= 9;
	if (v >= 3)
		km_wr_i32(w, 0);
	km_wr_array_len(w, flex, 2);
	km_wr_i32(w, 1);
	km_wr_string(w, flex, km_str_c(h1));
	km_wr_i32(w, 9092);
	if (v >= 1)
		km_wr_string(w, flex, km_str_c("rack-a"));
	tags0(w, flex);
	km_wr_i32(w, 2);
	km_wr_string(w, flex, km_str_c(h2));
	km_wr_i32(w, 9093);
	if (v >= 1)
		km_wr_string(w, flex, KM_STR_NULL);
	tags0(w, flex);
	if (v >= 2)
		km_wr_string(w, flex, km_str_c("cluster-xyz"));
	if (v >= 1)
		km_wr_i32(w, 2); /* controller */
	km_wr_array_len(w, flex, 1);
	km_wr_i16(w, 0);
	km_wr_string(w, flex, km_str_c("orders"));
	if (v >= 10) {
		km_uuid u = {{1, 2, 3}};
		km_wr_uuid(w, &u);
	}
	if (v >= 1)
		km_wr_bool(w, false);
	km_wr_array_len(w, flex, 0); /* partitions */
	if (v >= 8)
		km_wr_i32(w, -2147483647 - 1);
	tags0(w, flex);
	if (v >= 8 && v <= 10)
		km_wr_i32(w, 0);
	tags0(w, flex);
}

static void test_metadata_all_versions(void **state)
{
	for (int16_t v = 0; v <= 12; v++) {
		km_wr in, out, expect;
		learned l;
		km_rewrite_ctx c = ctx_for(&l);

		km_wr_init(&in);
		km_wr_init(&out);
		km_wr_init(&expect);
		metadata_body(&in, v, "broker-1.internal", "10.0.0.2");
		/* The expected output is the same response with the proxy's endpoints. */
		{
			bool flex = v >= 9;
			if (v >= 3)
				km_wr_i32(&expect, 0);
			km_wr_array_len(&expect, flex, 2);
			km_wr_i32(&expect, 1);
			km_wr_string(&expect, flex, km_str_c("proxy.local"));
			km_wr_i32(&expect, 19001);
			if (v >= 1)
				km_wr_string(&expect, flex, km_str_c("rack-a"));
			tags0(&expect, flex);
			km_wr_i32(&expect, 2);
			km_wr_string(&expect, flex, km_str_c("proxy.local"));
			km_wr_i32(&expect, 19002);
			if (v >= 1)
				km_wr_string(&expect, flex, KM_STR_NULL);
			tags0(&expect, flex);
		}
		assert_int_equal(km_rewrite_metadata(in.buf, in.len, v, &c, &out), KM_OK);
		assert_true(out.len >= expect.len);
		assert_memory_equal(out.buf, expect.buf, expect.len);
		/* Everything after the broker array is byte for byte the broker's. */
		{
			size_t rest = out.len - expect.len;
			size_t in_brokers = expect.len - 2 * strlen("proxy.local") + strlen("broker-1.internal") +
					    strlen("10.0.0.2");
			assert_int_equal(in.len - rest, in_brokers);
			assert_memory_equal(out.buf + expect.len, in.buf + in_brokers, rest);
		}
		assert_null(memmem(out.buf, out.len, "broker-1.internal", 17));
		assert_null(memmem(out.buf, out.len, "10.0.0.2", 8));
		assert_non_null(memmem(out.buf, out.len, "orders", 6));
		assert_int_equal(c.rewritten, 2);
		assert_int_equal(l.n, 2);
		assert_string_equal(l.host[0], "broker-1.internal");
		assert_int_equal(l.port[1], 9093);
		/* Truncated input is refused at every cut inside the broker array. */
		for (size_t cut = 0; cut < expect.len - 2; cut += 3) {
			km_wr o2;
			km_rewrite_ctx c2 = ctx_for(&l);
			km_wr_init(&o2);
			assert_int_not_equal(km_rewrite_metadata(in.buf, cut, v, &c2, &o2), KM_OK);
			km_wr_free(&o2);
		}
		km_wr_free(&in);
		km_wr_free(&out);
		km_wr_free(&expect);
	}
}

static void test_metadata_hostile_count(void **state)
{
	km_wr in, out;
	learned l;
	km_rewrite_ctx c = ctx_for(&l);
	km_wr_init(&in);
	km_wr_init(&out);
	km_wr_i32(&in, 0);
	km_wr_i32(&in, 0x7fffffff); /* brokers count, far beyond the bytes */
	km_wr_i32(&in, 1);
	assert_int_equal(km_rewrite_metadata(in.buf, in.len, 3, &c, &out), KM_ERR_DECODE);
	assert_int_equal(km_rewrite_metadata(in.buf, in.len, KM_METADATA_RESPONSE_MAX_VERSION + 1, &c, &out), KM_ERR_UNSUPPORTED);
	km_wr_free(&in);
	km_wr_free(&out);
}

static void test_find_coordinator(void **state)
{
	for (int16_t v = 0; v <= 6; v++) {
		km_wr in, out;
		learned l;
		km_rewrite_ctx c = ctx_for(&l);
		bool flex = v >= 3;
		km_rd r;
		int32_t node, port;
		km_str host;

		km_wr_init(&in);
		km_wr_init(&out);
		if (v >= 1)
			km_wr_i32(&in, 0);
		if (v <= 3) {
			km_wr_i16(&in, 0);
			if (v >= 1)
				km_wr_string(&in, flex, KM_STR_NULL);
			km_wr_i32(&in, 7);
			km_wr_string(&in, flex, km_str_c("kafka-7.svc"));
			km_wr_i32(&in, 9094);
			tags0(&in, flex);
		} else {
			km_wr_array_len(&in, true, 2);
			km_wr_string(&in, true, km_str_c("group-a"));
			km_wr_i32(&in, 7);
			km_wr_string(&in, true, km_str_c("kafka-7.svc"));
			km_wr_i32(&in, 9094);
			km_wr_i16(&in, 0);
			km_wr_string(&in, true, KM_STR_NULL);
			tags0(&in, true);
			/* an error entry: node -1, empty host, kept */
			km_wr_string(&in, true, km_str_c("group-b"));
			km_wr_i32(&in, -1);
			km_wr_string(&in, true, km_str_c(""));
			km_wr_i32(&in, -1);
			km_wr_i16(&in, 15);
			km_wr_string(&in, true, km_str_c("COORDINATOR_NOT_AVAILABLE"));
			tags0(&in, true);
			tags0(&in, true);
		}
		assert_int_equal(km_rewrite_find_coordinator(in.buf, in.len, v, &c, &out), KM_OK);
		assert_int_equal(c.rewritten, 1);
		assert_null(memmem(out.buf, out.len, "kafka-7", 7));
		/* Decode the result and check the endpoint. */
		km_rd_init(&r, out.buf, out.len);
		if (v >= 1)
			km_rd_skip(&r, "throttle", 4);
		if (v <= 3) {
			km_str msg;
			km_rd_skip(&r, "error", 2);
			if (v >= 1)
				km_rd_string(&r, "msg", flex, true, &msg);
		} else {
			int32_t n;
			km_str key;
			km_rd_array_len(&r, "coordinators", true, false, 1, &n);
			assert_int_equal(n, 2);
			km_rd_string(&r, "key", true, false, &key);
		}
		km_rd_i32(&r, "node", &node);
		km_rd_string(&r, "host", flex, false, &host);
		km_rd_i32(&r, "port", &port);
		assert_true(km_rd_ok(&r));
		assert_int_equal(node, 7);
		assert_true(km_str_eq_c(host, "proxy.local"));
		assert_int_equal(port, 19007);
		assert_int_equal(out.len, in.len + strlen("proxy.local") - strlen("kafka-7.svc"));
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

static void test_describe_cluster(void **state)
{
	for (int16_t v = 0; v <= 2; v++) {
		km_wr in, out;
		learned l;
		km_rewrite_ctx c = ctx_for(&l);
		km_wr_init(&in);
		km_wr_init(&out);
		km_wr_i32(&in, 0);
		km_wr_i16(&in, 0);
		km_wr_string(&in, true, KM_STR_NULL);
		if (v >= 1)
			km_wr_i8(&in, 1);
		km_wr_string(&in, true, km_str_c("cid"));
		km_wr_i32(&in, 3);
		km_wr_array_len(&in, true, 1);
		km_wr_i32(&in, 3);
		km_wr_string(&in, true, km_str_c("192.168.1.3"));
		km_wr_i32(&in, 9092);
		km_wr_string(&in, true, km_str_c("r1"));
		if (v >= 2)
			km_wr_bool(&in, false);
		tags0(&in, true);
		km_wr_i32(&in, 0);
		tags0(&in, true);
		assert_int_equal(km_rewrite_describe_cluster(in.buf, in.len, v, &c, &out), KM_OK);
		assert_null(memmem(out.buf, out.len, "192.168.1.3", 11));
		assert_non_null(memmem(out.buf, out.len, "proxy.local", 11));
		assert_int_equal(l.n, 1);
		assert_int_equal(l.node[0], 3);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

/* The mirror RPCs (api keys 32000-32009): LOCAL rows, advertised in every ApiVersions answer. */
#define KM_TEST_MIRROR_RPCS 10

static void test_api_versions_intersection(void **state)
{
	const km_api_info *fetch = km_api_lookup(KM_API_FETCH);
	const km_api_info *meta = km_api_lookup(KM_API_METADATA);
	learned l;
	km_rewrite_ctx c = ctx_for(&l);
	assert_non_null(fetch);
	assert_non_null(meta);
	for (int16_t v = 0; v <= KM_API_VERSIONS_RESPONSE_MAX_VERSION; v++) {
		bool flex = v >= 3;
		km_wr in, out;
		km_rd r;
		int16_t ec, key, lo, hi;
		int32_t n;

		km_wr_init(&in);
		km_wr_init(&out);
		km_wr_i16(&in, 0);
		km_wr_array_len(&in, flex, 4);
		/* Fetch: broker newer than the proxy */
		km_wr_i16(&in, KM_API_FETCH);
		km_wr_i16(&in, 4);
		km_wr_i16(&in, (int16_t)(fetch->max_version + 3));
		tags0(&in, flex);
		/* an API key nobody knows: dropped */
		km_wr_i16(&in, 30000);
		km_wr_i16(&in, 0);
		km_wr_i16(&in, 1);
		tags0(&in, flex);
		/* Metadata: broker older than the proxy */
		km_wr_i16(&in, KM_API_METADATA);
		km_wr_i16(&in, 0);
		km_wr_i16(&in, 5);
		tags0(&in, flex);
		/* disjoint range: dropped */
		km_wr_i16(&in, KM_API_PRODUCE);
		km_wr_i16(&in, 500);
		km_wr_i16(&in, 600);
		tags0(&in, flex);
		if (v >= 1)
			km_wr_i32(&in, 0);
		tags0(&in, flex);

		assert_int_equal(km_rewrite_api_versions(in.buf, in.len, v, &c, &out), KM_OK);
		km_rd_init(&r, out.buf, out.len);
		km_rd_i16(&r, "ec", &ec);
		km_rd_array_len(&r, "keys", flex, false, 6, &n);
		/* the two the broker and the proxy share, then the proxy's own: the ten mirror RPCs */
		assert_int_equal(n, 2 + KM_TEST_MIRROR_RPCS);
		km_rd_i16(&r, "k", &key);
		km_rd_i16(&r, "lo", &lo);
		km_rd_i16(&r, "hi", &hi);
		assert_int_equal(key, KM_API_FETCH);
		assert_int_equal(lo, 4);
		assert_int_equal(hi, fetch->max_version);
		if (flex)
			km_rd_skip(&r, "tags", 1);
		km_rd_i16(&r, "k", &key);
		km_rd_i16(&r, "lo", &lo);
		km_rd_i16(&r, "hi", &hi);
		assert_int_equal(key, KM_API_METADATA);
		assert_int_equal(lo, meta->min_version);
		assert_int_equal(hi, 5);
		if (flex)
			km_rd_skip(&r, "tags", 1);
		for (int i = 0; i < KM_TEST_MIRROR_RPCS; i++) {
			km_rd_i16(&r, "k", &key);
			km_rd_i16(&r, "lo", &lo);
			km_rd_i16(&r, "hi", &hi);
			assert_int_equal(key, KM_API_CREATE_MIRROR + i);
			assert_int_equal(lo, 0);
			assert_int_equal(hi, 0);
			if (flex)
				km_rd_skip(&r, "tags", 1);
		}
		if (v >= 1)
			km_rd_skip(&r, "throttle", 4);
		if (flex)
			km_rd_skip(&r, "tags", 1);
		assert_true(km_rd_ok(&r));
		assert_int_equal(km_rd_left(&r), 0);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

static void test_api_versions_unsupported(void **state)
{
	km_wr w;
	km_rd r;
	int16_t ec, key, lo, hi;
	int32_t n;
	km_wr_init(&w);
	km_api_versions_unsupported_body(&w);
	km_rd_init(&r, w.buf, w.len);
	km_rd_i16(&r, "ec", &ec);
	km_rd_array_len(&r, "keys", false, false, 6, &n);
	km_rd_i16(&r, "k", &key);
	km_rd_i16(&r, "lo", &lo);
	km_rd_i16(&r, "hi", &hi);
	assert_true(km_rd_ok(&r));
	assert_int_equal(km_rd_left(&r), 0);
	assert_int_equal(ec, 35);
	assert_int_equal(n, 1);
	assert_int_equal(key, 18);
	assert_int_equal(lo, 0);
	assert_int_equal(hi, km_api_lookup(18)->max_version);
	km_wr_free(&w);
}

/* A broker older than the request answers UNSUPPORTED_VERSION in the v0 layout, whatever was asked. */
static void test_api_versions_broker_too_old(void **state)
{
	km_wr in, out;
	km_rd r;
	int16_t ec, key, lo, hi;
	int32_t n;
	km_wr_init(&in);
	km_wr_init(&out);
	km_wr_i16(&in, 35);
	km_wr_array_len(&in, false, 1);
	km_wr_i16(&in, 18);
	km_wr_i16(&in, 0);
	km_wr_i16(&in, 2);
	{
		learned l;
		km_rewrite_ctx c = ctx_for(&l);
		assert_int_equal(km_rewrite_api_versions(in.buf, in.len, 4, &c, &out), KM_OK);
	}
	km_rd_init(&r, out.buf, out.len);
	km_rd_i16(&r, "ec", &ec);
	km_rd_array_len(&r, "keys", false, false, 6, &n);
	km_rd_i16(&r, "k", &key);
	km_rd_i16(&r, "lo", &lo);
	km_rd_i16(&r, "hi", &hi);
	assert_true(km_rd_ok(&r));
	assert_int_equal(km_rd_left(&r), 0);
	assert_int_equal(ec, 35);
	assert_int_equal(n, 1);
	assert_int_equal(hi, 2);
	km_wr_free(&in);
	km_wr_free(&out);
}

static void test_header_versions(void **state)
{
	assert_int_equal(km_proxy_request_header_version(KM_API_PRODUCE, 8), 1);
	assert_int_equal(km_proxy_request_header_version(KM_API_PRODUCE, 9), 2);
	assert_int_equal(km_proxy_response_header_version(KM_API_FETCH, 11), 0);
	assert_int_equal(km_proxy_response_header_version(KM_API_FETCH, 12), 1);
	assert_int_equal(km_proxy_response_header_version(KM_API_API_VERSIONS, 4), 0);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(apis, KM_API_PRODUCE), 10), KM_RESP_WHOLE);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(apis, KM_API_PRODUCE), 9), KM_RESP_FORWARD);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(apis, KM_API_FETCH), 16), KM_RESP_STREAM);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(apis, KM_API_FETCH), 15), KM_RESP_FORWARD);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(apis, 2), 5), KM_RESP_FORWARD); /* ListOffsets */
	/* controller-only APIs are not in the table */
	assert_null(km_proxy_apis_find(apis, 52)); /* Vote */
}

/* A whole Fetch v16 response frame; node_endpoints adds the KIP-951 tag. Records are opaque bytes. */
static void fetch_frame(km_wr *w, int16_t v, bool node_endpoints, size_t record_bytes, bool aborted)
{
	size_t start = km_wr_reserve(w, 4);
	uint8_t *recs = malloc(record_bytes ? record_bytes : 1);
	memset(recs, 0, record_bytes ? record_bytes : 1); /* zeros: a tail scan would be fooled */
	km_wr_i32(w, 42);          /* correlation id */
	tags0(w, true);            /* response header v1 */
	km_wr_i32(w, 0);           /* throttle */
	km_wr_i16(w, 0);           /* error */
	km_wr_i32(w, 0);           /* session */
	km_wr_array_len(w, true, 1);
	if (v >= 13) {
		km_uuid u = {{9}};
		km_wr_uuid(w, &u);
	} else {
		km_wr_string(w, true, km_str_c("t"));
	}
	km_wr_array_len(w, true, 2);
	for (int p = 0; p < 2; p++) {
		km_wr_i32(w, p);
		km_wr_i16(w, p == 1 ? 6 : 0); /* NOT_LEADER_OR_FOLLOWER on partition 1 */
		km_wr_i64(w, 100);
		km_wr_i64(w, 100);
		km_wr_i64(w, 0);
		if (aborted && p == 0) {
			km_wr_array_len(w, true, 1);
			km_wr_i64(w, 5);
			km_wr_i64(w, 10);
			tags0(w, true);
		} else {
			km_wr_array_len(w, true, -1);
		}
		km_wr_i32(w, -1);
		km_wr_bytes(w, true, (km_bytes){recs, p == 0 ? (int32_t)record_bytes : 0});
		if (p == 1) {
			/* CurrentLeader tag 1: leader 2, epoch 7 */
			km_wr_uvarint(w, 1);
			km_wr_uvarint(w, 1);
			km_wr_uvarint(w, 9);
			km_wr_i32(w, 2);
			km_wr_i32(w, 7);
			km_wr_uvarint(w, 0);
		} else {
			tags0(w, true);
		}
	}
	tags0(w, true); /* topic tags */
	if (node_endpoints) {
		km_wr ne;
		km_wr_init(&ne);
		km_wr_array_len(&ne, true, 1);
		km_wr_i32(&ne, 2);
		km_wr_string(&ne, true, km_str_c("kafka-2.internal"));
		km_wr_i32(&ne, 9092);
		km_wr_string(&ne, true, KM_STR_NULL);
		tags0(&ne, true);
		km_wr_uvarint(w, 2);
		km_wr_uvarint(w, 0);
		km_wr_uvarint(w, (uint32_t)ne.len);
		km_wr_raw(w, ne.buf, ne.len);
		km_wr_uvarint(w, 5); /* an unknown tag, copied */
		km_wr_uvarint(w, 1);
		km_wr_i8(w, 0x33);
		km_wr_free(&ne);
	} else {
		tags0(w, true);
	}
	km_wr_patch_i32(w, start, (int32_t)(w->len - 4));
	free(recs);
}


/* An ApiVersions v4 response as a broker sends it: these keys, these finalized features. */
static void api_versions_frame(km_wr *w, const km_api_versions_response_api_version *keys, int nkeys,
			       km_api_versions_response_finalized_feature_key *fin, int nfin)
{
	km_api_versions_response m;
	km_api_versions_response_supported_feature_key sup[8];
	km_api_versions_response_init(&m);
	m.api_keys.count = nkeys;
	m.api_keys.items = (km_api_versions_response_api_version *)keys;
	m.finalized_features.count = nfin;
	m.finalized_features.items = fin;
	for (int i = 0; i < nfin; i++) {
		km_api_versions_response_supported_feature_key_init(&sup[i]);
		sup[i].name = fin[i].name;
		sup[i].min_version = 0;
		sup[i].max_version = fin[i].max_version_level;
	}
	m.supported_features.count = nfin;
	m.supported_features.items = sup;
	m.finalized_features_epoch = 7;
	km_api_versions_response_encode(w, 4, &m);
	assert_true(km_wr_ok(w));
}

static int16_t finalized_level(const km_api_versions_response *m, const char *name)
{
	for (int32_t i = 0; i < m->finalized_features.count; i++)
		if (km_str_eq_c(m->finalized_features.items[i].name, name))
			return m->finalized_features.items[i].max_version_level;
	return -1; /* dropped */
}

static int16_t supported_max(const km_api_versions_response *m, const char *name)
{
	for (int32_t i = 0; i < m->supported_features.count; i++)
		if (km_str_eq_c(m->supported_features.items[i].name, name))
			return m->supported_features.items[i].max_version;
	return -1;
}

static void rewrite_and_decode(const km_wr *in, km_rewrite_ctx *c, km_api_versions_response *back, km_arena *a,
			       km_wr *out)
{
	km_rd r;
	km_wr_init(out);
	assert_int_equal(km_rewrite_api_versions(in->buf, in->len, 4, c, out), KM_OK);
	km_arena_init(a, 0);
	km_api_versions_response_init(back);
	km_rd_init(&r, out->buf, out->len);
	assert_int_equal(km_api_versions_response_decode(&r, 4, back, a), KM_OK);
	assert_int_equal(km_rd_left(&r), 0);
}

/*
 * A feature level the proxy passes on must be usable with the versions it offers: a client that sees
 * transaction.version=2 sends Produce v12+, so with Produce capped below 12 the level is lowered.
 */
static void test_api_versions_features_follow_versions(void **state)
{
	km_proxy_apis *t = km_proxy_apis_new();
	km_proxy_api produce = *km_proxy_apis_find(t, KM_API_PRODUCE);
	km_api_versions_response_api_version keys[5];
	km_api_versions_response_finalized_feature_key fin[4];
	const char *names[4] = {"transaction.version", "group.version", "metadata.version", "share.version"};
	int16_t levels[4] = {2, 1, 27, 1};
	int16_t key_ids[5] = {KM_API_PRODUCE, KM_API_END_TXN, KM_API_TXN_OFFSET_COMMIT, KM_API_SHARE_FETCH,
			      KM_API_API_VERSIONS};
	km_api_versions_response back;
	learned l;
	km_rewrite_ctx c = ctx_for(&l);
	km_wr in, out;
	km_arena a;

	for (int i = 0; i < 5; i++) {
		km_api_versions_response_api_version_init(&keys[i]);
		keys[i].api_key = key_ids[i];
		keys[i].min_version = 0;
		keys[i].max_version = km_api_lookup(key_ids[i])->max_version;
	}
	for (int i = 0; i < 4; i++) {
		km_api_versions_response_finalized_feature_key_init(&fin[i]);
		fin[i].name = km_str_c(names[i]);
		fin[i].min_version_level = 1;
		fin[i].max_version_level = levels[i];
	}
	km_wr_init(&in);
	api_versions_frame(&in, keys, 5, fin, 4);

	/* Everything offered: transaction.version 2 passes; group.version needs ConsumerGroupHeartbeat,
	 * which this broker does not offer, so it goes; share.version needs ShareGroupHeartbeat too. */
	rewrite_and_decode(&in, &c, &back, &a, &out);
	assert_int_equal(finalized_level(&back, "transaction.version"), 2);
	assert_int_equal(finalized_level(&back, "metadata.version"), 27); /* no needs listed: unchanged */
	assert_int_equal(finalized_level(&back, "group.version"), -1);
	assert_int_equal(finalized_level(&back, "share.version"), -1);
	assert_int_equal(supported_max(&back, "transaction.version"), 2);
	assert_int_equal(back.finalized_features_epoch, 7);
	km_arena_free(&a);
	km_wr_free(&out);

	/* The proxy serves Produce only up to v11: transaction.version is lowered to 1, finalized and supported. */
	produce.max_version = 11;
	assert_int_equal(km_proxy_apis_set(t, &produce), KM_OK);
	c.apis = t;
	rewrite_and_decode(&in, &c, &back, &a, &out);
	assert_int_equal(finalized_level(&back, "transaction.version"), 1);
	assert_int_equal(supported_max(&back, "transaction.version"), 1);
	for (int32_t i = 0; i < back.api_keys.count; i++)
		if (back.api_keys.items[i].api_key == KM_API_PRODUCE)
			assert_int_equal(back.api_keys.items[i].max_version, 11);
	/* Every level passed on meets every need of the table. */
	for (size_t i = 0; i < km_feature_needs_count; i++) {
		const km_feature_need *n = &km_feature_needs[i];
		int16_t lvl = finalized_level(&back, n->feature);
		bool offered = false;
		if (lvl < n->level)
			continue;
		for (int32_t k = 0; k < back.api_keys.count; k++)
			if (back.api_keys.items[k].api_key == n->api_key && back.api_keys.items[k].max_version >= n->min_version)
				offered = true;
		assert_true(offered);
	}
	km_arena_free(&a);
	km_wr_free(&out);
	km_wr_free(&in);
	km_proxy_apis_free(t);
}

static km_err answer_nothing(km_req *rq)
{
	(void)rq;
	return KM_OK;
}

/* An API the proxy answers itself is advertised with its own versions, whatever the broker knows. */
static void test_api_versions_local_rows(void **state)
{
	km_proxy_apis *t = km_proxy_apis_new();
	km_proxy_api local = {.key = 32100, .name = "TestLocal", .min_version = 0, .max_version = 2,
			      .req = KM_REQ_LOCAL, .on_request = answer_nothing, .note = "test"};
	km_api_versions_response_api_version keys[2];
	km_api_versions_response back;
	learned l;
	km_rewrite_ctx c = ctx_for(&l);
	km_wr in, out;
	km_arena a;
	bool seen = false;

	assert_int_equal(km_proxy_apis_set(t, &local), KM_OK);
	assert_non_null(km_proxy_apis_find(t, 32100));
	assert_int_equal(km_proxy_api_max(km_proxy_apis_find(t, 32100)), 2);
	for (int i = 0; i < 2; i++)
		km_api_versions_response_api_version_init(&keys[i]);
	keys[0].api_key = KM_API_METADATA;
	keys[0].max_version = 13;
	keys[1].api_key = 32100; /* the broker claims the key too: the proxy's row wins */
	keys[1].max_version = 9;
	km_wr_init(&in);
	api_versions_frame(&in, keys, 2, NULL, 0);
	c.apis = t;
	rewrite_and_decode(&in, &c, &back, &a, &out);
	assert_int_equal(back.api_keys.count, 2 + KM_TEST_MIRROR_RPCS);
	/* the mirror RPCs are LOCAL rows: advertised at v0 whatever the broker says */
	for (int16_t k = KM_API_CREATE_MIRROR; k <= KM_API_LAST_MIRRORED_OFFSETS; k++) {
		bool found = false;
		for (int32_t i = 0; i < back.api_keys.count; i++)
			if (back.api_keys.items[i].api_key == k) {
				assert_int_equal(back.api_keys.items[i].min_version, 0);
				assert_int_equal(back.api_keys.items[i].max_version, 0);
				found = true;
			}
		assert_true(found);
	}
	for (int32_t i = 0; i < back.api_keys.count; i++)
		if (back.api_keys.items[i].api_key == 32100) {
			assert_int_equal(back.api_keys.items[i].min_version, 0);
			assert_int_equal(back.api_keys.items[i].max_version, 2);
			seen = true;
		}
	assert_true(seen);
	km_arena_free(&a);
	km_wr_free(&out);
	km_wr_free(&in);
	km_proxy_apis_free(t);
}

static void test_fetch_tail(void **state)
{
	for (int16_t v = 12; v <= KM_FETCH_RESPONSE_MAX_VERSION; v++) {
		for (int ne = 0; ne < 2; ne++) {
			km_wr w;
			struct evbuffer *b = evbuffer_new();
			size_t tags_off;
			km_wr_init(&w);
			fetch_frame(&w, v, ne, 3000, v == 14);
			/* Spread over several chains, as a socket read leaves it. */
			evbuffer_add(b, w.buf, 100);
			evbuffer_add(b, w.buf + 100, 1000);
			evbuffer_add(b, w.buf + 1100, w.len - 1100);
			assert_int_equal(fetch_tags_off(b, w.len, v, &tags_off), KM_OK);
			if (!ne) {
				assert_int_equal(tags_off, w.len - 1);
			} else {
				learned l;
				km_rewrite_ctx c = ctx_for(&l);
				km_wr out;
				km_rd r;
				uint32_t n, tag, sz;
				int32_t cnt, node, port;
				km_str host;
				km_wr_init(&out);
				assert_true(tags_off < w.len - 1);
				assert_int_equal(km_rewrite_node_endpoint_tags(w.buf + tags_off, w.len - tags_off, &c, &out), KM_OK);
				assert_null(memmem(out.buf, out.len, "kafka-2", 7));
				km_rd_init(&r, out.buf, out.len);
				km_rd_uvarint(&r, "n", &n);
				km_rd_uvarint(&r, "tag", &tag);
				km_rd_uvarint(&r, "sz", &sz);
				km_rd_array_len(&r, "ne", true, false, 1, &cnt);
				km_rd_i32(&r, "node", &node);
				km_rd_string(&r, "host", true, false, &host);
				km_rd_i32(&r, "port", &port);
				assert_true(km_rd_ok(&r));
				assert_int_equal(n, 2);
				assert_int_equal(tag, 0);
				assert_int_equal(cnt, 1);
				assert_int_equal(node, 2);
				assert_true(km_str_eq_c(host, "proxy.local"));
				assert_int_equal(port, 19002);
				/* the unknown tag 5 is still there, last */
				assert_int_equal(out.buf[out.len - 3], 5);
				assert_int_equal(l.n, 1);
				km_wr_free(&out);
			}
			/* A truncated frame is refused (never guessed). */
			assert_int_not_equal(fetch_tags_off(b, w.len - 40, v, &tags_off), KM_OK);
			evbuffer_free(b);
			km_wr_free(&w);
		}
	}
}

static void test_produce_tail(void **state)
{
	for (int ne = 0; ne < 2; ne++) {
		km_wr w;
		struct evbuffer *b = evbuffer_new();
		size_t start, tags_off;
		km_wr_init(&w);
		start = km_wr_reserve(&w, 4);
		km_wr_i32(&w, 9);
		tags0(&w, true);
		km_wr_array_len(&w, true, 1);
		km_wr_string(&w, true, km_str_c("orders"));
		km_wr_array_len(&w, true, 1);
		km_wr_i32(&w, 0);
		km_wr_i16(&w, 6);
		km_wr_i64(&w, -1);
		km_wr_i64(&w, -1);
		km_wr_i64(&w, -1);
		km_wr_array_len(&w, true, 1); /* record errors */
		km_wr_i32(&w, 0);
		km_wr_string(&w, true, km_str_c("bad"));
		tags0(&w, true);
		km_wr_string(&w, true, KM_STR_NULL);
		tags0(&w, true);
		tags0(&w, true);
		km_wr_i32(&w, 0); /* throttle */
		if (ne) {
			km_wr_uvarint(&w, 1);
			km_wr_uvarint(&w, 0);
			km_wr_uvarint(&w, 1 + 4 + 5 + 4 + 1 + 1);
			km_wr_array_len(&w, true, 1);
			km_wr_i32(&w, 0);
			km_wr_string(&w, true, km_str_c("k0.x"));
			km_wr_i32(&w, 9092);
			km_wr_string(&w, true, KM_STR_NULL);
			tags0(&w, true);
		} else {
			tags0(&w, true);
		}
		km_wr_patch_i32(&w, start, (int32_t)(w.len - 4));
		evbuffer_add(b, w.buf, w.len);
		assert_int_equal(km_rewrite_produce_top_tags(b, 0, w.len, 11, &tags_off), KM_OK);
		if (ne) {
			learned l;
			km_rewrite_ctx c = ctx_for(&l);
			km_wr out;
			km_wr_init(&out);
			assert_int_equal(km_rewrite_node_endpoint_tags(w.buf + tags_off, w.len - tags_off, &c, &out), KM_OK);
			assert_non_null(memmem(out.buf, out.len, "proxy.local", 11));
			assert_int_equal(c.rewritten, 1);
			/* A size that does not match the content is refused. */
			w.buf[tags_off + 2] += 1;
			assert_int_not_equal(km_rewrite_node_endpoint_tags(w.buf + tags_off, w.len - tags_off, &c, &out), KM_OK);
			km_wr_free(&out);
		} else {
			assert_int_equal(tags_off, w.len - 1);
		}
		evbuffer_free(b);
		km_wr_free(&w);
	}
}


/* docs/proxy.md embeds the API table, as km_proxy_apis_write_doc prints it, between markers. */
static void test_docs_show_the_table(void **state)
{
	struct evbuffer *gen = evbuffer_new();
	km_proxy_apis_write_doc(apis, gen);
	assert_doc_shows("proxy.md", "<!-- BEGIN API TABLE -->\n", "<!-- END API TABLE -->",
			 (const char *)evbuffer_pullup(gen, -1), evbuffer_get_length(gen), "paste the table printed here");
	evbuffer_free(gen);
}

static int group_setup(void **state)
{
	apis = km_proxy_apis_new();
	return apis ? 0 : -1;
}

static int group_teardown(void **state)
{
	km_proxy_apis_free(apis);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_metadata_all_versions),
		cmocka_unit_test(test_metadata_hostile_count),
		cmocka_unit_test(test_find_coordinator),
		cmocka_unit_test(test_describe_cluster),
		cmocka_unit_test(test_api_versions_intersection),
		cmocka_unit_test(test_api_versions_unsupported),
		cmocka_unit_test(test_header_versions),
		cmocka_unit_test(test_api_versions_broker_too_old),
		cmocka_unit_test(test_api_versions_features_follow_versions),
		cmocka_unit_test(test_api_versions_local_rows),
		cmocka_unit_test(test_docs_show_the_table),
		cmocka_unit_test(test_fetch_tail),
		cmocka_unit_test(test_produce_tail),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
