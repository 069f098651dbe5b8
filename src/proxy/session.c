/* A client session: one client connection, its own upstream connection, and the FIFO of requests in flight. */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>

#include "kmirror/log.h"
#include "kmirror/net.h"
#include "kmirror/ring.h"
#include "proxy/peers.h"
#include "proxy/session.h"

/* One request waiting for its response, and what to do with that response. */
typedef struct inflight {
	int32_t corr;
	int16_t key, version;
	uint64_t seq;
	uint64_t t0_us;
	km_resp_action resp;
	const km_proxy_api *api;
	struct evbuffer *local; /* KM_RESP_LOCAL: the whole response frame once made; NULL while pending */
	bool started;           /* its response is being sent to the client */
	void *ctx;              /* the request's context, for the response hooks */
	void (*ctx_free)(void *ctx);
	km_resp_hook on_response; /* this request's own whole-response hook, if any */
	km_session_probe_cb probe; /* a proxy-made request (km_session_probe): its response goes here, not to the client */
	void *probe_arg;
	uint32_t marks;         /* what the request's stages noted for its response hooks */
} inflight;

KM_RING_TYPED(inflights, inflight)

/* UP_NONE: not dialled yet; the first request for the broker dials it (no request: no broker connection). */
typedef enum { UP_NONE, UP_CONNECTING, UP_READY, UP_FAILED } up_state;

/*
 * Each direction works on one frame at a time with one action and a remaining-bytes counter (the
 * way pgbouncer's sbuf drives a packet): at HEAD a new frame's header is read and its action
 * chosen from the API table; the other states finish that frame.
 */
typedef enum { RQ_HEAD, RQ_MOVE } rq_state;
typedef enum { RS_HEAD, RS_MOVE, RS_STREAM, RS_WHOLE } rs_state;

struct km_session {
	km_session_set *set;
	const km_session_host *host;
	uint64_t id;
	int32_t node_id; /* -1: bootstrap port */
	struct bufferevent *cli;
	struct bufferevent *up;
	struct evbuffer *held; /* requests received before the upstream is connected */
	km_peer *peer;         /* its source address's count (max_connections_per_ip) */
	up_state up_state;
	int up_try;            /* bootstrap: index of the upstream address being tried */
	char up_addr[300];
	km_ring fifo;          /* of inflight */
	uint64_t next_seq;
	int32_t next_probe_corr; /* correlation ids of probes: their own sequence (responses are matched in FIFO order) */
	bool first_frame;
	bool in_hook;          /* inside a request's on_request hook: km_session_probe may be called */
	bool pumping;          /* inside pump_responses: answers made meanwhile are sent by its loop */
	bool closed;
	bool draining;
	const char *close_when_written; /* the upstream is gone: close once the client has what it answered */
	bool cli_paused;       /* reads from the client paused (FIFO full or upstream buffer full) */
	bool up_paused;        /* reads from upstream paused (client buffer full) */
	uint64_t last_activity_ms;
	uint64_t partial_since_ms; /* last progress of an incomplete request frame; 0: none */
	uint64_t state_wait_ms;    /* a request that reads the mirror state waits for the store to load since then; 0: none */
	bool fetch_blank;          /* the last Fetch answer hid records past a tail and showed none */
	bool fetch_waiting;        /* the next request waits (tail_ev), unread */
	bool fetch_waited;         /* it waited: it goes now */
	struct event *tail_ev;
	/* While it waits: the maps whose tail ends the wait early (km_session_set_tail_moved), in set->waiting. */
	const void *tail_maps[KM_TAIL_MAPS];
	size_t ntail_maps;
	bool tail_any;
	bool wait_listed;          /* in set->waiting */
	/* The partitions the last answer blanked and their tails then (km_session_fetch_blank_at). */
	const void *blank_maps[KM_TAIL_MAPS];
	int64_t blank_tails[KM_TAIL_MAPS];
	size_t nblank;
	uint64_t blank_epoch;
	km_session *wait_prev, *wait_next;
	struct {
		rq_state state;
		size_t left;   /* RQ_MOVE: bytes of the frame still to forward */
	} rq;
	struct {
		rs_state state;
		size_t left;   /* RS_MOVE: bytes of the frame still to send on */
		size_t frame;  /* RS_STREAM / RS_WHOLE: the frame's length, size prefix included */
		size_t sent;   /* RS_STREAM: frame bytes already sent on */
		km_fetch_walk walk;
		bool small;    /* RS_STREAM: a record set too small to splice was seen: the partitions here are small */
	} rs;
	size_t splicing;   /* bytes of the response in a spliced range, upstream socket to client socket; 0: none */
	km_session *prev, *next;
	km_session *next_dead;
};

struct km_session_set {
	const km_session_host *host;
	km_session *sessions; /* doubly linked, newest first */
	size_t count;
	km_session *dead;     /* closed sessions, freed at the end of the loop iteration */
	km_session *waiting;  /* sessions whose Fetch waits at a tail (fetch_waiting), doubly linked */
	struct event *reap_ev;
	uint64_t next_id;
	km_peers peers;       /* open sessions per source address */
	km_log_gate refused_log; /* connections refused at accept: a flood is logged once in a while */
};

/*
 * How far a read callback tops up its input from the socket. libevent 2.1 reads at most 4 KiB per
 * readiness event whatever max_single_read says, so a Fetch response crossed the proxy in 4 KiB
 * rounds of FIONREAD, readv, writev and two epoll_ctl: that, not copying, was the proxy's CPU.
 */
#define KM_READ_FILL (256 * 1024)
/* The head of a request read before it is forwarded: the header, and for Produce the fields up to acks. */
#define KM_REQ_HEAD 512
/*
 * Where a spliced range may come next, reads stop this far past what the walk needs: a response
 * header and a partition's fields fit, and few record bytes are read before the range is known.
 */
#define KM_READ_PEEK 4096

static const char client_closed[] = "client closed the connection";

static uint64_t now_us(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (uint64_t)tv.tv_sec * 1000000 + (uint64_t)tv.tv_usec;
}

