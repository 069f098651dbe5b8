/* Unit tests of offset translation on mirror topics: requests, whole responses, and Fetch responses patched as they stream (cut at every byte), over a fake lookup with a two-run map. */
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kmirror/msg/delete_records_request.h"
#include "kmirror/msg/delete_records_response.h"
#include "kmirror/msg/describe_producers_response.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/offset_for_leader_epoch_response.h"
#include "kmirror/msg/produce_response.h"
#include "kmirror/batch.h"
#include "kmirror/log.h"
#include "proxy/offsets.h"

/*
 * Topic "m" (or M_ID) partitions 0 and 2 have the map: logical [0, 40) at physical [100, 140),
 * a hole at logical [40, 50), physical [140, 200) hidden, logical 50 on at physical 200 (the open
 * run), the tail at physical 300 / logical 160 (the source ended in a hole). Partition 1 of "m"
 * and topic "plain" have none.
 */
static const km_uuid M_ID = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
static const km_uuid P_ID = {{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}};
/* The second run's batches were LogAppendTime at the source: the proxy sets the bit back. */
static km_offrun RUNS[] = {{0, 100, -1, 0}, {50, 200, 40, KM_OFFRUN_LOG_APPEND_TIME}};
static km_offmap MAP = {RUNS, 2, 2, 300, 160};
static const char TOPIC_M[] = "m";
static bool ACTIVE = true;

static bool fake_active(void *arg)
{
	(void)arg;
	return ACTIVE;
}

static const void *fake_topic(void *arg, km_str name, const km_uuid *id)
{
	(void)arg;
	if (id)
		return km_uuid_eq(id, &M_ID) ? TOPIC_M : NULL;
	return km_str_eq_c(name, "m") ? TOPIC_M : NULL;
}

static const km_offmap *fake_map(void *arg, const void *topic, int32_t partition)
{
	(void)arg;
	return topic == TOPIC_M && (partition == 0 || partition == 2) ? &MAP : NULL;
}

static const km_off_lookup LK = {fake_active, fake_topic, fake_map, NULL};

/* ---- the map's rules, as the proxy uses them ---- */

static void test_batch_logical(void **state)
{
	int64_t l;
	(void)state;
	assert_true(km_off_batch_logical(&MAP, 100, &l));
	assert_int_equal(l, 0);
	assert_true(km_off_batch_logical(&MAP, 130, &l));
	assert_int_equal(l, 30);
	assert_false(km_off_batch_logical(&MAP, 150, &l)); /* hidden */
	assert_false(km_off_batch_logical(&MAP, 50, &l));  /* before every run */
	assert_true(km_off_batch_logical(&MAP, 210, &l));
	assert_int_equal(l, 60);
	/*
	 * At or past the physical tail while a pipeline runs the partition (a batch the broker has,
	 * whose acknowledgement the pipeline has not taken yet): not shown until it has.
	 */
	assert_true(km_off_batch_logical(&MAP, 299, &l));
	assert_int_equal(l, 149);
	assert_false(km_off_batch_logical(&MAP, 300, &l));
	assert_false(km_off_batch_logical(&MAP, 320, &l));
}

/* ---- Fetch requests ---- */

static void build_fetch_request(km_wr *w, int16_t v, int32_t session_epoch, bool with_m)
{
	km_fetch_request rq;
	km_fetch_request_fetch_topic t[2];
	km_fetch_request_fetch_partition p[5];
	int64_t offs[5] = {10, 45, 60, 170, 10};
	km_fetch_request_init(&rq);
	for (int i = 0; i < 5; i++) {
		km_fetch_request_fetch_partition_init(&p[i]);
		p[i].partition = i < 4 ? (i == 1 ? 2 : i == 3 ? 1 : 0) : 0;
		p[i].fetch_offset = offs[i];
		p[i].log_start_offset = i == 0 ? 5 : -1;
		p[i].partition_max_bytes = 1 << 20;
	}
	/* m: 0 at 10, 2 at 45 (a hole), 1 at 60 (no map); plain: 0 at 10. One more m partition, 0 again? No: 3 at 170. */
	p[2].partition = 1;
	p[3].partition = 2;
	for (int i = 0; i < 2; i++)
		km_fetch_request_fetch_topic_init(&t[i]);
	t[0].topic = km_str_c("m");
	t[0].topic_id = M_ID;
	t[0].partitions.count = 3;
	t[0].partitions.items = p;
	t[1].topic = km_str_c("plain");
	t[1].topic_id = P_ID;
	t[1].partitions.count = 1;
	t[1].partitions.items = &p[4];
	rq.replica_id = -1;
	rq.max_wait_ms = 500;
	rq.min_bytes = 1;
	rq.max_bytes = 1 << 24;
	rq.session_id = session_epoch > 0 ? 77 : 0;
	rq.session_epoch = session_epoch;
	rq.topics.count = with_m ? 2 : 1;
	rq.topics.items = with_m ? t : &t[1];
	km_fetch_request_encode(w, v, &rq);
	assert_true(km_wr_ok(w));
}

static void check_fetch_request(int16_t v)
{
	km_wr in, out;
	km_off_req *c = NULL;
	bool rewrote = false;
	km_fetch_request got;
	km_arena a;
	km_rd r;

	km_wr_init(&in);
	km_wr_init(&out);
	build_fetch_request(&in, v, 0, true);
	assert_int_equal(km_off_request(KM_API_FETCH, v, in.buf, in.len, &LK, &c, &rewrote, &out), KM_OK);
	assert_true(rewrote);
	assert_non_null(c);
	assert_int_equal(c->n, 2); /* m/0 and m/2: the partitions with a map */
	km_arena_init(&a, 0);
	km_fetch_request_init(&got);
	km_rd_init(&r, out.buf, out.len);
	assert_int_equal(km_fetch_request_decode(&r, v, &got, &a), KM_OK);
	assert_int_equal(r.pos, out.len);
	assert_int_equal(got.topics.count, 2);
	/* m/0: in the first run; m/2 at 45: a hole, the next run's start; m/1: no map, as asked. */
	assert_int_equal(got.topics.items[0].partitions.items[0].fetch_offset, 110);
	if (v >= 5)
		assert_int_equal(got.topics.items[0].partitions.items[0].log_start_offset, 105);
	assert_int_equal(got.topics.items[0].partitions.items[1].fetch_offset, 200);
	assert_int_equal(got.topics.items[0].partitions.items[1].log_start_offset, -1);
	assert_int_equal(got.topics.items[0].partitions.items[2].fetch_offset, 60);
	assert_int_equal(got.topics.items[1].partitions.items[0].fetch_offset, 10);
	if (v >= 13)
		assert_true(km_uuid_eq(&got.topics.items[0].topic_id, &M_ID));
	else
		assert_true(km_str_eq_c(got.topics.items[0].topic, "m"));
	/* What the response needs: the client's logical offsets. */
	assert_int_equal(km_off_req_find(c, km_str_c("m"), v >= 13 ? &M_ID : NULL, 0)->value, 10);
	assert_int_equal(km_off_req_find(c, km_str_c("m"), v >= 13 ? &M_ID : NULL, 2)->value, 45);
	assert_null(km_off_req_find(c, km_str_c("m"), v >= 13 ? &M_ID : NULL, 1));
	km_arena_free(&a);
	km_off_req_free(c);
	km_wr_free(&in);
	km_wr_free(&out);
}

static void test_fetch_request_lowest(void **state)
{
	(void)state;
	check_fetch_request(KM_FETCH_RESPONSE_MIN_VERSION);
	check_fetch_request(12);
}

static void test_fetch_request_highest(void **state)
{
	(void)state;
	check_fetch_request(13);
	check_fetch_request(KM_FETCH_REQUEST_MAX_VERSION);
}

