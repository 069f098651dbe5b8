/* Offset translation on mirror topics: requests logical -> physical, responses physical -> logical, Fetch responses patched in place as they stream. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/batch.h"
#include "kmirror/crc32c.h"
#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "kmirror/msg/delete_records_request.h"
#include "kmirror/msg/delete_records_response.h"
#include "kmirror/msg/describe_producers_response.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/offset_for_leader_epoch_response.h"
#include "kmirror/msg/produce_response.h"
#include "kmirror/net.h"
#include "proxy/offsets.h"
#include "proxy/features.h"
#include "proxy/session.h"
#include "proxy/share_offsets.h"

/* A decoded request or response is bounded like any decode. */
#define KM_OFF_ARENA_CAP ((size_t)32 << 20)

/* ---- the map ---- */

ssize_t km_off_batch_run(const km_offmap *m, int64_t physical, int64_t *logical)
{
	int64_t l = km_offmap_to_logical(m, physical);
	ssize_t i;

	*logical = l;
	if (l < 0 || (i = km_offmap_find_logical(m, l)) < 0)
		return -1;
	/* Hidden: to_logical gave the next run's start, which that run stores at a higher physical offset. */
	return m->runs[i].physical + (l - m->runs[i].logical) == physical ? i : -1;
}

bool km_off_batch_logical(const km_offmap *m, int64_t physical, int64_t *logical)
{
	return km_off_batch_run(m, physical, logical) >= 0;
}

bool km_off_set_append_time(uint8_t *hdr)
{
	uint8_t *attr = hdr + KM_BATCH_OFF_ATTRIBUTES, now[2];
	int32_t len = (int32_t)km_be32(hdr + KM_BATCH_OFF_LENGTH);
	/* The CRC covers from the attributes to the end: batchLength less epoch, magic and CRC. */
	size_t span = len >= KM_BATCH_HEADER_SIZE - KM_BATCH_LOG_OVERHEAD ? (size_t)len - 9 : 0;

	if (!span || (attr[1] & KM_BATCH_ATTR_LOG_APPEND_TIME))
		return false;
	now[0] = attr[0];
	now[1] = (uint8_t)(attr[1] | KM_BATCH_ATTR_LOG_APPEND_TIME);
	km_put_be32(hdr + KM_BATCH_OFF_CRC, km_crc32c_patch(km_be32(hdr + KM_BATCH_OFF_CRC), span, 0, attr, now, 2));
	memcpy(attr, now, 2);
	return true;
}

/* Translations that leave the protocol's "none" (-1, or any negative) as it is. */
static int64_t to_logical(const km_offmap *m, int64_t p)
{
	return p < 0 ? p : km_offmap_to_logical(m, p);
}

static int64_t next_to_logical(const km_offmap *m, int64_t p)
{
	return p < 0 ? p : km_offmap_next_to_logical(m, p);
}

/* An epoch's end offset, a bound the client checks its position against: never below what it may have read. */
static int64_t end_to_logical(const km_offmap *m, int64_t p)
{
	return p < 0 ? p : km_offmap_end_to_logical(m, p);
}

static int64_t to_physical(const km_offmap *m, int64_t l);

/*
 * Where the mirrored log starts (logical): the first run, or where mirroring began when a hole
 * (compaction at the source) separates it from the run's first record; -1 without runs.
 */
static int64_t mirrored_start(const km_offmap *m)
{
	const km_offrun *r = m->n ? &m->runs[0] : NULL;
	if (!r)
		return -1;
	return r->prev_logical_end >= 0 && r->prev_logical_end < r->logical ? r->prev_logical_end : r->logical;
}

/*
 * A fetch offset below the mirrored log start: the source answers OFFSET_OUT_OF_RANGE there (its
 * log starts at or after it, or the mirror began later, and then those records are not here), so
 * the broker is asked at -1, which it answers OFFSET_OUT_OF_RANGE; mapped to the first run's start
 * it would be served from there when mirroring began at a batch boundary (docs/proxy.md, "Reads
 * below the log start").
 */
static int64_t fetch_to_physical(const km_offmap *m, int64_t l)
{
	int64_t start = mirrored_start(m);
	if (l >= 0 && start >= 0 && l < start)
		return -1;
	return to_physical(m, l);
}

static int64_t to_physical(const km_offmap *m, int64_t l)
{
	int64_t p;
	if (l < 0)
		return l;
	/* An empty map with no tail has nowhere to send the fetch: it goes as asked (the broker answers). */
	p = km_offmap_to_physical(m, l);
	return p < 0 ? l : p;
}

/* ---- the request context ---- */

km_off_req *km_off_req_new(int16_t key, int16_t version, const km_off_lookup *lk)
{
	km_off_req *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->key = key;
	c->version = version;
	c->lk = lk;
	c->ref = c->ref_sent = -1;
	km_arena_init(&c->arena, KM_OFF_ARENA_CAP);
	return c;
}

void km_off_req_free(void *ctx)
{
	km_off_req *c = ctx;
	if (!c)
		return;
	if (c->inner_ctx && c->inner_free)
		c->inner_free(c->inner_ctx);
	km_off_trace_free(c);
	km_arena_free(&c->arena);
	free(c->entries);
	free(c->index);
	free(c);
}

static km_err add_entry(km_off_req *c, km_str name, const km_uuid *id, int32_t partition, int64_t value)
{
	km_off_entry *e;
	if (c->n == c->cap) {
		size_t ncap = c->cap ? c->cap * 2 : 8;
		km_off_entry *n = realloc(c->entries, ncap * sizeof(*n));
		if (!n)
			return KM_ERR_NOMEM;
		c->entries = n;
		c->cap = ncap;
	}
	e = &c->entries[c->n++];
	memset(e, 0, sizeof(*e));
	e->partition = partition;
	e->value = value;
	e->sent = -1;
	if (id)
		e->id = *id;
	e->topic = (km_str){"", 0};
	if (!id && name.len > 0) {
		char *p = km_arena_alloc(&c->arena, (size_t)name.len);
		if (!p)
			return KM_ERR_NOMEM;
		memcpy(p, name.p, (size_t)name.len);
		e->topic = (km_str){p, name.len};
	}
	return KM_OK;
}

static bool entry_is(const km_off_entry *e, km_str name, const km_uuid *id, int32_t partition)
{
	return e->partition == partition && (id ? km_uuid_eq(&e->id, id) : km_str_eq(e->topic, name));
}

/* FNV-1a over the topic (its id, or its name) and the partition. */
static size_t entry_hash(km_str name, const km_uuid *id, int32_t partition)
{
	uint8_t pb[4] = {(uint8_t)partition, (uint8_t)((uint32_t)partition >> 8), (uint8_t)((uint32_t)partition >> 16),
			 (uint8_t)((uint32_t)partition >> 24)};
	uint64_t h = id ? km_fnv1a(KM_FNV1A_INIT, id, sizeof(*id))
			: km_fnv1a(KM_FNV1A_INIT, name.p, name.len > 0 ? (size_t)name.len : 0);
	return (size_t)km_fnv1a(h, pb, sizeof(pb));
}

/* The index over every entry; false when out of memory (the caller scans instead). */
static bool build_index(km_off_req *c)
{
	size_t n = 16;
	while (n < 2 * c->n)
		n *= 2;
	free(c->index);
	c->nindexed = 0;
	if (!(c->index = calloc(n, sizeof(*c->index)))) {
		c->nindex = 0;
		return false;
	}
	c->nindex = n;
	for (size_t i = 0; i < c->n; i++) {
		const km_off_entry *e = &c->entries[i];
		size_t j = entry_hash(e->topic, e->topic.len > 0 ? NULL : &e->id, e->partition) & (n - 1);
		while (c->index[j])
			j = (j + 1) & (n - 1);
		c->index[j] = (uint32_t)i + 1;
	}
	c->nindexed = c->n;
	return true;
}

