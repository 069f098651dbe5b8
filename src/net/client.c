/* Async Kafka client connection: ApiVersions negotiation, TLS, SASL, pipelined requests built from copied or referenced pieces, responses delivered flat, owned or streamed, bounded in-flight. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <openssl/crypto.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "kmirror/api.h"
#include "kmirror/arena.h"
#include "kmirror/daemon_config.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/api_versions_request.h"
#include "kmirror/msg/api_versions_response.h"
#include "kmirror/net.h"
#include "kmirror/ring.h"
#include "kmirror/version.h"
#include "net_int.h"

#define KM_API_SASL_HANDSHAKE 17
#define KM_API_SASL_AUTHENTICATE 36
#define KAFKA_KEYS 256 /* Kafka's API keys tracked by the version table */
#define MIRROR_KEYS 64  /* kmirror's own keys, from KM_API_CREATE_MIRROR (32000) */
#define MAX_KEYS (KAFKA_KEYS + MIRROR_KEYS)

typedef struct pending {
	int32_t corr;
	int resp_hdr_version;
	uint64_t deadline_ms;
	km_net_delivery delivery;
	km_net_response_cb on_flat;
	km_net_owned_cb on_owned;
	km_net_stream_cb on_stream;
	void *arg;
	size_t bytes;  /* framed size, counted in inflight_bytes unless internal */
	bool internal; /* ApiVersions and SASL: outside the caps */
} pending;

KM_RING_TYPED(pending_q, pending)

typedef enum { C_IDLE, C_CONNECTING, C_NEGOTIATING, C_SASL, C_READY, C_CLOSED } client_state;
static const char *const state_names[] = {"idle", "connecting", "negotiating", "sasl", "ready", "closed"};

typedef struct feature {
	char *name;
	int16_t level;
} feature;

/* The referenced pieces of one request: each piece's release runs when its last chain is gone. */
typedef struct ref_block ref_block;
typedef struct piece_ref {
	ref_block *block;
	void (*release)(void *arg);
	void *arg;
	size_t chains;
} piece_ref;
struct ref_block {
	size_t live;
	piece_ref r[];
};

struct km_net_client {
	struct event_base *base;
	km_net_client_opts opts;
	char *client_id;
	char *host;
	struct bufferevent *bev;
	struct evbuffer *held;  /* framed requests waiting for the connection to be ready */
	struct evbuffer *chunk; /* streamed bytes being delivered */
	struct event *timer, *resume;
	client_state state;
	int32_t next_corr;
	km_ring fifo;   /* pending: sent, in order */
	km_ring queued; /* pending: in held, in order; they enter fifo after ApiVersions and SASL */
	size_t inflight, inflight_bytes;
	bool want_writable;
	size_t want_bytes;
	/* the response being streamed */
	bool rx_active;
	pending rx;
	size_t rx_left, rx_off;
	size_t unreleased, peak_unreleased, peak_buffered;
	uint64_t bytes_in;
	bool paused;
	/* negotiation */
	int16_t av_version;
	int16_t versions[MAX_KEYS];
	feature *features;
	size_t nfeatures;
	uint64_t id;
	km_sasl *sasl;
	km_sasl_oauth_wait oauth_wait; /* OAUTHBEARER: waiting for a token endpoint's answer */
	/*
	 * Re-authentication (KIP-368): the session lifetime the broker gave in the last
	 * SaslAuthenticate answer (0: none, the session lasts); reauth_ev fires before it ends, and
	 * while reauth the connection stays ready but holds new requests until the rounds are over.
	 */
	int64_t sasl_life_ms;
	struct event *reauth_ev;
	bool reauth;
	uint64_t reauths;
	/* GSSAPI: its start runs on a thread (km_sasl_gssapi_start); its first token, sent after the handshake */
	km_sasl_job *sasl_job;
	km_wr sasl_first;
	bool has_first;
	bool freed;
	km_net_rpc *rpc_waiting; /* src/net/rpc.c: calls whose resend timer runs */
	char reason[320]; /* why the connection last failed or closed (km_net_client_reason) */
};

static uint64_t next_client_id = 1;