/* Past the logical tail: the physical tail (an empty answer, no error). */
static void test_fetch_request_past_tail(void **state)
{
	(void)state;
	int64_t p = km_offmap_to_physical(&MAP, 170);
	assert_int_equal(p, 300);
	assert_int_equal(km_offmap_to_physical(&MAP, 160), 300);
	/* The trailing hole (logical 150-159, a marker last at the source): the tail too. */
	assert_int_equal(km_offmap_to_physical(&MAP, 159), 300);
	assert_int_equal(km_offmap_to_physical(&MAP, 149), 299);
}

/*
 * Below the mirrored log start (docs/proxy.md, "Reads below the log start"): a map whose first run
 * starts at logical 50 (mirroring began there at a batch boundary) sends a fetch at 10 as -1, which
 * the broker answers OFFSET_OUT_OF_RANGE, as the source does; with the run remembering that
 * mirroring began at 45 (a compaction hole at the source), 47 is served from the run's start and 44
 * is below. Before, both went to the run's start.
 */
static km_offrun LATE_RUNS[] = {{50, 0, -1, 0}};
static km_offmap LATE = {LATE_RUNS, 1, 1, -1, -1};

static const km_offmap *late_map(void *arg, const void *topic, int32_t partition)
{
	(void)arg;
	(void)partition;
	return topic == TOPIC_M ? &LATE : NULL;
}

static int64_t fetched_at(int64_t logical)
{
	static const km_off_lookup lk = {fake_active, fake_topic, late_map, NULL};
	km_fetch_request rq, got;
	km_fetch_request_fetch_topic t;
	km_fetch_request_fetch_partition p;
	km_wr in, out;
	km_off_req *c = NULL;
	bool rewrote = false;
	km_arena a;
	km_rd r;
	int64_t at;

	km_fetch_request_init(&rq);
	km_fetch_request_fetch_topic_init(&t);
	km_fetch_request_fetch_partition_init(&p);
	p.fetch_offset = logical;
	p.partition_max_bytes = 1 << 20;
	t.topic = km_str_c("m");
	t.partitions.items = &p;
	t.partitions.count = 1;
	rq.replica_id = -1;
	rq.session_epoch = -1;
	rq.topics.items = &t;
	rq.topics.count = 1;
	km_wr_init(&in);
	km_wr_init(&out);
	km_fetch_request_encode(&in, 12, &rq);
	assert_int_equal(km_off_request(KM_API_FETCH, 12, in.buf, in.len, &lk, &c, &rewrote, &out), KM_OK);
	assert_true(rewrote);
	km_arena_init(&a, 0);
	km_fetch_request_init(&got);
	km_rd_init(&r, out.buf, out.len);
	assert_int_equal(km_fetch_request_decode(&r, 12, &got, &a), KM_OK);
	at = got.topics.items[0].partitions.items[0].fetch_offset;
	km_arena_free(&a);
	km_off_req_free(c);
	km_wr_free(&in);
	km_wr_free(&out);
	return at;
}

static void test_fetch_request_below_log_start(void **state)
{
	(void)state;
	assert_int_equal(fetched_at(10), -1);
	assert_int_equal(fetched_at(49), -1);
	assert_int_equal(fetched_at(50), 0);
	assert_int_equal(fetched_at(57), 7);
	LATE_RUNS[0].prev_logical_end = 45;
	assert_int_equal(fetched_at(47), 0);
	assert_int_equal(fetched_at(44), -1);
	LATE_RUNS[0].prev_logical_end = -1;
}

/* No map among the partitions of a full fetch: no context, nothing rewritten; no mirror at all: nothing looked at. */
static void test_fetch_request_plain(void **state)
{
	km_wr in, out;
	km_off_req *c = (km_off_req *)1;
	bool rewrote = true;
	(void)state;
	km_wr_init(&in);
	km_wr_init(&out);
	build_fetch_request(&in, 17, 0, false);
	assert_int_equal(km_off_request(KM_API_FETCH, 17, in.buf, in.len, &LK, &c, &rewrote, &out), KM_OK);
	assert_null(c);
	assert_false(rewrote);
	assert_int_equal(out.len, 0);
	ACTIVE = false;
	km_wr_free(&in);
	km_wr_init(&in);
	build_fetch_request(&in, 17, 0, true);
	assert_int_equal(km_off_request(KM_API_FETCH, 17, in.buf, in.len, &LK, &c, &rewrote, &out), KM_OK);
	assert_null(c);
	assert_false(rewrote);
	ACTIVE = true;
	km_wr_free(&in);
	km_wr_free(&out);
}

/* KIP-227: an incremental request naming no mapped partition still gets a context (its session may hold one). */
static void test_fetch_request_incremental(void **state)
{
	km_wr in, out;
	km_off_req *c = NULL;
	bool rewrote = true;
	(void)state;
	km_wr_init(&in);
	km_wr_init(&out);
	build_fetch_request(&in, 15, 3, false);
	assert_int_equal(km_off_request(KM_API_FETCH, 15, in.buf, in.len, &LK, &c, &rewrote, &out), KM_OK);
	assert_non_null(c);
	assert_false(rewrote);
	assert_int_equal(c->n, 0);
	km_off_req_free(c);
	km_wr_free(&in);
	km_wr_free(&out);
}

/* ---- Fetch responses ---- */

/* A v2 batch header (61 bytes) and payload: only baseOffset, batchLength and lastOffsetDelta matter to the walk. */
#define BATCH_LEN 80
static void put_batch(uint8_t *b, int64_t base, int32_t last_delta, uint8_t fill)
{
	memset(b, fill, BATCH_LEN);
	km_put_be64(b, (uint64_t)base);
	km_put_be32(b + 8, BATCH_LEN - 12);
	km_put_be32(b + 12, 3); /* partition leader epoch */
	b[16] = 2;              /* magic */
	km_put_be32(b + 23, (uint32_t)last_delta);
	km_batch_update_crc(b, BATCH_LEN);
}

static uint8_t RECS_M0[4 * BATCH_LEN], RECS_M1[BATCH_LEN], RECS_PLAIN[BATCH_LEN];

/* The frame (size prefix, correlation id, v12+ header tags, body) of a response to a fetch of m/0 at logical 30. */
static void build_fetch_response(km_wr *w, int16_t v, bool only_plain)
{
	km_fetch_response rs;
	km_fetch_response_fetchable_topic_response t[2];
	km_fetch_response_partition_data p[4];
	km_fetch_response_aborted_transaction ab;
	km_wr body;

	put_batch(RECS_M0, 130, 9, 0xa1);              /* logical 30 */
	put_batch(RECS_M0 + BATCH_LEN, 150, 4, 0xa2);  /* hidden */
	put_batch(RECS_M0 + 2 * BATCH_LEN, 200, 9, 0xa3); /* logical 50 */
	put_batch(RECS_M0 + 3 * BATCH_LEN, 300, 9, 0xa4); /* at the tail: written, not mapped yet */
	put_batch(RECS_M1, 130, 9, 0xb1);
	put_batch(RECS_PLAIN, 130, 9, 0xc1);
	km_fetch_response_init(&rs);
	for (int i = 0; i < 4; i++) {
		km_fetch_response_partition_data_init(&p[i]);
		p[i].high_watermark = 300;
		p[i].last_stable_offset = 250;
		p[i].log_start_offset = 100;
	}
	km_fetch_response_aborted_transaction_init(&ab);
	ab.producer_id = 7;
	ab.first_offset = 210;
	p[0].partition_index = 0;
	p[0].aborted_transactions.count = 1;
	p[0].aborted_transactions.items = &ab;
	p[0].records = (km_bytes){RECS_M0, (int32_t)sizeof(RECS_M0)};
	p[1].partition_index = 1;
	p[1].records = (km_bytes){RECS_M1, (int32_t)sizeof(RECS_M1)};
	/* m/2: a diverged fetch: the epoch's end, no records. */
	p[2].partition_index = 2;
	if (v >= 12) {
		p[2].diverging_epoch.epoch = 5;
		p[2].diverging_epoch.end_offset = 250;
	}
	p[2].records = (km_bytes){NULL, 0};
	p[3].partition_index = 0;
	p[3].records = (km_bytes){RECS_PLAIN, (int32_t)sizeof(RECS_PLAIN)};
	for (int i = 0; i < 2; i++)
		km_fetch_response_fetchable_topic_response_init(&t[i]);
	t[0].topic = km_str_c("m");
	t[0].topic_id = M_ID;
	t[0].partitions.count = 3;
	t[0].partitions.items = p;
	t[1].topic = km_str_c("plain");
	t[1].topic_id = P_ID;
	t[1].partitions.count = 1;
	t[1].partitions.items = &p[3];
	rs.responses.count = only_plain ? 1 : 2;
	rs.responses.items = only_plain ? &t[1] : t;
	km_wr_init(&body);
	km_fetch_response_encode(&body, v, &rs);
	assert_true(km_wr_ok(&body));
	km_wr_i32(w, (int32_t)(body.len + 4 + (v >= 12)));
	km_wr_i32(w, 99);
	if (v >= 12)
		km_wr_uvarint(w, 0);
	km_wr_raw(w, body.buf, body.len);
	assert_true(km_wr_ok(w));
	km_wr_free(&body);
}