static uint64_t base_now_ms(struct event_base *base)
{
	struct timeval tv;
	event_base_gettimeofday_cached(base, &tv);
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

static uint64_t now_ms(const km_session *s)
{
	return base_now_ms(s->host->base);
}

const km_session_host *km_session_host_of(const km_session *s)
{
	return s->host;
}

uint64_t km_session_id(const km_session *s)
{
	return s->id;
}

static void inflight_clear(inflight *f)
{
	/* A probe never answered: its owner learns that the session is gone. */
	if (f->probe) {
		km_session_probe_cb cb = f->probe;
		f->probe = NULL;
		cb(f->probe_arg, KM_ERR_CLOSED, NULL, 0);
	}
	if (f->local)
		evbuffer_free(f->local);
	if (f->ctx && f->ctx_free)
		f->ctx_free(f->ctx);
	f->local = NULL;
	f->ctx = NULL;
}

static void session_free(km_session *s)
{
	for (size_t i = 0; i < inflights_count(&s->fifo); i++)
		inflight_clear(inflights_at(&s->fifo, i));
	km_ring_free(&s->fifo);
	if (s->held)
		evbuffer_free(s->held);
	if (s->tail_ev)
		event_free(s->tail_ev);
	free(s);
}

static void reap(km_session_set *set)
{
	while (set->dead) {
		km_session *s = set->dead;
		set->dead = s->next_dead;
		session_free(s);
	}
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
	reap(arg);
}

/* The upstream connection freed (and no longer counted, if it was connected). */
static void up_drop(km_session *s)
{
	km_proxy_counters *m = s->host->metrics;
	if (!s->up)
		return;
	km_net_bev_free(s->up);
	s->up = NULL;
	if (s->up_state == UP_READY && m->upstream_connections)
		m->upstream_connections--;
}

/* Out of set->waiting (a Fetch no longer waits at a tail). */
static void waiting_unlink(km_session *s)
{
	if (!s->wait_listed)
		return;
	if (s->wait_prev)
		s->wait_prev->wait_next = s->wait_next;
	else
		s->set->waiting = s->wait_next;
	if (s->wait_next)
		s->wait_next->wait_prev = s->wait_prev;
	s->wait_prev = s->wait_next = NULL;
	s->wait_listed = false;
}

static void session_close(km_session *s, const char *why)
{
	km_session_set *set = s->set;
	km_proxy_counters *m = s->host->metrics;
	static const struct timeval zero = {0, 0};

	if (s->closed)
		return;
	s->closed = true;
	/* An ordinary client close is not news; everything else is. */
	if (why == client_closed)
		KM_DEBUG("proxy", s->id, "closing client connection (%s), %zu request(s) in flight", why,
			 inflights_count(&s->fifo));
	else
		KM_INFO("proxy", s->id, "closing client connection (%s), %zu request(s) in flight", why,
			inflights_count(&s->fifo));
	if (s->cli)
		km_net_bev_free(s->cli);
	s->cli = NULL;
	up_drop(s);
	km_peers_release(&set->peers, s->peer);
	s->peer = NULL;
	waiting_unlink(s);
	if (s->prev)
		s->prev->next = s->next;
	else
		set->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	set->count--;
	m->client_connections--;
	/* Freed after this loop iteration: we are usually inside one of the session's own callbacks. */
	s->next_dead = set->dead;
	set->dead = s;
	if (!set->reap_ev)
		set->reap_ev = event_new(s->host->base, -1, 0, reap_cb, set);
	if (set->reap_ev)
		event_add(set->reap_ev, &zero);
	else
		reap(set);
}

static void reject(km_session *s, km_reject_reason why, const char *msg)
{
	s->host->metrics->rejected[why]++;
	KM_WARN("proxy", s->id, "%s", msg);
	session_close(s, km_reject_reason_name(why));
}

/* ---- flow control ---- */

static void update_cli_reading(km_session *s)
{
	const km_config *cfg = s->host->cfg;
	/* A request half forwarded must be finished whatever the FIFO or a drain say: the broker waits
	 * for its end before it answers anything. Buffer limits still apply (the upstream drains). */
	bool pause = s->close_when_written || (s->rq.state == RQ_HEAD &&
		      (s->draining || s->state_wait_ms || s->fetch_waiting ||
		       inflights_count(&s->fifo) >= (size_t)cfg->max_inflight_requests)) ||
		     (s->up && evbuffer_get_length(bufferevent_get_output(s->up)) > (size_t)cfg->connection_buffer_bytes) ||
		     evbuffer_get_length(s->held) > (size_t)cfg->connection_buffer_bytes;
	if (!s->cli || pause == s->cli_paused)
		return;
	s->cli_paused = pause;
	if (pause) {
		km_net_bev_disable(s->cli, EV_READ);
	} else {
		km_net_bev_enable(s->cli, EV_READ);
		/* A partial frame did not stall while we were the ones not reading. */
		if (s->partial_since_ms)
			s->partial_since_ms = now_ms(s);
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
	pause = evbuffer_get_length(bufferevent_get_output(s->cli)) > (size_t)s->host->cfg->connection_buffer_bytes;
	if (pause == s->up_paused)
		return;
	s->up_paused = pause;
	if (pause) {
		km_net_bev_disable(s->up, EV_READ);
	} else {
		km_net_bev_enable(s->up, EV_READ);
		if (evbuffer_get_length(bufferevent_get_input(s->up)))
			bufferevent_trigger(s->up, EV_READ, BEV_TRIG_DEFER_CALLBACKS | BEV_TRIG_IGNORE_WATERMARKS);
	}
}

/* A drained session closes once nothing is in flight and the client has everything. */
static void maybe_finish_drain(km_session *s)
{
	if (s->draining && !s->closed && !s->splicing && !inflights_count(&s->fifo) && s->rq.state == RQ_HEAD &&
	    (!s->cli || evbuffer_get_length(bufferevent_get_output(s->cli)) == 0))
		session_close(s, "draining");
}

/* ---- what goes to the client ---- */

static void to_client(km_session *s, struct evbuffer *src, size_t n)
{
	s->host->metrics->client_bytes_out += n;
	km_net_move(src, bufferevent_get_output(s->cli), n);
}

static void to_client_bytes(km_session *s, const void *p, size_t n)
{
	s->host->metrics->client_bytes_out += n;
	evbuffer_add(bufferevent_get_output(s->cli), p, n);
}

/* The response at the head of the FIFO is complete. */
static void response_done(km_session *s)
{
	inflight *f = inflights_front(&s->fifo);
	inflight_clear(f);
	inflights_pop(&s->fifo);
	s->last_activity_ms = now_ms(s);
}

/* Send the proxy's own answers that are now at the head of the FIFO. */
static void flush_local(km_session *s)
{
	inflight *f;
	while (s->cli && (f = inflights_front(&s->fifo)) && f->resp == KM_RESP_LOCAL && f->local) {
		km_metrics_latency(s->host->metrics, f->key, (double)(now_us() - f->t0_us) / 1e6);
		to_client(s, f->local, evbuffer_get_length(f->local));
		response_done(s);
	}
}

/* A response frame for f made from body (moved out): size, correlation id, the header's tags, body. */
static km_err frame_local(const inflight *f, struct evbuffer *body, struct evbuffer **out)
{
	uint8_t pre[9];
	size_t hlen = km_proxy_response_header_version(f->key, f->version) >= 1 ? 9 : 8;
	struct evbuffer *b = evbuffer_new();

	if (!b)
		return KM_ERR_NOMEM;
	km_put_be32(pre, (uint32_t)(hlen - 4 + evbuffer_get_length(body)));
	km_put_be32(pre + 4, (uint32_t)f->corr);
	pre[8] = 0; /* no header tags */
	if (evbuffer_add(b, pre, hlen) != 0 || evbuffer_add_buffer(b, body) != 0) {
		evbuffer_free(b);
		return KM_ERR_NOMEM;
	}
	*out = b;
	return KM_OK;
}

/* ---- upstream side ---- */

static void up_connect(km_session *s);

static void up_send(km_session *s, struct evbuffer *src, size_t n)
{
	s->host->metrics->upstream_bytes_out += n;
	if (s->up_state == UP_READY)
		km_net_move(src, bufferevent_get_output(s->up), n);
	else
		km_net_move(src, s->held, n);
}

/* RS_WHOLE: the whole frame is buffered; the row's rewriter or hook makes what the client gets. */
static km_err respond_whole(km_session *s, const inflight *f, struct evbuffer *in)
{
	const km_proxy_api *api = f->api;
	size_t end = s->rs.frame, body_off, hlen;
	int32_t corr;
	km_rewrite_ctx rw;
	km_err rc;

	if (km_net_response_header(in, (int32_t)(end - 4), km_proxy_response_header_version(f->key, f->version), &corr,
				   &hlen) != 1)
		return KM_ERR_DECODE;
	body_off = 4 + hlen;
	if (f->probe) {
		/* The proxy's own request: the response is its caller's, the client sees nothing of it. Copied
		 * out first: the callback may answer (or close) the session. */
		km_session_probe_cb cb = f->probe;
		uint8_t *copy = malloc(end - body_off + 1);
		if (!copy)
			return KM_ERR_NOMEM;
		evbuffer_drain(in, body_off);
		evbuffer_remove(in, copy, end - body_off);
		((inflight *)f)->probe = NULL;
		cb(f->probe_arg, KM_OK, copy, end - body_off);
		free(copy);
		return KM_OK;
	}
	s->host->rewrite_ctx(s->host->arg, &rw);
	if (!f->on_response && api->rewrite) {
		uint8_t *frame = evbuffer_pullup(in, (ev_ssize_t)end), pre[4];
		km_wr w;
		if (!frame)
			return KM_ERR_NOMEM;
		km_wr_init(&w);
		km_wr_raw(&w, frame + 4, body_off - 4); /* correlation id and header tags, unchanged */
		rc = api->rewrite(frame + body_off, end - body_off, f->version, &rw, &w);
		if (rc == KM_OK && (!km_wr_ok(&w) || w.len > INT32_MAX))
			rc = KM_ERR_NOMEM;
		if (rc == KM_OK) {
			km_put_be32(pre, (uint32_t)w.len);
			to_client_bytes(s, pre, 4);
			to_client_bytes(s, w.buf, w.len);
			evbuffer_drain(in, end);
		}
		km_wr_free(&w);
	} else {
		/* The hook writes into a scratch buffer, moved on (not copied) once it has succeeded. */
		struct evbuffer *scratch = evbuffer_new();
		km_resp rs = {.key = f->key, .version = f->version, .in = in, .frame_len = end - 4,
			      .body_off = body_off, .out = scratch, .rw = &rw, .ctx = f->ctx};
		size_t had = evbuffer_get_length(in);
		km_resp_hook hook = f->on_response ? f->on_response : api->on_response;
		rc = !scratch ? KM_ERR_NOMEM : hook ? hook(&rs) : KM_ERR_UNSUPPORTED;
		/* The hook must consume the frame exactly. */
		if (rc == KM_OK && had - evbuffer_get_length(in) != end)
			rc = KM_ERR_DECODE;
		if (rc == KM_OK)
			to_client(s, scratch, evbuffer_get_length(scratch));
		if (scratch)
			evbuffer_free(scratch);
	}
	if (rc == KM_OK && rw.rewritten)
		s->host->metrics->responses_rewritten_total++;
	return rc;
}

/* ---- spliced ranges (docs/proxy.md, "Forwarding") ---- */

static void pump_responses(km_session *s);

/* Whether both connections are plain sockets and splicing is on: then reads stop where a range may start. */
static bool may_splice(const km_session *s)
{
	return s->host->cfg->splice_min_bytes > 0 && !s->host->server_tls && !s->host->upstream_tls &&
	       s->up_state == UP_READY && s->cli && s->up;
}

static void splice_done(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	(void)bev;
	s->host->metrics->spliced_bytes_total += s->splicing;
	s->host->metrics->splices_total++;
	s->splicing = 0;
	if (s->rs.state == RS_MOVE && !s->rs.left) {
		response_done(s);
		s->rs.state = RS_HEAD;
	}
	pump_responses(s);
}

/*
 * The next n bytes of the response, none of them read yet, are settled (nothing looks at them):
 * when enough, they go socket to socket; splice_done resumes the response after the last one.
 */
static bool splice_range(km_session *s, struct evbuffer *in, size_t n)
{
	if (!may_splice(s) || n < (size_t)s->host->cfg->splice_min_bytes || evbuffer_get_length(in))
		return false;
	if (km_net_bev_splice(s->up, s->cli, n, splice_done, s) != 0)
		return false; /* not now (the other direction's range, no pipe): the bytes come through the buffers */
	s->splicing = n;
	s->host->metrics->client_bytes_out += n;
	return true;
}

/*
 * How far the next read of the upstream socket goes: to where a spliced range may start, plus a
 * peek (the fields the walk needs next), so a large record set is not read into memory before the
 * walk has found it; the usual large read where no range can come.
 */
static size_t up_read_size(km_session *s)
{
	size_t have = evbuffer_get_length(bufferevent_get_input(s->up)), want = KM_READ_FILL;
	const inflight *f = inflights_front(&s->fifo);

	switch (s->rs.state) {
	case RS_HEAD:
		/* Nothing asked: the next request may well be a Fetch (a consumer asks as soon as an answer is in). */
		if (!f || (f->key == KM_API_FETCH && f->resp != KM_RESP_LOCAL))
			want = have + KM_READ_PEEK;
		break;
	case RS_MOVE:
		want = have + s->rs.left + KM_READ_PEEK; /* this response's rest, and the next one's head */
		break;
	case RS_STREAM: {
		const km_fetch_walk *w = &s->rs.walk;
		size_t have_end = s->rs.sent + have;
		/* Small partitions, or the batches of one the hooks look at: no range is likely, read on. */
		if (s->rs.small || (w->descend && w->pos < w->records_end))
			break;
		want = (w->pos > have_end ? w->pos - s->rs.sent : have) + KM_READ_PEEK;
		break;
	}
	default:
		break;
	}
	return want < KM_READ_FILL ? want : KM_READ_FILL;
}

/* Sets how far the upstream's next read goes (a plain bufferevent only records it). */
static void up_read_plan(km_session *s)
{
	if (may_splice(s) && !s->splicing)
		km_net_bev_fill(s->up, up_read_size(s));
}

/* Send on the bytes of a streamed response that the walk has settled. */
static void stream_send_settled(km_session *s, struct evbuffer *in)
{
	size_t have_end = s->rs.sent + evbuffer_get_length(in);
	size_t upto = s->rs.walk.pos < have_end ? s->rs.walk.pos : have_end;
	if (upto > s->rs.sent) {
		to_client(s, in, upto - s->rs.sent);
		s->rs.sent = upto;
	}
}

/*
 * RS_STREAM: walk what has arrived, letting the row's hooks look and patch; send on what the walk
 * has passed; at the end the tail (top-level tags) is handled whole, at the same length.
 * Returns 1 when the response is done, 0 when it needs more bytes, or an error.
 */
static int stream_step(km_session *s, const inflight *f, struct evbuffer *in, km_err *err)
{
	const km_stream_hooks *h = f->api->stream;
	km_fetch_walk *w = &s->rs.walk;
	uint8_t *tail, *fixed;
	size_t tlen;
	km_rewrite_ctx rw;

	for (;;) {
		km_stream_ev e = {.api = f->api, .s = s, .w = w, .in = in, .first = s->rs.sent, .ctx = f->ctx,
				  .marks = f->marks};
		km_fetch_walk before;
		km_fw_event ev;
		/* A request with a context may have hooks that ask for an event again: keep where it started. */
		if (f->ctx)
			before = *w;
		ev = km_fetch_walk_next(w, in, s->rs.sent);
		*err = KM_OK;
		if (ev == KM_FW_ERROR) {
			*err = KM_ERR_DECODE;
			return -1;
		}
		if (ev == KM_FW_PARTITION && w->part.records_len &&
		    w->part.records_len < (size_t)s->host->cfg->splice_min_bytes)
			s->rs.small = true;
		if (ev == KM_FW_PARTITION && h && h->on_partition)
			*err = h->on_partition(&e);
		else if (ev == KM_FW_BATCH && h && h->on_batch)
			*err = h->on_batch(&e);
		if (*err == KM_STREAM_AGAIN && f->ctx) {
			/* The hook needs bytes that are on their way: the event again when they are here. */
			*w = before;
			*err = KM_OK;
			stream_send_settled(s, in);
			return 0;
		}
		if (*err != KM_OK)
			return -1;
		if (ev == KM_FW_NEED_MORE) {
			stream_send_settled(s, in);
			/* Settled bytes that have not arrived (records skipped by length): socket to socket. */
			if (w->pos > s->rs.sent && splice_range(s, in, w->pos - s->rs.sent))
				s->rs.sent = w->pos;
			return 0;
		}
		if (ev == KM_FW_END)
			break;
	}
	stream_send_settled(s, in);
	if (s->rs.sent + evbuffer_get_length(in) < s->rs.frame)
		return 0;
	tlen = s->rs.frame - w->pos;
	if (!tlen)
		return 1; /* v4-11: no tagged fields */
	tail = evbuffer_pullup(in, (ev_ssize_t)tlen);
	if (!tail || !(fixed = malloc(tlen))) {
		*err = KM_ERR_NOMEM;
		return -1;
	}
	s->host->rewrite_ctx(s->host->arg, &rw);
	if (h && h->on_tail)
		*err = h->on_tail(tail, tlen, fixed, &rw, f->ctx);
	else
		memcpy(fixed, tail, tlen);
	if (*err == KM_OK) {
		evbuffer_drain(in, tlen);
		to_client_bytes(s, fixed, tlen);
		if (rw.rewritten)
			s->host->metrics->responses_rewritten_total++;
	}
	free(fixed);
	return *err == KM_OK ? 1 : -1;
}

/* RS_HEAD: the next response frame from upstream must answer the oldest forwarded request. */
static bool response_head(km_session *s, struct evbuffer *in)
{
	km_proxy_counters *m = s->host->metrics;
	inflight *f = inflights_front(&s->fifo);
	int32_t size = 0, corr;
	uint8_t hdr[8];
	km_frame_status st = km_net_frame_peek(in, s->host->cfg->max_frame_bytes, KM_FRAME_MIN_RESPONSE, false, &size);

	if (st == KM_FRAME_NEED_MORE && evbuffer_get_length(in) < 8)
		return false;
	if (st != KM_FRAME_READY && st != KM_FRAME_NEED_MORE) {
		KM_WARN("proxy", s->id, "bad response frame from %s: %s (size %d)", s->up_addr, km_frame_status_name(st),
			size);
		m->upstream_errors_total++;
		session_close(s, "bad upstream frame");
		return false;
	}
	evbuffer_copyout(in, hdr, 8);
	corr = (int32_t)km_be32(hdr + 4);
	if (!f || f->resp == KM_RESP_LOCAL || f->corr != corr) {
		KM_WARN("proxy", s->id, "response with correlation id %d from %s does not match the oldest request (%d)", corr,
			s->up_addr, f ? f->corr : -1);
		m->upstream_errors_total++;
		session_close(s, "upstream protocol error");
		return false;
	}
	m->upstream_bytes_in += (uint64_t)size + 4;
	/* Latency: from the request's arrival to the start of its response. */
	km_metrics_latency(m, f->key, (double)(now_us() - f->t0_us) / 1e6);
	f->started = true;
	s->rs.frame = (size_t)size + 4;
	switch (f->resp) {
	case KM_RESP_STREAM:
		km_fetch_walk_init(&s->rs.walk, f->version, s->rs.frame);
		s->rs.sent = 0;
		s->rs.small = false;
		s->rs.state = RS_STREAM;
		break;
	case KM_RESP_WHOLE:
		s->rs.state = RS_WHOLE;
		break;
	default:
		s->rs.left = s->rs.frame;
		s->rs.state = RS_MOVE;
	}
	return true;
}

/* Everything buffered from upstream that can go to the client now, in FIFO order. */
static void pump_responses_loop(km_session *s);

static void pump_responses(km_session *s)
{
	/* A probe's callback may answer a request from inside the loop: the loop sends it. */
	if (s->pumping)
		return;
	s->pumping = true;
	pump_responses_loop(s);
	s->pumping = false;
}

static void pump_responses_loop(km_session *s)
{
	struct evbuffer *in = s->up ? bufferevent_get_input(s->up) : NULL;

	while (!s->closed) {
		size_t avail;
		inflight *f;
		km_err err = KM_OK;
		int done;

		if (s->splicing)
			goto out; /* the response goes on when its range is done (splice_done) */
		flush_local(s);
		f = inflights_front(&s->fifo);
		avail = in ? evbuffer_get_length(in) : 0;
		if (s->rs.state == RS_HEAD) {
			/* Nothing from upstream, or the head waits for the proxy's own answer (upstream bytes wait behind it). */
			if (!avail || (f && f->resp == KM_RESP_LOCAL))
				break;
			if (!response_head(s, in))
				break;
			continue;
		}
		switch (s->rs.state) {
		case RS_MOVE: {
			size_t n = avail < s->rs.left ? avail : s->rs.left;
			if (n) {
				to_client(s, in, n);
				s->rs.left -= n;
			}
			/* The rest has not arrived: when large, socket to socket (splice_done ends the response). */
			if (s->rs.left && splice_range(s, in, s->rs.left)) {
				s->rs.left = 0;
				goto out;
			}
			if (!n)
				goto out;
			done = s->rs.left == 0;
			break;
		}
		case RS_STREAM:
			done = stream_step(s, f, in, &err);
			break;
		case RS_WHOLE:
			if (avail < s->rs.frame)
				goto out;
			err = respond_whole(s, f, in);
			done = err == KM_OK;
			break;
		default:
			done = 0;
		}
		if (err != KM_OK || done < 0) {
			/* Never pass on a response we could not rewrite: it may hold real broker addresses. */
			KM_WARN("proxy", s->id, "cannot handle the response to %s v%d (correlation id %d): %s",
				km_proxy_api_name(f->api), f->version, f->corr, km_err_name(err));
			s->host->metrics->upstream_errors_total++;
			session_close(s, "unrewritable response");
			return;
		}
		if (!done)
			break;
		response_done(s);
		s->rs.state = RS_HEAD;
	}
out:
	if (s->closed)
		return;
	up_read_plan(s);
	update_up_reading(s);
	update_cli_reading(s);
	maybe_finish_drain(s);
}

static void up_read_cb(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	if (!s->up_paused)
		km_net_bev_fill(bev, KM_READ_FILL);
	pump_responses(s);
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
	km_proxy_counters *m = s->host->metrics;

	if (what & BEV_EVENT_CONNECTED) {
		int fd = bufferevent_getfd(bev), one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		bufferevent_set_timeouts(bev, NULL, NULL);
		s->up_state = UP_READY;
		m->upstream_connections++;
		KM_DEBUG("proxy", s->id, "upstream %s connected", s->up_addr);
		bufferevent_setwatermark(bev, EV_WRITE, (size_t)s->host->cfg->connection_buffer_bytes / 2, 0);
		if (evbuffer_get_length(s->held))
			evbuffer_add_buffer(bufferevent_get_output(bev), s->held);
		up_read_plan(s);
		update_cli_reading(s);
		return;
	}
	if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT)) {
		char tls[512] = "";
		bool was_ready = s->up_state == UP_READY;
		m->upstream_errors_total++; /* refused, timed out, reset, or closed by the broker */
		if (what & BEV_EVENT_ERROR)
			km_net_bev_error(bev, tls, sizeof(tls));
		KM_INFO("proxy", s->id, "upstream %s %s%s%s", s->up_addr,
			(what & BEV_EVENT_TIMEOUT) ? "connect timed out" :
			(what & BEV_EVENT_EOF)     ? "closed the connection" :
			was_ready                  ? "connection failed" : "connect failed",
			tls[0] ? ": " : "", tls);
		/* Bootstrap connections try the next address while nothing has been sent. */
		if (!was_ready && s->node_id < 0 && s->up_try + 1 < s->host->cfg->upstream_count) {
			up_drop(s);
			s->up_try++;
			up_connect(s);
			return;
		}
		/*
		 * The client sees what a broker failure looks like: a disconnect. But what the broker
		 * answered before it closed (a failed SASL authentication: the error, then the close) is
		 * the client's: the session closes once that is written, 10 s at most.
		 */
		if (was_ready && s->cli && evbuffer_get_length(bufferevent_get_output(s->cli))) {
			struct timeval tv = {10, 0};
			up_drop(s);
			s->up_state = UP_FAILED;
			s->close_when_written = "upstream disconnected";
			update_cli_reading(s); /* paused for good */
			bufferevent_set_timeouts(s->cli, NULL, &tv);
			return;
		}
		session_close(s, was_ready ? "upstream disconnected" : "upstream unreachable");
	}
}

