/* Unit tests of share group offset translation on mirror topics: run pieces, ShareFetch/ShareAcknowledge acknowledgements, ShareFetch records and acquired ranges, over a fake lookup with a two-run map (and one at the top of the offset range). */
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kmirror/batch.h"
#include "kmirror/msg/share_acknowledge_request.h"
#include "kmirror/msg/share_fetch_request.h"
#include "kmirror/msg/share_fetch_response.h"
#include "proxy/share_offsets.h"

/*
 * Topic M_ID partition 0 has the map: logical [0, 40) at physical [100, 140), a hole at logical
 * [40, 50), physical [140, 200) hidden, logical 50 on at physical 200 (the open run), the tail at
 * physical 300 / logical 160 (the source ended in a hole), so the open run covers logical
 * [50, 150); it was LogAppendTime at the source. Partition 1 of M_ID and topic P_ID have none.
 */
static const km_uuid M_ID = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
static const km_uuid P_ID = {{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}};
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
	(void)name;
	return id && km_uuid_eq(id, &M_ID) ? TOPIC_M : NULL;
}

static const km_offmap *fake_map(void *arg, const void *topic, int32_t partition)
{
	(void)arg;
	return topic == TOPIC_M && partition == 0 ? &MAP : NULL;
}

static const km_off_lookup LK = {fake_active, fake_topic, fake_map, NULL};

/* A piece: its first offsets and how many follow (its length - 1). */
static void assert_piece(const km_share_piece *p, int64_t logical, int64_t physical, int64_t last_delta)
{
	assert_int_equal(p->logical, logical);
	assert_int_equal(p->physical, physical);
	assert_int_equal(p->last_delta, last_delta);
}

/* ---- pieces ---- */

static void test_pieces(void **state)
{
	km_share_piece p[4];
	km_offmap empty;
	(void)state;

	/* Across the hole: one piece per run, the hole left out. */
	assert_int_equal(km_share_logical_pieces(&MAP, 30, 60, p, 4), 2);
	assert_piece(&p[0], 30, 130, 9);
	assert_piece(&p[1], 50, 200, 10);
	/* Inside one run: as it is. */
	assert_int_equal(km_share_logical_pieces(&MAP, 5, 9, p, 4), 1);
	assert_piece(&p[0], 5, 105, 4);
	/* Wholly in the hole, past the open run's end (the tail), a range that is not one: nothing. */
	assert_int_equal(km_share_logical_pieces(&MAP, 40, 49, p, 4), 0);
	assert_int_equal(km_share_logical_pieces(&MAP, 150, 170, p, 4), 0);
	assert_int_equal(km_share_logical_pieces(&MAP, 9, 5, p, 4), 0);
	assert_int_equal(km_share_logical_pieces(&MAP, -1, 5, p, 4), 0);
	/* The count is returned whatever the room. */
	assert_int_equal(km_share_logical_pieces(&MAP, 0, 200, NULL, 0), 2);

	/* Physical: the hidden part [140, 200) has no piece. */
	assert_int_equal(km_share_physical_pieces(&MAP, 130, 210, p, 4), 2);
	assert_piece(&p[0], 30, 130, 9);
	assert_piece(&p[1], 50, 200, 10);
	assert_int_equal(km_share_physical_pieces(&MAP, 150, 199, p, 4), 0);
	assert_int_equal(km_share_physical_pieces(&MAP, 0, 99, p, 4), 0); /* before every run: hidden */
	assert_int_equal(km_share_physical_pieces(&MAP, 295, 310, p, 4), 1); /* cut at the tail */
	assert_piece(&p[0], 145, 295, 4);

	/* No run: with no pipeline (stopped before anything was mirrored) the offsets themselves, else nothing. */
	km_offmap_init(&empty);
	assert_int_equal(km_share_logical_pieces(&empty, 3, 7, p, 4), 1);
	assert_piece(&p[0], 3, 3, 4);
	empty.tail_physical = 10;
	empty.tail_logical = 20;
	assert_int_equal(km_share_physical_pieces(&empty, 3, 7, p, 4), 0);

	/* The open run without a tail (a stopped pipeline): no end. */
	{
		km_offmap open = MAP;
		open.tail_physical = open.tail_logical = -1;
		assert_int_equal(km_share_logical_pieces(&open, 1000, 1009, p, 4), 1);
		assert_piece(&p[0], 1000, 1150, 9);
	}
}