static void add_chain(struct evbuffer *in, const void *p, size_t n)
{
	struct evbuffer *one = evbuffer_new();
	assert_non_null(one);
	assert_int_equal(evbuffer_add(one, p, n), 0);
	assert_int_equal(evbuffer_add_buffer(in, one), 0);
	evbuffer_free(one);
}

static void send_settled(const km_fetch_walk *w, struct evbuffer *in, size_t *sent, struct evbuffer *out)
{
	size_t have_end = *sent + evbuffer_get_length(in), upto = w->pos < have_end ? w->pos : have_end;
	if (upto > *sent) {
		evbuffer_remove_buffer(in, out, upto - *sent);
		*sent = upto;
	}
}

/*
 * The session's streaming, step by step: the frame arrives in pieces (cut at the offsets in
 * cuts), each walked as far as it goes with the hooks, the settled bytes sent on at once, an
 * event asked again (KM_STREAM_AGAIN) restarted when more has come. *agains counts those.
 */
static void stream(const uint8_t *frame, size_t len, int16_t v, const size_t *cuts, size_t ncuts, km_off_req *c,
		   struct evbuffer *out, int *agains)
{
	struct evbuffer *in = evbuffer_new();
	km_fetch_walk w;
	size_t sent = 0, fed = 0;
	bool walked = false;

	assert_non_null(in);
	km_fetch_walk_init(&w, v, len);
	for (size_t k = 0; k <= ncuts; k++) {
		size_t to = k < ncuts ? cuts[k] : len;
		if (to > fed) {
			add_chain(in, frame + fed, to - fed);
			fed = to;
		}
		while (!walked) {
			km_fetch_walk before = w;
			km_fw_event ev = km_fetch_walk_next(&w, in, sent);
			km_stream_ev e = {.w = &w, .in = in, .first = sent, .ctx = c};
			km_err rc = KM_OK;
			assert_int_not_equal(ev, KM_FW_ERROR);
			if (ev == KM_FW_PARTITION)
				rc = km_off_fetch_partition(&e);
			else if (ev == KM_FW_BATCH)
				rc = km_off_fetch_batch(&e);
			if (rc == KM_STREAM_AGAIN) {
				assert_true(fed < len); /* never asked again with the whole frame here */
				w = before;
				(*agains)++;
				break;
			}
			assert_int_equal(rc, KM_OK);
			if (ev == KM_FW_NEED_MORE)
				break;
			if (ev == KM_FW_END)
				walked = true;
		}
		send_settled(&w, in, &sent, out);
	}
	assert_true(walked);
	/* The tail (top-level tags) as it came. */
	evbuffer_remove_buffer(in, out, evbuffer_get_length(in));
	assert_int_equal(evbuffer_get_length(out), len);
	evbuffer_free(in);
}

/* A context as the request of m/0 at logical 30 (and m/2 at 45) makes it. */
static km_off_req *fetch_ctx(int16_t v)
{
	km_off_req *c = km_off_req_new(KM_API_FETCH, v, &LK);
	km_wr in, out;
	bool rw;
	(void)out;
	assert_non_null(c);
	km_off_req_free(c);
	km_wr_init(&in);
	km_wr_init(&out);
	build_fetch_request(&in, v, 0, true);
	c = NULL;
	assert_int_equal(km_off_request(KM_API_FETCH, v, in.buf, in.len, &LK, &c, &rw, &out), KM_OK);
	assert_non_null(c);
	/* The client asked m/0 from logical 30 (the request's first entry is m/0). */
	c->entries[0].value = 30;
	c->entries[0].sent = 130;
	km_wr_free(&in);
	km_wr_free(&out);
	return c;
}

static void check_fetch_response_fields(const uint8_t *frame, size_t len, int16_t v)
{
	km_fetch_response got;
	km_arena a;
	km_rd r;
	size_t hl = 8 + (v >= 12);
	const km_fetch_response_partition_data *p;
	const uint8_t *recs;

	km_arena_init(&a, 0);
	km_fetch_response_init(&got);
	km_rd_init(&r, frame + hl, len - hl);
	assert_int_equal(km_fetch_response_decode(&r, v, &got, &a), KM_OK);
	assert_int_equal(got.responses.count, 2);
	p = got.responses.items[0].partitions.items;
	/* m/0 */
	assert_int_equal(p[0].high_watermark, 160); /* the physical tail: the logical tail */
	assert_int_equal(p[0].last_stable_offset, 100);
	if (v >= 5)
		assert_int_equal(p[0].log_start_offset, 0);
	assert_int_equal(p[0].aborted_transactions.count, 1);
	assert_int_equal(p[0].aborted_transactions.items[0].producer_id, 7);
	assert_int_equal(p[0].aborted_transactions.items[0].first_offset, 60);
	recs = p[0].records.p;
	assert_int_equal((int64_t)km_be64(recs), 30);
	/* The hidden batch lies wholly below the fetch position 30: 25 + lastOffsetDelta 4 = 29. */
	assert_int_equal((int64_t)km_be64(recs + BATCH_LEN), 25);
	assert_int_equal((int64_t)km_be64(recs + 2 * BATCH_LEN), 50);
	/*
	 * The batch at the tail, last and after a visible one: below the fetch position too, and its
	 * length one byte past the records, so that every client drops it as cut by the fetch's size
	 * (the Java consumer then takes its position from the visible batch, not from this one).
	 */
	assert_int_equal((int64_t)km_be64(recs + 3 * BATCH_LEN), 30 - 1 - 9);
	assert_int_equal(km_be32(recs + 3 * BATCH_LEN + 8), BATCH_LEN - 12 + 1);
	assert_memory_equal(recs + 3 * BATCH_LEN + 12, RECS_M0 + 3 * BATCH_LEN + 12, BATCH_LEN - 12);
	/* Record bytes untouched: everything after each baseOffset, but for the LogAppendTime run's batch
	 * its attribute bit, and the CRC that covers it. */
	for (int i = 0; i < 2; i++)
		assert_memory_equal(recs + i * BATCH_LEN + 8, RECS_M0 + i * BATCH_LEN + 8, BATCH_LEN - 8);
	{
		const uint8_t *pb = recs + 2 * BATCH_LEN, *pw = RECS_M0 + 2 * BATCH_LEN;
		assert_memory_equal(pb + 8, pw + 8, KM_BATCH_OFF_CRC - 8);
		assert_int_equal(pb[KM_BATCH_OFF_ATTRIBUTES + 1], pw[KM_BATCH_OFF_ATTRIBUTES + 1] | KM_BATCH_ATTR_LOG_APPEND_TIME);
		assert_int_equal(pb[KM_BATCH_OFF_ATTRIBUTES], pw[KM_BATCH_OFF_ATTRIBUTES]);
		assert_memory_equal(pb + KM_BATCH_OFF_LAST_OFFSET_DELTA, pw + KM_BATCH_OFF_LAST_OFFSET_DELTA,
				    BATCH_LEN - KM_BATCH_OFF_LAST_OFFSET_DELTA);
		assert_int_equal(km_batch_verify_crc(pb, BATCH_LEN), KM_OK);
	}
	/* m/1: no map, as it came. */
	assert_int_equal(p[1].high_watermark, 300);
	assert_int_equal((int64_t)km_be64(p[1].records.p), 130);
	/* m/2: the diverging epoch's end. */
	assert_int_equal(p[2].high_watermark, 160);
	if (v >= 12) {
		assert_int_equal(p[2].diverging_epoch.epoch, 5);
		assert_int_equal(p[2].diverging_epoch.end_offset, 100);
	}
	/* plain: untouched. */
	p = got.responses.items[1].partitions.items;
	assert_int_equal(p[0].high_watermark, 300);
	assert_int_equal(p[0].log_start_offset, v >= 5 ? 100 : -1);
	assert_int_equal((int64_t)km_be64(p[0].records.p), 130);
	km_arena_free(&a);
}

