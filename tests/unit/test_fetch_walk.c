/* Unit tests for the Fetch response walker (kmirror/fetch.h): every version, bytes in random pieces, batch prefixes patched in place. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/fetch.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/wire.h"

/* Records of n fake batches: a 12-byte prefix (baseOffset, batchLength) and batchLength bytes each. */
static size_t fake_batches(uint8_t *buf, int n, int64_t base, bool partial_tail)
{
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		int32_t len = 49 + 30 * i; /* a real batch is never shorter than its 49-byte header rest */
		km_put_be64(buf + off, (uint64_t)(base + 10 * i));
		km_put_be32(buf + off + 8, (uint32_t)len);
		for (int32_t j = 0; j < len; j++)
			buf[off + 12 + (size_t)j] = (uint8_t)(i * 31 + j);
		off += 12 + (size_t)len;
	}
	if (partial_tail) {
		/* a batch cut by the fetch size: its prefix says more than is there */
		km_put_be64(buf + off, (uint64_t)(base + 10 * n));
		km_put_be32(buf + off + 8, 500);
		memset(buf + off + 12, 0xab, 20);
		off += 32;
	}
	return off;
}

typedef struct seen {
	int partitions, batches, partial;
	int64_t hw_sum;
	int32_t aborted_sum;
	size_t records_sum;
	char topics[600];
} seen;

/*
 * Feed the frame in pieces; after every NEED_MORE send on everything before w.pos, as the proxy does.
 * Every other partition is descended into and its batches get baseOffset + 1000 patched in place.
 */
static size_t walk_pieces(const uint8_t *frame, size_t len, int16_t v, unsigned *seed, uint8_t *out, seen *s)
{
	struct evbuffer *in = evbuffer_new();
	km_fetch_walk w;
	size_t fed = 0, sent = 0;

	memset(s, 0, sizeof(*s));
	km_fetch_walk_init(&w, v, len);
	for (;;) {
		km_fw_event ev = km_fetch_walk_next(&w, in, sent);
		assert_int_not_equal(ev, KM_FW_ERROR);
		if (ev == KM_FW_PARTITION) {
			s->partitions++;
			s->hw_sum += w.part.high_watermark + w.part.last_stable_offset;
			s->aborted_sum += w.part.aborted_count;
			s->records_sum += w.part.records_len;
			if (w.part.partition == 0 && strlen(s->topics) + sizeof(w.part.topic) < sizeof(s->topics)) {
				/* the topic of this partition: a name up to v12, an id after */
				if (v >= 13)
					strcat(s->topics, w.part.topic_id.b[0] == 1 ? "A" : "B");
				else
					strcat(s->topics, w.part.topic);
				strcat(s->topics, ",");
			}
			w.descend = w.part.partition % 2 == 0;
			continue;
		}
		if (ev == KM_FW_BATCH) {
			uint8_t nb[8];
			s->batches++;
			if (w.batch.partial) {
				s->partial++;
				continue;
			}
			km_put_be64(nb, (uint64_t)(w.batch.base_offset + 1000));
			assert_true(km_evbuf_patch(in, w.batch.off - sent, nb, 8));
			continue;
		}
		if (ev == KM_FW_END) {
			size_t rest = len - sent;
			/* the tagged fields (or nothing) are all that is left to send */
			if (fed < len) {
				evbuffer_add(in, frame + fed, len - fed);
				fed = len;
			}
			assert_int_equal(evbuffer_get_length(in), rest);
			evbuffer_remove(in, out + sent, rest);
			sent += rest;
			break;
		}
		/* NEED_MORE: everything before w.pos is settled */
		{
			size_t have_end = sent + evbuffer_get_length(in), upto = w.pos < have_end ? w.pos : have_end, n;
			if (upto > sent) {
				evbuffer_remove(in, out + sent, upto - sent);
				sent = upto;
			}
			assert_true(fed < len);
			*seed = *seed * 1103515245u + 12345u;
			n = 1 + (*seed >> 8) % 97;
			if (n > len - fed)
				n = len - fed;
			evbuffer_add(in, frame + fed, n);
			fed += n;
		}
	}
	evbuffer_free(in);
	return sent;
}

