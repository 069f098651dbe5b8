/*
 * Unit tests for record batches: iteration, truncated tails, patching and CRC, records, control
 * records, the builder in every codec, gap re-encoding, hostile input; and every batch of the Kafka
 * segment files in tests/data/batches (skipped while that directory does not exist) or --data DIR.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/batch.h"
#include "kmirror/crc32c.h"

static const int codecs[] = {KM_CODEC_NONE, KM_CODEC_GZIP, KM_CODEC_SNAPPY, KM_CODEC_LZ4, KM_CODEC_ZSTD};
#define NCODECS (sizeof(codecs) / sizeof(codecs[0]))
#define SCRATCH (1 << 20)

static uint8_t scratch[SCRATCH];

static km_bytes B(const char *s) { return s ? (km_bytes){(const uint8_t *)s, (int32_t)strlen(s)} : KM_BYTES_NULL; }

static const km_record_header hdrs[] = {
	{{"h1", 2}, {(const uint8_t *)"v1", 2}},
	{{"trace", 5}, {NULL, -1}},
};

/* n records: key-i (record 3 has a null key), value-i repeated, headers on every other. */
static void fill_records(km_batch_record *r, size_t n, char (*keys)[16], char (*vals)[64], int64_t ts0)
{
	for (size_t i = 0; i < n; i++) {
		snprintf(keys[i], 16, "key-%u", (unsigned)(i % 1000));
		snprintf(vals[i], 64, "value-%u-value-value-value", (unsigned)(i % 1000));
		r[i].timestamp = ts0 + (int64_t)(i * 7 % 5) * 1000; /* not monotonic: max must be computed */
		r[i].offset_delta = (int32_t)i;
		r[i].key = i == 3 ? KM_BYTES_NULL : B(keys[i]);
		r[i].value = i == 4 ? KM_BYTES_NULL : B(vals[i]);
		r[i].headers = i % 2 ? hdrs : NULL;
		r[i].headers_count = i % 2 ? 2 : 0;
	}
}

static void check_records(const km_batch *b, const km_batch_record *want, size_t n, int64_t base_offset)
{
	km_record_iter it;
	km_record rec;
	assert_int_equal(km_batch_records(b, scratch, SCRATCH, &it), KM_OK);
	size_t i = 0;
	while (km_record_next(&it, &rec)) {
		assert_true(i < n);
		assert_int_equal(rec.offset, base_offset + want[i].offset_delta);
		assert_int_equal(rec.timestamp, want[i].timestamp);
		assert_int_equal(rec.key.len, want[i].key.len);
		if (rec.key.len > 0)
			assert_memory_equal(rec.key.p, want[i].key.p, (size_t)rec.key.len);
		assert_int_equal(rec.value.len, want[i].value.len);
		if (rec.value.len > 0)
			assert_memory_equal(rec.value.p, want[i].value.p, (size_t)rec.value.len);
		assert_int_equal(rec.headers_count, (int32_t)want[i].headers_count);
		km_record_header_iter hi;
		km_record_header h;
		size_t k = 0;
		km_record_header_iter_init(&hi, &rec);
		while (km_record_header_next(&hi, &h)) {
			assert_true(km_str_eq(h.key, want[i].headers[k].key));
			assert_int_equal(h.value.len, want[i].headers[k].value.len);
			if (h.value.len > 0)
				assert_memory_equal(h.value.p, want[i].headers[k].value.p, (size_t)h.value.len);
			k++;
		}
		assert_int_equal(k, want[i].headers_count);
		i++;
	}
	assert_int_equal(it.err, KM_OK);
	assert_int_equal(i, n);
}