static void check_fetch_response(int16_t v)
{
	km_wr fr;
	struct evbuffer *whole = evbuffer_new(), *out;
	km_off_req *c;
	const uint8_t *want;
	int agains = 0;

	km_wr_init(&fr);
	build_fetch_response(&fr, v, false);
	/* In one piece. */
	c = fetch_ctx(v);
	stream(fr.buf, fr.len, v, NULL, 0, c, whole, &agains);
	km_off_req_free(c);
	assert_int_equal(agains, 0);
	want = evbuffer_pullup(whole, -1);
	check_fetch_response_fields(want, fr.len, v);
	/* Cut in two at every byte boundary: the same bytes out. */
	for (size_t cut = 1; cut < fr.len; cut++) {
		out = evbuffer_new();
		c = fetch_ctx(v);
		stream(fr.buf, fr.len, v, &cut, 1, c, out, &agains);
		km_off_req_free(c);
		assert_memory_equal(evbuffer_pullup(out, -1), want, fr.len);
		evbuffer_free(out);
	}
	/* One byte at a time. */
	{
		size_t *cuts = malloc(fr.len * sizeof(*cuts));
		assert_non_null(cuts);
		for (size_t i = 0; i < fr.len; i++)
			cuts[i] = i + 1;
		out = evbuffer_new();
		c = fetch_ctx(v);
		stream(fr.buf, fr.len, v, cuts, fr.len, c, out, &agains);
		km_off_req_free(c);
		assert_memory_equal(evbuffer_pullup(out, -1), want, fr.len);
		evbuffer_free(out);
		free(cuts);
	}
	/* v12+: the diverging epoch's tags were asked for again at some cuts. */
	if (v >= 12)
		assert_true(agains > 0);
	evbuffer_free(whole);
	km_wr_free(&fr);
}

static const char *fake_name(void *arg, const void *topic)
{
	(void)arg;
	return topic == TOPIC_M ? TOPIC_M : NULL;
}

/*
 * log_fetch_topics: the answer streamed whole, cut at every byte, and a byte at a time gives the
 * same line for m/0 each time (nothing for m/2, which holds no record, nor for plain), and it
 * says what the reader was shown; a list without m gives none.
 */
static void check_fetch_trace(int16_t v, const char *topics, bool traced)
{
	km_off_lookup lk = LK;
	km_wr fr;
	FILE *log = tmpfile();
	char line[4096], first[4096] = "";
	int saved, agains = 0, lines = 0, runs = 0;

	assert_non_null(log);
	lk.name = fake_name;
	lk.trace_topics = topics;
	km_wr_init(&fr);
	build_fetch_response(&fr, v, false);
	fflush(stderr);
	saved = dup(2);
	assert_true(dup2(fileno(log), 2) >= 0);
	km_log_set_level(KM_LOG_INFO);
	for (size_t cut = 0; cut <= fr.len; cut += cut < 200 || cut + 1 >= fr.len ? 1 : 7, runs++) {
		struct evbuffer *out = evbuffer_new();
		size_t *cuts = NULL, n = 0;
		km_off_req *c = fetch_ctx(v);
		c->lk = &lk;
		if (cut == fr.len) { /* the last round: a byte at a time */
			assert_non_null(cuts = malloc(fr.len * sizeof(*cuts)));
			for (n = 0; n < fr.len; n++)
				cuts[n] = n + 1;
		}
		stream(fr.buf, fr.len, v, cuts ? cuts : &cut, cuts ? n : cut > 0, c, out, &agains);
		km_off_req_free(c);
		evbuffer_free(out);
		free(cuts);
	}
	km_log_set_level(getenv("KM_TEST_LOG") ? KM_LOG_DEBUG : KM_LOG_ERROR);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(log);
	while (fgets(line, sizeof(line), log)) {
		char *msg = strstr(line, "comp=fetch-trace msg=");
		if (!msg)
			continue;
		lines++;
		if (!first[0])
			snprintf(first, sizeof(first), "%s", msg);
		assert_string_equal(msg, first);
	}
	fclose(log);
	km_wr_free(&fr);
	if (!traced) {
		assert_int_equal(lines, 0);
		return;
	}
	assert_int_equal(lines, runs);
	assert_non_null(strstr(first, "\"m/0: asked 30 (destination 130), tail 160/300, runs 2, error 0"));
	if (v >= 5)
		assert_non_null(strstr(first, ", hw 160 (300), lso 100 (250), "));
	assert_non_null(strstr(first, "aborted [7@210 as 7@60], records 320 bytes, batches: 130>30 pid "));
	assert_non_null(strstr(first, ", 150 hidden>25 pid "));
	assert_non_null(strstr(first, ", 200>50 pid "));
	assert_non_null(strstr(first, ", 300 hidden>20 pid "));
	assert_null(strstr(first, "plain"));
}

static void test_fetch_trace(void **state)
{
	int16_t vs[] = {5, 12, KM_FETCH_RESPONSE_MAX_VERSION};
	(void)state;
	for (size_t k = 0; k < sizeof(vs) / sizeof(vs[0]); k++) {
		check_fetch_trace(vs[k], "x, m ", true);
		check_fetch_trace(vs[k], "mm,x", false);
	}
}

static void test_fetch_response_lowest(void **state)
{
	(void)state;
	check_fetch_response(KM_FETCH_RESPONSE_MIN_VERSION);
	check_fetch_response(5);
	check_fetch_response(12);
}

static void test_fetch_response_highest(void **state)
{
	(void)state;
	check_fetch_response(13);
	check_fetch_response(KM_FETCH_RESPONSE_MAX_VERSION);
}

/* No map (or no context): every byte as it came, cut or not. */
static void test_fetch_response_untouched(void **state)
{
	int16_t vs[] = {4, 12, 18};
	(void)state;
	for (size_t k = 0; k < sizeof(vs) / sizeof(vs[0]); k++) {
		int16_t v = vs[k];
		km_wr fr;
		int agains = 0;
		km_wr_init(&fr);
		build_fetch_response(&fr, v, true);
		for (size_t cut = 1; cut < fr.len; cut += 7) {
			struct evbuffer *out = evbuffer_new();
			km_off_req *c = fetch_ctx(v);
			stream(fr.buf, fr.len, v, &cut, 1, c, out, &agains);
			assert_memory_equal(evbuffer_pullup(out, -1), fr.buf, fr.len);
			evbuffer_free(out);
			km_off_req_free(c);
			out = evbuffer_new();
			stream(fr.buf, fr.len, v, &cut, 1, NULL, out, &agains);
			assert_memory_equal(evbuffer_pullup(out, -1), fr.buf, fr.len);
			evbuffer_free(out);
		}
		/* The mapped topic's bytes too, with no context (a request that named no map). */
		km_wr_free(&fr);
		km_wr_init(&fr);
		build_fetch_response(&fr, v, false);
		{
			struct evbuffer *out = evbuffer_new();
			stream(fr.buf, fr.len, v, NULL, 0, NULL, out, &agains);
			assert_memory_equal(evbuffer_pullup(out, -1), fr.buf, fr.len);
			evbuffer_free(out);
		}
		km_wr_free(&fr);
	}
}

