/* Upstream swap: the proxy moves to another cluster on command; the previous upstream's sessions drain gradually. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/time.h>

#include <openssl/ssl.h>

#include "kmirror/log.h"
#include "proxy/proxy_int.h"

/* How long the new upstream may take to answer and have its mirror state read back. */
#define SWAP_PREPARE_MS 60000

/* A swap being prepared: the next configuration (the current one with the new upstream). */
typedef struct km_swap {
	km_proxy *px;
	km_config cfg;
	void *handle; /* the daemon's modules for cfg */
	struct event *timeout_ev;
	uint64_t started_ms;
	km_proxy_swap_done done;
	void *arg;
} km_swap;

/* A previous upstream: the host its sessions keep until they are drained, and its modules. */
typedef struct km_prev_upstream {
	km_proxy *px;
	km_session_host host;
	km_proxy_features features; /* the proxy's at the swap, without the Fetch hold */
	km_config cfg;
	km_cluster *upstream; /* where its brokers were, as its sessions still reach them; nothing learned any more */
	SSL_CTX *own_tls;     /* the context its cluster's clients were made with */
	void *handle;
	struct event *drain_ev;
	size_t per_round;
	uint64_t deadline_ms;
	struct km_prev_upstream *next;
} km_prev_upstream;

void km_proxy_set_swap_ops(km_proxy *px, const km_proxy_swap_ops *ops, void *current)
{
	px->swap_ops = *ops;
	px->gen = current;
}

static void upstream_text(const km_config *cfg, char *buf, size_t len)
{
	km_config_format_upstream(cfg->upstream, cfg->upstream_count, buf, len);
}

/* The same for a log line: a swap's list came in the body of an HTTP request (escaped). */
static void upstream_log_text(const km_config *cfg, char *buf, size_t len)
{
	char up[1024];
	upstream_text(cfg, up, sizeof(up));
	km_log_escape(buf, len, up, (int32_t)strlen(up));
}

static void swap_end(km_swap *sw, km_err err, const char *msg)
{
	km_proxy *px = sw->px;
	char esc[2048]; /* a log line's worth */

	snprintf(px->swap_last, sizeof(px->swap_last), "%s", msg);
	km_log_escape(esc, sizeof(esc), msg, (int32_t)strlen(msg));
	if (err == KM_OK)
		KM_INFO("proxy", 0, "upstream swap: %s", esc);
	else
		KM_ERROR("proxy", 0, "upstream swap failed: %s", esc);
	px->swap = NULL;
	if (sw->timeout_ev)
		event_free(sw->timeout_ev);
	if (sw->done)
		sw->done(sw->arg, err, msg);
	km_config_free(&sw->cfg);
	free(sw);
}

/* ---- the previous upstream's host: its brokers as they were, nothing learned any more ---- */

static bool prev_broker_addr(void *arg, int32_t node_id, const char **host, uint16_t *port)
{
	km_prev_upstream *pu = arg;
	return pu->upstream && km_cluster_addr(pu->upstream, node_id, host, port);
}

static void prev_rewrite_ctx(void *arg, km_rewrite_ctx *ctx)
{
	km_prev_upstream *pu = arg;
	km_proxy_fill_rewrite_ctx(pu->px, ctx, NULL, NULL);
}

static void prev_free(km_prev_upstream *pu)
{
	km_proxy *px = pu->px;
	for (km_prev_upstream **pp = &px->prev; *pp; pp = &(*pp)->next)
		if (*pp == pu) {
			*pp = pu->next;
			break;
		}
	if (pu->drain_ev)
		event_free(pu->drain_ev);
	if (px->swap_ops.release && pu->handle)
		px->swap_ops.release(px->swap_ops.arg, pu->handle);
	SSL_CTX_free(pu->host.server_tls);
	SSL_CTX_free(pu->host.upstream_tls);
	km_config_free(&pu->cfg);
	km_cluster_free(pu->upstream);
	SSL_CTX_free(pu->own_tls);
	free(pu);
}

