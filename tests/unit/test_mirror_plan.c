/*
 * Unit tests for the batch plan (src/mirror/pipeline/plan.c): fetched batches, built here with the
 * codec, are planned onto the destination's physical offsets, re-stamped with the mirror's
 * producer, split when compaction left gaps, held at transaction markers; no broker involved.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kmirror/batch.h"
#include "kmirror/offmap.h"
#include "kmirror/wire.h"
#include "mirror/pipeline/plan.h"

static const char TOPIC[] = "orders";

/* A fetched answer: the bytes in chains of at most chunk bytes each (batches cross chains). */
typedef struct answer {
	mheld *held;
	mresp *resp;
	uint8_t *bytes;
	size_t len;
} answer;

static void answer_init(answer *a, const km_wr *w, size_t chunk)
{
	a->held = calloc(1, sizeof(*a->held));
	a->resp = calloc(1, sizeof(*a->resp));
	assert_non_null(a->held);
	assert_non_null(a->resp);
	a->held->refs = 2; /* the test's and the response's */
	a->resp->buf = evbuffer_new();
	a->resp->refs = 1;
	a->resp->held = a->held;
	a->bytes = malloc(w->len);
	memcpy(a->bytes, w->buf, w->len);
	a->len = w->len;
	for (size_t off = 0; off < w->len; off += chunk) {
		size_t n = w->len - off < chunk ? w->len - off : chunk;
		assert_int_equal(evbuffer_add_reference(a->resp->buf, a->bytes + off, n, NULL, NULL), 0);
	}
	a->resp->size = w->len;
	a->held->bytes = w->len;
}

static void answer_free(answer *a)
{
	km_plan_resp_unref(a->resp);
	assert_int_equal(a->held->bytes, 0);
	km_plan_held_unref(a->held);
	free(a->bytes);
}

typedef struct fake_txn {
	int slot;           /* what txn() answers for a transaction it knows (-1: none) */
	int64_t first;      /* the logical offset of the first batch leased */
	int calls_create;
	int marked;         /* markers planned: each moves the slot on (the next transaction is another's) */
} fake_txn;

static int txn_of(void *arg, int64_t src_pid, int64_t logical, mtx_use use)
{
	fake_txn *f = arg;
	(void)src_pid;
	if (f->slot < 0)
		return -1;
	if (use == MTX_BATCH) {
		f->calls_create++;
		if (f->first < 0)
			f->first = logical;
	}
	return use == MTX_MARKER ? f->slot + f->marked++ : f->slot + f->marked;
}

static void plan_init(mplan *q, int64_t fetch_logical, int64_t phys)
{
	memset(q, 0, sizeof(*q));
	q->topic = TOPIC;
	q->partition = 3;
	q->fetch_logical = fetch_logical;
	q->cont_logical = -1;
	q->first_logical = fetch_logical;
	q->phys = phys;
	q->pid = 9000;
	q->epoch = 4;
	q->seq = 0;
}

/* Take every batch of the answer, as the fetch does; the first result that is not KM_OK ends it. */
static km_err take_all(mplan *q, const mplan_env *env, answer *a, runs_acc *ra, const char **fail)
{
	km_batch_iter it;
	km_batch b;
	km_batch_iter_init(&it, a->bytes, a->len);
	while (km_batch_next(&it, &b)) {
		struct evbuffer_ptr at;
		km_err rc;
		assert_int_equal(evbuffer_ptr_set(a->resp->buf, &at, (size_t)(b.data - a->bytes), EVBUFFER_PTR_SET), 0);
		rc = km_plan_take(q, env, a->resp, &at, b.size, b.data, ra, fail);
		if (rc != KM_OK)
			return rc;
	}
	return KM_OK;
}

/* The batch as it goes to the destination: its re-stamped header, then its record bytes (referenced or own). */
static size_t wire_of(const mbatch *b, uint8_t *out)
{
	size_t n = KM_BATCH_HEADER_SIZE;
	memcpy(out, b->hdr, KM_BATCH_HEADER_SIZE);
	if (b->own) {
		memcpy(out + n, b->own + KM_BATCH_HEADER_SIZE, b->own_len - KM_BATCH_HEADER_SIZE);
		n = b->own_len;
	} else {
		for (int i = 0; i < b->nvec; i++) {
			memcpy(out + n, b->vec[i].iov_base, b->vec[i].iov_len);
			n += b->vec[i].iov_len;
		}
	}
	assert_int_equal(n, b->size);
	return n;
}

static void free_queue(mplan *q)
{
	while (q->head) {
		mbatch *b = q->head;
		q->head = b->next;
		km_plan_batch_free(b);
	}
	q->tail = NULL;
}

