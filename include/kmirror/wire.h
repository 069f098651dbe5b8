/* Kafka wire primitives: a bounds-checked borrowing reader and a growable writer. */
#ifndef KMIRROR_WIRE_H
#define KMIRROR_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/error.h"

/* A borrowed string: p points into the input buffer and is not NUL-terminated. len -1 = null. */
typedef struct km_str {
	const char *p;
	int32_t len;
} km_str;

/* Borrowed bytes (also record sets). len -1 = null. */
typedef struct km_bytes {
	const uint8_t *p;
	int32_t len;
} km_bytes;

typedef struct km_uuid {
	uint8_t b[16];
} km_uuid;

#define KM_STR_NULL ((km_str){NULL, -1})
#define KM_BYTES_NULL ((km_bytes){NULL, -1})
/* A km_str from a C string literal or NUL-terminated string (NULL gives a null string). */
km_str km_str_c(const char *s);
bool km_str_eq(km_str a, km_str b);
bool km_str_eq_c(km_str a, const char *s);
bool km_uuid_eq(const km_uuid *a, const km_uuid *b);
/* The all-zero id Kafka uses for "no topic id". */
bool km_uuid_is_zero(const km_uuid *u);
/* An id as Kafka's tools print it: URL-safe base64 of its 16 bytes, no padding (22 characters). */
void km_uuid_str(const km_uuid *u, char out[23]);

/*
 * Reader. Every read checks bounds; the first failure is sticky: it records the field name and the
 * byte offset, later reads fail at once and yield zero values. Decoders check km_rd_ok() at the end
 * or test the return value of each read.
 */
typedef struct km_rd {
	const uint8_t *buf;
	size_t len;
	size_t pos;
	km_err err;
	size_t err_pos;
	const char *err_field;
	const char *err_what; /* "truncated", "negative length", "over limit", ... */
} km_rd;

void km_rd_init(km_rd *r, const void *buf, size_t len);
static inline bool km_rd_ok(const km_rd *r) { return r->err == KM_OK; }
static inline size_t km_rd_left(const km_rd *r) { return r->err ? 0 : r->len - r->pos; }
/* Record a failure (first one wins). Always returns false. */
bool km_rd_fail(km_rd *r, const char *field, const char *what);

bool km_rd_i8(km_rd *r, const char *field, int8_t *v);
bool km_rd_i16(km_rd *r, const char *field, int16_t *v);
bool km_rd_u16(km_rd *r, const char *field, uint16_t *v);
bool km_rd_i32(km_rd *r, const char *field, int32_t *v);
bool km_rd_u32(km_rd *r, const char *field, uint32_t *v);
bool km_rd_i64(km_rd *r, const char *field, int64_t *v);
bool km_rd_f64(km_rd *r, const char *field, double *v);
bool km_rd_bool(km_rd *r, const char *field, bool *v);
bool km_rd_uuid(km_rd *r, const char *field, km_uuid *v);
bool km_rd_uvarint(km_rd *r, const char *field, uint32_t *v);
bool km_rd_uvarlong(km_rd *r, const char *field, uint64_t *v);
bool km_rd_varint(km_rd *r, const char *field, int32_t *v);   /* zigzag */
bool km_rd_varlong(km_rd *r, const char *field, int64_t *v);  /* zigzag */

/* STRING/NULLABLE_STRING (int16 length) or COMPACT_ (uvarint length+1). A null is an error unless nullable. */
bool km_rd_string(km_rd *r, const char *field, bool compact, bool nullable, km_str *v);
/* BYTES (int32 length) or COMPACT_BYTES; also RECORDS. */
bool km_rd_bytes(km_rd *r, const char *field, bool compact, bool nullable, km_bytes *v);
/*
 * Array length (int32 or compact uvarint length+1). -1 = null (an error unless nullable). The count is
 * checked against the bytes left, at min_elem_size bytes per element, before the caller allocates.
 */
bool km_rd_array_len(km_rd *r, const char *field, bool compact, bool nullable, size_t min_elem_size,
		     int32_t *count);
/* Take n bytes as a borrowed slice / skip n bytes. */
bool km_rd_raw(km_rd *r, const char *field, size_t n, const uint8_t **p);
bool km_rd_skip(km_rd *r, const char *field, size_t n);
/* A sub-reader over the next n bytes; the parent moves past them. Errors carry parent offsets. */
bool km_rd_sub(km_rd *r, const char *field, size_t n, km_rd *sub);

/*
 * Writer: a growable buffer, or a fixed one (km_wr_init_fixed) that fails instead of growing. The first
 * failure (no memory, fixed buffer full) is sticky; check km_wr_ok() once at the end.
 */
typedef struct km_wr {
	uint8_t *buf;
	size_t len;
	size_t cap;
	bool fixed;
	km_err err;
} km_wr;

void km_wr_init(km_wr *w);
void km_wr_init_fixed(km_wr *w, void *buf, size_t cap);
void km_wr_free(km_wr *w);
static inline bool km_wr_ok(const km_wr *w) { return w->err == KM_OK; }
/* Hand the buffer to the caller (who frees it); the writer is reset. */
uint8_t *km_wr_take(km_wr *w, size_t *len);
/* Reserve n bytes, returning their position, to patch later with km_wr_patch_*. */
size_t km_wr_reserve(km_wr *w, size_t n);
void km_wr_patch_i32(km_wr *w, size_t pos, int32_t v);

void km_wr_raw(km_wr *w, const void *p, size_t n);
void km_wr_i8(km_wr *w, int8_t v);
void km_wr_i16(km_wr *w, int16_t v);
void km_wr_u16(km_wr *w, uint16_t v);
void km_wr_i32(km_wr *w, int32_t v);
void km_wr_u32(km_wr *w, uint32_t v);
void km_wr_i64(km_wr *w, int64_t v);
void km_wr_f64(km_wr *w, double v);
void km_wr_bool(km_wr *w, bool v);
void km_wr_uuid(km_wr *w, const km_uuid *v);
void km_wr_uvarint(km_wr *w, uint32_t v);
void km_wr_uvarlong(km_wr *w, uint64_t v);
void km_wr_varint(km_wr *w, int32_t v);
void km_wr_varlong(km_wr *w, int64_t v);
void km_wr_string(km_wr *w, bool compact, km_str v);
void km_wr_bytes(km_wr *w, bool compact, km_bytes v);
void km_wr_array_len(km_wr *w, bool compact, int32_t count); /* -1 = null */

/* Encoded sizes. */
size_t km_sz_uvarint(uint32_t v);
size_t km_sz_uvarlong(uint64_t v);
size_t km_sz_varint(int32_t v);
size_t km_sz_varlong(int64_t v);
size_t km_sz_string(bool compact, km_str v);
size_t km_sz_bytes(bool compact, km_bytes v);
size_t km_sz_array_len(bool compact, int32_t count);

/* Big-endian loads and stores on raw memory (for in-place patching). */
static inline uint16_t km_be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t km_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t km_be64(const uint8_t *p) { return ((uint64_t)km_be32(p) << 32) | km_be32(p + 4); }
static inline void km_put_be16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void km_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void km_put_be64(uint8_t *p, uint64_t v)
{
	km_put_be32(p, (uint32_t)(v >> 32));
	km_put_be32(p + 4, (uint32_t)v);
}

#endif
