/* The HTTP endpoints: /metrics, /healthz and /readyz on http_listen, the admin routes there or on admin_listen, and their limits. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/ssl.h>

/* A client picks how many connections the table holds: running out of memory must not abort the daemon. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#include "kmirror/log.h"
#include "kmirror/mirror.h"
#include "kmirror/state.h"
#include "proxy/proxy_int.h"

/* What a listener serves. */
enum { ROUTES_PUBLIC = 1, ROUTES_ADMIN = 2 };

/* The largest request body: the admin POST's upstream list. */
#define HTTP_MAX_BODY 4096

typedef struct http_conn http_conn;

/* One HTTP listener and the connections it has open. */
struct km_http {
	km_proxy *px;
	struct evhttp *http;
	const char *option;  /* "http_listen" or "admin_listen", for the logs */
	unsigned routes;
	bool tls;            /* its connections speak TLS (px->admin_tls) */
	http_conn *conns;    /* by the bufferevent evhttp reads through */
	size_t nconns;
	km_log_gate refused_log;
};

/*
 * One connection, from the bufferevent evhttp asks for to the connection's end. libevent 2.1's
 * evhttp says nothing when a connection opens, and hands out the connection object only with a
 * whole request, so: the bufferevent it asks for (bevcb) is made here, with a reference of ours
 * that keeps it (and its socket) alive; one loop round later the connection is adopted: evhttp has
 * set the bufferevent's callbacks by then, with the connection as their argument (it does so in
 * every release since 2.0), and its close callback is ours from then on. Callbacks gone instead:
 * evhttp has already dropped it.
 *
 * The deadline bounds how long a request may take to arrive whole, and its answer to be read:
 * evhttp's own timeout only bounds the silence between two reads, which a client sending one byte
 * at a time never reaches.
 */
struct http_conn {
	km_http *h;
	struct bufferevent *bev;
	struct evhttp_connection *evcon; /* NULL until adopted (and a reference on bev held) */
	struct event timer;    /* adoption, then the deadline */
	bool refused;          /* past http_max_connections: shut down when adopted */
	bool closing;          /* shut down; evhttp frees it as it sees the close */
	UT_hash_handle hh;
};

static uint64_t http_now_ms(km_http *h)
{
	return km_proxy_now_ms(h->px);
}

static void conn_arm(http_conn *c, int64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
	evtimer_add(&c->timer, &tv);
}

/* The connection is gone: no longer counted. */
static void conn_end(http_conn *c)
{
	km_http *h = c->h;

	event_del(&c->timer);
	HASH_DEL(h->conns, c);
	h->nconns--;
	h->px->metrics.http_connections--;
	if (!c->evcon)
		bufferevent_decref(c->bev);
	free(c);
}

/* evhttp's close callback: the connection is being freed. */
static void conn_closed(struct evhttp_connection *evcon, void *arg)
{
	(void)evcon;
	conn_end(arg);
}

/*
 * Shut the socket down (over the cap, or past the deadline): evhttp then reads the end of the
 * stream, or fails its write, and frees the connection as it would for a client that left; no
 * state of evhttp's is touched from outside.
 */
static void conn_shut(http_conn *c, km_http_reject_reason why)
{
	km_http *h = c->h;
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	uint64_t held;

	c->closing = true;
	if (fd >= 0)
		shutdown(fd, SHUT_RDWR);
	h->px->metrics.http_rejected[why]++;
	if (!km_log_gate_pass(&h->refused_log, http_now_ms(h), &held))
		return;
	KM_WARN("http", 0, "%s: closed a connection: %s; %llu more in the %d s before", h->option,
		why == KM_HTTP_REJECT_MAX_CONNECTIONS ? "http_max_connections reached" :
							"no whole request within http_request_timeout_ms",
		(unsigned long long)held, KM_LOG_GATE_MS / 1000);
}

