/*
 * log_fetch_topics: one log line per partition of a Fetch answer about a listed mirror topic, as
 * the proxy translated it (docs/proxy.md, "Tracing Fetch answers"). For finding out why a
 * consumer skipped or read again records of a mirror topic; each answer costs a line.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/batch.h"
#include "kmirror/log.h"
#include "kmirror/net.h"
#include "kmirror/wire.h"
#include "proxy/offsets.h"

#define TRACE_CAP 4096
#define TRACE_ABORTED 16

struct km_off_trace {
	char line[TRACE_CAP];
	size_t len;
	/* The aborted transactions as the broker sent them (pid, first offset), read before they are patched. */
	int64_t aborted[TRACE_ABORTED][2];
	int32_t naborted;
	bool active; /* the current partition's line is open */
	int nbatches; /* on the line */
};

static void add(km_off_trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(km_off_trace *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->len >= TRACE_CAP - 1)
		return;
	va_start(ap, fmt);
	n = vsnprintf(t->line + t->len, TRACE_CAP - t->len, fmt, ap);
	va_end(ap);
	t->len = n < 0 ? t->len : t->len + (size_t)n >= TRACE_CAP ? TRACE_CAP - 1 : t->len + (size_t)n;
}

static void flush(km_off_req *c)
{
	if (c->trace && c->trace->len) {
		KM_INFO("fetch-trace", 0, "%s%s", c->trace->line, c->trace->len >= TRACE_CAP - 1 ? " (cut)" : "");
		c->trace->len = 0;
	}
	if (c->trace)
		c->trace->active = false;
}

void km_off_trace_free(km_off_req *c)
{
	flush(c);
	free(c->trace);
	c->trace = NULL;
}

/* Whether the current partition's topic is in log_fetch_topics (names separated by commas, spaces around them ignored). */
static bool traced(km_off_req *c)
{
	const char *list = c->lk->trace_topics, *name, *p;
	size_t n;

	if (!list || !*list || !c->cur_topic || !c->lk->name || !(name = c->lk->name(c->lk->arg, c->cur_topic)))
		return false;
	n = strlen(name);
	for (p = list; *p;) {
		const char *end = strchr(p, ','), *stop = end ? end : p + strlen(p);
		while (p < stop && *p == ' ')
			p++;
		while (stop > p && stop[-1] == ' ')
			stop--;
		if ((size_t)(stop - p) == n && memcmp(p, name, n) == 0)
			return true;
		if (!end)
			break;
		p = end + 1;
	}
	return false;
}

/* The partition's aborted transactions (ProducerId, FirstOffset) as they stand in the answer now: how many read. */
static int32_t read_aborted(const km_fetch_walk *w, struct evbuffer *in, size_t first, int64_t out[][2])
{
	const km_fetch_part *p = &w->part;
	km_evrd r;
	int32_t n = 0;

	km_evrd_init(&r, in, p->aborted_off - first, p->records_off - first);
	for (; n < p->aborted_count && n < TRACE_ABORTED; n++) {
		uint8_t b[16];
		if (!km_evrd_raw(&r, b, sizeof(b)) || (w->version >= 12 && !km_evrd_skip_tags(&r)))
			break;
		out[n][0] = (int64_t)km_be64(b);
		out[n][1] = (int64_t)km_be64(b + 8);
	}
	return n;
}

void km_off_trace_part_before(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first)
{
	if (!c || !c->lk->trace_topics || !*c->lk->trace_topics)
		return;
	flush(c);
	if (!c->trace && !(c->trace = calloc(1, sizeof(*c->trace))))
		return;
	c->trace->naborted = read_aborted(w, in, first, c->trace->aborted);
}

bool km_off_trace_active(const km_off_req *c)
{
	return c && c->trace && c->trace->active && c->cur;
}

