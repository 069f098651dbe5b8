/* Shared by the libevent-linked harnesses: a byte source for choices, and bytes fed in chains of random sizes. */
#ifndef KMIRROR_FUZZ_SPLIT_H
#define KMIRROR_FUZZ_SPLIT_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <event2/buffer.h>

/*
 * The choices a harness makes (versions, chunk sizes, which partitions to descend into) come from
 * the first bytes of the input, so a crash input replays the same way: a small generator seeded
 * from them.
 */
typedef struct km_fuzz_rng {
	uint32_t s;
	size_t max_chunk; /* the largest piece fed at once (at least 1) */
} km_fuzz_rng;

static inline uint32_t km_fuzz_next(km_fuzz_rng *g)
{
	g->s = g->s * 1103515245u + 12345u;
	return g->s >> 8;
}

/* Seed from 3 bytes: the first picks the largest piece (1 to 128 bytes, or 4 KiB, or everything at once). */
static inline void km_fuzz_rng_init(km_fuzz_rng *g, const uint8_t b[3])
{
	g->s = (uint32_t)b[1] << 8 | b[2];
	if (b[0] == 0xff)
		g->max_chunk = SIZE_MAX;
	else if (b[0] >= 0xf0)
		g->max_chunk = 4096;
	else
		g->max_chunk = 1 + (size_t)(b[0] & 0x7f);
}

/* The size of the next piece, at most left. */
static inline size_t km_fuzz_chunk(km_fuzz_rng *g, size_t left)
{
	size_t n = g->max_chunk == SIZE_MAX ? left : 1 + km_fuzz_next(g) % g->max_chunk;
	return n < left ? n : left;
}

/* n bytes appended to b as a chain of their own (as a read from a socket makes it). */
static inline void km_fuzz_add_chain(struct evbuffer *b, const void *p, size_t n)
{
	struct evbuffer *one = evbuffer_new();
	if (!one || evbuffer_add(one, p, n) != 0 || evbuffer_add_buffer(b, one) != 0)
		abort();
	evbuffer_free(one);
}

/* The whole of p (n bytes) into b in pieces of the generator's sizes. */
static inline void km_fuzz_add_split(struct evbuffer *b, km_fuzz_rng *g, const uint8_t *p, size_t n)
{
	size_t at = 0;
	while (at < n) {
		size_t k = km_fuzz_chunk(g, n - at);
		km_fuzz_add_chain(b, p + at, k);
		at += k;
	}
}

#endif
