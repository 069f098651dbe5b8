/* The growable FIFO ring (kmirror/ring.h). */
#include <stdlib.h>
#include <string.h>

#include "kmirror/ring.h"

void km_ring_init(km_ring *r, size_t elem)
{
	memset(r, 0, sizeof(*r));
	r->elem = elem;
}

bool km_ring_push(km_ring *r, const void *e)
{
	if (r->count == r->cap) {
		size_t ncap = r->cap ? r->cap * 2 : 8;
		unsigned char *n = malloc(ncap * r->elem);
		if (!n)
			return false;
		for (size_t i = 0; i < r->count; i++)
			memcpy(n + i * r->elem, km_ring_at(r, i), r->elem);
		free(r->items);
		r->items = n;
		r->cap = ncap;
		r->head = 0;
	}
	memcpy(r->items + ((r->head + r->count) % r->cap) * r->elem, e, r->elem);
	r->count++;
	return true;
}

void km_ring_free(km_ring *r)
{
	free(r->items);
	r->items = NULL;
	r->head = r->count = r->cap = 0;
}
