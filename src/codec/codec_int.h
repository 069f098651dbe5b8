/* Helpers the generated codecs call; not a public interface. */
#ifndef KMIRROR_CODEC_INT_H
#define KMIRROR_CODEC_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "kmirror/arena.h"
#include "kmirror/codec.h"
#include "kmirror/wire.h"

/* Records the arena's failure (over its cap, or no memory) in r at field. Returns false. */
bool km_codec_arena_fail(km_rd *r, const km_arena *a, const char *field);
/* Records "unsupported version" for message in r. Returns KM_ERR_UNSUPPORTED. */
km_err km_codec_rd_unsupported(km_rd *r, const char *message);
/* A reader over data, a slice of r's buffer, whose error offsets are offsets in r. */
void km_codec_rd_slice(const km_rd *r, km_bytes data, km_rd *sub);
/* Copies sub's failure into r. Returns false. */
bool km_codec_rd_join(km_rd *r, const km_rd *sub);
/* Reads a tagged-field section into l (all entries, raw); the caller decodes the known ones. */
bool km_codec_rd_tags(km_rd *r, const char *field, km_tagged_list *l, km_arena *a);

static inline void km_codec_wr_fail(km_wr *w, km_err err)
{
	if (w->err == KM_OK)
		w->err = err;
}
/* with_count: writes the count and every entry. Otherwise the entries with lo <= tag < hi. */
void km_codec_wr_tags(km_wr *w, const km_tagged_list *l, uint64_t lo, uint64_t hi, bool with_count);
/* Encoded size of the entries (not the count). */
size_t km_codec_sz_tags(const km_tagged_list *l);

static inline bool km_codec_uuid_is_zero(const km_uuid *u)
{
	for (int i = 0; i < 16; i++)
		if (u->b[i])
			return false;
	return true;
}

#endif