static void add_batch(km_wr *w, int64_t base, const int32_t *deltas, size_t n, int codec, bool txn, bool lat)
{
	km_batch_record r[16];
	char vals[16][32];
	km_batch_params p;
	assert_true(n <= 16);
	for (size_t i = 0; i < n; i++) {
		snprintf(vals[i], sizeof(vals[i]), "value-%lld", (long long)(base + deltas[i]));
		r[i] = (km_batch_record){.timestamp = 1700000000000 + (int64_t)i, .offset_delta = deltas[i],
					 .key = {NULL, -1}, .value = {(const uint8_t *)vals[i], (int32_t)strlen(vals[i])}};
	}
	km_batch_params_init(&p);
	p.codec = codec;
	p.base_offset = base;
	p.producer_id = 77;
	p.producer_epoch = 1;
	p.base_sequence = (int32_t)base;
	p.transactional = txn;
	p.log_append_time = lat;
	p.max_timestamp = 1800000000000;
	assert_int_equal(km_batch_build(&p, r, n, w), KM_OK);
}

static void add_marker(km_wr *w, int64_t offset, bool commit)
{
	uint8_t key[4], val[6];
	km_batch_record r;
	km_batch_params p;
	km_put_be16(key, 0);
	km_put_be16(key + 2, commit ? 1 : 0);
	km_put_be16(val, 0);
	km_put_be32(val + 2, 5);
	r = (km_batch_record){.timestamp = 1, .offset_delta = 0, .key = {key, 4}, .value = {val, 6}};
	km_batch_params_init(&p);
	p.control = true;
	p.transactional = true;
	p.producer_id = 77;
	p.producer_epoch = 1;
	p.base_offset = offset;
	assert_int_equal(km_batch_build(&p, &r, 1, w), KM_OK);
}

static const int32_t five[] = {0, 1, 2, 3, 4};

/* One test's run: batches built into w, fetched as one answer, taken by a plan. */
typedef struct run {
	km_wr w;
	answer a;
	mplan q;
	fake_txn f;
	mplan_env env;
	runs_acc ra;
	const char *fail;
} run;

/* slot: what the plan's transactions answer (-1: the mirror carries no transaction). */
static void run_init(run *r, int slot, int64_t fetch_logical, int64_t phys)
{
	memset(r, 0, sizeof(*r));
	km_wr_init(&r->w);
	r->f = (fake_txn){slot, -1, 0};
	r->env = (mplan_env){txn_of, &r->f, false};
	plan_init(&r->q, fetch_logical, phys);
}

/* The batches built so far, fetched in chains of at most chunk bytes, then taken. */
static km_err run_take(run *r, size_t chunk)
{
	answer_init(&r->a, &r->w, chunk);
	return take_all(&r->q, &r->env, &r->a, &r->ra, &r->fail);
}

static void run_free(run *r)
{
	free_queue(&r->q);
	free(r->ra.runs);
	answer_free(&r->a);
	km_wr_free(&r->w);
}

/* A batch as it goes to the destination: CRC right, parsed into pb. */
static void check_wire(const mbatch *b, km_batch *pb, uint8_t *out)
{
	size_t n = wire_of(b, out);
	assert_int_equal(km_batch_verify_crc(out, n), KM_OK);
	assert_int_equal(km_batch_parse(out, n, pb), KM_OK);
}

