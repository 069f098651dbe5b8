/* A chunked bump allocator for decoded messages: many small allocations, one reset or free. */
#ifndef KMIRROR_ARENA_H
#define KMIRROR_ARENA_H

#include <stddef.h>

#include "kmirror/error.h"

/* The cap used when km_arena_init is given 0. */
#define KM_ARENA_DEFAULT_CAP ((size_t)64 << 20)
/* Size of the first chunk; later chunks double up to KM_ARENA_MAX_CHUNK (or hold one big request). */
#define KM_ARENA_FIRST_CHUNK ((size_t)4096)
#define KM_ARENA_MAX_CHUNK ((size_t)1 << 20)

typedef struct km_arena_chunk km_arena_chunk;

/*
 * Callers embed a km_arena by value; its fields are private. The cap bounds the bytes of all chunks
 * together, so a peer-chosen array count cannot make the arena grow without limit: an allocation over
 * the cap fails with KM_ERR_TOO_LARGE, a failed malloc with KM_ERR_NOMEM (both left in err).
 */
typedef struct km_arena {
	km_arena_chunk *head; /* current chunk; older ones follow ->next */
	size_t total;         /* bytes of all chunks */
	size_t cap;
	size_t next_chunk;
	km_err err;           /* first failure, KM_OK if none */
} km_arena;

void km_arena_init(km_arena *a, size_t cap);
/* n bytes aligned for any type, uninitialised; NULL on failure (see a->err). n 0 counts as 1. */
void *km_arena_alloc(km_arena *a, size_t n);
/* Like km_arena_alloc, zero-filled. */
void *km_arena_calloc(km_arena *a, size_t n);
/* Forgets every allocation and clears the error; keeps the newest chunk for reuse. */
void km_arena_reset(km_arena *a);
/* Frees everything; the arena may be initialised again. */
void km_arena_free(km_arena *a);
/* Bytes held in chunks (what counts against the cap). */
size_t km_arena_size(const km_arena *a);
static inline km_err km_arena_err(const km_arena *a) { return a->err; }

#endif