const km_off_entry *km_off_req_find(km_off_req *c, km_str name, const km_uuid *id, int32_t partition)
{
	if (!c->n)
		return NULL;
	/* Responses come in request order nearly always: the entry after the last one found first. */
	{
		size_t i = c->cursor % c->n;
		if (entry_is(&c->entries[i], name, id, partition)) {
			c->cursor = i + 1;
			return &c->entries[i];
		}
	}
	if (c->n > 8 && c->n < UINT32_MAX && (c->nindexed == c->n || build_index(c))) {
		/*
		 * Hashed as entry_is compares: by id when one is asked, else by name; an entry without a
		 * name (added by id, add_entry) was hashed by its id, all zeros when it has none either.
		 */
		static const km_uuid zero;
		const km_uuid *hid = id ? id : name.len > 0 ? NULL : &zero;
		for (size_t j = entry_hash(name, hid, partition) & (c->nindex - 1);; j = (j + 1) & (c->nindex - 1)) {
			uint32_t k = c->index[j];
			if (!k)
				return NULL;
			if (entry_is(&c->entries[k - 1], name, id, partition)) {
				c->cursor = k;
				return &c->entries[k - 1];
			}
		}
	}
	for (size_t k = 1; k < c->n; k++) {
		size_t i = (c->cursor + k) % c->n;
		if (entry_is(&c->entries[i], name, id, partition)) {
			c->cursor = i + 1;
			return &c->entries[i];
		}
	}
	return NULL;
}

static uint64_t lookup_epoch(const km_off_lookup *lk)
{
	return lk && lk->epoch ? lk->epoch(lk->arg) : 0;
}

static const void *find_topic(const km_off_lookup *lk, km_str name, const km_uuid *id)
{
	return lk->topic(lk->arg, name, id);
}

/* ---- requests ---- */

static km_err fetch_request(km_off_req *c, const uint8_t *body, size_t len, bool *rewrote, km_wr *out)
{
	int16_t v = c->version;
	km_fetch_request rq;
	km_rd r;
	km_err rc;
	bool by_id = v >= 13;

	km_fetch_request_init(&rq);
	km_rd_init(&r, body, len);
	if ((rc = km_fetch_request_decode(&r, v, &rq, &c->arena)) != KM_OK)
		return rc;
	for (int32_t i = 0; i < rq.topics.count; i++) {
		km_fetch_request_fetch_topic *t = &rq.topics.items[i];
		const void *topic = find_topic(c->lk, t->topic, by_id ? &t->topic_id : NULL);
		if (!topic)
			continue;
		for (int32_t j = 0; j < t->partitions.count; j++) {
			km_fetch_request_fetch_partition *p = &t->partitions.items[j];
			const km_offmap *m = c->lk->map(c->lk->arg, topic, p->partition);
			if (!m)
				continue;
			if ((rc = add_entry(c, t->topic, by_id ? &t->topic_id : NULL, p->partition, p->fetch_offset)) != KM_OK)
				return rc;
			if (m->tail_logical < 0 || p->fetch_offset < m->tail_logical)
				c->before_tail = true;
			p->fetch_offset = fetch_to_physical(m, p->fetch_offset);
			c->entries[c->n - 1].sent = p->fetch_offset;
			if (v >= 5)
				p->log_start_offset = to_physical(m, p->log_start_offset);
			*rewrote = true;
		}
	}
	if (*rewrote)
		km_fetch_request_encode(out, v, &rq);
	/*
	 * KIP-227: an incremental request names only what changed, and the broker answers for every
	 * partition of its session with data; those answers need translating too.
	 */
	if (!*rewrote && !(v >= 7 && rq.session_id != 0 && rq.session_epoch > 0))
		return KM_ERR_INVAL; /* nothing for the response: no context */
	return KM_OK;
}

static km_err list_offsets_request(km_off_req *c, const uint8_t *body, size_t len)
{
	km_list_offsets_request rq;
	km_rd r;
	km_err rc;
	bool any = false;

	km_list_offsets_request_init(&rq);
	km_rd_init(&r, body, len);
	if ((rc = km_list_offsets_request_decode(&r, c->version, &rq, &c->arena)) != KM_OK)
		return rc;
	c->committed = rq.isolation_level == 1;
	for (int32_t i = 0; i < rq.topics.count; i++) {
		km_list_offsets_request_list_offsets_topic *t = &rq.topics.items[i];
		const void *topic = find_topic(c->lk, t->name, NULL);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_list_offsets_request_list_offsets_partition *p = &t->partitions.items[j];
			if (!c->lk->map(c->lk->arg, topic, p->partition_index))
				continue;
			if ((rc = add_entry(c, t->name, NULL, p->partition_index, p->timestamp)) != KM_OK)
				return rc;
			any = true;
		}
	}
	return any ? KM_OK : KM_ERR_INVAL;
}

static km_err delete_records_request(km_off_req *c, const uint8_t *body, size_t len, bool *rewrote, km_wr *out)
{
	km_delete_records_request rq;
	km_rd r;
	km_err rc;

	km_delete_records_request_init(&rq);
	km_rd_init(&r, body, len);
	if ((rc = km_delete_records_request_decode(&r, c->version, &rq, &c->arena)) != KM_OK)
		return rc;
	for (int32_t i = 0; i < rq.topics.count; i++) {
		km_delete_records_request_delete_records_topic *t = &rq.topics.items[i];
		const void *topic = find_topic(c->lk, t->name, NULL);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_delete_records_request_delete_records_partition *p = &t->partitions.items[j];
			const km_offmap *m = c->lk->map(c->lk->arg, topic, p->partition_index);
			if (!m)
				continue;
			/* The logical offset before which records go: the physical one of the first record kept. -1 (the high watermark) stays. */
			p->offset = to_physical(m, p->offset);
			*rewrote = true;
		}
	}
	if (!*rewrote)
		return KM_ERR_INVAL;
	km_delete_records_request_encode(out, c->version, &rq);
	return KM_OK;
}

km_err km_off_request(int16_t key, int16_t version, const uint8_t *body, size_t len, const km_off_lookup *lk,
		      km_off_req **ctx, bool *rewrote, km_wr *out)
{
	km_off_req *c;
	km_err rc;

	*ctx = NULL;
	*rewrote = false;
	if (!km_off_active(lk))
		return KM_OK;
	if (!(c = km_off_req_new(key, version, lk)))
		return KM_ERR_NOMEM;
	switch (key) {
	case KM_API_FETCH:
		rc = fetch_request(c, body, len, rewrote, out);
		break;
	case KM_API_LIST_OFFSETS:
		rc = list_offsets_request(c, body, len);
		break;
	case KM_API_DELETE_RECORDS:
		rc = delete_records_request(c, body, len, rewrote, out);
		break;
	default:
		rc = KM_OK; /* the response alone says what to translate */
	}
	if (rc == KM_OK && *rewrote && !km_wr_ok(out))
		rc = KM_ERR_NOMEM;
	if (rc == KM_OK && km_arena_err(&c->arena) != KM_OK)
		rc = km_arena_err(&c->arena);
	if (rc == KM_ERR_INVAL) {
		/* Nothing mapped: no context. */
		km_off_req_free(c);
		return KM_OK;
	}
	if (rc != KM_OK) {
		km_off_req_free(c);
		*rewrote = false;
		return rc;
	}
	*ctx = c;
	return KM_OK;
}

/* ---- whole responses ---- */

static const km_offmap *map_of(km_off_req *c, const void *topic, int32_t partition)
{
	return topic ? c->lk->map(c->lk->arg, topic, partition) : NULL;
}

static void list_offsets_response(km_off_req *c, km_list_offsets_response *rs, bool *changed)
{
	for (int32_t i = 0; i < rs->topics.count; i++) {
		km_list_offsets_response_list_offsets_topic_response *t = &rs->topics.items[i];
		const void *topic = find_topic(c->lk, t->name, NULL);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_list_offsets_response_list_offsets_partition_response *p = &t->partitions.items[j];
			const km_offmap *m = map_of(c, topic, p->partition_index);
			const km_off_entry *e = m ? km_off_req_find(c, t->name, NULL, p->partition_index) : NULL;
			int64_t ts;
			if (!m)
				continue;
			/* The request's timestamp; without it (a map new since the request) the answer's own says which kind. */
			ts = e ? e->value : p->timestamp == -1 ? -1 : 0;
			/* latest -1, earliest -2, earliest local -4 answer "next" offsets; a timestamp, max-timestamp -3 and latest tiered -5 a record's. */
			p->offset = ts == -1 || ts == -2 || ts == -4 ? next_to_logical(m, p->offset) : to_logical(m, p->offset);
			*changed = true;
		}
	}
}