static void up_connect(km_session *s)
{
	const km_session_host *host = s->host;
	const km_config *cfg = host->cfg;
	const char *h;
	uint16_t port;
	int64_t tmo = cfg->upstream_connect_timeout_ms;
	struct timeval tv = {(time_t)(tmo / 1000), (suseconds_t)((tmo % 1000) * 1000)};

	if (s->node_id < 0) {
		h = cfg->upstream[s->up_try].host;
		port = cfg->upstream[s->up_try].port;
	} else if (!host->broker_addr(host->arg, s->node_id, &h, &port)) {
		session_close(s, "broker no longer known");
		return;
	}
	snprintf(s->up_addr, sizeof(s->up_addr), "%s:%u", h, port);
	s->up_state = UP_CONNECTING;
	s->up = km_net_bev_new(host->base, -1, host->upstream_tls, false, h, cfg->upstream_tls_verify_hostname);
	if (!s->up) {
		session_close(s, "out of memory");
		return;
	}
	host->metrics->upstream_connects_total++;
	km_net_bev_setcb(s->up, up_read_cb, up_write_cb, up_event_cb, s);
	bufferevent_set_timeouts(s->up, &tv, &tv);
	km_net_bev_enable(s->up, EV_READ | EV_WRITE);
	if (bufferevent_socket_connect_hostname(s->up, host->dns, AF_UNSPEC, h, port) != 0)
		up_event_cb(s->up, BEV_EVENT_ERROR, s);
}

