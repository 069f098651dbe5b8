/* The proxy: bootstrap and per-broker listeners, the upstream broker table, metadata refresh, drain and reload (HTTP: http.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/listener.h>

#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "proxy/mirror_rpc.h"
#include "proxy/proxy_int.h"

uint64_t km_proxy_now_ms(const km_proxy *px)
{
	struct timeval tv;
	event_base_gettimeofday_cached(px->base, &tv);
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* A tail moved in the store: the Fetch requests waiting at it go now. */
static void tail_moved(void *arg, const km_offmap *map)
{
	km_proxy *px = arg;
	km_session_set_tail_moved(px->sessions, map);
}

void km_proxy_set_state(km_proxy *px, km_state *st)
{
	px->host.state = st;
	if (st)
		km_state_on_tail(st, tail_moved, px);
	km_ro_lookup_from_state(st, &px->features.read_only);
	px->features.read_only.read_only_code = km_ro_code_of(px->cfg.read_only_error);
	km_off_lookup_from_state(st, &px->features.offsets);
	px->features.offsets.trace_topics = px->cfg.log_fetch_topics;
}

void km_proxy_state_ready(km_proxy *px, const km_state *st)
{
	km_session_set_state_ready(px->sessions, st);
}

void km_proxy_set_mirror(km_proxy *px, km_mirror *mi)
{
	px->host.mirror = mi;
}

km_proxy_counters *km_proxy_metrics(km_proxy *px)
{
	return &px->metrics;
}

size_t km_proxy_session_count(const km_proxy *px)
{
	return km_session_set_count(px->sessions);
}

/* ---- listeners ---- */

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	km_broker *b = arg;
	km_session_set_accept(b->px->sessions, fd, sa, b->node_id);
}

static void accept_resume(evutil_socket_t fd, short what, void *arg)
{
	km_broker *b = arg;
	if (b->listener)
		evconnlistener_enable(b->listener);
}

static void broker_close_listener(km_broker *b)
{
	if (b->resume_ev) {
		event_free(b->resume_ev);
		b->resume_ev = NULL;
	}
	if (b->listener) {
		evconnlistener_free(b->listener);
		b->listener = NULL;
	}
}

static void accept_error_cb(struct evconnlistener *l, void *arg)
{
	km_broker *b = arg;
	int err = EVUTIL_SOCKET_ERROR();
	struct timeval tv = {1, 0};

	KM_ERROR("proxy", 0, "accept on the %s listener failed: %s; pausing accepts for 1 s",
		 b->node_id < 0 ? "bootstrap" : "broker", evutil_socket_error_to_string(err));
	/* Out of descriptors: the socket stays readable, so accepting again at once would spin. */
	evconnlistener_disable(l);
	if (!b->resume_ev)
		b->resume_ev = evtimer_new(b->px->base, accept_resume, b);
	if (!b->resume_ev || evtimer_add(b->resume_ev, &tv) != 0)
		evconnlistener_enable(l);
}

static struct evconnlistener *listen_on(km_proxy *px, const char *host, uint16_t port, km_broker *b, char *err,
					size_t errlen)
{
	struct evutil_addrinfo hints, *res = NULL;
	struct evconnlistener *l;
	char service[8];
	int rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_ADDRCONFIG;
	snprintf(service, sizeof(service), "%u", port);
	rc = evutil_getaddrinfo(host, service, &hints, &res);
	if (rc != 0 || !res) {
		snprintf(err, errlen, "cannot resolve listen address %s:%u: %s", host, port, evutil_gai_strerror(rc));
		return NULL;
	}
	l = evconnlistener_new_bind(px->base, accept_cb, b,
				    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
					    (px->cfg.listen_reuseport ? LEV_OPT_REUSEABLE_PORT : 0),
				    512, res->ai_addr, (int)res->ai_addrlen);
	evutil_freeaddrinfo(res);
	if (!l) {
		int e = errno;
		snprintf(err, errlen, "cannot listen on %s:%u: %s%s", host, port, strerror(e),
			 e != EADDRINUSE ? ""
			 : px->cfg.listen_reuseport
				 ? " (a process there does not share it: set listen_reuseport = true in every kmirrord on this "
				   "port, run by the same user)"
				 : " (to run several kmirrord processes on these ports, set listen_reuseport = true in each)");
		return NULL;
	}
	evconnlistener_set_error_cb(l, accept_error_cb);
	return l;
}