static void test_every_version(void **state)
{
	static uint8_t recs[3][4096];
	size_t rlen[3];
	unsigned seed = 7;
	(void)state;
	rlen[0] = fake_batches(recs[0], 3, 100, false);
	rlen[1] = fake_batches(recs[1], 2, 500, true);
	rlen[2] = fake_batches(recs[2], 4, 900, true);
	for (int16_t v = KM_FETCH_RESPONSE_MIN_VERSION; v <= KM_FETCH_RESPONSE_MAX_VERSION; v++) {
		km_fetch_response m;
		km_fetch_response_fetchable_topic_response t[2];
		km_fetch_response_partition_data p[4];
		km_fetch_response_aborted_transaction ab[3];
		km_fetch_response_node_endpoint e;
		km_wr w;
		uint8_t *out;
		seen s;

		assert_true(km_fetch_walk_supported(v));
		km_fetch_response_init(&m);
		for (int i = 0; i < 2; i++) {
			km_fetch_response_fetchable_topic_response_init(&t[i]);
			t[i].topic = km_str_c(i ? "beta" : "alpha");
			t[i].topic_id.b[0] = (uint8_t)(i + 1);
		}
		for (int i = 0; i < 4; i++) {
			km_fetch_response_partition_data_init(&p[i]);
			p[i].partition_index = i % 2 == 0 ? 0 : 1;
			p[i].high_watermark = 1000 * (i + 1);
			p[i].last_stable_offset = 7;
		}
		for (int i = 0; i < 3; i++) {
			km_fetch_response_aborted_transaction_init(&ab[i]);
			ab[i].producer_id = 40 + i;
			ab[i].first_offset = i;
		}
		p[0].records = (km_bytes){recs[0], (int32_t)rlen[0]};
		p[1].records = (km_bytes){recs[1], (int32_t)rlen[1]};
		p[1].aborted_transactions.count = 3;
		p[1].aborted_transactions.items = ab;
		p[2].records = (km_bytes){recs[2], (int32_t)rlen[2]};
		p[3].records = KM_BYTES_NULL;
		p[3].aborted_transactions.count = -1; /* null */
		p[3].error_code = 6;
		t[0].partitions.count = 2;
		t[0].partitions.items = p;
		t[1].partitions.count = 2;
		t[1].partitions.items = p + 2;
		m.responses.count = 2;
		m.responses.items = t;
		if (v >= 16) {
			km_fetch_response_node_endpoint_init(&e);
			e.node_id = 4;
			e.host = km_str_c("broker-4.internal");
			e.port = 9092;
			m.node_endpoints.count = 1;
			m.node_endpoints.items = &e;
		}
		km_wr_init(&w);
		km_wr_i32(&w, 0);
		km_wr_i32(&w, 5);
		if (v >= 12)
			km_wr_uvarint(&w, 0); /* response header v1 */
		km_fetch_response_encode(&w, v, &m);
		km_wr_patch_i32(&w, 0, (int32_t)(w.len - 4));
		assert_true(km_wr_ok(&w));

		for (int round = 0; round < 4; round++) {
			out = malloc(w.len);
			assert_int_equal(walk_pieces(w.buf, w.len, v, &seed, out, &s), w.len);
			assert_int_equal(s.partitions, 4);
			assert_int_equal(s.hw_sum, 1000 + 2000 + 3000 + 4000 + 4 * 7);
			assert_int_equal(s.aborted_sum, 3 + 0 + 0 - 1); /* two empty arrays, one null */
			assert_int_equal(s.records_sum, rlen[0] + rlen[1] + rlen[2]);
			assert_string_equal(s.topics, v >= 13 ? "A,B," : "alpha,beta,");
			/* descended into partition 0 of each topic: 3 batches, then 4 + a cut one */
			assert_int_equal(s.batches, 3 + 5);
			assert_int_equal(s.partial, 1);
			/* the output is the input with baseOffset + 1000 in the descended batches only */
			{
				const uint8_t *r0 = memmem(w.buf, w.len, recs[0], rlen[0]);
				const uint8_t *r1 = memmem(w.buf, w.len, recs[1], rlen[1]);
				size_t o0 = (size_t)(r0 - w.buf), o1 = (size_t)(r1 - w.buf);
				assert_non_null(r0);
				assert_non_null(r1);
				assert_int_equal(km_be64(out + o0), 1100);
				assert_int_equal(km_be64(out + o0 + 12 + 49), 1110);
				assert_memory_equal(out + o0 + 8, w.buf + o0 + 8, 4);
				/* partition 1 was not descended into: untouched */
				assert_memory_equal(out + o1, w.buf + o1, rlen[1]);
				assert_memory_equal(out + w.len - 40, w.buf + w.len - 40, 40);
			}
			free(out);
		}
		km_wr_free(&w);
	}
}

