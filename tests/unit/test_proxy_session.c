/*
 * Proxy sessions end to end in one process: a real km_proxy between a raw test client and a fake upstream
 * broker that injects what a real broker will not (wrong correlation ids, NodeEndpoints on demand).
 */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <cmocka.h>

#include <event2/listener.h>

#include "kmirror/arena.h"
#include "kmirror/log.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/net.h"
#include "kmirror/proxy.h"
#include "proxy/apis.h"
#include "proxy/readonly.h"
#include "proxy/proxy_int.h" /* the table and the session set of a running proxy */
#include "proxy/rewrite.h"

/* ---- fake upstream broker ---- */

typedef struct upstream {
	struct event_base *base;
	struct evconnlistener *l;
	uint16_t port;
	int requests[128];     /* by api key, application connections only */
	int metadata_refreshes;
	bool bad_corr;
	bool node_endpoints;   /* Fetch v16 answers carry NodeEndpoints */
	int16_t fetch_error;   /* Fetch answers: the partition's error (no records, watermarks -1, as a broker) */
	bool second_broker;    /* Metadata answers list node 1 too */
	bool silent;           /* application requests get no answer */
	size_t bytes_received; /* all bytes read from the proxy's application connections */
	struct bufferevent *held_bev; /* ListOffsets: the second half of the answer waits here */
	km_wr held_rest;
	size_t seen_pending;  /* bytes counted but not yet consumed as a whole frame */
	int32_t last_acks0_corr;
} upstream;

static void up_reply(struct bufferevent *bev, int32_t corr, bool hdr_tags, const km_wr *body)
{
	uint8_t hdr[9];
	size_t n = hdr_tags ? 9 : 8;
	km_put_be32(hdr, (uint32_t)(n - 4 + body->len));
	km_put_be32(hdr + 4, (uint32_t)corr);
	hdr[8] = 0;
	evbuffer_add(bufferevent_get_output(bev), hdr, n);
	evbuffer_add(bufferevent_get_output(bev), body->buf, body->len);
}

static void metadata_v9_body(km_wr *w, uint16_t port, bool second)
{
	km_wr_i32(w, 0);
	km_wr_array_len(w, true, second ? 2 : 1);
	for (int32_t node = 0; node < (second ? 2 : 1); node++) {
		km_wr_i32(w, node);
		km_wr_string(w, true, km_str_c("127.0.0.1")); /* the real broker (this fake) */
		km_wr_i32(w, port);
		km_wr_string(w, true, KM_STR_NULL);
		km_wr_uvarint(w, 0);
	}
	km_wr_string(w, true, km_str_c("cluster"));
	km_wr_i32(w, 0);
	km_wr_array_len(w, true, 0);
	km_wr_i32(w, 0);
	km_wr_uvarint(w, 0);
}

/* Offset of the one partition's ErrorCode in fetch_v16_body's body. */
#define FETCH_BODY_PART_ERROR_OFF (4 + 2 + 4 + 1 + 16 + 1 + 4)

/* The record set's size in fetch_v16_body's answers (test_fetch_spliced makes it large). */
static size_t fetch_records_len = 300;

/* A Fetch v13-v16 body (the same bytes for each, but NodeEndpoints, a v16 tag). */
static void fetch_v16_body(km_wr *w, bool node_endpoints, int16_t part_error)
{
	uint8_t *recs = malloc(fetch_records_len);
	for (size_t i = 0; i < fetch_records_len; i++)
		recs[i] = fetch_records_len == 300 ? 0xab : (uint8_t)(i * 31 + i / 4096);
	km_wr_i32(w, 0);
	km_wr_i16(w, 0);
	km_wr_i32(w, 0);
	km_wr_array_len(w, true, 1);
	{
		km_uuid topic_id = {{0x42}};
		km_wr_uuid(w, &topic_id); /* v13+ */
	}
	km_wr_array_len(w, true, 1);
	km_wr_i32(w, 0);
	km_wr_i16(w, part_error);
	km_wr_i64(w, part_error ? -1 : 10);
	km_wr_i64(w, part_error ? -1 : 10);
	km_wr_i64(w, part_error ? -1 : 0);
	km_wr_array_len(w, true, -1);
	km_wr_i32(w, -1);
	km_wr_bytes(w, true, (km_bytes){recs, part_error ? 0 : (int32_t)fetch_records_len});
	free(recs);
	km_wr_uvarint(w, 0);
	km_wr_uvarint(w, 0);
	if (node_endpoints) {
		km_wr ne;
		km_wr_init(&ne);
		km_wr_array_len(&ne, true, 1);
		km_wr_i32(&ne, 0);
		km_wr_string(&ne, true, km_str_c("kafka-0.broker.internal"));
		km_wr_i32(&ne, 9092);
		km_wr_string(&ne, true, KM_STR_NULL);
		km_wr_uvarint(&ne, 0);
		km_wr_uvarint(w, 1);
		km_wr_uvarint(w, 0);
		km_wr_uvarint(w, (uint32_t)ne.len);
		km_wr_raw(w, ne.buf, ne.len);
		km_wr_free(&ne);
	} else {
		km_wr_uvarint(w, 0);
	}
}

