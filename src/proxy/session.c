/* A client session: one client connection, its own upstream connection, and the FIFO of requests in flight. */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/bufferevent_ssl.h>

#include "kmirror/log.h"
#include "proxy/proxy_int.h"

/* One request waiting for its response. local: a response the proxy made itself, sent in order. */
typedef struct inflight {
	int32_t corr;
	int16_t key, version;
	uint64_t t0_us;
	struct evbuffer *local;
	bool started; /* its response is being streamed to the client */
} inflight;

typedef enum { UP_CONNECTING, UP_READY, UP_FAILED } up_state;

struct km_session {
	km_proxy *px;
	uint64_t id;
	int32_t node_id; /* -1: bootstrap port */
	struct bufferevent *cli;
	struct bufferevent *up;
	struct evbuffer *held; /* requests received before the upstream is connected */
	up_state up_state;
	int up_try;            /* bootstrap: index of the upstream address being tried */
	char up_addr[300];
	inflight *fifo;
	size_t head, count, cap;
	bool first_frame;
	bool closed;
	bool draining;
	bool cli_paused;       /* reads from the client paused (FIFO full or upstream buffer full) */
	bool up_paused;        /* reads from upstream paused (client buffer full) */
	uint64_t last_activity_ms;
	uint64_t partial_since_ms; /* last progress of an incomplete request frame; 0: none */
	size_t req_left;       /* bytes of the current request still to forward (cut-through) */
	size_t resp_left;      /* bytes of the current response still to forward (cut-through) */
	bool walking;          /* a Fetch response is streaming while its walk looks for the tail */
	km_fetch_walk walk;
	size_t walk_sent;      /* frame bytes of that response already sent on */
	km_session *prev, *next;
	km_session *next_dead;
};

/*
 * How far a read callback tops up its input from the socket. libevent 2.1 reads at most 4 KiB per
 * readiness event whatever max_single_read says, so a Fetch response crossed the proxy in 4 KiB
 * rounds of FIONREAD, readv, writev and two epoll_ctl: that, not copying, was the proxy's CPU.
 */
#define KM_READ_FILL (256 * 1024)

static uint64_t now_us(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (uint64_t)tv.tv_sec * 1000000 + (uint64_t)tv.tv_usec;
}

km_session *km_session_next(const km_session *s)
{
	return s->next;
}

bool km_session_is_draining(const km_session *s)
{
	return s->draining;
}

void km_session_reap(km_proxy *px)
{
	while (px->dead) {
		km_session *s = px->dead;
		px->dead = s->next_dead;
		km_session_free(s);
	}
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
	km_session_reap(arg);
}

void km_session_free(km_session *s)
{
	for (size_t i = 0; i < s->count; i++) {
		inflight *f = &s->fifo[(s->head + i) % s->cap];
		if (f->local)
			evbuffer_free(f->local);
	}
	free(s->fifo);
	if (s->held)
		evbuffer_free(s->held);
	free(s);
}

static const char client_closed[] = "client closed the connection";

void km_session_close(km_session *s, const char *why)
{
	km_proxy *px = s->px;
	static const struct timeval zero = {0, 0};

	if (s->closed)
		return;
	s->closed = true;
	/* An ordinary client close is not news; everything else is. */
	if (why == client_closed)
		KM_DEBUG("proxy", s->id, "closing client connection (%s), %zu request(s) in flight", why, s->count);
	else
		KM_INFO("proxy", s->id, "closing client connection (%s), %zu request(s) in flight", why, s->count);
	if (s->cli)
		bufferevent_free(s->cli);
	s->cli = NULL;
	if (s->up) {
		bufferevent_free(s->up);
		if (s->up_state == UP_READY && px->metrics.upstream_connections)
			px->metrics.upstream_connections--;
	}
	s->up = NULL;
	if (s->prev)
		s->prev->next = s->next;
	else
		px->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	px->nsessions--;
	px->metrics.client_connections--;
	/* Freed after this loop iteration: we are usually inside one of the session's own callbacks. */
	s->next_dead = px->dead;
	px->dead = s;
	if (!px->reap_ev)
		px->reap_ev = event_new(px->base, -1, 0, reap_cb, px);
	if (px->reap_ev)
		event_add(px->reap_ev, &zero);
	else
		reap_cb(-1, 0, px);
}

