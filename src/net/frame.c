/* Kafka framing: frame size checks (with TLS/HTTP sniffing), request headers, an evbuffer cursor. */
#include <string.h>

#include "kmirror/net.h"

const char *km_frame_status_name(km_frame_status st)
{
	switch (st) {
	case KM_FRAME_NEED_MORE: return "need-more";
	case KM_FRAME_READY: return "ready";
	case KM_FRAME_TOO_LARGE: return "too-large";
	case KM_FRAME_BAD_SIZE: return "bad-size";
	case KM_FRAME_TLS_HELLO: return "tls-client-hello";
	case KM_FRAME_HTTP: return "http-request";
	}
	return "?";
}

km_frame_status km_net_frame_check(const uint8_t *p, size_t avail, int64_t max_frame, size_t min_frame,
				   bool first, int32_t *size)
{
	int32_t n;

	if (avail < 4)
		return KM_FRAME_NEED_MORE;
	/* A TLS record starts 0x16 (handshake) 0x03 0x0v: as a size that is ~369 MB, so without this
	 * check a TLS client would only ever see "frame too large". */
	if (first && p[0] == 0x16 && p[1] == 0x03 && p[2] <= 0x04)
		return KM_FRAME_TLS_HELLO;
	if (first && (!memcmp(p, "GET ", 4) || !memcmp(p, "POST", 4) || !memcmp(p, "HEAD", 4) ||
		      !memcmp(p, "PUT ", 4)))
		return KM_FRAME_HTTP;
	n = (int32_t)km_be32(p);
	*size = n;
	if (n < 0 || (size_t)n < min_frame)
		return KM_FRAME_BAD_SIZE;
	if ((int64_t)n > max_frame)
		return KM_FRAME_TOO_LARGE;
	if (avail - 4 < (size_t)n)
		return KM_FRAME_NEED_MORE;
	return KM_FRAME_READY;
}

km_frame_status km_net_frame_peek(struct evbuffer *in, int64_t max_frame, size_t min_frame, bool first,
				  int32_t *size)
{
	uint8_t hdr[4];
	size_t avail = evbuffer_get_length(in);
	km_frame_status st;

	if (avail < 4)
		return KM_FRAME_NEED_MORE;
	if (evbuffer_copyout(in, hdr, 4) != 4)
		return KM_FRAME_NEED_MORE;
	/* Check with only the prefix, then decide completeness against the whole buffer. */
	st = km_net_frame_check(hdr, 4, max_frame, min_frame, first, size);
	if (st == KM_FRAME_NEED_MORE && avail - 4 >= (size_t)*size)
		return KM_FRAME_READY;
	return st;
}

km_err km_net_parse_request_header(const uint8_t *p, size_t len, int header_version, km_req_header *h)
{
	km_rd r;

	memset(h, 0, sizeof(*h));
	h->client_id = KM_STR_NULL;
	km_rd_init(&r, p, len);
	km_rd_i16(&r, "api_key", &h->api_key);
	km_rd_i16(&r, "api_version", &h->api_version);
	km_rd_i32(&r, "correlation_id", &h->correlation_id);
	if (header_version >= 1)
		km_rd_string(&r, "client_id", false, true, &h->client_id);
	if (header_version >= 2) {
		/* Tagged fields: none are defined for the request header; skip them all. */
		uint32_t n, tag, sz;
		if (km_rd_uvarint(&r, "header_tags", &n)) {
			for (uint32_t i = 0; i < n && km_rd_ok(&r); i++) {
				km_rd_uvarint(&r, "tag", &tag);
				km_rd_uvarint(&r, "tag_size", &sz);
				km_rd_skip(&r, "tag_data", sz);
			}
		}
	}
	if (!km_rd_ok(&r))
		return r.err;
	h->body_offset = r.pos;
	return KM_OK;
}

int km_net_response_header(struct evbuffer *in, int32_t size, int hdr_version, int32_t *corr, size_t *hlen)
{
	size_t avail = evbuffer_get_length(in), end = 4 + (size_t)size;
	km_evrd r;
	bool ok;

	km_evrd_init(&r, in, 4, avail < end ? avail : end);
	ok = km_evrd_i32(&r, corr) && (hdr_version < 1 || km_evrd_skip_tags(&r));
	if (!ok)
		return avail < end ? 0 : -1;
	*hlen = r.pos - 4;
	return 1;
}

/* ---- evbuffer cursor ---- */

/*
 * Fields inside the chain the cursor is in are read from it in place; libevent's pointer moves
 * (and copyout gathers) only when a read or skip leaves that chain. Each evbuffer_copyout_from
 * and evbuffer_ptr_set costs about a hundred instructions: per field, that was most of a Produce
 * answer's walk.
 */
