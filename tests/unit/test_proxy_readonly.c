/* Unit tests of the read-only hooks' walk, split and merge, on frames built with the generated codecs and a fake lookup. */
#include <stdio.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kmirror/msg/delete_topics_request.h"
#include "kmirror/msg/delete_topics_response.h"
#include "kmirror/msg/produce_request.h"
#include "kmirror/msg/produce_response.h"
#include "proxy/readonly.h"

static const km_uuid RO_ID = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
static const km_uuid OK_ID = {{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}};

/* "ro" (or RO_ID) is read-only on every partition; "__mirror_state" is the store's. */
static bool fake_active(void *arg)
{
	(void)arg;
	return true;
}

static void fake_check(void *arg, km_str name, const km_uuid *id, int32_t partition, km_ro_op op, km_ro_verdict *v)
{
	(void)arg;
	(void)partition;
	(void)op;
	v->code = KM_OK;
	if ((name.len >= 0 && km_str_eq_c(name, "ro")) || (id && memcmp(id->b, RO_ID.b, 16) == 0)) {
		v->code = KM_MIRROR_READ_ONLY_TOPIC;
		snprintf(v->message, sizeof(v->message), "topic ro is read-only");
		snprintf(v->name, sizeof(v->name), "ro");
	} else if (name.len >= 0 && km_str_eq_c(name, "__mirror_state")) {
		v->code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
		snprintf(v->message, sizeof(v->message), "written only by kmirrord");
	}
}

static const km_ro_lookup lookup = {fake_active, fake_check, NULL};

static void header(km_wr *w, int16_t key, int16_t v, bool flex)
{
	km_wr_i16(w, key);
	km_wr_i16(w, v);
	km_wr_i32(w, 77);
	km_wr_string(w, false, km_str_c("cli"));
	if (flex)
		km_wr_uvarint(w, 0);
}

static const uint8_t BATCH[300] = {42}; /* a record set's bytes: never looked into */

/* Produce: topics ro (partitions 0, 1) and ok (partition 2), or by id in v13. */
static void build_produce(km_wr *w, int16_t v)
{
	km_produce_request rq;
	km_produce_request_topic_produce_data t[2];
	km_produce_request_partition_produce_data p[3];
	km_produce_request_init(&rq);
	for (int i = 0; i < 3; i++) {
		km_produce_request_partition_produce_data_init(&p[i]);
		p[i].index = i;
		p[i].records = (km_bytes){BATCH, (int32_t)sizeof(BATCH)};
	}
	for (int i = 0; i < 2; i++)
		km_produce_request_topic_produce_data_init(&t[i]);
	t[0].name = km_str_c("ro");
	t[0].topic_id = RO_ID;
	t[0].partition_data.count = 2;
	t[0].partition_data.items = p;
	t[1].name = km_str_c("ok");
	t[1].topic_id = OK_ID;
	t[1].partition_data.count = 1;
	t[1].partition_data.items = &p[2];
	rq.acks = -1;
	rq.timeout_ms = 3000;
	rq.transactional_id = km_str_c("txn-1");
	rq.topic_data.count = 2;
	rq.topic_data.items = t;
	header(w, KM_API_PRODUCE, v, v >= 9);
	km_produce_request_encode(w, v, &rq);
}