static bool fifo_push(km_session *s, const inflight *f)
{
	if (s->count == s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 8;
		inflight *n = malloc(ncap * sizeof(*n));
		if (!n)
			return false;
		for (size_t i = 0; i < s->count; i++)
			n[i] = s->fifo[(s->head + i) % s->cap];
		free(s->fifo);
		s->fifo = n;
		s->cap = ncap;
		s->head = 0;
	}
	s->fifo[(s->head + s->count) % s->cap] = *f;
	s->count++;
	return true;
}

static void fifo_pop(km_session *s)
{
	s->head = (s->head + 1) % s->cap;
	s->count--;
}

static void update_cli_reading(km_session *s)
{
	const km_config *cfg = &s->px->cfg;
	/* A request half forwarded must be finished whatever the FIFO or a drain say: the broker waits
	 * for its end before it answers anything. Buffer limits still apply (the upstream drains). */
	bool pause = (!s->req_left && (s->draining || s->count >= (size_t)cfg->max_inflight_requests)) ||
		     (s->up && evbuffer_get_length(bufferevent_get_output(s->up)) > (size_t)cfg->connection_buffer_bytes) ||
		     evbuffer_get_length(s->held) > (size_t)cfg->connection_buffer_bytes;
	if (!s->cli || pause == s->cli_paused)
		return;
	s->cli_paused = pause;
	if (pause) {
		bufferevent_disable(s->cli, EV_READ);
	} else {
		bufferevent_enable(s->cli, EV_READ);
		/* A partial frame did not stall while we were the ones not reading. */
		if (s->partial_since_ms)
			s->partial_since_ms = km_proxy_now_ms(s->px);
		/* Whole frames may already be buffered: no new bytes would wake us for them. */
		if (evbuffer_get_length(bufferevent_get_input(s->cli)))
			bufferevent_trigger(s->cli, EV_READ, BEV_TRIG_DEFER_CALLBACKS | BEV_TRIG_IGNORE_WATERMARKS);
	}
}

static void update_up_reading(km_session *s)
{
	bool pause;
	if (!s->up || !s->cli)
		return;
	pause = evbuffer_get_length(bufferevent_get_output(s->cli)) > (size_t)s->px->cfg.connection_buffer_bytes;
	if (pause == s->up_paused)
		return;
	s->up_paused = pause;
	if (pause) {
		bufferevent_disable(s->up, EV_READ);
	} else {
		bufferevent_enable(s->up, EV_READ);
		if (evbuffer_get_length(bufferevent_get_input(s->up)))
			bufferevent_trigger(s->up, EV_READ, BEV_TRIG_DEFER_CALLBACKS | BEV_TRIG_IGNORE_WATERMARKS);
	}
}

/* A drained session closes once nothing is in flight and the client has everything. */
static void maybe_finish_drain(km_session *s)
{
	if (s->draining && !s->closed && s->count == 0 && !s->req_left &&
	    (!s->cli || evbuffer_get_length(bufferevent_get_output(s->cli)) == 0))
		km_session_close(s, "draining");
}

/* Send the responses the proxy made itself that are now at the head of the FIFO. */
static void flush_local(km_session *s)
{
	while (s->count && s->fifo[s->head].local && s->cli) {
		inflight *f = &s->fifo[s->head];
		size_t n = evbuffer_get_length(f->local);
		s->px->metrics.client_bytes_out += n;
		evbuffer_add_buffer(bufferevent_get_output(s->cli), f->local);
		evbuffer_free(f->local);
		km_metrics_latency(&s->px->metrics, f->key, (double)(now_us() - f->t0_us) / 1e6);
		fifo_pop(s);
	}
}

/* ---- upstream side ---- */

static void up_connect(km_session *s);

static void up_send(km_session *s, struct evbuffer *src, size_t n)
{
	s->px->metrics.upstream_bytes_out += n;
	if (s->up_state == UP_READY)
		evbuffer_remove_buffer(src, bufferevent_get_output(s->up), n);
	else
		evbuffer_remove_buffer(src, s->held, n);
}