static void prev_drain_round(evutil_socket_t fd, short what, void *arg)
{
	km_prev_upstream *pu = arg;
	km_proxy *px = pu->px;
	uint64_t now = km_proxy_now_ms(px);
	size_t left = km_session_set_count_of(px->sessions, &pu->host);
	char up[KM_LOG_ESCAPED_SIZE(1024)];

	upstream_log_text(&pu->cfg, up, sizeof(up));
	if (left && now >= pu->deadline_ms) {
		KM_WARN("proxy", 0, "previous upstream %s: drain timeout, closing its remaining %zu connection(s)", up, left);
		km_session_set_close_of(px->sessions, &pu->host, "upstream swap: drain timeout");
	} else if (left) {
		km_session_set_drain_of(px->sessions, &pu->host, pu->per_round);
	}
	if (km_session_set_count_of(px->sessions, &pu->host) == 0) {
		KM_INFO("proxy", 0, "previous upstream %s: every client connection moved on; its modules are released", up);
		prev_free(pu);
	}
}

/* The current upstream as its sessions see it, moved into a previous upstream of its own. */
static km_prev_upstream *prev_new(km_proxy *px)
{
	km_prev_upstream *pu = calloc(1, sizeof(*pu));

	if (!pu)
		return NULL;
	if (km_config_copy(&pu->cfg, &px->cfg) != KM_OK) {
		free(pu);
		return NULL;
	}
	pu->drain_ev = event_new(px->base, -1, EV_PERSIST, prev_drain_round, pu);
	if (!pu->drain_ev) {
		km_config_free(&pu->cfg);
		free(pu);
		return NULL;
	}
	pu->px = px;
	pu->host = px->host;
	pu->features = px->features;
	pu->features.fetch_oor_hold_until_ms = 0; /* its connections answer only what they had in flight */
	pu->host.features = &pu->features;
	pu->host.cfg = &pu->cfg;
	pu->host.rewrite_ctx = prev_rewrite_ctx;
	pu->host.broker_addr = prev_broker_addr;
	pu->host.arg = pu;
	if (pu->host.server_tls)
		SSL_CTX_up_ref(pu->host.server_tls);
	if (pu->host.upstream_tls)
		SSL_CTX_up_ref(pu->host.upstream_tls);
	pu->handle = px->gen;
	return pu;
}

/* ---- the swap ---- */

static void swap_timeout(evutil_socket_t fd, short what, void *arg)
{
	km_swap *sw = arg;
	km_proxy *px = sw->px;
	char up[1024], msg[1400];

	upstream_text(&sw->cfg, up, sizeof(up));
	snprintf(msg, sizeof(msg),
		 "%s did not answer, or its mirror state was not read back, within %d s; still fronting the previous "
		 "upstream (check the address, its listeners and the upstream_tls/upstream_sasl settings, then retry)",
		 up, SWAP_PREPARE_MS / 1000);
	if (px->swap_ops.release)
		px->swap_ops.release(px->swap_ops.arg, sw->handle);
	swap_end(sw, KM_ERR_TIMEOUT, msg);
}