static void evrd_load(km_evrd *r)
{
	struct evbuffer_iovec v;

	r->seg = NULL;
	r->seg_pos = r->seg_end = r->pos;
	if (r->err || r->pos >= r->end || evbuffer_peek(r->buf, 1, &r->ptr, &v, 1) < 1)
		return;
	r->seg = v.iov_base;
	r->seg_end = r->pos + (v.iov_len < r->end - r->pos ? v.iov_len : r->end - r->pos);
}

void km_evrd_init(km_evrd *r, struct evbuffer *buf, size_t start, size_t end)
{
	memset(r, 0, sizeof(*r));
	r->buf = buf;
	r->pos = start;
	r->end = end;
	if (end > evbuffer_get_length(buf) || start > end ||
	    evbuffer_ptr_set(buf, &r->ptr, start, EVBUFFER_PTR_SET) != 0)
		r->err = KM_ERR_DECODE;
	evrd_load(r);
}

void km_evrd_init_at(km_evrd *r, struct evbuffer *buf, const struct evbuffer_ptr *ptr, size_t at, size_t start,
		     size_t end)
{
	memset(r, 0, sizeof(*r));
	r->buf = buf;
	r->pos = start;
	r->end = end;
	r->ptr = *ptr;
	if (end > evbuffer_get_length(buf) || start > end || start < at ||
	    (start > at && evbuffer_ptr_set(buf, &r->ptr, start - at, EVBUFFER_PTR_ADD) != 0))
		r->err = KM_ERR_DECODE;
	evrd_load(r);
}

bool km_evrd_skip(km_evrd *r, size_t n)
{
	size_t to;

	if (r->err)
		return false;
	if (r->end - r->pos < n) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	to = r->pos + n;
	if (to < r->seg_end) {
		r->pos = to;
		return true;
	}
	/* Out of the chain: the pointer catches up. It may not point past the end; at the very end, leave it unused. */
	if (to > r->seg_pos && to < evbuffer_get_length(r->buf) &&
	    evbuffer_ptr_set(r->buf, &r->ptr, to - r->seg_pos, EVBUFFER_PTR_ADD) != 0) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	r->pos = to;
	evrd_load(r);
	return true;
}

bool km_evrd_raw(km_evrd *r, void *out, size_t n)
{
	if (r->err)
		return false;
	if (r->end - r->pos < n) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	if (r->pos + n <= r->seg_end) {
		if (n)
			memcpy(out, r->seg + (r->pos - r->seg_pos), n);
		return km_evrd_skip(r, n);
	}
	/* Across chains: the pointer to pos first, then libevent gathers the bytes. */
	if (r->pos > r->seg_pos && evbuffer_ptr_set(r->buf, &r->ptr, r->pos - r->seg_pos, EVBUFFER_PTR_ADD) != 0) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	r->seg = NULL;
	r->seg_pos = r->seg_end = r->pos;
	if (evbuffer_copyout_from(r->buf, &r->ptr, out, n) != (ev_ssize_t)n) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	return km_evrd_skip(r, n);
}

bool km_evrd_i8(km_evrd *r, int8_t *v)
{
	uint8_t b = 0;
	bool ok = km_evrd_raw(r, &b, 1);
	*v = (int8_t)b;
	return ok;
}

bool km_evrd_i16(km_evrd *r, int16_t *v)
{
	uint8_t b[2] = {0, 0};
	bool ok = km_evrd_raw(r, b, 2);
	*v = (int16_t)km_be16(b);
	return ok;
}

bool km_evrd_i32(km_evrd *r, int32_t *v)
{
	uint8_t b[4] = {0, 0, 0, 0};
	bool ok = km_evrd_raw(r, b, 4);
	*v = (int32_t)km_be32(b);
	return ok;
}

bool km_evrd_uvarint(km_evrd *r, uint32_t *v)
{
	uint32_t x = 0;
	*v = 0;
	for (int shift = 0; shift < 35; shift += 7) {
		uint8_t b;
		if (!km_evrd_raw(r, &b, 1))
			return false;
		if (shift == 28 && (b & 0xf0)) {
			r->err = KM_ERR_DECODE;
			return false;
		}
		x |= (uint32_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return true;
		}
	}
	r->err = KM_ERR_DECODE;
	return false;
}

bool km_evrd_skip_compact(km_evrd *r)
{
	uint32_t n;
	if (!km_evrd_uvarint(r, &n))
		return false;
	return n == 0 || km_evrd_skip(r, n - 1);
}

bool km_evrd_skip_tags(km_evrd *r)
{
	uint32_t n, tag, sz;
	if (!km_evrd_uvarint(r, &n))
		return false;
	for (uint32_t i = 0; i < n; i++) {
		if (!km_evrd_uvarint(r, &tag) || !km_evrd_uvarint(r, &sz) || !km_evrd_skip(r, sz))
			return false;
	}
	return true;
}
