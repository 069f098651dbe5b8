/* The Fetch response walker (kmirror/fetch.h): one place that knows the layout, for the proxy's streaming and the mirror's client. */
#include <string.h>

#include "kmirror/fetch.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/net.h"

enum { FW_HEAD, FW_TOPIC, FW_PART, FW_RECORDS, FW_BATCH, FW_PART_TAGS, FW_TOPIC_TAGS, FW_DONE };

bool km_fetch_walk_supported(int16_t version)
{
	return version >= KM_FETCH_RESPONSE_MIN_VERSION && version <= KM_FETCH_RESPONSE_MAX_VERSION;
}

void km_fetch_walk_init(km_fetch_walk *w, int16_t version, size_t frame_len)
{
	memset(w, 0, sizeof(*w));
	w->version = version;
	w->phase = FW_HEAD;
	w->end = frame_len;
}

static bool flex(const km_fetch_walk *w)
{
	return w->version >= 12;
}

/*
 * A compact length or count: uvarint N+1, null (0) returned as -1. N beyond int32 (the uvarint
 * reaches 2^32 - 1) is corrupt: nothing on the wire is that long.
 */
static bool compact_len(km_evrd *r, int32_t *n)
{
	uint32_t v;
	if (!km_evrd_uvarint(r, &v))
		return false;
	if (v > (uint32_t)INT32_MAX + 1) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	*n = v == 0 ? -1 : (int32_t)(v - 1);
	return true;
}

/* An array count: uvarint N+1 (flexible) or int32 (classic); null (-1) is returned as -1. */
static bool count(km_evrd *r, bool compact, int32_t *n)
{
	if (!(compact ? compact_len(r, n) : km_evrd_i32(r, n)))
		return false;
	/* Each element takes at least one byte: a count beyond the bytes left is corrupt. */
	if (*n < -1 || (*n > 0 && (size_t)*n > r->end - r->pos)) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	return true;
}

/* A length prefix: uvarint N+1 (flexible), else int16 (strings) or int32 (bytes); null is -1, below is corrupt. */
static bool length(km_evrd *r, bool compact, bool wide, int32_t *n)
{
	if (compact) {
		if (!compact_len(r, n))
			return false;
	} else if (wide) {
		if (!km_evrd_i32(r, n))
			return false;
	} else {
		int16_t v;
		if (!km_evrd_i16(r, &v))
			return false;
		*n = v;
	}
	if (*n < -1) {
		r->err = KM_ERR_DECODE;
		return false;
	}
	return true;
}

static bool i64(km_evrd *r, int64_t *v)
{
	uint8_t b[8];
	if (!km_evrd_raw(r, b, 8))
		return false;
	*v = (int64_t)km_be64(b);
	return true;
}

static bool topic(km_evrd *r, km_fetch_walk *w)
{
	km_fetch_part *p = &w->part;
	memset(p->topic, 0, sizeof(p->topic));
	memset(&p->topic_id, 0, sizeof(p->topic_id));
	if (w->version >= 13)
		return km_evrd_raw(r, &p->topic_id, 16);
	{
		int32_t len;
		if (!length(r, flex(w), false, &len))
			return false;
		if (len < 0)
			return true; /* null name: kept empty */
		if ((size_t)len >= sizeof(p->topic)) {
			r->err = KM_ERR_DECODE;
			return false;
		}
		if (!km_evrd_raw(r, p->topic, (size_t)len))
			return false;
		/* A NUL byte (never in a Kafka name) would make the name read as another, shorter one. */
		if (memchr(p->topic, 0, (size_t)len)) {
			r->err = KM_ERR_DECODE;
			return false;
		}
		return true;
	}
}