static bool rewrite_small(km_session *s, const inflight *f, struct evbuffer *in, int32_t size)
{
	km_proxy *px = s->px;
	int hv = km_proxy_response_header_version(f->key, f->version);
	uint8_t *frame = evbuffer_pullup(in, (ev_ssize_t)size + 4);
	km_rd r;
	size_t body;
	km_wr w;
	km_rewrite_ctx ctx;
	km_err rc;
	uint8_t pre[4];

	if (!frame)
		return false;
	km_rd_init(&r, frame + 4, (size_t)size);
	km_rd_skip(&r, "correlation_id", 4);
	if (hv >= 1) {
		uint32_t n, tag, sz;
		km_rd_uvarint(&r, "header_tags", &n);
		for (uint32_t i = 0; i < n && km_rd_ok(&r); i++) {
			km_rd_uvarint(&r, "tag", &tag);
			km_rd_uvarint(&r, "tag_size", &sz);
			km_rd_skip(&r, "tag_data", sz);
		}
	}
	if (!km_rd_ok(&r))
		return false;
	body = r.pos;
	km_proxy_rewrite_ctx(px, &ctx);
	km_wr_init(&w);
	km_wr_raw(&w, frame + 4, body); /* correlation id and header tags, unchanged */
	switch (f->key) {
	case KM_API_METADATA:
		rc = km_rewrite_metadata(frame + 4 + body, (size_t)size - body, f->version, &ctx, &w);
		break;
	case KM_API_FIND_COORDINATOR:
		rc = km_rewrite_find_coordinator(frame + 4 + body, (size_t)size - body, f->version, &ctx, &w);
		break;
	case KM_API_DESCRIBE_CLUSTER:
		rc = km_rewrite_describe_cluster(frame + 4 + body, (size_t)size - body, f->version, &ctx, &w);
		break;
	case KM_API_API_VERSIONS:
		rc = km_rewrite_api_versions(frame + 4 + body, (size_t)size - body, f->version, &w);
		break;
	case KM_API_DESCRIBE_CONFIGS:
		rc = km_rewrite_describe_configs(frame + 4 + body, (size_t)size - body, f->version, &ctx, &w);
		break;
	case KM_API_DESCRIBE_QUORUM:
		rc = km_rewrite_describe_quorum(frame + 4 + body, (size_t)size - body, f->version, &ctx, &w);
		break;
	case KM_API_SHARE_FETCH:
		rc = km_rewrite_share_fetch(frame + 4 + body, (size_t)size - body, f->version, &ctx, &w);
		break;
	case KM_API_SHARE_ACKNOWLEDGE:
		rc = km_rewrite_share_acknowledge(frame + 4 + body, (size_t)size - body, f->version, &ctx, &w);
		break;
	default:
		rc = KM_ERR_UNSUPPORTED;
	}
	if (rc != KM_OK || !km_wr_ok(&w) || w.len > INT32_MAX) {
		km_wr_free(&w);
		return false;
	}
	km_put_be32(pre, (uint32_t)w.len);
	evbuffer_add(bufferevent_get_output(s->cli), pre, 4);
	evbuffer_add(bufferevent_get_output(s->cli), w.buf, w.len);
	px->metrics.client_bytes_out += 4 + w.len;
	if (ctx.rewritten)
		px->metrics.responses_rewritten_total++;
	km_wr_free(&w);
	evbuffer_drain(in, (size_t)size + 4);
	return true;
}

/* Produce/Fetch: move the body untouched; only a non-empty top-level tag section is re-encoded. */
static bool forward_tail_patched(km_session *s, const inflight *f, struct evbuffer *in, int32_t size)
{
	km_proxy *px = s->px;
	struct evbuffer *out = bufferevent_get_output(s->cli);
	size_t end = (size_t)size + 4, tags_off, tlen;
	uint8_t *tags, pre[4];
	km_rewrite_ctx ctx;
	km_wr w;

	if (km_rewrite_find_top_tags(in, 0, end, f->key, f->version, &tags_off) != KM_OK)
		return false;
	tlen = end - tags_off;
	if (tlen == 1) {
		uint8_t zero = 1;
		km_evrd r;
		km_evrd_init(&r, in, tags_off, end);
		if (km_evrd_raw(&r, &zero, 1) && zero == 0) {
			px->metrics.client_bytes_out += end;
			evbuffer_remove_buffer(in, out, end);
			return true;
		}
	}
	tags = malloc(tlen ? tlen : 1);
	if (!tags)
		return false;
	{
		struct evbuffer_ptr p;
		if (evbuffer_ptr_set(in, &p, tags_off, EVBUFFER_PTR_SET) != 0 ||
		    evbuffer_copyout_from(in, &p, tags, tlen) != (ev_ssize_t)tlen) {
			free(tags);
			return false;
		}
	}
	km_proxy_rewrite_ctx(px, &ctx);
	km_wr_init(&w);
	if (km_rewrite_node_endpoint_tags(tags, tlen, &ctx, &w) != KM_OK || !km_wr_ok(&w)) {
		free(tags);
		km_wr_free(&w);
		return false;
	}
	free(tags);
	km_put_be32(pre, (uint32_t)(tags_off - 4 + w.len));
	evbuffer_add(out, pre, 4);
	evbuffer_drain(in, 4);
	evbuffer_remove_buffer(in, out, tags_off - 4);
	evbuffer_drain(in, tlen);
	evbuffer_add(out, w.buf, w.len);
	px->metrics.client_bytes_out += tags_off + w.len;
	if (ctx.rewritten)
		px->metrics.responses_rewritten_total++;
	km_wr_free(&w);
	return true;
}

