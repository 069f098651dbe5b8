/* Unit tests for the compression codecs: round trips, framings, caps, bombs, truncated and hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <lz4frame.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include "kmirror/compress.h"

static const int codecs[] = {KM_CODEC_NONE, KM_CODEC_GZIP, KM_CODEC_SNAPPY, KM_CODEC_LZ4, KM_CODEC_ZSTD};
#define NCODECS (sizeof(codecs) / sizeof(codecs[0]))

/* Half text-like (compressible), half pseudo-random (not). */
static uint8_t *make_data(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n ? n : 1);
	assert_non_null(p);
	uint32_t x = seed * 2654435761u + 7;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = i < n / 2 ? (uint8_t)("kafka mirror record "[i % 20]) : (uint8_t)x;
	}
	return p;
}

static void compress_or_fail(int codec, const uint8_t *src, size_t n, km_wr *w)
{
	km_wr_init(w);
	assert_int_equal(km_compress(codec, 0, src, n, w), KM_OK);
}

static void test_roundtrip_all_codecs(void **state)
{
	static const size_t sizes[] = {0, 1, 17, 4096, 32767, 32768, 32769, 100000, 300001};
	for (size_t c = 0; c < NCODECS; c++) {
		for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			size_t n = sizes[s];
			uint8_t *src = make_data(n, (unsigned)(c * 31 + s));
			km_wr w;
			compress_or_fail(codecs[c], src, n, &w);
			uint8_t *dst = malloc(n + 1);
			size_t got = 12345;
			/* Exactly the size fits. */
			assert_int_equal(km_decompress(codecs[c], w.buf, w.len, dst, n, &got), KM_OK);
			assert_int_equal(got, n);
			if (n)
				assert_memory_equal(dst, src, n);
			/* One byte less is over the cap. */
			if (n)
				assert_int_equal(km_decompress(codecs[c], w.buf, w.len, dst, n - 1, &got),
						 KM_ERR_TOO_LARGE);
			/* The allocating variant, cap exact and one below. */
			uint8_t *out;
			assert_int_equal(km_decompress_alloc(codecs[c], w.buf, w.len, n, &out, &got), KM_OK);
			assert_int_equal(got, n);
			if (n)
				assert_memory_equal(out, src, n);
			free(out);
			if (n)
				assert_int_equal(km_decompress_alloc(codecs[c], w.buf, w.len, n - 1, &out, &got),
						 KM_ERR_TOO_LARGE);
			free(dst);
			free(src);
			km_wr_free(&w);
		}
	}
}

static void test_compress_appends(void **state)
{
	uint8_t *src = make_data(5000, 9);
	for (size_t c = 0; c < NCODECS; c++) {
		km_wr w;
		km_wr_init(&w);
		km_wr_raw(&w, "HEAD", 4);
		assert_int_equal(km_compress(codecs[c], 0, src, 5000, &w), KM_OK);
		assert_memory_equal(w.buf, "HEAD", 4);
		uint8_t dst[5000];
		size_t got;
		assert_int_equal(km_decompress(codecs[c], w.buf + 4, w.len - 4, dst, sizeof(dst), &got), KM_OK);
		assert_int_equal(got, 5000);
		assert_memory_equal(dst, src, 5000);
		km_wr_free(&w);
	}
	free(src);
}

/* 32 MiB of zeros compresses to a few KiB in every codec: the cap must stop it. */
static void test_bombs(void **state)
{
	size_t n = 32u << 20;
	uint8_t *zeros = calloc(n, 1);
	assert_non_null(zeros);
	for (size_t c = 1; c < NCODECS; c++) {
		km_wr w;
		compress_or_fail(codecs[c], zeros, n, &w);
		assert_true(w.len < n / 16); /* snappy's best ratio is about 1:21 */
		uint8_t *dst = malloc(1 << 20), *out = NULL;
		size_t got;
		assert_int_equal(km_decompress(codecs[c], w.buf, w.len, dst, 1 << 20, &got), KM_ERR_TOO_LARGE);
		assert_int_equal(km_decompress_alloc(codecs[c], w.buf, w.len, 1 << 20, &out, &got), KM_ERR_TOO_LARGE);
		assert_null(out);
		free(dst);
		km_wr_free(&w);
	}
	free(zeros);
}

