/* Unit tests of the read-only hooks' walk, split and merge, on frames built with the generated codecs (held in evbuffers of many chains) and a fake lookup. */
#include <stdio.h>
#include <stdlib.h>
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

/* Produce: topics ro (partitions 0, 1) and ok (partition 2), or by id in v13; with_ro false: ok alone. */
static void build_produce_topics(km_wr *w, int16_t v, bool with_ro)
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
	rq.topic_data.count = with_ro ? 2 : 1;
	rq.topic_data.items = with_ro ? t : &t[1];
	header(w, KM_API_PRODUCE, v, v >= 9);
	km_produce_request_encode(w, v, &rq);
}

static void build_produce(km_wr *w, int16_t v)
{
	build_produce_topics(w, v, true);
}

/* One chain of its own (copied from a separate buffer, so that no add ever merges two pieces). */
static void add_chain(struct evbuffer *in, const void *p, size_t n)
{
	struct evbuffer *one = evbuffer_new();
	assert_non_null(one);
	assert_int_equal(evbuffer_add(one, p, n), 0);
	assert_int_equal(evbuffer_add_buffer(in, one), 0);
	evbuffer_free(one);
}

/*
 * A client's input as the session hands it to the hook: the frame's size prefix, the frame cut
 * into chains at cuts[] (increasing offsets in the frame), then the first bytes of the next request.
 */
static struct evbuffer *input_of(const uint8_t *frame, size_t len, const size_t *cuts, size_t ncuts)
{
	static const uint8_t next[8] = {0, 0, 0, 99, 0, 0, 0, 9};
	struct evbuffer *in = evbuffer_new();
	uint8_t pre[4];
	size_t at = 0;

	assert_non_null(in);
	km_put_be32(pre, (uint32_t)len);
	add_chain(in, pre, 4);
	for (size_t i = 0; i <= ncuts; i++) {
		size_t to = i < ncuts ? cuts[i] : len;
		assert_true(to > at && to <= len);
		add_chain(in, frame + at, to - at);
		at = to;
	}
	add_chain(in, next, sizeof(next));
	/* The walk really has chain boundaries to cross. */
	assert_int_equal(evbuffer_peek(in, -1, NULL, NULL, 0), (int)ncuts + 3);
	return in;
}

static uint8_t *flat_of(struct evbuffer *b, size_t *len)
{
	*len = evbuffer_get_length(b);
	return evbuffer_pullup(b, -1);
}

/* Two plans of the same frame agree on every offset and verdict. */
static void assert_same_plan(const km_ro_produce *a, const km_ro_produce *b)
{
	assert_int_equal(a->ntopics, b->ntopics);
	assert_int_equal(a->nparts, b->nparts);
	assert_int_equal(a->nrefused, b->nrefused);
	assert_int_equal(a->acks, b->acks);
	assert_int_equal(a->head_end, b->head_end);
	assert_int_equal(a->topics_end, b->topics_end);
	for (int32_t i = 0; i < a->ntopics; i++) {
		const km_ro_topic *x = &a->topics[i], *y = &b->topics[i];
		assert_true(km_str_eq(x->name, y->name));
		assert_memory_equal(x->id.b, y->id.b, 16);
		assert_int_equal(x->start, y->start);
		assert_int_equal(x->head_end, y->head_end);
		assert_int_equal(x->parts_end, y->parts_end);
		assert_int_equal(x->end, y->end);
		assert_int_equal(x->nparts, y->nparts);
		for (int32_t j = 0; j < x->nparts; j++) {
			assert_int_equal(x->parts[j].index, y->parts[j].index);
			assert_int_equal(x->parts[j].start, y->parts[j].start);
			assert_int_equal(x->parts[j].end, y->parts[j].end);
			assert_int_equal(x->parts[j].code, y->parts[j].code);
		}
	}
}

/*
 * Walk and rewrite the frame held in in (freed here), referencing through a keeper, then free the
 * input before reading the result: the rewritten request must still hold want's bytes (the
 * keeper kept the chains alive; ASan would see it otherwise).
 */
static void walk_rewrite_in(struct evbuffer *in, size_t len, int16_t v, const km_ro_produce *ref,
			    const uint8_t *want, size_t wantlen)
{
	km_req_header h = {.api_key = KM_API_PRODUCE, .api_version = v};
	struct evbuffer *out = evbuffer_new();
	km_ro_produce *pl = NULL;
	km_ro_keeper *k;
	uint8_t *flat;
	size_t flen;

	assert_int_equal(km_ro_produce_walk(in, 4, len, &h, &lookup, &pl), KM_OK);
	assert_same_plan(pl, ref);
	k = km_ro_keeper_new(in);
	assert_non_null(k);
	assert_int_equal(km_ro_produce_rewrite(pl, in, 4, out, k), KM_OK);
	km_ro_keeper_release(k);
	evbuffer_drain(in, 4 + len); /* what the session does right after the hook */
	evbuffer_free(in);
	flat = flat_of(out, &flen);
	assert_int_equal(flen, wantlen);
	assert_memory_equal(flat, want, wantlen);
	km_ro_produce_free(pl);
	evbuffer_free(out);
}

