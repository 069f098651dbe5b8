/* Read-only mirror topics: Produce, DeleteRecords, DeleteTopics and CreatePartitions on them are refused here, the rest forwarded and the answers merged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kmirror/hash.h"
#include "kmirror/log.h"
#include "kmirror/msg/add_partitions_to_txn_request.h"
#include "kmirror/msg/add_partitions_to_txn_response.h"
#include "kmirror/msg/create_partitions_request.h"
#include "kmirror/msg/create_partitions_response.h"
#include "kmirror/msg/create_topics_request.h"
#include "kmirror/msg/create_topics_response.h"
#include "kmirror/msg/delete_records_request.h"
#include "kmirror/msg/delete_records_response.h"
#include "kmirror/msg/delete_topics_request.h"
#include "kmirror/msg/delete_topics_response.h"
#include "kmirror/msg/produce_response.h"
#include "proxy/readonly.h"
#include "proxy/features.h"
#include "proxy/session.h"

/* A plan's bookkeeping (topics, partitions, messages) is bounded like any decode. */
#define KM_RO_ARENA_CAP ((size_t)32 << 20)

static const char *arena_strdup(km_arena *a, const char *s)
{
	size_t n = strlen(s);
	char *p = km_arena_alloc(a, n + 1);
	if (p)
		memcpy(p, s, n + 1);
	return p;
}

static km_str arena_str(km_arena *a, km_str s)
{
	char *p;
	if (s.len <= 0 || !(p = km_arena_alloc(a, (size_t)s.len)))
		return s.len < 0 ? s : (km_str){"", 0};
	memcpy(p, s.p, (size_t)s.len);
	return (km_str){p, s.len};
}

/* ---- Produce: walk ---- */

void km_ro_produce_free(void *p)
{
	km_ro_produce *pl = p;
	if (!pl)
		return;
	km_arena_free(&pl->arena);
	free(pl);
}

/*
 * A cursor over the frame where it sits in the input's chains. Fields are read straight from the
 * chain the cursor is in (km_evrd copies each one out through libevent, about a hundred
 * instructions a byte, which made the walk a fifth of Produce's cost); only a field that
 * straddles two chains is gathered byte by byte, and a skip (a record set) moves the libevent
 * pointer once, however many chains it crosses. The frame is never changed or pulled up.
 */
typedef struct ro_rd {
	struct evbuffer *in;
	struct evbuffer_ptr at; /* at at_pos, the start of the extent [p0, lim) */
	size_t at_pos, end;     /* offsets in in; end: the frame's */
	const uint8_t *p0, *p, *lim;
	bool err;
} ro_rd;

static size_t rd_pos(const ro_rd *r)
{
	return r->at_pos + (size_t)(r->p - r->p0);
}

/* The extent at at_pos (up to the end of its chain, or of the frame). */
static bool rd_load(ro_rd *r)
{
	struct evbuffer_iovec v;
	r->p0 = r->p = r->lim = NULL;
	if (r->at_pos >= r->end)
		return false;
	if (evbuffer_peek(r->in, 1, &r->at, &v, 1) < 1 || v.iov_len == 0) {
		r->err = true;
		return false;
	}
	r->p0 = r->p = v.iov_base;
	r->lim = r->p0 + (v.iov_len < r->end - r->at_pos ? v.iov_len : r->end - r->at_pos);
	return true;
}

static void rd_init(ro_rd *r, struct evbuffer *in, size_t start, size_t end)
{
	memset(r, 0, sizeof(*r));
	r->in = in;
	r->at_pos = start;
	r->end = end;
	if (end > evbuffer_get_length(in) || start > end || evbuffer_ptr_set(in, &r->at, start, EVBUFFER_PTR_SET) != 0)
		r->err = true;
	else
		rd_load(r);
}

/* The slow half of a skip: to or past the end of the extent (a record set, a chain boundary). */
static bool rd_skip_far(ro_rd *r, size_t n)
{
	size_t pos = rd_pos(r);
	if (r->err || r->end - pos < n) {
		r->err = true;
		return false;
	}
	if (n < (size_t)(r->lim - r->p)) {
		r->p += n;
		return true;
	}
	/* Past this extent: the libevent pointer moves on from where it is, then the next extent. */
	if (pos + n < r->end && evbuffer_ptr_set(r->in, &r->at, pos + n - r->at_pos, EVBUFFER_PTR_ADD) != 0) {
		r->err = true;
		return false;
	}
	r->at_pos = pos + n;
	if (r->at_pos < r->end)
		return rd_load(r);
	r->p0 = r->p = r->lim = NULL;
	return true;
}

/* Fields inside the extent (nearly all of them) cost a compare and a pointer move. */
static inline bool rd_skip(ro_rd *r, size_t n)
{
	if (n < (size_t)(r->lim - r->p)) {
		r->p += n;
		return true;
	}
	return rd_skip_far(r, n);
}

static bool rd_raw(ro_rd *r, void *out, size_t n)
{
	uint8_t *o = out;
	while (n && !r->err) {
		size_t have = (size_t)(r->lim - r->p), take = have < n ? have : n;
		if (!take) {
			r->err = true;
			break;
		}
		memcpy(o, r->p, take);
		o += take;
		n -= take;
		rd_skip(r, take);
	}
	return !r->err;
}

static inline bool rd_u8(ro_rd *r, uint8_t *b)
{
	if (r->lim - r->p > 1) {
		*b = *r->p++;
		return true;
	}
	if (r->err || r->p == r->lim) {
		r->err = true;
		return false;
	}
	*b = *r->p;
	return rd_skip(r, 1);
}

static inline bool rd_i16(ro_rd *r, int16_t *v)
{
	uint8_t b[2] = {0, 0};
	bool ok = r->lim - r->p > 2 ? (memcpy(b, r->p, 2), r->p += 2, true) : rd_raw(r, b, 2);
	*v = (int16_t)km_be16(b);
	return ok;
}

static inline bool rd_i32(ro_rd *r, int32_t *v)
{
	uint8_t b[4] = {0, 0, 0, 0};
	bool ok = r->lim - r->p > 4 ? (memcpy(b, r->p, 4), r->p += 4, true) : rd_raw(r, b, 4);
	*v = (int32_t)km_be32(b);
	return ok;
}

static bool rd_uvarint_slow(ro_rd *r, uint32_t *v)
{
	uint32_t x = 0;
	*v = 0;
	for (int shift = 0; shift < 35; shift += 7) {
		uint8_t b;
		if (!rd_u8(r, &b))
			return false;
		if (shift == 28 && (b & 0xf0))
			break;
		x |= (uint32_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return true;
		}
	}
	r->err = true;
	return false;
}

/* One byte (a tag count of 0, a short length) is the common case. */
static inline bool rd_uvarint(ro_rd *r, uint32_t *v)
{
	if (r->lim - r->p > 1 && !(*r->p & 0x80)) {
		*v = *r->p++;
		return true;
	}
	return rd_uvarint_slow(r, v);
}

static bool rd_skip_tags(ro_rd *r)
{
	uint32_t n = 0, tag, sz;
	if (!rd_uvarint(r, &n))
		return false;
	for (uint32_t i = 0; i < n; i++)
		if (!rd_uvarint(r, &tag) || !rd_uvarint(r, &sz) || !rd_skip(r, sz))
			return false;
	return true;
}