static void test_produce_split_merge(void **state)
{
	static const int16_t versions[] = {3, 8, 9, 11, 13};
	(void)state;
	for (size_t vi = 0; vi < sizeof(versions) / sizeof(versions[0]); vi++) {
		int16_t v = versions[vi];
		km_wr w, bw, mw;
		km_req_header h = {.api_key = KM_API_PRODUCE, .api_version = v};
		km_ro_produce *pl;
		struct evbuffer *out = evbuffer_new();
		km_produce_request fwd;
		km_produce_response br, merged;
		km_produce_response_topic_produce_response bt;
		km_produce_response_partition_produce_response bp;
		km_arena a;
		km_rd r;
		uint8_t *flat;
		size_t flen, hdr = 8 + 2 + 3 + (v >= 9 ? 1 : 0);

		km_wr_init(&w);
		build_produce(&w, v);
		assert_true(km_wr_ok(&w));
		assert_int_equal(km_ro_produce_walk(w.buf, w.len, &h, &lookup, &pl), KM_OK);
		assert_int_equal(pl->nparts, 3);
		assert_int_equal(pl->nrefused, 2);
		assert_int_equal(pl->acks, -1);

		/* The rewritten request holds topic ok only, its batch unchanged. */
		assert_int_equal(km_ro_produce_rewrite(pl, w.buf, out, NULL), KM_OK);
		flen = evbuffer_get_length(out);
		flat = evbuffer_pullup(out, -1);
		assert_memory_equal(flat, w.buf, hdr);
		km_arena_init(&a, 1 << 20);
		km_produce_request_init(&fwd);
		km_rd_init(&r, flat + hdr, flen - hdr);
		assert_int_equal(km_produce_request_decode(&r, v, &fwd, &a), KM_OK);
		assert_int_equal(km_rd_left(&r), 0);
		assert_true(km_str_eq_c(fwd.transactional_id, "txn-1"));
		assert_int_equal(fwd.topic_data.count, 1);
		if (v >= 13)
			assert_memory_equal(fwd.topic_data.items[0].topic_id.b, OK_ID.b, 16);
		else
			assert_true(km_str_eq_c(fwd.topic_data.items[0].name, "ok"));
		assert_int_equal(fwd.topic_data.items[0].partition_data.count, 1);
		assert_int_equal(fwd.topic_data.items[0].partition_data.items[0].index, 2);
		assert_memory_equal(fwd.topic_data.items[0].partition_data.items[0].records.p, BATCH, sizeof(BATCH));

		/* The broker answers ok-2; the merge has ro-0, ro-1 refused and ok-2 as the broker said, in request order. */
		km_produce_response_init(&br);
		km_produce_response_topic_produce_response_init(&bt);
		km_produce_response_partition_produce_response_init(&bp);
		bp.index = 2;
		bp.base_offset = 1234;
		bt.name = km_str_c("ok");
		bt.topic_id = OK_ID;
		bt.partition_responses.count = 1;
		bt.partition_responses.items = &bp;
		br.responses.count = 1;
		br.responses.items = &bt;
		br.throttle_time_ms = 5;
		km_wr_init(&bw);
		km_produce_response_encode(&bw, v, &br);
		km_wr_init(&mw);
		assert_int_equal(km_ro_produce_merge(pl, bw.buf, bw.len, v >= 9 ? bw.buf + bw.len - 1 : NULL, v >= 9 ? 1 : 0,
						     NULL, &mw),
				 KM_OK);
		km_produce_response_init(&merged);
		km_rd_init(&r, mw.buf, mw.len);
		assert_int_equal(km_produce_response_decode(&r, v, &merged, &a), KM_OK);
		assert_int_equal(km_rd_left(&r), 0);
		assert_int_equal(merged.throttle_time_ms, 5);
		assert_int_equal(merged.responses.count, 2);
		if (v < 13)
			assert_true(km_str_eq_c(merged.responses.items[0].name, "ro"));
		assert_int_equal(merged.responses.items[0].partition_responses.count, 2);
		for (int i = 0; i < 2; i++) {
			const km_produce_response_partition_produce_response *mp =
				&merged.responses.items[0].partition_responses.items[i];
			assert_int_equal(mp->index, i);
			assert_int_equal(mp->error_code, KM_MIRROR_READ_ONLY_TOPIC);
			assert_int_equal(mp->base_offset, -1);
			if (v >= 8)
				assert_true(km_str_eq_c(mp->error_message, "topic ro is read-only"));
		}
		assert_int_equal(merged.responses.items[1].partition_responses.items[0].error_code, 0);
		assert_int_equal(merged.responses.items[1].partition_responses.items[0].base_offset, 1234);

		/* Everything refused: answered here alone. */
		km_wr_free(&mw);
		km_wr_init(&mw);
		assert_int_equal(km_ro_produce_merge(pl, NULL, 0, NULL, 0, NULL, &mw), KM_OK);
		km_produce_response_init(&merged);
		km_rd_init(&r, mw.buf, mw.len);
		assert_int_equal(km_produce_response_decode(&r, v, &merged, &a), KM_OK);
		assert_int_equal(merged.responses.items[1].partition_responses.items[0].error_code,
				 KM_KAFKA_UNKNOWN_SERVER_ERROR);

		km_wr_free(&mw);
		km_wr_free(&bw);
		km_arena_free(&a);
		km_ro_produce_free(pl);
		evbuffer_free(out);
		km_wr_free(&w);
	}
}

static void test_produce_truncated(void **state)
{
	km_wr w;
	km_req_header h = {.api_key = KM_API_PRODUCE, .api_version = 9};
	km_ro_produce *pl;
	(void)state;
	km_wr_init(&w);
	build_produce(&w, 9);
	for (size_t cut = 1; cut < w.len; cut += 7)
		assert_int_not_equal(km_ro_produce_walk(w.buf, w.len - cut, &h, &lookup, &pl), KM_OK);
	km_wr_free(&w);
}

