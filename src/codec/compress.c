/* gzip, snappy (xerial-framed or raw), lz4 (frame) and zstd for record batches, output capped by the caller. */
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <lz4frame.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "kmirror/compress.h"

/* The Java client's xerial SnappyOutputStream header: magic, version 1, compatible version 1. */
static const uint8_t xerial_magic[8] = {0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};
#define XERIAL_HEADER_SIZE 16
#define XERIAL_BLOCK_SIZE (32 * 1024)

const char *km_codec_name(int codec)
{
	switch (codec) {
	case KM_CODEC_NONE: return "none";
	case KM_CODEC_GZIP: return "gzip";
	case KM_CODEC_SNAPPY: return "snappy";
	case KM_CODEC_LZ4: return "lz4";
	case KM_CODEC_ZSTD: return "zstd";
	default: return "unknown";
	}
}

/*
 * Where decompressed bytes go: the caller's fixed buffer, or a heap buffer grown from what has been
 * produced so far (doubling), never past max. When the sink is full at its cap the decoders are given
 * a one-byte probe: if they still produce a byte, the output is over the cap.
 */
typedef struct sink {
	uint8_t *p;
	size_t len, cap, max;
	bool grow;
	uint8_t probe;
	bool probing;
} sink;

/* Room for the decoder: returns a pointer and its size, switching to the probe when full at max. */
static km_err sink_room(sink *s, uint8_t **out, size_t *avail)
{
	if (s->len == s->cap && s->grow && s->cap < s->max) {
		size_t ncap = s->cap < 4096 ? 4096 : s->cap * 2;
		if (ncap > s->max || ncap < s->cap)
			ncap = s->max;
		uint8_t *np = realloc(s->p, ncap ? ncap : 1);
		if (!np)
			return KM_ERR_NOMEM;
		s->p = np;
		s->cap = ncap;
	}
	if (s->len < s->cap) {
		s->probing = false;
		*out = s->p + s->len;
		*avail = s->cap - s->len;
	} else {
		s->probing = true;
		*out = &s->probe;
		*avail = 1;
	}
	return KM_OK;
}

/* Account for n bytes produced into the room; a byte in the probe means over the cap. */
static km_err sink_done(sink *s, size_t n)
{
	if (s->probing)
		return n ? KM_ERR_TOO_LARGE : KM_OK;
	s->len += n;
	return KM_OK;
}

/* Grow so that n more bytes fit (for snappy, whose blocks declare their size and are validated). */
static km_err sink_need(sink *s, size_t n)
{
	if (n > s->max - s->len)
		return KM_ERR_TOO_LARGE;
	if (s->len + n <= s->cap)
		return KM_OK;
	if (!s->grow)
		return KM_ERR_TOO_LARGE;
	size_t ncap = s->cap < 4096 ? 4096 : s->cap;
	while (ncap < s->len + n)
		ncap = ncap > s->max / 2 ? s->max : ncap * 2;
	uint8_t *np = realloc(s->p, ncap);
	if (!np)
		return KM_ERR_NOMEM;
	s->p = np;
	s->cap = ncap;
	return KM_OK;
}

static km_err gzip_decode(const uint8_t *src, size_t n, sink *s)
{
	z_stream z;
	memset(&z, 0, sizeof(z));
	/* 15 + 32: zlib or gzip header, detected; Kafka writes gzip. */
	if (inflateInit2(&z, 15 + 32) != Z_OK)
		return KM_ERR_NOMEM;
	km_err err = KM_OK;
	size_t pos = 0;
	for (;;) {
		uint8_t *out;
		size_t avail;
		if ((err = sink_room(s, &out, &avail)) != KM_OK)
			break;
		size_t in_chunk = n - pos > UINT_MAX ? UINT_MAX : n - pos;
		size_t out_chunk = avail > UINT_MAX ? UINT_MAX : avail;
		z.next_in = (Bytef *)(uintptr_t)(src + pos);
		z.avail_in = (uInt)in_chunk;
		z.next_out = out;
		z.avail_out = (uInt)out_chunk;
		int ret = inflate(&z, Z_NO_FLUSH);
		size_t consumed = in_chunk - z.avail_in, produced = out_chunk - z.avail_out;
		pos += consumed;
		if ((err = sink_done(s, produced)) != KM_OK)
			break;
		if (ret == Z_STREAM_END) {
			/* Another gzip member may follow (Java's GZIPInputStream reads them all). */
			if (n - pos >= 2 && src[pos] == 0x1f && src[pos + 1] == 0x8b) {
				if (inflateReset(&z) != Z_OK) {
					err = KM_ERR_DECODE;
					break;
				}
				continue;
			}
			break;
		}
		if (ret == Z_OK)
			continue; /* progress was made */
		/* Z_BUF_ERROR with room to write: the input ended inside the stream. */
		err = ret == Z_MEM_ERROR ? KM_ERR_NOMEM : KM_ERR_DECODE;
		break;
	}
	inflateEnd(&z);
	return err;
}