/*
 * One round of a streaming Fetch response: send on everything the walk has passed, and at the end
 * check the top-level tags (rewritten in place, same size, when they carry NodeEndpoints).
 * Returns 1 when the response is done, 0 when more bytes are needed, -1 when the session closed.
 */
static int stream_fetch(km_session *s, struct evbuffer *in)
{
	km_proxy *px = s->px;
	struct evbuffer *out = bufferevent_get_output(s->cli);
	size_t have_end = s->walk_sent + evbuffer_get_length(in), upto, tlen;
	int rc = km_fetch_walk_step(&s->walk, in, s->walk_sent);
	uint8_t *tags, *fixed;
	km_rewrite_ctx ctx;

	if (rc < 0) {
		KM_WARN("proxy", s->id, "malformed Fetch v%d response from %s", s->walk.version, s->up_addr);
		px->metrics.upstream_errors_total++;
		km_session_close(s, "unrewritable response");
		return -1;
	}
	/* Bytes before the walk position are never changed. */
	upto = s->walk.pos < have_end ? s->walk.pos : have_end;
	if (upto > s->walk_sent) {
		size_t n = upto - s->walk_sent;
		evbuffer_remove_buffer(in, out, n);
		s->walk_sent += n;
		px->metrics.client_bytes_out += n;
	}
	if (rc == 0 || have_end < s->walk.end)
		return 0;
	/* The tagged fields, whole: usually the single byte 0. */
	tlen = s->walk.end - s->walk.pos;
	tags = evbuffer_pullup(in, (ev_ssize_t)tlen);
	if (!tags || !(fixed = malloc(tlen))) {
		km_session_close(s, "out of memory");
		return -1;
	}
	if (tlen == 1 && tags[0] == 0) {
		memcpy(fixed, tags, 1);
	} else {
		km_proxy_rewrite_ctx(px, &ctx);
		if (km_rewrite_node_endpoint_tags_same_size(tags, tlen, &ctx, fixed) != KM_OK) {
			free(fixed);
			KM_WARN("proxy", s->id, "cannot rewrite the NodeEndpoints of a Fetch v%d response", s->walk.version);
			px->metrics.upstream_errors_total++;
			km_session_close(s, "unrewritable response");
			return -1;
		}
		if (ctx.rewritten)
			px->metrics.responses_rewritten_total++;
	}
	evbuffer_drain(in, tlen);
	evbuffer_add(out, fixed, tlen);
	free(fixed);
	px->metrics.client_bytes_out += tlen;
	s->walking = false;
	fifo_pop(s);
	flush_local(s);
	s->last_activity_ms = km_proxy_now_ms(px);
	return 1;
}