/* A length prefix: compact (uvarint, 0 = null) or classic (int16, or int32 when wide; -1 = null). *n -1: null. */
static bool rd_len(ro_rd *r, bool flex, bool wide, int32_t *n)
{
	*n = -1;
	if (flex) {
		uint32_t u;
		if (!rd_uvarint(r, &u))
			return false;
		if (u > INT32_MAX)
			goto bad;
		*n = (int32_t)u - 1;
		return true;
	}
	if (wide) {
		if (!rd_i32(r, n))
			return false;
	} else {
		int16_t x;
		if (!rd_i16(r, &x))
			return false;
		*n = x;
	}
	if (*n >= -1)
		return true;
bad:
	r->err = true;
	return false;
}

/* A non-nullable array's length, capped by the bytes left (each element takes at least min bytes). */
static bool rd_array(ro_rd *r, bool flex, size_t min, int32_t *n)
{
	if (!rd_len(r, flex, true, n))
		return false;
	if (*n >= 0 && (size_t)*n <= (r->end - rd_pos(r)) / min)
		return true;
	*n = 0;
	r->err = true;
	return false;
}

/* A nullable string or bytes field, skipped. */
static bool rd_skip_field(ro_rd *r, bool flex, bool wide)
{
	int32_t n;
	return rd_len(r, flex, wide, &n) && (n <= 0 || rd_skip(r, (size_t)n));
}

/*
 * A topic name: copied into the arena (a plan's names outlive the frame), or, when in_place and
 * the name lies inside one chain, pointing into the chain (valid while the frame is).
 */
static bool rd_name(ro_rd *r, bool flex, km_arena *a, bool in_place, km_str *out)
{
	int32_t n;
	char *p;
	*out = (km_str){"", 0};
	if (!rd_len(r, flex, false, &n))
		return false;
	if (n < 0 || (size_t)n > r->end - rd_pos(r)) {
		r->err = true;
		return false;
	}
	if (n == 0)
		return true;
	if (in_place && n < r->lim - r->p) {
		*out = (km_str){(const char *)r->p, n};
		r->p += n;
		return true;
	}
	if (!(p = km_arena_alloc(a, (size_t)n)))
		return false;
	*out = (km_str){p, n};
	return rd_raw(r, p, (size_t)n);
}

/*
 * The walk. build: every topic and partition recorded in pl (its arena); else (the first pass)
 * only the counts: nothing is allocated but a name that straddles two chains, and the verdicts'
 * messages are not kept.
 */
/* A verdict's code as the client gets it. */
static km_err wire_code(const km_ro_lookup *lk, km_err code)
{
	return code == KM_MIRROR_READ_ONLY_TOPIC && lk->read_only_code != KM_OK ? lk->read_only_code : code;
}

static km_err walk(struct evbuffer *in, size_t off, size_t len, int16_t v, const km_ro_lookup *lk, bool build,
		   km_ro_produce *pl)
{
	bool flex = v >= 9, by_id = v >= 13;
	km_ro_topic one_topic;
	km_ro_part one_part;
	km_ro_verdict vd;
	int32_t timeout = 0;
	ro_rd r;

	pl->version = v;
	pl->len = len;
	/*
	 * The frame stays where it is, in the input's chains. The header: api key, version,
	 * correlation id, client id (a classic string in every header version), then v2's tags.
	 */
	rd_init(&r, in, off, off + len);
	rd_skip(&r, 8);
	rd_skip_field(&r, false, false);
	if (km_net_produce_header_version(v) >= 2)
		rd_skip_tags(&r);
	rd_skip_field(&r, flex, false); /* transactional_id */
	rd_i16(&r, &pl->acks);
	rd_i32(&r, &timeout);
	pl->head_end = rd_pos(&r) - off;
	rd_array(&r, flex, 2, &pl->ntopics);
	if (!r.err && pl->ntopics > 0 && build)
		pl->topics = km_arena_calloc(&pl->arena, (size_t)pl->ntopics * sizeof(*pl->topics));
	for (int32_t i = 0; i < pl->ntopics && !r.err && (pl->topics || !build); i++) {
		km_ro_topic *t = build ? &pl->topics[i] : &one_topic;
		if (!build)
			memset(t, 0, sizeof(*t));
		t->start = rd_pos(&r) - off;
		t->name = (km_str){"", 0};
		if (by_id)
			rd_raw(&r, t->id.b, 16);
		else if (!rd_name(&r, flex, &pl->arena, !build, &t->name))
			break;
		t->head_end = rd_pos(&r) - off;
		rd_array(&r, flex, 5, &t->nparts);
		if (!r.err && t->nparts > 0 && build &&
		    !(t->parts = km_arena_calloc(&pl->arena, (size_t)t->nparts * sizeof(*t->parts))))
			break;
		for (int32_t j = 0; j < t->nparts && !r.err; j++) {
			km_ro_part *p = build ? &t->parts[j] : &one_part;
			p->start = rd_pos(&r) - off;
			rd_i32(&r, &p->index);
			/* The record set is skipped by its length: the broker validates it, not the proxy. */
			rd_skip_field(&r, flex, true);
			if (flex)
				rd_skip_tags(&r);
			p->end = rd_pos(&r) - off;
			if (r.err)
				break;
			vd.code = KM_OK;
			vd.message[0] = vd.name[0] = '\0';
			lk->check(lk->arg, t->name, by_id ? &t->id : NULL, p->index, KM_RO_WRITE, &vd);
			pl->nparts++;
			if (vd.code != KM_OK) {
				p->code = wire_code(lk, vd.code);
				p->message = build ? arena_strdup(&pl->arena, vd.message) : NULL;
				t->nrefused++;
				pl->nrefused++;
			}
		}
		t->parts_end = rd_pos(&r) - off;
		if (flex)
			rd_skip_tags(&r);
		t->end = rd_pos(&r) - off;
	}
	pl->topics_end = rd_pos(&r) - off;
	if (flex)
		rd_skip_tags(&r);
	if (!r.err && rd_pos(&r) != r.end)
		r.err = KM_ERR_DECODE; /* trailing bytes */
	if (r.err)
		return KM_ERR_DECODE;
	if (km_arena_err(&pl->arena) != KM_OK)
		return km_arena_err(&pl->arena);
	return build && pl->ntopics > 0 && !pl->topics ? KM_ERR_NOMEM : KM_OK;
}

km_err km_ro_produce_walk(struct evbuffer *in, size_t off, size_t len, const km_req_header *h, const km_ro_lookup *lk,
			  km_ro_produce **out)
{
	km_ro_produce count, *pl;
	km_err rc;

	*out = NULL;
	/* Nearly every Produce has nothing refused: that answer costs no allocation. */
	memset(&count, 0, sizeof(count));
	km_arena_init(&count.arena, KM_RO_ARENA_CAP);
	rc = walk(in, off, len, h->api_version, lk, false, &count);
	km_arena_free(&count.arena);
	if (rc != KM_OK || count.nrefused == 0)
		return rc;
	if (!(pl = calloc(1, sizeof(*pl))))
		return KM_ERR_NOMEM;
	km_arena_init(&pl->arena, KM_RO_ARENA_CAP);
	if ((rc = walk(in, off, len, h->api_version, lk, true, pl)) != KM_OK) {
		km_ro_produce_free(pl);
		return rc;
	}
	*out = pl;
	return KM_OK;
}

/* ---- Produce: the rewritten request ---- */

struct km_ro_keeper {
	struct evbuffer *held; /* references the client's input chains, so their bytes outlive its drain */
	unsigned refs;
};