/*
 * KIP-227: the response to an incremental request that did not name m/0 (its session did): the
 * partition is translated all the same, and the hidden batch put below the first visible batch's
 * logical offset (30), which is at or below the client's position.
 */
static void test_fetch_response_incremental(void **state)
{
	km_wr in, out, fr;
	km_off_req *c = NULL;
	bool rw;
	struct evbuffer *o = evbuffer_new();
	int agains = 0;
	(void)state;
	km_wr_init(&in);
	km_wr_init(&out);
	km_wr_init(&fr);
	build_fetch_request(&in, 15, 4, false);
	assert_int_equal(km_off_request(KM_API_FETCH, 15, in.buf, in.len, &LK, &c, &rw, &out), KM_OK);
	assert_non_null(c);
	build_fetch_response(&fr, 15, false);
	stream(fr.buf, fr.len, 15, NULL, 0, c, o, &agains);
	check_fetch_response_fields(evbuffer_pullup(o, -1), fr.len, 15);
	km_off_req_free(c);
	evbuffer_free(o);
	km_wr_free(&in);
	km_wr_free(&out);
	km_wr_free(&fr);
}

/*
 * m/0 answered with one batch of len bytes at physical 300, the tail (written, not mapped yet), and
 * plain/0 with a batch after it. v12+: the partition goes out with no records and its bytes as one
 * unknown tagged field, the frame's length the same; before v12 the batch is put below the fetch
 * position as before.
 */
/* One batch of len bytes at physical offset base in recs. */
static void put_unmapped_batch(uint8_t *recs, size_t len, int64_t base)
{
	memset(recs, 0xd1, len);
	km_put_be64(recs, base);
	km_put_be32(recs + 8, (uint32_t)(len - 12));
	recs[16] = 2;
	km_put_be32(recs + 23, 4);
	km_batch_update_crc(recs, len);
}

/* m/0's records: one batch at base over len bytes, or (base2 >= 0) two of half each, at base and base2. */
static void build_unmapped_response(km_wr *w, int16_t v, uint8_t *recs, size_t len, int64_t base, int64_t base2)
{
	km_fetch_response rs;
	km_fetch_response_fetchable_topic_response t[2];
	km_fetch_response_partition_data p[2];
	km_wr body;

	if (base2 < 0) {
		put_unmapped_batch(recs, len, base);
	} else {
		put_unmapped_batch(recs, len / 2, base);
		put_unmapped_batch(recs + len / 2, len - len / 2, base2);
	}
	km_fetch_response_init(&rs);
	for (int i = 0; i < 2; i++) {
		km_fetch_response_partition_data_init(&p[i]);
		km_fetch_response_fetchable_topic_response_init(&t[i]);
		p[i].high_watermark = 305;
		p[i].last_stable_offset = 305;
		p[i].log_start_offset = 100;
	}
	p[0].records = (km_bytes){recs, (int32_t)len};
	p[1].records = (km_bytes){RECS_PLAIN, (int32_t)sizeof(RECS_PLAIN)};
	put_batch(RECS_PLAIN, 130, 9, 0xc1);
	t[0].topic = km_str_c("m");
	t[0].topic_id = M_ID;
	t[0].partitions.count = 1;
	t[0].partitions.items = &p[0];
	t[1].topic = km_str_c("plain");
	t[1].topic_id = P_ID;
	t[1].partitions.count = 1;
	t[1].partitions.items = &p[1];
	rs.responses.count = 2;
	rs.responses.items = t;
	km_wr_init(&body);
	km_fetch_response_encode(&body, v, &rs);
	assert_true(km_wr_ok(&body));
	km_wr_i32(w, (int32_t)(body.len + 4 + (v >= 12)));
	km_wr_i32(w, 99);
	if (v >= 12)
		km_wr_uvarint(w, 0);
	km_wr_raw(w, body.buf, body.len);
	assert_true(km_wr_ok(w));
	km_wr_free(&body);
}

/*
 * m/0's answer (build_unmapped_response) to the fetch at logical 30, streamed whole into whole: its
 * frame in *fr, decoded into *got (allocations in *a), m/0's partition returned.
 */
static const km_fetch_response_partition_data *unmapped_answer(int16_t v, uint8_t *recs, size_t len, int64_t base,
							       int64_t base2, km_wr *fr, struct evbuffer *whole,
							       km_fetch_response *got, km_arena *a)
{
	size_t hl = 8 + (v >= 12);
	km_off_req *c;
	int agains = 0;
	km_rd r;

	km_wr_init(fr);
	build_unmapped_response(fr, v, recs, len, base, base2);
	c = fetch_ctx(v);
	stream(fr->buf, fr->len, v, NULL, 0, c, whole, &agains);
	km_off_req_free(c);
	km_arena_init(a, 0);
	km_fetch_response_init(got);
	km_rd_init(&r, evbuffer_pullup(whole, -1) + hl, fr->len - hl);
	assert_int_equal(km_fetch_response_decode(&r, v, got, a), KM_OK);
	assert_int_equal(r.pos, fr->len - hl);
	return got->responses.items[0].partitions.items;
}

/*
 * m/0's records, every batch hidden (at or past the tail at 300, or at 160 between the runs):
 * presented as empty records from v12 on, below the fetch position before. With base2 in the
 * second run (200 to 299), a mapped batch follows: presented one by one.
 */
static void check_unmapped(int16_t v, size_t len, bool every_cut, int64_t base, int64_t base2)
{
	bool blank = base2 < 200 || base2 >= 300; /* nothing mapped: 200 to 299 is the second run's */
	uint8_t *recs = malloc(len);
	km_wr fr;
	struct evbuffer *whole = evbuffer_new();
	km_fetch_response got;
	const km_fetch_response_partition_data *p;
	km_off_req *c;
	km_arena a;
	const uint8_t *out;
	int agains = 0;

	assert_non_null(recs);
	p = unmapped_answer(v, recs, len, base, base2, &fr, whole, &got, &a);
	out = evbuffer_pullup(whole, -1);
	assert_int_equal(p[0].high_watermark, 160); /* the tail */
	if (!blank) {
		assert_int_equal(p[0].records.len, (int32_t)len);
		assert_true((int64_t)km_be64(p[0].records.p) < 30); /* the hidden one below the fetch position */
		assert_int_equal((int64_t)km_be64(p[0].records.p + len / 2), 50); /* the mapped one */
	} else if (v >= 12) {
		assert_int_equal(p[0].records.len, 0);
		assert_int_equal(p[0].unknown_tags.count, 1);
		assert_int_equal(p[0].unknown_tags.items[0].tag, 10000);
	} else {
		assert_int_equal(p[0].records.len, (int32_t)len);
		assert_true((int64_t)km_be64(p[0].records.p) < 30); /* below the fetch position */
	}
	/* The next topic as it came. */
	p = got.responses.items[1].partitions.items;
	assert_int_equal(p[0].records.len, (int32_t)sizeof(RECS_PLAIN));
	assert_memory_equal(p[0].records.p, RECS_PLAIN, sizeof(RECS_PLAIN));
	km_arena_free(&a);
	/* Cut anywhere: the same bytes out (the partition waits for its last byte when it must). */
	for (size_t cut = 1; every_cut && cut < fr.len; cut++) {
		struct evbuffer *o = evbuffer_new();
		c = fetch_ctx(v);
		stream(fr.buf, fr.len, v, &cut, 1, c, o, &agains);
		km_off_req_free(c);
		assert_memory_equal(evbuffer_pullup(o, -1), out, fr.len);
		evbuffer_free(o);
	}
	evbuffer_free(whole);
	km_wr_free(&fr);
	free(recs);
}