static void test_build_iterate_every_codec(void **state)
{
	for (size_t c = 0; c < NCODECS; c++) {
		km_batch_record r[40];
		char keys[40][16], vals[40][64];
		fill_records(r, 40, keys, vals, 1700000000000);
		km_batch_params p;
		km_batch_params_init(&p);
		p.codec = codecs[c];
		p.base_offset = 1000;
		p.partition_leader_epoch = 3;
		p.producer_id = 4242;
		p.producer_epoch = 2;
		p.base_sequence = 17;
		km_wr w;
		km_wr_init(&w);
		assert_int_equal(km_batch_build(&p, r, 40, &w), KM_OK);

		km_batch b;
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(b.base_offset, 1000);
		assert_int_equal(b.size, w.len);
		assert_int_equal(b.batch_length, (int32_t)w.len - 12);
		assert_int_equal(b.partition_leader_epoch, 3);
		assert_int_equal(b.magic, 2);
		assert_int_equal(b.codec, codecs[c]);
		assert_false(b.transactional || b.control || b.log_append_time || b.delete_horizon);
		assert_int_equal(b.last_offset_delta, 39);
		assert_int_equal(b.base_timestamp, 1700000000000);
		assert_int_equal(b.max_timestamp, 1700000000000 + 4000);
		assert_int_equal(b.producer_id, 4242);
		assert_int_equal(b.producer_epoch, 2);
		assert_int_equal(b.base_sequence, 17);
		assert_int_equal(b.records_count, 40);
		assert_true(km_batch_is_contiguous(&b));
		assert_int_equal(km_batch_verify_crc(w.buf, w.len), KM_OK);
		assert_int_equal(b.crc, km_crc32c(0, w.buf + 21, w.len - 21));
		assert_ptr_equal(b.records, w.buf + 61);
		check_records(&b, r, 40, 1000);
		/* A scratch too small for the decompressed records. */
		if (codecs[c] != KM_CODEC_NONE) {
			km_record_iter it;
			assert_int_equal(km_batch_records(&b, scratch, 100, &it), KM_ERR_TOO_LARGE);
		}
		km_wr_free(&w);
	}
}

/* Several batches back to back; every prefix yields the whole batches and reports the rest. */
static void test_truncated_tail(void **state)
{
	km_batch_record r[5];
	char keys[5][16], vals[5][64];
	fill_records(r, 5, keys, vals, 1000);
	km_batch_params p;
	km_batch_params_init(&p);
	km_wr w;
	km_wr_init(&w);
	size_t ends[3];
	for (int i = 0; i < 3; i++) {
		p.base_offset = i * 5;
		p.codec = codecs[i + 1];
		assert_int_equal(km_batch_build(&p, r, 5, &w), KM_OK);
		ends[i] = w.len;
	}
	for (size_t cut = 0; cut <= w.len; cut++) {
		km_batch_iter it;
		km_batch b;
		km_batch_iter_init(&it, w.buf, cut);
		size_t n = 0, consumed = 0;
		while (km_batch_next(&it, &b)) {
			assert_int_equal(b.base_offset, (int64_t)n * 5);
			assert_int_equal(b.offset, consumed);
			assert_int_equal(km_batch_verify_crc(b.data, b.size), KM_OK);
			consumed += b.size;
			n++;
		}
		assert_int_equal(it.err, KM_OK);
		size_t want = cut >= ends[2] ? 3 : cut >= ends[1] ? 2 : cut >= ends[0] ? 1 : 0;
		assert_int_equal(n, want);
		assert_int_equal(it.truncated_bytes, cut - consumed);
	}
	km_wr_free(&w);
}

static void build_simple(km_wr *w, int codec, int64_t base_offset)
{
	km_batch_record r[3];
	char keys[3][16], vals[3][64];
	fill_records(r, 3, keys, vals, 5000);
	km_batch_params p;
	km_batch_params_init(&p);
	p.codec = codec;
	p.base_offset = base_offset;
	p.producer_id = 1;
	p.producer_epoch = 0;
	p.base_sequence = 0;
	km_wr_init(w);
	assert_int_equal(km_batch_build(&p, r, 3, w), KM_OK);
}

