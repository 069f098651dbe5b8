/* Chunked bump allocator with a cap on its total size, for arrays of decoded messages. */
#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/arena.h"

#define ALIGN ((size_t)alignof(max_align_t))

struct km_arena_chunk {
	km_arena_chunk *next;
	size_t size; /* usable bytes in data */
	size_t used;
	alignas(max_align_t) unsigned char data[];
};

void km_arena_init(km_arena *a, size_t cap)
{
	memset(a, 0, sizeof(*a));
	a->cap = cap ? cap : KM_ARENA_DEFAULT_CAP;
	a->next_chunk = KM_ARENA_FIRST_CHUNK;
}

static void *fail(km_arena *a, km_err err)
{
	if (a->err == KM_OK)
		a->err = err;
	return NULL;
}

void *km_arena_alloc(km_arena *a, size_t n)
{
	km_arena_chunk *c = a->head;

	if (n == 0)
		n = 1;
	if (n > SIZE_MAX - ALIGN)
		return fail(a, KM_ERR_TOO_LARGE);
	n = (n + ALIGN - 1) & ~(ALIGN - 1);
	if (c && c->size - c->used >= n) {
		void *p = c->data + c->used;
		c->used += n;
		return p;
	}
	/* A new chunk: at least n, usually the next size up, never past the cap. */
	size_t left = a->cap > a->total ? a->cap - a->total : 0;
	size_t overhead = sizeof(km_arena_chunk);
	if (left < overhead || n > left - overhead)
		return fail(a, KM_ERR_TOO_LARGE);
	size_t size = a->next_chunk > n ? a->next_chunk : n;
	if (size > left - overhead)
		size = left - overhead;
	c = malloc(overhead + size);
	if (!c)
		return fail(a, KM_ERR_NOMEM);
	c->size = size;
	c->used = n;
	c->next = a->head;
	a->head = c;
	a->total += overhead + size;
	if (a->next_chunk < KM_ARENA_MAX_CHUNK)
		a->next_chunk *= 2;
	return c->data;
}

void *km_arena_calloc(km_arena *a, size_t n)
{
	void *p = km_arena_alloc(a, n);
	if (p)
		memset(p, 0, n);
	return p;
}

void km_arena_reset(km_arena *a)
{
	km_arena_chunk *keep = a->head;
	if (!keep) {
		a->err = KM_OK;
		return;
	}
	km_arena_chunk *c = keep->next;
	while (c) {
		km_arena_chunk *next = c->next;
		free(c);
		c = next;
	}
	keep->next = NULL;
	keep->used = 0;
	a->total = sizeof(km_arena_chunk) + keep->size;
	a->err = KM_OK;
}

void km_arena_free(km_arena *a)
{
	km_arena_chunk *c = a->head;
	while (c) {
		km_arena_chunk *next = c->next;
		free(c);
		c = next;
	}
	a->head = NULL;
	a->total = 0;
	a->next_chunk = KM_ARENA_FIRST_CHUNK;
	a->err = KM_OK;
}

size_t km_arena_size(const km_arena *a)
{
	return a->total;
}