static uint64_t now_ms(struct event_base *base)
{
	struct timeval tv;
	event_base_gettimeofday_cached(base, &tv);
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* Keep the first reason of a failure: what follows (the close itself) is its consequence. */
static void set_reason(km_net_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_reason(km_net_client *c, const char *fmt, ...)
{
	va_list ap;
	if (c->reason[0])
		return;
	va_start(ap, fmt);
	vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
	va_end(ap);
	for (char *q = c->reason; *q; q++)
		if (*q == '\n' || *q == '\r')
			*q = ' ';
}

const char *km_net_client_reason(const km_net_client *c)
{
	return c->reason;
}

static void set_state(km_net_client *c, client_state st)
{
	KM_DEBUG("net", c->id, "client to %s: %s -> %s", c->host ? c->host : "?", state_names[c->state], state_names[st]);
	c->state = st;
}

static size_t unreleased_cap(const km_net_client *c)
{
	return c->opts.max_unreleased_bytes ? c->opts.max_unreleased_bytes : 4 * 1024 * 1024;
}

static void deliver_error(km_net_client *c, const pending *p, km_err err)
{
	switch (p->delivery) {
	case KM_NET_FLAT:
		p->on_flat(c, err, NULL, 0, p->arg);
		break;
	case KM_NET_OWNED:
		p->on_owned(c, err, NULL, p->arg);
		break;
	case KM_NET_STREAM:
		p->on_stream(c, err, NULL, 0, true, p->arg);
		break;
	case KM_NET_NO_RESPONSE:
		break;
	}
}

static void done_accounting(km_net_client *c, const pending *p)
{
	if (p->internal || p->delivery == KM_NET_NO_RESPONSE)
		return;
	c->inflight--;
	c->inflight_bytes -= p->bytes;
}

static bool has_room(const km_net_client *c, size_t bytes)
{
	if (c->opts.max_inflight && c->inflight >= c->opts.max_inflight)
		return false;
	/* One request alone always fits, or a big one could never be sent. */
	if (c->opts.max_inflight_bytes && c->inflight && c->inflight_bytes + bytes > c->opts.max_inflight_bytes)
		return false;
	return true;
}

static void maybe_writable(km_net_client *c)
{
	if (!c->want_writable || c->state == C_CLOSED || c->freed || !has_room(c, c->want_bytes))
		return;
	c->want_writable = false;
	if (c->opts.on_writable)
		c->opts.on_writable(c, c->opts.arg);
}

/* Pop each queue before its callback: a callback may free the client, which fails what is left. */
static void fail_all(km_net_client *c, km_err err)
{
	pending *f;
	if (c->rx_active) {
		pending p = c->rx;
		c->rx_active = false;
		done_accounting(c, &p);
		deliver_error(c, &p, err);
	}
	while ((f = pending_q_front(&c->fifo))) {
		pending p = *f;
		pending_q_pop(&c->fifo);
		done_accounting(c, &p);
		deliver_error(c, &p, err);
	}
	while ((f = pending_q_front(&c->queued))) {
		pending p = *f;
		pending_q_pop(&c->queued);
		done_accounting(c, &p);
		deliver_error(c, &p, err);
	}
}

static void first_token_drop(km_net_client *c)
{
	if (c->sasl_first.buf)
		OPENSSL_cleanse(c->sasl_first.buf, c->sasl_first.cap);
	km_wr_free(&c->sasl_first);
	c->has_first = false;
}

static void client_close(km_net_client *c, km_err err)
{
	bool notify = c->state != C_CLOSED;
	km_sasl_oauth_cancel(&c->oauth_wait);
	km_sasl_job_cancel(c->sasl_job);
	c->sasl_job = NULL;
	first_token_drop(c);
	if (notify)
		set_state(c, C_CLOSED);
	if (c->bev) {
		/* Its output is freed with it: referenced pieces not written yet are released then. */
		km_net_bev_free(c->bev);
		c->bev = NULL;
	}
	if (c->held)
		evbuffer_drain(c->held, evbuffer_get_length(c->held));
	if (c->timer)
		event_del(c->timer);
	if (c->reauth_ev)
		event_del(c->reauth_ev);
	fail_all(c, err);
	if (notify && !c->freed && c->opts.on_state)
		c->opts.on_state(c, err, c->opts.arg);
}

static void arm_timer(km_net_client *c)
{
	struct timeval tv = {0, 250000};
	if (c->timer && !event_pending(c->timer, EV_TIMEOUT, NULL))
		event_add(c->timer, &tv);
}

/* ---- requests ---- */

static void ref_chain_done(const void *data, size_t len, void *extra)
{
	piece_ref *r = extra;
	ref_block *b = r->block;
	(void)data;
	(void)len;
	if (--r->chains)
		return;
	r->release(r->arg);
	if (--b->live == 0)
		free(b);
}

/* Visit the bytes [off, off + len) of buf as the memory of its chains; false when fn fails or the range is short. */
static bool for_range(struct evbuffer *buf, size_t off, size_t len, bool (*fn)(void *ctx, void *p, size_t n),
		      void *ctx)
{
	struct evbuffer_iovec stackv[16], *v = stackv;
	struct evbuffer_ptr ptr;
	bool ok = true;
	int n;

	if (evbuffer_ptr_set(buf, &ptr, off, EVBUFFER_PTR_SET) != 0)
		return false;
	n = evbuffer_peek(buf, (ev_ssize_t)len, &ptr, NULL, 0);
	if (n > 16 && !(v = malloc((size_t)n * sizeof(*v))))
		return false;
	n = evbuffer_peek(buf, (ev_ssize_t)len, &ptr, v, n);
	for (int i = 0; i < n && len && ok; i++) {
		size_t take = v[i].iov_len < len ? v[i].iov_len : len;
		ok = fn(ctx, v[i].iov_base, take);
		len -= take;
	}
	if (v != stackv)
		free(v);
	return ok && len == 0;
}

typedef struct ref_ctx {
	struct evbuffer *out;
	piece_ref *r;
} ref_ctx;

static bool add_ref_chain(void *ctx, void *p, size_t n)
{
	ref_ctx *x = ctx;
	x->r->chains++;
	if (evbuffer_add_reference(x->out, p, n, ref_chain_done, x->r) == 0)
		return true;
	x->r->chains--;
	return false;
}

static bool add_copy(void *ctx, void *p, size_t n)
{
	return evbuffer_add(ctx, p, n) == 0;
}

/* Append one piece, referenced or copied; false when libevent could not take it (nothing stays referenced then). */
static bool add_piece(struct evbuffer *out, const km_net_piece *pc, piece_ref *r)
{
	ref_ctx x = {out, r};
	bool ok;

	if (!pc->len)
		ok = true;
	else if (!r)
		ok = pc->buf ? for_range(pc->buf, pc->off, pc->len, add_copy, out) : evbuffer_add(out, pc->p, pc->len) == 0;
	else if (!pc->buf)
		ok = add_ref_chain(&x, (void *)pc->p, pc->len);
	else
		ok = for_range(pc->buf, pc->off, pc->len, add_ref_chain, &x);
	/* The count held while adding: released here when no chain took the bytes (or there were none). */
	if (r)
		ref_chain_done(NULL, 0, r);
	return ok;
}

static size_t header_len(const km_net_client *c, int hdr_version)
{
	return 8 + (hdr_version >= 1 ? 2 + strlen(c->client_id) : 0) + (hdr_version >= 2 ? 1 : 0);
}

static void write_header(km_net_client *c, struct evbuffer *out, const km_net_request *rq, int hdr_version,
			 int32_t corr, size_t body_len)
{
	uint8_t hdr[14];
	size_t cid_len = strlen(c->client_id);

	km_put_be32(hdr, (uint32_t)(header_len(c, hdr_version) + body_len));
	km_put_be16(hdr + 4, (uint16_t)rq->api_key);
	km_put_be16(hdr + 6, (uint16_t)rq->api_version);
	km_put_be32(hdr + 8, (uint32_t)corr);
	if (hdr_version >= 1)
		km_put_be16(hdr + 12, (uint16_t)cid_len);
	evbuffer_add(out, hdr, hdr_version >= 1 ? 14 : 12);
	if (hdr_version >= 1)
		evbuffer_add(out, c->client_id, cid_len);
	if (hdr_version >= 2)
		evbuffer_add(out, "\0", 1);
}

void km_net_request_init(km_net_request *rq, int16_t api_key, int16_t api_version)
{
	memset(rq, 0, sizeof(*rq));
	rq->api_key = api_key;
	rq->api_version = api_version;
	rq->hdr_version = -1;
	rq->resp_hdr_version = -1;
}

static km_err enqueue(km_net_client *c, const km_net_request *rq, bool internal)
{
	int64_t tmo = c->opts.request_timeout_ms ? c->opts.request_timeout_ms : 30000;
	int hv = rq->hdr_version >= 0 ? rq->hdr_version : km_api_request_header_version(rq->api_key, rq->api_version);
	int rv = rq->resp_hdr_version >= 0 ? rq->resp_hdr_version
					   : km_api_response_header_version(rq->api_key, rq->api_version);
	bool direct = (c->state == C_READY && !c->reauth) || internal;
	struct evbuffer *out;
	size_t body_len = 0, nref = 0;
	ref_block *blk = NULL;
	pending p;
	bool ok = true;

	if (c->state == C_CLOSED || c->state == C_IDLE)
		return KM_ERR_CLOSED;
	if (hv < 0 || rv < 0)
		return KM_ERR_UNSUPPORTED;
	if ((rq->delivery == KM_NET_FLAT && !rq->on_flat) || (rq->delivery == KM_NET_OWNED && !rq->on_owned) ||
	    (rq->delivery == KM_NET_STREAM && !rq->on_stream) || (rq->npieces && !rq->pieces))
		return KM_ERR_INVAL;
	for (size_t i = 0; i < rq->npieces; i++) {
		const km_net_piece *pc = &rq->pieces[i];
		if (pc->buf && (pc->off > evbuffer_get_length(pc->buf) || pc->len > evbuffer_get_length(pc->buf) - pc->off))
			return KM_ERR_INVAL;
		if (pc->len > (size_t)INT32_MAX - body_len)
			return KM_ERR_TOO_LARGE;
		body_len += pc->len;
		nref += pc->release != NULL;
	}
	if (body_len > (size_t)INT32_MAX - 64)
		return KM_ERR_TOO_LARGE;
	memset(&p, 0, sizeof(p));
	p.bytes = 4 + header_len(c, hv) + body_len;
	p.internal = internal;
	p.delivery = rq->delivery;
	if (!internal && p.delivery != KM_NET_NO_RESPONSE && !has_room(c, p.bytes)) {
		c->want_writable = true;
		c->want_bytes = p.bytes;
		return KM_ERR_FULL;
	}
	if (nref && !(blk = calloc(1, sizeof(*blk) + nref * sizeof(piece_ref))))
		return KM_ERR_NOMEM;
	p.corr = c->next_corr;
	p.resp_hdr_version = rv;
	p.deadline_ms = now_ms(c->base) + (uint64_t)tmo;
	p.on_flat = rq->on_flat;
	p.on_owned = rq->on_owned;
	p.on_stream = rq->on_stream;
	p.arg = rq->arg;
	if (p.delivery != KM_NET_NO_RESPONSE && !pending_q_push(direct ? &c->fifo : &c->queued, &p)) {
		free(blk);
		return KM_ERR_NOMEM;
	}
	c->next_corr = c->next_corr == INT32_MAX ? 0 : c->next_corr + 1;
	if (!internal && p.delivery != KM_NET_NO_RESPONSE) {
		c->inflight++;
		c->inflight_bytes += p.bytes;
	}
	/* From here on the request is accepted: every referenced piece is released exactly once. */
	out = direct ? bufferevent_get_output(c->bev) : c->held;
	write_header(c, out, rq, hv, p.corr, body_len);
	if (blk)
		blk->live = nref;
	for (size_t i = 0, j = 0; i < rq->npieces; i++) {
		const km_net_piece *pc = &rq->pieces[i];
		piece_ref *r = NULL;
		if (pc->release) {
			r = &blk->r[j++];
			r->block = blk;
			r->release = pc->release;
			r->arg = pc->release_arg;
			r->chains = 1;
		}
		if (!add_piece(out, pc, r))
			ok = false;
	}
	if (p.delivery != KM_NET_NO_RESPONSE)
		arm_timer(c);
	if (!ok) {
		/* A frame missing bytes cannot stay on the wire. */
		KM_WARN("net", c->id, "out of memory framing a request to %s", c->host);
		client_close(c, KM_ERR_NOMEM);
	}
	return KM_OK;
}

km_err km_net_client_request(km_net_client *c, const km_net_request *rq)
{
	return enqueue(c, rq, false);
}

static km_err send_flat(km_net_client *c, int16_t key, int16_t ver, int hdr_version, int resp_hdr_version,
			const uint8_t *body, size_t len, km_net_response_cb cb, void *arg, bool internal)
{
	km_net_piece pc = {.p = body, .len = len};
	km_net_request rq;
	km_net_request_init(&rq, key, ver);
	rq.hdr_version = hdr_version;
	rq.resp_hdr_version = resp_hdr_version;
	rq.pieces = &pc;
	rq.npieces = 1;
	rq.delivery = cb ? KM_NET_FLAT : KM_NET_NO_RESPONSE;
	rq.on_flat = cb;
	rq.arg = arg;
	return enqueue(c, &rq, internal);
}

km_err km_net_client_send(km_net_client *c, int16_t api_key, int16_t api_version, int hdr_version,
			  int resp_hdr_version, const uint8_t *body, size_t len, km_net_response_cb cb, void *arg)
{
	return send_flat(c, api_key, api_version, hdr_version, resp_hdr_version, body, len, cb, arg, false);
}

static km_err send_internal(km_net_client *c, int16_t key, int16_t ver, int hdr_version, int resp_hdr_version,
			    const uint8_t *body, size_t len, km_net_response_cb cb)
{
	return send_flat(c, key, ver, hdr_version, resp_hdr_version, body, len, cb, NULL, true);
}

/* The requests held while the connection was not ready (or re-authenticated) go out, in order. */
static bool send_held(km_net_client *c)
{
	pending *f;
	while ((f = pending_q_front(&c->queued))) {
		if (!pending_q_push(&c->fifo, f)) {
			client_close(c, KM_ERR_NOMEM);
			return false;
		}
		pending_q_pop(&c->queued);
	}
	if (evbuffer_get_length(c->held))
		evbuffer_add_buffer(bufferevent_get_output(c->bev), c->held);
	return true;
}

static void became_ready(km_net_client *c)
{
	set_state(c, C_READY);
	if (send_held(c) && c->opts.on_state)
		c->opts.on_state(c, KM_OK, c->opts.arg);
}
static void start_sasl(km_net_client *c);

static void negotiated(km_net_client *c)
{
	if (c->opts.sasl_mechanism)
		start_sasl(c);
	else
		became_ready(c);
}

/* ---- ApiVersions: the newest version the codec knows, v0 (or the broker's max) after UNSUPPORTED_VERSION ---- */

static void api_versions_done(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg);

static void send_api_versions(km_net_client *c)
{
	km_api_versions_request m;
	km_wr w;
	int16_t v = c->av_version;

	km_api_versions_request_init(&m);
	m.client_software_name = km_str_c("kmirror");
	m.client_software_version = km_str_c(KM_VERSION);
	km_wr_init(&w);
	km_api_versions_request_encode(&w, v, &m);
	if (!km_wr_ok(&w) || send_internal(c, KM_API_API_VERSIONS, v, km_api_request_header_version(KM_API_API_VERSIONS, v),
					   0, w.buf, w.len, api_versions_done) != KM_OK)
		client_close(c, KM_ERR_NOMEM);
	km_wr_free(&w);
}

/* The version table's slot of an api key: Kafka's keys first, then kmirror's own; -1 for none. */
static int version_slot(int16_t api_key)
{
	if (api_key >= 0 && api_key < KAFKA_KEYS)
		return api_key;
	if (api_key >= KM_API_CREATE_MIRROR && api_key < KM_API_CREATE_MIRROR + MIRROR_KEYS)
		return KAFKA_KEYS + (api_key - KM_API_CREATE_MIRROR);
	return -1;
}

static void keep_versions(km_net_client *c, const km_api_versions_response *m)
{
	for (int32_t i = 0; i < m->api_keys.count; i++) {
		const km_api_versions_response_api_version *k = &m->api_keys.items[i];
		const km_api_info *api = km_api_lookup(k->api_key);
		int slot = version_slot(k->api_key);
		int16_t lo, hi;
		if (!api || slot < 0)
			continue;
		lo = k->min_version > api->min_version ? k->min_version : api->min_version;
		hi = k->max_version < api->max_version ? k->max_version : api->max_version;
		c->versions[slot] = hi >= lo ? hi : -1;
	}
	c->features = calloc(m->finalized_features.count > 0 ? (size_t)m->finalized_features.count : 1, sizeof(feature));
	for (int32_t i = 0; c->features && i < m->finalized_features.count; i++) {
		const km_api_versions_response_finalized_feature_key *f = &m->finalized_features.items[i];
		char *name = malloc((size_t)(f->name.len > 0 ? f->name.len : 0) + 1);
		if (!name)
			break;
		memcpy(name, f->name.p, (size_t)(f->name.len > 0 ? f->name.len : 0));
		name[f->name.len > 0 ? f->name.len : 0] = 0;
		c->features[c->nfeatures].name = name;
		c->features[c->nfeatures++].level = f->max_version_level;
	}
}

static void api_versions_done(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	km_api_versions_response m;
	km_arena a;
	km_rd r;
	int16_t ec = len >= 2 ? (int16_t)km_be16(body) : 0;
	km_err rc;

	(void)arg;
	if (err != KM_OK || c->state == C_CLOSED)
		return;
	km_arena_init(&a, 1024 * 1024);
	km_rd_init(&r, body, len);
	/* A broker answers a version it does not know with UNSUPPORTED_VERSION in the v0 layout. */
	if (ec == KM_KAFKA_UNSUPPORTED_VERSION && c->av_version > 0) {
		int16_t next = 0;
		if (km_api_versions_response_decode(&r, 0, &m, &a) == KM_OK) {
			for (int32_t i = 0; i < m.api_keys.count; i++)
				if (m.api_keys.items[i].api_key == KM_API_API_VERSIONS &&
				    m.api_keys.items[i].max_version < c->av_version)
					next = m.api_keys.items[i].max_version;
		}
		km_arena_free(&a);
		KM_INFO("net", c->id, "%s does not take ApiVersions v%d: retrying with v%d", c->host, c->av_version, next);
		c->av_version = next < 0 ? 0 : next;
		send_api_versions(c);
		return;
	}
	rc = km_api_versions_response_decode(&r, c->av_version, &m, &a);
	if (rc != KM_OK || m.error_code != 0) {
		KM_WARN("net", c->id, "ApiVersions v%d with %s failed: %s", c->av_version, c->host,
			km_err_name(rc != KM_OK ? rc : m.error_code));
		set_reason(c, "ApiVersions v%d failed: %s", c->av_version, km_err_name(rc != KM_OK ? rc : m.error_code));
		km_arena_free(&a);
		client_close(c, rc != KM_OK ? KM_ERR_DECODE : KM_ERR_UNSUPPORTED);
		return;
	}
	keep_versions(c, &m);
	km_arena_free(&a);
	KM_DEBUG("net", c->id, "%s: ApiVersions v%d, Produce v%d, Fetch v%d, Metadata v%d", c->host, c->av_version,
		 c->versions[KM_API_PRODUCE], c->versions[KM_API_FETCH], c->versions[KM_API_METADATA]);
	negotiated(c);
}

int16_t km_net_client_version(const km_net_client *c, int16_t api_key)
{
	int slot = version_slot(api_key);
	return slot >= 0 ? c->versions[slot] : -1;
}

int16_t km_net_client_feature(const km_net_client *c, const char *name)
{
	for (size_t i = 0; i < c->nfeatures; i++)
		if (!strcmp(c->features[i].name, name))
			return c->features[i].level;
	return -1;
}

/* ---- SASL: SaslHandshake v1, then SaslAuthenticate v1 rounds driven by the mechanism provider ---- */

static void sasl_auth_done(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg);

/* A SASL token may carry the password (PLAIN does): wiped before its buffer is freed. */
static void wr_wipe_free(km_wr *w)
{
	if (w->buf)
		OPENSSL_cleanse(w->buf, w->cap);
	km_wr_free(w);
}

/*
 * A session with a lifetime is authenticated again at 85 to 95 % of it, on the same connection
 * (KIP-368: the broker closes a connection whose session ended at its next request), as Kafka's
 * own clients do.
 */
static void reauth_schedule(km_net_client *c)
{
	int64_t ms;
	struct timeval tv;

	if (c->sasl_life_ms <= 0 || !c->reauth_ev)
		return;
	ms = c->sasl_life_ms * (85 + (int64_t)(random() % 11)) / 100;
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
	event_add(c->reauth_ev, &tv);
}


static void reauth_cb(evutil_socket_t fd, short what, void *arg)
{
	km_net_client *c = arg;
	(void)fd;
	(void)what;
	if (c->state != C_READY || c->reauth || !c->opts.sasl_mechanism)
		return;
	KM_DEBUG("net", c->id, "re-authenticating to %s: the session ends in %lld ms at most", c->host,
		 (long long)c->sasl_life_ms);
	c->reauth = true;
	start_sasl(c);
}

/* One SaslAuthenticate with the mechanism's token. */
static void sasl_send_token(km_net_client *c, const uint8_t *tok, size_t len)
{
	km_wr w;
	km_wr_init(&w);
	km_wr_bytes(&w, false, (km_bytes){tok, (int32_t)len});
	if (!km_wr_ok(&w) || send_internal(c, KM_API_SASL_AUTHENTICATE, 1, 1, 0, w.buf, w.len, sasl_auth_done) != KM_OK)
		client_close(c, KM_ERR_SASL);
	wr_wipe_free(&w);
}

static void sasl_send(km_net_client *c, const uint8_t *in, size_t inlen)
{
	km_wr tok;
	bool done = false;
	km_err rc;

	km_wr_init(&tok);
	rc = km_sasl_step(c->sasl, in, inlen, &tok, &done);
	if (rc != KM_OK && *km_sasl_reason(c->sasl)) {
		/* The mechanism knows why (GSSAPI: the KDC's or the library's words). */
		KM_WARN("net", c->id, "SASL %s with %s failed: %s", c->opts.sasl_mechanism, c->host,
			km_sasl_reason(c->sasl));
		set_reason(c, "SASL %s failed: %s", c->opts.sasl_mechanism, km_sasl_reason(c->sasl));
		wr_wipe_free(&tok);
		client_close(c, KM_ERR_SASL);
		return;
	}
	if (rc != KM_OK) {
		KM_WARN("net", c->id, "SASL %s with %s failed: the server's answer did not verify", c->opts.sasl_mechanism,
			c->host);
		set_reason(c, "SASL %s failed: the server's answer did not verify (not the server it claims to be?)",
			   c->opts.sasl_mechanism);
		wr_wipe_free(&tok);
		client_close(c, KM_ERR_SASL);
		return;
	}
	if (done) {
		wr_wipe_free(&tok);
		km_sasl_free(c->sasl);
		c->sasl = NULL;
		reauth_schedule(c);
		if (!c->reauth) {
			became_ready(c);
			return;
		}
		c->reauth = false;
		c->reauths++;
		KM_DEBUG("net", c->id, "re-authenticated to %s (%s)", c->host, c->opts.sasl_mechanism);
		send_held(c);
		return;
	}
	sasl_send_token(c, tok.buf, tok.len);
	wr_wipe_free(&tok);
}

static void sasl_auth_done(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	km_rd r;
	int16_t ec = 0;
	km_str msg = KM_STR_NULL;
	km_bytes auth = KM_BYTES_NULL;

	if (err != KM_OK || c->state == C_CLOSED)
		return;
	km_rd_init(&r, body, len);
	km_rd_i16(&r, "error_code", &ec);
	km_rd_string(&r, "error_message", false, true, &msg);
	km_rd_bytes(&r, "auth_bytes", false, false, &auth);
	c->sasl_life_ms = 0;
	if (km_rd_ok(&r) && km_rd_left(&r) >= 8) /* v1: the session's lifetime (KIP-368), 0 when it lasts */
		km_rd_i64(&r, "session_lifetime_ms", &c->sasl_life_ms);
	if (!km_rd_ok(&r) || ec != 0) {
		/* What the mechanism learnt on the way (OAUTHBEARER: the server's status and scope). */
		const char *more = c->sasl ? km_sasl_reason(c->sasl) : "";
		KM_WARN("net", c->id, "SASL authentication to %s failed: %s %.*s%s%s", c->host, km_err_name(ec),
			msg.len > 0 ? msg.len : 0, msg.p ? msg.p : "", *more ? "; " : "", more);
		if (!km_rd_ok(&r))
			set_reason(c, "SASL %s failed: malformed SaslAuthenticate response", c->opts.sasl_mechanism);
		else
			set_reason(c, "SASL %s failed: %s%s%.*s%s%s", c->opts.sasl_mechanism, km_err_name(ec),
				   msg.len > 0 ? ": " : "", msg.len > 0 ? (int)(msg.len > 200 ? 200 : msg.len) : 0,
				   msg.p ? msg.p : "", *more ? "; " : "", more);
		client_close(c, KM_ERR_SASL);
		return;
	}
	sasl_send(c, auth.p, (size_t)auth.len);
}

static void sasl_handshake_done(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	km_rd r;
	int16_t ec = 0;

	if (err != KM_OK || c->state == C_CLOSED)
		return;
	km_rd_init(&r, body, len);
	km_rd_i16(&r, "error_code", &ec);
	if (!km_rd_ok(&r) || ec != 0) {
		KM_WARN("net", c->id, "SASL handshake with %s failed: %s (mechanism %s)", c->host, km_err_name(ec),
			c->opts.sasl_mechanism);
		set_reason(c, "SASL handshake for %s failed: %s", c->opts.sasl_mechanism,
			   km_rd_ok(&r) ? km_err_name(ec) : "malformed response");
		client_close(c, KM_ERR_SASL);
		return;
	}
	if (c->has_first) {
		/* GSSAPI: its first token was made off the loop (km_sasl_gssapi_start). */
		sasl_send_token(c, c->sasl_first.buf, c->sasl_first.len);
		first_token_drop(c);
		return;
	}
	sasl_send(c, NULL, 0);
}

/* The token endpoint answered for a connection waiting in start_sasl. */
static void oauth_ready(void *arg, km_err rc, const char *why)
{
	km_net_client *c = arg;

	if ((c->state != C_SASL && !c->reauth) || c->state == C_CLOSED || c->sasl)
		return;
	if (rc != KM_OK) {
		set_reason(c, "SASL OAUTHBEARER failed: %s", why);
		client_close(c, KM_ERR_SASL);
		return;
	}
	start_sasl(c);
}

static void send_handshake(km_net_client *c)
{
	km_wr w;
	km_wr_init(&w);
	km_wr_string(&w, false, km_str_c(c->opts.sasl_mechanism));
	if (!km_wr_ok(&w) ||
	    send_internal(c, KM_API_SASL_HANDSHAKE, 1, 1, 0, w.buf, w.len, sasl_handshake_done) != KM_OK)
		client_close(c, KM_ERR_SASL);
	km_wr_free(&w);
}

/* GSSAPI's start is over (its thread): the handshake goes, then its first token. */
static void gss_ready(void *arg, km_sasl *s, const uint8_t *first, size_t len, const char *why)
{
	km_net_client *c = arg;

	c->sasl_job = NULL;
	if (!s) {
		KM_WARN("net", c->id, "SASL GSSAPI with %s: %s", c->host, why);
		set_reason(c, "SASL GSSAPI failed: %s", why);
		client_close(c, KM_ERR_SASL);
		return;
	}
	c->sasl = s;
	first_token_drop(c);
	km_wr_init(&c->sasl_first);
	km_wr_raw(&c->sasl_first, first, len);
	if (!km_wr_ok(&c->sasl_first)) {
		client_close(c, KM_ERR_NOMEM);
		return;
	}
	c->has_first = true;
	send_handshake(c);
}

static void start_sasl(km_net_client *c)
{
	if (!c->reauth)
		set_state(c, C_SASL);
	if (!strcmp(c->opts.sasl_mechanism, "GSSAPI")) {
		km_sasl_krb5 k = {c->opts.sasl_kerberos_service_name, c->opts.sasl_kerberos_keytab,
				  c->opts.sasl_kerberos_principal, c->opts.sasl_kerberos_setting};
		char why[400], host[300], *colon;
		/* The broker's name as connected to, without the port c->host carries: its service principal's host. */
		snprintf(host, sizeof(host), "%s", c->host);
		if ((colon = strrchr(host, ':')))
			*colon = 0;
		if (c->opts.sasl_kerberos_host && *c->opts.sasl_kerberos_host)
			snprintf(host, sizeof(host), "%s", c->opts.sasl_kerberos_host);
		/* Its credentials and first token may wait for the KDC: off the loop (gss_ready goes on). */
		if (!(c->sasl_job = km_sasl_gssapi_start(c->base, host, &k, gss_ready, c, why, sizeof(why)))) {
			KM_WARN("net", c->id, "SASL GSSAPI with %s: %s", c->host, why);
			set_reason(c, "SASL GSSAPI failed: %s", why);
			client_close(c, KM_ERR_SASL);
		}
		return;
	} else if (!strcmp(c->opts.sasl_mechanism, "OAUTHBEARER")) {
		km_sasl_oauth o = {c->opts.sasl_oauthbearer_token_endpoint_url, c->opts.sasl_oauthbearer_client_id,
				   c->opts.sasl_oauthbearer_client_secret, c->opts.sasl_oauthbearer_scope,
				   c->opts.sasl_oauthbearer_setting, c->opts.sasl_oauthbearer_token_command};
		char why[400], *token;
		/* Asked at every connection: the token is the current one, not the first connection's. */
		c->oauth_wait.cb = oauth_ready;
		c->oauth_wait.arg = c;
		if (km_sasl_oauth_get(&o, c->base, c->opts.dns, &c->oauth_wait, &token, why, sizeof(why)) != KM_OK) {
			KM_WARN("net", c->id, "SASL OAUTHBEARER with %s: %s", c->host, why);
			set_reason(c, "SASL OAUTHBEARER failed: %s", why);
			client_close(c, KM_ERR_SASL);
			return;
		}
		if (!token)
			return; /* the token endpoint is being asked: oauth_ready goes on (the connect timeout runs) */
		c->sasl = km_sasl_new("OAUTHBEARER", NULL, token);
		OPENSSL_cleanse(token, strlen(token));
		free(token);
	} else {
		c->sasl = km_sasl_new(c->opts.sasl_mechanism, c->opts.sasl_username, c->opts.sasl_password);
	}
	if (!c->sasl) {
		KM_WARN("net", c->id, "SASL mechanism %s is not supported", c->opts.sasl_mechanism);
		set_reason(c, "SASL mechanism %s is not supported", c->opts.sasl_mechanism);
		client_close(c, KM_ERR_SASL);
		return;
	}
	send_handshake(c);
}

/* ---- I/O ---- */

static void pause_reading(km_net_client *c)
{
	if (c->paused)
		return;
	c->paused = true;
	km_net_bev_disable(c->bev, EV_READ);
}

/* Deliver what is buffered of the streamed response, up to the unreleased cap; false to stop for now. */
static bool stream_some(km_net_client *c, struct evbuffer *in)
{
	size_t cap = unreleased_cap(c), avail = evbuffer_get_length(in), n, off;
	pending cur = c->rx;
	bool last;

	if (c->unreleased >= cap) {
		pause_reading(c);
		return false;
	}
	n = avail < c->rx_left ? avail : c->rx_left;
	if (n > cap - c->unreleased)
		n = cap - c->unreleased;
	if (n == 0 && c->rx_left > 0)
		return false;
	if (n && evbuffer_remove_buffer(in, c->chunk, n) != (int)n) {
		client_close(c, KM_ERR_NOMEM);
		return false;
	}
	off = c->rx_off;
	c->rx_off += n;
	c->rx_left -= n;
	c->unreleased += n;
	c->bytes_in += n;
	if (c->unreleased > c->peak_unreleased)
		c->peak_unreleased = c->unreleased;
	last = c->rx_left == 0;
	if (last) {
		c->rx_active = false;
		done_accounting(c, &cur);
	}
	cur.on_stream(c, KM_OK, c->chunk, off, last, cur.arg);
	if (c->state == C_CLOSED || c->freed)
		return false;
	evbuffer_drain(c->chunk, evbuffer_get_length(c->chunk));
	if (last)
		maybe_writable(c);
	return true;
}

/* A whole response frame is buffered: move its body out and hand it over. */
static void deliver_whole(km_net_client *c, struct evbuffer *in, const pending *cur, size_t body_len)
{
	struct evbuffer *body = evbuffer_new();
	const uint8_t *flat;

	if (!body || evbuffer_remove_buffer(in, body, body_len) != (int)body_len) {
		if (body)
			evbuffer_free(body);
		deliver_error(c, cur, KM_ERR_NOMEM);
		client_close(c, KM_ERR_NOMEM);
		return;
	}
	c->bytes_in += body_len;
	if (cur->delivery == KM_NET_OWNED) {
		cur->on_owned(c, KM_OK, body, cur->arg);
		return;
	}
	flat = body_len ? evbuffer_pullup(body, -1) : (const uint8_t *)"";
	if (!flat) {
		evbuffer_free(body);
		deliver_error(c, cur, KM_ERR_NOMEM);
		client_close(c, KM_ERR_NOMEM);
		return;
	}
	cur->on_flat(c, KM_OK, flat, body_len, cur->arg);
	evbuffer_free(body);
}

static void process_input(km_net_client *c)
{
	int64_t max = c->opts.max_frame_bytes ? c->opts.max_frame_bytes : 104857600;

	while (c->bev && c->state != C_CLOSED && !c->freed) {
		struct evbuffer *in = bufferevent_get_input(c->bev);
		int32_t size = -1, corr = 0;
		size_t hlen = 0;
		km_frame_status st;
		pending *front, cur;
		int h;

		if (c->rx_active) {
			if (!stream_some(c, in))
				return;
			continue;
		}
		st = km_net_frame_peek(in, max, KM_FRAME_MIN_RESPONSE, false, &size);
		if (st == KM_FRAME_NEED_MORE && size < 0)
			return;
		if (st != KM_FRAME_READY && st != KM_FRAME_NEED_MORE) {
			KM_WARN("net", c->id, "bad response frame from %s: %s (size %d)", c->host, km_frame_status_name(st),
				size);
			client_close(c, KM_ERR_DECODE);
			return;
		}
		front = pending_q_front(&c->fifo);
		h = km_net_response_header(in, size, front ? front->resp_hdr_version : 0, &corr, &hlen);
		if (h == 0)
			return;
		if (h < 0 || !front || front->corr != corr) {
			if (h < 0)
				KM_WARN("net", c->id, "malformed response header from %s", c->host);
			else
				KM_WARN("net", c->id, "unexpected correlation id %d from %s", corr, c->host);
			client_close(c, KM_ERR_DECODE);
			return;
		}
		/* A streamed response starts with its header; the others wait for the whole frame. */
		if (front->delivery != KM_NET_STREAM && st != KM_FRAME_READY)
			return;
		cur = *front;
		pending_q_pop(&c->fifo);
		evbuffer_drain(in, 4 + hlen);
		c->bytes_in += 4 + hlen;
		if (cur.delivery == KM_NET_STREAM) {
			c->rx = cur;
			c->rx_active = true;
			c->rx_left = (size_t)size - hlen;
			c->rx_off = 0;
			continue;
		}
		done_accounting(c, &cur);
		deliver_whole(c, in, &cur, (size_t)size - hlen);
		maybe_writable(c);
	}
}

size_t km_net_client_stream_size(const km_net_client *c)
{
	return c->rx_off + c->rx_left;
}

static void read_cb(struct bufferevent *bev, void *arg)
{
	km_net_client *c = arg;
	size_t buffered;

	/* libevent 2.1 reads 4 KiB (plain) or about one TLS record per event: take what the socket holds. */
	if (!c->paused)
		km_net_bev_fill(bev, c->opts.read_fill_bytes ? c->opts.read_fill_bytes : 1024 * 1024);
	buffered = evbuffer_get_length(bufferevent_get_input(bev));
	if (buffered > c->peak_buffered)
		c->peak_buffered = buffered;
	process_input(c);
}

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
	km_net_client *c = arg;
	(void)fd;
	(void)what;
	if (c->bev && c->state != C_CLOSED)
		read_cb(c->bev, c);
}

void km_net_client_release(km_net_client *c, size_t n)
{
	c->unreleased -= n < c->unreleased ? n : c->unreleased;
	/* Resume at half the cap, so a consumer releasing a few bytes at a time does not make tiny reads. */
	if (c->paused && c->unreleased <= unreleased_cap(c) / 2 && c->bev && c->state != C_CLOSED) {
		c->paused = false;
		km_net_bev_enable(c->bev, EV_READ);
		/* What is buffered already gets no read event of its own. */
		event_active(c->resume, EV_TIMEOUT, 1);
	}
}

/* The reason of a connection that failed or closed, by the state it was in. */
static void record_close(km_net_client *c, struct bufferevent *bev, short what, km_err kind, const char *why)
{
	const char *during = c->state == C_CONNECTING ? (c->opts.tls ? "the TLS handshake" : "connecting")
			     : c->state == C_NEGOTIATING ? "ApiVersions"
			     : c->state == C_SASL	 ? "SASL authentication"
							 : NULL;
	int dns = (what & BEV_EVENT_ERROR) && c->state == C_CONNECTING ? bufferevent_socket_get_dns_error(bev) : 0;

	if (what & BEV_EVENT_TIMEOUT) {
		set_reason(c, "timed out%s%s%s%s", during ? " during " : "", during ? during : "",
			   c->oauth_wait.pprev ? ", waiting for a token from " : "",
			   !c->oauth_wait.pprev			      ? ""
			   : c->opts.sasl_oauthbearer_token_command ? "the token command"
								      : c->opts.sasl_oauthbearer_token_endpoint_url);
		return;
	}
	if (dns) {
		/* The name did not resolve: no connection was tried (before, "closed by the peer during connecting"). */
		set_reason(c, "the host name does not resolve (DNS: %s)", evutil_gai_strerror(dns));
		return;
	}
	if (kind == KM_ERR_TLS) {
		/* OpenSSL's own verify result says why a certificate was refused (issuer, name, dates). */
		SSL *ssl = bufferevent_openssl_get_ssl(bev);
		long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
		if (vr != X509_V_OK)
			set_reason(c, "TLS handshake failed: certificate verify failed: %s", X509_verify_cert_error_string(vr));
		else
			set_reason(c, "TLS handshake failed: %s", why);
		return;
	}
	if (!(what & BEV_EVENT_EOF) && why[0] && strcmp(why, "closed by peer")) {
		/* A refused TCP connect says enough by itself. */
		if (c->state == C_CONNECTING && !c->opts.tls)
			set_reason(c, "%s", why);
		else
			set_reason(c, "%s%s%s", why, during ? " during " : "", during ? during : "");
		return;
	}
	set_reason(c, "closed by the peer%s%s", during ? " during " : "", during ? during : "");
}

/* Whether the socket's two ends are the same address and port (a TCP self-connect). */
static bool connected_to_itself(int fd)
{
	struct sockaddr_storage a, b;
	socklen_t la = sizeof(a), lb = sizeof(b);
	if (getsockname(fd, (struct sockaddr *)&a, &la) || getpeername(fd, (struct sockaddr *)&b, &lb) || la != lb)
		return false;
	return !memcmp(&a, &b, la);
}

/* net.core.wmem_max, read once (0: not readable). */
static long wmem_max(void)
{
	static long max = -1;
	if (max < 0) {
		FILE *f = fopen("/proc/sys/net/core/wmem_max", "r");
		max = 0;
		if (f) {
			if (fscanf(f, "%ld", &max) != 1)
				max = 0;
			fclose(f);
		}
	}
	return max;
}

/* SO_SNDBUF bytes, where the kernel would take it whole; else its autotuning stays. */
static void set_sndbuf(int fd, int bytes)
{
	if (bytes > 0 && wmem_max() >= bytes)
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	km_net_client *c = arg;

	if (what & BEV_EVENT_CONNECTED) {
		int fd = bufferevent_getfd(bev);
		int one = 1;
		if (fd >= 0 && connected_to_itself(fd)) {
			/*
			 * Nothing listens on a local port inside the ephemeral range: the kernel may pick that
			 * very port as the source, and TCP's simultaneous open connects the socket to itself
			 * (our own ApiVersions would come back as the answer), and holds the port a restarted
			 * broker wants to bind.
			 */
			KM_LOG(c->opts.quiet_failures ? KM_LOG_DEBUG : KM_LOG_INFO, "net", c->id,
			       "connection to %s failed: connected to itself (nothing listens there)", c->host);
			set_reason(c, "nothing listens at %s (the connection reached itself)", c->host);
			client_close(c, KM_ERR_IO);
			return;
		}
		if (fd >= 0) {
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			set_sndbuf(fd, c->opts.sndbuf_bytes);
		}
		/* Reads and writes now time out only through the request timer. */
		bufferevent_set_timeouts(bev, NULL, NULL);
		if (c->opts.skip_api_versions) {
			negotiated(c);
			return;
		}
		set_state(c, C_NEGOTIATING);
		c->av_version = KM_API_VERSIONS_REQUEST_MAX_VERSION;
		send_api_versions(c);
		return;
	}
	if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)) {
		km_err err = (what & BEV_EVENT_TIMEOUT) ? KM_ERR_TIMEOUT : (what & BEV_EVENT_EOF) ? KM_ERR_CLOSED : KM_ERR_IO;
		char tls[512] = "";
		km_err kind = KM_ERR_IO;
		if (what & BEV_EVENT_ERROR)
			kind = km_net_bev_error(bev, tls, sizeof(tls));
		KM_LOG((c->opts.quiet_failures && c->state != C_READY) ? KM_LOG_DEBUG : KM_LOG_INFO, "net", c->id,
		       "connection to %s %s%s%s", c->host,
		       (what & BEV_EVENT_TIMEOUT) ? "timed out" : (what & BEV_EVENT_EOF) ? "closed by peer" : "failed",
		       tls[0] ? ": " : "", tls);
		record_close(c, bev, what, kind, tls);
		client_close(c, err);
	}
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	km_net_client *c = arg;
	pending *front = pending_q_front(&c->fifo);
	(void)fd;
	(void)what;
	if (c->state == C_CLOSED)
		return;
	/* A response being streamed is paced by its consumer: only requests still waiting time out. */
	if (front && now_ms(c->base) >= front->deadline_ms) {
		KM_WARN("net", c->id, "request %d to %s timed out", front->corr, c->host);
		set_reason(c, "%s request timed out", c->state == C_SASL ? "SASL" : c->state == C_NEGOTIATING ? "ApiVersions"
														: "a");
		client_close(c, KM_ERR_TIMEOUT);
		return;
	}
	if (front)
		arm_timer(c);
}