/* Data batches: planned back to back from the physical tail, re-stamped with the mirror's producer, in one run. */
static void test_data_batches_restamped_in_one_run(void **state)
{
	int codecs[] = {KM_CODEC_NONE, KM_CODEC_ZSTD};
	(void)state;
	for (size_t c = 0; c < 2; c++) {
		run r;
		int64_t expect_phys = 100;
		int32_t expect_seq = 0;
		size_t src_off = 0;
		run_init(&r, -1, 0, 100);
		for (int k = 0; k < 3; k++)
			add_batch(&r.w, 5 * k, five, 5, codecs[c], false, false);
		assert_int_equal(run_take(&r, 37), KM_OK);
		assert_int_equal(r.q.fetch_logical, 15);
		assert_int_equal(r.q.cont_logical, 15);
		assert_int_equal(r.q.phys, 115);
		assert_int_equal(r.q.seq, 15);
		assert_int_equal(r.ra.n, 1);
		assert_ptr_equal(r.ra.runs[0].topic, TOPIC);
		assert_int_equal(r.ra.runs[0].partition, 3);
		assert_int_equal(r.ra.runs[0].logical, 0);
		assert_int_equal(r.ra.runs[0].physical, 100);
		assert_int_equal(r.ra.runs[0].prev_logical_end, -1);
		assert_int_equal(r.ra.runs[0].flags, 0);
		for (mbatch *b = r.q.head; b; b = b->next) {
			uint8_t out[4096];
			km_batch pb;
			check_wire(b, &pb, out);
			assert_int_equal(b->kind, BK_DATA);
			assert_int_equal(b->physical, expect_phys);
			assert_int_equal(pb.base_offset, 0);
			assert_int_equal(pb.producer_id, 9000);
			assert_int_equal(pb.producer_epoch, 4);
			assert_int_equal(pb.base_sequence, expect_seq);
			assert_int_equal(pb.codec, codecs[c]);
			/* The record bytes are the source's, untouched (compared with the fetched batch). */
			assert_memory_equal(out + KM_BATCH_HEADER_SIZE, r.a.bytes + src_off + KM_BATCH_HEADER_SIZE,
					    b->size - KM_BATCH_HEADER_SIZE);
			src_off += b->size;
			expect_phys += 5;
			expect_seq += 5;
		}
		assert_int_equal(expect_phys, 115);
		assert_int_equal(r.a.resp->refs, 4); /* the answer's own and one per batch */
		run_free(&r);
	}
}

/*
 * The re-stamped CRC is the source's, patched for the header: a source batch whose records do not
 * match its CRC goes out with a CRC they do not match either (the destination refuses it as
 * CORRUPT_MESSAGE), never with one computed over the corrupted bytes.
 */
static void test_source_crc_carried_not_recomputed(void **state)
{
	run r;
	uint8_t out[4096];
	size_t n;
	(void)state;
	run_init(&r, -1, 0, 100);
	add_batch(&r.w, 0, five, 5, KM_CODEC_NONE, false, false);
	add_batch(&r.w, 5, five, 5, KM_CODEC_NONE, false, false);
	r.w.buf[r.w.len - 1] ^= 0x40; /* the second batch's last record byte, after its CRC was made */
	assert_int_equal(run_take(&r, 37), KM_OK);
	assert_non_null(r.q.head);
	assert_non_null(r.q.head->next);
	n = wire_of(r.q.head, out);
	assert_int_equal(km_batch_verify_crc(out, n), KM_OK);
	n = wire_of(r.q.head->next, out);
	assert_int_not_equal(km_batch_verify_crc(out, n), KM_OK);
	out[n - 1] ^= 0x40; /* with the source's byte back, the patched CRC is right for the new header */
	assert_int_equal(km_batch_verify_crc(out, n), KM_OK);
	assert_int_equal(km_be64(out + KM_BATCH_OFF_PRODUCER_ID), 9000);
	run_free(&r);
}

/* A gap between batches (whole batches compacted away) starts a run that closes the one before it. */
static void test_gap_between_batches_starts_a_run(void **state)
{
	run r;
	(void)state;
	run_init(&r, -1, 0, 0);
	add_batch(&r.w, 0, five, 5, KM_CODEC_NONE, false, false);
	add_batch(&r.w, 10, five, 5, KM_CODEC_NONE, false, false);
	assert_int_equal(run_take(&r, 4096), KM_OK);
	assert_int_equal(r.ra.n, 2);
	assert_int_equal(r.ra.runs[1].logical, 10);
	assert_int_equal(r.ra.runs[1].physical, 5);
	assert_int_equal(r.ra.runs[1].prev_logical_end, 5);
	assert_int_equal(r.q.head->next->physical, 5);
	assert_int_equal(r.q.fetch_logical, 15);
	run_free(&r);
}

/* A batch with offsets missing inside (compaction) is split into contiguous pieces of its own. */
static void test_compacted_batch_split(void **state)
{
	static const int32_t gappy[] = {0, 1, 5, 6};
	run r;
	(void)state;
	run_init(&r, -1, 20, 7);
	add_batch(&r.w, 20, gappy, 4, KM_CODEC_LZ4, false, false);
	assert_int_equal(run_take(&r, 50), KM_OK);
	assert_non_null(r.q.head);
	assert_non_null(r.q.head->next);
	assert_null(r.q.head->next->next);
	assert_int_equal(r.q.head->logical, 20);
	assert_int_equal(r.q.head->count, 2);
	assert_int_equal(r.q.head->physical, 7);
	assert_int_equal(r.q.head->next->logical, 25);
	assert_int_equal(r.q.head->next->physical, 9);
	assert_int_equal(r.ra.n, 2);
	assert_int_equal(r.ra.runs[1].logical, 25);
	assert_int_equal(r.ra.runs[1].prev_logical_end, 22);
	for (mbatch *b = r.q.head; b; b = b->next) {
		uint8_t out[4096];
		km_batch pb;
		assert_non_null(b->own);
		check_wire(b, &pb, out);
		assert_int_equal(pb.producer_id, 9000);
		assert_int_equal(pb.last_offset_delta, 1);
	}
	assert_int_equal(r.q.fetch_logical, 27);
	run_free(&r);
}