static void up_read(struct bufferevent *bev, void *arg)
{
	upstream *u = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	int32_t size;

	u->bytes_received += evbuffer_get_length(in) - u->seen_pending;
	u->seen_pending = evbuffer_get_length(in);
	while (km_net_frame_peek(in, 1 << 24, 8, false, &size) == KM_FRAME_READY) {
		uint8_t *p = evbuffer_pullup(in, size + 4);
		km_req_header h;
		km_wr w;
		bool internal;
		assert_int_equal(km_net_parse_request_header(p + 4, (size_t)size, 1, &h), KM_OK);
		internal = km_str_eq_c(h.client_id, "kmirrord");
		km_wr_init(&w);
		if (internal) {
			u->metadata_refreshes++;
			metadata_v9_body(&w, u->port, u->second_broker);
			up_reply(bev, h.correlation_id, true, &w);
		} else {
			int16_t acks = 1;
			u->requests[h.api_key & 127]++;
			if (h.api_key == KM_API_PRODUCE)
				assert_int_equal(km_proxy_produce_acks(p + 4, (size_t)size, h.api_version, &acks), KM_OK);
			if (u->silent) {
				/* swallow it */
			} else if (h.api_key == KM_API_PRODUCE && acks == 0) {
				u->last_acks0_corr = h.correlation_id; /* no response, as a broker */
			} else if (h.api_key == KM_API_METADATA) {
				metadata_v9_body(&w, u->port, u->second_broker);
				up_reply(bev, h.correlation_id + (u->bad_corr ? 1 : 0), true, &w);
			} else if (h.api_key == 2) {
				/* ListOffsets (never rewritten): 10000 bytes, only the first 3000 sent now */
				uint8_t hdr[9];
				km_wr_init(&u->held_rest);
				km_put_be32(hdr, 5 + 10000);
				km_put_be32(hdr + 4, (uint32_t)h.correlation_id);
				hdr[8] = 0;
				evbuffer_add(bufferevent_get_output(bev), hdr, 9);
				for (int i = 0; i < 10000; i++)
					km_wr_i8(i < 3000 ? &w : &u->held_rest, (int8_t)(i & 0x7f));
				evbuffer_add(bufferevent_get_output(bev), w.buf, w.len);
				u->held_bev = bev;
			} else if (h.api_key == KM_API_FETCH) {
				fetch_v16_body(&w, u->node_endpoints && h.api_version >= 16, u->fetch_error);
				up_reply(bev, h.correlation_id, true, &w);
			} else {
				/* Produce v9: no topics, throttle, no tags */
				km_wr_array_len(&w, true, 0);
				km_wr_i32(&w, 0);
				km_wr_uvarint(&w, 0);
				up_reply(bev, h.correlation_id, true, &w);
			}
		}
		km_wr_free(&w);
		evbuffer_drain(in, (size_t)size + 4);
		u->seen_pending -= (size_t)size + 4;
	}
}

static void up_event(struct bufferevent *bev, short what, void *arg)
{
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		bufferevent_free(bev);
}

static void up_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
	upstream *u = arg;
	struct bufferevent *bev = bufferevent_socket_new(u->base, fd, BEV_OPT_CLOSE_ON_FREE);
	bufferevent_setcb(bev, up_read, NULL, up_event, u);
	bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static bool port_free(uint16_t port)
{
	struct sockaddr_in sin;
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	bool ok;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sin.sin_port = htons(port);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ok = bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
	close(fd);
	return ok;
}

static uint16_t free_port(void)
{
	struct sockaddr_in sin;
	socklen_t slen = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	getsockname(fd, (struct sockaddr *)&sin, &slen);
	close(fd);
	return ntohs(sin.sin_port);
}

/* ---- fixture: proxy + upstream ---- */

typedef struct fixture {
	struct event_base *base;
	upstream up;
	km_proxy *px;
	km_config cfg;
	uint16_t listen_port;
	uint16_t base_port;
} fixture;

static void run_for(struct event_base *base, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	event_base_loopexit(base, &tv);
	event_base_dispatch(base);
}

static char tls_dir[64];

static int setup_with(void **state, bool tls)
{
	fixture *f = calloc(1, sizeof(*f));
	struct sockaddr_in sin;
	socklen_t slen = sizeof(sin);
	char err[256], v[64];

	km_log_set_level(getenv("KM_TEST_LOG") ? KM_LOG_DEBUG : KM_LOG_ERROR);
	f->base = event_base_new();
	f->up.base = f->base;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->up.l = evconnlistener_new_bind(f->base, up_accept, &f->up, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 16,
					  (struct sockaddr *)&sin, sizeof(sin));
	assert_non_null(f->up.l);
	getsockname(evconnlistener_get_fd(f->up.l), (struct sockaddr *)&sin, &slen);
	f->up.port = ntohs(sin.sin_port);

	f->listen_port = free_port();
	/*
	 * The broker ports of nodes 0 and 1 must both be free, and stay free until the proxy opens
	 * node 1's later: below the ephemeral range (32768 up), where no outgoing connection of a test
	 * running next to this one can take it meanwhile.
	 */
	{
		static unsigned step;
		if (!step)
			step = (unsigned)getpid();
		do
			f->base_port = (uint16_t)(20000 + (step++ * 7919u) % 12000);
		while (!port_free(f->base_port) || !port_free((uint16_t)(f->base_port + 1)));
	}
	km_config_init(&f->cfg);
	snprintf(v, sizeof(v), "127.0.0.1:%u", f->listen_port);
	assert_int_equal(km_config_set(&f->cfg, "listen", v, err, sizeof(err)), KM_OK);
	snprintf(v, sizeof(v), "127.0.0.1:%u", f->up.port);
	assert_int_equal(km_config_set(&f->cfg, "upstream", v, err, sizeof(err)), KM_OK);
	snprintf(v, sizeof(v), "%u", f->base_port);
	assert_int_equal(km_config_set(&f->cfg, "broker_port_base", v, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "broker_port_count", "2", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "advertised_host", "proxy.test", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "max_frame_bytes", "100000", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "frame_timeout_ms", "300", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "drain_interval_ms", "50", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "drain_timeout_ms", "2000", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "idle_timeout_ms", "600", err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&f->cfg, "upstream_request_timeout_ms", "400", err, sizeof(err)), KM_OK);
	if (tls) {
		char path[128];
		snprintf(path, sizeof(path), "%s/cert.pem", tls_dir);
		assert_int_equal(km_config_set(&f->cfg, "tls_cert_file", path, err, sizeof(err)), KM_OK);
		snprintf(path, sizeof(path), "%s/key.pem", tls_dir);
		assert_int_equal(km_config_set(&f->cfg, "tls_key_file", path, err, sizeof(err)), KM_OK);
	}
	assert_int_equal(km_config_validate(&f->cfg, err, sizeof(err)), KM_OK);
	f->px = km_proxy_new(f->base, &f->cfg, NULL, err, sizeof(err));
	if (!f->px)
		fail_msg("km_proxy_new: %s", err);
	/* Let the startup metadata refresh open the broker port. */
	for (int i = 0; i < 100 && f->up.metadata_refreshes == 0; i++)
		run_for(f->base, 10);
	run_for(f->base, 20);
	*state = f;
	return 0;
}