static km_err snappy_raw_decode(const uint8_t *src, size_t n, sink *s)
{
	size_t ulen;
	if (snappy_uncompressed_length((const char *)src, n, &ulen) != SNAPPY_OK)
		return KM_ERR_DECODE;
	/* Validate before allocating (no output written): the declared length is then what the block
	 * really produces, not just a number from the peer. */
	if (snappy_validate_compressed_buffer((const char *)src, n) != SNAPPY_OK)
		return KM_ERR_DECODE;
	if (ulen > s->max - s->len)
		return KM_ERR_TOO_LARGE;
	if (ulen == 0)
		return KM_OK;
	km_err err = sink_need(s, ulen);
	if (err)
		return err;
	size_t got = ulen;
	if (snappy_uncompress((const char *)src, n, (char *)s->p + s->len, &got) != SNAPPY_OK || got != ulen)
		return KM_ERR_DECODE;
	s->len += got;
	return KM_OK;
}

static km_err snappy_decode(const uint8_t *src, size_t n, sink *s)
{
	if (n < XERIAL_HEADER_SIZE || memcmp(src, xerial_magic, sizeof(xerial_magic)) != 0)
		return snappy_raw_decode(src, n, s);
	size_t pos = 0;
	while (pos < n) {
		/* A header again: concatenated xerial streams. */
		if (n - pos >= XERIAL_HEADER_SIZE && memcmp(src + pos, xerial_magic, sizeof(xerial_magic)) == 0) {
			pos += XERIAL_HEADER_SIZE;
			continue;
		}
		if (n - pos < 4)
			return KM_ERR_DECODE;
		int32_t blen = (int32_t)km_be32(src + pos);
		pos += 4;
		if (blen < 0 || (size_t)blen > n - pos)
			return KM_ERR_DECODE;
		if (blen > 0) {
			km_err err = snappy_raw_decode(src + pos, (size_t)blen, s);
			if (err)
				return err;
		}
		pos += (size_t)blen;
	}
	return KM_OK;
}

static km_err lz4_decode(const uint8_t *src, size_t n, sink *s)
{
	LZ4F_dctx *d;
	if (LZ4F_isError(LZ4F_createDecompressionContext(&d, LZ4F_VERSION)))
		return KM_ERR_NOMEM;
	km_err err = KM_OK;
	size_t pos = 0;
	if (n == 0)
		err = KM_ERR_DECODE;
	while (!err) {
		uint8_t *out;
		size_t avail;
		if ((err = sink_room(s, &out, &avail)) != KM_OK)
			break;
		size_t dsz = avail, ssz = n - pos;
		size_t r = LZ4F_decompress(d, out, &dsz, src + pos, &ssz, NULL);
		if (LZ4F_isError(r)) {
			err = KM_ERR_DECODE;
			break;
		}
		pos += ssz;
		if ((err = sink_done(s, dsz)) != KM_OK)
			break;
		if (r == 0) {
			if (pos == n)
				break; /* frame complete, input used up */
			continue;      /* another frame follows; the context starts over by itself */
		}
		if (pos == n && dsz < avail) {
			err = KM_ERR_DECODE; /* input ended inside the frame */
			break;
		}
	}
	LZ4F_freeDecompressionContext(d);
	return err;
}