/* What the source must not send: a batch older than magic v2, one overlapping what is mirrored. */
static void test_refusals(void **state)
{
	struct evbuffer_ptr at;
	run r;
	(void)state;

	run_init(&r, -1, 0, 0);
	add_batch(&r.w, 0, five, 5, KM_CODEC_NONE, false, false);
	r.w.buf[KM_BATCH_OFF_MAGIC] = 1;
	answer_init(&r.a, &r.w, 4096);
	/* The iterator refuses it too: taken as the fetch walk hands it over, by its size. */
	assert_int_equal(evbuffer_ptr_set(r.a.resp->buf, &at, 0, EVBUFFER_PTR_SET), 0);
	assert_int_equal(km_plan_take(&r.q, &r.env, r.a.resp, &at, r.a.len, r.a.bytes, &r.ra, &r.fail),
			 KM_ERR_UNSUPPORTED);
	assert_non_null(strstr(r.fail, "magic"));
	assert_null(r.q.head);
	run_free(&r);

	/* Mirrored up to 10: a batch 8-12 ends past the fetch offset but begins inside what is mirrored. */
	run_init(&r, -1, 10, 10);
	r.q.cont_logical = 10;
	add_batch(&r.w, 8, five, 5, KM_CODEC_NONE, false, false);
	assert_int_equal(run_take(&r, 4096), KM_ERR_INVAL);
	assert_non_null(strstr(r.fail, "overlaps"));
	run_free(&r);

	/* A batch that ends before the fetch offset is passed over (a fetch may start inside a batch). */
	run_init(&r, -1, 5, 5);
	add_batch(&r.w, 0, five, 5, KM_CODEC_NONE, false, false);
	assert_int_equal(run_take(&r, 4096), KM_OK);
	assert_null(r.q.head);
	assert_int_equal(r.q.fetch_logical, 5);
	run_free(&r);
}

/*
 * Carried transactions: their data batches keep the source's producer until stamped for their
 * destination transaction; a COMMIT is planned as a marker, and what follows it is planned too
 * (the next transaction in a slot of its own) up to the second marker, where the answer stops.
 */
static void test_transaction_and_marker(void **state)
{
	uint8_t out[4096];
	km_batch pb;
	mbatch *d, *m, *d2, *m2;
	run r;
	(void)state;
	run_init(&r, 2, 0, 50);
	add_batch(&r.w, 0, five, 5, KM_CODEC_NONE, true, false);
	add_marker(&r.w, 5, true);
	add_batch(&r.w, 6, five, 5, KM_CODEC_NONE, true, false);
	add_marker(&r.w, 11, false);
	add_batch(&r.w, 12, five, 5, KM_CODEC_NONE, false, false);
	assert_int_equal(run_take(&r, 64), KM_OK);
	d = r.q.head;
	assert_non_null(d);
	assert_non_null(m = d->next);
	assert_non_null(d2 = m->next);
	assert_non_null(m2 = d2->next);
	assert_null(m2->next); /* the batch after the second marker waits for the next fetch */
	assert_true(r.q.stop_answer);
	assert_int_equal(r.q.fetch_logical, 12);
	assert_int_equal(r.f.calls_create, 2);
	assert_int_equal(r.f.first, 0);
	assert_int_equal(d->kind, BK_TXN);
	assert_int_equal(d->txi, 2);
	assert_int_equal(m->kind, BK_MARKER);
	assert_true(m->commit);
	assert_int_equal(m->txi, 2);
	assert_int_equal(m->logical, 5);
	assert_int_equal(m->physical, 55);
	assert_int_equal(d2->kind, BK_TXN);
	assert_int_equal(d2->txi, 3); /* the transaction after the marker: another slot */
	assert_int_equal(d2->physical, 56);
	assert_int_equal(m2->kind, BK_MARKER);
	assert_false(m2->commit);
	assert_int_equal(m2->txi, 3);
	assert_int_equal(m2->physical, 61);
	assert_int_equal(r.q.phys, 62);
	assert_int_equal(r.q.seq, 0); /* the idempotent producer's sequence does not move */

	assert_int_equal(km_plan_stamp_txn(d, 31337, 6, 40), KM_OK);
	check_wire(d, &pb, out);
	assert_true(pb.transactional);
	assert_int_equal(pb.producer_id, 31337);
	assert_int_equal(pb.producer_epoch, 6);
	assert_int_equal(pb.base_sequence, 40);
	assert_int_equal(pb.base_offset, 0);
	run_free(&r);
}