static int setup(void **state)
{
	return setup_with(state, false);
}

/* A self-signed certificate for localhost, made with the openssl tool; skipped without it. */
static int setup_tls(void **state)
{
	char cmd[512];
	snprintf(tls_dir, sizeof(tls_dir), "/tmp/km-tls-XXXXXX");
	if (!mkdtemp(tls_dir))
		return -1;
	snprintf(cmd, sizeof(cmd),
		 "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
		 "-addext subjectAltName=DNS:localhost -keyout %s/key.pem -out %s/cert.pem >/dev/null 2>&1",
		 tls_dir, tls_dir);
	if (system(cmd) != 0)
		return -1;
	return setup_with(state, true);
}

static int teardown(void **state)
{
	fixture *f = *state;
	km_proxy_free(f->px);
	evconnlistener_free(f->up.l);
	event_base_loop(f->base, EVLOOP_NONBLOCK);
	event_base_free(f->base);
	km_config_free(&f->cfg);
	free(f);
	return 0;
}

/* ---- a raw blocking test client (the proxy runs while we wait for bytes) ---- */

typedef struct tclient {
	struct bufferevent *bev;
	bool closed;
} tclient;

static void tc_event(struct bufferevent *bev, short what, void *arg)
{
	tclient *c = arg;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		c->closed = true;
}

static tclient *tc_connect(fixture *f, uint16_t port)
{
	tclient *c = calloc(1, sizeof(*c));
	struct sockaddr_in sin;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sin.sin_port = htons(port);
	c->bev = bufferevent_socket_new(f->base, -1, BEV_OPT_CLOSE_ON_FREE);
	bufferevent_setcb(c->bev, NULL, NULL, tc_event, c);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	assert_int_equal(bufferevent_socket_connect(c->bev, (struct sockaddr *)&sin, sizeof(sin)), 0);
	return c;
}

static tclient *tc_connect_tls(fixture *f, uint16_t port, SSL_CTX **ctx_out)
{
	tclient *c = calloc(1, sizeof(*c));
	struct sockaddr_in sin;
	char ca[128], err[256];
	SSL_CTX *ctx;

	snprintf(ca, sizeof(ca), "%s/cert.pem", tls_dir);
	ctx = km_net_tls_client_ctx(&(km_net_tls_files){.ca_file = ca}, true, err, sizeof(err));
	assert_non_null(ctx);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sin.sin_port = htons(port);
	c->bev = km_net_bev_new(f->base, -1, ctx, false, "localhost", true);
	assert_non_null(c->bev);
	bufferevent_setcb(c->bev, NULL, NULL, tc_event, c);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	assert_int_equal(bufferevent_socket_connect(c->bev, (struct sockaddr *)&sin, sizeof(sin)), 0);
	*ctx_out = ctx;
	return c;
}

static void tc_free(tclient *c)
{
	bufferevent_free(c->bev);
	free(c);
}

static void tc_request(tclient *c, int16_t key, int16_t ver, int32_t corr, const km_wr *body)
{
	km_wr w;
	bool flex = km_proxy_request_header_version(key, ver) == 2;
	size_t start;
	km_wr_init(&w);
	start = km_wr_reserve(&w, 4);
	km_wr_i16(&w, key);
	km_wr_i16(&w, ver);
	km_wr_i32(&w, corr);
	km_wr_string(&w, false, km_str_c("test"));
	if (flex)
		km_wr_uvarint(&w, 0);
	if (body)
		km_wr_raw(&w, body->buf, body->len);
	km_wr_patch_i32(&w, start, (int32_t)(w.len - 4));
	evbuffer_add(bufferevent_get_output(c->bev), w.buf, w.len);
	km_wr_free(&w);
}

static void produce_body(km_wr *w, int16_t acks)
{
	km_wr_string(w, true, KM_STR_NULL); /* transactional id */
	km_wr_i16(w, acks);
	km_wr_i32(w, 1000);
	km_wr_array_len(w, true, 0);
	km_wr_uvarint(w, 0);
}

/* Wait for one whole response frame; returns it (malloc'd, without the size) or NULL on close/timeout. */
static uint8_t *tc_response(fixture *f, tclient *c, size_t *len)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	for (int i = 0; i < 300; i++) {
		int32_t size;
		if (km_net_frame_peek(in, 1 << 24, 4, false, &size) == KM_FRAME_READY) {
			uint8_t *out = malloc((size_t)size);
			evbuffer_drain(in, 4);
			evbuffer_remove(in, out, (size_t)size);
			*len = (size_t)size;
			return out;
		}
		if (c->closed)
			return NULL;
		run_for(f->base, 10);
	}
	return NULL;
}

static void wait_closed(fixture *f, tclient *c)
{
	for (int i = 0; i < 300 && !c->closed; i++)
		run_for(f->base, 10);
	assert_true(c->closed);
}

/* ---- tests ---- */

static void test_pipelining_and_acks0(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	km_wr p0, p1;
	uint8_t *r;
	size_t len;

	km_wr_init(&p0);
	km_wr_init(&p1);
	produce_body(&p0, 0);
	produce_body(&p1, -1);
	/* acks=0, Metadata, acks=all, all written at once */
	tc_request(c, KM_API_PRODUCE, 9, 100, &p0);
	tc_request(c, KM_API_METADATA, 9, 101, NULL);
	tc_request(c, KM_API_PRODUCE, 9, 102, &p1);
	tc_request(c, KM_API_PRODUCE, 9, 103, &p0);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 101);
	/* the broker address never reaches the client */
	assert_null(memmem(r, len, "127.0.0.1", 9));
	assert_non_null(memmem(r, len, "proxy.test", 10));
	free(r);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 102);
	free(r);
	/* Nothing more: the second acks=0 produce has no response, and the session is still healthy. */
	tc_request(c, KM_API_METADATA, 9, 104, NULL);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 104);
	free(r);
	assert_int_equal(f->up.requests[KM_API_PRODUCE], 3);
	assert_int_equal(f->up.last_acks0_corr, 103);
	assert_false(c->closed);
	km_wr_free(&p0);
	km_wr_free(&p1);
	tc_free(c);
}