/* librdkafka may write raw snappy (no xerial framing): detected on decode. */
static void test_snappy_raw(void **state)
{
	uint8_t *src = make_data(70000, 5);
	size_t clen = snappy_max_compressed_length(70000);
	char *c = malloc(clen);
	assert_int_equal(snappy_compress((const char *)src, 70000, c, &clen), SNAPPY_OK);
	uint8_t *dst = malloc(70000);
	size_t got;
	assert_int_equal(km_decompress(KM_CODEC_SNAPPY, c, clen, dst, 70000, &got), KM_OK);
	assert_int_equal(got, 70000);
	assert_memory_equal(dst, src, 70000);
	assert_int_equal(km_decompress(KM_CODEC_SNAPPY, c, clen, dst, 69999, &got), KM_ERR_TOO_LARGE);
	/* Corrupted: a byte flipped inside. */
	c[clen / 2] ^= 0x55;
	km_err err = km_decompress(KM_CODEC_SNAPPY, c, clen, dst, 70000, &got);
	assert_true(err == KM_ERR_DECODE || (err == KM_OK && memcmp(dst, src, 70000) != 0));
	free(dst);
	free(c);
	free(src);
}

/* A raw snappy block that declares 4 GiB - 1 of output: refused before any allocation. */
static void test_snappy_declared_huge(void **state)
{
	static const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x00};
	uint8_t *out = NULL;
	size_t got;
	assert_int_equal(km_decompress_alloc(KM_CODEC_SNAPPY, huge, sizeof(huge), 1 << 20, &out, &got),
			 KM_ERR_DECODE);
	assert_null(out);
	/* An empty raw block (length 0) into a growing buffer that has nothing allocated yet. */
	static const uint8_t empty[] = {0x00};
	assert_int_equal(km_decompress_alloc(KM_CODEC_SNAPPY, empty, sizeof(empty), 1 << 20, &out, &got), KM_OK);
	assert_int_equal(got, 0);
	free(out);
	/* Declared small but the block is short: invalid. */
	static const uint8_t shortb[] = {0x40, 0x00, 'a'};
	uint8_t dst[100];
	assert_int_equal(km_decompress(KM_CODEC_SNAPPY, shortb, sizeof(shortb), dst, sizeof(dst), &got), KM_ERR_DECODE);
}

/* The xerial framing as the Java client writes it, built by hand; also two streams concatenated. */
static void test_snappy_xerial(void **state)
{
	const char *parts[] = {"hello, ", "xerial framed ", "snappy"};
	uint8_t buf[512];
	size_t pos = 0;
	for (int stream = 0; stream < 2; stream++) {
		static const uint8_t hdr[16] = {0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1};
		memcpy(buf + pos, hdr, 16);
		pos += 16;
		for (int i = 0; i < 3; i++) {
			size_t clen = sizeof(buf) - pos - 4;
			assert_int_equal(snappy_compress(parts[i], strlen(parts[i]), (char *)buf + pos + 4, &clen), SNAPPY_OK);
			km_put_be32(buf + pos, (uint32_t)clen);
			pos += 4 + clen;
		}
	}
	char dst[100];
	size_t got;
	assert_int_equal(km_decompress(KM_CODEC_SNAPPY, buf, pos, dst, sizeof(dst), &got), KM_OK);
	assert_int_equal(got, 2 * strlen("hello, xerial framed snappy"));
	assert_memory_equal(dst, "hello, xerial framed snappyhello, xerial framed snappy", got);
	/* A block length over the end, a negative one, and a cut length field. */
	uint8_t bad[64];
	memcpy(bad, buf, 24);
	km_put_be32(bad + 16, 1000);
	assert_int_equal(km_decompress(KM_CODEC_SNAPPY, bad, 24, dst, sizeof(dst), &got), KM_ERR_DECODE);
	km_put_be32(bad + 16, 0x80000001u);
	assert_int_equal(km_decompress(KM_CODEC_SNAPPY, bad, 24, dst, sizeof(dst), &got), KM_ERR_DECODE);
	assert_int_equal(km_decompress(KM_CODEC_SNAPPY, bad, 18, dst, sizeof(dst), &got), KM_ERR_DECODE);
}