/* ---- client side ---- */

/* A new FIFO entry for a request whose response will come (or be made). */
static bool push_inflight(km_session *s, const km_req *rq, const km_proxy_api *api)
{
	inflight f = {.corr = rq->h->correlation_id, .key = rq->h->api_key, .version = rq->h->api_version,
		      .seq = rq->seq, .t0_us = now_us(), .resp = rq->resp, .api = api, .ctx = rq->ctx,
		      .ctx_free = rq->ctx_free, .on_response = rq->on_response, .marks = rq->marks};
	if (rq->resp == KM_RESP_LOCAL && rq->answer && frame_local(&f, rq->answer, &f.local) != KM_OK)
		return false;
	if (!inflights_push(&s->fifo, &f)) {
		if (f.local)
			evbuffer_free(f.local);
		return false;
	}
	return true;
}

static void req_discard(km_req *rq)
{
	if (rq->ctx && rq->ctx_free)
		rq->ctx_free(rq->ctx);
	rq->ctx = NULL;
	if (rq->answer)
		evbuffer_free(rq->answer);
	rq->answer = NULL;
	if (rq->rewritten)
		evbuffer_free(rq->rewritten);
	rq->rewritten = NULL;
}

typedef enum { HEAD_DONE, HEAD_WAIT, HEAD_CLOSED } head_result;

