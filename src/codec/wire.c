/* Kafka wire primitives: bounds-checked reads that borrow from the input, and a growable writer. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/wire.h"

km_str km_str_c(const char *s)
{
	km_str v = {s, s ? (int32_t)strlen(s) : -1};
	return v;
}

bool km_str_eq(km_str a, km_str b)
{
	if (a.len != b.len)
		return false;
	return a.len <= 0 || memcmp(a.p, b.p, (size_t)a.len) == 0;
}

bool km_str_eq_c(km_str a, const char *s)
{
	return km_str_eq(a, km_str_c(s));
}

bool km_uuid_eq(const km_uuid *a, const km_uuid *b)
{
	return memcmp(a->b, b->b, sizeof(a->b)) == 0;
}

bool km_uuid_is_zero(const km_uuid *u)
{
	static const km_uuid zero;
	return km_uuid_eq(u, &zero);
}

void km_uuid_str(const km_uuid *u, char out[23])
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	size_t o = 0;

	for (size_t i = 0; i < 16; i += 3) {
		uint32_t v = (uint32_t)u->b[i] << 16 | (i + 1 < 16 ? (uint32_t)u->b[i + 1] << 8 : 0) |
			     (i + 2 < 16 ? u->b[i + 2] : 0);
		out[o++] = a[v >> 18 & 63];
		out[o++] = a[v >> 12 & 63];
		if (i + 1 < 16)
			out[o++] = a[v >> 6 & 63];
		if (i + 2 < 16)
			out[o++] = a[v & 63];
	}
	out[o] = 0;
}

/* ---- reader ---- */

void km_rd_init(km_rd *r, const void *buf, size_t len)
{
	memset(r, 0, sizeof(*r));
	r->buf = buf;
	r->len = len;
}

bool km_rd_fail(km_rd *r, const char *field, const char *what)
{
	if (r->err == KM_OK) {
		r->err = KM_ERR_DECODE;
		r->err_pos = r->pos;
		r->err_field = field;
		r->err_what = what;
	}
	return false;
}

static inline bool need(km_rd *r, const char *field, size_t n)
{
	if (r->err)
		return false;
	if (r->len - r->pos < n)
		return km_rd_fail(r, field, "truncated");
	return true;
}

bool km_rd_i8(km_rd *r, const char *field, int8_t *v)
{
	if (!need(r, field, 1))
		return (*v = 0), false;
	*v = (int8_t)r->buf[r->pos++];
	return true;
}

bool km_rd_i16(km_rd *r, const char *field, int16_t *v)
{
	uint16_t u;
	bool ok = km_rd_u16(r, field, &u);
	*v = (int16_t)u;
	return ok;
}

bool km_rd_u16(km_rd *r, const char *field, uint16_t *v)
{
	if (!need(r, field, 2))
		return (*v = 0), false;
	*v = km_be16(r->buf + r->pos);
	r->pos += 2;
	return true;
}

bool km_rd_i32(km_rd *r, const char *field, int32_t *v)
{
	uint32_t u;
	bool ok = km_rd_u32(r, field, &u);
	*v = (int32_t)u;
	return ok;
}

bool km_rd_u32(km_rd *r, const char *field, uint32_t *v)
{
	if (!need(r, field, 4))
		return (*v = 0), false;
	*v = km_be32(r->buf + r->pos);
	r->pos += 4;
	return true;
}

bool km_rd_i64(km_rd *r, const char *field, int64_t *v)
{
	if (!need(r, field, 8))
		return (*v = 0), false;
	*v = (int64_t)km_be64(r->buf + r->pos);
	r->pos += 8;
	return true;
}

bool km_rd_f64(km_rd *r, const char *field, double *v)
{
	int64_t bits;
	bool ok = km_rd_i64(r, field, &bits);
	memcpy(v, &bits, sizeof(*v));
	return ok;
}