/*
 * A reader at logical 30 whose answer holds only a batch mapped wholly below 30 (10 to 14: a reader
 * ahead of the tail, sent to the physical tail, answered with the batches that moved the tail):
 * v12+, empty records, as at the tail; a batch that reaches 30 (26 to 30) goes out as it is. Before,
 * librdkafka took such an answer for a fetch size too small (finding 16, the second hour run).
 */
static void check_below_position(int16_t v, int64_t base, bool blank)
{
	uint8_t recs[80];
	km_wr fr;
	struct evbuffer *whole = evbuffer_new();
	km_fetch_response got;
	const km_fetch_response_partition_data *p;
	km_arena a;

	p = unmapped_answer(v, recs, sizeof(recs), base, -1, &fr, whole, &got, &a);
	if (blank) {
		assert_int_equal(p[0].records.len, 0);
	} else {
		assert_int_equal(p[0].records.len, (int32_t)sizeof(recs));
		assert_int_equal((int64_t)km_be64(p[0].records.p), base - 100);
	}
	km_arena_free(&a);
	evbuffer_free(whole);
	km_wr_free(&fr);
}

static void test_fetch_response_below_position(void **state)
{
	int16_t vs[] = {12, 13, KM_FETCH_RESPONSE_MAX_VERSION};
	(void)state;
	for (size_t k = 0; k < sizeof(vs) / sizeof(vs[0]); k++) {
		check_below_position(vs[k], 110, true);
		check_below_position(vs[k], 126, false);
	}
}

static void test_fetch_response_unmapped_tail(void **state)
{
	int16_t vs[] = {5, 11, 12, 13, KM_FETCH_RESPONSE_MAX_VERSION};
	(void)state;
	for (size_t k = 0; k < sizeof(vs) / sizeof(vs[0]); k++) {
		check_unmapped(vs[k], 80, true, 300, -1);
		/* Every length where the size of the filler's value changes width (128, 16384: minimal or not). */
		for (size_t len = 61; len < 400; len++)
			check_unmapped(vs[k], len, false, 300, -1);
		for (size_t len = 16300; len < 16500; len++)
			check_unmapped(vs[k], len, false, 300, -1);
		/* Hidden between the runs, below the tail (finding 16): alone, two of them, then before a mapped one. */
		check_unmapped(vs[k], 80, true, 160, -1);
		check_unmapped(vs[k], 160, true, 160, 170);
		check_unmapped(vs[k], 160, true, 160, 200);
	}
}

/* ---- whole responses ---- */

static km_off_req *ctx_for(int16_t key, int16_t v)
{
	km_off_req *c = km_off_req_new(key, v, &LK);
	assert_non_null(c);
	return c;
}

static void check_list_offsets(int16_t v)
{
	km_list_offsets_request rq;
	km_list_offsets_request_list_offsets_topic rt[2];
	km_list_offsets_request_list_offsets_partition rp[6];
	km_list_offsets_response rs, got;
	km_list_offsets_response_list_offsets_topic_response st[2];
	km_list_offsets_response_list_offsets_partition_response sp[6];
	int64_t ts[5] = {-1, -2, -3, 1000, -4}, phys[5] = {300, 100, 230, 150, 100}, want[5] = {160, 0, 80, 50, 0};
	km_wr w, out;
	km_off_req *c = NULL;
	bool rw, changed;
	km_arena a;
	km_rd r;

	km_list_offsets_request_init(&rq);
	km_list_offsets_response_init(&rs);
	for (int i = 0; i < 2; i++) {
		km_list_offsets_request_list_offsets_topic_init(&rt[i]);
		km_list_offsets_response_list_offsets_topic_response_init(&st[i]);
	}
	/* m/0 asked five ways (one partition per entry: the map is the same), plain/0 latest. */
	for (int i = 0; i < 6; i++) {
		km_list_offsets_request_list_offsets_partition_init(&rp[i]);
		km_list_offsets_response_list_offsets_partition_response_init(&sp[i]);
		rp[i].partition_index = sp[i].partition_index = i < 5 ? (i == 0 ? 0 : i == 1 ? 2 : 100 + i) : 0;
		rp[i].timestamp = i < 5 ? ts[i] : -1;
		sp[i].offset = i < 5 ? phys[i] : 300;
		sp[i].timestamp = i < 5 && ts[i] >= -1 && ts[i] != -1 ? 999 : -1;
	}
	/* Partitions 0 and 2 have the map: the others of m do not, so use 0 and 2 for two kinds, then reuse via more requests. */
	rt[0].name = st[0].name = km_str_c("m");
	rt[0].partitions.count = st[0].partitions.count = 2;
	rt[0].partitions.items = rp;
	st[0].partitions.items = sp;
	rt[1].name = st[1].name = km_str_c("plain");
	rt[1].partitions.count = st[1].partitions.count = 1;
	rt[1].partitions.items = &rp[5];
	st[1].partitions.items = &sp[5];
	for (int k = 0; k < 5; k += 2) {
		/* Two kinds per round, on m/0 and m/2. */
		for (int j = 0; j < 2; j++) {
			int i = k + j < 5 ? k + j : 0;
			rp[j].timestamp = ts[i];
			sp[j].offset = phys[i];
			rp[j].partition_index = sp[j].partition_index = j == 0 ? 0 : 2;
		}
		rq.topics.count = rs.topics.count = 2;
		rq.topics.items = rt;
		rs.topics.items = st;
		km_wr_init(&w);
		km_wr_init(&out);
		km_list_offsets_request_encode(&w, v, &rq);
		assert_int_equal(km_off_request(KM_API_LIST_OFFSETS, v, w.buf, w.len, &LK, &c, &rw, &out), KM_OK);
		assert_non_null(c);
		assert_false(rw);
		km_wr_free(&w);
		km_wr_init(&w);
		km_list_offsets_response_encode(&w, v, &rs);
		assert_int_equal(km_off_response(c, w.buf, w.len, &changed, &out), KM_OK);
		assert_true(changed);
		km_arena_init(&a, 0);
		km_list_offsets_response_init(&got);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_list_offsets_response_decode(&r, v, &got, &a), KM_OK);
		for (int j = 0; j < 2; j++) {
			int i = k + j < 5 ? k + j : 0;
			assert_int_equal(got.topics.items[0].partitions.items[j].offset, want[i]);
		}
		assert_int_equal(got.topics.items[1].partitions.items[0].offset, 300);
		km_arena_free(&a);
		km_off_req_free(c);
		c = NULL;
		km_wr_free(&w);
		km_wr_free(&out);
	}
	/* Only plain asked: no context, the response goes as it came. */
	rq.topics.count = 1;
	rq.topics.items = &rt[1];
	km_wr_init(&w);
	km_wr_init(&out);
	km_list_offsets_request_encode(&w, v, &rq);
	assert_int_equal(km_off_request(KM_API_LIST_OFFSETS, v, w.buf, w.len, &LK, &c, &rw, &out), KM_OK);
	assert_null(c);
	km_wr_free(&w);
	km_wr_free(&out);
}

static void test_list_offsets(void **state)
{
	(void)state;
	check_list_offsets(KM_LIST_OFFSETS_REQUEST_MIN_VERSION);
	check_list_offsets(KM_LIST_OFFSETS_REQUEST_MAX_VERSION);
}