/* ---- upstream brokers ---- */

static km_broker *broker_find(const km_proxy *px, int32_t node_id)
{
	for (size_t i = 0; i < px->nbrokers; i++)
		if (px->brokers[i]->node_id == node_id)
			return px->brokers[i];
	return NULL;
}

static bool broker_addr(void *arg, int32_t node_id, const char **host, uint16_t *port)
{
	km_proxy *px = arg;
	return px->upstream && km_cluster_addr(px->upstream, node_id, host, port);
}

/* A broker seen in any upstream answer: remember where it lives, and give it a port the first time. */
static void learn_broker(void *arg, int32_t node_id, km_str host, int32_t port, km_str rack)
{
	km_proxy *px = arg;
	km_broker *b = broker_find(px, node_id);
	const char *h;
	uint16_t hp;
	char err[256];
	bool moved;

	(void)rack;
	if (!px->upstream || host.len <= 0)
		return;
	if (!b && node_id >= px->cfg.broker_port_count) {
		KM_WARN("proxy", 0, "broker %d is beyond broker_port_count %lld: clients cannot reach it", node_id,
			(long long)px->cfg.broker_port_count);
		return;
	}
	if (km_cluster_learn(px->upstream, node_id, host.p, (size_t)host.len, port, &moved) != KM_OK)
		return;
	if (moved && km_cluster_addr(px->upstream, node_id, &h, &hp))
		KM_INFO("proxy", 0, "broker %d moved to %s:%u", node_id, h, hp);
	if (b)
		return;
	if (px->nbrokers == px->capbrokers) {
		size_t ncap = px->capbrokers ? px->capbrokers * 2 : 8;
		km_broker **n = realloc(px->brokers, ncap * sizeof(*n));
		if (!n)
			return;
		px->brokers = n;
		px->capbrokers = ncap;
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return;
	b->px = px;
	b->node_id = node_id;
	if (!px->draining) {
		b->listener = listen_on(px, px->cfg.listen.host, (uint16_t)(px->cfg.broker_port_base + node_id), b, err,
					sizeof(err));
		if (!b->listener)
			KM_ERROR("proxy", 0, "broker %d: %s", node_id, err);
	}
	px->brokers[px->nbrokers++] = b;
	px->metrics.brokers_known = px->nbrokers;
	KM_INFO("proxy", 0, "broker %d at %.*s:%d is served on port %lld", node_id, (int)host.len, host.p, port,
		(long long)(px->cfg.broker_port_base + node_id));
}

void km_proxy_fill_rewrite_ctx(km_proxy *px, km_rewrite_ctx *ctx,
			       void (*learn)(void *arg, int32_t node_id, km_str host, int32_t port, km_str rack), void *arg)
{
	memset(ctx, 0, sizeof(*ctx));
	ctx->host = px->cfg.advertised_host;
	ctx->port_base = (int32_t)px->cfg.broker_port_base;
	ctx->port_count = (int32_t)px->cfg.broker_port_count;
	ctx->learn = learn;
	ctx->arg = arg;
	ctx->apis = px->apis;
}

static void proxy_rewrite_ctx(void *arg, km_rewrite_ctx *ctx)
{
	km_proxy_fill_rewrite_ctx(arg, ctx, learn_broker, arg);
}

/* ---- the upstream and its metadata refresh: Metadata v9 with no topics, answered by any bootstrap address ---- */

/* The refresh failed: forget its one-shot client; retry soon, then less often while it keeps failing. */
static void meta_failed(km_proxy *px, const char *why)
{
	km_net_client *c = px->meta;

	KM_WARN("proxy", 0, "metadata refresh failed: %s", why);
	px->meta = NULL;
	km_cluster_drop(px->upstream, c);
	px->meta_backoff_ms = px->meta_backoff_ms ? px->meta_backoff_ms * 2 : 1000;
	if (px->meta_backoff_ms > (uint64_t)px->cfg.metadata_refresh_ms)
		px->meta_backoff_ms = (uint64_t)px->cfg.metadata_refresh_ms;
	px->meta_next_ms = km_proxy_now_ms(px) + px->meta_backoff_ms;
}

static void meta_response(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	km_proxy *px = arg;
	km_rewrite_ctx ctx;
	km_wr w;

	if (c != px->meta) /* asked of a previous upstream, or at shutdown */
		return;
	if (err != KM_OK) {
		meta_failed(px, km_err_name(err));
		return;
	}
	proxy_rewrite_ctx(px, &ctx);
	km_wr_init(&w);
	/* The rewriter learns the brokers; its output is not needed. */
	if (km_rewrite_metadata(body, len, 9, &ctx, &w) == KM_OK) {
		px->meta_last_ok_ms = km_proxy_now_ms(px);
		px->meta_backoff_ms = 0;
	}
	km_wr_free(&w);
	/* One-shot connection: the next refresh may pick another address. */
	px->meta = NULL;
	km_cluster_drop(px->upstream, c);
}

/* The upstream's clients changed: the refresh's connection may have failed. */
static void upstream_changed(void *arg)
{
	km_proxy *px = arg;

	if (px->meta && km_cluster_failed(px->upstream, px->meta))
		meta_failed(px, km_cluster_last_error(px->upstream));
}

km_err km_proxy_upstream_new(km_proxy *px, const km_cluster *carry)
{
	km_net_client_opts o;
	size_t n = carry ? km_cluster_node_ids(carry, NULL, 0) : 0;
	int32_t *ids = NULL;
	km_err rc = KM_OK;

	memset(&o, 0, sizeof(o));
	o.client_id = "kmirrord";
	o.tls = px->own_tls;
	km_net_client_opts_upstream(&o, &px->cfg);
	o.connect_timeout_ms = px->cfg.upstream_connect_timeout_ms;
	o.request_timeout_ms = 30000;
	o.max_frame_bytes = px->cfg.max_frame_bytes;
	o.skip_api_versions = true; /* Metadata v9 is fixed: every broker since Kafka 2.4 takes it */
	o.dns = px->dns;
	if (!px->cfg.upstream_count)
		return KM_OK;
	px->upstream = km_cluster_new(px->base, "upstream", &o, px->cfg.upstream, (size_t)px->cfg.upstream_count,
				      upstream_changed, px);
	if (!px->upstream || (n && !(ids = calloc(n, sizeof(*ids)))))
		return KM_ERR_NOMEM;
	if (n)
		km_cluster_node_ids(carry, ids, n);
	for (size_t i = 0; i < n && rc == KM_OK; i++) {
		const char *h;
		uint16_t port;
		bool moved;
		if (km_cluster_addr(carry, ids[i], &h, &port))
			rc = km_cluster_learn(px->upstream, ids[i], h, strlen(h), port, &moved);
	}
	free(ids);
	return rc;
}

static void meta_refresh(km_proxy *px)
{
	static const uint8_t body[] = {0x01, 0x00, 0x00, 0x00, 0x00}; /* no topics, no auto-create, tags */
	km_net_client *c;

	if (px->meta || !px->upstream)
		return;
	c = km_cluster_any(px->upstream);
	if (!c || km_net_client_send(c, KM_API_METADATA, 9, 2, 1, body, sizeof(body), meta_response, px) != KM_OK) {
		km_cluster_drop(px->upstream, c);
		px->meta_next_ms = km_proxy_now_ms(px) + 1000;
		return;
	}
	px->meta = c;
}

void km_proxy_refresh_now(km_proxy *px)
{
	if (px->meta) { /* asked of the previous upstream, whose cluster went with it: its answer is ignored */
		px->meta = NULL;
	}
	px->meta_backoff_ms = 0;
	px->meta_next_ms = km_proxy_now_ms(px) + (uint64_t)px->cfg.metadata_refresh_ms;
	meta_refresh(px);
}

/* ---- periodic work ---- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	km_proxy *px = arg;
	uint64_t now = km_proxy_now_ms(px);

	km_session_set_tick(px->sessions, now);
	if (!px->draining && now >= px->meta_next_ms) {
		px->meta_next_ms = now + (uint64_t)px->cfg.metadata_refresh_ms;
		meta_refresh(px);
	}
}

/* ---- lifecycle ---- */

/*
 * The TLS contexts a config asks for, read from their files now: the client-facing one, the one
 * client sessions use upstream, kmirrord's own (its metadata refresh), and admin_listen's. Only
 * kmirrord's own carries upstream_tls_cert_file: a client session presenting kmirrord's
 * certificate would act as kmirrord on a destination that authenticates by certificate, whoever
 * the client is (docs/proxy.md, "TLS and SASL").
 */
typedef struct tls_ctxs {
	SSL_CTX *server, *sessions, *own, *admin;
} tls_ctxs;

static void tls_ctxs_free(tls_ctxs *t)
{
	SSL_CTX_free(t->server);
	SSL_CTX_free(t->sessions);
	SSL_CTX_free(t->own);
	SSL_CTX_free(t->admin);
	memset(t, 0, sizeof(*t));
}

static km_err make_tls(const km_config *cfg, tls_ctxs *t, char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	if (cfg->tls_cert_file || cfg->tls_keystore_file) {
		km_net_tls_files f = {
			.ca_file = cfg->tls_ca_file,
			.cert_file = cfg->tls_cert_file,
			.key_file = cfg->tls_key_file,
			.truststore = {.location = cfg->tls_truststore_file, .password = cfg->tls_truststore_password},
			.keystore = {.location = cfg->tls_keystore_file, .password = cfg->tls_keystore_password},
		};
		if (!(t->server = km_net_tls_server_ctx(&f, (int)cfg->tls_client_auth, err, errlen)))
			goto fail;
	}
	if (cfg->upstream_tls && !(t->sessions = km_state_upstream_tls(cfg, false, err, errlen)))
		goto fail;
	if (cfg->upstream_tls && !cfg->upstream_tls_cert_file && !cfg->upstream_tls_keystore_file &&
	    SSL_CTX_up_ref(t->sessions) == 1)
		t->own = t->sessions;
	else if (cfg->upstream_tls && !(t->own = km_state_upstream_tls(cfg, true, err, errlen)))
		goto fail;
	if (cfg->admin_tls_cert_file &&
	    !(t->admin = km_net_tls_server_ctx(
		      &(km_net_tls_files){.cert_file = cfg->admin_tls_cert_file, .key_file = cfg->admin_tls_key_file}, 0,
		      err, errlen)))
		goto fail;
	return KM_OK;
fail:
	tls_ctxs_free(t);
	return KM_ERR_TLS;
}

km_proxy *km_proxy_new(struct event_base *base, const km_config *cfg, km_metrics *metrics, char *err,
		       size_t errlen)
{
	km_proxy *px = calloc(1, sizeof(*px));
	struct timeval tick = {0, 250000};
	tls_ctxs tls;

	if (!px) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	px->base = base;
	if (km_config_copy(&px->cfg, cfg) != KM_OK) {
		snprintf(err, errlen, "out of memory");
		free(px);
		return NULL;
	}
	px->host.base = base;
	px->host.cfg = &px->cfg;
	px->host.metrics = &px->metrics;
	px->host.rewrite_ctx = proxy_rewrite_ctx;
	px->host.broker_addr = broker_addr;
	px->host.arg = px;
	px->apis = km_proxy_apis_new();
	px->sessions = px->apis ? km_session_set_new(&px->host) : NULL;
	px->host.sessions = px->sessions;
	if (!px->sessions) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	px->host.apis = px->apis;
	px->host.features = &px->features;
	if (make_tls(cfg, &tls, err, errlen) != KM_OK)
		goto fail;
	px->host.server_tls = tls.server;
	px->host.upstream_tls = tls.sessions;
	px->own_tls = tls.own;
	px->admin_tls = tls.admin;
	px->dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
	px->host.dns = px->dns;
	if (!px->dns)
		KM_WARN("proxy", 0, "no DNS resolver configuration: upstream names resolve synchronously");
	if (km_proxy_upstream_new(px, NULL) != KM_OK) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* The HTTP listener first: once clients can connect, /readyz and /healthz answer too. */
	if (km_proxy_http_start(px, err, errlen) != KM_OK)
		goto fail;
	px->bootstrap_b.px = px;
	px->bootstrap_b.node_id = -1;
	px->bootstrap = listen_on(px, cfg->listen.host, cfg->listen.port, &px->bootstrap_b, err, errlen);
	px->bootstrap_b.listener = px->bootstrap;
	if (!px->bootstrap)
		goto fail;
	px->tick_ev = event_new(base, -1, EV_PERSIST, tick_cb, px);
	if (!px->tick_ev || event_add(px->tick_ev, &tick) != 0) {
		snprintf(err, errlen, "cannot create timer");
		goto fail;
	}
	/* Last, so a failure before it leaves nothing in the caller's registry that points into px. */
	px->registry = metrics ? metrics : (px->own_registry = km_metrics_new());
	if (!px->registry || km_proxy_counters_register(&px->metrics, px->registry) != KM_OK) {
		snprintf(err, errlen, "cannot register the proxy's metrics (names taken, or out of memory)");
		goto fail;
	}
	KM_INFO("proxy", 0, "listening on %s:%u (bootstrap), broker ports %lld-%lld, advertised host %s", cfg->listen.host,
		cfg->listen.port, (long long)cfg->broker_port_base,
		(long long)(cfg->broker_port_base + cfg->broker_port_count - 1), cfg->advertised_host);
	meta_refresh(px);
	px->meta_next_ms = km_proxy_now_ms(px) + (uint64_t)cfg->metadata_refresh_ms;
	return px;
fail:
	km_proxy_free(px);
	return NULL;
}

km_err km_proxy_reload(km_proxy *px, const km_config *next, char *err, size_t errlen)
{
	km_config copy;
	tls_ctxs tls, old;
	km_cluster *prev;

	if (px->swap) {
		snprintf(err, errlen, "an upstream swap is in progress: reload again after it");
		return KM_ERR_INVAL;
	}
	/* TLS files are read again on every reload, so certificates rotated in place are picked up.
	 * New connections use the new contexts; open ones keep theirs (each SSL holds a reference). */
	if (make_tls(next, &tls, err, errlen) != KM_OK)
		return KM_ERR_TLS;
	if (km_config_copy(&copy, next) != KM_OK) {
		tls_ctxs_free(&tls);
		snprintf(err, errlen, "out of memory");
		return KM_ERR_NOMEM;
	}
	prev = px->upstream;
	old = (tls_ctxs){px->host.server_tls, px->host.upstream_tls, px->own_tls, px->admin_tls};
	px->host.server_tls = tls.server;
	px->host.upstream_tls = tls.sessions;
	px->own_tls = tls.own;
	px->admin_tls = tls.admin;
	km_config_free(&px->cfg);
	px->cfg = copy;
	px->features.offsets.trace_topics = px->cfg.log_fetch_topics;
	km_proxy_http_reload(px);
	/* The upstream's clients take the new settings; the brokers' addresses stay. */
	px->upstream = NULL;
	px->meta = NULL; /* in flight on the old clients: its answer is ignored */
	if (km_proxy_upstream_new(px, prev) != KM_OK)
		KM_ERROR("proxy", 0, "reload: out of memory for the upstream's clients; metadata refresh stops until the next reload");
	km_cluster_free(prev);
	tls_ctxs_free(&old);
	km_log_set_level((km_log_level)px->cfg.log_level);
	px->features.read_only.read_only_code = km_ro_code_of(px->cfg.read_only_error);
	/* Sessions read the config through their host (&px->cfg) on every use, so new limits apply at once. */
	return KM_OK;
}

static void drain_round(evutil_socket_t fd, short what, void *arg)
{
	km_proxy *px = arg;
	uint64_t now = km_proxy_now_ms(px);

	if (now >= px->drain_deadline_ms) {
		if (km_session_set_count(px->sessions))
			KM_WARN("proxy", 0, "drain timeout: closing the remaining %zu connection(s)",
				km_session_set_count(px->sessions));
		km_session_set_close_all(px->sessions, "drain timeout");
	} else {
		km_session_set_drain(px->sessions, px->drain_per_round);
	}
	if (!km_session_set_count(px->sessions)) {
		event_del(px->drain_ev);
		KM_INFO("proxy", 0, "all client connections closed");
		if (px->drain_done)
			px->drain_done(px->drain_arg);
	}
}

void km_proxy_drain(km_proxy *px, void (*done)(void *arg), void *arg)
{
	struct timeval iv;
	size_t rounds;

	if (px->draining)
		return;
	px->draining = true;
	px->metrics.draining = 1;
	px->drain_done = done;
	px->drain_arg = arg;
	broker_close_listener(&px->bootstrap_b);
	px->bootstrap = NULL;
	for (size_t i = 0; i < px->nbrokers; i++)
		broker_close_listener(px->brokers[i]);
	/* Spread the closes over the drain time, one round per interval; the last round is at the deadline. */
	rounds = (size_t)(px->cfg.drain_timeout_ms / px->cfg.drain_interval_ms);
	if (rounds < 1)
		rounds = 1;
	px->drain_per_round = (km_session_set_count(px->sessions) + rounds - 1) / rounds;
	if (px->drain_per_round < 1)
		px->drain_per_round = 1;
	px->drain_deadline_ms = km_proxy_now_ms(px) + (uint64_t)px->cfg.drain_timeout_ms;
	KM_INFO("proxy", 0, "draining %zu client connection(s): %zu every %lld ms", km_session_set_count(px->sessions),
		px->drain_per_round,
		(long long)px->cfg.drain_interval_ms);
	iv.tv_sec = (time_t)(px->cfg.drain_interval_ms / 1000);
	iv.tv_usec = (suseconds_t)((px->cfg.drain_interval_ms % 1000) * 1000);
	px->drain_ev = event_new(px->base, -1, EV_PERSIST, drain_round, px);
	if (!px->drain_ev) {
		km_session_set_close_all(px->sessions, "shutdown");
		if (done)
			done(arg);
		return;
	}
	event_add(px->drain_ev, &iv);
	drain_round(-1, 0, px);
}

void km_proxy_free(km_proxy *px)
{
	if (!px)
		return;
	if (px->host.state)
		km_state_on_tail(px->host.state, NULL, NULL);
	/* Mirror operations waiting for the store must not look for the sessions after this. */
	if (px->sessions) {
		km_mirror_rpc_detach(px->sessions);
		km_off_detach(px->sessions);
	}
	km_session_set_free(px->sessions);
	km_proxy_swap_free(px);
	km_proxy_apis_free(px->apis);
	px->meta = NULL; /* its answer, called back as its client is freed, is no longer ours */
	km_cluster_free(px->upstream);
	broker_close_listener(&px->bootstrap_b);
	px->bootstrap = NULL;
	for (size_t i = 0; i < px->nbrokers; i++) {
		broker_close_listener(px->brokers[i]);
		free(px->brokers[i]);
	}
	free(px->brokers);
	km_proxy_http_free(px);
	if (px->tick_ev)
		event_free(px->tick_ev);
	if (px->drain_ev)
		event_free(px->drain_ev);
	if (px->dns)
		evdns_base_free(px->dns, 0);
	SSL_CTX_free(px->host.server_tls);
	SSL_CTX_free(px->host.upstream_tls);
	SSL_CTX_free(px->own_tls);
	SSL_CTX_free(px->admin_tls);
	km_config_free(&px->cfg);
	km_metrics_free(px->own_registry);
	free(px);
}
