/* Offset translation of share groups on mirror topics: acknowledgements logical -> physical, ShareFetch records and acquired ranges physical -> logical. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/batch.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/share_acknowledge_request.h"
#include "kmirror/msg/share_fetch_request.h"
#include "kmirror/msg/share_fetch_response.h"
#include "kmirror/net.h"
#include "proxy/rewrite.h"
#include "proxy/features.h"
#include "proxy/session.h"
#include "proxy/share_offsets.h"

/* A decoded request or response is bounded like any decode (as in offsets.c). */
#define KM_SHARE_ARENA_CAP ((size_t)32 << 20)

/* ---- runs and pieces ---- */

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

static int64_t max64(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/*
 * How many offsets run i covers: a closed run as the map says (km_offmap_run_length); the open
 * run up to the tail while a pipeline runs the partition (records past it are not acknowledged
 * yet, so not shown), else without end.
 */
static int64_t run_cover(const km_offmap *m, size_t i)
{
	const km_offrun *r = &m->runs[i];
	int64_t len;

	if (i + 1 < m->n)
		return km_offmap_run_length(m, i);
	if (m->tail_physical < 0 || m->tail_logical < 0)
		return INT64_MAX;
	len = min64(m->tail_physical - r->physical, m->tail_logical - r->logical);
	return len > 0 ? len : 0;
}

/* The last run whose start (logical or physical) is <= v, or 0 when none is. */
static size_t run_at(const km_offmap *m, int64_t v, bool physical)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if ((physical ? m->runs[mid].physical : m->runs[mid].logical) <= v)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? lo - 1 : 0;
}

static size_t pieces(const km_offmap *m, int64_t first, int64_t last, bool physical, km_share_piece *out, size_t cap)
{
	size_t n = 0;

	if (first < 0 || last < first)
		return 0;
	if (m->n == 0) {
		/* Nothing mirrored: the destination's own offsets with no pipeline, else nothing is there yet. */
		if (m->tail_physical >= 0 && m->tail_logical >= 0)
			return 0;
		if (cap)
			out[0] = (km_share_piece){first, first, last - first};
		return 1;
	}
	for (size_t i = run_at(m, first, physical); i < m->n; i++) {
		const km_offrun *r = &m->runs[i];
		int64_t start = physical ? r->physical : r->logical, cov = run_cover(m, i), lo, hi;
		if (start > last)
			break;
		lo = max64(first, start);
		/* The run's last offset, saturating for the open run without end. */
		hi = cov > INT64_MAX - start ? INT64_MAX : start + cov - 1;
		hi = min64(hi, last);
		/* Neither counterpart may pass INT64_MAX: the piece ends where the larger side would. */
		if (start >= 0 && max64(r->logical, r->physical) >= 0 &&
		    hi - start > INT64_MAX - max64(r->logical, r->physical))
			hi = start + (INT64_MAX - max64(r->logical, r->physical));
		if (cov <= 0 || lo > hi)
			continue;
		if (n < cap)
			out[n] = (km_share_piece){.logical = r->logical + (lo - start),
						  .physical = r->physical + (lo - start), .last_delta = hi - lo};
		n++;
	}
	return n;
}

size_t km_share_logical_pieces(const km_offmap *m, int64_t first, int64_t last, km_share_piece *out, size_t cap)
{
	return pieces(m, first, last, false, out, cap);
}

size_t km_share_physical_pieces(const km_offmap *m, int64_t first, int64_t last, km_share_piece *out, size_t cap)
{
	return pieces(m, first, last, true, out, cap);
}

/* The pieces of a range into the arena; *n 0 (and NULL) when it has none. */
static km_share_piece *pieces_in(const km_offmap *m, int64_t first, int64_t last, bool physical, km_arena *a,
				 size_t *n)
{
	km_share_piece *p;
	size_t k = pieces(m, first, last, physical, NULL, 0);

	*n = 0;
	if (k == 0 || k > SIZE_MAX / sizeof(*p) || !(p = km_arena_alloc(a, k * sizeof(*p))))
		return NULL;
	*n = pieces(m, first, last, physical, p, k);
	return p;
}