km_ro_keeper *km_ro_keeper_new(struct evbuffer *in)
{
	km_ro_keeper *k;
	if (!in || !(k = calloc(1, sizeof(*k))))
		return NULL;
	k->held = evbuffer_new();
	if (!k->held || evbuffer_add_buffer_reference(k->held, in) != 0) {
		if (k->held)
			evbuffer_free(k->held);
		free(k);
		return NULL;
	}
	k->refs = 1;
	return k;
}

void km_ro_keeper_release(km_ro_keeper *k)
{
	if (k && --k->refs == 0) {
		evbuffer_free(k->held);
		free(k);
	}
}

static void keeper_cleanup(const void *data, size_t len, void *arg)
{
	(void)data;
	(void)len;
	km_ro_keeper_release(arg);
}

/* One piece of a chain: referenced through k when it is large enough, else copied. */
static int put_piece(struct evbuffer *out, const void *p, size_t n, km_ro_keeper *k)
{
	if (k && n >= KM_RO_REF_MIN) {
		k->refs++;
		if (evbuffer_add_reference(out, p, n, keeper_cleanup, k) == 0)
			return 0;
		k->refs--;
	}
	return evbuffer_add(out, p, n);
}

/* n bytes at offset at of in, chain by chain (the range may cross any number of chain boundaries). */
static int put(struct evbuffer *out, struct evbuffer *in, size_t at, size_t n, km_ro_keeper *k)
{
	struct evbuffer_iovec v[8];
	struct evbuffer_ptr ptr;

	if (!n)
		return 0;
	if (evbuffer_ptr_set(in, &ptr, at, EVBUFFER_PTR_SET) != 0)
		return -1;
	while (n) {
		int got = evbuffer_peek(in, (ev_ssize_t)n, &ptr, v, 8);
		size_t done = 0;
		if (got <= 0)
			return -1;
		/* The last extent may run past the range: only n bytes are taken. */
		for (int i = 0; i < got && i < 8 && done < n; i++) {
			size_t take = v[i].iov_len < n - done ? v[i].iov_len : n - done;
			if (put_piece(out, v[i].iov_base, take, k) != 0)
				return -1;
			done += take;
		}
		if (!done)
			return -1;
		n -= done;
		if (n && evbuffer_ptr_set(in, &ptr, done, EVBUFFER_PTR_ADD) != 0)
			return -1;
	}
	return 0;
}

static int put_len(struct evbuffer *out, bool flex, int32_t n)
{
	uint8_t b[8];
	km_wr w;
	km_wr_init_fixed(&w, b, sizeof(b));
	km_wr_array_len(&w, flex, n);
	return km_wr_ok(&w) ? evbuffer_add(out, b, w.len) : -1;
}

km_err km_ro_produce_rewrite(const km_ro_produce *pl, struct evbuffer *in, size_t off, struct evbuffer *out,
			     km_ro_keeper *k)
{
	bool flex = pl->version >= 9;
	int32_t kept_topics = 0;
	int rc = 0;

	if (off > evbuffer_get_length(in) || pl->len > evbuffer_get_length(in) - off)
		return KM_ERR_INVAL;
	for (int32_t i = 0; i < pl->ntopics; i++)
		kept_topics += pl->topics[i].nrefused < pl->topics[i].nparts || pl->topics[i].nparts == 0;
	/* The small parts (header, names, tags) are copied; only kept partitions go through k. */
	rc |= put(out, in, off, pl->head_end, NULL);
	rc |= put_len(out, flex, kept_topics);
	for (int32_t i = 0; i < pl->ntopics && rc == 0; i++) {
		const km_ro_topic *t = &pl->topics[i];
		if (t->nparts > 0 && t->nrefused == t->nparts)
			continue;
		rc |= put(out, in, off + t->start, t->head_end - t->start, NULL);
		rc |= put_len(out, flex, t->nparts - t->nrefused);
		for (int32_t j = 0; j < t->nparts; j++)
			if (t->parts[j].code == KM_OK)
				rc |= put(out, in, off + t->parts[j].start, t->parts[j].end - t->parts[j].start, k);
		rc |= put(out, in, off + t->parts_end, t->end - t->parts_end, NULL);
	}
	rc |= put(out, in, off + pl->topics_end, pl->len - pl->topics_end, NULL);
	return rc == 0 ? KM_OK : KM_ERR_NOMEM;
}

/* ---- Produce: the merged response ---- */

static const km_produce_response_topic_produce_response *find_topic(const km_produce_response *br,
								      const km_ro_topic *t, int16_t v)
{
	for (int32_t i = 0; i < br->responses.count; i++) {
		const km_produce_response_topic_produce_response *bt = &br->responses.items[i];
		if (v >= 13 ? km_uuid_eq(&bt->topic_id, &t->id) : km_str_eq(bt->name, t->name))
			return bt;
	}
	return NULL;
}

km_err km_ro_produce_merge(const km_ro_produce *pl, const uint8_t *body, size_t len, const uint8_t *tail,
			   size_t tlen, km_rewrite_ctx *rw, km_wr *out)
{
	int16_t v = pl->version;
	km_produce_response br, m;
	km_arena a;
	km_wr w;
	km_err rc = KM_OK;

	km_arena_init(&a, KM_ARENA_DEFAULT_CAP);
	km_produce_response_init(&br);
	br.responses.count = 0;
	if (body) {
		km_rd r;
		km_rd_init(&r, body, len);
		rc = km_produce_response_decode(&r, v, &br, &a);
		if (rc == KM_OK && km_rd_left(&r) != 0)
			rc = KM_ERR_DECODE;
	}
	km_produce_response_init(&m);
	m.throttle_time_ms = body ? br.throttle_time_ms : 0;
	m.responses.count = pl->ntopics;
	m.responses.items = pl->ntopics ? km_arena_calloc(&a, (size_t)pl->ntopics * sizeof(*m.responses.items)) : NULL;
	if (rc == KM_OK && pl->ntopics && !m.responses.items)
		rc = KM_ERR_NOMEM;
	for (int32_t i = 0; i < pl->ntopics && rc == KM_OK; i++) {
		const km_ro_topic *t = &pl->topics[i];
		km_produce_response_topic_produce_response *mt = &m.responses.items[i];
		const km_produce_response_topic_produce_response *bt = body ? find_topic(&br, t, v) : NULL;
		km_produce_response_topic_produce_response_init(mt);
		mt->name = t->name;
		mt->topic_id = t->id;
		mt->partition_responses.count = t->nparts;
		mt->partition_responses.items =
			t->nparts ? km_arena_calloc(&a, (size_t)t->nparts * sizeof(*mt->partition_responses.items)) : NULL;
		if (t->nparts && !mt->partition_responses.items) {
			rc = KM_ERR_NOMEM;
			break;
		}
		for (int32_t j = 0; j < t->nparts; j++) {
			const km_ro_part *p = &t->parts[j];
			km_produce_response_partition_produce_response *mp = &mt->partition_responses.items[j];
			const km_produce_response_partition_produce_response *bp = NULL;
			km_produce_response_partition_produce_response_init(mp);
			mp->index = p->index;
			for (int32_t k = 0; p->code == KM_OK && bt && k < bt->partition_responses.count && !bp; k++)
				if (bt->partition_responses.items[k].index == p->index)
					bp = &bt->partition_responses.items[k];
			if (bp) {
				*mp = *bp;
				continue;
			}
			/* Refused here (or, never seen, missing from the broker's answer). */
			mp->error_code = (int16_t)(p->code != KM_OK ? p->code : KM_KAFKA_UNKNOWN_SERVER_ERROR);
			mp->base_offset = -1;
			mp->log_append_time_ms = -1;
			mp->log_start_offset = -1;
			mp->record_errors.count = 0;
			if (v >= 8)
				mp->error_message = km_str_c(p->code != KM_OK ? p->message : "no answer from the broker for this partition");
		}
	}
	if (rc != KM_OK) {
		km_arena_free(&a);
		return rc;
	}
	/* Encoded without top-level tags (their empty section is the last byte), then the broker's own. */
	m.node_endpoints.count = 0;
	km_wr_init(&w);
	km_produce_response_encode(&w, v, &m);
	if (!km_wr_ok(&w))
		rc = w.err != KM_OK ? w.err : KM_ERR_NOMEM;
	else if (v >= 9 && (w.len == 0 || w.buf[w.len - 1] != 0))
		rc = KM_ERR_DECODE;
	if (rc == KM_OK) {
		km_wr_raw(out, w.buf, v >= 9 ? w.len - 1 : w.len);
		if (v >= 9) {
			if (!tail || (tlen == 1 && tail[0] == 0))
				km_wr_uvarint(out, 0);
			else if (v >= 10)
				rc = km_rewrite_node_endpoint_tags(tail, tlen, rw, out);
			else
				km_wr_raw(out, tail, tlen);
		}
	}
	km_wr_free(&w);
	km_arena_free(&a);
	return rc;
}