static void test_patching(void **state)
{
	for (size_t c = 0; c < NCODECS; c++) {
		km_wr w;
		build_simple(&w, codecs[c], 77);
		uint8_t *orig = malloc(w.len);
		memcpy(orig, w.buf, w.len);
		uint32_t crc = km_be32(w.buf + 17);

		/* Outside the CRC. */
		km_batch_set_base_offset(w.buf, 0);
		km_batch_set_partition_leader_epoch(w.buf, 99);
		assert_int_equal(km_batch_verify_crc(w.buf, w.len), KM_OK);
		assert_int_equal(km_be32(w.buf + 17), crc);
		km_batch b;
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(b.base_offset, 0);
		assert_int_equal(b.partition_leader_epoch, 99);

		/* Inside the CRC: invalid until recomputed. */
		km_batch_set_producer(w.buf, 900001, 7, 12345);
		assert_int_equal(km_batch_verify_crc(w.buf, w.len), KM_ERR_CRC);
		uint32_t ncrc = km_batch_update_crc(w.buf, w.len);
		assert_int_not_equal(ncrc, crc);
		assert_int_equal(km_batch_verify_crc(w.buf, w.len), KM_OK);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(b.producer_id, 900001);
		assert_int_equal(b.producer_epoch, 7);
		assert_int_equal(b.base_sequence, 12345);
		assert_int_equal(b.crc, ncrc);
		/* The payload is untouched: bytes from the records on are the same. */
		assert_memory_equal(w.buf + 57, orig + 57, w.len - 57);

		/* Restamping back gives the original CRC again. */
		assert_int_equal(km_batch_restamp(w.buf, w.len, 1, 0, 0), crc);
		assert_memory_equal(w.buf + 16, orig + 16, w.len - 16);

		/* A flipped payload bit is caught. */
		w.buf[w.len - 1] ^= 1;
		assert_int_equal(km_batch_verify_crc(w.buf, w.len), KM_ERR_CRC);
		assert_int_equal(km_batch_verify_crc(w.buf, 60), KM_ERR_DECODE);
		free(orig);
		km_wr_free(&w);
	}
}

/* A control batch as the coordinator writes it. */
static void build_control(km_wr *w, int16_t key_version, int16_t type, const uint8_t *value, int32_t vlen)
{
	uint8_t key[4];
	km_put_be16(key, (uint16_t)key_version);
	km_put_be16(key + 2, (uint16_t)type);
	km_batch_record r = {.timestamp = 1, .offset_delta = 0, .key = {key, 4}, .value = {value, vlen}};
	km_batch_params p;
	km_batch_params_init(&p);
	p.control = true;
	p.transactional = true;
	p.producer_id = 55;
	p.producer_epoch = 3;
	km_wr_init(w);
	assert_int_equal(km_batch_build(&p, &r, 1, w), KM_OK);
}

static void test_control_records(void **state)
{
	uint8_t val[6];
	km_put_be16(val, 0);
	km_put_be32(val + 2, 17);
	for (int16_t t = 0; t <= 1; t++) {
		km_wr w;
		km_batch b;
		km_control c;
		build_control(&w, 0, t, val, 6);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_true(b.control && b.transactional);
		assert_false(km_batch_is_contiguous(&b));
		assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_OK);
		assert_int_equal(c.type, t == 0 ? KM_CONTROL_ABORT : KM_CONTROL_COMMIT);
		assert_int_equal(c.coordinator_epoch, 17);
		assert_string_equal(km_control_type_name(c.type), t == 0 ? "ABORT" : "COMMIT");
		km_wr_free(&w);
	}
	/* KRaft types: no coordinator epoch; unknown types reported as such. */
	static const struct {
		int16_t raw;
		km_control_type t;
	} kinds[] = {{2, KM_CONTROL_LEADER_CHANGE}, {3, KM_CONTROL_SNAPSHOT_HEADER}, {4, KM_CONTROL_SNAPSHOT_FOOTER},
		     {5, KM_CONTROL_KRAFT_VERSION},   {6, KM_CONTROL_KRAFT_VOTERS},     {7, KM_CONTROL_UNKNOWN},
		     {-3, KM_CONTROL_UNKNOWN}};
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		km_wr w;
		km_batch b;
		km_control c;
		build_control(&w, 0, kinds[i].raw, (const uint8_t *)"x", 1);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_OK);
		assert_int_equal(c.type, kinds[i].t);
		assert_int_equal(c.raw_type, kinds[i].raw);
		assert_int_equal(c.coordinator_epoch, -1);
		km_wr_free(&w);
	}
	/* Malformed: COMMIT with a short value, negative key version, negative value version. */
	{
		km_wr w;
		km_batch b;
		km_control c;
		build_control(&w, 0, 1, val, 5);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_ERR_DECODE);
		km_wr_free(&w);
		build_control(&w, -1, 1, val, 6);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_ERR_DECODE);
		km_wr_free(&w);
		uint8_t badval[6] = {0xff, 0xff, 0, 0, 0, 1};
		build_control(&w, 0, 0, badval, 6);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_ERR_DECODE);
		km_wr_free(&w);
	}
	/* A short key. */
	{
		km_record rec = {.key = {(const uint8_t *)"\0\0\0", 3}, .value = KM_BYTES_NULL};
		km_control c;
		assert_int_equal(km_control_parse(&rec, &c), KM_ERR_DECODE);
	}
	/* Not a control batch; an empty (cleaned) control batch. */
	{
		km_wr w;
		km_batch b;
		km_control c;
		build_simple(&w, KM_CODEC_NONE, 0);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_ERR_INVAL);
		km_wr_free(&w);
		build_control(&w, 0, 1, val, 6);
		uint8_t empty[61];
		memcpy(empty, w.buf, 61);
		km_put_be32(empty + 8, 49);
		km_put_be32(empty + 57, 0);
		km_batch_update_crc(empty, 61);
		assert_int_equal(km_batch_parse(empty, 61, &b), KM_OK);
		assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_OK);
		assert_int_equal(c.type, KM_CONTROL_NONE);
		km_wr_free(&w);
	}
}