/* ---- requests ---- */

static int8_t TYPES15[15] = {1, 1, 2, 3, 1, 1, 1, 1, 1, 1, 3, 2, 1, 1, 1};
static int8_t ACCEPT[1] = {1};

/* The acknowledgement batches every request test sends for partition 0 of m (and 1, and plain). */
typedef struct ack_in {
	int64_t first, last;
	int8_t *types;
	int32_t ntypes;
} ack_in;

static const ack_in ACKS[] = {
	{30, 60, ACCEPT, 1},  /* over the hole: two pieces, the type for each */
	{38, 52, TYPES15, 15}, /* one type per offset: split with the offsets, the hole's dropped */
	{42, 45, ACCEPT, 1},  /* wholly in the hole: gone */
	{7, 7, ACCEPT, 1},    /* inside a run: moved */
};
#define NACKS (sizeof(ACKS) / sizeof(ACKS[0]))

static void build_share_fetch_request(km_wr *w, int16_t v, bool with_m)
{
	km_share_fetch_request rq;
	km_share_fetch_request_fetch_topic t[2];
	km_share_fetch_request_fetch_partition p[3];
	km_share_fetch_request_acknowledgement_batch b[NACKS];

	km_share_fetch_request_init(&rq);
	for (size_t i = 0; i < NACKS; i++) {
		km_share_fetch_request_acknowledgement_batch_init(&b[i]);
		b[i].first_offset = ACKS[i].first;
		b[i].last_offset = ACKS[i].last;
		b[i].acknowledge_types.count = ACKS[i].ntypes;
		b[i].acknowledge_types.items = ACKS[i].types;
	}
	for (int i = 0; i < 3; i++) {
		km_share_fetch_request_fetch_partition_init(&p[i]);
		p[i].partition_index = i == 1 ? 1 : 0;
		p[i].acknowledgement_batches.count = (int32_t)NACKS;
		p[i].acknowledgement_batches.items = b;
	}
	for (int i = 0; i < 2; i++)
		km_share_fetch_request_fetch_topic_init(&t[i]);
	t[0].topic_id = M_ID;
	t[0].partitions.count = 2;
	t[0].partitions.items = p;
	t[1].topic_id = P_ID;
	t[1].partitions.count = 1;
	t[1].partitions.items = &p[2];
	rq.group_id = km_str_c("g");
	rq.member_id = km_str_c("member");
	rq.share_session_epoch = 3;
	rq.max_wait_ms = 500;
	rq.min_bytes = 1;
	rq.max_records = 500;
	rq.batch_size = 500;
	rq.topics.count = with_m ? 2 : 1;
	rq.topics.items = with_m ? t : &t[1];
	km_share_fetch_request_encode(w, v, &rq);
	assert_true(km_wr_ok(w));
}

static void assert_ack(const km_share_fetch_request_acknowledgement_batch *b, int64_t first, int64_t last,
		       const int8_t *types, int32_t ntypes)
{
	assert_int_equal(b->first_offset, first);
	assert_int_equal(b->last_offset, last);
	assert_int_equal(b->acknowledge_types.count, ntypes);
	assert_memory_equal(b->acknowledge_types.items, types, (size_t)ntypes);
}

/* The mapped partition's batches as translated; the other two as they were sent. */
static void assert_translated_acks(const km_share_fetch_request_acknowledgement_batch *b, int32_t n)
{
	assert_int_equal(n, 5);
	assert_ack(&b[0], 130, 139, ACCEPT, 1);
	assert_ack(&b[1], 200, 210, ACCEPT, 1);
	assert_ack(&b[2], 138, 139, TYPES15, 2);      /* logical 38, 39 */
	assert_ack(&b[3], 200, 202, TYPES15 + 12, 3); /* logical 50..52: the last three types */
	assert_ack(&b[4], 107, 107, ACCEPT, 1);
}