static void conn_timer(evutil_socket_t unused, short what, void *arg)
{
	http_conn *c = arg;
	bufferevent_data_cb rd = NULL, wr = NULL;
	bufferevent_event_cb ev = NULL;
	void *evcon = NULL;

	(void)unused;
	(void)what;
	if (c->evcon) {
		conn_shut(c, KM_HTTP_REJECT_REQUEST_TIMEOUT);
		return;
	}
	bufferevent_getcb(c->bev, &rd, &wr, &ev, &evcon);
	if (!rd && !ev) { /* evhttp dropped it before this round (the client left, or no memory) */
		conn_end(c);
		return;
	}
	c->evcon = evcon;
	evhttp_connection_set_closecb(c->evcon, conn_closed, c);
	bufferevent_decref(c->bev); /* evhttp's alone now; its close callback ends the record */
	if (c->refused)
		conn_shut(c, KM_HTTP_REJECT_MAX_CONNECTIONS);
	else
		conn_arm(c, c->h->px->cfg.http_request_timeout_ms);
}

/* evhttp's bevcb: the bufferevent of a new connection, counted; adopted at the next loop round. */
static struct bufferevent *conn_new(struct event_base *base, void *arg)
{
	km_http *h = arg;
	km_proxy *px = h->px;
	http_conn *c = calloc(1, sizeof(*c));
	SSL *ssl;

	if (!c)
		return NULL;
	if (h->tls) {
		if (!px->admin_tls || !(ssl = SSL_new(px->admin_tls)))
			goto fail;
		c->bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
							BEV_OPT_CLOSE_ON_FREE);
		if (!c->bev) {
			SSL_free(ssl);
			goto fail;
		}
		bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
	} else if (!(c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE))) {
		goto fail;
	}
	c->h = h;
	HASH_ADD_PTR(h->conns, bev, c);
	if (!c->hh.tbl) { /* untracked: answered 503 (conn_of finds nothing) */
		struct bufferevent *bev = c->bev;
		free(c);
		return bev;
	}
	bufferevent_incref(c->bev);
	evtimer_assign(&c->timer, base, conn_timer, c);
	h->nconns++;
	px->metrics.http_connections++;
	c->refused = px->cfg.http_max_connections && h->nconns > (size_t)px->cfg.http_max_connections;
	conn_arm(c, 0);
	return c->bev;
fail:
	free(c);
	/* evhttp makes a plain bufferevent of its own: on the TLS listener its requests are refused (http_cb). */
	return NULL;
}

/* The connection record of req, or NULL (one evhttp made itself, or one that could not be counted). */
static http_conn *conn_of(km_http *h, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
	http_conn *c = NULL;

	if (bev)
		HASH_FIND_PTR(h->conns, &bev, c);
	return c;
}

/* "ADDR:PORT" of the peer of req, for the logs. */
static void peer_of(struct evhttp_request *req, char *buf, size_t len)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	char *addr = NULL;
	ev_uint16_t port = 0;

	if (evcon)
		evhttp_connection_get_peer(evcon, &addr, &port);
	snprintf(buf, len, "%s:%u", addr ? addr : "?", port);
}

/* ---- replies ---- */

/* Cut trailing newlines and spaces off s (n bytes) and end it there; the new length. */
static size_t rtrim(char *s, size_t n)
{
	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
		n--;
	s[n] = '\0';
	return n;
}

static void reply_text(struct evhttp_request *req, struct evbuffer *out, int code, const char *reason, const char *msg)
{
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain");
	evbuffer_add_printf(out, "%s\n", msg);
	evhttp_send_reply(req, code, reason, out);
}

/* ---- the admin token ---- */

/*
 * Read admin_token_file's token into token (size len): its length, or 0 with why (for the log
 * only: it names the file, and errno). A file that group or others may read or write is refused:
 * whoever can read the token can swap the upstream.
 */