static void up_read_cb(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	km_proxy *px = s->px;
	struct evbuffer *in = bufferevent_get_input(bev);

	if (!s->up_paused)
		km_net_bev_fill(bev, KM_READ_FILL);
	while (!s->closed) {
		int32_t size = 0, corr;
		uint8_t hdr[8];
		inflight f;
		bool ok;
		size_t avail = evbuffer_get_length(in), n;
		km_frame_status st;

		if (s->walking) {
			int rc = stream_fetch(s, in);
			if (rc < 0)
				return; /* closed */
			if (rc == 0)
				break;
			continue;
		}
		if (s->resp_left) {
			/* the rest of a response already started towards the client */
			n = avail < s->resp_left ? avail : s->resp_left;
			if (!n)
				break;
			px->metrics.client_bytes_out += n;
			evbuffer_remove_buffer(in, bufferevent_get_output(s->cli), n);
			s->resp_left -= n;
			if (s->resp_left)
				break;
			fifo_pop(s);
			flush_local(s);
			s->last_activity_ms = km_proxy_now_ms(px);
			continue;
		}
		st = km_net_frame_peek(in, px->cfg.max_frame_bytes, KM_FRAME_MIN_RESPONSE, false, &size);
		if (st == KM_FRAME_NEED_MORE && avail < 8)
			break;
		if (st != KM_FRAME_READY && st != KM_FRAME_NEED_MORE) {
			KM_WARN("proxy", s->id, "bad response frame from %s: %s (size %d)", s->up_addr,
				km_frame_status_name(st), size);
			px->metrics.upstream_errors_total++;
			km_session_close(s, "bad upstream frame");
			return;
		}
		evbuffer_copyout(in, hdr, 8);
		corr = (int32_t)km_be32(hdr + 4);
		if (!s->count || s->fifo[s->head].local || s->fifo[s->head].corr != corr) {
			KM_WARN("proxy", s->id, "response with correlation id %d from %s does not match the oldest request (%d)",
				corr, s->up_addr, s->count ? s->fifo[s->head].corr : -1);
			px->metrics.upstream_errors_total++;
			km_session_close(s, "upstream protocol error");
			return;
		}
		f = s->fifo[s->head];
		if (!km_proxy_response_needs_rewrite(f.key, f.version)) {
			/* Cut through: what has arrived goes now, the rest as it comes. */
			size_t total = (size_t)size + 4;
			px->metrics.upstream_bytes_in += total;
			km_metrics_latency(&px->metrics, f.key, (double)(now_us() - f.t0_us) / 1e6);
			n = avail < total ? avail : total;
			px->metrics.client_bytes_out += n;
			evbuffer_remove_buffer(in, bufferevent_get_output(s->cli), n);
			s->resp_left = total - n;
			s->fifo[s->head].started = true;
			if (s->resp_left)
				break;
			fifo_pop(s);
			flush_local(s);
			s->last_activity_ms = km_proxy_now_ms(px);
			continue;
		}
		if (f.key == KM_API_FETCH && f.version >= 12) {
			/* Fetch: sent on as it arrives, only the top-level tags are held back and checked. */
			px->metrics.upstream_bytes_in += (uint64_t)size + 4;
			km_metrics_latency(&px->metrics, f.key, (double)(now_us() - f.t0_us) / 1e6);
			km_fetch_walk_init(&s->walk, f.version, (size_t)size + 4);
			s->walk_sent = 0;
			s->walking = true;
			s->fifo[s->head].started = true;
			continue;
		}
		if (st != KM_FRAME_READY)
			break; /* other rewritten responses are handled whole */
		px->metrics.upstream_bytes_in += (uint64_t)size + 4;
		km_metrics_latency(&px->metrics, f.key, (double)(now_us() - f.t0_us) / 1e6);
		if (f.key == KM_API_PRODUCE || f.key == KM_API_FETCH)
			ok = forward_tail_patched(s, &f, in, size);
		else
			ok = rewrite_small(s, &f, in, size);
		if (!ok) {
			/* Never pass on a response we could not rewrite: it may hold real broker addresses. */
			KM_WARN("proxy", s->id, "cannot rewrite response to api %d v%d (correlation id %d)", f.key, f.version,
				corr);
			px->metrics.upstream_errors_total++;
			km_session_close(s, "unrewritable response");
			return;
		}
		fifo_pop(s);
		flush_local(s);
		s->last_activity_ms = km_proxy_now_ms(px);
	}
	if (s->closed)
		return;
	update_up_reading(s);
	update_cli_reading(s);
	maybe_finish_drain(s);
}

static void up_write_cb(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	if (!s->closed)
		update_cli_reading(s);
}