/* The rewritten request holds topic ok only, its batch unchanged. */
static void check_rewritten(const km_wr *w, int16_t v, size_t hdr, const uint8_t *flat, size_t flen, km_arena *a)
{
	km_produce_request fwd;
	km_rd r;

	assert_memory_equal(flat, w->buf, hdr);
	km_produce_request_init(&fwd);
	km_rd_init(&r, flat + hdr, flen - hdr);
	assert_int_equal(km_produce_request_decode(&r, v, &fwd, a), KM_OK);
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
}

/*
 * With a keeper, the kept partition is not copied: the rewritten request references the input's
 * own chain (the frame's one chain here).
 */
static void check_referenced(km_ro_produce *pl, const km_wr *w)
{
	struct evbuffer *ref_in = input_of(w->buf, w->len, NULL, 0), *rout = evbuffer_new();
	struct evbuffer_iovec ov[16];
	const uint8_t *chain;
	bool referenced = false;
	km_ro_keeper *k;
	int n;

	assert_int_equal(evbuffer_peek(ref_in, -1, NULL, ov, 3), 3);
	chain = ov[1].iov_base;
	k = km_ro_keeper_new(ref_in);
	assert_int_equal(km_ro_produce_rewrite(pl, ref_in, 4, rout, k), KM_OK);
	km_ro_keeper_release(k);
	n = evbuffer_peek(rout, -1, NULL, ov, 16);
	assert_true(n > 0 && n <= 16);
	for (int i = 0; i < n; i++)
		if ((const uint8_t *)ov[i].iov_base >= chain && (const uint8_t *)ov[i].iov_base < chain + w->len &&
		    ov[i].iov_len >= sizeof(BATCH))
			referenced = true;
	assert_true(referenced);
	evbuffer_free(rout);
	evbuffer_free(ref_in);
}

/*
 * The same frame cut into two chains at every byte boundary, into one chain per byte, and into
 * chains of odd sizes: the walk crosses every boundary to the same plan, and the rewrite
 * (references and copies mixed) gives the same bytes, which outlive the input.
 */
static void check_cuts(km_ro_produce *pl, const km_wr *w, int16_t v, const uint8_t *flat, size_t flen)
{
	static size_t cuts[2048];
	size_t nc = 0, at = 0;
	uint32_t x = 12345u + (uint32_t)v;

	for (size_t c = 1; c < w->len; c++)
		walk_rewrite_in(input_of(w->buf, w->len, &c, 1), w->len, v, pl, flat, flen);
	assert_true(w->len - 1 <= sizeof(cuts) / sizeof(cuts[0]));
	for (size_t c = 1; c < w->len; c++)
		cuts[c - 1] = c;
	walk_rewrite_in(input_of(w->buf, w->len, cuts, w->len - 1), w->len, v, pl, flat, flen);
	for (;;) {
		x = x * 1103515245u + 12345u;
		at += 1 + (x >> 16) % 97;
		if (at >= w->len)
			break;
		cuts[nc++] = at;
	}
	walk_rewrite_in(input_of(w->buf, w->len, cuts, nc), w->len, v, pl, flat, flen);
}

/* The broker answers ok-2; the merge has ro-0, ro-1 refused and ok-2 as the broker said, in request order. */
static void check_merge(km_ro_produce *pl, int16_t v, km_arena *a)
{
	km_produce_response br, merged;
	km_produce_response_topic_produce_response bt;
	km_produce_response_partition_produce_response bp;
	km_wr bw, mw;
	km_rd r;

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
	assert_int_equal(km_produce_response_decode(&r, v, &merged, a), KM_OK);
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
	assert_int_equal(km_produce_response_decode(&r, v, &merged, a), KM_OK);
	assert_int_equal(merged.responses.items[1].partition_responses.items[0].error_code,
			 KM_KAFKA_UNKNOWN_SERVER_ERROR);
	km_wr_free(&mw);
	km_wr_free(&bw);
}