static size_t read_token(const char *path, char *token, size_t len, char *why, size_t wlen)
{
	struct stat st;
	ssize_t n;
	/* O_NONBLOCK: a FIFO put there must not stall the loop; it is refused below. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0) {
		snprintf(why, wlen, "cannot read admin_token_file %s: %s", path, strerror(errno));
		return 0;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(why, wlen, "admin_token_file %s is not a regular file", path);
		close(fd);
		return 0;
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		snprintf(why, wlen, "admin_token_file %s has mode %04o: group or others may read or change the "
			 "token; chmod 600 %s", path, (unsigned)(st.st_mode & 07777), path);
		close(fd);
		return 0;
	}
	n = read(fd, token, len - 1);
	close(fd);
	if (n < 0) {
		snprintf(why, wlen, "cannot read admin_token_file %s: %s", path, strerror(errno));
		return 0;
	}
	if (!rtrim(token, (size_t)n)) {
		snprintf(why, wlen, "admin_token_file %s is empty: put a token in it", path);
		return 0;
	}
	return strlen(token);
}

/*
 * Whether req carries "Authorization: Bearer TOKEN" with admin_token_file's token (read now): 0,
 * or the HTTP status to answer with and in *say the text the caller may see. Whatever is wrong on
 * kmirrord's side (the file's path, errno, its mode) goes to the log only: a caller without the
 * token learns nothing about the host.
 */
static int admin_check(km_http *h, struct evhttp_request *req, const char **say)
{
	const char *file = h->px->cfg.admin_token_file;
	const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	char token[512], why[1024], peer[300];
	size_t n, given;
	unsigned char diff = 0;

	peer_of(req, peer, sizeof(peer));
	if (!file || !(n = read_token(file, token, sizeof(token), why, sizeof(why)))) {
		if (!file)
			snprintf(why, sizeof(why), "the admin endpoint is disabled: set admin_token_file (a file "
				 "holding a bearer token)");
		KM_WARN("http", 0, "admin request from %s refused: %s", peer, why);
		*say = "admin endpoint disabled";
		return 403;
	}
	if (!auth || strncmp(auth, "Bearer ", 7) != 0) {
		KM_INFO("http", 0, "admin request from %s refused: no bearer token", peer);
		*say = "unauthorized: send the token as 'Authorization: Bearer TOKEN'";
		return 401;
	}
	auth += 7;
	given = strlen(auth);
	for (size_t i = 0; i < n; i++) /* no early exit: the time does not say how much matched */
		diff |= (unsigned char)(token[i] ^ (i < given ? auth[i] : 0));
	if (diff || given != n) {
		KM_WARN("http", 0, "admin request from %s refused: wrong bearer token", peer);
		*say = "wrong bearer token";
		return 401;
	}
	return 0;
}

bool km_proxy_admin_body(struct evbuffer *body, char *text, size_t cap, char *why, size_t whylen)
{
	size_t n = evbuffer_get_length(body);

	if (n == 0 || n >= cap || evbuffer_copyout(body, text, n) != (ev_ssize_t)n) {
		snprintf(why, whylen, "the body is the new upstream: HOST:PORT[,HOST:PORT...]");
		return false;
	}
	/* A NUL would end the text early: the rest of the list would be dropped unseen. */
	if (memchr(text, 0, n)) {
		snprintf(why, whylen, "the body holds a NUL byte: send the new upstream as text, HOST:PORT[,HOST:PORT...]");
		return false;
	}
	evbuffer_drain(body, n);
	rtrim(text, n);
	return true;
}

/* GET: the swap's status (JSON); POST with body HOST:PORT[,HOST:PORT...]: start a swap (202, then poll GET). */
static void admin_upstream(km_http *h, struct evhttp_request *req, struct evbuffer *out)
{
	km_proxy *px = h->px;
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	struct evbuffer *body = evhttp_request_get_input_buffer(req);
	char why[1024], text[HTTP_MAX_BODY + 1];
	const char *say;
	int code;

	if ((code = admin_check(h, req, &say)) != 0) {
		px->metrics.http_rejected[KM_HTTP_REJECT_UNAUTHORIZED]++;
		reply_text(req, out, code, code == 403 ? "Forbidden" : "Unauthorized", say);
		return;
	}
	if (cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
		km_proxy_swap_status(px, out);
		evhttp_send_reply(req, 200, "OK", out);
		return;
	}
	if (cmd != EVHTTP_REQ_POST) {
		reply_text(req, out, 405, "Method Not Allowed", "GET or POST");
		return;
	}
	if (!km_proxy_admin_body(body, text, sizeof(text), why, sizeof(why))) {
		reply_text(req, out, 400, "Bad Request", why);
		return;
	}
	if (km_proxy_swap(px, text, NULL, NULL, why, sizeof(why)) != KM_OK) {
		reply_text(req, out, px->swap ? 409 : 400, px->swap ? "Conflict" : "Bad Request", why);
		return;
	}
	evbuffer_add_printf(out, "upstream swap to %s started: GET /admin/upstream shows its progress\n", text);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain");
	evhttp_send_reply(req, 202, "Accepted", out);
}

/* ---- the public routes ---- */

/* The upstream answered a metadata request within three refresh periods. */
static bool upstream_fresh(km_proxy *px)
{
	uint64_t now = km_proxy_now_ms(px);
	return px->meta_last_ok_ms && now - px->meta_last_ok_ms <= 3 * (uint64_t)px->cfg.metadata_refresh_ms;
}

/*
 * Why kmirrord itself does not work, or NULL: the mirror state stopped for good or has not loaded
 * yet (requests that read it wait), or the upstream does not answer. A mirror's source that is away
 * is not one: restarting kmirrord would not bring it back.
 */
static const char *unhealthy(km_proxy *px)
{
	const char *fatal = px->host.state ? km_state_fatal_message(px->host.state) : NULL;

	if (fatal)
		return fatal;
	if (!upstream_fresh(px))
		return "upstream unreachable";
	if (px->host.state && !km_state_ready(px->host.state))
		return "mirror state not loaded yet (requests on topics wait for it)";
	return NULL;
}

/* Why kmirrord should get no traffic now, or NULL: unhealthy, or draining. */
static const char *not_ready(km_proxy *px)
{
	/* A store stopped for good says why the daemon is draining and will exit: it comes first. */
	if (px->draining && !(px->host.state && km_state_fatal_message(px->host.state)))
		return "draining";
	return unhealthy(px);
}

/* ---- /healthz ---- */

/* ms since the epoch as 2006-01-02T15:04:05Z. */
static void iso_time(int64_t ms, char *buf, size_t len)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	if (!gmtime_r(&t, &tm) || !strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(buf, len, "?");
}

/* Why the last upstream connection failed; "" when none did. */
static const char *upstream_error(km_proxy *px)
{
	return px->upstream ? km_cluster_last_error(px->upstream) : "";
}

/* Whether the caller asked for JSON: ?format=json, or Accept: application/json. */
static bool wants_json(struct evhttp_request *req, const char *uri)
{
	const char *q = strchr(uri, '?');
	const char *accept = evhttp_find_header(evhttp_request_get_input_headers(req), "Accept");
	return (q && strstr(q, "format=json")) || (accept && strstr(accept, "application/json"));
}

static void health_text(km_proxy *px, const char *why, const km_state_health *st, struct evbuffer *out)
{
	uint64_t now = km_proxy_now_ms(px);
	km_mirror_source src;
	size_t cursor = 0;
	char at[32];

	evbuffer_add_printf(out, "%s\n", why ? why : "ok");
	if (px->host.state) {
		evbuffer_add_printf(out, "state: %s, %llu writes, %llu write failures, %llu followed changes",
				    st->fatal ? "stopped" : st->loaded ? "loaded" : "loading",
				    (unsigned long long)st->writes, (unsigned long long)st->write_failures,
				    (unsigned long long)st->follows);
		if (st->follow_delay_ms >= 0)
			evbuffer_add_printf(out, " (the last applied %lld ms after it was written)",
					    (long long)st->follow_delay_ms);
		evbuffer_add_printf(out, "\n");
	}
	evbuffer_add_printf(out, "upstream: %s, %llu brokers known", upstream_fresh(px) ? "reachable" : "unreachable",
			    (unsigned long long)px->metrics.brokers_known);
	if (px->meta_last_ok_ms)
		evbuffer_add_printf(out, ", metadata answered %llu ms ago",
				    (unsigned long long)(now - px->meta_last_ok_ms));
	if (!upstream_fresh(px) && *upstream_error(px))
		evbuffer_add_printf(out, ": %s", upstream_error(px));
	evbuffer_add_printf(out, "\n");
	while (px->host.mirror && km_mirror_source_next(px->host.mirror, &cursor, &src)) {
		iso_time(src.since_ms, at, sizeof(at));
		evbuffer_add_printf(out, "mirror %s: source %s since %s", src.mirror,
				    src.reachable ? "reachable" : "UNREACHABLE", at);
		if (src.fetched_ms)
			evbuffer_add_printf(out, ", last fetch %lld ms ago", (long long)((int64_t)now - src.fetched_ms));
		if (!src.reachable)
			evbuffer_add_printf(out, ": %s", src.error);
		evbuffer_add_printf(out, "\n");
	}
}

static void health_json(km_proxy *px, const char *why, const km_state_health *st, struct evbuffer *out)
{
	km_mirror_source src;
	size_t cursor = 0;
	const char *sep = "";

	evbuffer_add_printf(out, "{\"status\": ");
	km_proxy_json_str(out, why ? why : "ok");
	if (px->host.state) {
		evbuffer_add_printf(out, ", \"state\": {\"loaded\": %s, \"stopped\": ", st->loaded ? "true" : "false");
		if (st->fatal)
			km_proxy_json_str(out, st->fatal);
		else
			evbuffer_add_printf(out, "null");
		evbuffer_add_printf(out, ", \"writes\": %llu, \"write_failures\": %llu, \"follows\": %llu, "
				    "\"follow_delay_ms\": %lld}", (unsigned long long)st->writes,
				    (unsigned long long)st->write_failures, (unsigned long long)st->follows,
				    (long long)st->follow_delay_ms);
	}
	evbuffer_add_printf(out, ", \"upstream\": {\"reachable\": %s, \"brokers\": %llu, \"last_metadata_ms\": %llu, "
			    "\"last_error\": ", upstream_fresh(px) ? "true" : "false",
			    (unsigned long long)px->metrics.brokers_known, (unsigned long long)px->meta_last_ok_ms);
	km_proxy_json_str(out, upstream_error(px));
	evbuffer_add_printf(out, "}, \"mirrors\": [");
	while (px->host.mirror && km_mirror_source_next(px->host.mirror, &cursor, &src)) {
		evbuffer_add_printf(out, "%s{\"mirror\": ", sep);
		sep = ", ";
		km_proxy_json_str(out, src.mirror);
		evbuffer_add_printf(out, ", \"source_reachable\": %s, \"since_ms\": %lld, \"last_fetch_ms\": %lld, "
				    "\"error\": ", src.reachable ? "true" : "false", (long long)src.since_ms,
				    (long long)src.fetched_ms);
		km_proxy_json_str(out, src.error);
		evbuffer_add_printf(out, "}");
	}
	evbuffer_add_printf(out, "]}\n");
}

/*
 * /healthz: whether kmirrord itself works (200) or not (503), and what it sees: the mirror state,
 * the upstream and the source of each mirror whose pipeline runs here (docs/operations.md, "Health").
 */
static void health_page(km_proxy *px, struct evhttp_request *req, const char *uri, struct evbuffer *out)
{
	const char *why = unhealthy(px);
	bool json = wants_json(req, uri);
	km_state_health st = {0};

	if (px->host.state)
		km_state_health_get(px->host.state, &st);
	if (json)
		health_json(px, why, &st, out);
	else
		health_text(px, why, &st, out);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  json ? "application/json" : "text/plain");
	evhttp_send_reply(req, why ? 503 : 200, why ? "Service Unavailable" : "OK", out);
}