/*
 * The API table is the one place to extend the proxy: a new locally answered API (answered later,
 * as the mirror RPCs will be) and a Produce that is held and inspected whole (as the read-only check
 * will be) are two rows and their hooks, with no change to the session code. FIFO order holds.
 */
#define KM_TEST_LOCAL_KEY 32100

static struct {
	uint64_t session_id, seq;
	int held, forwarded, merged;
} ext;

static km_err test_local_later(km_req *rq)
{
	ext.session_id = km_session_id(rq->s);
	ext.seq = rq->seq;
	rq->pending = true;
	return KM_OK;
}

/* The broker's Produce response merged with a local part: one refused partition added in front. */
static km_err test_produce_merge(km_resp *rs)
{
	km_wr w;
	uint8_t *frame = evbuffer_pullup(rs->in, (ev_ssize_t)rs->frame_len + 4);
	size_t body = rs->body_off;
	assert_int_equal(frame[body], 1); /* the broker's answer: no topics (compact count 0) */
	km_wr_init(&w);
	km_wr_i32(&w, 0);
	km_wr_raw(&w, frame + 4, body - 4); /* correlation id and header tags */
	km_wr_array_len(&w, true, 1);
	km_wr_string(&w, true, km_str_c("mirrored"));
	km_wr_array_len(&w, true, 1);
	km_wr_i32(&w, 0);      /* partition */
	km_wr_i16(&w, 10042);  /* a local error code */
	km_wr_i64(&w, -1);
	km_wr_i64(&w, -1);
	km_wr_i64(&w, -1);
	km_wr_array_len(&w, true, 0);
	km_wr_string(&w, true, km_str_c("refused here"));
	km_wr_uvarint(&w, 0);
	km_wr_uvarint(&w, 0);
	km_wr_raw(&w, frame + body + 1, rs->frame_len + 4 - body - 1); /* throttle and tags */
	km_wr_patch_i32(&w, 0, (int32_t)(w.len - 4));
	evbuffer_add(rs->out, w.buf, w.len);
	evbuffer_drain(rs->in, rs->frame_len + 4);
	km_wr_free(&w);
	ext.merged++;
	return KM_OK;
}

/* Produce held whole: acks=-1 requests are answered here (an empty response), others go on with a merge. */
static km_err test_produce_hold(km_req *rq)
{
	int16_t acks = 0;
	km_wr w;
	assert_int_equal(rq->body_len, rq->frame_len); /* the whole frame */
	assert_int_equal(km_proxy_produce_acks(rq->body, rq->body_len, rq->h->api_version, &acks), KM_OK);
	if (acks != -1) {
		ext.forwarded++;
		rq->resp = KM_RESP_WHOLE;
		rq->on_response = test_produce_merge;
		return KM_OK;
	}
	ext.held++;
	km_wr_init(&w);
	km_wr_array_len(&w, true, 0);
	km_wr_i32(&w, 0);
	km_wr_uvarint(&w, 0);
	rq->answer = evbuffer_new();
	evbuffer_add(rq->answer, w.buf, w.len);
	km_wr_free(&w);
	return KM_OK;
}

static void test_table_rows_extend_the_proxy(void **state)
{
	fixture *f = *state;
	km_proxy_api local = {.key = KM_TEST_LOCAL_KEY, .name = "TestLocal", .min_version = 0, .max_version = 0,
			      .req = KM_REQ_LOCAL, .on_request = test_local_later, .note = "test"};
	km_proxy_api produce = *km_proxy_apis_find(f->px->apis, KM_API_PRODUCE);
	tclient *c;
	km_wr p_all, p_one, answer;
	struct evbuffer *body;
	int32_t want[] = {200, 201, 202, 203, 204};
	uint8_t *r;
	size_t len;

	memset(&ext, 0, sizeof(ext));
	produce.req = KM_REQ_HOLD;
	produce.on_request = test_produce_hold;
	assert_int_equal(km_proxy_apis_set(f->px->apis, &local), KM_OK);
	assert_int_equal(km_proxy_apis_set(f->px->apis, &produce), KM_OK);
	c = tc_connect(f, f->listen_port);
	km_wr_init(&p_all);
	km_wr_init(&p_one);
	produce_body(&p_all, -1);
	produce_body(&p_one, 1);
	tc_request(c, KM_TEST_LOCAL_KEY, 0, 200, NULL);
	tc_request(c, KM_API_METADATA, 9, 201, NULL);
	tc_request(c, KM_API_PRODUCE, 9, 202, &p_all);
	tc_request(c, KM_API_PRODUCE, 9, 203, &p_one);
	tc_request(c, KM_API_METADATA, 9, 204, NULL);
	/* The upstream answers at once, but nothing may overtake the pending local answer. */
	run_for(f->base, 200);
	assert_int_equal(f->up.requests[KM_API_METADATA], 2);
	assert_int_equal(evbuffer_get_length(bufferevent_get_input(c->bev)), 0);
	assert_int_equal(ext.held, 1);
	assert_int_equal(ext.forwarded, 1);
	assert_int_equal(f->up.requests[KM_API_PRODUCE], 1); /* the held-and-answered one never went up */
	assert_int_equal(f->up.requests[KM_TEST_LOCAL_KEY & 127], 0);
	/* The answer for an unknown request or a closed session is refused. */
	body = evbuffer_new();
	evbuffer_add(body, "\0\0", 2);
	assert_int_equal(km_session_answer(f->px->sessions, ext.session_id, ext.seq + 1, body), KM_ERR_INVAL);
	assert_int_equal(km_session_answer(f->px->sessions, ext.session_id + 1000, ext.seq, body), KM_ERR_CLOSED);
	km_wr_init(&answer);
	km_wr_i16(&answer, 0);
	km_wr_string(&answer, false, km_str_c("done later"));
	evbuffer_drain(body, evbuffer_get_length(body));
	evbuffer_add(body, answer.buf, answer.len);
	assert_int_equal(km_session_answer(f->px->sessions, ext.session_id, ext.seq, body), KM_OK);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		r = tc_response(f, c, &len);
		assert_non_null(r);
		assert_int_equal(km_be32(r), want[i]);
		if (i == 0) {
			/* response header v0, then the body the handler gave */
			assert_int_equal(len, 4 + answer.len);
			assert_memory_equal(r + 4, answer.buf, answer.len);
		}
		if (i == 3) /* the forwarded Produce: the broker's answer with the local part merged in */
			assert_non_null(memmem(r, len, "refused here", 12));
		free(r);
	}
	assert_int_equal(ext.merged, 1);
	assert_false(c->closed);
	evbuffer_free(body);
	km_wr_free(&answer);
	km_wr_free(&p_all);
	km_wr_free(&p_one);
	tc_free(c);
}

