/* Async Kafka client connection: framing, correlation ids, in-order completion, timeouts, optional TLS and SASL/PLAIN. */
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>

#include "kmirror/log.h"
#include "kmirror/net.h"

#define KM_API_SASL_HANDSHAKE 17
#define KM_API_SASL_AUTHENTICATE 36

typedef struct pending {
	int32_t corr;
	int resp_hdr_version;
	uint64_t deadline_ms;
	km_net_response_cb cb;
	void *arg;
} pending;

typedef enum { C_IDLE, C_CONNECTING, C_SASL, C_READY, C_CLOSED } client_state;

struct km_net_client {
	struct event_base *base;
	km_net_client_opts opts;
	char *client_id;
	char *host;
	struct bufferevent *bev;
	struct evbuffer *held; /* framed requests waiting for the connection to be ready */
	struct event *timer;
	client_state state;
	int32_t next_corr;
	pending *fifo;
	size_t head, count, cap;
	pending *held_p; /* requests in held, in order: they enter the FIFO after SASL's own requests */
	size_t held_count, held_cap;
	uint64_t id;
	km_sasl *sasl;
	bool freed;
};

static uint64_t next_client_id = 1;

static uint64_t now_ms(struct event_base *base)
{
	struct timeval tv;
	event_base_gettimeofday_cached(base, &tv);
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

static void fail_all(km_net_client *c, km_err err)
{
	/* Held requests were sent first, so they fail first too. */
	for (size_t i = 0; i < c->held_count; i++) {
		pending p = c->held_p[i];
		c->held_p[i].cb = NULL;
		if (p.cb)
			p.cb(c, err, NULL, 0, p.arg);
	}
	c->held_count = 0;
	while (c->count) {
		pending p = c->fifo[c->head];
		c->head = (c->head + 1) % c->cap;
		c->count--;
		if (p.cb)
			p.cb(c, err, NULL, 0, p.arg);
	}
}

static void client_close(km_net_client *c, km_err err)
{
	bool notify = c->state != C_CLOSED;
	c->state = C_CLOSED;
	if (c->bev) {
		bufferevent_free(c->bev);
		c->bev = NULL;
	}
	if (c->timer)
		event_del(c->timer);
	fail_all(c, err);
	if (notify && !c->freed && c->opts.on_state)
		c->opts.on_state(c, err, c->opts.arg);
}

static bool fifo_push(km_net_client *c, const pending *p)
{
	if (c->count == c->cap) {
		size_t ncap = c->cap ? c->cap * 2 : 16;
		pending *n = malloc(ncap * sizeof(*n));
		if (!n)
			return false;
		for (size_t i = 0; i < c->count; i++)
			n[i] = c->fifo[(c->head + i) % c->cap];
		free(c->fifo);
		c->fifo = n;
		c->cap = ncap;
		c->head = 0;
	}
	c->fifo[(c->head + c->count) % c->cap] = *p;
	c->count++;
	return true;
}

static void write_frame(struct evbuffer *out, int16_t key, int16_t ver, int32_t corr, const char *client_id,
			int hdr_version, const uint8_t *body, size_t len)
{
	uint8_t hdr[4 + 8 + 2];
	size_t cid_len = client_id ? strlen(client_id) : 0;
	size_t hlen = 8 + (hdr_version >= 1 ? 2 + cid_len : 0) + (hdr_version >= 2 ? 1 : 0);

	km_put_be32(hdr, (uint32_t)(hlen + len));
	km_put_be16(hdr + 4, (uint16_t)key);
	km_put_be16(hdr + 6, (uint16_t)ver);
	km_put_be32(hdr + 8, (uint32_t)corr);
	evbuffer_add(out, hdr, 12);
	if (hdr_version >= 1) {
		km_put_be16(hdr, (uint16_t)cid_len);
		evbuffer_add(out, hdr, 2);
		evbuffer_add(out, client_id, cid_len);
	}
	if (hdr_version >= 2)
		evbuffer_add(out, "\0", 1);
	evbuffer_add(out, body, len);
}

static void arm_timer(km_net_client *c)
{
	struct timeval tv = {0, 250000};
	if (c->timer && !event_pending(c->timer, EV_TIMEOUT, NULL))
		event_add(c->timer, &tv);
}

static km_err send_internal(km_net_client *c, int16_t key, int16_t ver, int hdr_version, int resp_hdr_version,
			    const uint8_t *body, size_t len, km_net_response_cb cb, void *arg, bool bypass_hold)
{
	pending p;
	int64_t tmo = c->opts.request_timeout_ms ? c->opts.request_timeout_ms : 30000;

	if (c->state == C_CLOSED || c->state == C_IDLE)
		return KM_ERR_CLOSED;
	if (len > (size_t)INT32_MAX - 64)
		return KM_ERR_TOO_LARGE;
	p.corr = c->next_corr++;
	if (c->next_corr < 0)
		c->next_corr = 0;
	p.resp_hdr_version = resp_hdr_version;
	p.deadline_ms = now_ms(c->base) + (uint64_t)tmo;
	p.cb = cb;
	p.arg = arg;
	if (c->state == C_READY || bypass_hold) {
		if (cb && !fifo_push(c, &p))
			return KM_ERR_NOMEM;
		write_frame(bufferevent_get_output(c->bev), key, ver, p.corr, c->client_id, hdr_version, body, len);
	} else {
		if (cb) {
			if (c->held_count == c->held_cap) {
				size_t ncap = c->held_cap ? c->held_cap * 2 : 8;
				pending *n = realloc(c->held_p, ncap * sizeof(*n));
				if (!n)
					return KM_ERR_NOMEM;
				c->held_p = n;
				c->held_cap = ncap;
			}
			c->held_p[c->held_count++] = p;
		}
		write_frame(c->held, key, ver, p.corr, c->client_id, hdr_version, body, len);
	}
	if (cb)
		arm_timer(c);
	return KM_OK;
}

km_err km_net_client_send(km_net_client *c, int16_t api_key, int16_t api_version, int hdr_version,
			  int resp_hdr_version, const uint8_t *body, size_t len, km_net_response_cb cb, void *arg)
{
	return send_internal(c, api_key, api_version, hdr_version, resp_hdr_version, body, len, cb, arg, false);
}

static void became_ready(km_net_client *c)
{
	c->state = C_READY;
	for (size_t i = 0; i < c->held_count; i++) {
		if (!fifo_push(c, &c->held_p[i])) {
			client_close(c, KM_ERR_NOMEM);
			return;
		}
	}
	c->held_count = 0;
	if (evbuffer_get_length(c->held))
		evbuffer_add_buffer(bufferevent_get_output(c->bev), c->held);
	KM_DEBUG("net", c->id, "connection to %s ready", c->host);
	if (c->opts.on_state)
		c->opts.on_state(c, KM_OK, c->opts.arg);
}

/* ---- SASL: SaslHandshake v1, then SaslAuthenticate v1 rounds driven by the mechanism provider ---- */

static void sasl_auth_done(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg);

static void sasl_send(km_net_client *c, const uint8_t *in, size_t inlen)
{
	km_wr tok, w;
	bool done = false;
	km_err rc;

	km_wr_init(&tok);
	rc = km_sasl_step(c->sasl, in, inlen, &tok, &done);
	if (rc != KM_OK) {
		KM_WARN("net", c->id, "SASL %s with %s failed: the server's answer did not verify", c->opts.sasl_mechanism,
			c->host);
		km_wr_free(&tok);
		client_close(c, KM_ERR_SASL);
		return;
	}
	if (done) {
		km_wr_free(&tok);
		km_sasl_free(c->sasl);
		c->sasl = NULL;
		became_ready(c);
		return;
	}
	km_wr_init(&w);
	km_wr_bytes(&w, false, (km_bytes){tok.buf, (int32_t)tok.len});
	if (!km_wr_ok(&w) || send_internal(c, KM_API_SASL_AUTHENTICATE, 1, 1, 0, w.buf, w.len, sasl_auth_done, NULL,
					   true) != KM_OK)
		client_close(c, KM_ERR_SASL);
	km_wr_free(&w);
	km_wr_free(&tok);
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
	if (!km_rd_ok(&r) || ec != 0) {
		KM_WARN("net", c->id, "SASL authentication to %s failed: %s %.*s", c->host, km_err_name(ec),
			msg.len > 0 ? msg.len : 0, msg.p ? msg.p : "");
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
		client_close(c, KM_ERR_SASL);
		return;
	}
	sasl_send(c, NULL, 0);
}

static void start_sasl(km_net_client *c)
{
	km_wr w;
	c->state = C_SASL;
	c->sasl = km_sasl_new(c->opts.sasl_mechanism, c->opts.sasl_username, c->opts.sasl_password);
	if (!c->sasl) {
		KM_WARN("net", c->id, "SASL mechanism %s is not supported", c->opts.sasl_mechanism);
		client_close(c, KM_ERR_SASL);
		return;
	}
	km_wr_init(&w);
	km_wr_string(&w, false, km_str_c(c->opts.sasl_mechanism));
	if (!km_wr_ok(&w) ||
	    send_internal(c, KM_API_SASL_HANDSHAKE, 1, 1, 0, w.buf, w.len, sasl_handshake_done, NULL, true) != KM_OK)
		client_close(c, KM_ERR_SASL);
	km_wr_free(&w);
}

/* ---- I/O ---- */

static void read_cb(struct bufferevent *bev, void *arg)
{
	km_net_client *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	int64_t max = c->opts.max_frame_bytes ? c->opts.max_frame_bytes : 104857600;

	/* libevent 2.1 reads 4 KiB per event: take what the socket holds in one go (plain sockets). */
	km_net_bev_fill(bev, 1024 * 1024);
	while (c->state != C_CLOSED && !c->freed) {
		int32_t size;
		km_frame_status st = km_net_frame_peek(in, max, KM_FRAME_MIN_RESPONSE, false, &size);
		uint8_t *frame;
		pending p;
		km_rd r;
		int32_t corr;

		if (st == KM_FRAME_NEED_MORE)
			return;
		if (st != KM_FRAME_READY) {
			KM_WARN("net", c->id, "bad response frame from %s: %s (size %d)", c->host, km_frame_status_name(st),
				size);
			client_close(c, KM_ERR_DECODE);
			return;
		}
		frame = evbuffer_pullup(in, (ev_ssize_t)size + 4);
		if (!frame) {
			client_close(c, KM_ERR_NOMEM);
			return;
		}
		km_rd_init(&r, frame + 4, (size_t)size);
		km_rd_i32(&r, "correlation_id", &corr);
		if (!c->count || c->fifo[c->head].corr != corr) {
			KM_WARN("net", c->id, "unexpected correlation id %d from %s", corr, c->host);
			client_close(c, KM_ERR_DECODE);
			return;
		}
		p = c->fifo[c->head];
		c->head = (c->head + 1) % c->cap;
		c->count--;
		if (p.resp_hdr_version >= 1) {
			uint32_t n, tag, sz;
			km_rd_uvarint(&r, "header_tags", &n);
			for (uint32_t i = 0; i < n && km_rd_ok(&r); i++) {
				km_rd_uvarint(&r, "tag", &tag);
				km_rd_uvarint(&r, "tag_size", &sz);
				km_rd_skip(&r, "tag_data", sz);
			}
		}
		if (!km_rd_ok(&r)) {
			p.cb(c, KM_ERR_DECODE, NULL, 0, p.arg);
			if (c->state != C_CLOSED)
				client_close(c, KM_ERR_DECODE);
			return;
		}
		p.cb(c, KM_OK, r.buf + r.pos, r.len - r.pos, p.arg);
		/* The callback may have closed or freed us; the buffer is gone then. */
		if (c->state == C_CLOSED || c->freed)
			return;
		evbuffer_drain(in, (size_t)size + 4);
	}
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
	km_net_client *c = arg;

	if (what & BEV_EVENT_CONNECTED) {
		int fd = bufferevent_getfd(bev);
		int one = 1;
		if (fd >= 0)
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		/* Reads and writes now time out only through the request timer. */
		bufferevent_set_timeouts(bev, NULL, NULL);
		if (c->opts.sasl_mechanism)
			start_sasl(c);
		else
			became_ready(c);
		return;
	}
	if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)) {
		km_err err = (what & BEV_EVENT_TIMEOUT) ? KM_ERR_TIMEOUT : (what & BEV_EVENT_EOF) ? KM_ERR_CLOSED : KM_ERR_IO;
		char tls[512] = "";
		if (what & BEV_EVENT_ERROR)
			km_net_bev_error(bev, tls, sizeof(tls));
		KM_INFO("net", c->id, "connection to %s %s%s%s", c->host,
			(what & BEV_EVENT_TIMEOUT) ? "timed out" : (what & BEV_EVENT_EOF) ? "closed by peer" : "failed",
			tls[0] ? ": " : "", tls);
		client_close(c, err);
	}
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	km_net_client *c = arg;
	if (c->state == C_CLOSED)
		return;
	if (c->count && now_ms(c->base) >= c->fifo[c->head].deadline_ms) {
		KM_WARN("net", c->id, "request %d to %s timed out", c->fifo[c->head].corr, c->host);
		client_close(c, KM_ERR_TIMEOUT);
		return;
	}
	if (c->count)
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
	c->timer = evtimer_new(base, timer_cb, c);
	c->id = next_client_id++;
	if (!c->client_id || !c->held || !c->timer) {
		km_net_client_free(c);
		return NULL;
	}
	return c;
}