/* A partition's fields up to (and including) the records length. */
static bool partition(km_evrd *r, km_fetch_walk *w)
{
	km_fetch_part *p = &w->part;
	int32_t rec = 0;

	p->last_stable_offset = -1;
	p->log_start_offset = -1;
	if (!km_evrd_i32(r, &p->partition) || !km_evrd_i16(r, &p->error_code))
		return false;
	p->high_watermark_off = r->pos;
	if (!i64(r, &p->high_watermark) || !i64(r, &p->last_stable_offset))
		return false;
	if (w->version >= 5 && !i64(r, &p->log_start_offset))
		return false;
	if (!count(r, flex(w), &p->aborted_count))
		return false;
	p->aborted_off = r->pos;
	for (int32_t a = 0; a < p->aborted_count; a++) /* producer id, first offset (, tags) */
		if (!km_evrd_skip(r, 16) || (flex(w) && !km_evrd_skip_tags(r)))
			return false;
	if (w->version >= 11 && !km_evrd_skip(r, 4)) /* preferred read replica */
		return false;
	if (!length(r, flex(w), true, &rec))
		return false;
	p->records_len = rec > 0 ? (size_t)rec : 0;
	return true;
}

/* Steps that read nothing (records skipped by length, partitions and topics ending before v12); true: one taken. */
static bool step_without_bytes(km_fetch_walk *w)
{
	if (w->phase == FW_RECORDS) {
		w->phase = w->descend ? FW_BATCH : FW_PART_TAGS;
		if (!w->descend)
			w->pos = w->records_end;
		return true;
	}
	if (w->phase == FW_BATCH && w->pos >= w->records_end) {
		w->pos = w->records_end;
		w->phase = FW_PART_TAGS;
		return true;
	}
	if (w->phase == FW_PART_TAGS && !flex(w)) {
		w->phase = ++w->pi < w->parts ? FW_PART : FW_TOPIC_TAGS;
		return true;
	}
	if (w->phase == FW_TOPIC_TAGS && !flex(w)) {
		w->phase = ++w->ti < w->topics ? FW_TOPIC : FW_DONE;
		return true;
	}
	return false;
}

/* A reader at the walk's position over what has arrived (from where the last step started: same buffer). */
static void reader_at(km_fetch_walk *w, struct evbuffer *buf, size_t first, size_t have_end, km_evrd *r)
{
	if (w->cache.buf == buf && w->cache.first == first && w->cache.len == evbuffer_get_length(buf) &&
	    w->pos >= w->cache.pos && w->pos - first < w->cache.len)
		km_evrd_init_at(r, buf, &w->cache.ptr, w->cache.pos - first, w->pos - first, have_end - first);
	else
		km_evrd_init(r, buf, w->pos - first, have_end - first);
	if (!r->err && w->pos - first < evbuffer_get_length(buf)) {
		w->cache.buf = buf;
		w->cache.first = first;
		w->cache.len = evbuffer_get_length(buf);
		w->cache.pos = w->pos;
		w->cache.ptr = r->ptr;
	} else {
		w->cache.buf = NULL;
	}
}

/* A batch's 12-byte prefix (base offset, length): the event, or false when its bytes have not arrived. */
static bool batch_prefix(km_fetch_walk *w, km_evrd *r)
{
	uint8_t pre[12];
	size_t left = w->records_end - w->pos;
	if (left < sizeof(pre)) {
		/* A truncated batch too short for its prefix: reported, then skipped. */
		w->batch = (km_fetch_batch){.off = w->pos, .base_offset = -1, .length = -1, .partial = true};
		w->pos = w->records_end;
		return true;
	}
	if (!km_evrd_raw(r, pre, sizeof(pre)))
		return false;
	w->batch.off = w->pos;
	w->batch.base_offset = (int64_t)km_be64(pre);
	w->batch.length = (int32_t)km_be32(pre + 8);
	w->batch.partial = w->batch.length < 0 || (size_t)w->batch.length > left - sizeof(pre);
	w->pos = w->batch.partial ? w->records_end : w->pos + sizeof(pre) + (size_t)w->batch.length;
	return true;
}

/*
 * The walk is past the last topic: v12+, the tagged fields take at least their count byte; before,
 * the frame ends here (whichever way the walk got here: a last partition skipped by length too).
 */