static void up_event_cb(struct bufferevent *bev, short what, void *arg)
{
	km_session *s = arg;
	km_proxy *px = s->px;

	if (what & BEV_EVENT_CONNECTED) {
		int fd = bufferevent_getfd(bev), one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		bufferevent_set_timeouts(bev, NULL, NULL);
		s->up_state = UP_READY;
		px->metrics.upstream_connections++;
		KM_DEBUG("proxy", s->id, "upstream %s connected", s->up_addr);
		bufferevent_setwatermark(bev, EV_WRITE, (size_t)px->cfg.connection_buffer_bytes / 2, 0);
		if (evbuffer_get_length(s->held))
			evbuffer_add_buffer(bufferevent_get_output(bev), s->held);
		update_cli_reading(s);
		return;
	}
	if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)) {
		char tls[512] = "";
		bool was_ready = s->up_state == UP_READY;
		px->metrics.upstream_errors_total++; /* refused, timed out, reset, or closed by the broker */
		if (what & BEV_EVENT_ERROR)
			km_net_bev_error(bev, tls, sizeof(tls));
		KM_INFO("proxy", s->id, "upstream %s %s%s%s", s->up_addr,
			(what & BEV_EVENT_TIMEOUT) ? "connect timed out" :
			(what & BEV_EVENT_EOF)     ? "closed the connection" :
			was_ready                  ? "connection failed" : "connect failed",
			tls[0] ? ": " : "", tls);
		/* Bootstrap connections try the next address while nothing has been sent. */
		if (!was_ready && s->node_id < 0 && s->up_try + 1 < px->cfg.upstream_count) {
			bufferevent_free(s->up);
			s->up = NULL;
			s->up_try++;
			up_connect(s);
			return;
		}
		/* The client sees what a broker failure looks like: a disconnect. */
		km_session_close(s, was_ready ? "upstream disconnected" : "upstream unreachable");
	}
}

static void up_connect(km_session *s)
{
	km_proxy *px = s->px;
	const char *host;
	uint16_t port;
	int64_t tmo = px->cfg.upstream_connect_timeout_ms;
	struct timeval tv = {(time_t)(tmo / 1000), (suseconds_t)((tmo % 1000) * 1000)};

	if (s->node_id < 0) {
		host = px->cfg.upstream[s->up_try].host;
		port = px->cfg.upstream[s->up_try].port;
	} else if (!km_proxy_broker_addr(px, s->node_id, &host, &port)) {
		km_session_close(s, "broker no longer known");
		return;
	}
	snprintf(s->up_addr, sizeof(s->up_addr), "%s:%u", host, port);
	s->up_state = UP_CONNECTING;
	s->up = km_net_bev_new(px->base, -1, px->upstream_tls, false, host, px->cfg.upstream_tls_verify_hostname);
	if (!s->up) {
		km_session_close(s, "out of memory");
		return;
	}
	px->metrics.upstream_connects_total++;
	bufferevent_setcb(s->up, up_read_cb, up_write_cb, up_event_cb, s);
	bufferevent_set_timeouts(s->up, &tv, &tv);
	bufferevent_enable(s->up, EV_READ | EV_WRITE);
	if (bufferevent_socket_connect_hostname(s->up, px->dns, AF_UNSPEC, host, port) != 0)
		up_event_cb(s->up, BEV_EVENT_ERROR, s);
}

/* ---- client side ---- */

static void reject(km_session *s, km_reject_reason why, const char *msg)
{
	s->px->metrics.rejected[why]++;
	KM_WARN("proxy", s->id, "%s", msg);
	km_session_close(s, km_reject_reason_name(why));
}

/* Answer a too-new ApiVersions request as a broker does, in order with the other responses. */
static bool answer_api_versions_unsupported(km_session *s, int32_t corr, inflight *f)
{
	km_wr w;
	uint8_t pre[8];
	km_wr_init(&w);
	km_api_versions_unsupported_body(&w);
	f->local = evbuffer_new();
	if (!km_wr_ok(&w) || !f->local) {
		km_wr_free(&w);
		return false;
	}
	km_put_be32(pre, (uint32_t)(w.len + 4));
	km_put_be32(pre + 4, (uint32_t)corr);
	evbuffer_add(f->local, pre, 8);
	evbuffer_add(f->local, w.buf, w.len);
	km_wr_free(&w);
	return true;
}