static void test_broker_port(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->base_port); /* node 0 */
	uint8_t *r;
	size_t len;
	tc_request(c, KM_API_METADATA, 9, 7, NULL);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 7);
	free(r);
	assert_int_equal(km_proxy_metrics(f->px)->brokers_known, 1);
	tc_free(c);
}

static void test_tls_hello_rejected(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	const uint8_t hello[] = {0x16, 0x03, 0x01, 0x00, 0xf4, 0x01, 0x00, 0x00, 0xf0, 0x03, 0x03};
	evbuffer_add(bufferevent_get_output(c->bev), hello, sizeof(hello));
	wait_closed(f, c);
	assert_int_equal(km_proxy_metrics(f->px)->rejected[KM_REJECT_TLS_HELLO], 1);
	tc_free(c);
}

static void test_frame_too_large(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	uint8_t big[8];
	km_put_be32(big, 100001);
	km_put_be32(big + 4, 0x00030009);
	evbuffer_add(bufferevent_get_output(c->bev), big, sizeof(big));
	wait_closed(f, c);
	assert_int_equal(km_proxy_metrics(f->px)->rejected[KM_REJECT_TOO_LARGE], 1);
	tc_free(c);
}

static void test_stalled_frame_times_out(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	uint8_t part[6];
	km_put_be32(part, 50);
	km_put_be16(part + 4, 3);
	evbuffer_add(bufferevent_get_output(c->bev), part, sizeof(part));
	wait_closed(f, c);
	assert_int_equal(km_proxy_metrics(f->px)->rejected[KM_REJECT_FRAME_TIMEOUT], 1);
	tc_free(c);
}

static void test_api_versions_too_new(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	uint8_t *r;
	size_t len;
	km_rd rd;
	int32_t corr, n;
	int16_t ec, key, lo, hi;

	/* In order with a forwarded request before it. */
	tc_request(c, KM_API_METADATA, 9, 1, NULL);
	tc_request(c, KM_API_API_VERSIONS, 99, 2, NULL);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 1);
	free(r);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	km_rd_init(&rd, r, len);
	km_rd_i32(&rd, "corr", &corr);
	km_rd_i16(&rd, "ec", &ec);
	km_rd_array_len(&rd, "keys", false, false, 6, &n);
	km_rd_i16(&rd, "key", &key);
	km_rd_i16(&rd, "lo", &lo);
	km_rd_i16(&rd, "hi", &hi);
	assert_true(km_rd_ok(&rd));
	assert_int_equal(corr, 2);
	assert_int_equal(ec, 35);
	assert_int_equal(n, 1);
	assert_int_equal(key, 18);
	assert_int_equal(hi, km_api_lookup(KM_API_API_VERSIONS)->max_version);
	assert_int_equal(f->up.requests[KM_API_API_VERSIONS], 0);
	free(r);
	/* An unknown api key closes the connection, as a broker does. */
	tc_request(c, 20000, 0, 3, NULL);
	wait_closed(f, c);
	tc_free(c);
}

static void test_wrong_correlation_disconnects(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	size_t len;
	f->up.bad_corr = true;
	tc_request(c, KM_API_METADATA, 9, 1, NULL);
	assert_null(tc_response(f, c, &len));
	assert_true(c->closed);
	assert_true(km_proxy_metrics(f->px)->upstream_errors_total >= 1);
	f->up.bad_corr = false;
	tc_free(c);
}

static void test_fetch_node_endpoints(void **state)
{
	fixture *f = *state;
	km_wr body;

	km_wr_init(&body);
	for (int ne = 0; ne < 2; ne++) {
		tclient *c = tc_connect(f, f->listen_port);
		uint8_t *r;
		size_t len;
		km_wr expect, sent;
		km_fetch_response back;
		km_arena a;
		km_rd rd;

		f->up.node_endpoints = ne;
		tc_request(c, KM_API_FETCH, 16, 50 + ne, &body);
		r = tc_response(f, c, &len);
		assert_non_null(r);
		assert_int_equal(km_be32(r), 50 + ne);
		assert_null(memmem(r, len, "kafka-0", 7));
		km_wr_init(&expect);
		km_wr_init(&sent);
		fetch_v16_body(&expect, false, 0);
		fetch_v16_body(&sent, ne, 0);
		/* everything before the top-level tags is the broker's bytes (records included) */
		assert_memory_equal(r + 5, expect.buf, expect.len - 1);
		/* streamed: the size the broker announced stays right */
		assert_int_equal(len, 5 + sent.len);
		if (ne)
			assert_non_null(memmem(r, len, "proxy.test", 10));
		/* and a Kafka decoder reads it (the filler tag is an unknown tag to it) */
		km_arena_init(&a, 0);
		km_fetch_response_init(&back);
		km_rd_init(&rd, r + 5, len - 5);
		assert_int_equal(km_fetch_response_decode(&rd, 16, &back, &a), KM_OK);
		assert_int_equal(km_rd_left(&rd), 0);
		assert_int_equal(back.node_endpoints.count, ne ? 1 : 0);
		if (ne) {
			assert_true(km_str_eq_c(back.node_endpoints.items[0].host, "proxy.test"));
			assert_int_equal(back.node_endpoints.items[0].port, f->base_port);
		}
		km_arena_free(&a);
		km_wr_free(&expect);
		km_wr_free(&sent);
		free(r);
		tc_free(c);
	}
	km_wr_free(&body);
}