static void test_offset_for_leader_epoch(void **state)
{
	int16_t vs[] = {KM_OFFSET_FOR_LEADER_EPOCH_RESPONSE_MIN_VERSION, KM_OFFSET_FOR_LEADER_EPOCH_RESPONSE_MAX_VERSION};
	(void)state;
	for (size_t k = 0; k < 2; k++) {
		int16_t v = vs[k];
		km_offset_for_leader_epoch_response rs, got;
		km_offset_for_leader_epoch_response_offset_for_leader_topic_result t[2];
		km_offset_for_leader_epoch_response_epoch_end_offset p[4];
		km_off_req *c = ctx_for(KM_API_OFFSET_FOR_LEADER_EPOCH, v);
		km_wr w, out;
		bool changed;
		km_arena a;
		km_rd r;
		km_offset_for_leader_epoch_response_init(&rs);
		for (int i = 0; i < 4; i++) {
			km_offset_for_leader_epoch_response_epoch_end_offset_init(&p[i]);
			p[i].leader_epoch = 3;
		}
		p[0].partition = 0;
		p[0].end_offset = 300; /* the tail */
		p[1].partition = 2;
		p[1].end_offset = 140; /* the end of the first run: hidden, the next run's start */
		p[2].partition = 0;
		p[2].end_offset = 320; /* past the tail: what is there (a follower's tail is behind), not the tail */
		p[3].partition = 0;
		p[3].end_offset = 140;
		for (int i = 0; i < 2; i++)
			km_offset_for_leader_epoch_response_offset_for_leader_topic_result_init(&t[i]);
		t[0].topic = km_str_c("m");
		t[0].partitions.count = 3;
		t[0].partitions.items = p;
		t[1].topic = km_str_c("plain");
		t[1].partitions.count = 1;
		t[1].partitions.items = &p[3];
		rs.topics.count = 2;
		rs.topics.items = t;
		km_wr_init(&w);
		km_wr_init(&out);
		km_offset_for_leader_epoch_response_encode(&w, v, &rs);
		assert_int_equal(km_off_response(c, w.buf, w.len, &changed, &out), KM_OK);
		assert_true(changed);
		km_arena_init(&a, 0);
		km_offset_for_leader_epoch_response_init(&got);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_offset_for_leader_epoch_response_decode(&r, v, &got, &a), KM_OK);
		assert_int_equal(got.topics.items[0].partitions.items[0].end_offset, 160);
		assert_int_equal(got.topics.items[0].partitions.items[1].end_offset, 50);
		assert_int_equal(got.topics.items[0].partitions.items[2].end_offset, 180);
		assert_int_equal(got.topics.items[1].partitions.items[0].end_offset, 140);
		km_arena_free(&a);
		/* Only plain: not changed, nothing written. */
		rs.topics.count = 1;
		rs.topics.items = &t[1];
		km_wr_free(&w);
		km_wr_free(&out);
		km_wr_init(&w);
		km_wr_init(&out);
		km_offset_for_leader_epoch_response_encode(&w, v, &rs);
		assert_int_equal(km_off_response(c, w.buf, w.len, &changed, &out), KM_OK);
		assert_false(changed);
		assert_int_equal(out.len, 0);
		km_wr_free(&w);
		km_wr_free(&out);
		km_off_req_free(c);
	}
}

static void test_delete_records(void **state)
{
	(void)state;
	for (int16_t v = KM_DELETE_RECORDS_RESPONSE_MIN_VERSION; v <= KM_DELETE_RECORDS_RESPONSE_MAX_VERSION; v += 2) {
		km_delete_records_request rq, gotq;
		km_delete_records_request_delete_records_topic rt[2];
		km_delete_records_request_delete_records_partition rp[3];
		km_delete_records_response rs, got;
		km_delete_records_response_delete_records_topic_result st[2];
		km_delete_records_response_delete_records_partition_result sp[3];
		km_off_req *c = NULL;
		km_wr w, out;
		bool rw, changed;
		km_arena a;
		km_rd r;

		km_delete_records_request_init(&rq);
		km_delete_records_response_init(&rs);
		for (int i = 0; i < 3; i++) {
			km_delete_records_request_delete_records_partition_init(&rp[i]);
			km_delete_records_response_delete_records_partition_result_init(&sp[i]);
		}
		rp[0].partition_index = sp[0].partition_index = 0;
		rp[0].offset = 60;   /* -> 210 */
		sp[0].low_watermark = 210;
		rp[1].partition_index = sp[1].partition_index = 2;
		rp[1].offset = -1;   /* the high watermark: stays */
		sp[1].low_watermark = 300;
		rp[2].partition_index = sp[2].partition_index = 0;
		rp[2].offset = 60;
		sp[2].low_watermark = 60;
		for (int i = 0; i < 2; i++) {
			km_delete_records_request_delete_records_topic_init(&rt[i]);
			km_delete_records_response_delete_records_topic_result_init(&st[i]);
		}
		rt[0].name = st[0].name = km_str_c("m");
		rt[0].partitions.count = st[0].partitions.count = 2;
		rt[0].partitions.items = rp;
		st[0].partitions.items = sp;
		rt[1].name = st[1].name = km_str_c("plain");
		rt[1].partitions.count = st[1].partitions.count = 1;
		rt[1].partitions.items = &rp[2];
		st[1].partitions.items = &sp[2];
		rq.topics.count = rs.topics.count = 2;
		rq.topics.items = rt;
		rs.topics.items = st;
		rq.timeout_ms = 1000;
		km_wr_init(&w);
		km_wr_init(&out);
		km_delete_records_request_encode(&w, v, &rq);
		assert_int_equal(km_off_request(KM_API_DELETE_RECORDS, v, w.buf, w.len, &LK, &c, &rw, &out), KM_OK);
		assert_true(rw);
		assert_non_null(c);
		km_arena_init(&a, 0);
		km_delete_records_request_init(&gotq);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_delete_records_request_decode(&r, v, &gotq, &a), KM_OK);
		assert_int_equal(gotq.topics.items[0].partitions.items[0].offset, 210);
		assert_int_equal(gotq.topics.items[0].partitions.items[1].offset, -1);
		assert_int_equal(gotq.topics.items[1].partitions.items[0].offset, 60);
		assert_int_equal(gotq.timeout_ms, 1000);
		km_wr_free(&w);
		km_wr_free(&out);
		km_wr_init(&w);
		km_wr_init(&out);
		km_delete_records_response_encode(&w, v, &rs);
		assert_int_equal(km_off_response(c, w.buf, w.len, &changed, &out), KM_OK);
		assert_true(changed);
		km_delete_records_response_init(&got);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_delete_records_response_decode(&r, v, &got, &a), KM_OK);
		assert_int_equal(got.topics.items[0].partitions.items[0].low_watermark, 60);
		assert_int_equal(got.topics.items[0].partitions.items[1].low_watermark, 160);
		assert_int_equal(got.topics.items[1].partitions.items[0].low_watermark, 60);
		km_arena_free(&a);
		km_off_req_free(c);
		km_wr_free(&w);
		km_wr_free(&out);
	}
}

/* After a stop: the stop persisted a run at the tail (logical 160 at physical 300), and no pipeline runs the partition. */
static km_offrun RUNS_STOPPED[] = {{0, 100, -1}, {50, 200, 40}, {160, 300, 150}};

static void test_produce_response(void **state)
{
	int16_t vs[] = {KM_PRODUCE_RESPONSE_MIN_VERSION, 12, KM_PRODUCE_RESPONSE_MAX_VERSION};
	km_offmap mirroring = MAP;
	(void)state;
	MAP = (km_offmap){RUNS_STOPPED, 3, 3, -1, -1};
	for (size_t k = 0; k < sizeof(vs) / sizeof(vs[0]); k++) {
		int16_t v = vs[k];
		km_produce_response rs, got;
		km_produce_response_topic_produce_response t[2];
		km_produce_response_partition_produce_response p[2];
		km_off_req *c = ctx_for(KM_API_PRODUCE, v);
		km_wr w, out;
		bool changed;
		km_arena a;
		km_rd r;
		km_produce_response_init(&rs);
		for (int i = 0; i < 2; i++) {
			km_produce_response_partition_produce_response_init(&p[i]);
			km_produce_response_topic_produce_response_init(&t[i]);
			p[i].index = 0;
			p[i].base_offset = 300; /* after a stop: the first write lands at the physical tail */
			p[i].log_start_offset = 100;
		}
		t[0].name = km_str_c("m");
		t[0].topic_id = M_ID;
		t[1].name = km_str_c("plain");
		t[1].topic_id = P_ID;
		for (int i = 0; i < 2; i++) {
			t[i].partition_responses.count = 1;
			t[i].partition_responses.items = &p[i];
		}
		rs.responses.count = 2;
		rs.responses.items = t;
		km_wr_init(&w);
		km_wr_init(&out);
		km_produce_response_encode(&w, v, &rs);
		assert_int_equal(km_off_response(c, w.buf, w.len, &changed, &out), KM_OK);
		assert_true(changed);
		km_arena_init(&a, 0);
		km_produce_response_init(&got);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_produce_response_decode(&r, v, &got, &a), KM_OK);
		/* The new record follows the source's last one: the logical tail. */
		assert_int_equal(got.responses.items[0].partition_responses.items[0].base_offset, 160);
		assert_int_equal(got.responses.items[0].partition_responses.items[0].log_start_offset, v >= 5 ? 0 : -1);
		assert_int_equal(got.responses.items[1].partition_responses.items[0].base_offset, 300);
		km_arena_free(&a);
		km_wr_free(&w);
		km_wr_free(&out);
		km_off_req_free(c);
	}
	MAP = mirroring;
}