bool km_rd_bool(km_rd *r, const char *field, bool *v)
{
	int8_t b;
	bool ok = km_rd_i8(r, field, &b);
	*v = b != 0;
	return ok;
}

bool km_rd_uuid(km_rd *r, const char *field, km_uuid *v)
{
	if (!need(r, field, 16)) {
		memset(v, 0, sizeof(*v));
		return false;
	}
	memcpy(v->b, r->buf + r->pos, 16);
	r->pos += 16;
	return true;
}

bool km_rd_uvarlong(km_rd *r, const char *field, uint64_t *v)
{
	uint64_t x = 0;
	*v = 0;
	if (r->err)
		return false;
	for (unsigned shift = 0; shift < 70; shift += 7) {
		if (r->pos >= r->len)
			return km_rd_fail(r, field, "truncated varint");
		uint8_t b = r->buf[r->pos++];
		x |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return true;
		}
	}
	return km_rd_fail(r, field, "varint too long");
}

bool km_rd_uvarint(km_rd *r, const char *field, uint32_t *v)
{
	uint64_t x;
	size_t start = r->pos;
	*v = 0;
	if (!km_rd_uvarlong(r, field, &x))
		return false;
	if (x > UINT32_MAX || r->pos - start > 5) {
		r->pos = start;
		return km_rd_fail(r, field, "varint too long");
	}
	*v = (uint32_t)x;
	return true;
}

bool km_rd_varint(km_rd *r, const char *field, int32_t *v)
{
	uint32_t u;
	bool ok = km_rd_uvarint(r, field, &u);
	*v = (int32_t)((u >> 1) ^ (~(u & 1) + 1));
	return ok;
}

bool km_rd_varlong(km_rd *r, const char *field, int64_t *v)
{
	uint64_t u;
	bool ok = km_rd_uvarlong(r, field, &u);
	*v = (int64_t)((u >> 1) ^ (~(u & 1) + 1));
	return ok;
}

/* Reads a length: int16/int32 or compact (uvarint N+1, 0 = null). Returns -1 for null. */
static bool read_len(km_rd *r, const char *field, bool compact, bool wide, int64_t *len)
{
	if (compact) {
		uint32_t u;
		if (!km_rd_uvarint(r, field, &u))
			return false;
		*len = (int64_t)u - 1;
	} else if (wide) {
		int32_t l;
		if (!km_rd_i32(r, field, &l))
			return false;
		*len = l;
	} else {
		int16_t l;
		if (!km_rd_i16(r, field, &l))
			return false;
		*len = l;
	}
	return true;
}

static bool read_blob(km_rd *r, const char *field, bool compact, bool wide, bool nullable, const uint8_t **p,
		      int32_t *outlen)
{
	int64_t len;
	*p = NULL;
	*outlen = -1;
	if (!read_len(r, field, compact, wide, &len))
		return false;
	if (len < 0) {
		if (len != -1 && !compact)
			return km_rd_fail(r, field, "negative length");
		if (!nullable)
			return km_rd_fail(r, field, "null in a non-nullable field");
		return true;
	}
	if (!need(r, field, (size_t)len))
		return false;
	*p = r->buf + r->pos;
	*outlen = (int32_t)len;
	r->pos += (size_t)len;
	return true;
}

bool km_rd_string(km_rd *r, const char *field, bool compact, bool nullable, km_str *v)
{
	const uint8_t *p;
	bool ok = read_blob(r, field, compact, false, nullable, &p, &v->len);
	v->p = (const char *)p;
	return ok;
}

bool km_rd_bytes(km_rd *r, const char *field, bool compact, bool nullable, km_bytes *v)
{
	return read_blob(r, field, compact, true, nullable, &v->p, &v->len);
}

