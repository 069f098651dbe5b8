/* A cluster as a client sees it: bootstrap addresses, then clients (lanes) per broker the metadata names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "kmirror/clock.h"
#include "kmirror/cluster.h"
#include "kmirror/log.h"

#define MAX_NODES 10000
/*
 * Reconnects back off per broker, exponentially from BACKOFF_MS to BACKOFF_MAX_MS with ±20 %
 * jitter (Kafka's reconnect.backoff.ms and reconnect.backoff.max.ms defaults): a cluster that is
 * down costs about one attempt a second per broker, not one per loop turn (docs/net.md,
 * "Reconnects").
 */
#define BACKOFF_MS 50
#define BACKOFF_MAX_MS 1000
/* A broker that stays unreachable is logged again this often, with the count of attempts since. */
#define FAIL_LOG_MS 60000

/* One address's reconnect state. */
typedef struct retry {
	uint32_t fails;     /* attempts failed in a row (0: connected, or not tried) */
	int64_t next_at;    /* no new connection before this */
	int64_t logged_at;  /* the last warning about it */
	uint64_t unlogged;  /* attempts failed since that warning */
	bool ready;         /* the current connection became ready */
} retry;

/* A broker: its lanes' clients (NULL: not connected) share its address and its reconnect state. */
typedef struct cnode {
	int32_t id;
	char host[256];
	uint16_t port;
	km_net_client *c[KM_CLUSTER_LANES];
	bool failed[KM_CLUSTER_LANES];
	retry r;
} cnode;

struct km_cluster {
	struct event_base *base;
	char side[16];
	km_net_client_opts o;
	char *client_id, *mech, *user, *pass;
	char *krb5_service, *krb5_keytab, *krb5_principal, *krb5_setting, *krb5_host;
	char *oauth_url, *oauth_setting, *oauth_id, *oauth_secret, *oauth_scope, *oauth_command;
	km_hostport *boot;
	size_t nboot, boot_i;
	km_net_client *bootc;
	bool boot_failed;
	retry boot_r;        /* the bootstrap addresses' (taken in turn) */
	struct event *timer; /* on_change when a backoff ends */
	int64_t timer_at;
	uint64_t attempts;   /* connections opened (km_cluster_attempts) */
	cnode *nodes;
	size_t nnodes;
	/* Clients dropped from inside their own callbacks, freed on the next loop iteration. */
	km_net_client **dead;
	size_t ndead, capdead;
	struct event *ev;
	char last_error[300]; /* why the last connection failed, for messages ("" when none has) */
	void (*on_change)(void *arg);
	void *arg;
};

static void on_ev(evutil_socket_t fd, short what, void *arg)
{
	km_cluster *cl = arg;
	(void)fd;
	(void)what;
	for (size_t i = 0; i < cl->ndead; i++)
		km_net_client_free(cl->dead[i]);
	cl->ndead = 0;
	if (cl->on_change)
		cl->on_change(cl->arg);
}

static void kick(km_cluster *cl)
{
	event_active(cl->ev, 0, 0);
}

/* The wait before attempt fails + 1: 50 ms doubling to 1 s, ±20 %. */
static int64_t backoff_ms(uint32_t fails)
{
	int64_t ms = BACKOFF_MS;
	for (uint32_t i = 1; i < fails && ms < BACKOFF_MAX_MS; i++)
		ms *= 2;
	if (ms > BACKOFF_MAX_MS)
		ms = BACKOFF_MAX_MS;
	return ms * 8 / 10 + (int64_t)((uint64_t)random() % (uint64_t)(ms * 4 / 10 + 1));
}

/* The broker and lane whose client c is; NULL when c is no broker's (the bootstrap client, or dropped). */
static cnode *lane_of(km_cluster *cl, const km_net_client *c, unsigned *lane)
{
	for (size_t i = 0; c && i < cl->nnodes; i++)
		for (unsigned l = 0; l < KM_CLUSTER_LANES; l++)
			if (cl->nodes[i].c[l] == c) {
				*lane = l;
				return &cl->nodes[i];
			}
	return NULL;
}