km_net_client *km_net_client_new(struct event_base *base, const km_net_client_opts *opts)
{
	km_net_client *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->base = base;
	c->opts = *opts;
	c->client_id = strdup(opts->client_id ? opts->client_id : "kmirror");
	c->held = evbuffer_new();
	c->chunk = evbuffer_new();
	c->timer = evtimer_new(base, timer_cb, c);
	c->reauth_ev = evtimer_new(base, reauth_cb, c);
	c->resume = event_new(base, -1, 0, resume_cb, c);
	c->id = next_client_id++;
	pending_q_init(&c->fifo);
	pending_q_init(&c->queued);
	for (int i = 0; i < MAX_KEYS; i++)
		c->versions[i] = -1;
	if (!c->client_id || !c->held || !c->chunk || !c->timer || !c->reauth_ev || !c->resume) {
		km_net_client_free(c);
		return NULL;
	}
	return c;
}

km_err km_net_client_connect(km_net_client *c, const char *host, uint16_t port)
{
	int64_t tmo = c->opts.connect_timeout_ms ? c->opts.connect_timeout_ms : 10000;
	struct timeval tv = {(time_t)(tmo / 1000), (suseconds_t)((tmo % 1000) * 1000)};
	size_t hl = strlen(host) + 8;

	if (c->state != C_IDLE)
		return KM_ERR_INVAL;
	c->reason[0] = 0;
	free(c->host);
	c->host = malloc(hl);
	if (!c->host)
		return KM_ERR_NOMEM;
	snprintf(c->host, hl, "%s:%u", host, port);
	c->bev = km_net_bev_new(c->base, -1, c->opts.tls, false, host, c->opts.tls_verify_host);
	if (!c->bev)
		return KM_ERR_NOMEM;
	km_net_bev_setcb(c->bev, read_cb, NULL, event_cb, c);
	bufferevent_set_timeouts(c->bev, &tv, &tv);
	km_net_bev_enable(c->bev, EV_READ | EV_WRITE);
	set_state(c, C_CONNECTING);
	if (bufferevent_socket_connect_hostname(c->bev, c->opts.dns, AF_UNSPEC, host, port) != 0) {
		client_close(c, KM_ERR_IO);
		return KM_ERR_IO;
	}
	return KM_OK;
}