static void test_log_append_time(void **state)
{
	km_batch_record r[3];
	char keys[3][16], vals[3][64];
	fill_records(r, 3, keys, vals, 5000);
	km_batch_params p;
	km_batch_params_init(&p);
	p.log_append_time = true;
	p.max_timestamp = 999999;
	km_wr w;
	km_wr_init(&w);
	assert_int_equal(km_batch_build(&p, r, 3, &w), KM_OK);
	km_batch b;
	km_record_iter it;
	km_record rec;
	assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
	assert_true(b.log_append_time);
	assert_int_equal(b.max_timestamp, 999999);
	assert_int_equal(km_batch_records(&b, NULL, 0, &it), KM_OK);
	int n = 0;
	while (km_record_next(&it, &rec)) {
		assert_int_equal(rec.timestamp, 999999);
		assert_int_equal(b.base_timestamp + rec.timestamp_delta, r[n].timestamp);
		n++;
	}
	assert_int_equal(n, 3);
	km_wr_free(&w);
}

static void test_builder_refuses(void **state)
{
	km_batch_record r[3];
	char keys[3][16], vals[3][64];
	fill_records(r, 3, keys, vals, 5000);
	km_batch_params p;
	km_batch_params_init(&p);
	km_wr w;
	km_wr_init(&w);
	assert_int_equal(km_batch_build(&p, r, 0, &w), KM_ERR_INVAL);
	r[2].offset_delta = 1; /* not increasing */
	assert_int_equal(km_batch_build(&p, r, 3, &w), KM_ERR_INVAL);
	r[2].offset_delta = 2;
	p.last_offset_delta = 1; /* below the last record's delta */
	assert_int_equal(km_batch_build(&p, r, 3, &w), KM_ERR_INVAL);
	p.last_offset_delta = -1;
	p.codec = 6;
	assert_int_equal(km_batch_build(&p, r, 3, &w), KM_ERR_INVAL);
	p.codec = 0;
	r[1].key.len = -2;
	assert_int_equal(km_batch_build(&p, r, 3, &w), KM_ERR_INVAL);
	assert_int_equal(w.len, 0);
	km_wr_free(&w);
}