static km_err zstd_decode(const uint8_t *src, size_t n, sink *s)
{
	ZSTD_DCtx *d = ZSTD_createDCtx();
	if (!d)
		return KM_ERR_NOMEM;
	/*
	 * The window is the decoder's own allocation and the frame chooses it: keep it near the output cap
	 * (but allow 8 MiB, what high producer levels use even for small batches; 128 MiB at most).
	 */
	int wlog = 23;
	while (wlog < 27 && ((size_t)1 << wlog) < s->max)
		wlog++;
	ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, wlog);
	ZSTD_inBuffer in = {src, n, 0};
	km_err err = KM_OK;
	if (n == 0)
		err = KM_ERR_DECODE;
	/*
	 * A frame whose declared content size fits the room given is decoded in one pass straight into
	 * the output, without a window buffer. Make the growable sink that large up front (the size is
	 * within the caller's cap) so that both variants decode the same frames the same way.
	 */
	unsigned long long fcs = n ? ZSTD_getFrameContentSize(src, n) : ZSTD_CONTENTSIZE_ERROR;
	if (!err && s->grow && fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != ZSTD_CONTENTSIZE_ERROR &&
	    fcs <= s->max - s->len)
		err = sink_need(s, (size_t)fcs);
	while (!err) {
		uint8_t *out;
		size_t avail;
		if ((err = sink_room(s, &out, &avail)) != KM_OK)
			break;
		ZSTD_outBuffer ob = {out, avail, 0};
		size_t r = ZSTD_decompressStream(d, &ob, &in);
		if (ZSTD_isError(r)) {
			err = ZSTD_getErrorCode(r) == ZSTD_error_frameParameter_windowTooLarge ? KM_ERR_TOO_LARGE
											    : KM_ERR_DECODE;
			break;
		}
		if ((err = sink_done(s, ob.pos)) != KM_OK)
			break;
		if (r == 0) {
			if (in.pos == in.size)
				break;
			continue;
		}
		if (in.pos == in.size && ob.pos < ob.size) {
			err = KM_ERR_DECODE;
			break;
		}
	}
	ZSTD_freeDCtx(d);
	return err;
}

static km_err decode(int codec, const uint8_t *src, size_t n, sink *s)
{
	switch (codec) {
	case KM_CODEC_NONE: {
		km_err err = sink_need(s, n);
		if (err)
			return err;
		if (n)
			memcpy(s->p + s->len, src, n);
		s->len += n;
		return KM_OK;
	}
	case KM_CODEC_GZIP: return gzip_decode(src, n, s);
	case KM_CODEC_SNAPPY: return snappy_decode(src, n, s);
	case KM_CODEC_LZ4: return lz4_decode(src, n, s);
	case KM_CODEC_ZSTD: return zstd_decode(src, n, s);
	default: return KM_ERR_UNSUPPORTED;
	}
}

km_err km_decompress(int codec, const void *src, size_t src_len, void *dst, size_t dst_cap, size_t *out_len)
{
	sink s = {.p = dst, .cap = dst_cap, .max = dst_cap};
	*out_len = 0;
	if (!src && src_len)
		return KM_ERR_INVAL;
	km_err err = decode(codec, src, src_len, &s);
	if (!err)
		*out_len = s.len;
	return err;
}

km_err km_decompress_alloc(int codec, const void *src, size_t src_len, size_t max_out, uint8_t **out,
			   size_t *out_len)
{
	sink s = {.max = max_out, .grow = true};
	*out = NULL;
	*out_len = 0;
	if (!src && src_len)
		return KM_ERR_INVAL;
	km_err err = decode(codec, src, src_len, &s);
	if (err) {
		free(s.p);
		return err;
	}
	*out = s.p ? s.p : malloc(1);
	if (!*out)
		return KM_ERR_NOMEM;
	*out_len = s.len;
	return KM_OK;
}

/* ---- encoders: each reserves its worst case in the writer, then trims to what it wrote ---- */

static uint8_t *wr_room(km_wr *w, size_t n, size_t *pos)
{
	*pos = km_wr_reserve(w, n);
	return km_wr_ok(w) ? w->buf + *pos : NULL;
}