static void assert_untouched_acks(const km_share_fetch_request_acknowledgement_batch *b, int32_t n)
{
	assert_int_equal(n, (int32_t)NACKS);
	for (size_t i = 0; i < NACKS; i++)
		assert_ack(&b[i], ACKS[i].first, ACKS[i].last, ACKS[i].types, ACKS[i].ntypes);
}

static void test_share_fetch_request(void **state)
{
	(void)state;
	for (int16_t v = 1; v <= 2; v++) {
		km_wr in, out;
		km_share_fetch_request rq;
		km_arena a;
		km_rd r;
		bool changed = true;

		km_wr_init(&in);
		km_wr_init(&out);
		build_share_fetch_request(&in, v, true);
		assert_int_equal(km_share_request_translate(KM_API_SHARE_FETCH, v, in.buf, in.len, &LK, &changed, &out),
				 KM_OK);
		assert_true(changed);
		km_arena_init(&a, 0);
		km_share_fetch_request_init(&rq);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_share_fetch_request_decode(&r, v, &rq, &a), KM_OK);
		assert_int_equal(r.pos, out.len);
		assert_int_equal(rq.topics.count, 2);
		assert_int_equal(rq.share_session_epoch, 3);
		assert_int_equal(rq.topics.items[0].partitions.items[0].partition_index, 0);
		assert_translated_acks(rq.topics.items[0].partitions.items[0].acknowledgement_batches.items,
				       rq.topics.items[0].partitions.items[0].acknowledgement_batches.count);
		assert_untouched_acks(rq.topics.items[0].partitions.items[1].acknowledgement_batches.items,
				      rq.topics.items[0].partitions.items[1].acknowledgement_batches.count);
		assert_untouched_acks(rq.topics.items[1].partitions.items[0].acknowledgement_batches.items,
				      rq.topics.items[1].partitions.items[0].acknowledgement_batches.count);
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);

		/* No mapped partition, or no mirror at all: nothing to do. */
		km_wr_init(&in);
		km_wr_init(&out);
		build_share_fetch_request(&in, v, false);
		assert_int_equal(km_share_request_translate(KM_API_SHARE_FETCH, v, in.buf, in.len, &LK, &changed, &out),
				 KM_OK);
		assert_false(changed);
		assert_int_equal(out.len, 0);
		km_wr_free(&in);
		km_wr_init(&in);
		build_share_fetch_request(&in, v, true);
		ACTIVE = false;
		assert_int_equal(km_share_request_translate(KM_API_SHARE_FETCH, v, in.buf, in.len, &LK, &changed, &out),
				 KM_OK);
		ACTIVE = true;
		assert_false(changed);
		/* A truncated request is refused (the connection is closed). */
		assert_int_not_equal(km_share_request_translate(KM_API_SHARE_FETCH, v, in.buf, in.len - 3, &LK, &changed,
								&out), KM_OK);
		assert_false(changed);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