/* ---- DeleteRecords, DeleteTopics, CreatePartitions ---- */

struct km_ro_admin {
	int16_t key, version;
	int32_t ntopics;
	km_ro_topic *topics;     /* in request order; DeleteRecords: with partitions */
	bool by_id;              /* DeleteTopics v6: topics named by id */
	km_arena arena;
};

void km_ro_admin_free(void *p)
{
	km_ro_admin *ad = p;
	if (!ad)
		return;
	km_arena_free(&ad->arena);
	free(ad);
}

/* Ask the lookup; a refusal's message is kept in the plan. Returns whether it is refused. */
static bool refuse(km_ro_admin *ad, const km_ro_lookup *lk, km_str name, const km_uuid *id, int32_t partition,
		   km_ro_op op, km_err *code, const char **message, km_str *name_out)
{
	km_ro_verdict vd;
	memset(&vd, 0, sizeof(vd));
	lk->check(lk->arg, name, id, partition, op, &vd);
	if (vd.code == KM_OK)
		return false;
	*code = wire_code(lk, vd.code);
	*message = arena_strdup(&ad->arena, vd.message);
	if (name_out && name.len < 0 && vd.name[0])
		*name_out = arena_str(&ad->arena, km_str_c(vd.name));
	return true;
}

static km_err split_delete_records(km_ro_admin *ad, km_rd *r, const km_ro_lookup *lk, size_t *nref, size_t *nall,
				   km_wr *forward)
{
	km_delete_records_request rq, fwd;
	km_err rc;

	km_delete_records_request_init(&rq);
	if ((rc = km_delete_records_request_decode(r, ad->version, &rq, &ad->arena)) != KM_OK)
		return rc;
	fwd = rq;
	fwd.topics.count = 0;
	ad->ntopics = rq.topics.count > 0 ? rq.topics.count : 0;
	ad->topics = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*ad->topics) + 1);
	fwd.topics.items = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*fwd.topics.items) + 1);
	if (!ad->topics || !fwd.topics.items)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		km_delete_records_request_delete_records_topic *rt = &rq.topics.items[i], kept = *rt;
		km_ro_topic *t = &ad->topics[i];
		t->name = arena_str(&ad->arena, rt->name);
		t->nparts = rt->partitions.count > 0 ? rt->partitions.count : 0;
		t->parts = km_arena_calloc(&ad->arena, (size_t)t->nparts * sizeof(*t->parts) + 1);
		kept.partitions.items = km_arena_calloc(&ad->arena, (size_t)t->nparts * sizeof(*kept.partitions.items) + 1);
		if (!t->parts || !kept.partitions.items)
			return KM_ERR_NOMEM;
		kept.partitions.count = 0;
		for (int32_t j = 0; j < t->nparts; j++) {
			km_ro_part *p = &t->parts[j];
			p->index = rt->partitions.items[j].partition_index;
			(*nall)++;
			if (refuse(ad, lk, t->name, NULL, p->index, KM_RO_DELETE_RECORDS, &p->code, &p->message, NULL)) {
				/* DeleteRecords has no message field: only kmirrord's log has it (log_admin). */
				t->nrefused++;
				(*nref)++;
			} else {
				kept.partitions.items[kept.partitions.count++] = rt->partitions.items[j];
			}
		}
		if (kept.partitions.count > 0)
			fwd.topics.items[fwd.topics.count++] = kept;
	}
	if (*nref && *nref < *nall)
		km_delete_records_request_encode(forward, ad->version, &fwd);
	return km_arena_err(&ad->arena);
}

static km_err split_delete_topics(km_ro_admin *ad, km_rd *r, const km_ro_lookup *lk, size_t *nref, size_t *nall,
				  km_wr *forward)
{
	km_delete_topics_request rq, fwd;
	km_err rc;
	int16_t v = ad->version;

	km_delete_topics_request_init(&rq);
	if ((rc = km_delete_topics_request_decode(r, v, &rq, &ad->arena)) != KM_OK)
		return rc;
	fwd = rq;
	ad->by_id = v >= 6;
	ad->ntopics = v >= 6 ? rq.topics.count : rq.topic_names.count;
	if (ad->ntopics < 0)
		ad->ntopics = 0;
	ad->topics = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*ad->topics) + 1);
	if (v >= 6) {
		fwd.topics.count = 0;
		fwd.topics.items = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*fwd.topics.items) + 1);
	} else {
		fwd.topic_names.count = 0;
		fwd.topic_names.items = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(km_str) + 1);
	}
	if (!ad->topics || (v >= 6 ? !fwd.topics.items : !fwd.topic_names.items))
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		km_ro_topic *t = &ad->topics[i];
		bool by_id = v >= 6 && rq.topics.items[i].name.len < 0;
		t->name = arena_str(&ad->arena, v >= 6 ? rq.topics.items[i].name : rq.topic_names.items[i]);
		if (v >= 6)
			t->id = rq.topics.items[i].topic_id;
		(*nall)++;
		if (refuse(ad, lk, t->name, by_id ? &t->id : NULL, -1, KM_RO_DELETE_TOPIC, &t->code, &t->message,
			   &t->name)) {
			(*nref)++;
			t->nrefused = 1;
		} else if (v >= 6) {
			fwd.topics.items[fwd.topics.count++] = rq.topics.items[i];
		} else {
			fwd.topic_names.items[fwd.topic_names.count++] = rq.topic_names.items[i];
		}
	}
	if (*nref && *nref < *nall)
		km_delete_topics_request_encode(forward, v, &fwd);
	return km_arena_err(&ad->arena);
}

