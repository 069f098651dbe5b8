/* Test support for the generated round-trip data: the per-message table and value makers. */
#ifndef KMIRROR_TEST_MSG_ROUNDTRIP_H
#define KMIRROR_TEST_MSG_ROUNDTRIP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kmirror/arena.h"
#include "kmirror/codec.h"
#include "kmirror/wire.h"

typedef struct km_test_msg {
	const char *name;
	int api_key; /* -1 for headers and data types */
	int16_t min_version;
	int16_t max_version;
	int16_t first_flexible;
	size_t struct_size;
	void (*init)(void *m);
	km_err (*decode)(km_rd *r, int16_t v, void *m, km_arena *a);
	void (*encode)(km_wr *w, int16_t v, const void *m);
	size_t (*size)(int16_t v, const void *m);
	/* mode 0: every field of version v set to a non-default value, unknown tags added;
	 * mode 1: the same, but every field that is nullable in v set to null. */
	void (*fill)(void *m, int16_t v, int mode, km_arena *a, uint32_t *seq);
	bool (*eq)(const void *x, const void *y);
} km_test_msg;

extern const km_test_msg km_test_msgs[];
extern const size_t km_test_msgs_count;

/* A number in 1..span, never def. */
static inline int64_t t_int(uint32_t *seq, int64_t span, int64_t def)
{
	int64_t x = (int64_t)((*seq)++ % (uint32_t)span) + 1;
	if (x == def)
		x++;
	return x;
}

static inline km_str t_str(km_arena *a, uint32_t *seq)
{
	char *p = km_arena_alloc(a, 16);
	int n = snprintf(p, 16, "s%u", (*seq)++);
	return (km_str){p, n};
}

static inline km_bytes t_bytes(km_arena *a, uint32_t *seq)
{
	uint8_t *p = km_arena_alloc(a, 4);
	uint32_t s = (*seq)++;
	int32_t n = 1 + (int32_t)(s % 4);
	for (int32_t i = 0; i < n; i++)
		p[i] = (uint8_t)(s + (uint32_t)i * 7);
	return (km_bytes){p, n};
}

static inline void t_uuid(km_uuid *u, uint32_t *seq)
{
	uint32_t s = (*seq)++;
	for (int i = 0; i < 16; i++)
		u->b[i] = (uint8_t)(s * 31 + (uint32_t)i + 1);
}

static inline void t_unknown_tags(km_tagged_list *l, km_arena *a, uint32_t low, uint32_t high, uint32_t *seq)
{
	l->count = 2;
	l->items = km_arena_alloc(a, 2 * sizeof(*l->items));
	l->items[0].tag = low;
	l->items[0].data = t_bytes(a, seq);
	l->items[1].tag = high;
	l->items[1].data = (km_bytes){(const uint8_t *)"", 0};
}

static inline bool t_diff(const char *field)
{
	fprintf(stderr, "round trip: field %s differs\n", field);
	return false;
}

static inline bool t_bytes_eq(km_bytes x, km_bytes y)
{
	if (x.len != y.len)
		return false;
	return x.len <= 0 || memcmp(x.p, y.p, (size_t)x.len) == 0;
}

static inline bool t_tags_eq(const km_tagged_list *x, const km_tagged_list *y)
{
	int32_t nx = x->count > 0 ? x->count : 0, ny = y->count > 0 ? y->count : 0;
	if (nx != ny)
		return false;
	for (int32_t i = 0; i < nx; i++)
		if (x->items[i].tag != y->items[i].tag || !t_bytes_eq(x->items[i].data, y->items[i].data))
			return false;
	return true;
}

#endif