bool km_rd_array_len(km_rd *r, const char *field, bool compact, bool nullable, size_t min_elem_size,
		     int32_t *count)
{
	int64_t len;
	*count = 0;
	if (!read_len(r, field, compact, true, &len))
		return false;
	if (len < 0) {
		if (len != -1)
			return km_rd_fail(r, field, "negative array length");
		if (!nullable)
			return km_rd_fail(r, field, "null in a non-nullable array");
		*count = -1;
		return true;
	}
	if (min_elem_size == 0)
		min_elem_size = 1;
	if ((uint64_t)len > (r->len - r->pos) / min_elem_size)
		return km_rd_fail(r, field, "array length over the bytes left");
	*count = (int32_t)len;
	return true;
}

bool km_rd_raw(km_rd *r, const char *field, size_t n, const uint8_t **p)
{
	*p = NULL;
	if (!need(r, field, n))
		return false;
	*p = r->buf + r->pos;
	r->pos += n;
	return true;
}

bool km_rd_skip(km_rd *r, const char *field, size_t n)
{
	const uint8_t *p;
	return km_rd_raw(r, field, n, &p);
}

bool km_rd_sub(km_rd *r, const char *field, size_t n, km_rd *sub)
{
	const uint8_t *p;
	size_t start = r->pos;
	if (!km_rd_raw(r, field, n, &p)) {
		km_rd_init(sub, NULL, 0);
		sub->err = r->err;
		return false;
	}
	/* The sub-reader sees the whole parent buffer, bounded at the end of the slice, so its
	 * error offsets are offsets in the parent. */
	km_rd_init(sub, r->buf, start + n);
	sub->pos = start;
	return true;
}

/* ---- writer ---- */

void km_wr_init(km_wr *w)
{
	memset(w, 0, sizeof(*w));
}

void km_wr_init_fixed(km_wr *w, void *buf, size_t cap)
{
	memset(w, 0, sizeof(*w));
	w->buf = buf;
	w->cap = cap;
	w->fixed = true;
}

void km_wr_free(km_wr *w)
{
	if (!w->fixed)
		free(w->buf);
	memset(w, 0, sizeof(*w));
}

uint8_t *km_wr_take(km_wr *w, size_t *len)
{
	uint8_t *b = w->buf;
	*len = w->len;
	memset(w, 0, sizeof(*w));
	return b;
}

static bool grow(km_wr *w, size_t n)
{
	if (w->err)
		return false;
	if (w->cap - w->len >= n)
		return true;
	if (w->fixed) {
		w->err = KM_ERR_TOO_LARGE;
		return false;
	}
	size_t cap = w->cap ? w->cap : 256;
	while (cap - w->len < n) {
		if (cap > SIZE_MAX / 2) {
			w->err = KM_ERR_NOMEM;
			return false;
		}
		cap *= 2;
	}
	uint8_t *b = realloc(w->buf, cap);
	if (!b) {
		w->err = KM_ERR_NOMEM;
		return false;
	}
	w->buf = b;
	w->cap = cap;
	return true;
}

size_t km_wr_reserve(km_wr *w, size_t n)
{
	size_t pos = w->len;
	if (grow(w, n)) {
		memset(w->buf + w->len, 0, n);
		w->len += n;
	}
	return pos;
}

void km_wr_patch_i32(km_wr *w, size_t pos, int32_t v)
{
	if (!w->err && pos + 4 <= w->len)
		km_put_be32(w->buf + pos, (uint32_t)v);
}

void km_wr_raw(km_wr *w, const void *p, size_t n)
{
	if (n && grow(w, n)) {
		memcpy(w->buf + w->len, p, n);
		w->len += n;
	}
}

void km_wr_i8(km_wr *w, int8_t v)
{
	if (grow(w, 1))
		w->buf[w->len++] = (uint8_t)v;
}

void km_wr_i16(km_wr *w, int16_t v)
{
	km_wr_u16(w, (uint16_t)v);
}

void km_wr_u16(km_wr *w, uint16_t v)
{
	if (grow(w, 2)) {
		km_put_be16(w->buf + w->len, v);
		w->len += 2;
	}
}