static km_err gzip_encode(int level, const uint8_t *src, size_t n, km_wr *w)
{
	z_stream z;
	memset(&z, 0, sizeof(z));
	if (n > UINT_MAX)
		return KM_ERR_TOO_LARGE;
	if (deflateInit2(&z, level ? level : Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
			 Z_DEFAULT_STRATEGY) != Z_OK)
		return KM_ERR_INVAL;
	size_t bound = deflateBound(&z, (uLong)n), pos;
	uint8_t *out = bound <= UINT_MAX ? wr_room(w, bound, &pos) : NULL;
	if (!out) {
		deflateEnd(&z);
		return bound > UINT_MAX ? KM_ERR_TOO_LARGE : KM_ERR_NOMEM;
	}
	z.next_in = (Bytef *)(uintptr_t)src;
	z.avail_in = (uInt)n;
	z.next_out = out;
	z.avail_out = (uInt)bound;
	int ret = deflate(&z, Z_FINISH);
	size_t produced = bound - z.avail_out;
	deflateEnd(&z);
	if (ret != Z_STREAM_END)
		return KM_ERR_ENCODE;
	w->len = pos + produced;
	return KM_OK;
}

static km_err snappy_encode(const uint8_t *src, size_t n, km_wr *w)
{
	km_wr_raw(w, xerial_magic, sizeof(xerial_magic));
	km_wr_i32(w, 1);
	km_wr_i32(w, 1);
	for (size_t off = 0; off < n; off += XERIAL_BLOCK_SIZE) {
		size_t blk = n - off < XERIAL_BLOCK_SIZE ? n - off : XERIAL_BLOCK_SIZE, pos;
		size_t olen = snappy_max_compressed_length(blk);
		uint8_t *out = wr_room(w, 4 + olen, &pos);
		if (!out)
			return KM_ERR_NOMEM;
		if (snappy_compress((const char *)src + off, blk, (char *)out + 4, &olen) != SNAPPY_OK)
			return KM_ERR_ENCODE;
		km_put_be32(out, (uint32_t)olen);
		w->len = pos + 4 + olen;
	}
	return km_wr_ok(w) ? KM_OK : KM_ERR_NOMEM;
}

static km_err lz4_encode(int level, const uint8_t *src, size_t n, km_wr *w)
{
	LZ4F_preferences_t prefs;
	memset(&prefs, 0, sizeof(prefs));
	prefs.frameInfo.blockSizeID = LZ4F_max64KB;
	prefs.frameInfo.blockMode = LZ4F_blockIndependent;
	prefs.compressionLevel = level;
	size_t bound = LZ4F_compressFrameBound(n, &prefs), pos;
	uint8_t *out = wr_room(w, bound, &pos);
	if (!out)
		return KM_ERR_NOMEM;
	size_t r = LZ4F_compressFrame(out, bound, src, n, &prefs);
	if (LZ4F_isError(r))
		return KM_ERR_ENCODE;
	w->len = pos + r;
	return KM_OK;
}

static km_err zstd_encode(int level, const uint8_t *src, size_t n, km_wr *w)
{
	size_t bound = ZSTD_compressBound(n), pos;
	if (ZSTD_isError(bound))
		return KM_ERR_TOO_LARGE;
	uint8_t *out = wr_room(w, bound, &pos);
	if (!out)
		return KM_ERR_NOMEM;
	size_t r = ZSTD_compress(out, bound, src, n, level ? level : ZSTD_CLEVEL_DEFAULT);
	if (ZSTD_isError(r))
		return KM_ERR_ENCODE;
	w->len = pos + r;
	return KM_OK;
}

km_err km_compress(int codec, int level, const void *src, size_t src_len, km_wr *out)
{
	if (!km_wr_ok(out) || (!src && src_len))
		return KM_ERR_INVAL;
	km_err err;
	switch (codec) {
	case KM_CODEC_NONE:
		km_wr_raw(out, src, src_len);
		err = km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
		break;
	case KM_CODEC_GZIP: err = gzip_encode(level, src, src_len, out); break;
	case KM_CODEC_SNAPPY: err = snappy_encode(src, src_len, out); break;
	case KM_CODEC_LZ4: err = lz4_encode(level, src, src_len, out); break;
	case KM_CODEC_ZSTD: err = zstd_encode(level, src, src_len, out); break;
	default: err = KM_ERR_UNSUPPORTED; break;
	}
	return err;
}