static void test_share_acknowledge_request(void **state)
{
	(void)state;
	for (int16_t v = 1; v <= 2; v++) {
		km_share_acknowledge_request rq, got;
		km_share_acknowledge_request_acknowledge_topic t;
		km_share_acknowledge_request_acknowledge_partition p;
		km_share_acknowledge_request_acknowledgement_batch b[NACKS];
		km_wr in, out;
		km_arena a;
		km_rd r;
		bool changed = false;

		km_share_acknowledge_request_init(&rq);
		for (size_t i = 0; i < NACKS; i++) {
			km_share_acknowledge_request_acknowledgement_batch_init(&b[i]);
			b[i].first_offset = ACKS[i].first;
			b[i].last_offset = ACKS[i].last;
			b[i].acknowledge_types.count = ACKS[i].ntypes;
			b[i].acknowledge_types.items = ACKS[i].types;
		}
		km_share_acknowledge_request_acknowledge_partition_init(&p);
		p.acknowledgement_batches.count = (int32_t)NACKS;
		p.acknowledgement_batches.items = b;
		km_share_acknowledge_request_acknowledge_topic_init(&t);
		t.topic_id = M_ID;
		t.partitions.count = 1;
		t.partitions.items = &p;
		rq.group_id = km_str_c("g");
		rq.member_id = km_str_c("member");
		rq.share_session_epoch = 4;
		rq.is_renew_ack = v >= 2;
		rq.topics.count = 1;
		rq.topics.items = &t;
		km_wr_init(&in);
		km_wr_init(&out);
		km_share_acknowledge_request_encode(&in, v, &rq);
		assert_true(km_wr_ok(&in));
		assert_int_equal(km_share_request_translate(KM_API_SHARE_ACKNOWLEDGE, v, in.buf, in.len, &LK, &changed,
							    &out), KM_OK);
		assert_true(changed);
		km_arena_init(&a, 0);
		km_share_acknowledge_request_init(&got);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_share_acknowledge_request_decode(&r, v, &got, &a), KM_OK);
		assert_int_equal(got.is_renew_ack, v >= 2);
		{
			/* The same fields as ShareFetch's batches: compared the same way. */
			const km_share_acknowledge_request_acknowledgement_batch *g =
				got.topics.items[0].partitions.items[0].acknowledgement_batches.items;
			int32_t n = got.topics.items[0].partitions.items[0].acknowledgement_batches.count;
			int64_t want[5][2] = {{130, 139}, {200, 210}, {138, 139}, {200, 202}, {107, 107}};
			int32_t ntypes[5] = {1, 1, 2, 3, 1};
			assert_int_equal(n, 5);
			for (int i = 0; i < 5; i++) {
				assert_int_equal(g[i].first_offset, want[i][0]);
				assert_int_equal(g[i].last_offset, want[i][1]);
				assert_int_equal(g[i].acknowledge_types.count, ntypes[i]);
			}
			assert_memory_equal(g[3].acknowledge_types.items, TYPES15 + 12, 3);
		}
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

/* ---- ShareFetch responses ---- */

/* One batch of n records at physical base (deltas 0..n-1), appended to w. */
static void add_batch(km_wr *w, int64_t base, int n)
{
	km_batch_params bp;
	km_batch_record recs[16];
	char vals[16][8];
	assert_true(n <= 16);
	km_batch_params_init(&bp);
	bp.base_offset = base;
	for (int i = 0; i < n; i++) {
		snprintf(vals[i], sizeof(vals[i]), "v%d", i);
		recs[i] = (km_batch_record){.timestamp = 1000 + i, .offset_delta = i, .key = KM_BYTES_NULL,
					    .value = {(const uint8_t *)vals[i], (int32_t)strlen(vals[i])}};
	}
	assert_int_equal(km_batch_build(&bp, recs, (size_t)n, w), KM_OK);
}

/* The records' batch base offsets, in order (n at most cap). */
static size_t batch_bases(const km_bytes *rec, int64_t *out, size_t cap)
{
	size_t n = 0, at = 0;
	while (rec->len > 0 && (size_t)rec->len - at >= 12 && n < cap) {
		out[n++] = (int64_t)km_be64(rec->p + at);
		at += 12 + km_be32(rec->p + at + 8);
		if (at > (size_t)rec->len)
			break;
	}
	return n;
}

static void build_share_fetch_response(km_wr *w, int16_t v, bool cut)
{
	km_share_fetch_response rs;
	km_share_fetch_response_share_fetchable_topic_response t[2];
	km_share_fetch_response_partition_data p[3];
	km_share_fetch_response_acquired_records acq[3] = {
		{130, 202, 1, {0}}, /* over the hidden part and the run boundary */
		{150, 154, 2, {0}}, /* wholly hidden: dropped */
		{203, 203, 3, {0}},
	};
	km_wr recs;

	/* Physical: batch [130, 140) visible, [150, 155) hidden, [200, 204) visible. */
	km_wr_init(&recs);
	add_batch(&recs, 130, 10);
	add_batch(&recs, 150, 5);
	add_batch(&recs, 200, 4);
	if (cut) {
		/* A hidden batch that the response's size cut after its first 20 bytes. */
		size_t at = recs.len;
		add_batch(&recs, 160, 3);
		recs.len = at + 20;
	}
	km_share_fetch_response_init(&rs);
	for (int i = 0; i < 3; i++) {
		km_share_fetch_response_partition_data_init(&p[i]);
		p[i].partition_index = i == 1 ? 1 : 0;
		p[i].records = (km_bytes){recs.buf, (int32_t)recs.len};
		p[i].acquired_records.count = 3;
		p[i].acquired_records.items = acq;
	}
	for (int i = 0; i < 2; i++)
		km_share_fetch_response_share_fetchable_topic_response_init(&t[i]);
	t[0].topic_id = M_ID;
	t[0].partitions.count = 2;
	t[0].partitions.items = p;
	t[1].topic_id = P_ID;
	t[1].partitions.count = 1;
	t[1].partitions.items = &p[2];
	rs.acquisition_lock_timeout_ms = 30000;
	rs.responses.count = 2;
	rs.responses.items = t;
	km_share_fetch_response_encode(w, v, &rs);
	assert_true(km_wr_ok(w));
	km_wr_free(&recs);
}

static void assert_physical_partition(const km_share_fetch_response_partition_data *p, size_t batches)
{
	int64_t b[4];
	assert_int_equal(batch_bases(&p->records, b, 4), batches);
	assert_int_equal(b[0], 130);
	assert_int_equal(b[1], 150);
	assert_int_equal(b[2], 200);
	assert_int_equal(p->acquired_records.count, 3);
	assert_int_equal(p->acquired_records.items[0].first_offset, 130);
	assert_int_equal(p->acquired_records.items[2].last_offset, 203);
}

static void test_share_fetch_response(void **state)
{
	(void)state;
	for (int16_t v = 1; v <= 2; v++) {
		for (int cut = 0; cut < 2; cut++) {
			km_share_fetch_response rs;
			const km_share_fetch_response_partition_data *p;
			km_wr in, out;
			km_arena a;
			km_rd r;
			int64_t b[5];
			bool changed = false;

			km_wr_init(&in);
			km_wr_init(&out);
			build_share_fetch_response(&in, v, cut);
			assert_int_equal(km_share_fetch_response_translate(v, in.buf, in.len, &LK, &changed, &out), KM_OK);
			assert_true(changed);
			km_arena_init(&a, 0);
			km_share_fetch_response_init(&rs);
			km_rd_init(&r, out.buf, out.len);
			assert_int_equal(km_share_fetch_response_decode(&r, v, &rs, &a), KM_OK);
			assert_int_equal(r.pos, out.len);
			assert_int_equal(rs.acquisition_lock_timeout_ms, 30000);
			p = &rs.responses.items[0].partitions.items[0];
			/* Visible batches at their logical base; the hidden one wholly below the lowest acquired (30). */
			assert_int_equal(batch_bases(&p->records, b, 5), cut ? 4 : 3);
			assert_int_equal(b[0], 30);
			assert_int_equal(b[1], 30 - 1 - 4);
			assert_int_equal(b[2], 50);
			if (cut) /* lastOffsetDelta cut off: the widest bound */
				assert_int_equal(b[3], 30 - 1 - (int64_t)INT32_MAX);
			/* Acquired: [130, 202] split at the run boundary and its hidden part dropped; [150, 154] gone. */
			assert_int_equal(p->acquired_records.count, 3);
			assert_int_equal(p->acquired_records.items[0].first_offset, 30);
			assert_int_equal(p->acquired_records.items[0].last_offset, 39);
			assert_int_equal(p->acquired_records.items[0].delivery_count, 1);
			assert_int_equal(p->acquired_records.items[1].first_offset, 50);
			assert_int_equal(p->acquired_records.items[1].last_offset, 52);
			assert_int_equal(p->acquired_records.items[1].delivery_count, 1);
			assert_int_equal(p->acquired_records.items[2].first_offset, 53);
			assert_int_equal(p->acquired_records.items[2].last_offset, 53);
			assert_int_equal(p->acquired_records.items[2].delivery_count, 3);
			/*
			 * The batches are intact (the CRC does not cover baseOffset); the LogAppendTime run's
			 * batch has its attribute back, its CRC fixed; the others are left CreateTime.
			 */
			{
				km_batch_iter it;
				km_batch bt;
				int n = 0;
				km_batch_iter_init(&it, p->records.p, (size_t)p->records.len);
				while (km_batch_next(&it, &bt)) {
					assert_int_equal(km_batch_verify_crc(bt.data, bt.size), KM_OK);
					assert_int_equal(bt.log_append_time, n == 2);
					n++;
				}
				assert_int_equal(n, 3);
			}
			/* Unmapped partition and topic: physical as they came. */
			assert_physical_partition(&rs.responses.items[0].partitions.items[1], cut ? 4 : 3);
			assert_physical_partition(&rs.responses.items[1].partitions.items[0], cut ? 4 : 3);
			km_arena_free(&a);
			km_wr_free(&in);
			km_wr_free(&out);
		}
	}
}

static void test_share_fetch_response_untouched(void **state)
{
	km_share_fetch_response rs;
	km_share_fetch_response_share_fetchable_topic_response t;
	km_share_fetch_response_partition_data p;
	km_wr in, out;
	bool changed = true;
	(void)state;

	km_share_fetch_response_init(&rs);
	km_share_fetch_response_partition_data_init(&p);
	km_share_fetch_response_share_fetchable_topic_response_init(&t);
	t.topic_id = P_ID;
	t.partitions.count = 1;
	t.partitions.items = &p;
	rs.responses.count = 1;
	rs.responses.items = &t;
	km_wr_init(&in);
	km_wr_init(&out);
	km_share_fetch_response_encode(&in, 1, &rs);
	assert_int_equal(km_share_fetch_response_translate(1, in.buf, in.len, &LK, &changed, &out), KM_OK);
	assert_false(changed);
	assert_int_equal(out.len, 0);
	/* Garbage is an error, never passed on half translated. */
	assert_int_not_equal(km_share_fetch_response_translate(1, in.buf, 3, &LK, &changed, &out), KM_OK);
	assert_false(changed);
	km_wr_free(&in);
	km_wr_free(&out);
}

/* ---- the top of the offset range ---- */

/*
 * Partition 0 of M_ID: logical [INT64_MAX - 10, INT64_MAX] stored at physical [0, 10] (the open
 * run without a tail: it ends where its logical side does). Partition 1: no run and no pipeline,
 * so its offsets are themselves, up to INT64_MAX.
 */
static km_offrun TOP_RUNS[] = {{INT64_MAX - 10, 0, -1, 0}};
static km_offmap TOP = {TOP_RUNS, 1, 1, -1, -1, -1};
static km_offmap NONE = {NULL, 0, 0, -1, -1, -1};

static const km_offmap *top_map(void *arg, const void *topic, int32_t partition)
{
	(void)arg;
	return topic == TOPIC_M && partition == 0 ? &TOP : topic == TOPIC_M && partition == 1 ? &NONE : NULL;
}

static const km_off_lookup LK_TOP = {fake_active, fake_topic, top_map, NULL};

static int8_t ACCEPT3[3] = {1, 2, 1};

static void set_ack(km_share_acknowledge_request_acknowledgement_batch *b, int64_t first, int64_t last, int8_t *types,
		    int32_t ntypes)
{
	km_share_acknowledge_request_acknowledgement_batch_init(b);
	b->first_offset = first;
	b->last_offset = last;
	b->acknowledge_types.count = ntypes;
	b->acknowledge_types.items = types;
}

/* Pieces that end at INT64_MAX, and the whole range, which no int64 length counts. */
static void test_pieces_at_the_top(void **state)
{
	km_share_piece p[2];
	(void)state;

	/* The run ends where its logical side reaches INT64_MAX: physical 10. */
	assert_int_equal(km_share_physical_pieces(&TOP, 0, 20, p, 2), 1);
	assert_piece(&p[0], INT64_MAX - 10, 0, 10);
	assert_int_equal(km_share_physical_pieces(&TOP, 11, INT64_MAX, p, 2), 0);
	assert_int_equal(km_share_logical_pieces(&TOP, INT64_MAX - 3, INT64_MAX, p, 2), 1);
	assert_piece(&p[0], INT64_MAX - 3, 7, 3);
	assert_int_equal(km_share_logical_pieces(&TOP, 0, INT64_MAX, p, 2), 1);
	assert_piece(&p[0], INT64_MAX - 10, 0, 10);
	/* No run, no pipeline: the offsets themselves, all 2^63 of them. */
	assert_int_equal(km_share_logical_pieces(&NONE, 0, INT64_MAX, p, 2), 1);
	assert_piece(&p[0], 0, 0, INT64_MAX);
	assert_int_equal(km_share_physical_pieces(&NONE, INT64_MAX, INT64_MAX, p, 2), 1);
	assert_piece(&p[0], INT64_MAX, INT64_MAX, 0);
}

/* Acknowledgements that end at INT64_MAX: their physical ranges, the whole range left as it is. */
static void test_acks_at_the_top(void **state)
{
	(void)state;
	for (int16_t v = 1; v <= 2; v++) {
		km_share_acknowledge_request rq, got;
		km_share_acknowledge_request_acknowledge_topic t;
		km_share_acknowledge_request_acknowledge_partition p[2];
		km_share_acknowledge_request_acknowledgement_batch b[3], whole;
		const km_share_acknowledge_request_acknowledge_partition *gp;
		km_wr in, out;
		km_arena a;
		km_rd r;
		bool changed = false;

		km_share_acknowledge_request_init(&rq);
		set_ack(&b[0], INT64_MAX - 10, INT64_MAX, ACCEPT, 1); /* the whole run, one type */
		set_ack(&b[1], INT64_MAX - 2, INT64_MAX, ACCEPT3, 3); /* one type per offset */
		set_ack(&b[2], INT64_MAX - 20, INT64_MAX, ACCEPT, 1); /* from below the run, up to the top */
		/* [0, INT64_MAX] with two types (not one per offset: it holds 2^63 offsets) */
		set_ack(&whole, 0, INT64_MAX, ACCEPT3, 2);
		for (int i = 0; i < 2; i++) {
			km_share_acknowledge_request_acknowledge_partition_init(&p[i]);
			p[i].partition_index = i;
		}
		p[0].acknowledgement_batches.count = 3;
		p[0].acknowledgement_batches.items = b;
		p[1].acknowledgement_batches.count = 1;
		p[1].acknowledgement_batches.items = &whole;
		km_share_acknowledge_request_acknowledge_topic_init(&t);
		t.topic_id = M_ID;
		t.partitions.count = 2;
		t.partitions.items = p;
		rq.group_id = km_str_c("g");
		rq.member_id = km_str_c("member");
		rq.topics.count = 1;
		rq.topics.items = &t;
		km_wr_init(&in);
		km_wr_init(&out);
		km_share_acknowledge_request_encode(&in, v, &rq);
		assert_true(km_wr_ok(&in));
		assert_int_equal(km_share_request_translate(KM_API_SHARE_ACKNOWLEDGE, v, in.buf, in.len, &LK_TOP, &changed,
							    &out), KM_OK);
		assert_true(changed);
		km_arena_init(&a, 0);
		km_share_acknowledge_request_init(&got);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_share_acknowledge_request_decode(&r, v, &got, &a), KM_OK);
		gp = got.topics.items[0].partitions.items;
		assert_int_equal(gp[0].acknowledgement_batches.count, 3);
		assert_int_equal(gp[0].acknowledgement_batches.items[0].first_offset, 0);
		assert_int_equal(gp[0].acknowledgement_batches.items[0].last_offset, 10);
		assert_int_equal(gp[0].acknowledgement_batches.items[1].first_offset, 8);
		assert_int_equal(gp[0].acknowledgement_batches.items[1].last_offset, 10);
		assert_int_equal(gp[0].acknowledgement_batches.items[1].acknowledge_types.count, 3);
		assert_memory_equal(gp[0].acknowledgement_batches.items[1].acknowledge_types.items, ACCEPT3, 3);
		assert_int_equal(gp[0].acknowledgement_batches.items[2].first_offset, 0);
		assert_int_equal(gp[0].acknowledgement_batches.items[2].last_offset, 10);
		assert_int_equal(gp[1].acknowledgement_batches.count, 1);
		assert_int_equal(gp[1].acknowledgement_batches.items[0].first_offset, 0);
		assert_int_equal(gp[1].acknowledgement_batches.items[0].last_offset, INT64_MAX);
		assert_int_equal(gp[1].acknowledgement_batches.items[0].acknowledge_types.count, 2);
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

/* Acquired records whose logical side ends at INT64_MAX, and the whole range of a partition with no run. */
static void test_acquired_at_the_top(void **state)
{
	(void)state;
	for (int16_t v = 1; v <= 2; v++) {
		km_share_fetch_response rs;
		km_share_fetch_response_share_fetchable_topic_response t;
		km_share_fetch_response_partition_data p[2];
		km_share_fetch_response_acquired_records acq[2] = {{0, 10, 1, {0}}, {3, 5, 2, {0}}},
							 whole = {0, INT64_MAX, 1, {0}};
		const km_share_fetch_response_acquired_records *g;
		km_wr in, out;
		km_arena a;
		km_rd r;
		bool changed = false;

		km_share_fetch_response_init(&rs);
		for (int i = 0; i < 2; i++) {
			km_share_fetch_response_partition_data_init(&p[i]);
			p[i].partition_index = i;
		}
		p[0].acquired_records.count = 2;
		p[0].acquired_records.items = acq;
		p[1].acquired_records.count = 1;
		p[1].acquired_records.items = &whole;
		km_share_fetch_response_share_fetchable_topic_response_init(&t);
		t.topic_id = M_ID;
		t.partitions.count = 2;
		t.partitions.items = p;
		rs.responses.count = 1;
		rs.responses.items = &t;
		km_wr_init(&in);
		km_wr_init(&out);
		km_share_fetch_response_encode(&in, v, &rs);
		assert_true(km_wr_ok(&in));
		assert_int_equal(km_share_fetch_response_translate(v, in.buf, in.len, &LK_TOP, &changed, &out), KM_OK);
		assert_true(changed);
		km_arena_init(&a, 0);
		km_share_fetch_response_init(&rs);
		km_rd_init(&r, out.buf, out.len);
		assert_int_equal(km_share_fetch_response_decode(&r, v, &rs, &a), KM_OK);
		assert_int_equal(rs.responses.items[0].partitions.items[0].acquired_records.count, 2);
		g = rs.responses.items[0].partitions.items[0].acquired_records.items;
		assert_int_equal(g[0].first_offset, INT64_MAX - 10);
		assert_int_equal(g[0].last_offset, INT64_MAX);
		assert_int_equal(g[1].first_offset, INT64_MAX - 7);
		assert_int_equal(g[1].last_offset, INT64_MAX - 5);
		assert_int_equal(rs.responses.items[0].partitions.items[1].acquired_records.count, 1);
		g = rs.responses.items[0].partitions.items[1].acquired_records.items;
		assert_int_equal(g[0].first_offset, 0);
		assert_int_equal(g[0].last_offset, INT64_MAX);
		km_arena_free(&a);
		km_wr_free(&in);
		km_wr_free(&out);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pieces),
		cmocka_unit_test(test_share_fetch_request),
		cmocka_unit_test(test_share_acknowledge_request),
		cmocka_unit_test(test_share_fetch_response),
		cmocka_unit_test(test_share_fetch_response_untouched),
		cmocka_unit_test(test_pieces_at_the_top),
		cmocka_unit_test(test_acks_at_the_top),
		cmocka_unit_test(test_acquired_at_the_top),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