/* ---- acknowledgements: logical -> physical ---- */

/* One acknowledgement batch, whichever request it came in (both have the same fields). */
typedef struct ack {
	int64_t first, last;
	int32_t ntypes;
	int8_t *types;
	int32_t src; /* the batch it came from (its unknown tags go with every piece) */
} ack;

/*
 * A partition's acknowledgement batches, logical -> physical: one batch per run piece, holes
 * dropped. AcknowledgeTypes: a single type applies to each piece; one type per offset is split
 * with the offsets. Anything else (a malformed batch, which the broker refuses) keeps its types for
 * each piece. A range that is not a range (first < 0, last < first) goes as it came, for the broker
 * to answer. *changed is set when the result differs from the input.
 */
static km_err map_acks(const km_offmap *m, const ack *in, int32_t nin, ack **out, int32_t *nout, km_arena *a,
		       bool *changed)
{
	size_t total = 0, k = 0;
	ack *o;

	for (int32_t i = 0; i < nin; i++) {
		size_t n = in[i].first < 0 || in[i].last < in[i].first ? 1 : pieces(m, in[i].first, in[i].last, false, NULL, 0);
		total += n;
	}
	if (total > INT32_MAX)
		return KM_ERR_TOO_LARGE;
	*out = NULL;
	*nout = 0;
	if (total == 0) {
		*changed = *changed || nin > 0;
		return KM_OK;
	}
	if (!(o = km_arena_alloc(a, total * sizeof(*o))))
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < nin; i++) {
		const ack *b = &in[i];
		km_share_piece *p;
		size_t n;
		bool per_offset;

		if (b->first < 0 || b->last < b->first) {
			o[k++] = *b;
			continue;
		}
		p = pieces_in(m, b->first, b->last, false, a, &n);
		if (km_arena_err(a) != KM_OK)
			return km_arena_err(a);
		per_offset = b->ntypes > 1 && (int64_t)b->ntypes - 1 == b->last - b->first;
		if (n != 1 || p[0].physical != b->first || p[0].last_delta != b->last - b->first)
			*changed = true;
		for (size_t j = 0; j < n; j++) {
			ack *x = &o[k++];
			x->first = p[j].physical;
			x->last = p[j].physical + p[j].last_delta;
			x->src = b->src;
			if (per_offset) {
				x->types = b->types + (p[j].logical - b->first);
				x->ntypes = (int32_t)(p[j].last_delta + 1);
			} else {
				x->types = b->types;
				x->ntypes = b->ntypes;
			}
		}
	}
	*out = o;
	*nout = (int32_t)k;
	return KM_OK;
}

/*
 * The request types' acknowledgement batch arrays through map_acks: the macro only moves the
 * fields between the codec's type T and ack (the two requests' batch types differ in name only).
 */
#define KM_SHARE_MAP_ACKS(T, arr, m, a, changed, rc)                                                        \
	do {                                                                                                \
		ack *in_ = NULL, *out_ = NULL;                                                              \
		int32_t nin_ = (arr).count > 0 ? (arr).count : 0, nout_ = 0;                                 \
		if (nin_ == 0)                                                                              \
			break;                                                                              \
		if (!(in_ = km_arena_alloc((a), (size_t)nin_ * sizeof(*in_)))) {                            \
			(rc) = KM_ERR_NOMEM;                                                                \
			break;                                                                              \
		}                                                                                           \
		for (int32_t i_ = 0; i_ < nin_; i_++)                                                       \
			in_[i_] = (ack){(arr).items[i_].first_offset, (arr).items[i_].last_offset,           \
					(arr).items[i_].acknowledge_types.count,                             \
					(arr).items[i_].acknowledge_types.items, i_};                        \
		if (((rc) = map_acks((m), in_, nin_, &out_, &nout_, (a), (changed))) != KM_OK)              \
			break;                                                                              \
		T *items_ = nout_ ? km_arena_alloc((a), (size_t)nout_ * sizeof(T)) : NULL;                  \
		if (nout_ && !items_) {                                                                     \
			(rc) = KM_ERR_NOMEM;                                                                \
			break;                                                                              \
		}                                                                                           \
		for (int32_t i_ = 0; i_ < nout_; i_++) {                                                    \
			items_[i_] = (arr).items[out_[i_].src];                                             \
			items_[i_].first_offset = out_[i_].first;                                           \
			items_[i_].last_offset = out_[i_].last;                                             \
			items_[i_].acknowledge_types.count = out_[i_].ntypes;                               \
			items_[i_].acknowledge_types.items = out_[i_].types;                                \
		}                                                                                           \
		(arr).items = items_;                                                                       \
		(arr).count = nout_;                                                                        \
	} while (0)