static void test_describe_producers(void **state)
{
	km_describe_producers_response rs, got;
	km_describe_producers_response_topic_response t;
	km_describe_producers_response_partition_response p;
	km_describe_producers_response_producer_state ps[2];
	km_off_req *c = ctx_for(KM_API_DESCRIBE_PRODUCERS, 0);
	km_wr w, out;
	bool changed;
	km_arena a;
	km_rd r;
	(void)state;
	km_describe_producers_response_init(&rs);
	km_describe_producers_response_topic_response_init(&t);
	km_describe_producers_response_partition_response_init(&p);
	for (int i = 0; i < 2; i++) {
		km_describe_producers_response_producer_state_init(&ps[i]);
		ps[i].producer_id = 40 + i;
	}
	ps[0].current_txn_start_offset = 210;
	ps[1].current_txn_start_offset = -1;
	p.partition_index = 0;
	p.active_producers.count = 2;
	p.active_producers.items = ps;
	t.name = km_str_c("m");
	t.partitions.count = 1;
	t.partitions.items = &p;
	rs.topics.count = 1;
	rs.topics.items = &t;
	km_wr_init(&w);
	km_wr_init(&out);
	km_describe_producers_response_encode(&w, 0, &rs);
	assert_int_equal(km_off_response(c, w.buf, w.len, &changed, &out), KM_OK);
	assert_true(changed);
	km_arena_init(&a, 0);
	km_describe_producers_response_init(&got);
	km_rd_init(&r, out.buf, out.len);
	assert_int_equal(km_describe_producers_response_decode(&r, 0, &got, &a), KM_OK);
	assert_int_equal(got.topics.items[0].partitions.items[0].active_producers.items[0].current_txn_start_offset, 60);
	assert_int_equal(got.topics.items[0].partitions.items[0].active_producers.items[1].current_txn_start_offset, -1);
	km_arena_free(&a);
	km_wr_free(&w);
	km_wr_free(&out);
	km_off_req_free(c);
}

/* Committed group offsets are logical already: OffsetCommit, OffsetFetch and TxnOffsetCommit are plain forwards. */
static void test_group_offsets_untouched(void **state)
{
	km_proxy_apis *t = km_proxy_apis_new();
	int16_t keys[] = {KM_API_OFFSET_COMMIT, KM_API_OFFSET_FETCH, KM_API_TXN_OFFSET_COMMIT};
	(void)state;
	assert_non_null(t);
	for (size_t i = 0; i < 3; i++) {
		const km_proxy_api *a = km_proxy_apis_find(t, keys[i]);
		assert_non_null(a);
		assert_null(a->classify);
		assert_null(a->on_request);
		assert_null(a->on_response);
		assert_null(a->rewrite);
		assert_null(a->stream);
		assert_int_equal(a->req, KM_REQ_FORWARD);
		assert_int_equal(a->resp, KM_RESP_FORWARD);
	}
	/* And the rows this module owns are in the table with their hooks. */
	assert_non_null(km_proxy_apis_find(t, KM_API_FETCH)->on_request);
	assert_true(km_proxy_apis_find(t, KM_API_FETCH)->stream->on_batch == km_off_fetch_batch);
	assert_non_null(km_proxy_apis_find(t, KM_API_LIST_OFFSETS)->on_request);
	assert_non_null(km_proxy_apis_find(t, KM_API_OFFSET_FOR_LEADER_EPOCH)->on_request);
	assert_non_null(km_proxy_apis_find(t, KM_API_DESCRIBE_PRODUCERS)->on_request);
	km_proxy_apis_free(t);
}

/*
 * A response in another order than its request (ListOffsets of thousands of partitions comes back
 * grouped by topic): every entry is found by its index, by name and by id, and what the request
 * did not name is not. 20,000 entries looked up in reverse: a scan per lookup would be 2 x 10^8
 * comparisons, seconds; the index makes it milliseconds.
 */
static void test_req_find_out_of_order(void **state)
{
	enum { TOPICS = 2000, PARTS = 10, N = TOPICS * PARTS + 1 };
	static char names[TOPICS][16];
	km_off_req *c = km_off_req_new(KM_API_LIST_OFFSETS, 7, &LK);

	(void)state;
	assert_non_null(c);
	c->entries = calloc(N, sizeof(*c->entries));
	assert_non_null(c->entries);
	c->cap = N;
	for (int t = 0; t < TOPICS; t++) {
		snprintf(names[t], sizeof(names[t]), "topic-%04d", t);
		for (int p = 0; p < PARTS; p++) {
			km_off_entry *e = &c->entries[c->n++];
			e->topic = km_str_c(names[t]);
			e->partition = p;
			e->value = t * PARTS + p;
		}
	}
	/* One by id (Fetch v13+): no name. */
	c->entries[c->n].topic = (km_str){"", 0};
	c->entries[c->n].id = M_ID;
	c->entries[c->n].partition = 3;
	c->entries[c->n++].value = -7;
	for (int i = TOPICS * PARTS - 1; i >= 0; i--) {
		const km_off_entry *e = km_off_req_find(c, km_str_c(names[i / PARTS]), NULL, i % PARTS);
		assert_non_null(e);
		assert_int_equal(e->value, i);
	}
	assert_int_equal(km_off_req_find(c, (km_str){"", 0}, &M_ID, 3)->value, -7);
	assert_null(km_off_req_find(c, (km_str){"", 0}, &M_ID, 4));
	assert_null(km_off_req_find(c, (km_str){"", 0}, &P_ID, 3));
	assert_null(km_off_req_find(c, km_str_c("topic-0001"), NULL, PARTS));
	assert_null(km_off_req_find(c, km_str_c("topic-9999"), NULL, 0));
	/* In request order the cursor finds each at once, as before. */
	assert_int_equal(km_off_req_find(c, km_str_c("topic-0000"), NULL, 0)->value, 0);
	assert_int_equal(km_off_req_find(c, km_str_c("topic-0000"), NULL, 1)->value, 1);
	km_off_req_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_logical),
		cmocka_unit_test(test_fetch_request_lowest),
		cmocka_unit_test(test_fetch_request_highest),
		cmocka_unit_test(test_fetch_request_past_tail),
		cmocka_unit_test(test_fetch_request_below_log_start),
		cmocka_unit_test(test_fetch_request_plain),
		cmocka_unit_test(test_fetch_request_incremental),
		cmocka_unit_test(test_fetch_response_lowest),
		cmocka_unit_test(test_fetch_response_highest),
		cmocka_unit_test(test_fetch_response_untouched),
		cmocka_unit_test(test_fetch_response_incremental),
		cmocka_unit_test(test_fetch_response_unmapped_tail),
		cmocka_unit_test(test_fetch_response_below_position),
		cmocka_unit_test(test_fetch_trace),
		cmocka_unit_test(test_list_offsets),
		cmocka_unit_test(test_offset_for_leader_epoch),
		cmocka_unit_test(test_delete_records),
		cmocka_unit_test(test_produce_response),
		cmocka_unit_test(test_describe_producers),
		cmocka_unit_test(test_group_offsets_untouched),
		cmocka_unit_test(test_req_find_out_of_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
