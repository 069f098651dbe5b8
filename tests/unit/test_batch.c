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

/*
 * A LogAppendTime batch made CreateTime for a CreateTime topic: the records unchanged, every record's
 * timestamp at most the append time and the largest exactly it (so a broker keeps the header as it
 * is), the two attribute bits cleared, for every codec.
 */
static void test_append_time_as_create(void **state)
{
	km_batch_record r[6];
	char keys[6][16], vals[6][64];
	(void)state;
	fill_records(r, 6, keys, vals, 5000); /* deltas 0, 2000, 4000, 1000, 3000, 0: the largest is not the last */
	for (size_t c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		km_batch_params p;
		km_batch b, nb;
		km_record_iter it;
		km_record rec;
		km_wr w;
		int64_t max = INT64_MIN;
		uint8_t *copy;

		km_batch_params_init(&p);
		p.codec = codecs[c];
		p.log_append_time = true;
		p.max_timestamp = 1700000000000LL;
		km_wr_init(&w);
		assert_int_equal(km_batch_build(&p, r, 6, &w), KM_OK);
		w.buf[KM_BATCH_OFF_ATTRIBUTES + 1] |= KM_BATCH_ATTR_DELETE_HORIZON; /* as the cleaner leaves some */
		km_batch_update_crc(w.buf, w.len);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_true(b.delete_horizon);
		copy = malloc(w.len);
		memcpy(copy, w.buf, w.len);
		assert_int_equal(km_batch_append_time_as_create(&b, scratch, SCRATCH, copy), KM_OK);
		km_batch_update_crc(copy, w.len);
		assert_int_equal(km_batch_parse(copy, w.len, &nb), KM_OK);
		assert_int_equal(km_batch_verify_crc(copy, w.len), KM_OK);
		assert_false(nb.log_append_time || nb.delete_horizon);
		assert_int_equal(nb.codec, codecs[c]);
		assert_int_equal(nb.max_timestamp, p.max_timestamp);
		assert_memory_equal(nb.records, b.records, b.records_size);
		assert_int_equal(km_batch_records(&nb, scratch, SCRATCH, &it), KM_OK);
		while (km_record_next(&it, &rec)) {
			assert_true(rec.timestamp <= p.max_timestamp);
			max = rec.timestamp > max ? rec.timestamp : max;
		}
		assert_int_equal(it.err, KM_OK);
		assert_int_equal(max, p.max_timestamp);
		free(copy);
		km_wr_free(&w);
	}
	/* Only LogAppendTime batches. */
	{
		km_batch_params p;
		km_batch b;
		km_wr w;
		uint8_t hdr[KM_BATCH_HEADER_SIZE];
		km_batch_params_init(&p);
		km_wr_init(&w);
		assert_int_equal(km_batch_build(&p, r, 6, &w), KM_OK);
		assert_int_equal(km_batch_parse(w.buf, w.len, &b), KM_OK);
		assert_int_equal(km_batch_append_time_as_create(&b, NULL, 0, hdr), KM_ERR_INVAL);
		km_wr_free(&w);
	}
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

/* ---- batches written by Kafka's Java client (kafka-clients 4.1.1, MemoryRecords.withRecords and
 * withEndTransactionMarker): 20 records "k<i>" / "v<i>" x30 at 1700000000000 + 10 i, key 3 null,
 * header "h<i>"="hv<i>" on odd records, base offset 500, leader epoch 5, producer 77/3, sequence 9;
 * then a COMMIT (coordinator epoch 42) and an ABORT (43) marker. ---- */
static const uint8_t java_gzip[377] = {
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xf4, 0x00, 0x00, 0x01, 0x6d, 0x00, 0x00, 0x00, 0x05,
	0x02, 0xa2, 0x09, 0xb7, 0x91, 0x00, 0x01, 0x00, 0x00, 0x00, 0x13, 0x00, 0x00, 0x01, 0x8b, 0xcf,
	0xe5, 0x68, 0x00, 0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0xbe, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x4d, 0x00, 0x03, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x14, 0x1f, 0x8b, 0x08,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xb5, 0x93, 0x31, 0x4a, 0x04, 0x41, 0x10, 0x45, 0xab,
	0x9a, 0x66, 0x58, 0x44, 0x44, 0x64, 0x11, 0x11, 0x11, 0x11, 0x11, 0xc3, 0xe9, 0xe9, 0xe9, 0xe9,
	0x69, 0xf0, 0x10, 0x1e, 0xc2, 0x60, 0xa0, 0xf3, 0xa2, 0x0f, 0x60, 0xb0, 0x88, 0x91, 0x81, 0x6c,
	0xe8, 0x01, 0x0c, 0xf7, 0x00, 0x86, 0x62, 0x6c, 0xe8, 0x01, 0x0c, 0x3d, 0x80, 0x81, 0xbf, 0xae,
	0xd0, 0xd0, 0xfc, 0x9f, 0xbf, 0xff, 0x0a, 0x6a, 0xc3, 0x44, 0x64, 0x73, 0x5f, 0xa4, 0xaf, 0x0f,
	0xbd, 0x30, 0xad, 0x8d, 0xcd, 0xae, 0x88, 0xab, 0x8f, 0xb1, 0x8b, 0xeb, 0x16, 0x71, 0x1b, 0xa6,
	0x1b, 0x6b, 0xf3, 0x50, 0x64, 0xa8, 0x0f, 0x3d, 0x33, 0xdd, 0x76, 0x5c, 0xc4, 0xd7, 0x07, 0x83,
	0x3c, 0x06, 0x79, 0x0c, 0xba, 0x5b, 0xd9, 0x3c, 0x16, 0x19, 0xeb, 0xa3, 0x37, 0xba, 0xdf, 0xb3,
	0x39, 0x14, 0x09, 0xf5, 0xc1, 0xa4, 0x80, 0x49, 0x01, 0x93, 0xca, 0xbe, 0xcd, 0x53, 0x91, 0xa9,
	0x3e, 0xb4, 0x65, 0x7a, 0xe2, 0x03, 0x9b, 0x63, 0x91, 0x58, 0x1f, 0x6c, 0x8a, 0xd8, 0x14, 0x1f,
	0x99, 0x5e, 0xf9, 0xd0, 0xe6, 0xb9, 0xc8, 0x5c, 0x1f, 0x1d, 0xb5, 0xe3, 0x23, 0x9b, 0x53, 0x91,
	0x54, 0x1f, 0x8c, 0x4a, 0x18, 0x95, 0x3e, 0x99, 0x3e, 0x78, 0xdd, 0x65, 0xd7, 0xef, 0x58, 0x5c,
	0xdf, 0xa8, 0xf4, 0xcd, 0xe8, 0x31, 0x30, 0x4e, 0x31, 0xae, 0x51, 0x4d, 0xb7, 0x38, 0xb7, 0xc2,
	0x8b, 0x38, 0x68, 0xfd, 0xf2, 0x09, 0x78, 0x83, 0xf2, 0x86, 0x46, 0x55, 0xad, 0x07, 0x73, 0x0a,
	0x8c, 0x57, 0x8c, 0x6f, 0x54, 0xd5, 0xf2, 0xaa, 0xe5, 0xa1, 0xb5, 0x35, 0x67, 0xe0, 0x8d, 0xca,
	0x1b, 0x1b, 0x55, 0xb5, 0xde, 0xcc, 0x39, 0x30, 0x41, 0x31, 0xa1, 0x51, 0x55, 0x2b, 0xa8, 0x56,
	0x80, 0xd6, 0xbb, 0xb9, 0x00, 0x6f, 0x52, 0xde, 0xd4, 0xa8, 0xaa, 0xf5, 0x65, 0x2e, 0x81, 0x89,
	0x8a, 0x89, 0x8d, 0xaa, 0x5a, 0x51, 0xb5, 0x22, 0xb4, 0x7e, 0xcc, 0x15, 0x78, 0xb3, 0xf2, 0xe6,
	0x46, 0x55, 0xad, 0x3f, 0x73, 0x0d, 0x4c, 0x52, 0x4c, 0x6a, 0x54, 0xd5, 0x4a, 0xaa, 0x95, 0xfe,
	0x01, 0x6a, 0xbb, 0x68, 0x9b, 0x13, 0x07, 0x00, 0x00,
};
static const uint8_t java_snappy[534] = {
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xf4, 0x00, 0x00, 0x02, 0x0a, 0x00, 0x00, 0x00, 0x05,
	0x02, 0xca, 0x57, 0x82, 0xc4, 0x00, 0x02, 0x00, 0x00, 0x00, 0x13, 0x00, 0x00, 0x01, 0x8b, 0xcf,
	0xe5, 0x68, 0x00, 0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0xbe, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x4d, 0x00, 0x03, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x14, 0x82, 0x53, 0x4e,
	0x41, 0x50, 0x50, 0x59, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x01,
	0xc5, 0x93, 0x0e, 0x28, 0x88, 0x01, 0x00, 0x00, 0x00, 0x04, 0x6b, 0x30, 0x78, 0x76, 0x30, 0xe6,
	0x02, 0x00, 0x2c, 0x00, 0x96, 0x01, 0x00, 0x14, 0x02, 0x04, 0x6b, 0x31, 0x78, 0x76, 0x31, 0xe6,
	0x02, 0x00, 0x48, 0x02, 0x04, 0x68, 0x31, 0x06, 0x68, 0x76, 0x31, 0x88, 0x01, 0x00, 0x28, 0x04,
	0x04, 0x6b, 0x32, 0x78, 0x76, 0x32, 0xe6, 0x02, 0x00, 0x24, 0x00, 0x92, 0x01, 0x00, 0x3c, 0x06,
	0x01, 0x78, 0x76, 0x33, 0xe6, 0x02, 0x00, 0x48, 0x02, 0x04, 0x68, 0x33, 0x06, 0x68, 0x76, 0x33,
	0x88, 0x01, 0x00, 0x50, 0x08, 0x04, 0x6b, 0x34, 0x78, 0x76, 0x34, 0xe6, 0x02, 0x00, 0x21, 0x24,
	0x1c, 0x64, 0x0a, 0x04, 0x6b, 0x35, 0x78, 0x76, 0x35, 0xe6, 0x02, 0x00, 0x48, 0x02, 0x04, 0x68,
	0x35, 0x06, 0x68, 0x76, 0x35, 0x88, 0x01, 0x00, 0x78, 0x0c, 0x04, 0x6b, 0x36, 0x78, 0x76, 0x36,
	0xe6, 0x02, 0x00, 0x30, 0x00, 0x98, 0x01, 0x00, 0x8c, 0x01, 0x0e, 0x04, 0x6b, 0x37, 0x78, 0x76,
	0x37, 0xe6, 0x02, 0x00, 0x4c, 0x02, 0x04, 0x68, 0x37, 0x06, 0x68, 0x76, 0x37, 0x8a, 0x01, 0x00,
	0xa0, 0x01, 0x10, 0x04, 0x6b, 0x38, 0x78, 0x76, 0x38, 0xe6, 0x02, 0x00, 0x01, 0x95, 0x20, 0xb4,
	0x01, 0x12, 0x04, 0x6b, 0x39, 0x78, 0x76, 0x39, 0xe6, 0x02, 0x00, 0x58, 0x02, 0x04, 0x68, 0x39,
	0x06, 0x68, 0x76, 0x39, 0xca, 0x01, 0x00, 0xc8, 0x01, 0x14, 0x06, 0x6b, 0x31, 0x30, 0xb4, 0x01,
	0x76, 0x31, 0x30, 0xfe, 0x03, 0x00, 0x5a, 0x03, 0x00, 0x28, 0x00, 0xdc, 0x01, 0x00, 0xdc, 0x01,
	0x16, 0x06, 0x6b, 0x31, 0x31, 0x01, 0x67, 0x04, 0x31, 0x76, 0xfe, 0x03, 0x00, 0x56, 0x03, 0x00,
	0x4c, 0x02, 0x06, 0x68, 0x31, 0x31, 0x08, 0x68, 0x76, 0x31, 0x31, 0xca, 0x01, 0x00, 0xf0, 0x01,
	0x18, 0x06, 0x6b, 0x31, 0x32, 0x01, 0x70, 0x04, 0x32, 0x76, 0xfe, 0x03, 0x00, 0x56, 0x03, 0x00,
	0x01, 0xd7, 0x18, 0x84, 0x02, 0x1a, 0x06, 0x6b, 0x31, 0x33, 0x01, 0x67, 0x04, 0x33, 0x76, 0xfe,
	0x03, 0x00, 0x56, 0x03, 0x00, 0x01, 0xd7, 0x00, 0x33, 0x01, 0xd7, 0x28, 0x33, 0xca, 0x01, 0x00,
	0x98, 0x02, 0x1c, 0x06, 0x6b, 0x31, 0x34, 0x01, 0x70, 0x04, 0x34, 0x76, 0xfe, 0x03, 0x00, 0x56,
	0x03, 0x00, 0x01, 0xd7, 0x18, 0xac, 0x02, 0x1e, 0x06, 0x6b, 0x31, 0x35, 0x01, 0x67, 0x04, 0x35,
	0x76, 0xfe, 0x03, 0x00, 0x56, 0x03, 0x00, 0x01, 0xd7, 0x00, 0x35, 0x01, 0xd7, 0x28, 0x35, 0xca,
	0x01, 0x00, 0xc0, 0x02, 0x20, 0x06, 0x6b, 0x31, 0x36, 0x01, 0x70, 0x04, 0x36, 0x76, 0xfe, 0x03,
	0x00, 0x56, 0x03, 0x00, 0x01, 0xd7, 0x18, 0xd4, 0x02, 0x22, 0x06, 0x6b, 0x31, 0x37, 0x01, 0x67,
	0x04, 0x37, 0x76, 0xfe, 0x03, 0x00, 0x56, 0x03, 0x00, 0x01, 0xd7, 0x00, 0x37, 0x01, 0xd7, 0x28,
	0x37, 0xca, 0x01, 0x00, 0xe8, 0x02, 0x24, 0x06, 0x6b, 0x31, 0x38, 0x01, 0x70, 0x04, 0x38, 0x76,
	0xfe, 0x03, 0x00, 0x56, 0x03, 0x00, 0x01, 0xd7, 0x18, 0xfc, 0x02, 0x26, 0x06, 0x6b, 0x31, 0x39,
	0x01, 0x67, 0x04, 0x39, 0x76, 0xfe, 0x03, 0x00, 0x56, 0x03, 0x00, 0x24, 0x02, 0x06, 0x68, 0x31,
	0x39, 0x08, 0x68, 0x76, 0x31, 0x39,
};
static const uint8_t java_lz4[503] = {
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xf4, 0x00, 0x00, 0x01, 0xeb, 0x00, 0x00, 0x00, 0x05,
	0x02, 0x69, 0x0e, 0xa9, 0xaa, 0x00, 0x03, 0x00, 0x00, 0x00, 0x13, 0x00, 0x00, 0x01, 0x8b, 0xcf,
	0xe5, 0x68, 0x00, 0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0xbe, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x4d, 0x00, 0x03, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x14, 0x04, 0x22, 0x4d,
	0x18, 0x60, 0x40, 0x82, 0xab, 0x01, 0x00, 0x00, 0xbf, 0x88, 0x01, 0x00, 0x00, 0x00, 0x04, 0x6b,
	0x30, 0x78, 0x76, 0x30, 0x02, 0x00, 0x27, 0xcf, 0x00, 0x96, 0x01, 0x00, 0x14, 0x02, 0x04, 0x6b,
	0x31, 0x78, 0x76, 0x31, 0x02, 0x00, 0x27, 0xff, 0x04, 0x02, 0x04, 0x68, 0x31, 0x06, 0x68, 0x76,
	0x31, 0x88, 0x01, 0x00, 0x28, 0x04, 0x04, 0x6b, 0x32, 0x78, 0x76, 0x32, 0x02, 0x00, 0x27, 0xaf,
	0x00, 0x92, 0x01, 0x00, 0x3c, 0x06, 0x01, 0x78, 0x76, 0x33, 0x02, 0x00, 0x27, 0xff, 0x04, 0x02,
	0x04, 0x68, 0x33, 0x06, 0x68, 0x76, 0x33, 0x88, 0x01, 0x00, 0x50, 0x08, 0x04, 0x6b, 0x34, 0x78,
	0x76, 0x34, 0x02, 0x00, 0x27, 0x00, 0x24, 0x01, 0x8f, 0x64, 0x0a, 0x04, 0x6b, 0x35, 0x78, 0x76,
	0x35, 0x02, 0x00, 0x27, 0xff, 0x04, 0x02, 0x04, 0x68, 0x35, 0x06, 0x68, 0x76, 0x35, 0x88, 0x01,
	0x00, 0x78, 0x0c, 0x04, 0x6b, 0x36, 0x78, 0x76, 0x36, 0x02, 0x00, 0x27, 0xdf, 0x00, 0x98, 0x01,
	0x00, 0x8c, 0x01, 0x0e, 0x04, 0x6b, 0x37, 0x78, 0x76, 0x37, 0x02, 0x00, 0x27, 0xff, 0x05, 0x02,
	0x04, 0x68, 0x37, 0x06, 0x68, 0x76, 0x37, 0x8a, 0x01, 0x00, 0xa0, 0x01, 0x10, 0x04, 0x6b, 0x38,
	0x78, 0x76, 0x38, 0x02, 0x00, 0x27, 0x00, 0x95, 0x00, 0x9f, 0xb4, 0x01, 0x12, 0x04, 0x6b, 0x39,
	0x78, 0x76, 0x39, 0x02, 0x00, 0x27, 0xff, 0x08, 0x02, 0x04, 0x68, 0x39, 0x06, 0x68, 0x76, 0x39,
	0xca, 0x01, 0x00, 0xc8, 0x01, 0x14, 0x06, 0x6b, 0x31, 0x30, 0xb4, 0x01, 0x76, 0x31, 0x30, 0x03,
	0x00, 0x44, 0xb0, 0x00, 0xdc, 0x01, 0x00, 0xdc, 0x01, 0x16, 0x06, 0x6b, 0x31, 0x31, 0x67, 0x00,
	0x1f, 0x31, 0x03, 0x00, 0x44, 0xf0, 0x05, 0x02, 0x06, 0x68, 0x31, 0x31, 0x08, 0x68, 0x76, 0x31,
	0x31, 0xca, 0x01, 0x00, 0xf0, 0x01, 0x18, 0x06, 0x6b, 0x31, 0x32, 0x70, 0x00, 0x1f, 0x32, 0x03,
	0x00, 0x44, 0x00, 0xd7, 0x00, 0x70, 0x84, 0x02, 0x1a, 0x06, 0x6b, 0x31, 0x33, 0x67, 0x00, 0x1f,
	0x33, 0x03, 0x00, 0x44, 0x00, 0xd7, 0x00, 0x10, 0x33, 0xd7, 0x00, 0xb0, 0x33, 0xca, 0x01, 0x00,
	0x98, 0x02, 0x1c, 0x06, 0x6b, 0x31, 0x34, 0x70, 0x00, 0x1f, 0x34, 0x03, 0x00, 0x44, 0x00, 0xd7,
	0x00, 0x70, 0xac, 0x02, 0x1e, 0x06, 0x6b, 0x31, 0x35, 0x67, 0x00, 0x1f, 0x35, 0x03, 0x00, 0x44,
	0x00, 0xd7, 0x00, 0x10, 0x35, 0xd7, 0x00, 0xb0, 0x35, 0xca, 0x01, 0x00, 0xc0, 0x02, 0x20, 0x06,
	0x6b, 0x31, 0x36, 0x70, 0x00, 0x1f, 0x36, 0x03, 0x00, 0x44, 0x00, 0xd7, 0x00, 0x70, 0xd4, 0x02,
	0x22, 0x06, 0x6b, 0x31, 0x37, 0x67, 0x00, 0x1f, 0x37, 0x03, 0x00, 0x44, 0x00, 0xd7, 0x00, 0x10,
	0x37, 0xd7, 0x00, 0xb0, 0x37, 0xca, 0x01, 0x00, 0xe8, 0x02, 0x24, 0x06, 0x6b, 0x31, 0x38, 0x70,
	0x00, 0x1f, 0x38, 0x03, 0x00, 0x44, 0x00, 0xd7, 0x00, 0x70, 0xfc, 0x02, 0x26, 0x06, 0x6b, 0x31,
	0x39, 0x67, 0x00, 0x1f, 0x39, 0x03, 0x00, 0x44, 0xa0, 0x02, 0x06, 0x68, 0x31, 0x39, 0x08, 0x68,
	0x76, 0x31, 0x39, 0x00, 0x00, 0x00, 0x00,
};
static const uint8_t java_zstd[401] = {
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xf4, 0x00, 0x00, 0x01, 0x85, 0x00, 0x00, 0x00, 0x05,
	0x02, 0xc1, 0xdc, 0xf0, 0x29, 0x00, 0x04, 0x00, 0x00, 0x00, 0x13, 0x00, 0x00, 0x01, 0x8b, 0xcf,
	0xe5, 0x68, 0x00, 0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0xbe, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x4d, 0x00, 0x03, 0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x14, 0x28, 0xb5, 0x2f,
	0xfd, 0x00, 0x58, 0x44, 0x0a, 0x00, 0x96, 0xd6, 0x43, 0x2e, 0x70, 0x4b, 0x92, 0x0e, 0x9c, 0x63,
	0x7d, 0x6d, 0xf7, 0x3c, 0xd6, 0xf7, 0xbb, 0x74, 0xbc, 0xe9, 0x1f, 0x71, 0x5c, 0x7c, 0xfb, 0x67,
	0xba, 0xab, 0x58, 0xff, 0xa7, 0xd8, 0x6d, 0xb7, 0xdd, 0x48, 0x8b, 0x40, 0xe8, 0xff, 0xff, 0xff,
	0x4d, 0xfd, 0x7f, 0x22, 0xef, 0x20, 0x93, 0x0c, 0x39, 0x00, 0x39, 0x00, 0x34, 0x00, 0x67, 0x13,
	0x4f, 0x9a, 0x3b, 0xab, 0x8e, 0x1a, 0x00, 0x11, 0xcc, 0x0f, 0xb6, 0x58, 0xb5, 0x50, 0x83, 0x40,
	0x30, 0x3b, 0x92, 0x4d, 0x4c, 0xd2, 0x5c, 0xb2, 0xca, 0xf8, 0xc0, 0x5c, 0xc1, 0x14, 0xab, 0x14,
	0x6a, 0x8c, 0x03, 0xb3, 0xe3, 0x9b, 0xf8, 0x34, 0xf7, 0x55, 0x57, 0x73, 0x08, 0xf3, 0x83, 0x25,
	0x56, 0x25, 0xd4, 0x98, 0x99, 0x1d, 0x01, 0xbf, 0x62, 0x01, 0x2f, 0xe6, 0xc5, 0x12, 0x5f, 0xaf,
	0xc4, 0x15, 0x11, 0xce, 0x60, 0x56, 0xd2, 0x26, 0xa6, 0x34, 0x97, 0x56, 0x25, 0x35, 0x04, 0xbc,
	0xcc, 0x0f, 0x6b, 0xac, 0x6a, 0xa8, 0x19, 0x60, 0x0b, 0xe6, 0x09, 0x68, 0x13, 0x51, 0x9a, 0x43,
	0xab, 0x90, 0x1a, 0x01, 0xa6, 0x60, 0x7e, 0x18, 0x63, 0x15, 0x43, 0x4d, 0x00, 0x65, 0x76, 0x04,
	0x4f, 0xbc, 0xf3, 0xf5, 0x3a, 0x57, 0x4c, 0x70, 0x17, 0xcc, 0x8b, 0x2d, 0xbe, 0x5e, 0x8b, 0x2b,
	0x22, 0xb8, 0x87, 0x59, 0x49, 0xbe, 0x89, 0x24, 0x4f, 0xbc, 0xe4, 0xeb, 0x95, 0x5c, 0xf1, 0xc0,
	0x49, 0x30, 0x2f, 0xa6, 0xf8, 0x7a, 0x29, 0xae, 0x68, 0xc0, 0x1c, 0xcc, 0xca, 0xbf, 0x89, 0xfc,
	0x89, 0xf7, 0xaf, 0x57, 0xe9, 0x9b, 0x48, 0x7a, 0xe2, 0xa5, 0xaf, 0x57, 0xba, 0x62, 0x83, 0xeb,
	0x60, 0x5e, 0xac, 0xf1, 0xf5, 0x6a, 0x5c, 0x91, 0xc1, 0x6d, 0x30, 0x2b, 0xe8, 0x9b, 0x08, 0x7a,
	0xe2, 0xa1, 0xaf, 0x17, 0xba, 0xe2, 0x82, 0xd3, 0x60, 0x5e, 0x8c, 0xf1, 0xf5, 0x62, 0x5c, 0x51,
	0xc1, 0x61, 0x30, 0x2b, 0xe7, 0x9b, 0xc8, 0x09, 0x14, 0x00, 0x08, 0x4c, 0x2b, 0x02, 0xd3, 0x40,
	0x60, 0x02, 0x11, 0x98, 0x30, 0x02, 0x13, 0x88, 0xc0, 0x84, 0x11, 0x98, 0x40, 0x04, 0x26, 0x8c,
	0xc0, 0x04, 0x92, 0x6e, 0x12, 0x0f, 0xce, 0xef, 0xe0, 0x64, 0x0e, 0xce, 0xff, 0xe0, 0x0c, 0x07,
	0x27, 0x7d, 0x70, 0xda, 0x83, 0xb3, 0x3f, 0x38, 0xc3, 0xc1, 0x49, 0xdf, 0xe9, 0xe6, 0x01, 0x00,
	0x00,
};
static const uint8_t java_control[156] = {
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x1c, 0x00, 0x00, 0x00, 0x42, 0x00, 0x00, 0x00, 0x05,
	0x02, 0x20, 0xff, 0x67, 0x95, 0x00, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x4e, 0x00, 0x01, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x20, 0x00, 0x00,
	0x00, 0x08, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00, 0x02, 0x1d, 0x00, 0x00, 0x00, 0x42, 0x00, 0x00, 0x00, 0x05, 0x02, 0x13,
	0x85, 0x2e, 0x8f, 0x00, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x4f, 0x00, 0x02, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x20, 0x00, 0x00, 0x00, 0x08,
	0x00, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2b, 0x00,
};

static char jkeys[20][8], jvals[20][128], jhk[20][8], jhv[20][8];
static km_record_header jhdr[20];
static km_batch_record jrecs[20];

static void java_records(void)
{
	for (int i = 0; i < 20; i++) {
		snprintf(jkeys[i], sizeof(jkeys[i]), "k%d", i);
		jvals[i][0] = 0;
		for (int k = 0; k < 30; k++)
			snprintf(jvals[i] + strlen(jvals[i]), sizeof(jvals[i]) - strlen(jvals[i]), "v%d", i);
		snprintf(jhk[i], sizeof(jhk[i]), "h%d", i);
		snprintf(jhv[i], sizeof(jhv[i]), "hv%d", i);
		jhdr[i] = (km_record_header){{jhk[i], (int32_t)strlen(jhk[i])}, B(jhv[i])};
		jrecs[i] = (km_batch_record){.timestamp = 1700000000000 + i * 10, .offset_delta = i,
					     .key = i == 3 ? KM_BYTES_NULL : B(jkeys[i]), .value = B(jvals[i]),
					     .headers = i % 2 ? &jhdr[i] : NULL, .headers_count = (size_t)(i % 2)};
	}
}

static void test_java_written(void **state)
{
	static const struct {
		const uint8_t *p;
		size_t n;
		int codec;
		bool identical; /* our builder writes the same bytes */
	} fx[] = {
		{java_gzip, sizeof(java_gzip), KM_CODEC_GZIP, false}, /* zlib and the JDK differ in the gzip header */
		{java_snappy, sizeof(java_snappy), KM_CODEC_SNAPPY, true},
		{java_lz4, sizeof(java_lz4), KM_CODEC_LZ4, true},
		{java_zstd, sizeof(java_zstd), KM_CODEC_ZSTD, false}, /* zstd-jni's streaming frame differs */
	};
	java_records();
	for (size_t i = 0; i < sizeof(fx) / sizeof(fx[0]); i++) {
		km_batch b;
		assert_int_equal(km_batch_parse(fx[i].p, fx[i].n, &b), KM_OK);
		assert_int_equal(b.codec, fx[i].codec);
		assert_int_equal(b.base_offset, 500);
		assert_int_equal(b.partition_leader_epoch, 5);
		assert_int_equal(b.producer_id, 77);
		assert_int_equal(b.producer_epoch, 3);
		assert_int_equal(b.base_sequence, 9);
		assert_int_equal(b.last_offset_delta, 19);
		assert_int_equal(b.max_timestamp, 1700000000190);
		assert_true(km_batch_is_contiguous(&b));
		assert_int_equal(km_batch_verify_crc(b.data, b.size), KM_OK);
		check_records(&b, jrecs, 20, 500);

		km_batch_params p;
		km_batch_params_init(&p);
		p.codec = fx[i].codec;
		p.base_offset = 500;
		p.partition_leader_epoch = 5;
		p.producer_id = 77;
		p.producer_epoch = 3;
		p.base_sequence = 9;
		km_wr w;
		km_wr_init(&w);
		assert_int_equal(km_batch_build(&p, jrecs, 20, &w), KM_OK);
		/* The header up to the records always matches, but for the length and the CRC. */
		assert_memory_equal(w.buf, fx[i].p, 8);
		assert_memory_equal(w.buf + 12, fx[i].p + 12, 5);
		assert_memory_equal(w.buf + 21, fx[i].p + 21, 40);
		if (fx[i].identical) {
			assert_int_equal(w.len, fx[i].n);
			assert_memory_equal(w.buf, fx[i].p, fx[i].n);
		}
		km_wr_free(&w);
	}

	km_batch_iter it;
	km_batch b;
	km_control c;
	km_batch_iter_init(&it, java_control, sizeof(java_control));
	assert_true(km_batch_next(&it, &b));
	assert_int_equal(km_batch_verify_crc(b.data, b.size), KM_OK);
	assert_true(b.control && b.transactional);
	assert_int_equal(b.base_offset, 540);
	assert_int_equal(b.producer_id, 78);
	assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_OK);
	assert_int_equal(c.type, KM_CONTROL_COMMIT);
	assert_int_equal(c.coordinator_epoch, 42);
	assert_true(km_batch_next(&it, &b));
	assert_int_equal(km_batch_verify_crc(b.data, b.size), KM_OK);
	assert_int_equal(b.producer_id, 79);
	assert_int_equal(b.producer_epoch, 2);
	assert_int_equal(km_batch_control(&b, NULL, 0, &c), KM_OK);
	assert_int_equal(c.type, KM_CONTROL_ABORT);
	assert_int_equal(c.coordinator_epoch, 43);
	assert_false(km_batch_next(&it, &b));
	assert_int_equal(it.err, KM_OK);
	assert_int_equal(it.truncated_bytes, 0);
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

/* One batch line of README.txt: "offset N records M codec flags pid P epoch E seq S". */
typedef struct want_batch {
	long offset;
	int records;
	char codec[16];
	char flags[64];
	long pid;
	int epoch, seq;
} want_batch;

/* The batches README.txt lists under "name" (after "Batches in each file"); -1 if not listed. */
static int readme_batches(const char *readme, const char *name, want_batch *out, int max)
{
	const char *p = strstr(readme, "Batches in each file");
	if (!p)
		return -1;
	int n = -1;
	bool in = false;
	while ((p = strchr(p, '\n')) != NULL) {
		p++;
		char line[256];
		size_t len = strcspn(p, "\n");
		if (len >= sizeof(line))
			len = sizeof(line) - 1;
		memcpy(line, p, len);
		line[len] = 0;
		if (line[0] && line[0] != ' ') {
			in = strcmp(line, name) == 0;
			if (in)
				n = 0;
			continue;
		}
		want_batch w;
		if (in && sscanf(line, " offset %ld records %d %15s %63s pid %ld epoch %d seq %d", &w.offset, &w.records,
				 w.codec, w.flags, &w.pid, &w.epoch, &w.seq) == 7 && n < max)
			out[n++] = w;
	}
	return n;
}

static bool bytes_is(km_bytes b, const char *s) { return b.len == (int32_t)strlen(s) && memcmp(b.p, s, (size_t)b.len) == 0; }

/* Per-record content README.txt describes, by file name. */
static void check_content(const char *file, const km_batch *b, const km_record *rec, int data_index, int control_index,
			  const km_control *ctl)
{
	static const char *names[] = {"none", "gzip", "snappy", "lz4", "zstd"};
	char want[128];
	if (strcmp(file, "librdkafka-txn.log") == 0) {
		static const km_control_type markers[] = {KM_CONTROL_COMMIT, KM_CONTROL_ABORT, KM_CONTROL_COMMIT};
		if (ctl) {
			assert_true(control_index < 3);
			assert_int_equal(ctl->type, markers[control_index]);
			return;
		}
		const char *what = data_index >= 10 && data_index < 20 ? "abort" : "commit";
		snprintf(want, sizeof(want), "key-%03d", data_index);
		assert_true(bytes_is(rec->key, want));
		snprintf(want, sizeof(want), "value-%03d-%s-abcdefghabcdefghabcdefghabcdefgh", data_index, what);
		assert_true(bytes_is(rec->value, want));
		km_record_header_iter hi;
		km_record_header h;
		km_record_header_iter_init(&hi, rec);
		assert_true(km_record_header_next(&hi, &h));
		assert_true(km_str_eq_c(h.key, "txn"));
		assert_true(bytes_is(h.value, what));
		return;
	}
	if (strcmp(file, "java-txn.log") == 0) {
		if (ctl) {
			assert_int_equal(ctl->type, KM_CONTROL_COMMIT);
			return;
		}
		assert_int_equal(rec->key.len, -1);
		assert_int_equal(rec->value.len, 40);
		return;
	}
	for (int c = 0; c < 5; c++) {
		char suffix[32];
		snprintf(suffix, sizeof(suffix), "-%s.log", names[c]);
		size_t fl = strlen(file), sl = strlen(suffix);
		if (fl <= sl || strcmp(file + fl - sl, suffix) != 0)
			continue;
		assert_null(ctl);
		assert_int_equal(b->codec, c);
		assert_int_equal(rec->offset, data_index);
		snprintf(want, sizeof(want), "key-%03d", data_index);
		assert_true(bytes_is(rec->key, want));
		snprintf(want, sizeof(want), "value-%03d-%s-abcdefghabcdefghabcdefghabcdefgh", data_index, names[c]);
		assert_true(bytes_is(rec->value, want));
		assert_int_equal(rec->headers_count, 2);
		km_record_header_iter hi;
		km_record_header h;
		km_record_header_iter_init(&hi, rec);
		assert_true(km_record_header_next(&hi, &h));
		assert_true(km_str_eq_c(h.key, "h1"));
		snprintf(want, sizeof(want), "hv-%d", data_index);
		assert_true(bytes_is(h.value, want));
		assert_true(km_record_header_next(&hi, &h));
		assert_true(km_str_eq_c(h.key, "codec"));
		assert_true(bytes_is(h.value, names[c]));
		return;
	}
	fail_msg("%s: README.txt names no content for this file", file);
}

/*
 * The iovec restamp must give the bytes of the contiguous one, however the batch is split: at one
 * point (inside the header too) and at two, with an empty piece and bytes past the batch.
 */
static void check_restamp_iov(const km_batch *b, const uint8_t *want)
{
	size_t cuts[] = {0, 1, 8, 17, 20, 21, 22, 43, 60, 61, 62, b->size / 2, b->size - 1, b->size};
	size_t ncut = sizeof(cuts) / sizeof(cuts[0]);
	uint8_t hdr[KM_BATCH_HEADER_SIZE];
	uint32_t crc;
	uint8_t *buf = malloc(b->size + 5);

	memcpy(buf, b->data, b->size);
	memset(buf + b->size, 0xee, 5); /* not part of the batch: must not be covered */
	for (size_t i = 0; i < ncut; i++) {
		for (size_t j = i; j < ncut; j++) {
			size_t a = cuts[i] < b->size ? cuts[i] : b->size, z = cuts[j] < b->size ? cuts[j] : b->size;
			struct iovec v[4] = {{buf, a}, {buf + a, z - a}, {buf + z, b->size - z}, {buf + b->size, 5}};
			memset(hdr, 0, sizeof(hdr));
			assert_int_equal(km_batch_restamp_iov(v, 4, hdr, 424242, 1, 7, &crc), KM_OK);
			assert_memory_equal(hdr, want, KM_BATCH_HEADER_SIZE);
			assert_int_equal(crc, km_be32(want + KM_BATCH_OFF_CRC));
		}
	}
	/* The source pieces are only read. */
	assert_memory_equal(buf, b->data, b->size);
	/* Short: not even a header, or fewer bytes than the batch length says. */
	struct iovec s1 = {buf, KM_BATCH_HEADER_SIZE - 1}, s2 = {buf, b->size - 1};
	assert_int_equal(km_batch_restamp_iov(&s1, 1, hdr, 1, 1, 1, &crc), KM_ERR_DECODE);
	if (b->size > KM_BATCH_HEADER_SIZE)
		assert_int_equal(km_batch_restamp_iov(&s2, 1, hdr, 1, 1, 1, &crc), KM_ERR_DECODE);
	free(buf);
}

static void test_kafka_segments(void **state)
{
	DIR *d = opendir(data_dir);
	/* In the default run the directory is optional (the data may not be there yet); once it exists
	 * it must hold segment files and README.txt. With --data it is required. */
	if (!d && state && *state == (void *)1)
		skip();
	assert_non_null(d);
	char path[4096];
	size_t rlen;
	snprintf(path, sizeof(path), "%s/README.txt", data_dir);
	uint8_t *rbuf = read_file(path, &rlen);
	char *readme = malloc(rlen + 1);
	memcpy(readme, rbuf, rlen);
	readme[rlen] = 0;
	free(rbuf);
	struct dirent *e;
	int files = 0;
	while ((e = readdir(d))) {
		size_t nl = strlen(e->d_name);
		if (nl < 5 || strcmp(e->d_name + nl - 4, ".log") != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", data_dir, e->d_name);
		want_batch want[128];
		int nwant = readme_batches(readme, e->d_name, want, 128);
		if (nwant < 0)
			fail_msg("%s is not described in README.txt", e->d_name);
		size_t len;
		uint8_t *buf = read_file(path, &len);
		km_batch_iter it;
		km_batch b;
		int batches = 0, records = 0, controls = 0;
		km_batch_iter_init(&it, buf, len);
		while (km_batch_next(&it, &b)) {
			assert_int_equal(km_batch_verify_crc(b.data, b.size), KM_OK);
			assert_true(batches < nwant);
			const want_batch *w = &want[batches];
			assert_int_equal(b.base_offset, w->offset);
			assert_int_equal(b.records_count, w->records);
			assert_string_equal(km_codec_name(b.codec), w->codec);
			assert_int_equal(b.transactional, strstr(w->flags, "transactional") != NULL);
			assert_int_equal(b.control, strstr(w->flags, "control") != NULL);
			assert_int_equal(b.producer_id, w->pid);
			assert_int_equal(b.producer_epoch, w->epoch);
			assert_int_equal(b.base_sequence, w->seq);
			batches++;
			if (b.control) {
				km_control c;
				assert_int_equal(km_batch_control(&b, scratch, SCRATCH, &c), KM_OK);
				assert_true(c.type == KM_CONTROL_COMMIT || c.type == KM_CONTROL_ABORT);
				check_content(e->d_name, &b, NULL, records, controls, &c);
				controls++;
				continue;
			}
			assert_true(km_batch_is_contiguous(&b));
			km_record_iter ri;
			km_record rec;
			assert_int_equal(km_batch_records(&b, scratch, SCRATCH, &ri), KM_OK);
			int32_t n = 0;
			while (km_record_next(&ri, &rec)) {
				check_content(e->d_name, &b, &rec, records + n, controls, NULL);
				n++;
			}
			assert_int_equal(ri.err, KM_OK);
			assert_int_equal(n, b.records_count);
			records += n;
			/* A restamp keeps the batch valid and its payload intact. */
			uint8_t *copy = malloc(b.size);
			memcpy(copy, b.data, b.size);
			km_batch_set_base_offset(copy, 0);
			km_batch_restamp(copy, b.size, 424242, 1, 7);
			assert_int_equal(km_batch_verify_crc(copy, b.size), KM_OK);
			assert_memory_equal(copy + KM_BATCH_HEADER_SIZE, b.records, b.records_size);
			check_restamp_iov(&b, copy);
			free(copy);
		}
		if (it.err)
			fprintf(stderr, "%s: %s at byte %zu\n", e->d_name, it.err_what, it.err_pos);
		assert_int_equal(it.err, KM_OK);
		assert_int_equal(it.truncated_bytes, 0);
		assert_int_equal(batches, nwant);
		assert_true(batches > 0);
		printf("# %s: %d batches, %d records, %d control, as README.txt says\n", e->d_name, batches, records,
		       controls);
		free(buf);
		files++;
	}
	closedir(d);
	free(readme);
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
		cmocka_unit_test(test_append_time_as_create),
		cmocka_unit_test(test_builder_refuses),
		cmocka_unit_test(test_split_gaps),
		cmocka_unit_test(test_split_edge_cases),
		cmocka_unit_test(test_hostile_headers),
		cmocka_unit_test(test_hostile_records),
		cmocka_unit_test(test_decompression_bomb_batch),
		cmocka_unit_test(test_java_written),
		cmocka_unit_test_setup(test_kafka_segments, optional_data),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