static void metrics_page(km_proxy *px, struct evhttp_request *req, struct evbuffer *out)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	km_err rc = f ? km_metrics_render(px->registry, f) : KM_ERR_NOMEM;

	if (f && fclose(f) != 0)
		rc = KM_ERR_NOMEM;
	if (rc != KM_OK || evbuffer_add(out, text, len) != 0) {
		evhttp_send_error(req, 500, NULL);
	} else {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
				  "text/plain; version=0.0.4; charset=utf-8");
		evhttp_send_reply(req, 200, "OK", out);
	}
	free(text);
}

/* Whether uri is path, alone or with a query. */
static bool is_path(const char *uri, const char *path)
{
	size_t n = strlen(path);
	return strncmp(uri, path, n) == 0 && (uri[n] == '\0' || uri[n] == '?');
}

static size_t header_count(struct evhttp_request *req)
{
	const struct evkeyval *kv;
	size_t n = 0;
	for (kv = evhttp_request_get_input_headers(req)->tqh_first; kv; kv = kv->next.tqe_next)
		n++;
	return n;
}

/* Every request that arrived whole: the limits evhttp has no setting for, then the route. */
static void http_cb(struct evhttp_request *req, void *arg)
{
	km_http *h = arg;
	km_proxy *px = h->px;
	const char *uri = evhttp_request_get_uri(req);
	http_conn *c = conn_of(h, req);
	struct evbuffer *out;

	/* The request is in: its answer must be read, and the next request arrive, within a new deadline. */
	if (c && c->evcon && !c->closing)
		conn_arm(c, px->cfg.http_request_timeout_ms);
	if (!c || c->refused || c->closing) {
		evhttp_send_error(req, 503, "Service Unavailable");
		return;
	}
	if (header_count(req) > (size_t)px->cfg.http_max_headers) {
		px->metrics.http_rejected[KM_HTTP_REJECT_TOO_MANY_HEADERS]++;
		evhttp_send_error(req, 431, "Request Header Fields Too Large");
		return;
	}
	if (!(out = evbuffer_new())) {
		evhttp_send_error(req, 500, NULL);
		return;
	}
	if ((h->routes & ROUTES_PUBLIC) && is_path(uri, "/metrics")) {
		metrics_page(px, req, out);
	} else if ((h->routes & ROUTES_PUBLIC) && is_path(uri, "/healthz")) {
		health_page(px, req, uri, out);
	} else if ((h->routes & ROUTES_PUBLIC) && is_path(uri, "/readyz")) {
		const char *why = not_ready(px);
		reply_text(req, out, why ? 503 : 200, why ? "Service Unavailable" : "OK", why ? why : "ok");
	} else if ((h->routes & ROUTES_ADMIN) && is_path(uri, "/admin/upstream")) {
		admin_upstream(h, req, out);
	} else {
		evhttp_send_error(req, 404, "Not Found");
	}
	evbuffer_free(out);
}

