/* Fuzz target: every codec's decoder on arbitrary bytes with capped output, and encode/decode round trips. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/compress.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CAP (1 << 20)
static uint8_t out[CAP];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	/* First byte: codec (low 3 bits, 5-7 exercise the unknown-codec path) and the cap for the
	 * allocating variant (high bits), so that small caps are hit often. */
	int codec = data[0] & 7;
	size_t small_cap = (size_t)(data[0] >> 3) * 97;
	const uint8_t *src = data + 1;
	size_t n = size - 1;

	size_t got = 0, got2 = 0;
	km_err e1 = km_decompress(codec, src, n, out, CAP, &got);
	uint8_t *heap = NULL;
	km_err e2 = km_decompress_alloc(codec, src, n, CAP, &heap, &got2);
	/*
	 * Both variants agree, except that zstd decodes a frame in one pass without a window when the
	 * room left holds its declared size: a later frame's oversized window may then pass in the fixed
	 * buffer and be refused (TOO_LARGE) by the growing one.
	 */
	bool zstd_window = codec == KM_CODEC_ZSTD && e1 == KM_OK && e2 == KM_ERR_TOO_LARGE;
	if ((e1 != e2 && !zstd_window) || (e1 == KM_OK && e2 == KM_OK && (got != got2 || memcmp(out, heap, got) != 0)))
		abort();
	free(heap);
	heap = NULL;
	km_err e3 = km_decompress_alloc(codec, src, n, small_cap, &heap, &got2);
	if (e1 == KM_OK && got <= small_cap && (e3 != KM_OK || got2 != got) && !(codec == KM_CODEC_ZSTD && e3 == KM_ERR_TOO_LARGE))
		abort();
	if (e1 == KM_OK && got > small_cap && e3 != KM_ERR_TOO_LARGE)
		abort();
	free(heap);

	/* The input as plain data: compress and decompress must give it back. */
	if (codec <= KM_CODEC_MAX && n <= 65536) {
		km_wr w;
		km_wr_init(&w);
		if (km_compress(codec, 0, src, n, &w) != KM_OK)
			abort();
		if (km_decompress(codec, w.buf, w.len, out, CAP, &got) != KM_OK || got != n ||
		    (n && memcmp(out, src, n) != 0))
			abort();
		km_wr_free(&w);
	}
	return 0;
}