/* A compacted batch: offsets 100,101,103,104,105,108 of 100..109, in every codec. */
static void test_split_gaps(void **state)
{
	static const int32_t deltas[] = {0, 1, 3, 4, 5, 8};
	for (size_t c = 0; c < NCODECS; c++) {
		km_batch_record r[6];
		char keys[6][16], vals[6][64];
		fill_records(r, 6, keys, vals, 7000);
		for (int i = 0; i < 6; i++)
			r[i].offset_delta = deltas[i];
		km_batch_params p;
		km_batch_params_init(&p);
		p.codec = codecs[c];
		p.base_offset = 100;
		p.partition_leader_epoch = 4;
		p.producer_id = 31;
		p.producer_epoch = 1;
		p.base_sequence = 50;
		p.transactional = true;
		p.last_offset_delta = 9; /* the cleaner keeps the original last offset */
		km_wr src;
		km_wr_init(&src);
		assert_int_equal(km_batch_build(&p, r, 6, &src), KM_OK);
		km_batch b;
		assert_int_equal(km_batch_parse(src.buf, src.len, &b), KM_OK);
		assert_int_equal(b.last_offset_delta, 9);
		assert_false(km_batch_is_contiguous(&b));

		km_wr out;
		km_wr_init(&out);
		size_t pieces;
		assert_int_equal(km_batch_split_gaps(&b, scratch, SCRATCH, &out, &pieces), KM_OK);
		assert_int_equal(pieces, 3);
		static const int64_t bases[] = {100, 103, 108};
		static const int32_t seqs[] = {50, 53, 58};
		static const int32_t counts[] = {2, 3, 1};
		km_batch_iter it;
		km_batch pb;
		size_t n = 0, ri = 0;
		km_batch_iter_init(&it, out.buf, out.len);
		while (km_batch_next(&it, &pb)) {
			assert_true(n < 3);
			assert_int_equal(pb.base_offset, bases[n]);
			assert_int_equal(pb.records_count, counts[n]);
			assert_int_equal(pb.last_offset_delta, counts[n] - 1);
			assert_true(km_batch_is_contiguous(&pb));
			assert_int_equal(pb.codec, codecs[c]);
			assert_true(pb.transactional);
			assert_int_equal(pb.producer_id, 31);
			assert_int_equal(pb.producer_epoch, 1);
			assert_int_equal(pb.base_sequence, seqs[n]);
			assert_int_equal(pb.partition_leader_epoch, 4);
			assert_int_equal(km_batch_verify_crc(pb.data, pb.size), KM_OK);
			/* Same records at the same absolute offsets. */
			km_batch_record want[3];
			for (int k = 0; k < counts[n]; k++) {
				want[k] = r[ri + (size_t)k];
				want[k].offset_delta = deltas[ri + (size_t)k] - deltas[ri];
			}
			check_records(&pb, want, (size_t)counts[n], bases[n]);
			ri += (size_t)counts[n];
			n++;
		}
		assert_int_equal(it.err, KM_OK);
		assert_int_equal(it.truncated_bytes, 0);
		assert_int_equal(n, 3);
		km_wr_free(&out);
		km_wr_free(&src);
	}
}

static void test_split_edge_cases(void **state)
{
	/* Already contiguous: one piece, the same records. */
	km_wr w, out;
	km_batch b;
	size_t pieces;
	build_simple(&w, KM_CODEC_LZ4, 10);
	assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
	km_wr_init(&out);
	assert_int_equal(km_batch_split_gaps(&b, scratch, SCRATCH, &out, &pieces), KM_OK);
	assert_int_equal(pieces, 1);
	km_batch pb;
	assert_int_equal(km_batch_parse(out.buf, out.len, &pb), KM_OK);
	assert_int_equal(pb.base_offset, 10);
	assert_int_equal(pb.records_count, 3);
	km_wr_free(&out);

	/* Empty (cleaned) batch: no piece. */
	uint8_t empty[61];
	memcpy(empty, w.buf, 61);
	km_put_be16(empty + 21, 0);
	km_put_be32(empty + 8, 49);
	km_put_be32(empty + 57, 0);
	assert_int_equal(km_batch_parse(empty, 61, &b), KM_OK);
	km_wr_init(&out);
	assert_int_equal(km_batch_split_gaps(&b, scratch, SCRATCH, &out, &pieces), KM_OK);
	assert_int_equal(pieces, 0);
	assert_int_equal(out.len, 0);
	km_wr_free(&w);

	/* Control batch: refused. */
	uint8_t val[6] = {0, 0, 0, 0, 0, 1};
	build_control(&w, 0, 1, val, 6);
	assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
	assert_int_equal(km_batch_split_gaps(&b, scratch, SCRATCH, &out, &pieces), KM_ERR_INVAL);
	km_wr_free(&w);

	/* Sequence wrap: base sequence near INT32_MAX. */
	km_batch_record r[2] = {{.timestamp = 1, .offset_delta = 0, .key = B("a"), .value = B("b")},
				{.timestamp = 2, .offset_delta = 5, .key = B("c"), .value = B("d")}};
	km_batch_params p;
	km_batch_params_init(&p);
	p.producer_id = 1;
	p.producer_epoch = 0;
	p.base_sequence = INT32_MAX - 2;
	km_wr_init(&w);
	assert_int_equal(km_batch_build(&p, r, 2, &w), KM_OK);
	assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
	assert_int_equal(km_batch_split_gaps(&b, scratch, SCRATCH, &out, &pieces), KM_OK);
	assert_int_equal(pieces, 2);
	km_batch_iter it;
	km_batch_iter_init(&it, out.buf, out.len);
	assert_true(km_batch_next(&it, &pb));
	assert_int_equal(pb.base_sequence, INT32_MAX - 2);
	assert_true(km_batch_next(&it, &pb));
	assert_int_equal(pb.base_sequence, 2); /* MAX-2 + 5 wraps to 2 */
	assert_int_equal(pb.base_offset, 5);
	km_wr_free(&w);
	km_wr_free(&out);
}