bool km_net_client_ready(const km_net_client *c)
{
	return c->state == C_READY;
}

size_t km_net_client_inflight(const km_net_client *c)
{
	return c->inflight;
}

void km_net_client_stats_get(const km_net_client *c, km_net_client_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->inflight = c->inflight;
	st->inflight_bytes = c->inflight_bytes;
	st->unreleased = c->unreleased;
	st->peak_buffered = c->peak_buffered;
	st->peak_unreleased = c->peak_unreleased;
	st->bytes_in = c->bytes_in;
	st->paused = c->paused;
}

static void free_later(evutil_socket_t fd, short what, void *arg)
{
	km_net_client *c = arg;
	(void)fd;
	(void)what;
	km_sasl_free(c->sasl);
	km_ring_free(&c->fifo);
	km_ring_free(&c->queued);
	for (size_t i = 0; i < c->nfeatures; i++)
		free(c->features[i].name);
	free(c->features);
	if (c->chunk)
		evbuffer_free(c->chunk);
	free(c->client_id);
	free(c->host);
	free(c);
}

void km_net_client_free(km_net_client *c)
{
	static const struct timeval zero = {0, 0};
	if (!c || c->freed)
		return;
	c->freed = true;
	client_close(c, KM_ERR_CLOSED);
	km_net_rpc_client_gone(c);
	if (c->timer) {
		event_free(c->timer);
		c->timer = NULL;
	}
	if (c->reauth_ev) {
		event_free(c->reauth_ev);
		c->reauth_ev = NULL;
	}
	if (c->resume) {
		event_free(c->resume);
		c->resume = NULL;
	}
	if (c->held) {
		evbuffer_free(c->held);
		c->held = NULL;
	}
	/* Freed at the end of this loop iteration: we may be inside one of our own callbacks. */
	if (event_base_once(c->base, -1, EV_TIMEOUT, free_later, c, &zero) != 0)
		free_later(-1, 0, c);
}

