/* Record batch compression codecs (gzip, snappy, lz4, zstd) in Kafka's framings, with capped output. */
#ifndef KMIRROR_COMPRESS_H
#define KMIRROR_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "kmirror/error.h"
#include "kmirror/wire.h"

/* The codec ids of record batch attributes bits 0-2. */
typedef enum km_codec {
	KM_CODEC_NONE = 0,
	KM_CODEC_GZIP = 1,
	KM_CODEC_SNAPPY = 2,
	KM_CODEC_LZ4 = 3,
	KM_CODEC_ZSTD = 4,
} km_codec;

#define KM_CODEC_MAX KM_CODEC_ZSTD

/* "none", "gzip", "snappy", "lz4", "zstd", or "unknown". */
const char *km_codec_name(int codec);

/*
 * Decompress src into dst (at most dst_cap bytes); *out_len is the decompressed size. Output that
 * would not fit is KM_ERR_TOO_LARGE (nothing larger than dst_cap is ever allocated or written),
 * malformed input KM_ERR_DECODE, an unknown codec KM_ERR_UNSUPPORTED. KM_CODEC_NONE copies.
 * Snappy input may be xerial-framed (as the Java client writes) or raw (as librdkafka may write):
 * the framing is detected. gzip accepts concatenated members; lz4 and zstd concatenated frames.
 */
km_err km_decompress(int codec, const void *src, size_t src_len, void *dst, size_t dst_cap,
		     size_t *out_len) __attribute__((warn_unused_result));

/*
 * The same into a malloc'd buffer that grows as needed up to max_out bytes; on success the caller
 * frees *out. The buffer is grown from the output actually produced, never from a size the input
 * declares.
 */
km_err km_decompress_alloc(int codec, const void *src, size_t src_len, size_t max_out, uint8_t **out,
			   size_t *out_len) __attribute__((warn_unused_result));

/*
 * Compress src and append the result to out, in the framing Kafka's Java producer writes: gzip
 * member, xerial-framed snappy (32 KiB blocks), LZ4 frame (64 KiB independent blocks, no content
 * checksum), zstd frame. level 0 = the codec's default. KM_CODEC_NONE appends src as it is.
 */
km_err km_compress(int codec, int level, const void *src, size_t src_len, km_wr *out)
	__attribute__((warn_unused_result));

#endif