static km_err split_create_partitions(km_ro_admin *ad, km_rd *r, const km_ro_lookup *lk, size_t *nref, size_t *nall,
				      km_wr *forward)
{
	km_create_partitions_request rq, fwd;
	km_err rc;

	km_create_partitions_request_init(&rq);
	if ((rc = km_create_partitions_request_decode(r, ad->version, &rq, &ad->arena)) != KM_OK)
		return rc;
	fwd = rq;
	fwd.topics.count = 0;
	ad->ntopics = rq.topics.count > 0 ? rq.topics.count : 0;
	ad->topics = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*ad->topics) + 1);
	fwd.topics.items = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*fwd.topics.items) + 1);
	if (!ad->topics || !fwd.topics.items)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		km_ro_topic *t = &ad->topics[i];
		t->name = arena_str(&ad->arena, rq.topics.items[i].name);
		(*nall)++;
		if (refuse(ad, lk, t->name, NULL, -1, KM_RO_CREATE_PARTITIONS, &t->code, &t->message, NULL)) {
			(*nref)++;
			t->nrefused = 1;
		} else {
			fwd.topics.items[fwd.topics.count++] = rq.topics.items[i];
		}
	}
	if (*nref && *nref < *nall)
		km_create_partitions_request_encode(forward, ad->version, &fwd);
	return km_arena_err(&ad->arena);
}

/* CreateTopics: only the state topic is refused (a mirror topic exists already: the broker says so itself). */
static km_err split_create_topics(km_ro_admin *ad, km_rd *r, const km_ro_lookup *lk, size_t *nref, size_t *nall,
				  km_wr *forward)
{
	km_create_topics_request rq, fwd;
	km_err rc;

	km_create_topics_request_init(&rq);
	if ((rc = km_create_topics_request_decode(r, ad->version, &rq, &ad->arena)) != KM_OK)
		return rc;
	fwd = rq;
	fwd.topics.count = 0;
	ad->ntopics = rq.topics.count > 0 ? rq.topics.count : 0;
	ad->topics = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*ad->topics) + 1);
	fwd.topics.items = km_arena_calloc(&ad->arena, (size_t)ad->ntopics * sizeof(*fwd.topics.items) + 1);
	if (!ad->topics || !fwd.topics.items)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		km_ro_topic *t = &ad->topics[i];
		t->name = arena_str(&ad->arena, rq.topics.items[i].name);
		(*nall)++;
		if (refuse(ad, lk, t->name, NULL, -1, KM_RO_CREATE_TOPIC, &t->code, &t->message, NULL)) {
			(*nref)++;
			t->nrefused = 1;
		} else {
			fwd.topics.items[fwd.topics.count++] = rq.topics.items[i];
		}
	}
	if (*nref && *nref < *nall)
		km_create_topics_request_encode(forward, ad->version, &fwd);
	return km_arena_err(&ad->arena);
}

km_err km_ro_admin_split(int16_t key, int16_t version, const uint8_t *body, size_t len, const km_ro_lookup *lk,
			 km_ro_admin **out, km_wr *forward)
{
	km_ro_admin *ad = calloc(1, sizeof(*ad));
	size_t nref = 0, nall = 0;
	km_rd r;
	km_err rc;

	*out = NULL;
	if (!ad)
		return KM_ERR_NOMEM;
	km_arena_init(&ad->arena, KM_RO_ARENA_CAP);
	ad->key = key;
	ad->version = version;
	km_rd_init(&r, body, len);
	switch (key) {
	case KM_API_DELETE_RECORDS:
		rc = split_delete_records(ad, &r, lk, &nref, &nall, forward);
		break;
	case KM_API_DELETE_TOPICS:
		rc = split_delete_topics(ad, &r, lk, &nref, &nall, forward);
		break;
	case KM_API_CREATE_PARTITIONS:
		rc = split_create_partitions(ad, &r, lk, &nref, &nall, forward);
		break;
	case KM_API_CREATE_TOPICS:
		rc = split_create_topics(ad, &r, lk, &nref, &nall, forward);
		break;
	default:
		rc = KM_ERR_UNSUPPORTED;
	}
	if (rc == KM_OK && km_rd_left(&r) != 0)
		rc = KM_ERR_DECODE;
	if (rc == KM_OK && !km_wr_ok(forward))
		rc = forward->err;
	if (rc != KM_OK || nref == 0) {
		km_ro_admin_free(ad);
		return rc;
	}
	*out = ad;
	return KM_OK;
}

static km_err merge_delete_records(const km_ro_admin *ad, const uint8_t *body, size_t len, km_arena *a, km_wr *out)
{
	km_delete_records_response br, m;
	km_err rc = KM_OK;

	km_delete_records_response_init(&br);
	br.topics.count = 0;
	if (body) {
		km_rd r;
		km_rd_init(&r, body, len);
		if ((rc = km_delete_records_response_decode(&r, ad->version, &br, a)) != KM_OK)
			return rc;
	}
	m = br;
	m.topics.count = ad->ntopics;
	m.topics.items = km_arena_calloc(a, (size_t)ad->ntopics * sizeof(*m.topics.items) + 1);
	if (!m.topics.items)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		const km_ro_topic *t = &ad->topics[i];
		km_delete_records_response_delete_records_topic_result *mt = &m.topics.items[i], *bt = NULL;
		for (int32_t k = 0; k < br.topics.count && !bt; k++)
			if (km_str_eq(br.topics.items[k].name, t->name))
				bt = &br.topics.items[k];
		km_delete_records_response_delete_records_topic_result_init(mt);
		mt->name = t->name;
		mt->partitions.count = t->nparts;
		mt->partitions.items = km_arena_calloc(a, (size_t)t->nparts * sizeof(*mt->partitions.items) + 1);
		if (!mt->partitions.items)
			return KM_ERR_NOMEM;
		for (int32_t j = 0; j < t->nparts; j++) {
			km_delete_records_response_delete_records_partition_result *mp = &mt->partitions.items[j], *bp = NULL;
			for (int32_t k = 0; t->parts[j].code == KM_OK && bt && k < bt->partitions.count && !bp; k++)
				if (bt->partitions.items[k].partition_index == t->parts[j].index)
					bp = &bt->partitions.items[k];
			if (bp) {
				*mp = *bp;
				continue;
			}
			km_delete_records_response_delete_records_partition_result_init(mp);
			mp->partition_index = t->parts[j].index;
			mp->low_watermark = -1;
			mp->error_code = (int16_t)(t->parts[j].code != KM_OK ? t->parts[j].code : KM_KAFKA_UNKNOWN_SERVER_ERROR);
		}
	}
	km_delete_records_response_encode(out, ad->version, &m);
	return rc;
}

static km_err merge_delete_topics(const km_ro_admin *ad, const uint8_t *body, size_t len, km_arena *a, km_wr *out)
{
	km_delete_topics_response br, m;
	km_err rc;

	km_delete_topics_response_init(&br);
	br.responses.count = 0;
	if (body) {
		km_rd r;
		km_rd_init(&r, body, len);
		if ((rc = km_delete_topics_response_decode(&r, ad->version, &br, a)) != KM_OK)
			return rc;
	}
	m = br;
	m.responses.count = ad->ntopics;
	m.responses.items = km_arena_calloc(a, (size_t)ad->ntopics * sizeof(*m.responses.items) + 1);
	if (!m.responses.items)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		const km_ro_topic *t = &ad->topics[i];
		km_delete_topics_response_deletable_topic_result *mt = &m.responses.items[i], *bt = NULL;
		bool named = t->name.len >= 0 && t->code == KM_OK;
		for (int32_t k = 0; t->code == KM_OK && k < br.responses.count && !bt; k++) {
			const km_delete_topics_response_deletable_topic_result *c = &br.responses.items[k];
			if (named ? km_str_eq(c->name, t->name) : km_uuid_eq(&c->topic_id, &t->id))
				bt = &br.responses.items[k];
		}
		if (bt) {
			*mt = *bt;
			continue;
		}
		km_delete_topics_response_deletable_topic_result_init(mt);
		mt->name = t->name;
		mt->topic_id = t->id;
		mt->error_code = (int16_t)(t->code != KM_OK ? t->code : KM_KAFKA_UNKNOWN_SERVER_ERROR);
		/* Before v5 there is no message field: only kmirrord's log has it (log_admin). */
		if (ad->version >= 5)
			mt->error_message = km_str_c(t->code != KM_OK ? t->message : "no answer from the broker for this topic");
	}
	km_delete_topics_response_encode(out, ad->version, &m);
	return KM_OK;
}