void km_wr_i32(km_wr *w, int32_t v)
{
	km_wr_u32(w, (uint32_t)v);
}

void km_wr_u32(km_wr *w, uint32_t v)
{
	if (grow(w, 4)) {
		km_put_be32(w->buf + w->len, v);
		w->len += 4;
	}
}

void km_wr_i64(km_wr *w, int64_t v)
{
	if (grow(w, 8)) {
		km_put_be64(w->buf + w->len, (uint64_t)v);
		w->len += 8;
	}
}

void km_wr_f64(km_wr *w, double v)
{
	int64_t bits;
	memcpy(&bits, &v, sizeof(bits));
	km_wr_i64(w, bits);
}

void km_wr_bool(km_wr *w, bool v)
{
	km_wr_i8(w, v ? 1 : 0);
}

void km_wr_uuid(km_wr *w, const km_uuid *v)
{
	km_wr_raw(w, v->b, 16);
}

void km_wr_uvarlong(km_wr *w, uint64_t v)
{
	uint8_t tmp[10];
	size_t n = 0;
	while (v >= 0x80) {
		tmp[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	tmp[n++] = (uint8_t)v;
	km_wr_raw(w, tmp, n);
}

void km_wr_uvarint(km_wr *w, uint32_t v)
{
	km_wr_uvarlong(w, v);
}

void km_wr_varint(km_wr *w, int32_t v)
{
	km_wr_uvarlong(w, (uint32_t)(((uint32_t)v << 1) ^ (uint32_t)(v >> 31)));
}

void km_wr_varlong(km_wr *w, int64_t v)
{
	km_wr_uvarlong(w, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

static void write_len(km_wr *w, bool compact, bool wide, int32_t len)
{
	if (compact)
		km_wr_uvarint(w, (uint32_t)(len + 1));
	else if (wide)
		km_wr_i32(w, len);
	else
		km_wr_i16(w, (int16_t)len);
}

void km_wr_string(km_wr *w, bool compact, km_str v)
{
	if (v.len < 0) {
		write_len(w, compact, false, -1);
		return;
	}
	if (!compact && v.len > INT16_MAX) {
		if (!w->err)
			w->err = KM_ERR_ENCODE;
		return;
	}
	write_len(w, compact, false, v.len);
	km_wr_raw(w, v.p, (size_t)v.len);
}

void km_wr_bytes(km_wr *w, bool compact, km_bytes v)
{
	write_len(w, compact, true, v.len < 0 ? -1 : v.len);
	if (v.len > 0)
		km_wr_raw(w, v.p, (size_t)v.len);
}

void km_wr_array_len(km_wr *w, bool compact, int32_t count)
{
	write_len(w, compact, true, count < 0 ? -1 : count);
}

size_t km_sz_uvarlong(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

size_t km_sz_uvarint(uint32_t v)
{
	return km_sz_uvarlong(v);
}

size_t km_sz_varint(int32_t v)
{
	return km_sz_uvarlong((uint32_t)(((uint32_t)v << 1) ^ (uint32_t)(v >> 31)));
}

size_t km_sz_varlong(int64_t v)
{
	return km_sz_uvarlong(((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

size_t km_sz_string(bool compact, km_str v)
{
	size_t body = v.len > 0 ? (size_t)v.len : 0;
	if (compact)
		return km_sz_uvarint((uint32_t)(v.len + 1)) + body;
	return 2 + body;
}

size_t km_sz_bytes(bool compact, km_bytes v)
{
	size_t body = v.len > 0 ? (size_t)v.len : 0;
	if (compact)
		return km_sz_uvarint((uint32_t)(v.len + 1)) + body;
	return 4 + body;
}

size_t km_sz_array_len(bool compact, int32_t count)
{
	if (compact)
		return km_sz_uvarint((uint32_t)(count + 1));
	return 4;
}