/*
 * A 1 MiB record set goes from the broker's socket to the client's by splice: in a Fetch answer
 * walked on the way (v16, NodeEndpoints rewritten at its end) and in one passed on untouched
 * (v13); the client gets the broker's bytes; with splice_min_bytes 0 the same bytes, none spliced.
 */
static void test_fetch_spliced(void **state)
{
	fixture *f = *state;
	km_proxy_counters *m = km_proxy_metrics(f->px);
	static const int16_t versions[] = {16, 13, 16};
	km_wr body;

	km_wr_init(&body);
	f->px->cfg.max_frame_bytes = 8 << 20;
	f->up.node_endpoints = true;
	fetch_records_len = 1 << 20;
	for (int i = 0; i < 3; i++) {
		tclient *c = tc_connect(f, f->listen_port);
		uint64_t before = m->spliced_bytes_total;
		uint8_t *r;
		size_t len;
		km_wr expect, sent;

		if (i == 2)
			f->px->cfg.splice_min_bytes = 0;
		tc_request(c, KM_API_FETCH, versions[i], 70 + i, &body);
		r = tc_response(f, c, &len);
		assert_non_null(r);
		assert_int_equal(km_be32(r), 70 + i);
		km_wr_init(&expect);
		km_wr_init(&sent);
		fetch_v16_body(&expect, false, 0);
		fetch_v16_body(&sent, versions[i] >= 16, 0);
		assert_int_equal(len, 5 + sent.len);
		/* the broker's bytes up to the top-level tags, the 1 MiB of records among them */
		assert_memory_equal(r + 5, expect.buf, expect.len - 1);
		if (versions[i] >= 16) {
			assert_null(memmem(r, len, "kafka-0", 7));
			assert_non_null(memmem(r + len - 64, 64, "proxy.test", 10));
		}
		if (i < 2)
			assert_true(m->spliced_bytes_total - before >= (1u << 20) - 16384);
		else
			assert_int_equal(m->spliced_bytes_total, before);
		km_wr_free(&expect);
		km_wr_free(&sent);
		free(r);
		tc_free(c);
	}
	fetch_records_len = 300;
	km_wr_free(&body);
}

/*
 * After an upstream swap (fetch_oor_hold_until_ms): OFFSET_OUT_OF_RANGE reaches the client as
 * OFFSET_NOT_AVAILABLE, in a streamed version (v16) and in one otherwise forwarded as it came (v13),
 * every other byte as the broker sent it; other errors, and every answer once the hold is over,
 * pass unchanged.
 */
static void test_fetch_oor_hold(void **state)
{
	static const struct {
		int16_t version, error;
		bool hold;
		int16_t want;
	} cases[] = {
		{16, KM_KAFKA_OFFSET_OUT_OF_RANGE, false, KM_KAFKA_OFFSET_OUT_OF_RANGE},
		{13, KM_KAFKA_OFFSET_OUT_OF_RANGE, false, KM_KAFKA_OFFSET_OUT_OF_RANGE},
		{16, KM_KAFKA_OFFSET_OUT_OF_RANGE, true, KM_KAFKA_OFFSET_NOT_AVAILABLE},
		{13, KM_KAFKA_OFFSET_OUT_OF_RANGE, true, KM_KAFKA_OFFSET_NOT_AVAILABLE},
		{13, KM_KAFKA_NOT_LEADER_OR_FOLLOWER, true, KM_KAFKA_NOT_LEADER_OR_FOLLOWER},
		{13, KM_KAFKA_NONE, true, KM_KAFKA_NONE},
	};
	fixture *f = *state;
	km_wr body;
	uint64_t held = 0;

	km_wr_init(&body);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		tclient *c = tc_connect(f, f->listen_port);
		km_wr expect;
		uint8_t *r;
		size_t len;

		f->up.fetch_error = cases[i].error;
		f->px->features.fetch_oor_hold_until_ms = cases[i].hold ? UINT64_MAX : 0;
		tc_request(c, KM_API_FETCH, cases[i].version, 70 + (int32_t)i, &body);
		r = tc_response(f, c, &len);
		assert_non_null(r);
		assert_int_equal(km_be32(r), 70 + (int32_t)i);
		km_wr_init(&expect);
		fetch_v16_body(&expect, false, cases[i].want);
		assert_int_equal(len, 5 + expect.len);
		assert_memory_equal(r + 5, expect.buf, expect.len);
		assert_int_equal(km_be16(r + 5 + FETCH_BODY_PART_ERROR_OFF), (uint16_t)cases[i].want);
		held += cases[i].want == KM_KAFKA_OFFSET_NOT_AVAILABLE;
		assert_int_equal(km_proxy_metrics(f->px)->fetch_oor_held_total, held);
		km_wr_free(&expect);
		free(r);
		tc_free(c);
	}
	f->up.fetch_error = 0;
	f->px->features.fetch_oor_hold_until_ms = 0;
	km_wr_free(&body);
}

static void test_new_broker_gets_port(void **state)
{
	fixture *f = *state;
	tclient *c, *n1;
	uint8_t *r;
	size_t len;

	assert_int_equal(km_proxy_metrics(f->px)->brokers_known, 1);
	/* A client's Metadata answer shows a new broker: its port opens at once. */
	f->up.second_broker = true;
	c = tc_connect(f, f->listen_port);
	tc_request(c, KM_API_METADATA, 9, 1, NULL);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	free(r);
	assert_int_equal(km_proxy_metrics(f->px)->brokers_known, 2);
	n1 = tc_connect(f, (uint16_t)(f->base_port + 1));
	tc_request(n1, KM_API_METADATA, 9, 2, NULL);
	r = tc_response(f, n1, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 2);
	free(r);
	tc_free(n1);
	tc_free(c);
}

