/* A growable FIFO ring of fixed-size elements, with typed accessors: the in-flight queues of the client and the proxy. */
#ifndef KMIRROR_RING_H
#define KMIRROR_RING_H

#include <stdbool.h>
#include <stddef.h>

typedef struct km_ring {
	unsigned char *items;
	size_t elem;        /* element size */
	size_t head, count, cap;
} km_ring;

void km_ring_init(km_ring *r, size_t elem);
/* Append a copy of *e; grows by doubling (first capacity: 8). False when out of memory. */
bool km_ring_push(km_ring *r, const void *e) __attribute__((warn_unused_result));
/* The i-th element from the oldest (i < count). */
static inline void *km_ring_at(const km_ring *r, size_t i)
{
	return r->items + ((r->head + i) % r->cap) * r->elem;
}
/* Drop the oldest element (count > 0). */
static inline void km_ring_pop(km_ring *r)
{
	r->head = (r->head + 1) % r->cap;
	r->count--;
}
void km_ring_free(km_ring *r);

/*
 * Typed accessors over a km_ring of T: NAME_init, NAME_push (by pointer), NAME_at, NAME_front (NULL
 * when empty), NAME_pop, NAME_count.
 */
#define KM_RING_TYPED(NAME, T)                                                                            \
	static inline void NAME##_init(km_ring *r) { km_ring_init(r, sizeof(T)); }                        \
	static inline bool NAME##_push(km_ring *r, const T *e) { return km_ring_push(r, e); }             \
	static inline T *NAME##_at(const km_ring *r, size_t i) { return (T *)km_ring_at(r, i); }          \
	static inline T *NAME##_front(const km_ring *r) { return r->count ? (T *)km_ring_at(r, 0) : NULL; } \
	static inline void NAME##_pop(km_ring *r) { km_ring_pop(r); }                                     \
	static inline size_t NAME##_count(const km_ring *r) { return r->count; }

#endif