/* Hostile batch headers. */
static void test_hostile_headers(void **state)
{
	km_wr w;
	build_simple(&w, KM_CODEC_NONE, 0);
	uint8_t *buf = malloc(w.len);
	km_batch_iter it;
	km_batch b;

	static const struct {
		int32_t len;
		int8_t magic;
		km_err err;
	} cases[] = {
		{-1, 2, KM_ERR_DECODE},       /* negative length */
		{INT32_MIN, 2, KM_ERR_DECODE},
		{13, 2, KM_ERR_DECODE},       /* below any magic's minimum */
		{20, 2, KM_ERR_DECODE},       /* too small for a v2 header */
		{48, 2, KM_ERR_DECODE},
		{30, 1, KM_ERR_UNSUPPORTED},  /* old message formats */
		{30, 0, KM_ERR_UNSUPPORTED},
		{30, 3, KM_ERR_DECODE},       /* unknown magic */
		{30, -1, KM_ERR_DECODE},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(buf, w.buf, w.len);
		km_put_be32(buf + 8, (uint32_t)cases[i].len);
		buf[16] = (uint8_t)cases[i].magic;
		km_batch_iter_init(&it, buf, w.len);
		assert_false(km_batch_next(&it, &b));
		assert_int_equal(it.err, cases[i].err);
		assert_int_equal(it.err_pos, 0);
		assert_non_null(it.err_what);
		/* The error is sticky. */
		assert_false(km_batch_next(&it, &b));
	}
	/* A length past the end is a truncated batch, not an error. */
	memcpy(buf, w.buf, w.len);
	km_put_be32(buf + 8, INT32_MAX);
	km_batch_iter_init(&it, buf, w.len);
	assert_false(km_batch_next(&it, &b));
	assert_int_equal(it.err, KM_OK);
	assert_int_equal(it.truncated_bytes, w.len);
	/* A negative records count. */
	memcpy(buf, w.buf, w.len);
	km_put_be32(buf + 57, 0xffffffffu);
	km_batch_iter_init(&it, buf, w.len);
	assert_false(km_batch_next(&it, &b));
	assert_int_equal(it.err, KM_ERR_DECODE);
	/* parse wants exactly one batch. */
	assert_int_equal(km_batch_parse(w.buf, w.len - 1, &b), KM_ERR_DECODE);
	free(buf);
	km_wr_free(&w);
}

static km_err iterate_all(const uint8_t *buf, size_t len, int *n)
{
	km_batch b;
	km_record_iter it;
	km_record rec;
	*n = 0;
	assert_int_equal(km_batch_parse(buf, len, &b), KM_OK);
	km_err err = km_batch_records(&b, scratch, SCRATCH, &it);
	if (err)
		return err;
	while (km_record_next(&it, &rec))
		(*n)++;
	return it.err;
}