static void test_idle_and_request_timeouts(void **state)
{
	fixture *f = *state;
	tclient *idle = tc_connect(f, f->listen_port);
	tclient *waiting;
	size_t len;

	/* idle: nothing in flight for idle_timeout_ms (600) */
	run_for(f->base, 100);
	assert_false(idle->closed);
	wait_closed(f, idle);
	assert_int_equal(km_proxy_metrics(f->px)->rejected[KM_REJECT_IDLE_TIMEOUT], 1);
	tc_free(idle);
	/* a request the upstream never answers: closed after upstream_request_timeout_ms (400) */
	f->up.silent = true;
	waiting = tc_connect(f, f->listen_port);
	tc_request(waiting, KM_API_METADATA, 9, 1, NULL);
	assert_null(tc_response(f, waiting, &len));
	assert_true(waiting->closed);
	assert_int_equal(km_proxy_metrics(f->px)->rejected[KM_REJECT_REQUEST_TIMEOUT], 1);
	tc_free(waiting);
}

static void test_cut_through(void **state)
{
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	struct evbuffer *in = bufferevent_get_input(c->bev);
	km_wr body, frame;
	uint8_t *r;
	size_t len, before;
	int32_t size;

	/* A 20000-byte Produce request: the broker sees its first part before the client sends the rest. */
	km_wr_init(&body);
	km_wr_string(&body, true, KM_STR_NULL);
	km_wr_i16(&body, 1);
	km_wr_i32(&body, 1000);
	for (int i = 0; i < 20000; i++)
		km_wr_i8(&body, 0x11);
	km_wr_init(&frame);
	before = f->up.bytes_received; /* the proxy's own metadata refresh came first */
	tc_request(c, KM_API_PRODUCE, 9, 1, &body);
	/* hold back the end of the frame: take it out of the output buffer before it is sent */
	{
		struct evbuffer *out = bufferevent_get_output(c->bev);
		size_t total = evbuffer_get_length(out);
		km_wr_raw(&frame, evbuffer_pullup(out, -1), total);
		evbuffer_drain(out, total);
		evbuffer_add(out, frame.buf, 8000);
	}
	for (int i = 0; i < 50 && f->up.bytes_received < before + 8000; i++)
		run_for(f->base, 10);
	assert_int_equal(f->up.bytes_received, before + 8000);
	assert_int_equal(f->up.requests[KM_API_PRODUCE], 0); /* not complete at the broker yet */
	evbuffer_add(bufferevent_get_output(c->bev), frame.buf + 8000, frame.len - 8000);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 1);
	free(r);
	assert_int_equal(f->up.requests[KM_API_PRODUCE], 1);

	/* A response that is never rewritten reaches the client while its end is still on the way. */
	tc_request(c, 2, 5, 2, NULL);
	for (int i = 0; i < 50 && evbuffer_get_length(in) < 3009; i++)
		run_for(f->base, 10);
	before = evbuffer_get_length(in);
	assert_int_equal(before, 9 + 3000);
	assert_int_equal(km_net_frame_peek(in, 1 << 24, 4, false, &size), KM_FRAME_NEED_MORE);
	assert_int_equal(size, 10005);
	assert_non_null(f->up.held_bev);
	evbuffer_add(bufferevent_get_output(f->up.held_bev), f->up.held_rest.buf, f->up.held_rest.len);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(len, 10005);
	assert_int_equal(km_be32(r), 2);
	assert_int_equal(r[5 + 9999], 9999 & 0x7f);
	free(r);
	/* and the connection goes on normally */
	tc_request(c, KM_API_METADATA, 9, 3, NULL);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 3);
	free(r);
	km_wr_free(&f->up.held_rest);
	km_wr_free(&body);
	km_wr_free(&frame);
	tc_free(c);
}

static void test_tls_listener(void **state)
{
	fixture *f = *state;
	SSL_CTX *ctx;
	tclient *c = tc_connect_tls(f, f->listen_port, &ctx);
	tclient *plain;
	uint8_t *r;
	size_t len;
	char cmd[128];

	tc_request(c, KM_API_METADATA, 9, 5, NULL);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 5);
	assert_non_null(memmem(r, len, "proxy.test", 10));
	free(r);
	tc_free(c);
	SSL_CTX_free(ctx); /* each SSL keeps its own reference */
	/* the broker port speaks TLS too */
	c = tc_connect_tls(f, f->base_port, &ctx);
	tc_request(c, KM_API_METADATA, 9, 6, NULL);
	r = tc_response(f, c, &len);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 6);
	free(r);
	tc_free(c);
	SSL_CTX_free(ctx);
	/* a plaintext client on a TLS port is closed */
	plain = tc_connect(f, f->listen_port);
	tc_request(plain, KM_API_METADATA, 9, 7, NULL);
	assert_null(tc_response(f, plain, &len));
	assert_true(plain->closed);
	tc_free(plain);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tls_dir);
	assert_int_equal(system(cmd), 0);
}

static int drained_calls;
static void on_drained(void *arg)
{
	drained_calls++;
}

/* ---- a client id in the log ---- */

/* Topic "ro" is read-only on every partition. */
static bool ro_active(void *arg)
{
	(void)arg;
	return true;
}

static void ro_check(void *arg, km_str name, const km_uuid *id, int32_t partition, km_ro_op op, km_ro_verdict *v)
{
	(void)arg;
	(void)id;
	(void)partition;
	(void)op;
	v->code = KM_OK;
	if (name.len >= 0 && km_str_eq_c(name, "ro")) {
		v->code = KM_MIRROR_READ_ONLY_TOPIC;
		snprintf(v->message, sizeof(v->message), "topic ro is read-only");
	}
}