/* One marker does not stop the answer: what follows it is planned behind it. */
static void test_one_marker_plans_on(void **state)
{
	mbatch *m;
	run r;
	(void)state;
	run_init(&r, 0, 0, 0);
	add_batch(&r.w, 0, five, 5, KM_CODEC_NONE, true, false);
	add_marker(&r.w, 5, true);
	add_batch(&r.w, 6, five, 5, KM_CODEC_NONE, false, false);
	assert_int_equal(run_take(&r, 64), KM_OK);
	assert_non_null(m = r.q.head->next);
	assert_int_equal(m->kind, BK_MARKER);
	assert_non_null(m->next);
	assert_int_equal(m->next->kind, BK_DATA);
	assert_int_equal(m->next->physical, 6);
	assert_false(r.q.stop_answer);
	assert_int_equal(r.q.fetch_logical, 11);
	run_free(&r);
}

/* A marker of a transaction the mirror does not carry is a hole; a destination without transactions refuses them. */
static void test_marker_hole_and_no_txn(void **state)
{
	run r;
	(void)state;
	run_init(&r, -1, 3, 10);
	add_marker(&r.w, 3, false);
	assert_int_equal(run_take(&r, 4096), KM_OK);
	assert_null(r.q.head);
	assert_false(r.q.stop_answer);
	assert_int_equal(r.q.fetch_logical, 4);
	assert_int_equal(r.q.phys, 10);
	run_free(&r);

	run_init(&r, -1, 0, 0);
	r.env.no_txn = true;
	add_batch(&r.w, 0, five, 5, KM_CODEC_NONE, true, false);
	assert_int_equal(run_take(&r, 4096), KM_ERR_UNSUPPORTED);
	assert_non_null(strstr(r.fail, "transactional"));
	run_free(&r);
}

/*
 * A LogAppendTime batch goes as CreateTime with the append time, in a run that says so; the next
 * CreateTime batch starts another.
 */
static void test_log_append_time_runs(void **state)
{
	uint8_t out[4096];
	km_batch pb;
	run r;
	(void)state;
	run_init(&r, -1, 0, 0);
	add_batch(&r.w, 0, five, 5, KM_CODEC_GZIP, false, true);
	add_batch(&r.w, 5, five, 5, KM_CODEC_NONE, false, false);
	assert_int_equal(run_take(&r, 29), KM_OK);
	assert_int_equal(r.ra.n, 2);
	assert_int_equal(r.ra.runs[0].flags, KM_OFFRUN_LOG_APPEND_TIME);
	assert_int_equal(r.ra.runs[1].flags, 0);
	assert_int_equal(r.ra.runs[1].logical, 5);
	assert_int_equal(r.ra.runs[1].prev_logical_end, 5);
	assert_true(r.q.head->lat);
	check_wire(r.q.head, &pb, out);
	assert_false(pb.log_append_time);
	assert_int_equal(pb.max_timestamp, 1800000000000);
	run_free(&r);
}

/* Dropping what is unsent keeps what is in flight, in order, and the tail on it. */
static void test_drop_unsent(void **state)
{
	mplan q;
	mbatch *b[3];
	(void)state;
	plan_init(&q, 0, 0);
	for (int i = 0; i < 3; i++) {
		b[i] = calloc(1, sizeof(*b[i]));
		if (i)
			b[i - 1]->next = b[i];
	}
	b[0]->sent = true;
	q.head = b[0];
	q.tail = b[2];
	km_plan_drop_unsent(&q);
	assert_ptr_equal(q.head, b[0]);
	assert_ptr_equal(q.tail, b[0]);
	assert_null(b[0]->next);
	free_queue(&q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_data_batches_restamped_in_one_run),
		cmocka_unit_test(test_source_crc_carried_not_recomputed),
		cmocka_unit_test(test_gap_between_batches_starts_a_run),
		cmocka_unit_test(test_compacted_batch_split),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_transaction_and_marker),
		cmocka_unit_test(test_one_marker_plans_on),
		cmocka_unit_test(test_marker_hole_and_no_txn),
		cmocka_unit_test(test_log_append_time_runs),
		cmocka_unit_test(test_drop_unsent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