static km_err share_fetch_request(int16_t v, const uint8_t *body, size_t len, const km_off_lookup *lk,
				  km_arena *a, bool *changed, km_wr *out)
{
	km_share_fetch_request rq;
	km_rd r;
	km_err rc;

	km_share_fetch_request_init(&rq);
	km_rd_init(&r, body, len);
	if ((rc = km_share_fetch_request_decode(&r, v, &rq, a)) != KM_OK)
		return rc;
	for (int32_t i = 0; i < rq.topics.count; i++) {
		km_share_fetch_request_fetch_topic *t = &rq.topics.items[i];
		const void *topic = lk->topic(lk->arg, KM_STR_NULL, &t->topic_id);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_share_fetch_request_fetch_partition *p = &t->partitions.items[j];
			const km_offmap *m = lk->map(lk->arg, topic, p->partition_index);
			if (m)
				KM_SHARE_MAP_ACKS(km_share_fetch_request_acknowledgement_batch, p->acknowledgement_batches, m,
						  a, changed, rc);
			if (rc != KM_OK)
				return rc;
		}
	}
	if (*changed)
		km_share_fetch_request_encode(out, v, &rq);
	return KM_OK;
}

static km_err share_ack_request(int16_t v, const uint8_t *body, size_t len, const km_off_lookup *lk, km_arena *a,
				bool *changed, km_wr *out)
{
	km_share_acknowledge_request rq;
	km_rd r;
	km_err rc;

	km_share_acknowledge_request_init(&rq);
	km_rd_init(&r, body, len);
	if ((rc = km_share_acknowledge_request_decode(&r, v, &rq, a)) != KM_OK)
		return rc;
	for (int32_t i = 0; i < rq.topics.count; i++) {
		km_share_acknowledge_request_acknowledge_topic *t = &rq.topics.items[i];
		const void *topic = lk->topic(lk->arg, KM_STR_NULL, &t->topic_id);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_share_acknowledge_request_acknowledge_partition *p = &t->partitions.items[j];
			const km_offmap *m = lk->map(lk->arg, topic, p->partition_index);
			if (m)
				KM_SHARE_MAP_ACKS(km_share_acknowledge_request_acknowledgement_batch,
						  p->acknowledgement_batches, m, a, changed, rc);
			if (rc != KM_OK)
				return rc;
		}
	}
	if (*changed)
		km_share_acknowledge_request_encode(out, v, &rq);
	return KM_OK;
}

km_err km_share_request_translate(int16_t key, int16_t version, const uint8_t *body, size_t len,
				  const km_off_lookup *lk, bool *changed, km_wr *out)
{
	km_arena a;
	km_err rc;

	*changed = false;
	if (!km_off_active(lk))
		return KM_OK;
	km_arena_init(&a, KM_SHARE_ARENA_CAP);
	if (key == KM_API_SHARE_FETCH)
		rc = share_fetch_request(version, body, len, lk, &a, changed, out);
	else if (key == KM_API_SHARE_ACKNOWLEDGE)
		rc = share_ack_request(version, body, len, lk, &a, changed, out);
	else
		rc = KM_ERR_UNSUPPORTED;
	if (rc == KM_OK && km_arena_err(&a) != KM_OK)
		rc = km_arena_err(&a);
	if (rc == KM_OK && *changed && !km_wr_ok(out))
		rc = KM_ERR_NOMEM;
	km_arena_free(&a);
	if (rc != KM_OK)
		*changed = false;
	return rc;
}

