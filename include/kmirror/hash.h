/* FNV-1a, the one hash of the project's own small tables (metrics series, request entries, log slots). */
#ifndef KM_HASH_H
#define KM_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KM_FNV1A_INIT 14695981039346656037ull

/* h extended by the n bytes at p (start with KM_FNV1A_INIT). */
static inline uint64_t km_fnv1a(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

#endif