/* Records that lie: counts, lengths, key lengths, header keys, trailing bytes. */
static void test_hostile_records(void **state)
{
	km_wr w;
	int n;
	build_simple(&w, KM_CODEC_NONE, 0);
	uint8_t *buf = malloc(w.len + 16);
	memcpy(buf, w.buf, w.len);
	assert_int_equal(iterate_all(buf, w.len, &n), KM_OK);
	assert_int_equal(n, 3);

	/* Count too large / too small. */
	km_put_be32(buf + 57, 4);
	assert_int_equal(iterate_all(buf, w.len, &n), KM_ERR_DECODE);
	assert_int_equal(n, 3);
	km_put_be32(buf + 57, 2);
	assert_int_equal(iterate_all(buf, w.len, &n), KM_ERR_DECODE);
	assert_int_equal(n, 2);
	km_put_be32(buf + 57, INT32_MAX);
	assert_int_equal(iterate_all(buf, w.len, &n), KM_ERR_DECODE);
	memcpy(buf, w.buf, w.len);

	/* First record's length: negative, over the end, shorter than its fields. */
	uint8_t l0 = buf[61];
	buf[61] = 0x01; /* zigzag -1 */
	assert_int_equal(iterate_all(buf, w.len, &n), KM_ERR_DECODE);
	buf[61] = 0x7e; /* 63, more than there is */
	km_put_be32(buf + 57, 1);
	memcpy(buf + 8, "\0\0\0\x51", 4); /* batch ends after 20 record bytes */
	assert_int_equal(iterate_all(buf, 12 + 0x51, &n), KM_ERR_DECODE);
	memcpy(buf, w.buf, w.len);
	buf[61] = (uint8_t)(l0 - 2); /* length 1 smaller than the fields */
	assert_int_equal(iterate_all(buf, w.len, &n), KM_ERR_DECODE);
	assert_int_equal(n, 0);
	memcpy(buf, w.buf, w.len);

	/* Key length -2 (record 0: len, attrs, tsdelta, offdelta, keylen at 61+4). */
	assert_int_equal(buf[65], 2 * 5); /* "key-0" */
	buf[65] = 0x03; /* zigzag -2 */
	assert_int_equal(iterate_all(buf, w.len, &n), KM_ERR_DECODE);
	memcpy(buf, w.buf, w.len);

	/* Trailing bytes after the last record (batch one byte longer). */
	buf[w.len] = 0;
	km_put_be32(buf + 8, (uint32_t)(w.len + 1 - 12));
	assert_int_equal(iterate_all(buf, w.len + 1, &n), KM_ERR_DECODE);
	assert_int_equal(n, 3);
	free(buf);
	km_wr_free(&w);

	/* A header with a null key. */
	km_record_header bad = {{"k", 1}, {NULL, -1}};
	km_batch_record r = {.timestamp = 0, .offset_delta = 0, .key = B("k"), .value = B("v"), .headers = &bad,
			     .headers_count = 1};
	km_batch_params p;
	km_batch_params_init(&p);
	km_wr_init(&w);
	assert_int_equal(km_batch_build(&p, &r, 1, &w), KM_OK);
	/* record: len attrs ts off klen 'k' vlen 'v' hc hklen 'k' hvlen */
	size_t hk = 61 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1;
	assert_int_equal(w.buf[hk], 2);
	w.buf[hk] = 0x01;
	assert_int_equal(iterate_all(w.buf, w.len, &n), KM_ERR_DECODE);
	km_wr_free(&w);
}

/* A compressed batch whose records decompress past the scratch cap: refused, not allocated. */
static void test_decompression_bomb_batch(void **state)
{
	size_t big = 8u << 20;
	uint8_t *zeros = calloc(big, 1);
	km_batch_record r = {.timestamp = 0, .offset_delta = 0, .key = KM_BYTES_NULL, .value = {zeros, (int32_t)big}};
	for (size_t c = 1; c < NCODECS; c++) {
		km_batch_params p;
		km_batch_params_init(&p);
		p.codec = codecs[c];
		km_wr w;
		km_wr_init(&w);
		assert_int_equal(km_batch_build(&p, &r, 1, &w), KM_OK);
		assert_true(w.len < big / 16);
		km_batch b;
		km_record_iter it;
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(km_batch_records(&b, scratch, SCRATCH, &it), KM_ERR_TOO_LARGE);
		km_record rec;
		assert_false(km_record_next(&it, &rec));
		assert_int_equal(it.err, KM_ERR_TOO_LARGE);
		/* Corrupt compressed payload: a decode error, never a crash. */
		for (size_t i = 61; i < w.len; i += 7)
			w.buf[i] ^= 0xa5;
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_not_equal(km_batch_records(&b, scratch, SCRATCH, &it), KM_OK);
		km_wr_free(&w);
	}
	free(zeros);
}