/* Concatenated gzip members, lz4 frames and zstd frames decode as one stream. */
static void test_concatenated(void **state)
{
	for (size_t c = 1; c < NCODECS; c++) {
		if (codecs[c] == KM_CODEC_SNAPPY)
			continue;
		km_wr w;
		km_wr_init(&w);
		assert_int_equal(km_compress(codecs[c], 0, "first|", 6, &w), KM_OK);
		assert_int_equal(km_compress(codecs[c], 0, "second", 6, &w), KM_OK);
		char dst[64];
		size_t got;
		assert_int_equal(km_decompress(codecs[c], w.buf, w.len, dst, sizeof(dst), &got), KM_OK);
		assert_int_equal(got, 12);
		assert_memory_equal(dst, "first|second", 12);
		km_wr_free(&w);
	}
}

/* LZ4 frames with checksums and a content size (other writers set them) decode; a bad checksum fails. */
static void test_lz4_checksums(void **state)
{
	uint8_t *src = make_data(200000, 11);
	LZ4F_preferences_t prefs;
	memset(&prefs, 0, sizeof(prefs));
	prefs.frameInfo.blockSizeID = LZ4F_max256KB;
	prefs.frameInfo.blockMode = LZ4F_blockLinked;
	prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
	prefs.frameInfo.blockChecksumFlag = LZ4F_blockChecksumEnabled;
	prefs.frameInfo.contentSize = 200000;
	size_t bound = LZ4F_compressFrameBound(200000, &prefs);
	uint8_t *c = malloc(bound);
	size_t clen = LZ4F_compressFrame(c, bound, src, 200000, &prefs);
	assert_false(LZ4F_isError(clen));
	uint8_t *dst = malloc(200000);
	size_t got;
	assert_int_equal(km_decompress(KM_CODEC_LZ4, c, clen, dst, 200000, &got), KM_OK);
	assert_int_equal(got, 200000);
	assert_memory_equal(dst, src, 200000);
	c[clen - 2] ^= 1; /* content checksum */
	assert_int_equal(km_decompress(KM_CODEC_LZ4, c, clen, dst, 200000, &got), KM_ERR_DECODE);
	free(dst);
	free(c);
	free(src);
}

/* zstd frames without a content size (streaming writers such as the Java client's). */
static void test_zstd_streaming_frame(void **state)
{
	uint8_t *src = make_data(150000, 12);
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	size_t bound = ZSTD_compressBound(150000);
	uint8_t *c = malloc(bound);
	ZSTD_outBuffer ob = {c, bound, 0};
	ZSTD_inBuffer ib = {src, 150000, 0};
	ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
	assert_int_equal(ZSTD_compressStream2(cc, &ob, &ib, ZSTD_e_end), 0);
	ZSTD_freeCCtx(cc);
	assert_int_equal(ZSTD_getFrameContentSize(c, ob.pos), ZSTD_CONTENTSIZE_UNKNOWN);
	uint8_t *dst = malloc(150000);
	size_t got;
	assert_int_equal(km_decompress(KM_CODEC_ZSTD, c, ob.pos, dst, 150000, &got), KM_OK);
	assert_int_equal(got, 150000);
	assert_memory_equal(dst, src, 150000);
	assert_int_equal(km_decompress(KM_CODEC_ZSTD, c, ob.pos, dst, 149999, &got), KM_ERR_TOO_LARGE);
	free(dst);
	free(c);
	free(src);
}