/* ---- listeners ---- */

/* What evhttp itself enforces, from the config (for connections made from now on). */
static void apply_limits(km_http *h, const km_config *cfg)
{
	/* The silence between two reads or writes, a backstop: the deadline above comes first. */
	int64_t ms = 2 * cfg->http_request_timeout_ms;
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};

	evhttp_set_max_headers_size(h->http, (ev_ssize_t)cfg->http_max_header_bytes);
	evhttp_set_max_body_size(h->http, HTTP_MAX_BODY);
	evhttp_set_timeout_tv(h->http, &tv);
}

static km_http *listener_new(km_proxy *px, const km_hostport *addr, const char *option, unsigned routes, bool tls,
			     char *err, size_t errlen)
{
	km_http *h = calloc(1, sizeof(*h));

	if (!h || !(h->http = evhttp_new(px->base))) {
		free(h);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	h->px = px;
	h->option = option;
	h->routes = routes;
	h->tls = tls;
	if (evhttp_bind_socket(h->http, addr->host, addr->port) != 0) {
		snprintf(err, errlen, "cannot listen for HTTP (%s) on %s:%u", option, addr->host, addr->port);
		evhttp_free(h->http);
		free(h);
		return NULL;
	}
	evhttp_set_bevcb(h->http, conn_new, h);
	evhttp_set_gencb(h->http, http_cb, h);
	evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST);
	apply_limits(h, &px->cfg);
	KM_INFO("http", 0, "%s %s:%u serves %s%s", option, addr->host, addr->port,
		routes == ROUTES_ADMIN ? "the admin routes only" :
		routes == ROUTES_PUBLIC ? "/metrics, /healthz and /readyz (the admin routes are on admin_listen)" :
		"/metrics, /healthz, /readyz and the admin routes",
		tls ? " over TLS" : "");
	return h;
}