static void leader_epoch_response(km_off_req *c, km_offset_for_leader_epoch_response *rs, bool *changed)
{
	for (int32_t i = 0; i < rs->topics.count; i++) {
		km_offset_for_leader_epoch_response_offset_for_leader_topic_result *t = &rs->topics.items[i];
		const void *topic = find_topic(c->lk, t->topic, NULL);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_offset_for_leader_epoch_response_epoch_end_offset *p = &t->partitions.items[j];
			const km_offmap *m = map_of(c, topic, p->partition);
			if (!m)
				continue;
			p->end_offset = end_to_logical(m, p->end_offset);
			*changed = true;
		}
	}
}

static void delete_records_response(km_off_req *c, km_delete_records_response *rs, bool *changed)
{
	for (int32_t i = 0; i < rs->topics.count; i++) {
		km_delete_records_response_delete_records_topic_result *t = &rs->topics.items[i];
		const void *topic = find_topic(c->lk, t->name, NULL);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_delete_records_response_delete_records_partition_result *p = &t->partitions.items[j];
			const km_offmap *m = map_of(c, topic, p->partition_index);
			if (!m)
				continue;
			p->low_watermark = next_to_logical(m, p->low_watermark);
			*changed = true;
		}
	}
}

static void produce_response(km_off_req *c, km_produce_response *rs, bool *changed)
{
	bool by_id = c->version >= 13;
	for (int32_t i = 0; i < rs->responses.count; i++) {
		km_produce_response_topic_produce_response *t = &rs->responses.items[i];
		const void *topic = find_topic(c->lk, t->name, by_id ? &t->topic_id : NULL);
		for (int32_t j = 0; topic && j < t->partition_responses.count; j++) {
			km_produce_response_partition_produce_response *p = &t->partition_responses.items[j];
			const km_offmap *m = map_of(c, topic, p->index);
			if (!m)
				continue;
			p->base_offset = to_logical(m, p->base_offset);
			if (c->version >= 5)
				p->log_start_offset = next_to_logical(m, p->log_start_offset);
			*changed = true;
		}
	}
}

static void describe_producers_response(km_off_req *c, km_describe_producers_response *rs, bool *changed)
{
	for (int32_t i = 0; i < rs->topics.count; i++) {
		km_describe_producers_response_topic_response *t = &rs->topics.items[i];
		const void *topic = find_topic(c->lk, t->name, NULL);
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_describe_producers_response_partition_response *p = &t->partitions.items[j];
			const km_offmap *m = map_of(c, topic, p->partition_index);
			if (!m)
				continue;
			for (int32_t k = 0; k < p->active_producers.count; k++) {
				km_describe_producers_response_producer_state *ps = &p->active_producers.items[k];
				ps->current_txn_start_offset = to_logical(m, ps->current_txn_start_offset);
			}
			*changed = true;
		}
	}
}