/* Make the first n body bytes of the frame at the start of in contiguous for rq, the header parsed again over them. */
static bool pull_head(struct evbuffer *in, size_t n, km_req_header *h, km_req *rq)
{
	uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)n + 4);
	if (!p || km_net_parse_request_header(p + 4, n, 0, h) != KM_OK)
		return false;
	rq->body = p + 4;
	rq->body_len = n;
	return true;
}

/* What a broker does too: an API or version it cannot parse closes the connection. */
static head_result reject_unsupported(km_session *s, const km_req_header *h)
{
	char msg[200];
	snprintf(msg, sizeof(msg), "unsupported request: api key %d version %d (correlation id %d)", h->api_key,
		 h->api_version, h->correlation_id);
	reject(s, KM_REJECT_BAD_HEADER, msg);
	return HEAD_CLOSED;
}

/*
 * RQ_HEAD: read a new request's header, find its row, let the row decide; forward it (cut-through
 * or whole, as it is or rewritten) or answer it. Classify hooks may run again on a later call
 * (when they ask for more bytes, or the action needs the whole frame): they only decide.
 */
/*
 * A new request frame's size, as km_net_frame_peek judged it: HEAD_DONE to go on (the frame is
 * whole, or enough of it for the header, and for Produce acks, has arrived), else wait or closed.
 */
static head_result frame_head(km_session *s, km_frame_status st, int32_t size, size_t avail)
{
	const km_config *cfg = s->host->cfg;
	char msg[200];

	switch (st) {
	case KM_FRAME_NEED_MORE:
		/* Enough for the header (and Produce acks)? Then start before the end arrives. */
		if (avail >= 4 && avail - 4 >= ((size_t)size < KM_REQ_HEAD ? (size_t)size : KM_REQ_HEAD))
			return HEAD_DONE;
		s->partial_since_ms = avail ? now_ms(s) : 0;
		return HEAD_WAIT;
	case KM_FRAME_TLS_HELLO:
		reject(s, KM_REJECT_TLS_HELLO,
		       "TLS ClientHello received on a plaintext port: the client uses TLS (security.protocol SSL) "
		       "but this listener does not");
		return HEAD_CLOSED;
	case KM_FRAME_HTTP:
		reject(s, KM_REJECT_HTTP, "HTTP request received on a Kafka port");
		return HEAD_CLOSED;
	case KM_FRAME_TOO_LARGE:
		snprintf(msg, sizeof(msg), "request frame of %d bytes is over max_frame_bytes %lld", size,
			 (long long)cfg->max_frame_bytes);
		reject(s, KM_REJECT_TOO_LARGE, msg);
		return HEAD_CLOSED;
	case KM_FRAME_BAD_SIZE:
		snprintf(msg, sizeof(msg), "invalid request frame size %d", size);
		reject(s, KM_REJECT_BAD_SIZE, msg);
		return HEAD_CLOSED;
	case KM_FRAME_READY:
		break;
	}
	return HEAD_DONE;
}

/*
 * A held or local request: looked at whole by the row's on_request (which may answer it now or
 * later, or rewrite it). HEAD_DONE with rq decided, else wait (rq discarded) or closed.
 */
/* ---- a Fetch at the mirror's tail waits a moment ---- */

void km_session_fetch_shown(km_session *s)
{
	s->fetch_blank = false;
	s->nblank = 0;
}

void km_session_fetch_blank_at(km_session *s, const void *map, int64_t tail, uint64_t epoch)
{
	s->fetch_blank = true;
	if (s->nblank && s->blank_epoch != epoch)
		s->nblank = 0; /* the older ones may be gone */
	s->blank_epoch = epoch;
	for (size_t i = 0; i < s->nblank; i++)
		if (s->blank_maps[i] == map) {
			s->blank_tails[i] = tail;
			return;
		}
	if (s->nblank < KM_TAIL_MAPS) {
		s->blank_maps[s->nblank] = map;
		s->blank_tails[s->nblank++] = tail;
	}
}

size_t km_session_fetch_blanks(const km_session *s, const void *const **maps, const int64_t **tails, uint64_t *epoch)
{
	*maps = s->blank_maps;
	*tails = s->blank_tails;
	*epoch = s->blank_epoch;
	return s->nblank;
}

void km_session_fetch_blanks_clear(km_session *s)
{
	s->nblank = 0;
}

bool km_session_fetch_may_wait(const km_session *s)
{
	return s->fetch_blank && !s->fetch_waited;
}


static void tail_wait_over(evutil_socket_t fd, short what, void *arg)
{
	km_session *s = arg;
	(void)fd;
	(void)what;
	if (s->closed)
		return;
	waiting_unlink(s);
	s->fetch_waiting = false;
	s->fetch_waited = true;
	update_cli_reading(s); /* reads on: the request waiting in the buffer goes now */
}