static void test_delete_topics(void **state)
{
	(void)state;
	for (int16_t v = 1; v <= 6; v++) {
		km_delete_topics_request rq;
		km_delete_topics_request_delete_topic_state ts[3];
		km_str names[3] = {km_str_c("ro"), km_str_c("ok"), km_str_c("__mirror_state")};
		km_delete_topics_response br, m;
		km_delete_topics_response_deletable_topic_result bres;
		km_ro_admin *ad;
		km_wr w, fw, bw, mw;
		km_arena a;
		km_rd r;

		km_delete_topics_request_init(&rq);
		for (int i = 0; i < 3; i++) {
			km_delete_topics_request_delete_topic_state_init(&ts[i]);
			ts[i].name = names[i];
		}
		ts[0].name = KM_STR_NULL; /* v6: by id */
		ts[0].topic_id = RO_ID;
		if (v >= 6) {
			rq.topics.count = 3;
			rq.topics.items = ts;
		} else {
			rq.topic_names.count = 3;
			rq.topic_names.items = names;
		}
		km_wr_init(&w);
		km_delete_topics_request_encode(&w, v, &rq);
		assert_true(km_wr_ok(&w));
		km_wr_init(&fw);
		assert_int_equal(km_ro_admin_split(KM_API_DELETE_TOPICS, v, w.buf, w.len, &lookup, &ad, &fw), KM_OK);
		assert_non_null(ad);
		km_arena_init(&a, 1 << 20);
		km_delete_topics_request_init(&rq);
		km_rd_init(&r, fw.buf, fw.len);
		assert_int_equal(km_delete_topics_request_decode(&r, v, &rq, &a), KM_OK);
		assert_int_equal(v >= 6 ? rq.topics.count : rq.topic_names.count, 1);
		assert_true(km_str_eq_c(v >= 6 ? rq.topics.items[0].name : rq.topic_names.items[0], "ok"));

		km_delete_topics_response_init(&br);
		km_delete_topics_response_deletable_topic_result_init(&bres);
		bres.name = km_str_c("ok");
		br.responses.count = 1;
		br.responses.items = &bres;
		km_wr_init(&bw);
		km_delete_topics_response_encode(&bw, v, &br);
		km_wr_init(&mw);
		assert_int_equal(km_ro_admin_merge(ad, bw.buf, bw.len, &mw), KM_OK);
		km_delete_topics_response_init(&m);
		km_rd_init(&r, mw.buf, mw.len);
		assert_int_equal(km_delete_topics_response_decode(&r, v, &m, &a), KM_OK);
		assert_int_equal(m.responses.count, 3);
		assert_int_equal(m.responses.items[0].error_code, KM_MIRROR_READ_ONLY_TOPIC);
		assert_true(km_str_eq_c(m.responses.items[0].name, "ro")); /* v6 by id: the name from the store */
		assert_int_equal(m.responses.items[1].error_code, 0);
		assert_int_equal(m.responses.items[2].error_code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
		if (v >= 5)
			assert_true(km_str_eq_c(m.responses.items[2].error_message, "written only by kmirrord"));
		km_wr_free(&mw);
		km_wr_free(&bw);
		km_wr_free(&fw);
		km_wr_free(&w);
		km_arena_free(&a);
		km_ro_admin_free(ad);
	}
}

/* One log line per topic and operation in KM_RO_LOG_INTERVAL_MS, with the count of those left out. */
static void test_log_rate(void **state)
{
	uint32_t sup = 99;
	uint64_t t0 = 1000000;
	(void)state;
	assert_true(km_ro_log_allow(km_str_c("rate-a"), KM_RO_WRITE, t0, &sup));
	assert_int_equal(sup, 0);
	assert_false(km_ro_log_allow(km_str_c("rate-a"), KM_RO_WRITE, t0 + 1, &sup));
	assert_false(km_ro_log_allow(km_str_c("rate-a"), KM_RO_WRITE, t0 + KM_RO_LOG_INTERVAL_MS - 1, &sup));
	/* another topic, another operation: their own lines */
	assert_true(km_ro_log_allow(km_str_c("rate-b"), KM_RO_WRITE, t0 + 2, &sup));
	assert_true(km_ro_log_allow(km_str_c("rate-a"), KM_RO_DELETE_TOPIC, t0 + 3, &sup));
	assert_true(km_ro_log_allow(km_str_c("rate-a"), KM_RO_WRITE, t0 + KM_RO_LOG_INTERVAL_MS, &sup));
	assert_int_equal(sup, 2);
	assert_false(km_ro_log_allow(km_str_c("rate-a"), KM_RO_WRITE, t0 + KM_RO_LOG_INTERVAL_MS + 5, &sup));
	/* many topics: the table evicts, never refuses a new topic its first line */
	for (int i = 0; i < 1000; i++) {
		char name[32];
		snprintf(name, sizeof(name), "rate-many-%d", i);
		assert_true(km_ro_log_allow(km_str_c(name), KM_RO_WRITE, t0 + 100 + (uint64_t)i, &sup));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_produce_split_merge),
		cmocka_unit_test(test_produce_truncated),
		cmocka_unit_test(test_delete_topics),
		cmocka_unit_test(test_log_rate),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
