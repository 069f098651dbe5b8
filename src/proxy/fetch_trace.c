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

#include "kmirror/log.h"
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

void km_off_trace_part_before(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first)
{
	const km_fetch_part *p = &w->part;
	size_t at = p->aborted_off;

	if (!c || !c->lk->trace_topics || !*c->lk->trace_topics)
		return;
	flush(c);
	if (!c->trace && !(c->trace = calloc(1, sizeof(*c->trace))))
		return;
	c->trace->naborted = 0;
	for (int32_t a = 0; a < p->aborted_count && a < TRACE_ABORTED; a++) {
		uint8_t b[16];
		if (km_off_peek(w, in, first, at, b, 16) != KM_OK)
			return;
		c->trace->aborted[a][0] = (int64_t)km_be64(b);
		c->trace->aborted[a][1] = (int64_t)km_be64(b + 8);
		c->trace->naborted = a + 1;
		at += 16 + (w->version >= 12 ? 1 : 0); /* the broker's entries carry no tagged field */
	}
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
	size_t at = p->aborted_off;

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
	for (int32_t a = 0; a < t->naborted; a++) {
		uint8_t b[16];
		if (km_off_peek(w, in, first, at, b, 16) != KM_OK)
			break;
		add(t, "%s%" PRId64 "@%" PRId64 " as %" PRId64 "@%" PRId64, a ? ", " : "", t->aborted[a][0],
		    t->aborted[a][1], (int64_t)km_be64(b), (int64_t)km_be64(b + 8));
		at += 16 + (w->version >= 12 ? 1 : 0);
	}
	if (p->aborted_count > t->naborted)
		add(t, ", %" PRId32 " more", p->aborted_count - t->naborted);
	add(t, "], records %zu bytes%s, batches:", p->records_len, c->blanked ? " (blanked)" : "");
}

/*
 * A batch, read before it is patched: its destination offset, producer and kind. KM_STREAM_AGAIN
 * while its header (and a control record's key) has not come yet: the event comes again.
 */
km_err km_off_trace_batch_before(km_off_req *c, const km_fetch_walk *w, struct evbuffer *in, size_t first,
				 km_off_trace_rec *out)
{
	const km_fetch_batch *b = &w->batch;
	uint8_t h[61];

	km_err rc;

	memset(out, 0, sizeof(*out));
	out->physical = b->base_offset;
	out->pid = -2;
	out->control = -1;
	if (b->off + 61 > w->records_end)
		return KM_OK; /* cut by the fetch's size */
	if ((rc = km_off_peek(w, in, first, b->off, h, 61)) != KM_OK)
		return rc;
	out->attrs = (int16_t)km_be16(h + 21);
	out->last_delta = (int32_t)km_be32(h + 23);
	out->pid = (int64_t)km_be64(h + 43);
	out->count = (int32_t)km_be32(h + 57);
	if (out->attrs & 0x20) {
		/* A control record: length, attributes, timestamp delta, offset delta, key length, key (version, type). */
		uint8_t r[24];
		size_t n = w->records_end - (b->off + 61) < sizeof(r) ? w->records_end - (b->off + 61) : sizeof(r);
		km_rd rd;
		int64_t v;
		int8_t attr;
		int16_t ver, type;
		if ((rc = km_off_peek(w, in, first, b->off + 61, r, n)) != KM_OK)
			return rc;
		km_rd_init(&rd, r, n);
		if (km_rd_varlong(&rd, "length", &v) && km_rd_i8(&rd, "attributes", &attr) &&
		    km_rd_varlong(&rd, "ts", &v) && km_rd_varlong(&rd, "delta", &v) && km_rd_varlong(&rd, "key", &v) &&
		    km_rd_i16(&rd, "version", &ver) && km_rd_i16(&rd, "type", &type))
			out->control = type;
	}
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
	    tb->physical,
	    km_off_batch_run(c->cur, tb->physical, &(int64_t){0}) >= 0 ? ">" : " hidden>", shown, tb->pid,
	    tb->control == 0 ? "ABORT" : tb->control == 1 ? "COMMIT" : (tb->attrs & 0x20) ? "ctl" : (tb->attrs & 0x10) ? "txn" : "data",
	    tb->count, w->batch.partial ? " partial" : "");
}