static void listener_free(km_http *h)
{
	http_conn *c, *tmp;

	if (!h)
		return;
	/* Adopted connections end through their close callback; the others keep a reference to drop. */
	evhttp_free(h->http);
	HASH_ITER(hh, h->conns, c, tmp)
		conn_end(c);
	free(h);
}

km_err km_proxy_http_start(km_proxy *px, char *err, size_t errlen)
{
	const km_config *cfg = &px->cfg;
	bool apart = cfg->admin_listen.port != 0;

	if (cfg->http_listen.port &&
	    !(px->http = listener_new(px, &cfg->http_listen, "http_listen",
				      apart ? ROUTES_PUBLIC : ROUTES_PUBLIC | ROUTES_ADMIN, false, err, errlen)))
		return KM_ERR_IO;
	if (apart && !(px->admin_http = listener_new(px, &cfg->admin_listen, "admin_listen", ROUTES_ADMIN,
						     px->admin_tls != NULL, err, errlen)))
		return KM_ERR_IO;
	return KM_OK;
}

void km_proxy_http_reload(km_proxy *px)
{
	if (px->http)
		apply_limits(px->http, &px->cfg);
	if (px->admin_http)
		apply_limits(px->admin_http, &px->cfg);
}

void km_proxy_http_free(km_proxy *px)
{
	listener_free(px->http);
	listener_free(px->admin_http);
	px->http = px->admin_http = NULL;
}