km_err km_proxy_swap(km_proxy *px, const char *upstream, km_proxy_swap_done done, void *arg, char *err,
		     size_t errlen)
{
	km_swap *sw;
	char sub[400], now[1024], next[1024];
	struct timeval tv = {SWAP_PREPARE_MS / 1000, 0};
	km_err rc = KM_ERR_INVAL;

	if (px->draining) {
		snprintf(err, errlen, "kmirrord is draining for shutdown: no upstream swap now");
		return KM_ERR_INVAL;
	}
	if (!px->cfg.upstream_file) {
		snprintf(err, errlen, "upstream swap needs upstream_file (where the new upstream is kept for the next "
			 "start): set it and restart kmirrord");
		return KM_ERR_INVAL;
	}
	if (!px->swap_ops.prepare) {
		snprintf(err, errlen, "this kmirrord cannot swap its upstream");
		return KM_ERR_INVAL;
	}
	if (px->swap) {
		upstream_text(&px->swap->cfg, next, sizeof(next));
		snprintf(err, errlen, "an upstream swap to %s is in progress: wait for it (GET /admin/upstream)", next);
		return KM_ERR_INVAL;
	}
	if (!(sw = calloc(1, sizeof(*sw))) || km_config_copy(&sw->cfg, &px->cfg) != KM_OK) {
		free(sw);
		snprintf(err, errlen, "out of memory");
		return KM_ERR_NOMEM;
	}
	sw->px = px;
	if (!upstream || km_config_set(&sw->cfg, "upstream", upstream, sub, sizeof(sub)) != KM_OK ||
	    sw->cfg.upstream_count == 0) {
		snprintf(err, errlen, "%s", upstream && *upstream ? sub : "upstream: give HOST:PORT[,HOST:PORT...]");
		goto fail;
	}
	upstream_text(&px->cfg, now, sizeof(now));
	upstream_text(&sw->cfg, next, sizeof(next));
	if (!strcmp(now, next)) {
		snprintf(err, errlen, "kmirrord fronts %s already", now);
		goto fail;
	}
	sw->timeout_ev = evtimer_new(px->base, swap_timeout, sw);
	if (!sw->timeout_ev || evtimer_add(sw->timeout_ev, &tv) != 0) {
		snprintf(err, errlen, "out of memory");
		rc = KM_ERR_NOMEM;
		goto fail;
	}
	sw->started_ms = km_proxy_now_ms(px);
	sw->done = done;
	sw->arg = arg;
	px->swap = sw;
	if (KM_LOG_INFO <= km_log_current) {
		char esc[KM_LOG_ESCAPED_SIZE(1024)];
		upstream_log_text(&sw->cfg, esc, sizeof(esc));
		KM_INFO("proxy", 0, "upstream swap from %s to %s: connecting and reading its mirror state", now, esc);
	}
	if (!(sw->handle = px->swap_ops.prepare(px->swap_ops.arg, &sw->cfg))) {
		px->swap = NULL;
		snprintf(err, errlen, "cannot prepare the modules for %s (see the log)", next);
		goto fail;
	}
	return KM_OK;
fail:
	if (sw->timeout_ev)
		event_free(sw->timeout_ev);
	km_config_free(&sw->cfg);
	free(sw);
	return rc;
}