static void test_produce_split_merge(void **state)
{
	static const int16_t versions[] = {3, 8, 9, 11, 13};
	(void)state;
	for (size_t vi = 0; vi < sizeof(versions) / sizeof(versions[0]); vi++) {
		int16_t v = versions[vi];
		km_wr w;
		km_req_header h = {.api_key = KM_API_PRODUCE, .api_version = v};
		km_ro_produce *pl;
		struct evbuffer *out = evbuffer_new(), *in;
		km_arena a;
		uint8_t *flat;
		size_t flen, hdr = 8 + 2 + 3 + (v >= 9 ? 1 : 0);

		km_wr_init(&w);
		build_produce(&w, v);
		assert_true(km_wr_ok(&w));
		in = input_of(w.buf, w.len, NULL, 0);
		assert_int_equal(km_ro_produce_walk(in, 4, w.len, &h, &lookup, &pl), KM_OK);
		assert_int_equal(pl->nparts, 3);
		assert_int_equal(pl->nrefused, 2);
		assert_int_equal(pl->acks, -1);
		assert_int_equal(km_ro_produce_rewrite(pl, in, 4, out, NULL), KM_OK);
		flat = flat_of(out, &flen);
		km_arena_init(&a, 1 << 20);
		check_rewritten(&w, v, hdr, flat, flen, &a);
		check_referenced(pl, &w);
		check_cuts(pl, &w, v, flat, flen);
		check_merge(pl, v, &a);
		km_arena_free(&a);
		km_ro_produce_free(pl);
		evbuffer_free(out);
		evbuffer_free(in);
		km_wr_free(&w);
	}
}

/* Nothing refused (a Produce to a topic that is not mirrored while others are): no plan, whatever the chains. */
static void test_produce_nothing_refused(void **state)
{
	static const int16_t versions[] = {3, 9, 13};
	(void)state;
	for (size_t vi = 0; vi < sizeof(versions) / sizeof(versions[0]); vi++) {
		km_req_header h = {.api_key = KM_API_PRODUCE, .api_version = versions[vi]};
		km_ro_produce *pl;
		km_wr w;
		km_wr_init(&w);
		build_produce_topics(&w, versions[vi], false);
		for (size_t c = 1; c < w.len; c++) {
			struct evbuffer *in = input_of(w.buf, w.len, &c, 1);
			pl = (km_ro_produce *)&lookup; /* must be overwritten */
			assert_int_equal(km_ro_produce_walk(in, 4, w.len, &h, &lookup, &pl), KM_OK);
			assert_null(pl); /* no plan: the frame is forwarded as it is */
			/* The same frame cut one byte short is still malformed, not "nothing refused". */
			if (c < w.len - 1)
				assert_int_equal(km_ro_produce_walk(in, 4, w.len - 1, &h, &lookup, &pl), KM_ERR_DECODE);
			evbuffer_free(in);
		}
		km_wr_free(&w);
	}
}

/*
 * A frame cut short (its length says less than its fields, across a chain boundary), one longer
 * than the input holds, and one with a byte too many: all refused.
 */
static void test_produce_truncated(void **state)
{
	km_wr w;
	km_req_header h = {.api_key = KM_API_PRODUCE, .api_version = 9};
	km_ro_produce *pl;
	uint8_t *longer;
	(void)state;
	km_wr_init(&w);
	build_produce(&w, 9);
	for (size_t cut = 1; cut < w.len; cut += 7) {
		size_t at = (w.len - cut) / 2 + 1;
		struct evbuffer *in = input_of(w.buf, w.len - cut, &at, 1);
		assert_int_not_equal(km_ro_produce_walk(in, 4, w.len - cut, &h, &lookup, &pl), KM_OK);
		assert_null(pl);
		evbuffer_free(in);
	}
	{
		struct evbuffer *in = input_of(w.buf, w.len, NULL, 0);
		/* The input ends 8 bytes after the frame. */
		assert_int_not_equal(km_ro_produce_walk(in, 4, w.len + 9, &h, &lookup, &pl), KM_OK);
		evbuffer_free(in);
	}
	longer = malloc(w.len + 1);
	assert_non_null(longer);
	memcpy(longer, w.buf, w.len);
	longer[w.len] = 0;
	{
		struct evbuffer *in = input_of(longer, w.len + 1, NULL, 0);
		assert_int_not_equal(km_ro_produce_walk(in, 4, w.len + 1, &h, &lookup, &pl), KM_OK);
		evbuffer_free(in);
	}
	free(longer);
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
		cmocka_unit_test(test_produce_nothing_refused),
		cmocka_unit_test(test_produce_truncated),
		cmocka_unit_test(test_delete_topics),
		cmocka_unit_test(test_log_rate),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