struct event_base *km_net_client_base(const km_net_client *c) { return c->base; }

km_net_rpc **km_net_client_rpc_waiting(km_net_client *c) { return &c->rpc_waiting; }

void km_net_client_opts_upstream(km_net_client_opts *o, const struct km_config *cfg)
{
	o->tls_verify_host = cfg->upstream_tls_verify_hostname;
	o->sasl_mechanism = cfg->upstream_sasl_mechanism;
	o->sasl_username = cfg->upstream_sasl_username;
	o->sasl_password = cfg->upstream_sasl_password;
	o->sasl_kerberos_service_name = cfg->upstream_sasl_kerberos_service_name;
	o->sasl_kerberos_keytab = cfg->upstream_sasl_kerberos_keytab;
	o->sasl_kerberos_principal = cfg->upstream_sasl_kerberos_principal;
	o->sasl_kerberos_setting = "upstream_sasl_kerberos_keytab";
	o->sasl_kerberos_host = cfg->upstream_sasl_kerberos_host;
	o->sasl_oauthbearer_token_endpoint_url = cfg->upstream_sasl_oauthbearer_token_endpoint_url;
	o->sasl_oauthbearer_setting = "upstream_sasl_oauthbearer_token_endpoint_url";
	o->sasl_oauthbearer_client_id = cfg->upstream_sasl_oauthbearer_client_id;
	o->sasl_oauthbearer_client_secret = cfg->upstream_sasl_oauthbearer_client_secret;
	o->sasl_oauthbearer_scope = cfg->upstream_sasl_oauthbearer_scope;
	o->sasl_oauthbearer_token_command = cfg->upstream_sasl_oauthbearer_token_command;
}