static void test_malformed(void **state)
{
	struct evbuffer *in = evbuffer_new();
	km_fetch_walk w;
	uint8_t frame[32];
	(void)state;
	/* v12 frame whose topic count claims far more than the bytes */
	memset(frame, 0, sizeof(frame));
	km_put_be32(frame, sizeof(frame) - 4);
	frame[8] = 0;                /* header tags */
	frame[19] = 0x7f;            /* topics: uvarint 127 -> 126 topics in 12 bytes */
	evbuffer_add(in, frame, sizeof(frame));
	km_fetch_walk_init(&w, 12, sizeof(frame));
	assert_int_equal(km_fetch_walk_next(&w, in, 0), KM_FW_ERROR);
	/* a v4 frame that ends early: error once everything has arrived */
	evbuffer_drain(in, evbuffer_get_length(in));
	memset(frame, 0, sizeof(frame));
	km_put_be32(frame, 12);
	km_put_be32(frame + 12, 3); /* 3 topics, no bytes for them */
	evbuffer_add(in, frame, 16);
	km_fetch_walk_init(&w, 4, 16);
	assert_int_equal(km_fetch_walk_next(&w, in, 0), KM_FW_ERROR);
	/* bytes the walk needs already sent on */
	km_fetch_walk_init(&w, 4, 16);
	assert_int_equal(km_fetch_walk_next(&w, in, 4), KM_FW_ERROR);
	evbuffer_free(in);
}

/* Walk a whole frame held in one buffer to its first event other than PARTITION and BATCH. */
static km_fw_event walk_whole(const uint8_t *frame, size_t len, int16_t v)
{
	struct evbuffer *in = evbuffer_new();
	km_fetch_walk w;
	km_fw_event ev;
	evbuffer_add(in, frame, len);
	km_fetch_walk_init(&w, v, len);
	while ((ev = km_fetch_walk_next(&w, in, 0)) == KM_FW_PARTITION || ev == KM_FW_BATCH)
		;
	evbuffer_free(in);
	return ev;
}

/*
 * A v12 frame of one topic "t" with one partition, up to its aborted transactions (count bytes
 * given), then the preferred read replica and the records length (bytes given), then filler.
 */
static size_t v12_frame(uint8_t *f, const uint8_t *aborted, size_t alen, const uint8_t *rec, size_t rlen)
{
	km_wr w;
	size_t n;
	km_wr_init(&w);
	km_wr_i32(&w, 0);       /* size, patched below */
	km_wr_i32(&w, 7);       /* correlation id */
	km_wr_uvarint(&w, 0);   /* header tags */
	km_wr_i32(&w, 0);       /* throttle */
	km_wr_i16(&w, 0);       /* error */
	km_wr_i32(&w, 0);       /* session id */
	km_wr_uvarint(&w, 2);   /* one topic */
	km_wr_string(&w, true, km_str_c("t"));
	km_wr_uvarint(&w, 2);   /* one partition */
	km_wr_i32(&w, 0);
	km_wr_i16(&w, 0);
	km_wr_i64(&w, 10);
	km_wr_i64(&w, 10);
	km_wr_i64(&w, 0);
	km_wr_raw(&w, aborted, alen);
	km_wr_i32(&w, -1);      /* preferred read replica */
	km_wr_raw(&w, rec, rlen);
	for (int i = 0; i < 40; i++)
		km_wr_i8(&w, 0);
	km_wr_patch_i32(&w, 0, (int32_t)(w.len - 4));
	assert_true(km_wr_ok(&w));
	n = w.len;
	memcpy(f, w.buf, n);
	km_wr_free(&w);
	return n;
}

/*
 * Lengths and counts beyond int32 (a compact uvarint of 2^31 or more) are malformed: the walk
 * says so instead of computing them (that subtraction overflowed, which UBSan reports).
 */
static void test_huge_lengths(void **state)
{
	static const uint8_t none[] = {0x00}, huge[] = {0x80, 0x80, 0x80, 0x80, 0x08}, /* 2^31 */
		max[] = {0xff, 0xff, 0xff, 0xff, 0x0f}, /* 2^32 - 1 */ empty[] = {0x01};
	uint8_t f[256];
	size_t n;
	(void)state;
	/* The frame is well formed with an empty records field. */
	n = v12_frame(f, none, sizeof(none), empty, sizeof(empty));
	f[n - 40] = 0;  /* partition tags */
	f[n - 39] = 0;  /* topic tags */
	f[n - 38] = 0;  /* top-level tags */
	n -= 37;
	km_put_be32(f, (uint32_t)(n - 4));
	assert_int_equal(walk_whole(f, n, 12), KM_FW_END);
	/* Records whose length is 2^31 - 1 or 2^32 - 2. */
	n = v12_frame(f, none, sizeof(none), huge, sizeof(huge));
	assert_int_equal(walk_whole(f, n, 12), KM_FW_ERROR);
	n = v12_frame(f, none, sizeof(none), max, sizeof(max));
	assert_int_equal(walk_whole(f, n, 12), KM_FW_ERROR);
	/* Aborted transactions counted 2^31 - 1. */
	n = v12_frame(f, huge, sizeof(huge), empty, sizeof(empty));
	assert_int_equal(walk_whole(f, n, 12), KM_FW_ERROR);
}