/* ---- Kafka segment files (test_batch --data DIR) ---- */
#include <dirent.h>

static const char *data_dir;

static uint8_t *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
	assert_non_null(p);
	assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return p;
}

static void test_kafka_segments(void **state)
{
	DIR *d = opendir(data_dir);
	/* In the default run the directory is optional (the data may not be there yet); once it exists
	 * it must hold segment files. With --data it is required. */
	if (!d && state && *state == (void *)1)
		skip();
	assert_non_null(d);
	struct dirent *e;
	int files = 0;
	while ((e = readdir(d))) {
		size_t nl = strlen(e->d_name);
		if (nl < 5 || strcmp(e->d_name + nl - 4, ".log") != 0)
			continue;
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", data_dir, e->d_name);
		size_t len;
		uint8_t *buf = read_file(path, &len);
		km_batch_iter it;
		km_batch b;
		long batches = 0, records = 0, controls = 0, commits = 0, aborts = 0;
		km_batch_iter_init(&it, buf, len);
		while (km_batch_next(&it, &b)) {
			batches++;
			assert_int_equal(km_batch_verify_crc(b.data, b.size), KM_OK);
			if (b.control) {
				km_control c;
				assert_int_equal(km_batch_control(&b, scratch, SCRATCH, &c), KM_OK);
				controls++;
				commits += c.type == KM_CONTROL_COMMIT;
				aborts += c.type == KM_CONTROL_ABORT;
				if (b.transactional)
					assert_true(c.type == KM_CONTROL_COMMIT || c.type == KM_CONTROL_ABORT);
				continue;
			}
			km_record_iter ri;
			km_record rec;
			assert_int_equal(km_batch_records(&b, scratch, SCRATCH, &ri), KM_OK);
			int32_t n = 0;
			while (km_record_next(&ri, &rec))
				n++;
			assert_int_equal(ri.err, KM_OK);
			assert_int_equal(n, b.records_count);
			records += n;
		}
		if (it.err)
			fprintf(stderr, "%s: %s at byte %zu\n", e->d_name, it.err_what, it.err_pos);
		assert_int_equal(it.err, KM_OK);
		assert_int_equal(it.truncated_bytes, 0);
		assert_true(batches > 0);
		printf("# %s: %ld batches, %ld records, %ld control (%ld commit, %ld abort)\n", e->d_name, batches,
		       records, controls, commits, aborts);
		free(buf);
		files++;
	}
	closedir(d);
	/* An empty directory must not pass. */
	assert_true(files > 0);
}

static int optional_data(void **state)
{
	*state = (void *)1;
	return 0;
}

int main(int argc, char **argv)
{
#ifdef KM_BATCH_DATA_DIR
	data_dir = KM_BATCH_DATA_DIR;
#else
	data_dir = "tests/data/batches";
#endif
	if (argc == 3 && strcmp(argv[1], "--data") == 0) {
		data_dir = argv[2];
		const struct CMUnitTest data_tests[] = {cmocka_unit_test(test_kafka_segments)};
		return cmocka_run_group_tests(data_tests, NULL, NULL);
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_build_iterate_every_codec),
		cmocka_unit_test(test_truncated_tail),
		cmocka_unit_test(test_patching),
		cmocka_unit_test(test_control_records),
		cmocka_unit_test(test_log_append_time),
		cmocka_unit_test(test_builder_refuses),
		cmocka_unit_test(test_split_gaps),
		cmocka_unit_test(test_split_edge_cases),
		cmocka_unit_test(test_hostile_headers),
		cmocka_unit_test(test_hostile_records),
		cmocka_unit_test(test_decompression_bomb_batch),
		cmocka_unit_test_setup(test_kafka_segments, optional_data),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