static bool fetch_wait(km_session *s, const km_req *rq)
{
	struct timeval tv = {0, KM_FETCH_TAIL_WAIT_MS * 1000};
	if (!s->tail_ev && !(s->tail_ev = evtimer_new(s->host->base, tail_wait_over, s)))
		return false; /* out of memory: it goes at once */
	if (event_add(s->tail_ev, &tv) != 0)
		return false;
	s->fetch_waiting = true;
	memcpy(s->tail_maps, rq->tail_maps, sizeof(s->tail_maps));
	s->ntail_maps = rq->ntail_maps;
	s->tail_any = rq->tail_any;
	s->wait_prev = NULL;
	s->wait_next = s->set->waiting;
	if (s->wait_next)
		s->wait_next->wait_prev = s;
	s->set->waiting = s;
	s->wait_listed = true;
	s->host->metrics->fetch_tail_waits_total++;
	update_cli_reading(s);
	return true;
}

static head_result request_held(km_session *s, struct evbuffer *in, bool whole, km_req_header *h, km_req *rq)
{
	const km_proxy_api *api = rq->api;
	km_err rc;

	if (!whole) {
		req_discard(rq);
		s->partial_since_ms = now_ms(s);
		return HEAD_WAIT;
	}
	/*
	 * One contiguous piece for the hook, unless the row reads the frame in place (a held
	 * Produce: pulling it up would copy every record byte once more).
	 */
	if (!api->in_place && !pull_head(in, rq->frame_len, h, rq)) {
		req_discard(rq);
		reject(s, KM_REJECT_BAD_HEADER, "malformed request header");
		return HEAD_CLOSED;
	}
	rq->in = in;
	rq->in_off = 4;
	s->in_hook = true;
	rc = api->on_request ? api->on_request(rq) : KM_ERR_UNSUPPORTED;
	s->in_hook = false;
	if (rc == KM_OK && rq->action == KM_REQ_LOCAL && !rq->answer && !rq->pending)
		rc = KM_ERR_UNSUPPORTED; /* a local API must answer, now or later */
	if (rc != KM_OK) {
		KM_WARN("proxy", s->id, "%s v%d (correlation id %d): %s", km_proxy_api_name(api), h->api_version,
			h->correlation_id, rq->close_reason ? rq->close_reason : km_err_name(rc));
		req_discard(rq);
		session_close(s, rq->close_reason ? rq->close_reason : "request handler failed");
		return HEAD_CLOSED;
	}
	if (rq->answer || rq->pending)
		rq->resp = KM_RESP_LOCAL;
	if (rq->wait_at_tail && fetch_wait(s, rq)) {
		req_discard(rq); /* read and classified again when the wait is over */
		return HEAD_WAIT;
	}
	return HEAD_DONE;
}

/* A small request's own frame cap (km_frame_cap). */
static size_t frame_cap_of(const km_config *cfg, km_frame_cap cap)
{
	return (size_t)(cap == KM_FRAME_CAP_AUTH ? cfg->max_auth_frame_bytes : cfg->max_local_frame_bytes);
}

static head_result request_head(km_session *s, struct evbuffer *in)
{
	km_proxy_counters *m = s->host->metrics;
	const km_config *cfg = s->host->cfg;
	size_t avail = evbuffer_get_length(in);
	int32_t size = 0;
	km_req_header h;
	const km_proxy_api *api;
	km_req rq;
	head_result r;
	km_frame_status st = km_net_frame_peek(in, cfg->max_frame_bytes, KM_FRAME_MIN_REQUEST, s->first_frame, &size);

	if ((r = frame_head(s, st, size, avail)) != HEAD_DONE)
		return r;
	memset(&rq, 0, sizeof(rq));
	if (!pull_head(in, (size_t)size < KM_REQ_HEAD ? (size_t)size : KM_REQ_HEAD, &h, &rq)) {
		reject(s, KM_REJECT_BAD_HEADER, "malformed request header");
		return HEAD_CLOSED;
	}
	api = km_proxy_apis_find(s->host->apis, h.api_key);
	/* Too new is refused here, unless the row's classify may answer it itself (ApiVersions). */
	if (!api || h.api_version < km_proxy_api_min(api) ||
	    (h.api_version > km_proxy_api_max(api) && api->classify == NULL))
		return reject_unsupported(s, &h);
	if (api->frame_cap && (size_t)size > frame_cap_of(cfg, api->frame_cap)) {
		char msg[200];
		snprintf(msg, sizeof(msg), "%s request frame of %d bytes is over %s %lld", km_proxy_api_name(api), size,
			 api->frame_cap == KM_FRAME_CAP_AUTH ? "max_auth_frame_bytes" : "max_local_frame_bytes",
			 (long long)frame_cap_of(cfg, api->frame_cap));
		reject(s, KM_REJECT_TOO_LARGE, msg);
		return HEAD_CLOSED;
	}
	/* Until the store has loaded nothing would be refused or translated: such a request waits (unread). */
	if (api->needs_state && s->host->state && !km_state_ready(s->host->state)) {
		if (!s->state_wait_ms) {
			s->state_wait_ms = now_ms(s);
			KM_DEBUG("proxy", s->id, "%s v%d (correlation id %d) waits for the mirror state to load",
				 km_proxy_api_name(api), h.api_version, h.correlation_id);
		}
		return HEAD_WAIT;
	}
	rq.s = s;
	rq.api = api;
	rq.seq = s->next_seq;
	rq.h = &h;
	rq.frame_len = (size_t)size;
	rq.action = api->req;
	rq.resp = api->req == KM_REQ_LOCAL ? KM_RESP_LOCAL : km_proxy_api_resp(api, h.api_version);
	rq.expect_response = true;
	for (;;) {
		km_err rc = api->classify ? api->classify(&rq) : KM_OK;
		if (rc != KM_OK) {
			req_discard(&rq);
			reject(s, KM_REJECT_BAD_HEADER, rq.close_reason ? rq.close_reason : "request refused");
			return HEAD_CLOSED;
		}
		if (rq.need <= rq.body_len)
			break;
		req_discard(&rq);
		if (avail - 4 < rq.need) {
			s->partial_since_ms = now_ms(s);
			return HEAD_WAIT; /* classified again from the start when more has arrived */
		}
		if (!pull_head(in, rq.need, &h, &rq)) {
			reject(s, KM_REJECT_BAD_HEADER, "malformed request header");
			return HEAD_CLOSED;
		}
		rq.need = 0;
	}
	if (h.api_version > km_proxy_api_max(api) && rq.action != KM_REQ_LOCAL) {
		req_discard(&rq);
		return reject_unsupported(s, &h);
	}
	if (rq.action != KM_REQ_FORWARD && (r = request_held(s, in, st == KM_FRAME_READY, &h, &rq)) != HEAD_DONE)
		return r;
	s->partial_since_ms = 0;
	s->first_frame = false;
	s->fetch_waited = false;
	s->next_seq++;
	KM_TRACE("proxy", s->id, "request %s v%d corr %d size %d: %s", km_proxy_api_name(api), h.api_version,
		 h.correlation_id, size, km_req_action_names[rq.action]);
	km_metrics_request(m, h.api_key);
	/* acks=0: the broker sends nothing back, so nothing waits in the FIFO. */
	if (rq.expect_response || rq.resp == KM_RESP_LOCAL) {
		if (!push_inflight(s, &rq, api)) {
			req_discard(&rq);
			session_close(s, "out of memory");
			return HEAD_CLOSED;
		}
		rq.ctx = NULL; /* the FIFO entry owns it now */
	}
	if (rq.resp == KM_RESP_LOCAL) {
		/* Answered here: the frame goes nowhere. */
		m->client_bytes_in += (uint64_t)size + 4;
		evbuffer_drain(in, (size_t)size + 4);
		req_discard(&rq);
		return HEAD_DONE;
	}
	if (rq.rewritten) {
		/* A hold hook rewrote the request: the new frame replaces the old one. */
		uint8_t pre[4];
		size_t n = evbuffer_get_length(rq.rewritten);
		m->client_bytes_in += (uint64_t)size + 4;
		evbuffer_drain(in, (size_t)size + 4);
		km_put_be32(pre, (uint32_t)n);
		evbuffer_prepend(rq.rewritten, pre, 4);
		up_send(s, rq.rewritten, n + 4);
		req_discard(&rq);
		return HEAD_DONE;
	}
	/* Forwarded by length: what is here now, the rest as it comes (RQ_MOVE). */
	req_discard(&rq);
	s->rq.left = (size_t)size + 4;
	s->rq.state = RQ_MOVE;
	return HEAD_DONE;
}