bool km_proxy_swap_ready(km_proxy *px, void *handle, km_state *st, km_mirror *mi, km_err err, const char *msg)
{
	km_swap *sw = px->swap;
	km_prev_upstream *pu;
	char up[1024], prev[1024], why[600], text[2400];
	size_t moving, rounds;
	struct timeval iv;

	if (!sw || sw->handle != handle) /* a swap that timed out released it already */
		return false;
	upstream_text(&sw->cfg, up, sizeof(up));
	upstream_text(&px->cfg, prev, sizeof(prev));
	if (err != KM_OK) {
		snprintf(text, sizeof(text), "%s: %s; still fronting %s", up, msg ? msg : km_err_name(err), prev);
		px->swap_ops.release(px->swap_ops.arg, handle);
		swap_end(sw, err, text);
		return false;
	}
	if (!(pu = prev_new(px))) {
		snprintf(text, sizeof(text), "out of memory; still fronting %s", prev);
		px->swap_ops.release(px->swap_ops.arg, handle);
		swap_end(sw, KM_ERR_NOMEM, text);
		return false;
	}
	/* Persisted before any client sees the new upstream: a restart comes back to it. */
	if ((err = km_config_write_upstream_file(px->cfg.upstream_file, sw->cfg.upstream, sw->cfg.upstream_count, why,
						 sizeof(why))) != KM_OK) {
		pu->handle = NULL;
		prev_free(pu);
		snprintf(text, sizeof(text), "%s; still fronting %s (fix the file's directory or permissions, then retry)",
			 why, prev);
		px->swap_ops.release(px->swap_ops.arg, handle);
		swap_end(sw, err, text);
		return false;
	}
	/* Every open session stays with the previous upstream until it is drained; new ones get the new one. */
	km_session_set_rehost(px->sessions, &pu->host);
	memcpy(px->cfg.upstream, sw->cfg.upstream, sizeof(px->cfg.upstream));
	px->cfg.upstream_count = sw->cfg.upstream_count;
	px->meta_last_ok_ms = 0;
	/* The previous upstream keeps its brokers' addresses; the new one's are unknown until its metadata names them. */
	pu->upstream = px->upstream;
	px->upstream = NULL;
	if ((pu->own_tls = px->own_tls))
		SSL_CTX_up_ref(pu->own_tls); /* its cluster's clients were made with it */
	if (km_proxy_upstream_new(px, NULL) != KM_OK)
		KM_ERROR("proxy", 0, "upstream swap: out of memory for the new upstream's clients; metadata refresh stops");
	km_proxy_set_state(px, st);
	km_proxy_set_mirror(px, mi);
	px->gen = handle;
	pu->next = px->prev;
	px->prev = pu;
	km_proxy_refresh_now(px);

	moving = km_session_set_count_of(px->sessions, &pu->host);
	rounds = (size_t)(px->cfg.drain_timeout_ms / px->cfg.drain_interval_ms);
	if (rounds < 1)
		rounds = 1;
	pu->per_round = (moving + rounds - 1) / rounds;
	if (pu->per_round < 1)
		pu->per_round = 1;
	pu->deadline_ms = km_proxy_now_ms(px) + (uint64_t)px->cfg.drain_timeout_ms;
	/*
	 * A consumer that moves over may fetch at the previous cluster's position before its group
	 * learns (at its next heartbeat, UNKNOWN_MEMBER_ID) that it must rejoin and read the committed
	 * offsets here: past this cluster's end, that fetch would reset it (auto.offset.reset).
	 */
	if (px->cfg.swap_fetch_hold_ms > 0)
		px->features.fetch_oor_hold_until_ms = pu->deadline_ms + (uint64_t)px->cfg.swap_fetch_hold_ms;
	iv.tv_sec = (time_t)(px->cfg.drain_interval_ms / 1000);
	iv.tv_usec = (suseconds_t)((px->cfg.drain_interval_ms % 1000) * 1000);
	event_add(pu->drain_ev, &iv);
	snprintf(text, sizeof(text),
		 "now fronting %s (was %s); %zu client connection(s) of the previous upstream move over, %zu every %lld ms, "
		 "within %lld ms",
		 up, prev, moving, pu->per_round, (long long)px->cfg.drain_interval_ms, (long long)px->cfg.drain_timeout_ms);
	swap_end(sw, KM_OK, text);
	return true;
}

void km_proxy_json_str(struct evbuffer *out, const char *s)
{
	evbuffer_add(out, "\"", 1);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			evbuffer_add_printf(out, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			evbuffer_add_printf(out, "\\u%04x", (unsigned)(unsigned char)*s);
		else
			evbuffer_add(out, s, 1);
	}
	evbuffer_add(out, "\"", 1);
}