/* A topic name with a NUL byte would read as another name (km_fetch_part.topic is a C string): malformed. */
static void test_nul_in_name(void **state)
{
	static const uint8_t none[] = {0x00}, empty[] = {0x01};
	uint8_t f[256];
	size_t n = v12_frame(f, none, sizeof(none), empty, sizeof(empty));
	(void)state;
	assert_int_equal(f[21], 't'); /* size, correlation id, tags, throttle, error, session, count, length */
	assert_int_equal(walk_whole(f, n, 12), KM_FW_END);
	f[21] = 0;
	assert_int_equal(walk_whole(f, n, 12), KM_FW_ERROR);
}

/*
 * v4-11 have no top-level tags: bytes after the last partition's records are malformed, however
 * the walk reached the end (the last records skipped by length, or not).
 */
static void test_trailing_bytes(void **state)
{
	km_fetch_response m;
	km_fetch_response_fetchable_topic_response t;
	km_fetch_response_partition_data p;
	uint8_t recs[20];
	(void)state;
	memset(recs, 0x5a, sizeof(recs));
	km_fetch_response_init(&m);
	km_fetch_response_fetchable_topic_response_init(&t);
	km_fetch_response_partition_data_init(&p);
	t.topic = km_str_c("t");
	t.partitions.count = 1;
	t.partitions.items = &p;
	p.records = (km_bytes){recs, (int32_t)sizeof(recs)};
	m.responses.count = 1;
	m.responses.items = &t;
	for (int16_t v = 4; v <= 11; v++) {
		km_wr w;
		km_wr_init(&w);
		km_wr_i32(&w, 0);
		km_wr_i32(&w, 5);
		km_fetch_response_encode(&w, v, &m);
		km_wr_patch_i32(&w, 0, (int32_t)(w.len - 4));
		assert_true(km_wr_ok(&w));
		assert_int_equal(walk_whole(w.buf, w.len, v), KM_FW_END);
		km_wr_i32(&w, 0x7e7e7e7e);
		km_wr_patch_i32(&w, 0, (int32_t)(w.len - 4));
		assert_int_equal(walk_whole(w.buf, w.len, v), KM_FW_ERROR);
		km_wr_free(&w);
	}
}

static void test_patch_across_chains(void **state)
{
	struct evbuffer *b = evbuffer_new();
	struct evbuffer_iovec iov[4];
	struct evbuffer_ptr p;
	uint8_t all[30], want[30];
	(void)state;
	/* three separate chains of 10 bytes: moved in whole from their own buffers */
	for (int c = 0; c < 3; c++) {
		struct evbuffer *piece = evbuffer_new();
		uint8_t bytes[10];
		for (int i = 0; i < 10; i++)
			bytes[i] = (uint8_t)(c * 10 + i);
		evbuffer_add(piece, bytes, 10);
		evbuffer_add_buffer(b, piece);
		evbuffer_free(piece);
	}
	assert_int_equal(evbuffer_ptr_set(b, &p, 6, EVBUFFER_PTR_SET), 0);
	assert_true(evbuffer_peek(b, 18, &p, iov, 4) >= 2); /* the patched range does straddle chains */
	for (int i = 0; i < 30; i++)
		want[i] = (uint8_t)i;
	memset(want + 6, 0xee, 18);
	{
		uint8_t ee[18];
		memset(ee, 0xee, sizeof(ee));
		assert_true(km_evbuf_patch(b, 6, ee, sizeof(ee)));
		assert_false(km_evbuf_patch(b, 25, ee, 6)); /* past the end */
	}
	assert_int_equal(evbuffer_remove(b, all, 30), 30);
	assert_memory_equal(all, want, 30);
	evbuffer_free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_version),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_huge_lengths),
		cmocka_unit_test(test_trailing_bytes),
		cmocka_unit_test(test_nul_in_name),
		cmocka_unit_test(test_patch_across_chains),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