static km_fw_event end_event(const km_fetch_walk *w)
{
	if (flex(w) ? w->pos >= w->end : w->pos != w->end)
		return KM_FW_ERROR;
	return KM_FW_END;
}

km_fw_event km_fetch_walk_next(km_fetch_walk *w, struct evbuffer *buf, size_t first)
{
	size_t have_end = first + evbuffer_get_length(buf);

	if (have_end > w->end)
		have_end = w->end;
	for (;;) {
		km_evrd r;
		bool ok = true;
		int32_t n;

		if (w->phase == FW_DONE)
			return end_event(w);
		if (w->pos < first)
			return KM_FW_ERROR; /* bytes the walk still needs were already sent on: never guess */
		if (step_without_bytes(w))
			continue;
		if (w->pos >= have_end)
			return w->pos >= w->end ? KM_FW_ERROR : KM_FW_NEED_MORE;
		reader_at(w, buf, first, have_end, &r);
		switch (w->phase) {
		case FW_HEAD:
			/* size, correlation id, header tags (v12+), throttle, error and session id (v7+), topic count */
			ok = km_evrd_skip(&r, 8) && (!flex(w) || km_evrd_skip_tags(&r)) &&
			     km_evrd_skip(&r, w->version >= 7 ? 10 : 4) && count(&r, flex(w), &n);
			if (ok) {
				w->topics = n > 0 ? (uint32_t)n : 0;
				w->ti = 0;
				w->phase = w->topics ? FW_TOPIC : FW_DONE;
			}
			break;
		case FW_TOPIC:
			ok = topic(&r, w) && count(&r, flex(w), &n);
			if (ok) {
				w->part.topic_index = w->ti;
				w->parts = n > 0 ? (uint32_t)n : 0;
				w->pi = 0;
				w->phase = w->parts ? FW_PART : FW_TOPIC_TAGS;
			}
			break;
		case FW_PART:
			ok = partition(&r, w);
			if (ok) {
				size_t rec_off = first + r.pos;
				w->part.high_watermark_off += first;
				w->part.aborted_off += first;
				w->part.records_off = rec_off;
				if (rec_off + w->part.records_len > w->end)
					return KM_FW_ERROR;
				w->records_end = rec_off + w->part.records_len;
				w->pos = rec_off;
				w->descend = false;
				w->phase = FW_RECORDS;
				return KM_FW_PARTITION;
			}
			break;
		case FW_BATCH:
			if (batch_prefix(w, &r))
				return KM_FW_BATCH;
			ok = false;
			break;
		case FW_PART_TAGS:
			ok = km_evrd_skip_tags(&r);
			if (ok)
				w->phase = ++w->pi < w->parts ? FW_PART : FW_TOPIC_TAGS;
			break;
		case FW_TOPIC_TAGS:
			ok = km_evrd_skip_tags(&r);
			if (ok)
				w->phase = ++w->ti < w->topics ? FW_TOPIC : FW_DONE;
			break;
		}
		if (!ok)
			/* Out of bytes in this window: wait for more, unless the frame is complete. */
			return have_end >= w->end ? KM_FW_ERROR : KM_FW_NEED_MORE;
		w->pos = first + r.pos;
	}
}

bool km_evbuf_patch(struct evbuffer *b, size_t off, const void *data, size_t n)
{
	struct evbuffer_ptr p;
	struct evbuffer_iovec iov[8];
	const uint8_t *src = data;
	int k;

	if (off + n > evbuffer_get_length(b) || evbuffer_ptr_set(b, &p, off, EVBUFFER_PTR_SET) != 0)
		return false;
	while (n) {
		k = evbuffer_peek(b, (ev_ssize_t)n, &p, iov, 8);
		if (k <= 0)
			return false;
		for (int i = 0; i < k && i < 8 && n; i++) {
			size_t m = iov[i].iov_len < n ? iov[i].iov_len : n;
			memcpy(iov[i].iov_base, src, m);
			src += m;
			n -= m;
			if (evbuffer_ptr_set(b, &p, m, EVBUFFER_PTR_ADD) != 0 && n)
				return false;
		}
	}
	return true;
}