/* Decode, translate, and encode only when something had a map. */
#define TRANSLATE(type, fn)                                                      \
	do {                                                                     \
		type m;                                                          \
		type##_init(&m);                                                 \
		if ((rc = type##_decode(&r, c->version, &m, &a)) != KM_OK)      \
			break;                                                   \
		if (km_rd_ok(&r) && r.pos != r.len) {                            \
			rc = KM_ERR_DECODE;                                      \
			break;                                                   \
		}                                                                \
		fn(c, &m, changed);                                              \
		if (*changed)                                                    \
			type##_encode(out, c->version, &m);                      \
	} while (0)

km_err km_off_response(km_off_req *c, const uint8_t *body, size_t len, bool *changed, km_wr *out)
{
	km_arena a;
	km_rd r;
	km_err rc = KM_OK;

	*changed = false;
	if (!c || !km_off_active(c->lk))
		return KM_OK;
	km_arena_init(&a, KM_OFF_ARENA_CAP);
	km_rd_init(&r, body, len);
	switch (c->key) {
	case KM_API_LIST_OFFSETS:
		TRANSLATE(km_list_offsets_response, list_offsets_response);
		break;
	case KM_API_OFFSET_FOR_LEADER_EPOCH:
		TRANSLATE(km_offset_for_leader_epoch_response, leader_epoch_response);
		break;
	case KM_API_DELETE_RECORDS:
		TRANSLATE(km_delete_records_response, delete_records_response);
		break;
	case KM_API_PRODUCE:
		TRANSLATE(km_produce_response, produce_response);
		break;
	case KM_API_DESCRIBE_PRODUCERS:
		TRANSLATE(km_describe_producers_response, describe_producers_response);
		break;
	default:
		rc = KM_ERR_UNSUPPORTED;
	}
	if (rc == KM_OK && km_arena_err(&a) != KM_OK)
		rc = km_arena_err(&a);
	if (rc == KM_OK && *changed && !km_wr_ok(out))
		rc = KM_ERR_NOMEM;
	km_arena_free(&a);
	if (rc != KM_OK)
		*changed = false;
	return rc;
}

/* The session's hook: the inner hook (if any) first, then the translation of what it made. */
static km_err off_response_hook(km_resp *rs)
{
	km_off_req *c = rs->ctx;
	struct evbuffer *frame = rs->in, *scratch = NULL;
	size_t flen = rs->frame_len + 4, body_off = rs->body_off;
	uint8_t *p, pre[4];
	bool changed = false;
	km_wr w;
	km_err rc;

	if (c->inner) {
		/* The inner hook writes the client's frame (size prefix included); its header is the broker's. */
		km_resp in2 = *rs;
		if (!(scratch = evbuffer_new()))
			return KM_ERR_NOMEM;
		in2.out = scratch;
		in2.ctx = c->inner_ctx;
		if ((rc = c->inner(&in2)) != KM_OK) {
			evbuffer_free(scratch);
			return rc;
		}
		frame = scratch;
		flen = evbuffer_get_length(scratch);
	}
	if (flen < body_off || !(p = evbuffer_pullup(frame, (ev_ssize_t)flen))) {
		rc = KM_ERR_DECODE;
		goto out;
	}
	km_wr_init(&w);
	rc = km_off_response(c, p + body_off, flen - body_off, &changed, &w);
	if (rc == KM_OK && changed) {
		km_put_be32(pre, (uint32_t)(body_off - 4 + w.len));
		if (evbuffer_add(rs->out, pre, 4) != 0 || evbuffer_add(rs->out, p + 4, body_off - 4) != 0 ||
		    evbuffer_add(rs->out, w.buf, w.len) != 0)
			rc = KM_ERR_NOMEM;
		evbuffer_drain(frame, flen);
	} else if (rc == KM_OK) {
		evbuffer_remove_buffer(frame, rs->out, flen);
	}
	km_wr_free(&w);
out:
	if (scratch)
		evbuffer_free(scratch);
	return rc;
}

/* ---- the streamed Fetch response ---- */

/* Read n bytes at frame offset off: KM_STREAM_AGAIN when they are in the frame but not here yet. */
km_err km_off_peek(const km_fetch_walk *w, struct evbuffer *in, size_t first, size_t off, void *out, size_t n)
{
	struct evbuffer_ptr p;
	if (off < first || off + n > w->end)
		return KM_ERR_DECODE;
	if (off + n > first + evbuffer_get_length(in))
		return KM_STREAM_AGAIN;
	if (evbuffer_ptr_set(in, &p, off - first, EVBUFFER_PTR_SET) != 0 ||
	    evbuffer_copyout_from(in, &p, out, n) != (ev_ssize_t)n)
		return KM_ERR_DECODE;
	return KM_OK;
}

static km_err patch64(struct evbuffer *in, size_t first, size_t off, int64_t v)
{
	uint8_t b[8];
	km_put_be64(b, (uint64_t)v);
	return km_evbuf_patch(in, off - first, b, 8) ? KM_OK : KM_ERR_DECODE;
}

/*
 * DivergingEpoch (tag 0 of a v12+ partition: Epoch int32, EndOffset int64, tags), in the tagged
 * fields right after the records. The broker sends it only with no records (it answers a diverged
 * fetch with the epoch's end and nothing else), so it is read here, at the partition's event: the
 * few bytes are usually here already, else the event comes again when they are. Tags are in
 * increasing order, so tag 0 is the first if it is there at all.
 */
static km_err diverging_epoch(const km_fetch_walk *w, struct evbuffer *in, size_t first, const km_offmap *m)
{
	uint8_t buf[32];
	size_t at = w->part.records_off, cap = w->end - at < sizeof(buf) ? w->end - at : sizeof(buf);
	size_t avail = first + evbuffer_get_length(in) - at, n = avail < cap ? avail : cap;
	km_err rc, out = n < cap ? KM_STREAM_AGAIN : KM_ERR_DECODE; /* what running out of bytes means */
	uint32_t count = 0, tag = 0, sz = 0;
	km_rd r;

	if (n && (rc = km_off_peek(w, in, first, at, buf, n)) != KM_OK)
		return rc;
	km_rd_init(&r, buf, n);
	if (!km_rd_uvarint(&r, "tags", &count))
		return out;
	if (count == 0)
		return KM_OK;
	if (!km_rd_uvarint(&r, "tag", &tag) || !km_rd_uvarint(&r, "size", &sz))
		return out;
	if (tag != 0)
		return KM_OK;
	if (sz < 12)
		return KM_ERR_DECODE;
	if (r.pos + 12 > n)
		return out;
	return patch64(in, first, at + r.pos + 4, end_to_logical(m, (int64_t)km_be64(buf + r.pos + 4)));
}

/* Writes v as an unsigned varint of exactly width bytes (non-minimal when v needs fewer); false if it needs more. */
static bool uvarint_fixed(uint8_t *out, uint32_t v, size_t width)
{
	for (size_t i = 0; i < width; i++) {
		out[i] = (uint8_t)(v & 0x7f) | (i + 1 < width ? 0x80 : 0);
		v >>= 7;
	}
	return v == 0;
}

static size_t uvarint_width(uint32_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/*
 * A partition whose records all lie at or past the pipeline's tail (written, not mapped yet) is
 * answered with no records. Every client skips such batches once they are put below its position
 * (fetch_batch), but librdkafka takes an answer that yields no record for a fetch size too small:
 * it doubles the size, and once at 1 GiB it reports MSG_SIZE_TOO_LARGE for the partition ("might
 * be too large to fetch"), a consumer at the head that fetched while a batch was unmapped a dozen
 * times. The frame's length went out already, so the partition keeps its length: the records
 * field becomes empty and its bytes, with the partition's (empty) tagged fields, the value of one
 * tagged field no client knows (KM_FETCH_FILLER_TAG; every reader skips unknown tags). Only the
 * head of that span is written: the walk goes on over the old layout, which is still there after
 * it. v12+ only (v4-11 partitions have no tagged fields to hold the bytes: left as they were), and
 * only when the tagged fields are empty, as the broker sends them with records.
 */
#define KM_FETCH_FILLER_TAG 10000u

/*
 * Whether no batch of the partition's records shows a record at or past the reader's position
 * ref: every one hidden (between runs, or at or past the tail), or mapped wholly below ref (the
 * request went to the broker translated with a tail that moved before the answer came: a reader
 * ahead of the tail is sent to the physical tail, and once the batches written there are mapped
 * they stand below its position). ref < 0 (not known): whether none is mapped. Headers read from
 * the first batch on; KM_STREAM_AGAIN in *rc while the partition's bytes are not all here.
 */
static bool nothing_reaches(const km_fetch_walk *w, struct evbuffer *in, size_t first, const km_offmap *m,
			    int64_t ref, km_err *rc)
{
	const km_fetch_part *p = &w->part;
	size_t off = p->records_off, end = p->records_off + p->records_len;
	uint8_t h[KM_BATCH_OFF_LAST_OFFSET_DELTA + 4]; /* baseOffset, batchLength, ..., lastOffsetDelta */
	int64_t logical;

	*rc = KM_OK;
	while (off + KM_BATCH_LOG_OVERHEAD <= end) {
		uint32_t len;
		size_t n = end - off < sizeof(h) ? end - off : sizeof(h);
		if ((*rc = km_off_peek(w, in, first, off, h, n)) != KM_OK)
			return false;
		if (km_off_batch_run(m, (int64_t)km_be64(h), &logical) >= 0 &&
		    (ref < 0 || n < sizeof(h) || logical + (int32_t)km_be32(h + KM_BATCH_OFF_LAST_OFFSET_DELTA) >= ref))
			return false;
		len = km_be32(h + KM_BATCH_OFF_LENGTH);
		if (len > end - off - KM_BATCH_LOG_OVERHEAD)
			break; /* the last batch, cut by the fetch's size */
		off += KM_BATCH_LOG_OVERHEAD + len;
	}
	return true;
}

static km_err blank_unmapped(const km_fetch_walk *w, struct evbuffer *in, size_t first, const km_offmap *m,
			     int64_t ref, bool *blanked)
{
	const km_fetch_part *p = &w->part;
	size_t k, end = p->records_off + p->records_len, span, room, tw = uvarint_width(KM_FETCH_FILLER_TAG), sw;
	uint8_t b[8], head[16];
	uint32_t len1;
	km_rd r;
	km_err rc;

	*blanked = false;
	if (w->version < 12 || p->records_len < 12 || m->tail_physical < 0 || p->records_len >= UINT32_MAX - 1)
		return KM_OK;
	if ((rc = km_off_peek(w, in, first, p->records_off, b, 8)) != KM_OK)
		return rc;
	/*
	 * Before the tail, the batches are presented one by one, unless none of them shows a record at
	 * or past the reader's position: a reader whose position the map sends into a hidden range (a
	 * former owner's writes that landed late, before reconcile hides them past a fence run), or a
	 * reader ahead of the tail whose answer holds the batches that moved the tail (mapped below
	 * its position), would take such an answer for a fetch size too small, as at the tail
	 * (docs/reliability.md, finding 16).
	 */
	if ((int64_t)km_be64(b) < m->tail_physical && !nothing_reaches(w, in, first, m, ref, &rc))
		return rc;
	/* The records' length prefix (COMPACT_RECORDS: length + 1), as the broker wrote it. */
	k = uvarint_width((uint32_t)p->records_len + 1);
	if (p->records_off < first + k)
		return KM_OK;
	if ((rc = km_off_peek(w, in, first, p->records_off - k, b, k)) != KM_OK)
		return rc;
	km_rd_init(&r, b, k);
	if (!km_rd_uvarint(&r, "records length", &len1) || len1 != p->records_len + 1 || r.pos != k)
		return KM_OK;
	/* The partition's tagged fields: only their count byte, 0, follows the records. */
	if ((rc = km_off_peek(w, in, first, end, b, 1)) != KM_OK)
		return rc;
	if (b[0] != 0)
		return KM_OK;
	/* records (empty: 0x01), one tagged field (count 0x01), its tag, its size, its value to the span's end. */
	span = k + p->records_len + 1;
	room = span - 2 - tw;
	for (sw = 1; sw <= 5 && uvarint_width((uint32_t)(room - sw)) > sw; sw++)
		;
	if (sw > 5 || room <= sw)
		return KM_OK;
	head[0] = 0x01;
	head[1] = 0x01;
	uvarint_fixed(head + 2, KM_FETCH_FILLER_TAG, tw);
	/* Minimal unless no width fits exactly (room = 129, say): then one byte wider, which readers take. */
	if (!uvarint_fixed(head + 2 + tw, (uint32_t)(room - sw), sw))
		return KM_OK;
	if (!km_evbuf_patch(in, p->records_off - k - first, head, 2 + tw + sw))
		return KM_ERR_DECODE;
	*blanked = true;
	return KM_OK;
}

static km_err fetch_partition(km_fetch_walk *w, struct evbuffer *in, size_t first, void *ctx)
{
	km_off_req *c = ctx;
	const km_fetch_part *p = &w->part;
	const km_off_entry *e;
	const km_offmap *m;
	km_str name = KM_STR_NULL;
	const km_uuid *id = w->version >= 13 ? &p->topic_id : NULL;
	uint8_t f[24];
	bool blanked = false;
	km_err rc;

	if (!c)
		return KM_OK;
	c->cur = NULL;
	if (!km_off_active(c->lk))
		return KM_OK;
	if (!id)
		name = (km_str){p->topic, (int32_t)strlen(p->topic)};
	/* One topic lookup per topic of the response (and again after the store changed its model). */
	if (!c->cur_ti_set || c->cur_ti != p->topic_index || c->cur_epoch != lookup_epoch(c->lk)) {
		c->cur_topic = find_topic(c->lk, name, id);
		c->cur_ti = p->topic_index;
		c->cur_ti_set = true;
		c->cur_epoch = lookup_epoch(c->lk);
	}
	if (!c->cur_topic || !(m = c->lk->map(c->lk->arg, c->cur_topic, p->partition)))
		return KM_OK;
	/* DivergingEpoch first: it may ask for the event again, and nothing must be patched twice. */
	if (w->version >= 12 && p->records_len == 0 && (rc = diverging_epoch(w, in, first, m)) != KM_OK)
		return rc;
	/* Before anything is patched too: it may wait for the rest of the partition's bytes. */
	e = km_off_req_find(c, name, id, p->partition);
	if ((rc = blank_unmapped(w, in, first, m, e ? e->value : -1, &blanked)) != KM_OK)
		return rc;
	/* HighWatermark, LastStableOffset, LogStartOffset (v5+): "next" offsets. */
	if ((rc = km_off_peek(w, in, first, p->high_watermark_off, f, w->version >= 5 ? 24 : 16)) != KM_OK)
		return rc;
	for (int k = 0; k < (w->version >= 5 ? 3 : 2); k++) {
		int64_t v = (int64_t)km_be64(f + 8 * k);
		if (v >= 0 && (rc = patch64(in, first, p->high_watermark_off + 8 * (size_t)k, next_to_logical(m, v))) != KM_OK)
			return rc;
	}
	/*
	 * AbortedTransactions: ProducerId, FirstOffset (a record's), then tags (v12+). A transaction
	 * that starts hidden is hidden whole, its abort marker too (the mirror hid the transactions a
	 * fence aborted): its producer id becomes -1, which no batch carries, or a reader would skip
	 * that producer's later batches while waiting for a marker it never sees.
	 */
	if (p->aborted_count > 0) {
		km_evrd r;
		km_evrd_init(&r, in, p->aborted_off - first, p->records_off - first);
		for (int32_t a = 0; a < p->aborted_count; a++) {
			uint8_t b[8];
			size_t at = r.pos + first + 8;
			int64_t logical;
			if (!km_evrd_skip(&r, 8) || !km_evrd_raw(&r, b, 8) || (w->version >= 12 && !km_evrd_skip_tags(&r)))
				return KM_ERR_DECODE;
			if (m->n && km_off_batch_run(m, (int64_t)km_be64(b), &logical) < 0 &&
			    (rc = patch64(in, first, at - 8, -1)) != KM_OK)
				return rc;
			if ((rc = patch64(in, first, at, to_logical(m, (int64_t)km_be64(b)))) != KM_OK)
				return rc;
		}
	}
	c->cur = m;
	c->ref = e ? e->value : -1;
	c->ref_sent = e ? e->sent : -1;
	c->seen_visible = false;
	c->blanked = blanked;
	if (p->records_len > 0 && !blanked)
		w->descend = true;
	return KM_OK;
}

static km_err fetch_batch(km_fetch_walk *w, struct evbuffer *in, size_t first, void *ctx)
{
	km_off_req *c = ctx;
	const km_fetch_batch *b = &w->batch;
	int64_t logical, delta = INT32_MAX;
	ssize_t run;
	uint8_t d[4];
	km_err rc;

	if (c && c->cur && c->cur_epoch != lookup_epoch(c->lk)) {
		/* The store changed its model while this answer streamed: the map is found again. */
		const km_fetch_part *p = &w->part;
		km_str name = w->version >= 13 ? KM_STR_NULL : (km_str){p->topic, (int32_t)strlen(p->topic)};
		c->cur_topic = find_topic(c->lk, name, w->version >= 13 ? &p->topic_id : NULL);
		c->cur = c->cur_topic ? c->lk->map(c->lk->arg, c->cur_topic, p->partition) : NULL;
		c->cur_epoch = lookup_epoch(c->lk);
	}
	if (!c || !c->cur || b->length < 0)
		return KM_OK; /* a truncated prefix is not a batch: left as it came */
	if ((run = km_off_batch_run(c->cur, b->base_offset, &logical)) >= 0) {
		/* The reference for hidden batches when the request did not name the partition (KIP-227). */
		if (c->ref < 0)
			c->ref = logical;
		/* Header bytes cut off by the fetch's size: a partial batch, which clients drop anyway. */
		if ((c->cur->runs[run].flags & KM_OFFRUN_LOG_APPEND_TIME) && b->off + KM_BATCH_OFF_LAST_OFFSET_DELTA <= w->records_end) {
			uint8_t h[KM_BATCH_OFF_LAST_OFFSET_DELTA];
			if ((rc = km_off_peek(w, in, first, b->off, h, sizeof(h))) != KM_OK)
				return rc; /* nothing patched yet: the event may come again */
			if (km_off_set_append_time(h) &&
			    !km_evbuf_patch(in, b->off - first + KM_BATCH_OFF_CRC, h + KM_BATCH_OFF_CRC,
					    KM_BATCH_OFF_LAST_OFFSET_DELTA - KM_BATCH_OFF_CRC))
				return KM_ERR_DECODE;
		}
		c->seen_visible = true;
		return patch64(in, first, b->off, logical);
	}
	/*
	 * Hidden (outside every run): its records must not be seen. Consumers skip records below
	 * their fetch position (librdkafka compares with the position the request was made at), so
	 * the batch is put wholly below it: lastOffsetDelta (batch offset 23) tells how far its
	 * records reach; a partial batch cut before it gets the widest bound.
	 */
	if (b->off + 27 <= w->records_end) {
		if ((rc = km_off_peek(w, in, first, b->off + 23, d, 4)) != KM_OK)
			return rc;
		delta = (int32_t)km_be32(d);
		if (delta < 0)
			delta = INT32_MAX;
	}
	if ((rc = patch64(in, first, b->off, (c->ref >= 0 ? c->ref : 0) - 1 - delta)) != KM_OK)
		return rc;
	/*
	 * But the Java consumer takes the last whole batch's next offset as its position: a hidden
	 * batch last in the answer (written by the pipeline, not mapped yet: at or past the tail)
	 * would send it back to the fetch position, and it would read the visible batches before it
	 * again. When a visible batch came before, and nothing visible can come after (every batch
	 * past the tail is hidden too), this batch's length is made to reach past the records, as if
	 * the fetch's size had cut it: every client drops a cut last batch, and takes its position
	 * from the visible one. (With no visible batch before, a cut batch alone would be "no
	 * progress" to the Java consumer; below the fetch position it only repeats the fetch.)
	 */
	if (c->seen_visible && c->cur->tail_physical >= 0 && b->base_offset >= c->cur->tail_physical &&
	    w->records_end - b->off - 12 < INT32_MAX) {
		uint8_t len[4];
		km_put_be32(len, (uint32_t)(w->records_end - b->off - 12 + 1));
		if (!km_evbuf_patch(in, b->off + 8 - first, len, 4))
			return KM_ERR_DECODE;
	}
	return KM_OK;
}

/* What the answer shows, for the session's next request (km_session_fetch_may_wait). */
km_err km_off_fetch_partition(const km_stream_ev *e)
{
	km_off_req *c = e->ctx;
	km_err rc;

	km_off_trace_part_before(c, e->w, e->in, e->first);
	rc = fetch_partition(e->w, e->in, e->first, c);
	if (rc == KM_OK && c && c->cur && c->blanked && e->s)
		km_session_fetch_blank_at(e->s, c->cur, c->cur->tail_logical, c->cur_epoch);
	if (rc == KM_OK)
		km_off_trace_part(c, e->w, e->in, e->first);
	return rc;
}

km_err km_off_fetch_batch(const km_stream_ev *e)
{
	km_off_req *c = e->ctx;
	km_off_trace_rec tb;
	bool trace = km_off_trace_active(c);
	km_err rc;

	if (trace && (rc = km_off_trace_batch_before(e->w, e->in, e->first, &tb)) != KM_OK)
		return rc;
	rc = fetch_batch(e->w, e->in, e->first, c);
	if (rc == KM_OK && c && c->cur && c->seen_visible && e->s)
		km_session_fetch_shown(e->s);
	if (rc == KM_OK && trace)
		km_off_trace_batch(c, e->w, e->in, e->first, &tb);
	return rc;
}

/* ---- the rows ---- */

const km_off_lookup *km_off_lookup_of(km_req *rq)
{
	return &km_proxy_features_of(rq->s)->offsets;
}

km_err km_off_body_of(km_req *rq, size_t *off)
{
	km_req_header full;
	if (km_net_parse_request_header(rq->body, rq->frame_len,
					km_proxy_request_header_version(rq->h->api_key, rq->h->api_version), &full) != KM_OK) {
		rq->close_reason = "malformed request header";
		return KM_ERR_DECODE;
	}
	*off = full.body_offset;
	return KM_OK;
}

static km_err set_rewritten(km_req *rq, const uint8_t *head, size_t hlen, const km_wr *w)
{
	if (rq->rewritten)
		evbuffer_free(rq->rewritten);
	if (!(rq->rewritten = evbuffer_new()) || evbuffer_add(rq->rewritten, head, hlen) != 0 ||
	    evbuffer_add(rq->rewritten, w->buf, w->len) != 0)
		return KM_ERR_NOMEM;
	return KM_OK;
}

/* Any request of these APIs is held (whole) while some topic may have a map: then looked at. */
km_err km_off_hold_classify(km_req *rq)
{
	if (km_off_active(km_off_lookup_of(rq)))
		rq->action = KM_REQ_HOLD;
	return KM_OK;
}

/* Whether a tail the session's last answer blanked at has moved since (or may have: the lookup changed). */
static bool blank_tails_moved(const km_off_lookup *lk, const km_session *s)
{
	const void *const *maps;
	const int64_t *tails;
	uint64_t epoch;
	size_t n = km_session_fetch_blanks(s, &maps, &tails, &epoch);

	if (n && epoch != lookup_epoch(lk))
		return true;
	for (size_t i = 0; i < n; i++)
		if (((const km_offmap *)maps[i])->tail_logical != tails[i])
			return true;
	return false;
}

/* The maps of the partitions a Fetch asks: the wait at their tail also ends when one of them moves. */
static void tail_maps_of(const km_off_req *c, km_req *rq)
{
	const km_off_lookup *lk = c->lk;
	rq->ntail_maps = 0;
	rq->tail_any = false;
	for (size_t i = 0; i < c->n && !rq->tail_any; i++) {
		const void *t = lk->topic(lk->arg, c->entries[i].topic, &c->entries[i].id);
		const km_offmap *m = t ? lk->map(lk->arg, t, c->entries[i].partition) : NULL;
		if (!m)
			continue;
		if (rq->ntail_maps == KM_TAIL_MAPS)
			rq->tail_any = true; /* too many to name: any tail ends it */
		else
			rq->tail_maps[rq->ntail_maps++] = m;
	}
	if (!rq->ntail_maps)
		rq->tail_any = true; /* an incremental Fetch naming no partition: its session's are not known here */
}

static km_err fetch_request_hook(km_req *rq)
{
	km_off_req *c = NULL;
	bool rewrote = false;
	size_t off;
	km_wr w;
	km_err rc;

	if (!km_fetch_walk_supported(rq->h->api_version))
		return KM_OK; /* a version the walker does not know: as it came (the codec's range is the walker's) */
	if ((rc = km_off_body_of(rq, &off)) != KM_OK)
		return rc;
	km_wr_init(&w);
	rc = km_off_request(KM_API_FETCH, rq->h->api_version, rq->body + off, rq->frame_len - off, km_off_lookup_of(rq), &c,
			    &rewrote, &w);
	if (rc != KM_OK)
		rq->close_reason = "malformed Fetch request";
	if (rc == KM_OK && rewrote)
		rc = set_rewritten(rq, rq->body, off, &w);
	km_wr_free(&w);
	if (rc != KM_OK) {
		km_off_req_free(c);
		return rc;
	}
	if (c) {
		rq->ctx = c;
		rq->ctx_free = km_off_req_free;
		rq->resp = KM_RESP_STREAM; /* every version, while a mapped partition may be in the answer */
		/*
		 * Nothing asked before a tail, and the last answer showed nothing: the broker would answer
		 * at once again. Unless a tail it blanked at has moved since (the pipeline's Produce was
		 * answered after the broker's Fetch answer: the usual order at low rates).
		 */
		rq->wait_at_tail = !c->before_tail && km_session_fetch_may_wait(rq->s) && !blank_tails_moved(c->lk, rq->s);
		km_session_fetch_blanks_clear(rq->s);
		if (rq->wait_at_tail)
			tail_maps_of(c, rq);
	}
	return KM_OK;
}

/* Wrap whatever response hook the request has (or the row's) in the translation. */
static km_err wrap_response(km_req *rq, km_off_req *c, km_resp_hook row_hook, bool row_applies)
{
	/* Never itself (a classify run again over more bytes). */
	km_resp_hook own = rq->on_response == off_response_hook ? NULL : rq->on_response;
	c->inner = own ? own : row_applies ? row_hook : NULL;
	c->inner_ctx = rq->ctx;
	c->inner_free = rq->ctx_free;
	rq->ctx = c;
	rq->ctx_free = km_off_req_free;
	rq->on_response = off_response_hook;
	rq->resp = KM_RESP_WHOLE;
	return KM_OK;
}

/* ---- ListOffsets by timestamp on mirror topics ---- */

/*
 * The destination's own lookup goes wrong on a mirror topic in two ways (docs/mirror.md,
 * "ListOffsets by timestamp"). The mirror's transaction markers carry the destination's clock,
 * later than the source records around them: the broker's time index lands on the first such
 * marker whose time reaches the one asked, far before the record the source answers. And in a
 * LogAppendTime run the right batch is found (its MaxTimestamp is the source's append time) but on
 * the first record whose own, producer-given, timestamp reaches the one asked, where the source
 * (every record of the batch at the append time) answers with the batch's first record. So the
 * request is asked of the broker as a probe (as the client: the broker authorizes it), and from
 * each of its answers on a mirror topic the destination partition is searched with kmirrord's own
 * client (km_mirror_batches_at): the first record of a data batch whose timestamp reaches the one
 * asked is the answer.
 */
typedef struct time_op {
	struct time_op *prev, *next; /* every live one (km_off_detach) */
	km_session_set *set;        /* NULL: the proxy is gone, drop the answer */
	uint64_t sid, seq;
	km_off_req *c;
	km_mirror *mi;
	uint8_t *body;              /* the broker's answer, copied: the decoded response borrows it */
	km_arena a;
	km_list_offsets_response rs;
	km_mirror_batch_q *q;
	km_list_offsets_response_list_offsets_partition_response **qp; /* the answer each question fixes */
	size_t nq;
} time_op;

static time_op *time_ops;

void km_off_detach(km_session_set *set)
{
	for (time_op *op = time_ops; op; op = op->next)
		if (op->set == set)
			op->set = NULL;
}

static void time_free(time_op *op)
{
	if (op->prev)
		op->prev->next = op->next;
	else if (time_ops == op)
		time_ops = op->next;
	if (op->next)
		op->next->prev = op->prev;
	km_off_req_free(op->c);
	km_arena_free(&op->a);
	free(op->body);
	free(op->q);
	free(op->qp);
	free(op);
}

/* Whether physical offset o is in a run, and that run a LogAppendTime one. */
static bool lat_run_at(const km_offmap *m, int64_t o)
{
	int64_t l;
	ssize_t i = o >= 0 ? km_off_batch_run(m, o, &l) : -1;
	return i >= 0 && (m->runs[i].flags & KM_OFFRUN_LOG_APPEND_TIME);
}

/* Where a search from physical offset o starts: o itself in a run; in a hidden range, the next run's start. */
static int64_t search_from(const km_offmap *m, int64_t o)
{
	int64_t l, p;
	if (km_off_batch_run(m, o, &l) >= 0 || l < 0 || (p = km_offmap_to_physical(m, l)) < o)
		return o;
	return p;
}

/* Whether the request asks a timestamp (>= 0) of a mirror topic's partition that has mirrored records. */
static bool wants_time_search(km_off_req *c)
{
	for (size_t i = 0; i < c->n; i++) {
		const km_off_entry *e = &c->entries[i];
		const void *t = e->value >= 0 ? find_topic(c->lk, e->topic, NULL) : NULL;
		const km_offmap *m = t ? map_of(c, t, e->partition) : NULL;
		if (m && m->n)
			return true;
	}
	return false;
}

static void time_answer(time_op *op)
{
	struct evbuffer *b;
	km_wr w;
	km_err rc;

	if (!op->set) {
		time_free(op);
		return;
	}
	km_wr_init(&w);
	km_list_offsets_response_encode(&w, op->c->version, &op->rs);
	b = km_wr_ok(&w) ? evbuffer_new() : NULL;
	if (!b || evbuffer_add(b, w.buf, w.len) != 0) {
		/* No answer can come: the client learns it from the closed connection and retries. */
		KM_WARN("proxy", op->sid, "cannot encode the answer to ListOffsets");
		if (b)
			evbuffer_free(b);
		km_wr_free(&w);
		km_session_fail(op->set, op->sid, "out of memory");
		time_free(op);
		return;
	}
	km_wr_free(&w);
	if ((rc = km_session_answer(op->set, op->sid, op->seq, b)) != KM_OK)
		KM_DEBUG("proxy", op->sid, "answer to ListOffsets dropped: %s", km_err_name(rc));
	evbuffer_free(b);
	time_free(op);
}

/*
 * Whether the source's answer stands for a search that passed over a marker: the mirror's marker
 * carries the destination's clock, the source's its own, so the first offset whose time reaches
 * the one asked lies from that marker (logical) up to the record found (found, logical; -1: none
 * found, then below the logical tail). Outside that range the source's log is not the one
 * mirrored (retention, a source changed since): the destination's answer stays.
 */
static bool source_answers(const km_offmap *m, const km_mirror_batch_q *q, int64_t found)
{
	int64_t from = q->marker >= 0 ? to_logical(m, q->marker) : -1, s = q->source_offset;

	if (!q->source_known || from < 0 || s < from)
		return false;
	if (found >= 0)
		return s <= found;
	return m->tail_logical >= 0 && s < m->tail_logical;
}

static void time_looked_up(void *arg, km_mirror_batch_q *q, size_t n)
{
	time_op *op = arg;

	if (!op->set) {
		time_free(op); /* shutting down: the store may be gone already */
		return;
	}
	for (size_t i = 0; i < n; i++) {
		km_list_offsets_response_list_offsets_partition_response *p = op->qp[i];
		const void *t = find_topic(op->c->lk, km_str_c(q[i].topic), NULL);
		const km_offmap *m = t ? map_of(op->c, t, q[i].partition) : NULL;
		if (q[i].code != KM_OK || !m) {
			/* The plain translation stays: the record the destination found. */
			char tn[KM_LOG_ESCAPED_SIZE(256)];
			km_log_escape(tn, sizeof(tn), q[i].topic, q[i].topic ? (int32_t)strnlen(q[i].topic, 256) : 0);
			KM_WARN("proxy", op->sid, "ListOffsets by timestamp on %s-%d: the search from destination offset "
				"%lld failed (%s): answered with the record the destination found", tn, (int)q[i].partition,
				(long long)q[i].offset, km_err_name(q[i].code));
			continue;
		}
		p->offset = q[i].found_offset >= 0 ? to_logical(m, q[i].found_offset) : -1;
		p->timestamp = q[i].found_timestamp;
		if (source_answers(m, &q[i], p->offset)) {
			p->offset = q[i].source_offset;
			p->timestamp = q[i].source_timestamp;
		}
	}
	time_answer(op);
}

static void time_probed(void *arg, km_err err, const uint8_t *body, size_t len)
{
	time_op *op = arg;
	km_off_req *c = op->c;
	bool changed = false;
	size_t cap = 0;
	km_rd r;

	if (err != KM_OK) {
		time_free(op); /* the session is gone (it is not to be touched) */
		return;
	}
	if (!(op->body = malloc(len ? len : 1))) {
		if (op->set)
			km_session_fail(op->set, op->sid, "out of memory");
		time_free(op);
		return;
	}
	memcpy(op->body, body, len);
	km_rd_init(&r, op->body, len);
	km_list_offsets_response_init(&op->rs);
	if (km_list_offsets_response_decode(&r, c->version, &op->rs, &op->a) != KM_OK) {
		KM_WARN("proxy", op->sid, "cannot decode the broker's answer to ListOffsets");
		if (op->set)
			km_session_fail(op->set, op->sid, "unreadable response");
		time_free(op);
		return;
	}
	/* The questions: timestamp answers in LogAppendTime runs, before the offsets are translated. */
	for (int32_t i = 0; i < op->rs.topics.count; i++)
		cap += (size_t)op->rs.topics.items[i].partitions.count;
	op->q = calloc(cap ? cap : 1, sizeof(*op->q));
	op->qp = calloc(cap ? cap : 1, sizeof(*op->qp));
	for (int32_t i = 0; op->q && op->qp && i < op->rs.topics.count; i++) {
		km_list_offsets_response_list_offsets_topic_response *t = &op->rs.topics.items[i];
		const void *topic = find_topic(c->lk, t->name, NULL);
		char *name = NULL;
		for (int32_t j = 0; topic && j < t->partitions.count; j++) {
			km_list_offsets_response_list_offsets_partition_response *p = &t->partitions.items[j];
			const km_off_entry *e = km_off_req_find(c, t->name, NULL, p->partition_index);
			const km_offmap *m = map_of(c, topic, p->partition_index);
			int64_t from;
			if (!e || e->value < 0 || p->error_code || !m || !m->n || p->offset < 0)
				continue;
			if (!name && (name = km_arena_alloc(&op->a, (size_t)t->name.len + 1))) {
				memcpy(name, t->name.p, (size_t)t->name.len);
				name[t->name.len] = 0;
			}
			if (!name)
				break;
			from = search_from(m, p->offset);
			op->q[op->nq] = (km_mirror_batch_q){.topic = name, .partition = p->partition_index, .offset = from,
							     .timestamp = e->value, .lat = lat_run_at(m, from),
							     .committed = c->committed};
			op->qp[op->nq++] = p;
		}
	}
	list_offsets_response(c, &op->rs, &changed);
	if (!op->nq || !op->set) {
		time_answer(op);
		return;
	}
	km_mirror_batches_at(op->mi, op->q, op->nq, time_looked_up, op);
}

/* Take a ListOffsets that needs batch lookups: asked of the broker as a probe, answered later. */
static km_err time_start(km_req *rq, km_off_req *c, size_t off)
{
	const km_session_host *host = km_session_host_of(rq->s);
	time_op *op;
	km_err rc;

	if (!(op = calloc(1, sizeof(*op))))
		return KM_ERR_NOMEM;
	op->set = host->sessions;
	op->sid = km_session_id(rq->s);
	op->seq = rq->seq;
	op->c = c;
	op->mi = host->mirror;
	km_arena_init(&op->a, KM_OFF_ARENA_CAP);
	if ((rc = km_session_probe(rq->s, rq->h->api_key, rq->h->api_version, rq->body + off, rq->frame_len - off,
				   time_probed, op)) != KM_OK) {
		op->c = NULL; /* the caller frees it */
		km_arena_free(&op->a);
		free(op);
		return rc;
	}
	op->next = time_ops;
	if (time_ops)
		time_ops->prev = op;
	time_ops = op;
	rq->pending = true;
	return KM_OK;
}

static km_err small_request_hook(km_req *rq)
{
	km_off_req *c = NULL;
	bool rewrote = false;
	size_t off;
	km_wr w;
	km_err rc;

	if ((rc = km_off_body_of(rq, &off)) != KM_OK)
		return rc;
	km_wr_init(&w);
	rc = km_off_request(rq->h->api_key, rq->h->api_version, rq->body + off, rq->frame_len - off, km_off_lookup_of(rq), &c,
			    &rewrote, &w);
	km_wr_free(&w);
	if (rc != KM_OK) {
		rq->close_reason = "malformed request";
		return rc;
	}
	/* Timestamps asked of LogAppendTime runs: the answer needs the batches that hold the broker's. */
	if (c && rq->h->api_key == KM_API_LIST_OFFSETS && km_session_host_of(rq->s)->mirror && wants_time_search(c)) {
		if ((rc = time_start(rq, c, off)) == KM_OK)
			return KM_OK;
		km_off_req_free(c);
		return rc;
	}
	/* ListOffsets without a mapped partition has no context; the other two are asked of their (small) response. */
	return c ? wrap_response(rq, c, NULL, false) : KM_OK;
}

/*
 * DeleteRecords: after the read-only stage (refused partitions answered there; an answer stops
 * the row before this stage), what goes up translated.
 */
static km_err dr_request(km_req *rq)
{
	km_off_req *c = NULL;
	bool rewrote = false;
	const uint8_t *frame;
	size_t off, flen;
	km_wr w;
	km_err rc;

	if (!km_off_active(km_off_lookup_of(rq)))
		return KM_OK;
	if ((rc = km_off_body_of(rq, &off)) != KM_OK)
		return rc;
	frame = rq->body;
	flen = rq->frame_len;
	if (rq->rewritten && !(frame = evbuffer_pullup(rq->rewritten, -1)))
		return KM_ERR_NOMEM;
	if (rq->rewritten)
		flen = evbuffer_get_length(rq->rewritten);
	km_wr_init(&w);
	rc = km_off_request(KM_API_DELETE_RECORDS, rq->h->api_version, frame + off, flen - off, km_off_lookup_of(rq), &c,
			    &rewrote, &w);
	if (rc == KM_OK && rewrote) {
		/* The header is the client's (the rewritten body keeps it too). */
		uint8_t *head = malloc(off);
		if (!head) {
			rc = KM_ERR_NOMEM;
		} else {
			memcpy(head, frame, off);
			rc = set_rewritten(rq, head, off, &w);
			free(head);
		}
	}
	km_wr_free(&w);
	if (rc != KM_OK) {
		rq->close_reason = "malformed DeleteRecords request";
		km_off_req_free(c);
		return rc;
	}
	return c ? wrap_response(rq, c, NULL, false) : KM_OK;
}

/* The row's own response hook (Produce v10+: NodeEndpoints in the tail), which the translation runs first. */
static km_err wrap_row_response(km_req *rq, km_off_req *c)
{
	return wrap_response(rq, c, rq->api->on_response, rq->h->api_version >= rq->api->resp_from);
}

/*
 * Produce: the request is never looked at for this (it carries the records; walking it would
 * cost every Produce): while some topic has a map, the small response is held whole and
 * translated when it names a partition with one (after a stop), else moved on as it came.
 * Forwarded: wrapped here; held (a read-only topic somewhere): wrapped at produce_request, after
 * the read-only stage, which may set its own merge.
 */
static km_err produce_classify(km_req *rq)
{
	km_off_req *c;

	if (rq->action != KM_REQ_FORWARD || !rq->expect_response || !km_off_active(km_off_lookup_of(rq)))
		return KM_OK;
	if (!(c = km_off_req_new(KM_API_PRODUCE, rq->h->api_version, km_off_lookup_of(rq))))
		return KM_ERR_NOMEM;
	return wrap_row_response(rq, c);
}

static km_err produce_request(km_req *rq)
{
	km_off_req *c;

	if (!rq->expect_response || !km_off_active(km_off_lookup_of(rq)))
		return KM_OK;
	if (!(c = km_off_req_new(KM_API_PRODUCE, rq->h->api_version, km_off_lookup_of(rq))))
		return KM_ERR_NOMEM;
	return wrap_row_response(rq, c);
}

static const km_stream_hooks fetch_hooks = {
	.on_partition = km_off_fetch_partition,
	.on_batch = km_off_fetch_batch,
};

static const km_proxy_stage stages[] = {
	{.key = KM_API_PRODUCE, .classify = produce_classify, .on_request = produce_request,
	 .note = "mirror topics after a stop: BaseOffset and LogStartOffset physical -> logical"},
	{.key = KM_API_FETCH, .classify = km_off_hold_classify, .on_request = fetch_request_hook, .stream = &fetch_hooks,
	 .note = "mirror topics: fetch offsets logical -> physical, responses (every version) patched in place: batch "
		 "base offsets, watermarks, aborted transactions, diverging epoch; a partition wholly past the tail answered "
		 "with no records (v12+); at the tail after such an answer, held 50 ms"},
	{.key = KM_API_LIST_OFFSETS, .classify = km_off_hold_classify, .on_request = small_request_hook,
	 .note = "mirror topics: offsets physical -> logical (by timestamp: a record's; earliest, latest, earliest local: "
		 "next); a timestamp asked of a LogAppendTime run: answered later (probe + batch lookup)"},
	{.key = KM_API_DELETE_RECORDS, .classify = km_off_hold_classify, .on_request = dr_request,
	 .note = "mirror topics after a stop: Offset logical -> physical, LowWatermark physical -> logical"},
	{.key = KM_API_OFFSET_FOR_LEADER_EPOCH, .classify = km_off_hold_classify, .on_request = small_request_hook,
	 .note = "mirror topics: EndOffset physical -> logical"},
	{.key = KM_API_DESCRIBE_PRODUCERS, .classify = km_off_hold_classify, .on_request = small_request_hook,
	 .note = "mirror topics: CurrentTxnStartOffset physical -> logical"},
};

const km_proxy_feature km_off_feature = {"offsets", stages, sizeof(stages) / sizeof(stages[0]), .needs_state = true};

/* ---- the lookup over the state store ---- */

static bool state_active(void *arg)
{
	/* One test: with no mirror at all no topic can have a map. */
	return km_state_mirror_count(arg) > 0;
}

static const void *state_topic(void *arg, km_str name, const km_uuid *id)
{
	km_state *st = arg;
	if (id)
		return km_state_topic_find_id(st, id);
	return name.len > 0 ? km_state_topic_find(st, name.p, (size_t)name.len) : NULL;
}

static const km_offmap *state_map(void *arg, const void *topic, int32_t partition)
{
	const km_offmap *m = km_state_topic_offmap(topic, partition);
	(void)arg;
	/* No run and no pipeline (stopped, or failed, before anything was mirrored): its own offsets. */
	return m && !m->n && m->tail_physical < 0 ? NULL : m;
}

static uint64_t state_epoch(void *arg)
{
	return km_state_model_epoch(arg);
}

static const char *state_name(void *arg, const void *topic)
{
	(void)arg;
	return km_state_topic_name(topic);
}

void km_off_lookup_from_state(km_state *st, km_off_lookup *out)
{
	out->active = st ? state_active : NULL;
	out->topic = st ? state_topic : NULL;
	out->map = st ? state_map : NULL;
	out->epoch = st ? state_epoch : NULL;
	out->name = st ? state_name : NULL;
	out->arg = st;
}