/* The retry state of c's address, and a name for it; NULL when c is none of ours (dropped). */
static retry *retry_of(km_cluster *cl, const km_net_client *c, char *name, size_t cap)
{
	unsigned lane;
	if (c == cl->bootc) {
		const km_hostport *hp = &cl->boot[(cl->boot_i + cl->nboot - 1) % cl->nboot];
		snprintf(name, cap, "bootstrap server %s:%u", hp->host, (unsigned)hp->port);
		return &cl->boot_r;
	}
	cnode *n = lane_of(cl, c, &lane);
	if (!n)
		return NULL;
	snprintf(name, cap, "broker %d (%s:%u)", (int)n->id, n->host, (unsigned)n->port);
	return &n->r;
}

/*
 * A connection of ours became ready or failed. A failure before it was ready counts towards the
 * backoff; one that was ready (the broker went away) starts over from the first step. The second
 * failure in a row is a warning (the first may be a broker restarting), then one a minute with the
 * count; the recovery says how many attempts it took.
 */
static void note_outcome(km_cluster *cl, km_net_client *c, km_err err)
{
	char name[300];
	retry *r = retry_of(cl, c, name, sizeof(name));
	int64_t now = km_mono_ms();

	if (!r)
		return;
	if (err == KM_OK) {
		if (r->fails > 1)
			KM_INFO("net", 0, "%s: %s reachable again after %u failed attempt(s)", cl->side, name, r->fails);
		*r = (retry){.ready = true};
		return;
	}
	if (r->ready)
		r->fails = 0;
	r->ready = false;
	r->fails++;
	r->next_at = now + backoff_ms(r->fails);
	if (r->fails == 2) {
		KM_WARN("net", 0, "%s: cannot connect to %s: %s (%u attempts in a row; retrying with backoff, once a "
			"second at most)", cl->side, name, cl->last_error, r->fails);
		r->logged_at = now;
		r->unlogged = 0;
	} else if (r->fails > 2 && now - r->logged_at >= FAIL_LOG_MS) {
		KM_WARN("net", 0, "%s: still cannot connect to %s: %s (%u attempts in a row, %llu since the last warning)",
			cl->side, name, cl->last_error, r->fails, (unsigned long long)r->unlogged + 1);
		r->logged_at = now;
		r->unlogged = 0;
	} else {
		r->unlogged++;
	}
}

static void on_state(km_net_client *c, km_err err, void *arg)
{
	km_cluster *cl = arg;
	unsigned lane;

	if (err != KM_OK) {
		KM_DEBUG("net", 0, "%s connection failed: %s", cl->side, km_net_client_reason(c));
		snprintf(cl->last_error, sizeof(cl->last_error), "%s", *km_net_client_reason(c) ? km_net_client_reason(c) :
									km_err_name(err));
		cnode *n = lane_of(cl, c, &lane);
		if (c == cl->bootc)
			cl->boot_failed = true;
		if (n)
			n->failed[lane] = true;
	}
	note_outcome(cl, c, err);
	kick(cl);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	km_cluster *cl = arg;
	(void)fd;
	(void)what;
	if (cl->on_change)
		cl->on_change(cl->arg);
}