/* Every prefix of a valid stream is refused (never taken as complete, never read past). */
static void test_truncated(void **state)
{
	uint8_t *src = make_data(3000, 13);
	uint8_t dst[3000];
	for (size_t c = 1; c < NCODECS; c++) {
		km_wr w;
		compress_or_fail(codecs[c], src, 3000, &w);
		for (size_t cut = 0; cut < w.len; cut++) {
			uint8_t *copy = malloc(cut ? cut : 1);
			memcpy(copy, w.buf, cut);
			size_t got;
			km_err err = km_decompress(codecs[c], copy, cut, dst, sizeof(dst), &got);
			/* A snappy xerial stream cut exactly between blocks is a shorter valid stream. */
			if (err == KM_OK)
				assert_true(codecs[c] == KM_CODEC_SNAPPY && got < 3000);
			else
				assert_int_equal(err, KM_ERR_DECODE);
			free(copy);
		}
		km_wr_free(&w);
	}
	free(src);
}

static void test_garbage_and_unknown(void **state)
{
	uint8_t junk[256], dst[1024];
	size_t got;
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 37 + 5);
	for (size_t c = 1; c < NCODECS; c++)
		assert_int_not_equal(km_decompress(codecs[c], junk, sizeof(junk), dst, sizeof(dst), &got), KM_OK);
	assert_int_equal(km_decompress(5, junk, 4, dst, sizeof(dst), &got), KM_ERR_UNSUPPORTED);
	assert_int_equal(km_decompress(-1, junk, 4, dst, sizeof(dst), &got), KM_ERR_UNSUPPORTED);
	km_wr w;
	km_wr_init(&w);
	assert_int_equal(km_compress(7, 0, junk, 4, &w), KM_ERR_UNSUPPORTED);
	km_wr_free(&w);
	assert_string_equal(km_codec_name(KM_CODEC_LZ4), "lz4");
	assert_string_equal(km_codec_name(9), "unknown");
	/* None over its cap. */
	assert_int_equal(km_decompress(KM_CODEC_NONE, junk, sizeof(junk), dst, 10, &got), KM_ERR_TOO_LARGE);
}

/* A gzip stream written by zlib directly (as the JDK's GZIPOutputStream writes: plain gzip member). */
static void test_gzip_foreign(void **state)
{
	const char *text = "gzip member written by another writer";
	uint8_t c[256];
	z_stream z;
	memset(&z, 0, sizeof(z));
	assert_int_equal(deflateInit2(&z, 9, Z_DEFLATED, 31, 9, Z_FILTERED), Z_OK);
	z.next_in = (Bytef *)(uintptr_t)text;
	z.avail_in = (uInt)strlen(text);
	z.next_out = c;
	z.avail_out = sizeof(c);
	assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
	size_t clen = sizeof(c) - z.avail_out;
	deflateEnd(&z);
	char dst[64];
	size_t got;
	assert_int_equal(km_decompress(KM_CODEC_GZIP, c, clen, dst, sizeof(dst), &got), KM_OK);
	assert_int_equal(got, strlen(text));
	assert_memory_equal(dst, text, got);
	c[clen - 5] ^= 0xff; /* CRC32 trailer */
	assert_int_equal(km_decompress(KM_CODEC_GZIP, c, clen, dst, sizeof(dst), &got), KM_ERR_DECODE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_all_codecs),
		cmocka_unit_test(test_compress_appends),
		cmocka_unit_test(test_bombs),
		cmocka_unit_test(test_snappy_raw),
		cmocka_unit_test(test_snappy_declared_huge),
		cmocka_unit_test(test_snappy_xerial),
		cmocka_unit_test(test_concatenated),
		cmocka_unit_test(test_lz4_checksums),
		cmocka_unit_test(test_zstd_streaming_frame),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_garbage_and_unknown),
		cmocka_unit_test(test_gzip_foreign),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