static void cli_read_cb(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	const km_config *cfg = s->host->cfg;
	struct evbuffer *in = bufferevent_get_input(bev);
	bool answered = false;

	s->last_activity_ms = now_ms(s);
	if (!s->cli_paused)
		km_net_bev_fill(bev, KM_READ_FILL);
	while (!s->closed) {
		if (s->rq.state == RQ_MOVE) {
			size_t avail = evbuffer_get_length(in), n = avail < s->rq.left ? avail : s->rq.left;
			s->host->metrics->client_bytes_in += n;
			up_send(s, in, n);
			s->rq.left -= n;
			if (s->rq.left) {
				s->partial_since_ms = now_ms(s);
				break;
			}
			s->partial_since_ms = 0;
			s->rq.state = RQ_HEAD;
			continue;
		}
		if (s->draining || inflights_count(&s->fifo) >= (size_t)cfg->max_inflight_requests)
			break;
		if (s->host != s->set->host && evbuffer_get_length(in)) {
			/* The upstream was swapped: nothing new goes to the previous one. The request stays
			 * unread; the client sends it again on a new connection, to the new upstream. */
			s->draining = true;
			update_cli_reading(s);
			maybe_finish_drain(s);
			break;
		}
		{
			size_t fifo_before = inflights_count(&s->fifo);
			head_result r = request_head(s, in);
			if (r != HEAD_DONE)
				break;
			if (s->rq.state == RQ_HEAD && inflights_count(&s->fifo) > fifo_before)
				answered = true; /* a local answer may be at the head now */
		}
	}
	if (s->closed)
		return;
	/*
	 * The first request for the broker has been read (its header checked, its bytes held): dial
	 * now. Not earlier: a socket that sends nothing, or nothing Kafka, opens no broker connection.
	 * Here, not in up_send: a dial that fails at once closes the session, which a hook or the
	 * loop above must not see.
	 */
	if (s->up_state == UP_NONE && evbuffer_get_length(s->held)) {
		up_connect(s);
		if (s->closed)
			return;
	}
	if (answered)
		pump_responses(s);
	else
		update_cli_reading(s);
}

static void cli_write_cb(struct bufferevent *bev, void *arg)
{
	km_session *s = arg;
	if (s->closed)
		return;
	if (s->close_when_written) {
		if (!evbuffer_get_length(bufferevent_get_output(bev)))
			session_close(s, s->close_when_written);
		return;
	}
	update_up_reading(s);
	maybe_finish_drain(s);
}

static void cli_event_cb(struct bufferevent *bev, short what, void *arg)
{
	km_session *s = arg;

	if (what & BEV_EVENT_CONNECTED)
		return;
	if (what & BEV_EVENT_EOF) {
		session_close(s, client_closed);
	} else if (what & BEV_EVENT_TIMEOUT) {
		session_close(s, s->close_when_written ? s->close_when_written : "client write timed out");
	} else if (what & BEV_EVENT_ERROR) {
		char why[512];
		if (km_net_bev_error(bev, why, sizeof(why)) == KM_ERR_CLOSED) {
			session_close(s, client_closed);
			return;
		}
		KM_INFO("proxy", s->id, "client connection error%s: %s", s->host->server_tls ? " (TLS)" : "", why);
		session_close(s, "client connection error");
	}
}

/* ---- the set ---- */

km_session_set *km_session_set_new(const km_session_host *host)
{
	km_session_set *set = calloc(1, sizeof(*set));
	if (set)
		set->host = host;
	return set;
}

void km_session_set_close_all(km_session_set *set, const char *why)
{
	while (set->sessions)
		session_close(set->sessions, why);
}

void km_session_set_free(km_session_set *set)
{
	if (!set)
		return;
	km_session_set_close_all(set, "shutdown");
	reap(set);
	km_peers_clear(&set->peers);
	if (set->reap_ev)
		event_free(set->reap_ev);
	free(set);
}

size_t km_session_set_count(const km_session_set *set)
{
	return set->count;
}

size_t km_session_set_count_of(const km_session_set *set, const km_session_host *host)
{
	size_t n = 0;
	for (const km_session *s = set->sessions; s; s = s->next)
		n += !s->closed && s->host == host;
	return n;
}

void km_session_set_rehost(km_session_set *set, const km_session_host *to)
{
	for (km_session *s = set->sessions; s; s = s->next)
		if (s->host == set->host)
			s->host = to;
}

void km_session_set_close_of(km_session_set *set, const km_session_host *host, const char *why)
{
	km_session *s = set->sessions;
	while (s) {
		km_session *next = s->next;
		if (s->host == host && !s->closed)
			session_close(s, why);
		s = next;
	}
}

/* A connection refused at accept: closed at once, counted, and logged once in a while (a flood would flood the log). */
static void refuse(km_session_set *set, int fd, const struct sockaddr *sa, km_reject_reason why)
{
	const km_config *cfg = set->host->cfg;
	uint64_t held;
	char addr[64];

	evutil_closesocket(fd);
	set->host->metrics->rejected[why]++;
	if (!km_log_gate_pass(&set->refused_log, base_now_ms(set->host->base), &held))
		return;
	km_peers_format(sa, addr, sizeof(addr));
	KM_WARN("proxy", 0,
		"refused a client connection from %s: %s (%lld) reached; %llu more refused in the %d s before", addr,
		why == KM_REJECT_MAX_CONNECTIONS ? "max_connections" : "max_connections_per_ip",
		(long long)(why == KM_REJECT_MAX_CONNECTIONS ? cfg->max_connections : cfg->max_connections_per_ip),
		(unsigned long long)held, KM_LOG_GATE_MS / 1000);
}

/* The caps of max_connections and max_connections_per_ip: the new connection's peer entry, or NULL (fd closed). */
static km_peer *admit(km_session_set *set, int fd, const struct sockaddr *sa)
{
	const km_config *cfg = set->host->cfg;
	km_peer *p;
	bool full;

	if (cfg->max_connections && set->count >= (size_t)cfg->max_connections) {
		refuse(set, fd, sa, KM_REJECT_MAX_CONNECTIONS);
		return NULL;
	}
	if ((p = km_peers_take(&set->peers, sa, cfg->max_connections_per_ip, &full)))
		return p;
	if (full) {
		refuse(set, fd, sa, KM_REJECT_MAX_CONNECTIONS_PER_IP);
	} else {
		KM_ERROR("proxy", 0, "out of memory accepting a client connection");
		evutil_closesocket(fd);
	}
	return NULL;
}