void km_off_trace_part(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first)
{
	const km_fetch_part *p = &w->part;
	const km_offmap *m;
	km_off_trace *t;
	uint8_t f[24];
	int64_t shown[TRACE_ABORTED][2];
	int32_t nshown;

	/* An answer with nothing in it (a long poll's end) says nothing: left out. */
	if (!c || !(t = c->trace) || !(m = c->cur) || (!p->records_len && !p->error_code && p->aborted_count <= 0) ||
	    !traced(c))
		return;
	t->active = true;
	t->nbatches = 0;
	add(t, "%s/%" PRId32 ": asked %" PRId64 " (destination %" PRId64 "), tail %" PRId64 "/%" PRId64
	       ", runs %zu, error %d",
	    c->lk->name(c->lk->arg, c->cur_topic), p->partition, c->ref, c->ref_sent, m->tail_logical,
	    m->tail_physical, m->n, (int)p->error_code);
	if (km_off_peek(w, in, first, p->high_watermark_off, f, w->version >= 5 ? 24 : 16) == KM_OK)
		add(t, ", hw %" PRId64 " (%" PRId64 "), lso %" PRId64 " (%" PRId64 ")", (int64_t)km_be64(f),
		    p->high_watermark, (int64_t)km_be64(f + 8), p->last_stable_offset);
	add(t, ", aborted [");
	nshown = read_aborted(w, in, first, shown);
	for (int32_t a = 0; a < t->naborted && a < nshown; a++)
		add(t, "%s%" PRId64 "@%" PRId64 " as %" PRId64 "@%" PRId64, a ? ", " : "", t->aborted[a][0],
		    t->aborted[a][1], shown[a][0], shown[a][1]);
	if (p->aborted_count > t->naborted)
		add(t, ", %" PRId32 " more", p->aborted_count - t->naborted);
	add(t, "], records %zu bytes%s, batches:", p->records_len, c->blanked ? " (blanked)" : "");
}

/*
 * A batch, read before it is patched: its destination offset, producer and kind. KM_STREAM_AGAIN
 * while its header (and a control batch whole) has not come yet: the event comes again.
 */
km_err km_off_trace_batch_before(const km_fetch_walk *w, struct evbuffer *in, size_t first, km_off_trace_rec *out)
{
	const km_fetch_batch *b = &w->batch;
	uint8_t h[KM_BATCH_HEADER_SIZE], whole[256], scratch[256];
	size_t size;
	km_batch kb;
	km_control ctl;
	km_err rc;

	memset(out, 0, sizeof(*out));
	out->physical = b->base_offset;
	out->pid = -2;
	out->control = KM_CONTROL_UNKNOWN;
	if (b->off + sizeof(h) > w->records_end)
		return KM_OK; /* cut by the fetch's size */
	if ((rc = km_off_peek(w, in, first, b->off, h, sizeof(h))) != KM_OK)
		return rc;
	out->attrs = (int16_t)km_be16(h + KM_BATCH_OFF_ATTRIBUTES);
	out->pid = (int64_t)km_be64(h + KM_BATCH_OFF_PRODUCER_ID);
	out->count = (int32_t)km_be32(h + KM_BATCH_OFF_RECORDS_COUNT);
	size = KM_BATCH_LOG_OVERHEAD + km_be32(h + KM_BATCH_OFF_LENGTH);
	if (!(out->attrs & KM_BATCH_ATTR_CONTROL) || size > sizeof(whole) || b->off + size > w->records_end)
		return KM_OK;
	/* A control batch (a few dozen bytes): its record's type, as the batch module reads it. */
	if ((rc = km_off_peek(w, in, first, b->off, whole, size)) != KM_OK)
		return rc;
	if (km_batch_parse(whole, size, &kb) == KM_OK && km_batch_control(&kb, scratch, sizeof(scratch), &ctl) == KM_OK)
		out->control = ctl.type;
	return KM_OK;
}

void km_off_trace_batch(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first,
			const km_off_trace_rec *tb)
{
	uint8_t b[8];
	int64_t shown = -1;

	if (km_off_peek(w, in, first, w->batch.off, b, 8) == KM_OK)
		shown = (int64_t)km_be64(b);
	add(c->trace, "%s %" PRId64 "%s%" PRId64 " pid %" PRId64 " %s n %" PRId32 "%s", c->trace->nbatches++ ? "," : "",
	    tb->physical, km_off_batch_run(c->cur, tb->physical, &(int64_t){0}) >= 0 ? ">" : " hidden>", shown, tb->pid,
	    (tb->attrs & KM_BATCH_ATTR_CONTROL) ? km_control_type_name((km_control_type)tb->control)
	    : (tb->attrs & KM_BATCH_ATTR_TRANSACTIONAL) ? "txn" : "data",
	    tb->count, w->batch.partial ? " partial" : "");
}