/* ---- ShareFetch responses: physical -> logical ---- */

/* v2 record batch: baseOffset int64, batchLength int32 (what follows), ..., lastOffsetDelta int32 at 23. */
#define KM_SHARE_BATCH_HEAD 12
#define KM_SHARE_LAST_DELTA_AT KM_BATCH_OFF_LAST_OFFSET_DELTA

/*
 * One record batch of a mirror partition's ShareFetch records (avail bytes of it here: a batch the
 * response's size cut is partial), patched in place. A visible batch gets its logical base
 * offset. A hidden one (in no run) must not be seen: it is put wholly below ref, the lowest
 * logical offset the client is given for the partition (its acquired records never reach below
 * it, and a share consumer delivers only acquired records), using lastOffsetDelta for how far its
 * records reach, the widest bound when that is cut off. Every per-batch change on this path goes
 * here.
 */
static void share_patch_batch(const km_offmap *m, uint8_t *batch, size_t avail, int64_t ref)
{
	int64_t base = (int64_t)km_be64(batch), logical, delta = INT32_MAX;
	ssize_t run = km_off_batch_run(m, base, &logical);

	if (run >= 0) {
		/* A LogAppendTime run: the attribute back, as in Fetch (a header cut off: clients drop a partial batch). */
		if ((m->runs[run].flags & KM_OFFRUN_LOG_APPEND_TIME) && avail >= KM_BATCH_OFF_LAST_OFFSET_DELTA)
			(void)km_off_set_append_time(batch);
		km_put_be64(batch, (uint64_t)logical);
		return;
	}
	if (avail >= KM_SHARE_LAST_DELTA_AT + 4) {
		delta = (int32_t)km_be32(batch + KM_SHARE_LAST_DELTA_AT);
		if (delta < 0)
			delta = INT32_MAX;
	}
	km_put_be64(batch, (uint64_t)(ref - 1 - delta));
}

/* The logical base of the first visible batch of records, or -1 (none: every batch hidden). */
static int64_t first_visible(const km_offmap *m, const uint8_t *rec, size_t len)
{
	size_t at = 0;
	while (len - at >= KM_SHARE_BATCH_HEAD) {
		int64_t logical;
		int32_t blen = (int32_t)km_be32(rec + at + 8);
		if (km_off_batch_logical(m, (int64_t)km_be64(rec + at), &logical))
			return logical;
		if (blen < 0 || (size_t)blen > len - at - KM_SHARE_BATCH_HEAD)
			break;
		at += KM_SHARE_BATCH_HEAD + (size_t)blen;
	}
	return -1;
}

/* Each batch of records through share_patch_batch (a trailing prefix too short for a header is left as it came). */
static void patch_records(const km_offmap *m, uint8_t *rec, size_t len, int64_t ref)
{
	size_t at = 0;
	while (len - at >= KM_SHARE_BATCH_HEAD) {
		int32_t blen = (int32_t)km_be32(rec + at + 8);
		size_t avail = len - at;
		if (blen >= 0 && (size_t)blen <= avail - KM_SHARE_BATCH_HEAD)
			avail = KM_SHARE_BATCH_HEAD + (size_t)blen;
		share_patch_batch(m, rec + at, avail, ref);
		if (blen < 0)
			break;
		at += avail;
	}
}