void km_proxy_swap_status(km_proxy *px, struct evbuffer *out)
{
	char up[1024];
	bool first = true;

	upstream_text(&px->cfg, up, sizeof(up));
	evbuffer_add_printf(out, "{\"upstream\": ");
	km_proxy_json_str(out, up);
	evbuffer_add_printf(out, ", \"connections\": %zu, \"swapping_to\": ", km_session_set_count_of(px->sessions,
											     &px->host));
	if (px->swap) {
		upstream_text(&px->swap->cfg, up, sizeof(up));
		km_proxy_json_str(out, up);
		evbuffer_add_printf(out, ", \"swap_elapsed_ms\": %llu",
				    (unsigned long long)(km_proxy_now_ms(px) - px->swap->started_ms));
	} else {
		evbuffer_add_printf(out, "null");
	}
	evbuffer_add_printf(out, ", \"draining\": [");
	for (km_prev_upstream *pu = px->prev; pu; pu = pu->next) {
		upstream_text(&pu->cfg, up, sizeof(up));
		evbuffer_add_printf(out, "%s{\"upstream\": ", first ? "" : ", ");
		km_proxy_json_str(out, up);
		evbuffer_add_printf(out, ", \"connections\": %zu}", km_session_set_count_of(px->sessions, &pu->host));
		first = false;
	}
	evbuffer_add_printf(out, "], \"last_swap\": ");
	if (px->swap_last[0])
		km_proxy_json_str(out, px->swap_last);
	else
		evbuffer_add_printf(out, "null");
	evbuffer_add_printf(out, "}\n");
}

void km_proxy_swap_free(km_proxy *px)
{
	while (px->prev)
		prev_free(px->prev);
	if (px->swap) {
		km_swap *sw = px->swap;
		if (px->swap_ops.release)
			px->swap_ops.release(px->swap_ops.arg, sw->handle);
		sw->done = NULL;
		swap_end(sw, KM_ERR_CLOSED, "kmirrord stopped during the swap");
	}
}

/* ---- the Fetch hold: a stage of the Fetch row ---- */

static uint64_t host_now_ms(const km_session_host *h)
{
	struct timeval tv;
	event_base_gettimeofday_cached(h->base, &tv);
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* After an upstream swap: a forwarded Fetch's answer is walked, to hold OFFSET_OUT_OF_RANGE back. */
static km_err hold_classify(km_req *rq)
{
	const km_session_host *h = km_session_host_of(rq->s);

	if ((rq->resp == KM_RESP_FORWARD || rq->resp == KM_RESP_STREAM) &&
	    h->features->fetch_oor_hold_until_ms > host_now_ms(h) && km_fetch_walk_supported(rq->h->api_version)) {
		rq->resp = KM_RESP_STREAM;
		rq->marks |= KM_REQ_MARK_OOR_HOLD;
	}
	return KM_OK;
}

/*
 * The partition's ErrorCode (right before HighWatermark, still here: nothing from the partition's
 * start on has been sent) becomes OFFSET_NOT_AVAILABLE; the watermarks stay -1, as the broker sent
 * them with the error.
 */
static km_err hold_partition(const km_stream_ev *e)
{
	km_fetch_walk *w = e->w;
	uint8_t code[2];

	if (!(e->marks & KM_REQ_MARK_OOR_HOLD) || w->part.error_code != KM_KAFKA_OFFSET_OUT_OF_RANGE)
		return KM_OK;
	km_put_be16(code, (uint16_t)KM_KAFKA_OFFSET_NOT_AVAILABLE);
	if (!km_evbuf_patch(e->in, w->part.high_watermark_off - 2 - e->first, code, 2))
		return KM_ERR_DECODE;
	w->part.error_code = KM_KAFKA_OFFSET_NOT_AVAILABLE;
	km_session_host_of(e->s)->metrics->fetch_oor_held_total++;
	KM_DEBUG("proxy", km_session_id(e->s),
		 "Fetch of partition %d: OFFSET_OUT_OF_RANGE answered as OFFSET_NOT_AVAILABLE (after an upstream swap)",
		 w->part.partition);
	return KM_OK;
}

static const km_stream_hooks hold_hooks = {.on_partition = hold_partition};

static const km_proxy_stage hold_stages[] = {
	{.key = KM_API_FETCH, .classify = hold_classify, .stream = &hold_hooks,
	 .note = "for swap_fetch_hold_ms after an upstream swap: OFFSET_OUT_OF_RANGE answered as OFFSET_NOT_AVAILABLE"},
};

const km_proxy_feature km_swap_hold_feature = {"swap-hold", hold_stages, 1};