static km_err merge_create_partitions(const km_ro_admin *ad, const uint8_t *body, size_t len, km_arena *a, km_wr *out)
{
	km_create_partitions_response br, m;
	km_err rc;

	km_create_partitions_response_init(&br);
	br.results.count = 0;
	if (body) {
		km_rd r;
		km_rd_init(&r, body, len);
		if ((rc = km_create_partitions_response_decode(&r, ad->version, &br, a)) != KM_OK)
			return rc;
	}
	m = br;
	m.results.count = ad->ntopics;
	m.results.items = km_arena_calloc(a, (size_t)ad->ntopics * sizeof(*m.results.items) + 1);
	if (!m.results.items)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		const km_ro_topic *t = &ad->topics[i];
		km_create_partitions_response_create_partitions_topic_result *mt = &m.results.items[i], *bt = NULL;
		for (int32_t k = 0; t->code == KM_OK && k < br.results.count && !bt; k++)
			if (km_str_eq(br.results.items[k].name, t->name))
				bt = &br.results.items[k];
		if (bt) {
			*mt = *bt;
			continue;
		}
		km_create_partitions_response_create_partitions_topic_result_init(mt);
		mt->name = t->name;
		mt->error_code = (int16_t)(t->code != KM_OK ? t->code : KM_KAFKA_UNKNOWN_SERVER_ERROR);
		mt->error_message = km_str_c(t->code != KM_OK ? t->message : "no answer from the broker for this topic");
	}
	km_create_partitions_response_encode(out, ad->version, &m);
	return KM_OK;
}

static km_err merge_create_topics(const km_ro_admin *ad, const uint8_t *body, size_t len, km_arena *a, km_wr *out)
{
	km_create_topics_response br, m;
	km_err rc;

	km_create_topics_response_init(&br);
	br.topics.count = 0;
	if (body) {
		km_rd r;
		km_rd_init(&r, body, len);
		if ((rc = km_create_topics_response_decode(&r, ad->version, &br, a)) != KM_OK)
			return rc;
	}
	m = br;
	m.topics.count = ad->ntopics;
	m.topics.items = km_arena_calloc(a, (size_t)ad->ntopics * sizeof(*m.topics.items) + 1);
	if (!m.topics.items)
		return KM_ERR_NOMEM;
	for (int32_t i = 0; i < ad->ntopics; i++) {
		const km_ro_topic *t = &ad->topics[i];
		km_create_topics_response_creatable_topic_result *mt = &m.topics.items[i], *bt = NULL;
		for (int32_t k = 0; t->code == KM_OK && k < br.topics.count && !bt; k++)
			if (km_str_eq(br.topics.items[k].name, t->name))
				bt = &br.topics.items[k];
		if (bt) {
			*mt = *bt;
			continue;
		}
		km_create_topics_response_creatable_topic_result_init(mt);
		mt->name = t->name;
		mt->error_code = (int16_t)(t->code != KM_OK ? t->code : KM_KAFKA_UNKNOWN_SERVER_ERROR);
		/* v0 has no message field: only kmirrord's log has it (log_admin). */
		if (ad->version >= 1)
			mt->error_message = km_str_c(t->code != KM_OK ? t->message : "no answer from the broker for this topic");
	}
	km_create_topics_response_encode(out, ad->version, &m);
	return KM_OK;
}

km_err km_ro_admin_merge(const km_ro_admin *ad, const uint8_t *body, size_t len, km_wr *out)
{
	km_arena a;
	km_err rc;

	km_arena_init(&a, KM_ARENA_DEFAULT_CAP);
	switch (ad->key) {
	case KM_API_DELETE_RECORDS:
		rc = merge_delete_records(ad, body, len, &a, out);
		break;
	case KM_API_DELETE_TOPICS:
		rc = merge_delete_topics(ad, body, len, &a, out);
		break;
	case KM_API_CREATE_TOPICS:
		rc = merge_create_topics(ad, body, len, &a, out);
		break;
	default:
		rc = merge_create_partitions(ad, body, len, &a, out);
		break;
	}
	if (rc == KM_OK && !km_wr_ok(out))
		rc = out->err;
	km_arena_free(&a);
	return rc;
}

/* Every refused resource of an admin request, one line each (readonly_log.c has the others). */
static void log_admin(const km_req *rq, const km_ro_admin *ad)
{
	for (int32_t i = 0; i < ad->ntopics; i++) {
		const km_ro_topic *t = &ad->topics[i];
		if (ad->key == KM_API_DELETE_RECORDS) {
			for (int32_t j = 0; j < t->nparts; j++)
				if (t->parts[j].code != KM_OK) {
					km_ro_log_refusal(rq, KM_RO_DELETE_RECORDS, t->name, NULL, t->parts, t->nparts,
							  t->parts[j].code, t->parts[j].message, NULL);
					break;
				}
		} else if (t->code != KM_OK) {
			km_ro_log_refusal(rq,
					  ad->key == KM_API_DELETE_TOPICS   ? KM_RO_DELETE_TOPIC
					  : ad->key == KM_API_CREATE_TOPICS ? KM_RO_CREATE_TOPIC
									    : KM_RO_CREATE_PARTITIONS,
					  t->name, ad->by_id ? &t->id : NULL, NULL, 0, t->code, t->message, NULL);
		}
	}
}

/* ---- the hooks ---- */

static const km_ro_lookup *lookup_of(const km_req *rq)
{
	return &km_proxy_features_of(rq->s)->read_only;
}

/* A merged response: the broker's size prefix and header replaced around the new body. */
static km_err send_merged(km_resp *rs, const uint8_t *frame, const km_wr *body)
{
	uint8_t pre[4];
	size_t end = rs->frame_len + 4;
	if (rs->body_off - 4 + body->len > INT32_MAX)
		return KM_ERR_TOO_LARGE;
	km_put_be32(pre, (uint32_t)(rs->body_off - 4 + body->len));
	if (evbuffer_add(rs->out, pre, 4) != 0 || evbuffer_add(rs->out, frame + 4, rs->body_off - 4) != 0 ||
	    evbuffer_add(rs->out, body->buf, body->len) != 0)
		return KM_ERR_NOMEM;
	evbuffer_drain(rs->in, end);
	return KM_OK;
}

static km_err ro_produce_response(km_resp *rs)
{
	const km_ro_produce *pl = rs->ctx;
	size_t end = rs->frame_len + 4, tags_off = end;
	const uint8_t *frame;
	km_wr w;
	km_err rc = KM_OK;

	if (rs->version >= 9 && (rc = km_rewrite_produce_top_tags(rs->in, 0, end, rs->version, &tags_off)) != KM_OK)
		return rc;
	if (!(frame = evbuffer_pullup(rs->in, (ev_ssize_t)end)))
		return KM_ERR_NOMEM;
	km_wr_init(&w);
	rc = km_ro_produce_merge(pl, frame + rs->body_off, end - rs->body_off, rs->version >= 9 ? frame + tags_off : NULL,
				 end - tags_off, rs->rw, &w);
	if (rc == KM_OK && !km_wr_ok(&w))
		rc = w.err;
	if (rc == KM_OK)
		rc = send_merged(rs, frame, &w);
	km_wr_free(&w);
	return rc;
}