/* One mapped partition: acquired ranges physical -> logical (split at run boundaries, hidden parts dropped), then its batches. */
static km_err share_fetch_partition(const km_offmap *m, km_share_fetch_response_partition_data *p, uint8_t *body,
				    const uint8_t *cbody, km_arena *a)
{
	km_share_fetch_response_acquired_records *o = NULL;
	size_t total = 0, k = 0;
	int64_t ref = -1;

	for (int32_t i = 0; i < p->acquired_records.count; i++)
		total += pieces(m, p->acquired_records.items[i].first_offset, p->acquired_records.items[i].last_offset,
				true, NULL, 0);
	if (total > INT32_MAX)
		return KM_ERR_TOO_LARGE;
	if (total && !(o = km_arena_alloc(a, total * sizeof(*o))))
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < p->acquired_records.count; i++) {
		const km_share_fetch_response_acquired_records *r = &p->acquired_records.items[i];
		size_t n;
		km_share_piece *pc = pieces_in(m, r->first_offset, r->last_offset, true, a, &n);
		if (km_arena_err(a) != KM_OK)
			return km_arena_err(a);
		for (size_t j = 0; j < n; j++) {
			o[k] = *r;
			o[k].first_offset = pc[j].logical;
			o[k].last_offset = pc[j].logical + pc[j].last_delta;
			if (ref < 0 || o[k].first_offset < ref)
				ref = o[k].first_offset;
			k++;
		}
	}
	if (p->acquired_records.count > 0) {
		p->acquired_records.items = o;
		p->acquired_records.count = (int32_t)k;
	}
	if (p->records.p && p->records.len > 0) {
		/* The decoder borrows the body: the same bytes, reached through the writable pointer. */
		uint8_t *rec = body + (p->records.p - cbody);
		int64_t fv = first_visible(m, rec, (size_t)p->records.len);
		if (fv >= 0 && (ref < 0 || fv < ref))
			ref = fv;
		patch_records(m, rec, (size_t)p->records.len, ref >= 0 ? ref : 0);
	}
	return KM_OK;
}

km_err km_share_fetch_response_translate(int16_t version, uint8_t *body, size_t len, const km_off_lookup *lk,
					 bool *changed, km_wr *out)
{
	km_share_fetch_response m;
	const uint8_t *cbody = body;
	km_arena a;
	km_rd r;
	km_err rc;

	*changed = false;
	if (!km_off_active(lk))
		return KM_OK;
	km_arena_init(&a, KM_SHARE_ARENA_CAP);
	km_share_fetch_response_init(&m);
	km_rd_init(&r, cbody, len);
	rc = km_share_fetch_response_decode(&r, version, &m, &a);
	for (int32_t i = 0; rc == KM_OK && i < m.responses.count; i++) {
		km_share_fetch_response_share_fetchable_topic_response *t = &m.responses.items[i];
		const void *topic = lk->topic(lk->arg, KM_STR_NULL, &t->topic_id);
		for (int32_t j = 0; topic && rc == KM_OK && j < t->partitions.count; j++) {
			km_share_fetch_response_partition_data *p = &t->partitions.items[j];
			const km_offmap *pm = lk->map(lk->arg, topic, p->partition_index);
			if (!pm)
				continue;
			rc = share_fetch_partition(pm, p, body, cbody, &a);
			*changed = true;
		}
	}
	if (rc == KM_OK && *changed) {
		km_share_fetch_response_encode(out, version, &m);
		if (!km_wr_ok(out))
			rc = KM_ERR_NOMEM;
	}
	if (rc == KM_OK && km_arena_err(&a) != KM_OK)
		rc = km_arena_err(&a);
	km_arena_free(&a);
	if (rc != KM_OK)
		*changed = false;
	return rc;
}

/* ---- the rows ---- */

/*
 * The ShareFetch response: offsets first (the records patched in the frame where they are), then
 * the row's NodeEndpoints rewriter over the result, so that the endpoints are done in one place.
 */