static void cli_read_cb(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	km_proxy *px = s->px;
	struct evbuffer *in = bufferevent_get_input(bev);
	uint64_t now = km_proxy_now_ms(px);

	s->last_activity_ms = now;
	if (!s->cli_paused)
		km_net_bev_fill(bev, KM_READ_FILL);
	while (!s->closed) {
		int32_t size = 0;
		km_frame_status st;
		size_t want, avail = evbuffer_get_length(in), n;
		uint8_t *p;
		km_req_header h;
		const km_api_info *api;
		inflight f;
		int16_t acks = -1;
		char msg[200];

		if (s->req_left) {
			/* the rest of a request already started towards the broker */
			n = avail < s->req_left ? avail : s->req_left;
			px->metrics.client_bytes_in += n;
			up_send(s, in, n);
			s->req_left -= n;
			if (s->req_left) {
				s->partial_since_ms = now;
				goto out;
			}
			s->partial_since_ms = 0;
			continue;
		}
		if (s->draining || s->count >= (size_t)px->cfg.max_inflight_requests)
			break;
		st = km_net_frame_peek(in, px->cfg.max_frame_bytes, KM_FRAME_MIN_REQUEST, s->first_frame, &size);
		switch (st) {
		case KM_FRAME_NEED_MORE:
			/* Enough for the header (and Produce acks)? Then start forwarding before the end arrives. */
			if (avail >= 4 && avail - 4 >= ((size_t)size < 512 ? (size_t)size : 512))
				break;
			s->partial_since_ms = avail ? now : 0;
			goto out;
		case KM_FRAME_TLS_HELLO:
			reject(s, KM_REJECT_TLS_HELLO,
			       "TLS ClientHello received on a plaintext port: the client uses TLS (security.protocol SSL) "
			       "but this listener does not");
			return;
		case KM_FRAME_HTTP:
			reject(s, KM_REJECT_HTTP, "HTTP request received on a Kafka port");
			return;
		case KM_FRAME_TOO_LARGE:
			snprintf(msg, sizeof(msg), "request frame of %d bytes is over max_frame_bytes %lld", size,
				 (long long)px->cfg.max_frame_bytes);
			reject(s, KM_REJECT_TOO_LARGE, msg);
			return;
		case KM_FRAME_BAD_SIZE:
			snprintf(msg, sizeof(msg), "invalid request frame size %d", size);
			reject(s, KM_REJECT_BAD_SIZE, msg);
			return;
		case KM_FRAME_READY:
			break;
		}
		s->partial_since_ms = 0;
		s->first_frame = false;
		/* The header, and for Produce the fields up to acks: the head of the frame only. */
		want = (size_t)size < 512 ? (size_t)size : 512;
		p = evbuffer_pullup(in, (ev_ssize_t)want + 4);
		if (!p || km_net_parse_request_header(p + 4, want, 0, &h) != KM_OK) {
			reject(s, KM_REJECT_BAD_HEADER, "malformed request header");
			return;
		}
		api = km_proxy_api_find(h.api_key);
		f.corr = h.correlation_id;
		f.key = h.api_key;
		f.version = h.api_version;
		f.t0_us = now_us();
		f.local = NULL;
		f.started = false;
		if (h.api_key == KM_API_API_VERSIONS && api && h.api_version > api->max_version) {
			if (st != KM_FRAME_READY) {
				s->partial_since_ms = now;
				goto out; /* answered here: wait for the whole frame, then drop it */
			}
			km_metrics_request(&px->metrics, h.api_key);
			KM_DEBUG("proxy", s->id, "ApiVersions v%d is newer than v%d: answering UNSUPPORTED_VERSION",
				 h.api_version, api->max_version);
			if (!answer_api_versions_unsupported(s, h.correlation_id, &f) || !fifo_push(s, &f)) {
				km_session_close(s, "out of memory");
				return;
			}
			evbuffer_drain(in, (size_t)size + 4);
			px->metrics.client_bytes_in += (uint64_t)size + 4;
			flush_local(s);
			continue;
		}
		if (!api || h.api_version < km_proxy_min_version(api) || h.api_version > api->max_version) {
			/* What a broker does too: an API it cannot parse closes the connection. */
			snprintf(msg, sizeof(msg), "unsupported request: api key %d version %d (correlation id %d)",
				 h.api_key, h.api_version, h.correlation_id);
			reject(s, KM_REJECT_BAD_HEADER, msg);
			return;
		}
		if (h.api_key == KM_API_PRODUCE) {
			km_err rc = km_net_produce_acks(p + 4, want, h.api_version, &acks);
			if (rc != KM_OK && (size_t)size > want) {
				/* Long client or transactional ids: look further, still bounded by the frame. */
				want = (size_t)size < 70000 ? (size_t)size : 70000;
				if (avail - 4 < want) {
					s->partial_since_ms = now;
					goto out; /* parse again from the start when more has arrived */
				}
				p = evbuffer_pullup(in, (ev_ssize_t)want + 4);
				rc = p ? km_net_produce_acks(p + 4, want, h.api_version, &acks) : KM_ERR_NOMEM;
			}
			if (rc != KM_OK) {
				reject(s, KM_REJECT_BAD_HEADER, "malformed Produce request");
				return;
			}
		}
		KM_TRACE("proxy", s->id, "request api %d v%d corr %d size %d", h.api_key, h.api_version,
			 h.correlation_id, size);
		km_metrics_request(&px->metrics, h.api_key);
		/* acks=0: the broker sends nothing back, so nothing waits in the FIFO. */
		if (!(h.api_key == KM_API_PRODUCE && acks == 0) && !fifo_push(s, &f)) {
			km_session_close(s, "out of memory");
			return;
		}
		/* Forward what is here; a frame still arriving continues in req_left. */
		n = avail < (size_t)size + 4 ? avail : (size_t)size + 4;
		px->metrics.client_bytes_in += n;
		up_send(s, in, n);
		s->req_left = (size_t)size + 4 - n;
		s->partial_since_ms = s->req_left ? now : 0;
	}
out:
	if (s->closed)
		return;
	update_cli_reading(s);
}