static km_err answer_with(km_req *rq, km_wr *w)
{
	if (!km_wr_ok(w))
		return w->err;
	rq->answer = evbuffer_new();
	if (!rq->answer || evbuffer_add(rq->answer, w->buf, w->len) != 0)
		return KM_ERR_NOMEM;
	return KM_OK;
}

static km_err ro_produce_classify(km_req *rq)
{
	/* With no store (no mirrors), Produce stays cut-through: this test is all it costs. */
	if (km_ro_active(lookup_of(rq)))
		rq->action = KM_REQ_HOLD;
	return KM_OK;
}

static km_err ro_produce_request(km_req *rq)
{
	const km_ro_lookup *lk = lookup_of(rq);
	km_ro_produce *pl = NULL;
	km_ro_keeper *k;
	km_err rc;

	if (!km_ro_active(lk))
		return KM_OK; /* no longer (the store changed since classify): forwarded as it is */
	/* The row reads in place: the frame is in rq->in's chains, never pulled up into one piece. */
	rc = km_ro_produce_walk(rq->in, rq->in_off, rq->frame_len, rq->h, lk, &pl);
	if (rc != KM_OK) {
		rq->close_reason = "malformed Produce request";
		return rc;
	}
	if (!pl)
		return KM_OK; /* nothing refused (the common case): forwarded as it is, moved like a FORWARD row's frame */
	KM_DEBUG("proxy", km_session_id(rq->s), "Produce v%d (correlation id %d): %zu of %zu partitions refused",
		 rq->h->api_version, rq->h->correlation_id, pl->nrefused, pl->nparts);
	km_ro_log_produce(rq, pl);
	if (pl->nrefused == pl->nparts && pl->acks != 0) {
		km_wr w;
		km_wr_init(&w);
		rc = km_ro_produce_merge(pl, NULL, 0, NULL, 0, NULL, &w);
		if (rc == KM_OK)
			rc = answer_with(rq, &w);
		km_wr_free(&w);
		km_ro_produce_free(pl);
		return rc;
	}
	/* acks=0 with nothing left still goes up, empty: the frame must go somewhere, and no answer is due. */
	if (!(rq->rewritten = evbuffer_new())) {
		km_ro_produce_free(pl);
		return KM_ERR_NOMEM;
	}
	k = km_ro_keeper_new(rq->in);
	rc = km_ro_produce_rewrite(pl, rq->in, rq->in_off, rq->rewritten, k);
	km_ro_keeper_release(k);
	if (rc != KM_OK || pl->acks == 0) {
		km_ro_produce_free(pl);
		return rc;
	}
	rq->ctx = pl;
	rq->ctx_free = km_ro_produce_free;
	rq->on_response = ro_produce_response;
	rq->resp = KM_RESP_WHOLE;
	return KM_OK;
}

static km_err ro_admin_response(km_resp *rs)
{
	size_t end = rs->frame_len + 4;
	const uint8_t *frame = evbuffer_pullup(rs->in, (ev_ssize_t)end);
	km_wr w;
	km_err rc;

	if (!frame)
		return KM_ERR_NOMEM;
	km_wr_init(&w);
	rc = km_ro_admin_merge(rs->ctx, frame + rs->body_off, end - rs->body_off, &w);
	if (rc == KM_OK)
		rc = send_merged(rs, frame, &w);
	km_wr_free(&w);
	return rc;
}

static km_err ro_admin_request(km_req *rq)
{
	const km_ro_lookup *lk = lookup_of(rq);
	km_ro_admin *ad = NULL;
	km_req_header full;
	size_t off;
	km_wr fwd;
	km_err rc;

	if (!km_ro_active(lk))
		return KM_OK;
	if (km_net_parse_request_header(rq->body, rq->frame_len,
					km_proxy_request_header_version(rq->h->api_key, rq->h->api_version), &full) != KM_OK) {
		rq->close_reason = "malformed request header";
		return KM_ERR_DECODE;
	}
	off = full.body_offset;
	km_wr_init(&fwd);
	rc = km_ro_admin_split(rq->h->api_key, rq->h->api_version, rq->body + off, rq->frame_len - off, lk, &ad, &fwd);
	if (rc != KM_OK || !ad) {
		if (rc != KM_OK)
			rq->close_reason = "malformed request";
		km_wr_free(&fwd);
		return rc;
	}
	log_admin(rq, ad);
	if (fwd.len == 0) {
		km_wr w;
		km_wr_init(&w);
		rc = km_ro_admin_merge(ad, NULL, 0, &w);
		if (rc == KM_OK)
			rc = answer_with(rq, &w);
		km_wr_free(&w);
		km_ro_admin_free(ad);
	} else if (!(rq->rewritten = evbuffer_new()) || evbuffer_add(rq->rewritten, rq->body, off) != 0 ||
		   evbuffer_add(rq->rewritten, fwd.buf, fwd.len) != 0) {
		km_ro_admin_free(ad);
		rc = KM_ERR_NOMEM;
	} else {
		rq->ctx = ad;
		rq->ctx_free = km_ro_admin_free;
		rq->on_response = ro_admin_response;
		rq->resp = KM_RESP_WHOLE;
	}
	km_wr_free(&fwd);
	return rc;
}

/* Held while there is a store to guard (the state topic always, mirror topics while read-only). */
static km_err ro_admin_classify(km_req *rq)
{
	if (km_ro_active(lookup_of(rq)))
		rq->action = KM_REQ_HOLD;
	return KM_OK;
}

/* ---- AddPartitionsToTxn (v0-3, the clients' path) ---- */