static km_err share_fetch_response_hook(km_resp *rs)
{
	const km_off_req *c = rs->ctx;
	size_t flen = rs->frame_len + 4;
	uint8_t *p, pre[4];
	bool changed = false;
	km_wr tr, w;
	km_err rc;

	if (flen < rs->body_off || !(p = evbuffer_pullup(rs->in, (ev_ssize_t)flen)))
		return KM_ERR_DECODE;
	km_wr_init(&tr);
	km_wr_init(&w);
	rc = km_share_fetch_response_translate(rs->version, p + rs->body_off, flen - rs->body_off, c->lk, &changed, &tr);
	km_wr_raw(&w, p + 4, rs->body_off - 4); /* correlation id and header tags, unchanged */
	if (rc == KM_OK)
		rc = changed ? km_rewrite_share_fetch(tr.buf, tr.len, rs->version, rs->rw, &w)
			     : km_rewrite_share_fetch(p + rs->body_off, flen - rs->body_off, rs->version, rs->rw, &w);
	if (rc == KM_OK && (!km_wr_ok(&w) || w.len > INT32_MAX))
		rc = KM_ERR_NOMEM;
	if (rc == KM_OK) {
		km_put_be32(pre, (uint32_t)w.len);
		if (evbuffer_add(rs->out, pre, 4) != 0 || evbuffer_add(rs->out, w.buf, w.len) != 0)
			rc = KM_ERR_NOMEM;
		else
			evbuffer_drain(rs->in, flen);
	}
	km_wr_free(&tr);
	km_wr_free(&w);
	return rc;
}

static km_err share_request_hook(km_req *rq)
{
	const km_off_lookup *lk = km_off_lookup_of(rq);
	bool changed = false;
	size_t off;
	km_wr w;
	km_err rc;

	if (!km_off_active(lk))
		return KM_OK;
	if ((rc = km_off_body_of(rq, &off)) != KM_OK)
		return rc;
	km_wr_init(&w);
	rc = km_share_request_translate(rq->h->api_key, rq->h->api_version, rq->body + off, rq->frame_len - off, lk,
					&changed, &w);
	if (rc != KM_OK)
		rq->close_reason = "malformed share group request";
	if (rc == KM_OK && changed) {
		if (rq->rewritten)
			evbuffer_free(rq->rewritten);
		if (!(rq->rewritten = evbuffer_new()) || evbuffer_add(rq->rewritten, rq->body, off) != 0 ||
		    evbuffer_add(rq->rewritten, w.buf, w.len) != 0)
			rc = KM_ERR_NOMEM;
	}
	km_wr_free(&w);
	if (rc != KM_OK || rq->h->api_key != KM_API_SHARE_FETCH)
		return rc;
	/*
	 * The answer may hold partitions this request does not name (those of the share session), so
	 * every ShareFetch response is looked at while a map may exist.
	 */
	if (rq->ctx && rq->ctx_free)
		rq->ctx_free(rq->ctx);
	if (!(rq->ctx = km_off_req_new(KM_API_SHARE_FETCH, rq->h->api_version, lk))) {
		rq->ctx_free = NULL;
		return KM_ERR_NOMEM;
	}
	rq->ctx_free = km_off_req_free;
	rq->on_response = share_fetch_response_hook;
	rq->resp = KM_RESP_WHOLE;
	return KM_OK;
}

static const km_proxy_stage stages[] = {
	{.key = KM_API_SHARE_FETCH, .classify = km_off_hold_classify, .on_request = share_request_hook,
	 .note = "mirror topics: AcknowledgementBatches logical -> physical (one per run), Records batch base offsets "
		 "and AcquiredRecords physical -> logical (split at runs, hidden dropped)"},
	{.key = KM_API_SHARE_ACKNOWLEDGE, .classify = km_off_hold_classify, .on_request = share_request_hook,
	 .note = "mirror topics: AcknowledgementBatches logical -> physical (one per run, holes dropped)"},
};

const km_proxy_feature km_share_off_feature = {"share-offsets", stages, sizeof(stages) / sizeof(stages[0]), .needs_state = true};