km_err km_net_client_connect(km_net_client *c, const char *host, uint16_t port)
{
	int64_t tmo = c->opts.connect_timeout_ms ? c->opts.connect_timeout_ms : 10000;
	struct timeval tv = {(time_t)(tmo / 1000), (suseconds_t)((tmo % 1000) * 1000)};

	if (c->state != C_IDLE)
		return KM_ERR_INVAL;
	free(c->host);
	c->host = malloc(strlen(host) + 8);
	if (!c->host)
		return KM_ERR_NOMEM;
	sprintf(c->host, "%s:%u", host, port);
	c->bev = km_net_bev_new(c->base, -1, c->opts.tls, false, host, c->opts.tls_verify_host);
	if (!c->bev)
		return KM_ERR_NOMEM;
	bufferevent_setcb(c->bev, read_cb, NULL, event_cb, c);
	bufferevent_set_timeouts(c->bev, &tv, &tv);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	c->state = C_CONNECTING;
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
	return c->count + c->held_count;
}

static void free_later(evutil_socket_t fd, short what, void *arg)
{
	km_net_client *c = arg;
	km_sasl_free(c->sasl);
	free(c->fifo);
	free(c->held_p);
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
	if (c->timer) {
		event_free(c->timer);
		c->timer = NULL;
	}
	if (c->held) {
		evbuffer_free(c->held);
		c->held = NULL;
	}
	/* Freed at the end of this loop iteration: we may be inside one of our own callbacks. */
	if (event_base_once(c->base, -1, EV_TIMEOUT, free_later, c, &zero) != 0)
		free_later(-1, 0, c);
}