static void cli_write_cb(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	if (s->closed)
		return;
	update_up_reading(s);
	maybe_finish_drain(s);
}

static void cli_event_cb(struct bufferevent *bev, short what, void *arg)
{
	km_session *s = arg;

	if (what & BEV_EVENT_CONNECTED)
		return;
	if (what & BEV_EVENT_EOF) {
		km_session_close(s, client_closed);
	} else if (what & BEV_EVENT_ERROR) {
		char why[512];
		if (km_net_bev_error(bev, why, sizeof(why)) == KM_ERR_CLOSED) {
			km_session_close(s, client_closed);
			return;
		}
		KM_INFO("proxy", s->id, "client connection error%s: %s", s->px->server_tls ? " (TLS)" : "", why);
		km_session_close(s, "client connection error");
	}
}

void km_session_accept(km_proxy *px, int fd, int32_t node_id)
{
	km_session *s = calloc(1, sizeof(*s));
	int one = 1;

	if (!s || !(s->held = evbuffer_new())) {
		free(s);
		evutil_closesocket(fd);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	s->px = px;
	s->id = ++px->next_session_id;
	s->node_id = node_id;
	s->first_frame = true;
	s->last_activity_ms = km_proxy_now_ms(px);
	s->cli = km_net_bev_new(px->base, fd, px->server_tls, true, NULL, false);
	if (!s->cli) {
		evutil_closesocket(fd);
		evbuffer_free(s->held);
		free(s);
		return;
	}
	s->next = px->sessions;
	if (px->sessions)
		px->sessions->prev = s;
	px->sessions = s;
	px->nsessions++;
	px->metrics.client_connections++;
	px->metrics.client_connections_total++;
	bufferevent_setcb(s->cli, cli_read_cb, cli_write_cb, cli_event_cb, s);
	bufferevent_setwatermark(s->cli, EV_WRITE, (size_t)px->cfg.connection_buffer_bytes / 2, 0);
	bufferevent_enable(s->cli, EV_READ | EV_WRITE);
	KM_DEBUG("proxy", s->id, "client connected on %s port (node %d)", node_id < 0 ? "bootstrap" : "broker", node_id);
	up_connect(s);
}

bool km_session_drain(km_session *s)
{
	if (s->closed || s->draining)
		return false;
	s->draining = true;
	update_cli_reading(s);
	maybe_finish_drain(s);
	return true;
}

void km_session_tick(km_session *s, uint64_t now)
{
	const km_config *cfg = &s->px->cfg;
	if (s->closed)
		return;
	if (cfg->frame_timeout_ms && s->partial_since_ms && !s->cli_paused &&
	    now - s->partial_since_ms > (uint64_t)cfg->frame_timeout_ms) {
		reject(s, KM_REJECT_FRAME_TIMEOUT, "partial request frame stalled past frame_timeout_ms");
		return;
	}
	if (cfg->upstream_request_timeout_ms && s->count && !s->fifo[s->head].local && !s->fifo[s->head].started &&
	    (now_us() - s->fifo[s->head].t0_us) / 1000 > (uint64_t)cfg->upstream_request_timeout_ms) {
		reject(s, KM_REJECT_REQUEST_TIMEOUT, "no response from upstream within upstream_request_timeout_ms");
		return;
	}
	if (cfg->idle_timeout_ms && !s->count && !s->partial_since_ms &&
	    now - s->last_activity_ms > (uint64_t)cfg->idle_timeout_ms)
		reject(s, KM_REJECT_IDLE_TIMEOUT, "connection idle past idle_timeout_ms");
}
