/*
 * Cross-check of the proxy's partial rewriters against the generated codecs: responses built with the
 * generated encoders for every version, rewritten, then decoded again with the generated decoders.
 */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/arena.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_versions_response.h"
#include "kmirror/msg/describe_cluster_response.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/find_coordinator_response.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/msg/produce_response.h"
#include "kmirror/net.h"
#include "kmirror/fetch.h"
#include "proxy/apis.h"
#include "proxy/rewrite.h"
#include "unit_fetch.h"

static int learned;
static void learn(void *arg, int32_t node, km_str host, int32_t port, km_str rack)
{
	learned++;
}

static km_proxy_apis *apis;

/* The offset of a response's top-level tags: Fetch through its walker, Produce through its own. */
static km_err top_tags(struct evbuffer *b, size_t len, int16_t key, int16_t v, size_t *off)
{
	return key == KM_API_FETCH ? fetch_tags_off(b, len, v, off) : km_rewrite_produce_top_tags(b, 0, len, v, off);
}

static km_rewrite_ctx ctx(void)
{
	km_rewrite_ctx c = {.host = "px.example", .port_base = 30000, .port_count = 50, .learn = learn, .apis = apis};
	learned = 0;
	return c;
}

static void test_metadata_generated(void **state)
{
	for (int16_t v = KM_METADATA_RESPONSE_MIN_VERSION; v <= KM_METADATA_RESPONSE_MAX_VERSION; v++) {
		km_metadata_response m, back;
		km_metadata_response_broker brokers[3];
		km_metadata_response_topic topic;
		km_metadata_response_partition part;
		int32_t replicas[3] = {0, 1, 2};
		km_wr in, out;
		km_rd r;
		km_arena a;
		km_rewrite_ctx c = ctx();

		km_metadata_response_init(&m);
		m.throttle_time_ms = 5;
		for (int i = 0; i < 3; i++) {
			km_metadata_response_broker_init(&brokers[i]);
			brokers[i].node_id = i;
			brokers[i].host = km_str_c(i == 1 ? "10.1.2.3" : "kafka-x.cluster.local");
			brokers[i].port = 9092 + i;
			brokers[i].rack = v >= 1 ? km_str_c("az-1") : KM_STR_NULL;
		}
		m.brokers.count = 3;
		m.brokers.items = brokers;
		m.cluster_id = v >= 2 ? km_str_c("abc") : KM_STR_NULL;
		m.controller_id = 1;
		km_metadata_response_topic_init(&topic);
		topic.name = km_str_c("payments");
		km_metadata_response_partition_init(&part);
		part.leader_id = 2;
		part.replica_nodes.count = 3;
		part.replica_nodes.items = replicas;
		part.isr_nodes.count = 3;
		part.isr_nodes.items = replicas;
		part.offline_replicas.count = 0;
		topic.partitions.count = 1;
		topic.partitions.items = &part;
		m.topics.count = 1;
		m.topics.items = &topic;

		km_wr_init(&in);
		km_wr_init(&out);
		km_metadata_response_encode(&in, v, &m);
		assert_true(km_wr_ok(&in));
		assert_int_equal(km_rewrite_metadata(in.buf, in.len, v, &c, &out), KM_OK);
		assert_int_equal(learned, 3);

		km_arena_init(&a, 0);
		km_metadata_response_init(&back);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_metadata_response_decode(&r, v, &back, &a), KM_OK);
		assert_int_equal(km_rd_left(&r), 0);
		assert_int_equal(back.brokers.count, 3);
		for (int i = 0; i < 3; i++) {
			assert_int_equal(back.brokers.items[i].node_id, i);
			assert_true(km_str_eq_c(back.brokers.items[i].host, "px.example"));
			assert_int_equal(back.brokers.items[i].port, 30000 + i);
			if (v >= 1)
				assert_true(km_str_eq_c(back.brokers.items[i].rack, "az-1"));
		}
		assert_int_equal(back.controller_id, v >= 1 ? 1 : -1);
		assert_int_equal(back.topics.count, 1);
		assert_true(km_str_eq_c(back.topics.items[0].name, "payments"));
		assert_int_equal(back.topics.items[0].partitions.items[0].leader_id, 2);
		assert_null(memmem(out.buf, out.len, "kafka-x", 7));
		assert_null(memmem(out.buf, out.len, "10.1.2.3", 8));
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

static void test_find_coordinator_generated(void **state)
{
	for (int16_t v = KM_FIND_COORDINATOR_RESPONSE_MIN_VERSION; v <= KM_FIND_COORDINATOR_RESPONSE_MAX_VERSION; v++) {
		km_find_coordinator_response m, back;
		km_find_coordinator_response_coordinator co[2];
		km_wr in, out;
		km_rd r;
		km_arena a;
		km_rewrite_ctx c = ctx();

		km_find_coordinator_response_init(&m);
		if (v <= 3) {
			m.node_id = 4;
			m.host = km_str_c("coordinator.internal");
			m.port = 9999;
		} else {
			for (int i = 0; i < 2; i++) {
				km_find_coordinator_response_coordinator_init(&co[i]);
				co[i].key = km_str_c(i ? "txn-1" : "group-1");
				co[i].node_id = i ? -1 : 4;
				co[i].host = km_str_c(i ? "" : "coordinator.internal");
				co[i].port = i ? -1 : 9999;
				co[i].error_code = i ? 15 : 0;
			}
			m.coordinators.count = 2;
			m.coordinators.items = co;
		}
		km_wr_init(&in);
		km_wr_init(&out);
		km_find_coordinator_response_encode(&in, v, &m);
		assert_true(km_wr_ok(&in));
		assert_int_equal(km_rewrite_find_coordinator(in.buf, in.len, v, &c, &out), KM_OK);
		km_arena_init(&a, 0);
		km_find_coordinator_response_init(&back);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_find_coordinator_response_decode(&r, v, &back, &a), KM_OK);
		assert_int_equal(km_rd_left(&r), 0);
		if (v <= 3) {
			assert_int_equal(back.node_id, 4);
			assert_true(km_str_eq_c(back.host, "px.example"));
			assert_int_equal(back.port, 30004);
		} else {
			assert_int_equal(back.coordinators.count, 2);
			assert_true(km_str_eq_c(back.coordinators.items[0].host, "px.example"));
			assert_int_equal(back.coordinators.items[0].port, 30004);
			assert_true(km_str_eq_c(back.coordinators.items[1].key, "txn-1"));
			assert_int_equal(back.coordinators.items[1].node_id, -1);
			assert_int_equal(back.coordinators.items[1].port, -1);
			assert_int_equal(back.coordinators.items[1].error_code, 15);
		}
		assert_null(memmem(out.buf, out.len, "coordinator.internal", 20));
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

static void test_describe_cluster_generated(void **state)
{
	for (int16_t v = KM_DESCRIBE_CLUSTER_RESPONSE_MIN_VERSION; v <= KM_DESCRIBE_CLUSTER_RESPONSE_MAX_VERSION; v++) {
		km_describe_cluster_response m, back;
		km_describe_cluster_response_describe_cluster_broker b[2];
		km_wr in, out;
		km_rd r;
		km_arena a;
		km_rewrite_ctx c = ctx();

		km_describe_cluster_response_init(&m);
		m.cluster_id = km_str_c("cid");
		m.controller_id = 7;
		for (int i = 0; i < 2; i++) {
			km_describe_cluster_response_describe_cluster_broker_init(&b[i]);
			b[i].broker_id = 7 + i;
			b[i].host = km_str_c("172.16.0.9");
			b[i].port = 9092;
		}
		m.brokers.count = 2;
		m.brokers.items = b;
		km_wr_init(&in);
		km_wr_init(&out);
		km_describe_cluster_response_encode(&in, v, &m);
		assert_true(km_wr_ok(&in));
		assert_int_equal(km_rewrite_describe_cluster(in.buf, in.len, v, &c, &out), KM_OK);
		km_arena_init(&a, 0);
		km_describe_cluster_response_init(&back);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_describe_cluster_response_decode(&r, v, &back, &a), KM_OK);
		assert_int_equal(km_rd_left(&r), 0);
		assert_int_equal(back.brokers.count, 2);
		assert_int_equal(back.brokers.items[1].port, 30008);
		assert_true(km_str_eq_c(back.brokers.items[1].host, "px.example"));
		assert_true(km_str_eq_c(back.cluster_id, "cid"));
		assert_int_equal(learned, 2);
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

static void test_api_versions_generated(void **state)
{
	for (int16_t v = KM_API_VERSIONS_RESPONSE_MIN_VERSION; v <= KM_API_VERSIONS_RESPONSE_MAX_VERSION; v++) {
		km_api_versions_response m, back;
		km_api_versions_response_api_version keys[4];
		km_api_versions_response_supported_feature_key feat;
		km_wr in, out;
		km_rd r;
		km_arena a;

		km_api_versions_response_init(&m);
		for (int i = 0; i < 4; i++)
			km_api_versions_response_api_version_init(&keys[i]);
		keys[0].api_key = KM_API_PRODUCE;
		keys[0].min_version = 3;
		keys[0].max_version = 99;
		keys[1].api_key = 52; /* Vote: controller only, never advertised */
		keys[1].max_version = 1;
		keys[2].api_key = KM_API_API_VERSIONS;
		keys[2].max_version = 4;
		keys[3].api_key = KM_API_SASL_HANDSHAKE; /* v0 sends raw tokens: the proxy offers v1 only */
		keys[3].max_version = 1;
		m.api_keys.count = 4;
		m.api_keys.items = keys;
		m.throttle_time_ms = 0;
		km_api_versions_response_supported_feature_key_init(&feat);
		feat.name = km_str_c("metadata.version");
		feat.min_version = 1;
		feat.max_version = 27;
		m.supported_features.count = 1;
		m.supported_features.items = &feat;
		km_wr_init(&in);
		km_wr_init(&out);
		km_api_versions_response_encode(&in, v, &m);
		assert_true(km_wr_ok(&in));
		{
			km_rewrite_ctx c = ctx();
			assert_int_equal(km_rewrite_api_versions(in.buf, in.len, v, &c, &out), KM_OK);
		}
		km_arena_init(&a, 0);
		km_api_versions_response_init(&back);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_api_versions_response_decode(&r, v, &back, &a), KM_OK);
		assert_int_equal(km_rd_left(&r), 0);
		assert_int_equal(back.api_keys.count, 3 + 10); /* and the ten mirror RPCs (LOCAL rows) */
		assert_int_equal(back.api_keys.items[2].api_key, KM_API_SASL_HANDSHAKE);
		/* Shown from the broker's v0 (older librdkafka looks for it there); a v0 request is refused all the same. */
		assert_int_equal(back.api_keys.items[2].min_version, 0);
		assert_int_equal(back.api_keys.items[2].max_version, 1);
		assert_int_equal(back.api_keys.items[0].api_key, KM_API_PRODUCE);
		assert_int_equal(back.api_keys.items[0].min_version, 3);
		assert_int_equal(back.api_keys.items[0].max_version, km_api_lookup(KM_API_PRODUCE)->max_version);
		assert_int_equal(back.api_keys.items[1].api_key, KM_API_API_VERSIONS);
		if (v >= 3) {
			/* the tagged features survive */
			assert_int_equal(back.supported_features.count, 1);
			assert_true(km_str_eq_c(back.supported_features.items[0].name, "metadata.version"));
		}
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

/* Produce/Fetch: find the tags in a generated frame, rewrite them, splice, decode the whole again. */
static void splice_and_check(km_wr *frame_body, int16_t key, int16_t v, bool expect_tags,
			     void (*check)(const uint8_t *, size_t, int16_t))
{
	struct evbuffer *b = evbuffer_new();
	uint8_t hdr[9];
	size_t tags_off, total = 9 + frame_body->len;
	km_rewrite_ctx c = ctx();
	km_wr tail, whole;
	uint8_t *copy;

	km_put_be32(hdr, (uint32_t)(5 + frame_body->len));
	km_put_be32(hdr + 4, 77);
	hdr[8] = 0;
	evbuffer_add(b, hdr, 9);
	/* in pieces, so the walker crosses chain boundaries */
	for (size_t off = 0; off < frame_body->len; off += 37) {
		size_t n = frame_body->len - off < 37 ? frame_body->len - off : 37;
		evbuffer_add(b, frame_body->buf + off, n);
	}
	assert_int_equal(top_tags(b, total, key, v, &tags_off), KM_OK);
	if (!expect_tags) {
		assert_int_equal(tags_off, total - 1);
		evbuffer_free(b);
		return;
	}
	copy = malloc(total);
	evbuffer_copyout(b, copy, total);
	km_wr_init(&tail);
	assert_int_equal(km_rewrite_node_endpoint_tags(copy + tags_off, total - tags_off, &c, &tail), KM_OK);
	km_wr_init(&whole);
	km_wr_raw(&whole, copy + 9, tags_off - 9);
	km_wr_raw(&whole, tail.buf, tail.len);
	check(whole.buf, whole.len, v);
	assert_null(memmem(whole.buf, whole.len, "leader.internal", 15));
	free(copy);
	km_wr_free(&tail);
	km_wr_free(&whole);
	evbuffer_free(b);
}

static void check_produce(const uint8_t *p, size_t len, int16_t v)
{
	km_produce_response back;
	km_arena a;
	km_rd r;
	km_arena_init(&a, 0);
	km_produce_response_init(&back);
	km_rd_init(&r, p, len);
	assert_int_equal(km_produce_response_decode(&r, v, &back, &a), KM_OK);
	assert_int_equal(km_rd_left(&r), 0);
	assert_int_equal(back.node_endpoints.count, 1);
	assert_int_equal(back.node_endpoints.items[0].node_id, 3);
	assert_true(km_str_eq_c(back.node_endpoints.items[0].host, "px.example"));
	assert_int_equal(back.node_endpoints.items[0].port, 30003);
	assert_int_equal(back.responses.items[0].partition_responses.items[0].current_leader.leader_id, 3);
	km_arena_free(&a);
}

static void test_produce_generated(void **state)
{
	for (int16_t v = 9; v <= KM_PRODUCE_RESPONSE_MAX_VERSION; v++) {
		for (int ne = 0; ne < 2; ne++) {
			km_produce_response m;
			km_produce_response_topic_produce_response t;
			km_produce_response_partition_produce_response p;
			km_produce_response_node_endpoint e;
			km_wr w;
			km_produce_response_init(&m);
			km_produce_response_topic_produce_response_init(&t);
			km_produce_response_partition_produce_response_init(&p);
			t.name = km_str_c("orders");
			p.error_code = 6;
			p.record_errors.count = 0;
			if (v >= 10) {
				p.current_leader.leader_id = 3;
				p.current_leader.leader_epoch = 9;
			}
			t.partition_responses.count = 1;
			t.partition_responses.items = &p;
			m.responses.count = 1;
			m.responses.items = &t;
			if (ne && v >= 10) {
				km_produce_response_node_endpoint_init(&e);
				e.node_id = 3;
				e.host = km_str_c("leader.internal");
				e.port = 9095;
				m.node_endpoints.count = 1;
				m.node_endpoints.items = &e;
			}
			km_wr_init(&w);
			km_produce_response_encode(&w, v, &m);
			assert_true(km_wr_ok(&w));
			splice_and_check(&w, KM_API_PRODUCE, v, ne && v >= 10, check_produce);
			km_wr_free(&w);
		}
	}
}

static void check_fetch(const uint8_t *p, size_t len, int16_t v)
{
	km_fetch_response back;
	km_arena a;
	km_rd r;
	km_arena_init(&a, 0);
	km_fetch_response_init(&back);
	km_rd_init(&r, p, len);
	assert_int_equal(km_fetch_response_decode(&r, v, &back, &a), KM_OK);
	assert_int_equal(km_rd_left(&r), 0);
	assert_int_equal(back.node_endpoints.count, 1);
	assert_true(km_str_eq_c(back.node_endpoints.items[0].host, "px.example"));
	assert_int_equal(back.node_endpoints.items[0].port, 30003);
	assert_int_equal(back.responses.items[0].partitions.count, 2);
	assert_int_equal(back.responses.items[0].partitions.items[0].records.len, 1000);
	assert_int_equal(back.responses.items[0].partitions.items[0].aborted_transactions.count, 2);
	km_arena_free(&a);
}

static void test_fetch_generated(void **state)
{
	uint8_t recs[1000];
	memset(recs, 0, sizeof(recs)); /* zero bytes everywhere: a tail heuristic would be fooled */
	for (int16_t v = 12; v <= KM_FETCH_RESPONSE_MAX_VERSION; v++) {
		for (int ne = 0; ne < 2; ne++) {
			km_fetch_response m;
			km_fetch_response_fetchable_topic_response t;
			km_fetch_response_partition_data p[2];
			km_fetch_response_aborted_transaction ab[2];
			km_fetch_response_node_endpoint e;
			km_wr w;
			km_fetch_response_init(&m);
			km_fetch_response_fetchable_topic_response_init(&t);
			t.topic = km_str_c("events");
			t.topic_id.b[0] = 1;
			for (int i = 0; i < 2; i++) {
				km_fetch_response_partition_data_init(&p[i]);
				km_fetch_response_aborted_transaction_init(&ab[i]);
				p[i].partition_index = i;
				ab[i].producer_id = 100 + i;
			}
			p[0].records = (km_bytes){recs, sizeof(recs)};
			p[0].aborted_transactions.count = 2;
			p[0].aborted_transactions.items = ab;
			p[1].error_code = 6;
			p[1].current_leader.leader_id = 3;
			p[1].current_leader.leader_epoch = 2;
			p[1].diverging_epoch.epoch = 1;
			p[1].diverging_epoch.end_offset = 50;
			t.partitions.count = 2;
			t.partitions.items = p;
			m.responses.count = 1;
			m.responses.items = &t;
			if (ne && v >= 16) {
				km_fetch_response_node_endpoint_init(&e);
				e.node_id = 3;
				e.host = km_str_c("leader.internal");
				e.port = 9095;
				m.node_endpoints.count = 1;
				m.node_endpoints.items = &e;
			}
			km_wr_init(&w);
			km_fetch_response_encode(&w, v, &m);
			assert_true(km_wr_ok(&w));
			splice_and_check(&w, KM_API_FETCH, v, ne && v >= 16, check_fetch);
			km_wr_free(&w);
		}
	}
}

/* Stream a whole Fetch frame through the walker in random pieces, as the session's stream_step does. */
static size_t stream_sim(const uint8_t *frame, size_t len, int16_t v, unsigned *seed, uint8_t *out,
			 size_t *sent_before_end)
{
	struct evbuffer *in = evbuffer_new();
	km_fetch_walk w;
	size_t fed = 0, sent = 0;
	km_rewrite_ctx c = ctx();

	km_fetch_walk_init(&w, v, len);
	*sent_before_end = 0;
	for (;;) {
		km_fw_event ev;
		size_t have_end, upto;
		if (fed < len) {
			size_t n;
			*seed = *seed * 1103515245u + 12345u;
			n = 1 + (*seed >> 8) % 700;
			if (n > len - fed)
				n = len - fed;
			evbuffer_add(in, frame + fed, n);
			fed += n;
		}
		while ((ev = km_fetch_walk_next(&w, in, sent)) == KM_FW_PARTITION || ev == KM_FW_BATCH)
			;
		assert_int_not_equal(ev, KM_FW_ERROR);
		have_end = sent + evbuffer_get_length(in);
		upto = w.pos < have_end ? w.pos : have_end;
		if (upto > sent) {
			evbuffer_remove(in, out + sent, upto - sent);
			sent = upto;
			if (fed < len)
				*sent_before_end = sent;
		}
		if (ev == KM_FW_END && have_end == len) {
			size_t tlen = len - w.pos;
			uint8_t *tags = evbuffer_pullup(in, (ev_ssize_t)tlen);
			assert_int_equal(km_rewrite_node_endpoint_tags_same_size(tags, tlen, &c, out + sent), KM_OK);
			sent += tlen;
			break;
		}
		assert_true(fed < len || ev == KM_FW_END); /* with everything fed, the walk must finish */
	}
	evbuffer_free(in);
	return sent;
}

static void test_fetch_streaming_walk(void **state)
{
	static const char *hosts[] = {"k", "px.exampl", "broker-17.kafka.internal.example.com"};
	uint8_t recs[5000];
	unsigned seed = 99;
	for (size_t i = 0; i < sizeof(recs); i++)
		recs[i] = (uint8_t)(i * 7);
	for (int16_t v = 12; v <= KM_FETCH_RESPONSE_MAX_VERSION; v++) {
		for (int h = -1; h < 3; h++) {
			for (int round = 0; round < 5; round++) {
				km_fetch_response m, back;
				km_fetch_response_fetchable_topic_response t[2];
				km_fetch_response_partition_data p[3];
				km_fetch_response_aborted_transaction ab;
				km_fetch_response_node_endpoint e;
				km_wr w;
				uint8_t *out;
				size_t outlen, early;
				km_arena a;
				km_rd r;

				km_fetch_response_init(&m);
				for (int i = 0; i < 2; i++) {
					km_fetch_response_fetchable_topic_response_init(&t[i]);
					t[i].topic = km_str_c(i ? "b" : "a");
					t[i].topic_id.b[0] = (uint8_t)(i + 1);
				}
				for (int i = 0; i < 3; i++) {
					km_fetch_response_partition_data_init(&p[i]);
					p[i].partition_index = i;
					p[i].records = (km_bytes){recs, (int32_t)(1000 + 1500 * i)};
				}
				km_fetch_response_aborted_transaction_init(&ab);
				p[1].aborted_transactions.count = 1;
				p[1].aborted_transactions.items = &ab;
				p[2].current_leader.leader_id = 4;
				p[2].error_code = 6;
				t[0].partitions.count = 2;
				t[0].partitions.items = p;
				t[1].partitions.count = 1;
				t[1].partitions.items = p + 2;
				m.responses.count = 2;
				m.responses.items = t;
				if (h >= 0 && v >= 16) {
					km_fetch_response_node_endpoint_init(&e);
					e.node_id = 4;
					e.host = km_str_c(hosts[h]);
					e.port = 9092;
					m.node_endpoints.count = 1;
					m.node_endpoints.items = &e;
				}
				km_wr_init(&w);
				km_wr_i32(&w, 0);
				km_wr_i32(&w, 5);
				km_wr_uvarint(&w, 0);
				km_fetch_response_encode(&w, v, &m);
				km_wr_patch_i32(&w, 0, (int32_t)(w.len - 4));
				assert_true(km_wr_ok(&w));
				out = malloc(w.len);
				outlen = stream_sim(w.buf, w.len, v, &seed, out, &early);
				assert_int_equal(outlen, w.len);
				/* most of the frame went out before its end had arrived */
				assert_true(early > w.len / 2);
				km_arena_init(&a, 0);
				km_fetch_response_init(&back);
				km_rd_init(&r, out + 9, outlen - 9);
				assert_int_equal(km_fetch_response_decode(&r, v, &back, &a), KM_OK);
				assert_int_equal(km_rd_left(&r), 0);
				assert_int_equal(back.responses.count, 2);
				assert_int_equal(back.responses.items[1].partitions.items[0].records.len, 4000);
				assert_memory_equal(back.responses.items[1].partitions.items[0].records.p, recs, 4000);
				if (h >= 0 && v >= 16 && strlen(hosts[h]) >= strlen("px.example")) {
					/* room for the proxy's endpoint: rewritten */
					assert_int_equal(back.node_endpoints.count, 1);
					assert_true(km_str_eq_c(back.node_endpoints.items[0].host, "px.example"));
					assert_int_equal(back.node_endpoints.items[0].port, 30004);
				} else {
					/* none, or no room: dropped (the client refreshes metadata instead) */
					assert_int_equal(back.node_endpoints.count, 0);
				}
				assert_null(memmem(out, outlen, "broker-17", 9));
				km_arena_free(&a);
				free(out);
				km_wr_free(&w);
			}
		}
	}
}

/* Mutated and truncated inputs: every rewriter must fail cleanly or succeed, never read out of bounds. */
static void test_mutations_never_crash(void **state)
{
	km_metadata_response m;
	km_metadata_response_broker b;
	km_fetch_response f;
	km_fetch_response_fetchable_topic_response t;
	km_fetch_response_partition_data p;
	km_fetch_response_node_endpoint e;
	uint8_t recs[64] = {1, 2, 3};
	km_wr meta, fetch;
	unsigned seed = getenv("KM_TEST_SEED") ? (unsigned)strtoul(getenv("KM_TEST_SEED"), NULL, 10) : 12345;
	int ok = 0, failed = 0;

	km_log_set_level(KM_LOG_ERROR); /* thousands of expected "cannot rewrite" warnings */
	km_metadata_response_init(&m);
	km_metadata_response_broker_init(&b);
	b.host = km_str_c("broker.internal");
	b.port = 9092;
	m.brokers.count = 1;
	m.brokers.items = &b;
	m.topics.count = 0;
	km_fetch_response_init(&f);
	km_fetch_response_fetchable_topic_response_init(&t);
	km_fetch_response_partition_data_init(&p);
	km_fetch_response_node_endpoint_init(&e);
	p.records = (km_bytes){recs, sizeof(recs)};
	t.partitions.count = 1;
	t.partitions.items = &p;
	f.responses.count = 1;
	f.responses.items = &t;
	e.host = km_str_c("broker.internal");
	f.node_endpoints.count = 1;
	f.node_endpoints.items = &e;
	km_wr_init(&meta);
	km_wr_init(&fetch);
	km_metadata_response_encode(&meta, 12, &m);
	km_wr_raw(&fetch, "\0\0\0\0\0\0\0\x2a\0", 9); /* size (patched), correlation id, header tags */
	km_fetch_response_encode(&fetch, 17, &f);
	km_wr_patch_i32(&fetch, 0, (int32_t)(fetch.len - 4));
	assert_true(km_wr_ok(&meta) && km_wr_ok(&fetch));

	for (int i = 0; i < 20000; i++) {
		uint8_t mbuf[512], fbuf[512];
		size_t mlen = meta.len < sizeof(mbuf) ? meta.len : sizeof(mbuf);
		size_t flen = fetch.len < sizeof(fbuf) ? fetch.len : sizeof(fbuf);
		km_rewrite_ctx c = ctx();
		km_wr out;
		struct evbuffer *eb;
		size_t off;
		/* each round: a few random bytes changed, and a random truncation */
		memcpy(mbuf, meta.buf, mlen);
		memcpy(fbuf, fetch.buf, flen);
		for (int k = 0; k < 3; k++) {
			seed = seed * 1103515245u + 12345u;
			mbuf[(seed >> 8) % mlen] = (uint8_t)(seed >> 16);
			seed = seed * 1103515245u + 12345u;
			fbuf[9 + (seed >> 8) % (flen - 9)] = (uint8_t)(seed >> 16);
		}
		seed = seed * 1103515245u + 12345u;
		if (seed & 1)
			mlen = (seed >> 4) % (mlen + 1);
		km_wr_init(&out);
		if (km_rewrite_metadata(mbuf, mlen, 12, &c, &out) == KM_OK)
			ok++;
		else
			failed++;
		km_wr_free(&out);
		km_wr_init(&out);
		(void)km_rewrite_find_coordinator(mbuf, mlen, 6, &c, &out);
		km_wr_free(&out);
		km_wr_init(&out);
		(void)km_rewrite_describe_cluster(mbuf, mlen, 1, &c, &out);
		km_wr_free(&out);
		km_wr_init(&out);
		(void)km_rewrite_api_versions(mbuf, mlen, 4, &c, &out);
		km_wr_free(&out);
		eb = evbuffer_new();
		evbuffer_add(eb, fbuf, flen);
		if (top_tags(eb, flen, KM_API_FETCH, 17, &off) == KM_OK) {
			assert_true(off < flen);
			km_wr_init(&out);
			(void)km_rewrite_node_endpoint_tags(fbuf + off, flen - off, &c, &out);
			km_wr_free(&out);
		}
		(void)km_rewrite_produce_top_tags(eb, 0, flen, 11, &off);
		if (top_tags(eb, flen, KM_API_FETCH, 17, &off) == KM_OK && flen - off <= 512) {
			uint8_t fixed[512];
			assert_true(off < flen);
			(void)km_rewrite_node_endpoint_tags_same_size(fbuf + off, flen - off, &c, fixed);
		}
		evbuffer_free(eb);
	}
	/* both outcomes happen: the mutations are not all harmless or all fatal */
	assert_true(ok > 0);
	assert_true(failed > 0);
	km_wr_free(&meta);
	km_wr_free(&fetch);
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
		cmocka_unit_test(test_metadata_generated),     cmocka_unit_test(test_find_coordinator_generated),
		cmocka_unit_test(test_describe_cluster_generated), cmocka_unit_test(test_api_versions_generated),
		cmocka_unit_test(test_produce_generated),      cmocka_unit_test(test_fetch_generated),
		cmocka_unit_test(test_mutations_never_crash),
		cmocka_unit_test(test_fetch_streaming_walk),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