km_err km_ro_add_partitions_check(int16_t version, const uint8_t *body, size_t len, const km_ro_lookup *lk,
				  km_wr *answer, km_ro_verdict *first)
{
	km_add_partitions_to_txn_request rq;
	km_add_partitions_to_txn_response rs;
	km_arena a;
	km_rd r;
	int32_t nt;
	bool refused = false;
	km_err rc;

	first->code = KM_OK;
	km_arena_init(&a, KM_ARENA_DEFAULT_CAP);
	km_rd_init(&r, body, len);
	km_add_partitions_to_txn_request_init(&rq);
	if ((rc = km_add_partitions_to_txn_request_decode(&r, version, &rq, &a)) == KM_OK && km_rd_left(&r) != 0)
		rc = KM_ERR_DECODE;
	nt = rq.v3_and_below_topics.count > 0 ? rq.v3_and_below_topics.count : 0;
	km_add_partitions_to_txn_response_init(&rs);
	rs.results_by_topic_v3_and_below.count = nt;
	rs.results_by_topic_v3_and_below.items = km_arena_calloc(&a, (size_t)nt * sizeof(*rs.results_by_topic_v3_and_below.items) + 1);
	if (rc == KM_OK && !rs.results_by_topic_v3_and_below.items)
		rc = KM_ERR_NOMEM;
	for (int32_t i = 0; rc == KM_OK && i < nt; i++) {
		const km_add_partitions_to_txn_request_add_partitions_to_txn_topic *t = &rq.v3_and_below_topics.items[i];
		km_add_partitions_to_txn_response_add_partitions_to_txn_topic_result *tr = &rs.results_by_topic_v3_and_below.items[i];
		int32_t np = t->partitions.count > 0 ? t->partitions.count : 0;
		km_add_partitions_to_txn_response_add_partitions_to_txn_topic_result_init(tr);
		tr->name = t->name;
		tr->results_by_partition.count = np;
		tr->results_by_partition.items = km_arena_calloc(&a, (size_t)np * sizeof(*tr->results_by_partition.items) + 1);
		if (!tr->results_by_partition.items) {
			rc = KM_ERR_NOMEM;
			break;
		}
		for (int32_t j = 0; j < np; j++) {
			km_add_partitions_to_txn_response_add_partitions_to_txn_partition_result *pr = &tr->results_by_partition.items[j];
			km_ro_verdict vd;
			memset(&vd, 0, sizeof(vd));
			lk->check(lk->arg, t->name, NULL, t->partitions.items[j], KM_RO_WRITE, &vd);
			km_add_partitions_to_txn_response_add_partitions_to_txn_partition_result_init(pr);
			pr->partition_index = t->partitions.items[j];
			/*
			 * All or nothing, as the coordinator answers: the others were not attempted. The
			 * refusal is TOPIC_AUTHORIZATION_FAILED whatever read_only_error says: the one code
			 * the Java and librdkafka producers take as abortable here (the application aborts
			 * and goes on); any other makes their producer fail fatally.
			 */
			pr->partition_error_code = (int16_t)(vd.code != KM_OK ? KM_KAFKA_TOPIC_AUTHORIZATION_FAILED :
									 KM_KAFKA_OPERATION_NOT_ATTEMPTED);
			if (vd.code != KM_OK && !refused) {
				refused = true;
				*first = vd;
				first->code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
			}
		}
	}
	if (rc == KM_OK && refused)
		km_add_partitions_to_txn_response_encode(answer, version, &rs);
	km_arena_free(&a);
	return rc;
}

static km_err ro_txn_request(km_req *rq)
{
	km_ro_lookup lk = *lookup_of(rq);
	km_req_header full;
	km_ro_verdict first;
	km_wr w;
	km_err rc;

	if (!km_ro_active(&lk))
		return KM_OK;
	if (km_net_parse_request_header(rq->body, rq->frame_len,
					km_proxy_request_header_version(rq->h->api_key, rq->h->api_version), &full) != KM_OK) {
		rq->close_reason = "malformed request header";
		return KM_ERR_DECODE;
	}
	km_wr_init(&w);
	rc = km_ro_add_partitions_check(rq->h->api_version, rq->body + full.body_offset, rq->frame_len - full.body_offset,
					&lk, &w, &first);
	if (rc != KM_OK)
		rq->close_reason = "malformed AddPartitionsToTxn request";
	else if (first.code != KM_OK) {
		km_ro_log_refusal(rq, KM_RO_ADD_TO_TXN, km_str_c(first.name), NULL, NULL, 0, first.code, first.message,
				  "the transaction's marker would be written into it");
		rc = answer_with(rq, &w);
	}
	km_wr_free(&w);
	return rc;
}

/* ---- the stages ---- */

static const km_proxy_stage stages[] = {
	{.key = KM_API_PRODUCE, .classify = ro_produce_classify, .on_request = ro_produce_request, .in_place = true,
	 .note = "held, split and merged (read in place, not copied): the state topic refused always, mirror topics while read-only"},
	{.key = KM_API_DELETE_TOPICS, .classify = ro_admin_classify, .on_request = ro_admin_request,
	 .note = "mirror topics (unless every partition is STOPPED) and the state topic refused; the rest forwarded, merged"},
	{.key = KM_API_DELETE_RECORDS, .classify = ro_admin_classify, .on_request = ro_admin_request,
	 .note = "partitions of read-only mirror topics and of the state topic refused; the rest forwarded, merged"},
	{.key = KM_API_CREATE_PARTITIONS, .classify = ro_admin_classify, .on_request = ro_admin_request,
	 .note = "mirror topics (their partitions follow the source) and the state topic refused; the rest forwarded, merged"},
	{.key = KM_API_ADD_PARTITIONS_TO_TXN, .versions = true, .min_version = -1, .max_version = 3,
	 .classify = ro_admin_classify, .on_request = ro_txn_request,
	 .note = "up to v3 (v4+ is the brokers' own); a transaction adding a read-only mirror partition refused (its marker "
		 "would be written there), the others OPERATION_NOT_ATTEMPTED"},
	{.key = KM_API_CREATE_TOPICS, .classify = ro_admin_classify, .on_request = ro_admin_request,
	 .note = "the state topic refused (kmirrord creates it, compacted); the rest forwarded, merged"},
};

const km_proxy_feature km_ro_feature = {"read-only", stages, sizeof(stages) / sizeof(stages[0]), .needs_state = true};

/* ---- the lookup over the state store ---- */

/* The state topic is guarded whatever is read-only: with a store, every Produce and admin request is looked at. */
static bool state_active(void *arg)
{
	return arg != NULL;
}

static void state_check(void *arg, km_str name, const km_uuid *id, int32_t partition, km_ro_op op, km_ro_verdict *v)
{
	km_state *st = arg;
	const char *store = km_state_topic_name_of_store(st);
	const km_state_topic *t = id ? km_state_topic_find_id(st, id) : km_state_topic_find(st, name.p, (size_t)name.len);
	const km_state_mirror *m;
	const char *mirror, *topic;
	bool refuse;

	v->code = KM_OK;
	v->message[0] = v->name[0] = '\0';
	if ((!id && store && km_str_eq_c(name, store)) || (id && km_state_is_store_topic_id(st, id))) {
		v->code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
		snprintf(v->message, sizeof(v->message), "%s is written, deleted and configured only by kmirrord", store);
		return;
	}
	if (!t || op == KM_RO_CREATE_TOPIC)
		return;
	refuse = partition >= 0 ? km_state_topic_read_only(t, partition) : km_state_topic_state(t) != KM_MP_STOPPED;
	if (!refuse)
		return;
	m = km_state_topic_mirror(t);
	mirror = km_state_mirror_name(m);
	topic = km_state_topic_name(t);
	snprintf(v->name, sizeof(v->name), "%s", topic);
	v->code = KM_MIRROR_READ_ONLY_TOPIC;
	switch (op) {
	case KM_RO_CREATE_PARTITIONS:
		snprintf(v->message, sizeof(v->message),
			 "topic %s is mirrored by mirror %s from %s: its partitions follow its source topic's", topic,
			 mirror, km_state_mirror_source(m));
		break;
	case KM_RO_DELETE_TOPIC:
		snprintf(v->message, sizeof(v->message),
			 "topic %s is mirrored by mirror %s from %s and cannot be deleted while it is %s; stop its "
			 "mirroring first (kmirror stop --mirror %s --topics %s)",
			 topic, mirror, km_state_mirror_source(m), km_mp_state_name(km_state_topic_state(t)), mirror, topic);
		break;
	default:
		snprintf(v->message, sizeof(v->message),
			 "topic %s is a read-only mirror of topic %s on the Kafka cluster at %s (mirror %s): write to "
			 "that cluster; this topic takes writes only after a failover to this cluster",
			 topic, topic, km_state_mirror_source(m), mirror);
		break;
	}
}

void km_ro_lookup_from_state(km_state *st, km_ro_lookup *out)
{
	out->active = st ? state_active : NULL;
	out->check = st ? state_check : NULL;
	out->arg = st;
}
