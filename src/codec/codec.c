/* Support for the generated codecs: tagged-field sections, error plumbing and error text. */
#include <stdio.h>

#include "codec/codec_int.h"
#include "kmirror/api.h"

bool km_codec_arena_fail(km_rd *r, const km_arena *a, const char *field)
{
	if (r->err == KM_OK) {
		r->err = a->err == KM_ERR_NOMEM ? KM_ERR_NOMEM : KM_ERR_TOO_LARGE;
		r->err_pos = r->pos;
		r->err_field = field;
		r->err_what = r->err == KM_ERR_NOMEM ? "out of memory" : "over the decode memory cap";
	}
	return false;
}

km_err km_codec_rd_unsupported(km_rd *r, const char *message)
{
	if (r->err == KM_OK) {
		r->err = KM_ERR_UNSUPPORTED;
		r->err_pos = r->pos;
		r->err_field = message;
		r->err_what = "unsupported version";
	}
	return r->err;
}

void km_codec_rd_slice(const km_rd *r, km_bytes data, km_rd *sub)
{
	size_t start = (size_t)(data.p - r->buf);
	km_rd_init(sub, r->buf, start + (size_t)data.len);
	sub->pos = start;
}

bool km_codec_rd_join(km_rd *r, const km_rd *sub)
{
	if (r->err == KM_OK && sub->err != KM_OK) {
		r->err = sub->err;
		r->err_pos = sub->err_pos;
		r->err_field = sub->err_field;
		r->err_what = sub->err_what;
	}
	return false;
}

bool km_codec_rd_tags(km_rd *r, const char *field, km_tagged_list *l, km_arena *a)
{
	uint32_t count;

	l->count = 0;
	l->items = NULL;
	if (!km_rd_uvarint(r, field, &count))
		return false;
	if (count == 0)
		return true;
	/* Each entry takes at least two bytes (tag and size): cap the count before allocating. */
	if (count > km_rd_left(r) / 2)
		return km_rd_fail(r, field, "tagged field count over the bytes left");
	l->items = km_arena_alloc(a, (size_t)count * sizeof(*l->items));
	if (!l->items)
		return km_codec_arena_fail(r, a, field);
	for (uint32_t i = 0; i < count; i++) {
		km_tagged *t = &l->items[i];
		uint32_t size;
		const uint8_t *p;
		if (!km_rd_uvarint(r, field, &t->tag) || !km_rd_uvarint(r, field, &size))
			return false;
		if (size > INT32_MAX)
			return km_rd_fail(r, field, "tagged field size over the limit");
		if (!km_rd_raw(r, field, size, &p))
			return false;
		t->data.p = p;
		t->data.len = (int32_t)size;
		l->count = (int32_t)i + 1;
	}
	return true;
}

void km_codec_wr_tags(km_wr *w, const km_tagged_list *l, uint64_t lo, uint64_t hi, bool with_count)
{
	int32_t n = l->count > 0 ? l->count : 0;
	if (with_count)
		km_wr_uvarint(w, (uint32_t)n);
	for (int32_t i = 0; i < n; i++) {
		const km_tagged *t = &l->items[i];
		if (!with_count && (t->tag < lo || t->tag >= hi))
			continue;
		km_wr_uvarint(w, t->tag);
		km_wr_uvarint(w, (uint32_t)(t->data.len > 0 ? t->data.len : 0));
		if (t->data.len > 0)
			km_wr_raw(w, t->data.p, (size_t)t->data.len);
	}
}

size_t km_codec_sz_tags(const km_tagged_list *l)
{
	size_t n = 0;
	for (int32_t i = 0; i < l->count; i++) {
		uint32_t len = (uint32_t)(l->items[i].data.len > 0 ? l->items[i].data.len : 0);
		n += km_sz_uvarint(l->items[i].tag) + km_sz_uvarint(len) + len;
	}
	return n;
}

int km_codec_strerror_msg(char *buf, size_t n, const char *message, int16_t version, const km_rd *r)
{
	if (r->err == KM_OK)
		return snprintf(buf, n, "%s v%d: no error", message, version);
	return snprintf(buf, n, "%s v%d: field %s at byte %zu: %s", message, version,
			r->err_field ? r->err_field : "?", r->err_pos,
			r->err_what ? r->err_what : km_err_message(r->err));
}

int km_codec_strerror(char *buf, size_t n, int16_t api_key, int16_t version, const km_rd *r)
{
	const km_api_info *api = km_api_lookup(api_key);
	char what[64];
	snprintf(what, sizeof(what), "ApiKey %d (%s)", api_key, api ? api->name : "unknown");
	return km_codec_strerror_msg(buf, n, what, version, r);
}