void km_session_set_accept(km_session_set *set, int fd, const struct sockaddr *sa, int32_t node_id)
{
	const km_session_host *host = set->host;
	km_peer *peer = admit(set, fd, sa);
	km_session *s;
	int one = 1;

	if (!peer)
		return;
	s = calloc(1, sizeof(*s));
	if (!s || !(s->held = evbuffer_new())) {
		free(s);
		km_peers_release(&set->peers, peer);
		evutil_closesocket(fd);
		return;
	}
	s->peer = peer;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	s->set = set;
	s->host = host;
	s->id = ++set->next_id;
	s->node_id = node_id;
	s->first_frame = true;
	inflights_init(&s->fifo);
	s->last_activity_ms = now_ms(s);
	s->cli = km_net_bev_new(host->base, fd, host->server_tls, true, NULL, false);
	if (!s->cli) {
		evutil_closesocket(fd);
		km_peers_release(&set->peers, peer);
		evbuffer_free(s->held);
		free(s);
		return;
	}
	s->next = set->sessions;
	if (set->sessions)
		set->sessions->prev = s;
	set->sessions = s;
	set->count++;
	host->metrics->client_connections++;
	host->metrics->client_connections_total++;
	km_net_bev_setcb(s->cli, cli_read_cb, cli_write_cb, cli_event_cb, s);
	bufferevent_setwatermark(s->cli, EV_WRITE, (size_t)host->cfg->connection_buffer_bytes / 2, 0);
	km_net_bev_enable(s->cli, EV_READ | EV_WRITE);
	KM_DEBUG("proxy", s->id, "client connected on %s port (node %d)", node_id < 0 ? "bootstrap" : "broker", node_id);
}

size_t km_session_set_drain(km_session_set *set, size_t n)
{
	return km_session_set_drain_of(set, NULL, n);
}

size_t km_session_set_drain_of(km_session_set *set, const km_session_host *host, size_t n)
{
	size_t asked = 0;
	km_session *s = set->sessions;
	while (s && asked < n) {
		km_session *next = s->next;
		if (!s->closed && !s->draining && (!host || s->host == host)) {
			s->draining = true;
			asked++;
			update_cli_reading(s);
			maybe_finish_drain(s);
		}
		s = next;
	}
	return asked;
}

static void session_tick(km_session *s, uint64_t now)
{
	const km_config *cfg = s->host->cfg;
	inflight *f = inflights_front(&s->fifo);
	if (cfg->frame_timeout_ms && s->partial_since_ms && !s->cli_paused &&
	    now - s->partial_since_ms > (uint64_t)cfg->frame_timeout_ms) {
		reject(s, KM_REJECT_FRAME_TIMEOUT, "partial request frame stalled past frame_timeout_ms");
		return;
	}
	if (cfg->upstream_request_timeout_ms && s->state_wait_ms &&
	    now - s->state_wait_ms > (uint64_t)cfg->upstream_request_timeout_ms) {
		reject(s, KM_REJECT_STATE_TIMEOUT,
		       "the mirror state did not load within upstream_request_timeout_ms; see the state store's log lines");
		return;
	}
	/* The proxy's own pending answers are not the upstream's to time out. */
	if (cfg->upstream_request_timeout_ms && f && f->resp != KM_RESP_LOCAL && !f->started &&
	    (now_us() - f->t0_us) / 1000 > (uint64_t)cfg->upstream_request_timeout_ms) {
		reject(s, KM_REJECT_REQUEST_TIMEOUT, "no response from upstream within upstream_request_timeout_ms");
		return;
	}
	if (cfg->idle_timeout_ms && !f && !s->partial_since_ms && now - s->last_activity_ms > (uint64_t)cfg->idle_timeout_ms)
		reject(s, KM_REJECT_IDLE_TIMEOUT, "connection idle past idle_timeout_ms");
}

void km_session_set_state_ready(km_session_set *set, const km_state *st)
{
	for (km_session *s = set->sessions; s; s = s->next)
		if (s->state_wait_ms && s->host->state == st) {
			s->state_wait_ms = 0;
			update_cli_reading(s);
		}
}

void km_session_set_tail_moved(km_session_set *set, const void *map)
{
	km_session *s = set ? set->waiting : NULL;
	while (s) {
		km_session *next = s->wait_next;
		bool mine = s->tail_any;
		for (size_t i = 0; !mine && i < s->ntail_maps; i++)
			mine = s->tail_maps[i] == map;
		if (mine) {
			/* Out of the list now; its wait ends in its own event, not inside the pipeline's call. */
			waiting_unlink(s);
			s->host->metrics->fetch_tail_waits_woken_total++;
			event_del(s->tail_ev);
			event_active(s->tail_ev, EV_TIMEOUT, 1);
		}
		s = next;
	}
}

void km_session_set_tick(km_session_set *set, uint64_t now_ms_)
{
	km_session *s = set->sessions;
	while (s) {
		km_session *next = s->next;
		session_tick(s, now_ms_);
		s = next;
	}
}

static km_session *session_find(km_session_set *set, uint64_t session_id)
{
	km_session *s = set->sessions;
	while (s && s->id != session_id)
		s = s->next;
	return s && !s->closed ? s : NULL;
}

void km_session_fail(km_session_set *set, uint64_t session_id, const char *why)
{
	km_session *s = session_find(set, session_id);
	if (s)
		session_close(s, why);
}

km_err km_session_answer(km_session_set *set, uint64_t session_id, uint64_t seq, struct evbuffer *body)
{
	km_session *s = session_find(set, session_id);
	if (!s)
		return KM_ERR_CLOSED;
	for (size_t i = 0; i < inflights_count(&s->fifo); i++) {
		inflight *f = inflights_at(&s->fifo, i);
		if (f->seq != seq)
			continue;
		if (f->resp != KM_RESP_LOCAL || f->local)
			return KM_ERR_INVAL;
		if (frame_local(f, body, &f->local) != KM_OK) {
			session_close(s, "out of memory");
			return KM_ERR_NOMEM;
		}
		/* Sent now if it is at the head; responses buffered behind it follow. */
		pump_responses(s);
		return KM_OK;
	}
	return KM_ERR_INVAL;
}

km_err km_session_probe(km_session *s, int16_t key, int16_t version, const uint8_t *body, size_t len,
			km_session_probe_cb cb, void *arg)
{
	int hv = km_proxy_request_header_version(key, version);
	static const char client_id[] = "kmirrord";
	struct evbuffer *frame;
	inflight f;
	km_wr w;

	if (s->closed)
		return KM_ERR_CLOSED;
	/* Only from a hook: then nothing of the client's is half sent upstream, and the probe's FIFO
	 * entry comes before the entry of the request it serves. */
	if (!s->in_hook || hv < 0 || len > (size_t)s->host->cfg->max_frame_bytes)
		return KM_ERR_INVAL;
	memset(&f, 0, sizeof(f));
	f.corr = s->next_probe_corr++;
	f.key = key;
	f.version = version;
	f.seq = UINT64_MAX; /* never a client request's: km_session_answer cannot find it */
	f.t0_us = now_us();
	f.resp = KM_RESP_WHOLE;
	f.api = km_proxy_apis_find(s->host->apis, key);
	f.probe = cb;
	f.probe_arg = arg;
	if (!f.api)
		return KM_ERR_INVAL;
	km_wr_init(&w);
	km_wr_i32(&w, 0); /* size, patched below */
	km_wr_i16(&w, key);
	km_wr_i16(&w, version);
	km_wr_i32(&w, f.corr);
	if (hv >= 1)
		km_wr_string(&w, false, km_str_c(client_id));
	if (hv >= 2)
		km_wr_uvarint(&w, 0); /* no header tags */
	km_wr_raw(&w, body, len);
	if (!km_wr_ok(&w) || w.len > INT32_MAX || !(frame = evbuffer_new())) {
		km_wr_free(&w);
		return KM_ERR_NOMEM;
	}
	km_wr_patch_i32(&w, 0, (int32_t)(w.len - 4));
	if (evbuffer_add(frame, w.buf, w.len) != 0 || !inflights_push(&s->fifo, &f)) {
		km_wr_free(&w);
		evbuffer_free(frame);
		return KM_ERR_NOMEM;
	}
	KM_DEBUG("proxy", s->id, "probe %s v%d (correlation id %d) on the client's upstream connection",
		 km_proxy_api_name(f.api), version, f.corr);
	up_send(s, frame, w.len);
	km_wr_free(&w);
	evbuffer_free(frame);
	return KM_OK;
}