/* Whether r's backoff still runs (then on_change is called when it ends). */
static bool backing_off(km_cluster *cl, const retry *r)
{
	int64_t left = r->next_at - km_mono_ms();
	struct timeval tv;
	if (left <= 0)
		return false;
	if (!event_pending(cl->timer, EV_TIMEOUT, NULL) || cl->timer_at > r->next_at) {
		tv.tv_sec = (time_t)(left / 1000);
		tv.tv_usec = (suseconds_t)(left % 1000) * 1000;
		event_add(cl->timer, &tv);
		cl->timer_at = r->next_at;
	}
	return true;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* The cluster's own copy of a string option of the template: kept in *keep, the options pointed at it. */
static void own(char **keep, const char **field)
{
	*keep = dup_or_null(*field);
	*field = *keep;
}

km_cluster *km_cluster_new(struct event_base *base, const char *side, const km_net_client_opts *tmpl,
			     const km_hostport *boot, size_t nboot, void (*on_change)(void *arg), void *arg)
{
	km_cluster *cl = calloc(1, sizeof(*cl));

	if (!cl || !nboot)
		goto fail;
	cl->base = base;
	snprintf(cl->side, sizeof(cl->side), "%s", side);
	cl->o = *tmpl;
	cl->o.quiet_failures = true; /* note_outcome says it once */
	own(&cl->client_id, &cl->o.client_id);
	own(&cl->mech, &cl->o.sasl_mechanism);
	own(&cl->user, &cl->o.sasl_username);
	own(&cl->pass, &cl->o.sasl_password);
	own(&cl->krb5_service, &cl->o.sasl_kerberos_service_name);
	own(&cl->krb5_keytab, &cl->o.sasl_kerberos_keytab);
	own(&cl->krb5_principal, &cl->o.sasl_kerberos_principal);
	own(&cl->krb5_setting, &cl->o.sasl_kerberos_setting);
	own(&cl->krb5_host, &cl->o.sasl_kerberos_host);
	own(&cl->oauth_url, &cl->o.sasl_oauthbearer_token_endpoint_url);
	own(&cl->oauth_setting, &cl->o.sasl_oauthbearer_setting);
	own(&cl->oauth_id, &cl->o.sasl_oauthbearer_client_id);
	own(&cl->oauth_secret, &cl->o.sasl_oauthbearer_client_secret);
	own(&cl->oauth_scope, &cl->o.sasl_oauthbearer_scope);
	own(&cl->oauth_command, &cl->o.sasl_oauthbearer_token_command);
	cl->o.on_state = on_state;
	cl->o.arg = cl;
	cl->boot = malloc(nboot * sizeof(*cl->boot));
	cl->ev = event_new(base, -1, 0, on_ev, cl);
	cl->timer = event_new(base, -1, 0, on_timer, cl);
	if (!cl->boot || !cl->ev || !cl->timer)
		goto fail;
	memcpy(cl->boot, boot, nboot * sizeof(*boot));
	cl->nboot = nboot;
	cl->on_change = on_change;
	cl->arg = arg;
	return cl;
fail:
	km_cluster_free(cl);
	return NULL;
}

void km_cluster_free(km_cluster *cl)
{
	if (!cl)
		return;
	if (cl->bootc)
		km_net_client_free(cl->bootc);
	for (size_t i = 0; i < cl->nnodes; i++)
		for (unsigned l = 0; l < KM_CLUSTER_LANES; l++)
			if (cl->nodes[i].c[l])
				km_net_client_free(cl->nodes[i].c[l]);
	for (size_t i = 0; i < cl->ndead; i++)
		km_net_client_free(cl->dead[i]);
	free(cl->dead);
	free(cl->nodes);
	free(cl->boot);
	if (cl->ev)
		event_free(cl->ev);
	if (cl->timer)
		event_free(cl->timer);
	if (cl->pass)
		OPENSSL_cleanse(cl->pass, strlen(cl->pass));
	if (cl->oauth_secret)
		OPENSSL_cleanse(cl->oauth_secret, strlen(cl->oauth_secret));
	free(cl->client_id);
	free(cl->mech);
	free(cl->user);
	free(cl->pass);
	free(cl->krb5_service);
	free(cl->krb5_keytab);
	free(cl->krb5_principal);
	free(cl->krb5_setting);
	free(cl->krb5_host);
	free(cl->oauth_url);
	free(cl->oauth_setting);
	free(cl->oauth_id);
	free(cl->oauth_secret);
	free(cl->oauth_scope);
	free(cl->oauth_command);
	free(cl);
}

uint64_t km_cluster_attempts(const km_cluster *cl)
{
	return cl->attempts;
}

bool km_cluster_unreachable(const km_cluster *cl)
{
	bool failing = cl->boot_r.fails > 0;

	if (cl->bootc && !cl->boot_failed && cl->boot_r.ready)
		return false;
	for (size_t i = 0; i < cl->nnodes; i++) {
		const cnode *n = &cl->nodes[i];
		for (unsigned l = 0; l < KM_CLUSTER_LANES; l++)
			if (n->c[l] && !n->failed[l] && n->r.ready)
				return false;
		failing |= n->r.fails > 0;
	}
	return failing;
}

const char *km_cluster_last_error(const km_cluster *cl)
{
	return cl->last_error;
}

const char *km_cluster_side(const km_cluster *cl)
{
	return cl->side;
}

static km_net_client *connect_to(km_cluster *cl, const char *host, uint16_t port)
{
	km_net_client *c = km_net_client_new(cl->base, &cl->o);

	cl->attempts++;
	if (c && km_net_client_connect(c, host, port) != KM_OK) {
		km_net_client_free(c);
		c = NULL;
	}
	return c;
}

/* Park a client for freeing on the next loop iteration (it may be calling us). */
static void bury(km_cluster *cl, km_net_client *c)
{
	if (cl->ndead == cl->capdead) {
		size_t cap = cl->capdead ? cl->capdead * 2 : 8;
		km_net_client **d = realloc(cl->dead, cap * sizeof(*d));
		if (!d) {
			/* Freeing now is safe from outside a callback; inside one the client's own free is reentrant-safe. */
			km_net_client_free(c);
			return;
		}
		cl->dead = d;
		cl->capdead = cap;
	}
	cl->dead[cl->ndead++] = c;
	kick(cl);
}

km_net_client *km_cluster_any(km_cluster *cl)
{
	/* A broker the metadata named, connected and healthy, is the cheapest. */
	for (size_t i = 0; i < cl->nnodes; i++)
		if (cl->nodes[i].c[0] && !cl->nodes[i].failed[0] && km_net_client_ready(cl->nodes[i].c[0]))
			return cl->nodes[i].c[0];
	if (cl->bootc && cl->boot_failed)
		km_cluster_drop(cl, cl->bootc);
	if (!cl->bootc) {
		const km_hostport *hp = &cl->boot[cl->boot_i % cl->nboot];
		/* The next bootstrap address at once, until each has failed in this round. */
		if (cl->boot_r.fails % cl->nboot == 0 && backing_off(cl, &cl->boot_r))
			return NULL;
		cl->boot_i++;
		cl->bootc = connect_to(cl, hp->host, hp->port);
		cl->boot_failed = false;
	}
	return cl->bootc;
}

static cnode *node_of(km_cluster *cl, int32_t id)
{
	for (size_t i = 0; i < cl->nnodes; i++)
		if (cl->nodes[i].id == id)
			return &cl->nodes[i];
	return NULL;
}

km_net_client *km_cluster_lane(km_cluster *cl, int32_t id, unsigned lane)
{
	cnode *n = node_of(cl, id);

	if (!n || lane >= KM_CLUSTER_LANES)
		return NULL;
	if (n->c[lane] && n->failed[lane])
		km_cluster_drop(cl, n->c[lane]);
	if (!n->c[lane]) {
		if (backing_off(cl, &n->r))
			return NULL;
		n->c[lane] = connect_to(cl, n->host, n->port);
		n->failed[lane] = false;
	}
	return n->c[lane];
}

km_net_client *km_cluster_node(km_cluster *cl, int32_t id)
{
	return km_cluster_lane(cl, id, 0);
}

bool km_cluster_failed(km_cluster *cl, const km_net_client *c)
{
	unsigned lane;
	cnode *n;

	if (!c)
		return true;
	if (c == cl->bootc)
		return cl->boot_failed;
	n = lane_of(cl, c, &lane);
	return n ? n->failed[lane] : true;
}

bool km_cluster_usable(km_cluster *cl, km_net_client *c)
{
	if (!c)
		return false;
	if (km_net_client_ready(c))
		return true;
	if (km_cluster_failed(cl, c))
		km_cluster_drop(cl, c);
	return false;
}

void km_cluster_drop(km_cluster *cl, km_net_client *c)
{
	unsigned lane;
	cnode *n;

	if (!c)
		return;
	if (c == cl->bootc) {
		cl->bootc = NULL;
		cl->boot_failed = false;
		bury(cl, c);
		return;
	}
	if ((n = lane_of(cl, c, &lane))) {
		n->c[lane] = NULL;
		n->failed[lane] = false;
		bury(cl, c);
	}
}

km_err km_cluster_brokers(km_cluster *cl, const km_metadata_response *r)
{
	size_t n = r->brokers.count > 0 ? (size_t)r->brokers.count : 0;
	cnode *nn;

	if (n > MAX_NODES)
		return KM_ERR_DECODE;
	if (!n)
		return KM_OK; /* keep what we had: a response without brokers is no news */
	nn = calloc(n, sizeof(*nn));
	if (!nn)
		return KM_ERR_NOMEM;
	for (size_t i = 0; i < n; i++) {
		const km_metadata_response_broker *b = &r->brokers.items[i];
		cnode *old = node_of(cl, b->node_id);
		nn[i].id = b->node_id;
		snprintf(nn[i].host, sizeof(nn[i].host), "%.*s", b->host.len > 0 ? (int)b->host.len : 0, b->host.p);
		nn[i].port = (uint16_t)b->port;
		if (old && !strcmp(old->host, nn[i].host) && old->port == nn[i].port) {
			memcpy(nn[i].c, old->c, sizeof(old->c));
			memcpy(nn[i].failed, old->failed, sizeof(old->failed));
			nn[i].r = old->r;
			memset(old->c, 0, sizeof(old->c));
		}
	}
	for (size_t i = 0; i < cl->nnodes; i++)
		for (unsigned l = 0; l < KM_CLUSTER_LANES; l++)
			if (cl->nodes[i].c[l])
				bury(cl, cl->nodes[i].c[l]);
	free(cl->nodes);
	cl->nodes = nn;
	cl->nnodes = n;
	return KM_OK;
}

size_t km_cluster_node_ids(const km_cluster *cl, int32_t *out, size_t cap)
{
	for (size_t i = 0; i < cl->nnodes && i < cap; i++)
		out[i] = cl->nodes[i].id;
	return cl->nnodes;
}

km_err km_cluster_learn(km_cluster *cl, int32_t id, const char *host, size_t hostlen, int32_t port, bool *moved)
{
	cnode *n = node_of(cl, id), *nn;

	*moved = false;
	if (id < 0 || !hostlen || hostlen >= sizeof(n->host) || port <= 0 || port > 65535)
		return KM_ERR_INVAL;
	if (n) {
		if (hostlen == strlen(n->host) && !memcmp(n->host, host, hostlen) && n->port == port)
			return KM_OK;
		for (unsigned l = 0; l < KM_CLUSTER_LANES; l++)
			if (n->c[l])
				km_cluster_drop(cl, n->c[l]);
		n->r = (retry){0}; /* a new address: no backoff carried over */
		*moved = true;
	} else {
		if (cl->nnodes >= MAX_NODES)
			return KM_ERR_FULL;
		if (!(nn = realloc(cl->nodes, (cl->nnodes + 1) * sizeof(*nn))))
			return KM_ERR_NOMEM;
		cl->nodes = nn;
		n = &cl->nodes[cl->nnodes++];
		memset(n, 0, sizeof(*n));
		n->id = id;
	}
	memcpy(n->host, host, hostlen);
	n->host[hostlen] = '\0';
	n->port = (uint16_t)port;
	return KM_OK;
}

bool km_cluster_addr(const km_cluster *cl, int32_t id, const char **host, uint16_t *port)
{
	for (size_t i = 0; i < cl->nnodes; i++)
		if (cl->nodes[i].id == id) {
			*host = cl->nodes[i].host;
			*port = cl->nodes[i].port;
			return true;
		}
	return false;
}