/*
 * A client id is the client's to choose, newlines and quotes included: the refusal's log line
 * shows it escaped, on one line, and nothing the client wrote starts a line of its own.
 */
static void test_client_id_escaped_in_log(void **state)
{
	static const char cid[] = "evil\n2024-01-01T00:00:00.000Z level=error comp=proxy msg=\"forged\" \x1b[2J";
	fixture *f = *state;
	tclient *c = tc_connect(f, f->listen_port);
	char path[] = "/tmp/km-log-XXXXXX", line[4096];
	int fd = mkstemp(path), saved;
	int refusals = 0, lines = 0;
	km_wr w, body;
	uint8_t recs[70] = {0};
	uint8_t *r;
	size_t len, start;
	FILE *log;

	assert_true(fd >= 0);
	f->px->features.read_only = (km_ro_lookup){ro_active, ro_check, NULL};
	/* Produce v9 to "ro" partition 0, from a client with that id (the raw frame: tc_request says "test"). */
	km_wr_init(&body);
	km_wr_string(&body, true, KM_STR_NULL); /* transactional id */
	km_wr_i16(&body, -1);
	km_wr_i32(&body, 1000);
	km_wr_array_len(&body, true, 1);
	km_wr_string(&body, true, km_str_c("ro"));
	km_wr_array_len(&body, true, 1);
	km_wr_i32(&body, 0);
	km_wr_bytes(&body, true, (km_bytes){recs, (int32_t)sizeof(recs)});
	km_wr_uvarint(&body, 0);
	km_wr_uvarint(&body, 0);
	km_wr_uvarint(&body, 0);
	km_wr_init(&w);
	start = km_wr_reserve(&w, 4);
	km_wr_i16(&w, KM_API_PRODUCE);
	km_wr_i16(&w, 9);
	km_wr_i32(&w, 31);
	km_wr_string(&w, false, km_str_c(cid));
	km_wr_uvarint(&w, 0);
	km_wr_raw(&w, body.buf, body.len);
	km_wr_patch_i32(&w, start, (int32_t)(w.len - 4));

	fflush(stderr);
	saved = dup(2);
	assert_true(dup2(fd, 2) >= 0);
	km_log_set_level(KM_LOG_INFO);
	evbuffer_add(bufferevent_get_output(c->bev), w.buf, w.len);
	r = tc_response(f, c, &len);
	km_log_set_level(getenv("KM_TEST_LOG") ? KM_LOG_DEBUG : KM_LOG_ERROR);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	assert_non_null(r);
	assert_int_equal(km_be32(r), 31); /* answered here: every partition refused */
	assert_int_equal(f->up.requests[KM_API_PRODUCE], 0);

	assert_non_null(log = fdopen(fd, "r"));
	rewind(log);
	while (fgets(line, sizeof(line), log)) {
		lines++;
		/* Every line is one of kmirrord's: it starts with the timestamp and its level field follows. */
		assert_true(line[0] >= '0' && line[0] <= '9');
		assert_non_null(strstr(line, "Z level="));
		/* What the client wrote stays inside the refusal's line (unescaped, it started a forged line). */
		if (strstr(line, "forged"))
			assert_non_null(strstr(line, "refused Produce v9"));
		assert_null(strchr(line, '\x1b'));
		if (strstr(line, "refused Produce v9")) {
			refusals++;
			assert_non_null(strstr(line, "client id \"evil\\n2024-01-01T00:00:00.000Z level=error comp=proxy "
						     "msg=\\\"forged\\\" \\x1b[2J\""));
			assert_non_null(strstr(line, "on topic ro partition 0: READ_ONLY_TOPIC"));
		}
	}
	assert_int_equal(refusals, 1);
	assert_true(lines >= 1);
	fclose(log);
	unlink(path);
	f->px->features.read_only = (km_ro_lookup){NULL, NULL, NULL};
	free(r);
	km_wr_free(&w);
	km_wr_free(&body);
	tc_free(c);
}

static void test_drain_gradual(void **state)
{
	fixture *f = *state;
	tclient *c[4];
	size_t len;
	for (int i = 0; i < 4; i++) {
		uint8_t *r;
		c[i] = tc_connect(f, f->listen_port);
		tc_request(c[i], KM_API_METADATA, 9, i, NULL);
		r = tc_response(f, c[i], &len);
		assert_non_null(r);
		free(r);
	}
	assert_int_equal(km_proxy_session_count(f->px), 4);
	drained_calls = 0;
	/* 2000 ms in rounds of 50 ms: 40 rounds, so one connection per round. */
	km_proxy_drain(f->px, on_drained, NULL);
	run_for(f->base, 5);
	assert_int_equal(km_proxy_session_count(f->px), 3);
	for (int i = 0; i < 100 && !drained_calls; i++)
		run_for(f->base, 10);
	assert_int_equal(drained_calls, 1);
	assert_int_equal(km_proxy_session_count(f->px), 0);
	for (int i = 0; i < 4; i++) {
		wait_closed(f, c[i]);
		tc_free(c[i]);
	}
	/* no new connections are accepted */
	{
		tclient *late = tc_connect(f, f->listen_port);
		wait_closed(f, late);
		tc_free(late);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_pipelining_and_acks0, setup, teardown),
		cmocka_unit_test_setup_teardown(test_broker_port, setup, teardown),
		cmocka_unit_test_setup_teardown(test_table_rows_extend_the_proxy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tls_hello_rejected, setup, teardown),
		cmocka_unit_test_setup_teardown(test_frame_too_large, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stalled_frame_times_out, setup, teardown),
		cmocka_unit_test_setup_teardown(test_api_versions_too_new, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wrong_correlation_disconnects, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fetch_node_endpoints, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fetch_oor_hold, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fetch_spliced, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drain_gradual, setup, teardown),
		cmocka_unit_test_setup_teardown(test_client_id_escaped_in_log, setup, teardown),
		cmocka_unit_test_setup_teardown(test_new_broker_gets_port, setup, teardown),
		cmocka_unit_test_setup_teardown(test_idle_and_request_timeouts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cut_through, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tls_listener, setup_tls, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
