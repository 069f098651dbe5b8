/* A cluster as a client sees it: bootstrap addresses, then one client per broker the metadata names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "kmirror/cluster.h"
#include "kmirror/log.h"

#define MAX_NODES 10000

typedef struct cnode {
	int32_t id;
	char host[256];
	uint16_t port;
	km_net_client *c;
	bool failed;
} cnode;

struct km_cluster {
	struct event_base *base;
	char side[16];
	km_net_client_opts o;
	char *client_id, *mech, *user, *pass;
	km_hostport *boot;
	size_t nboot, boot_i;
	km_net_client *bootc;
	bool boot_failed;
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

static void on_state(km_net_client *c, km_err err, void *arg)
{
	km_cluster *cl = arg;

	if (err != KM_OK) {
		KM_DEBUG("net", 0, "%s connection failed: %s", cl->side, km_net_client_reason(c));
		snprintf(cl->last_error, sizeof(cl->last_error), "%s", *km_net_client_reason(c) ? km_net_client_reason(c) :
									km_err_name(err));
		if (c == cl->bootc)
			cl->boot_failed = true;
		for (size_t i = 0; i < cl->nnodes; i++)
			if (cl->nodes[i].c == c)
				cl->nodes[i].failed = true;
	}
	kick(cl);
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
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
	cl->client_id = dup_or_null(tmpl->client_id);
	cl->mech = dup_or_null(tmpl->sasl_mechanism);
	cl->user = dup_or_null(tmpl->sasl_username);
	cl->pass = dup_or_null(tmpl->sasl_password);
	cl->o.client_id = cl->client_id;
	cl->o.sasl_mechanism = cl->mech;
	cl->o.sasl_username = cl->user;
	cl->o.sasl_password = cl->pass;
	cl->o.on_state = on_state;
	cl->o.arg = cl;
	cl->boot = malloc(nboot * sizeof(*cl->boot));
	cl->ev = event_new(base, -1, 0, on_ev, cl);
	if (!cl->boot || !cl->ev)
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
		if (cl->nodes[i].c)
			km_net_client_free(cl->nodes[i].c);
	for (size_t i = 0; i < cl->ndead; i++)
		km_net_client_free(cl->dead[i]);
	free(cl->dead);
	free(cl->nodes);
	free(cl->boot);
	if (cl->ev)
		event_free(cl->ev);
	if (cl->pass)
		OPENSSL_cleanse(cl->pass, strlen(cl->pass));
	free(cl->client_id);
	free(cl->mech);
	free(cl->user);
	free(cl->pass);
	free(cl);
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
		if (cl->nodes[i].c && !cl->nodes[i].failed && km_net_client_ready(cl->nodes[i].c))
			return cl->nodes[i].c;
	if (cl->bootc && cl->boot_failed)
		km_cluster_drop(cl, cl->bootc);
	if (!cl->bootc) {
		const km_hostport *hp = &cl->boot[cl->boot_i++ % cl->nboot];
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

km_net_client *km_cluster_node(km_cluster *cl, int32_t id)
{
	cnode *n = node_of(cl, id);

	if (!n)
		return NULL;
	if (n->c && n->failed)
		km_cluster_drop(cl, n->c);
	if (!n->c) {
		n->c = connect_to(cl, n->host, n->port);
		n->failed = false;
	}
	return n->c;
}

bool km_cluster_failed(km_cluster *cl, const km_net_client *c)
{
	if (!c)
		return true;
	if (c == cl->bootc)
		return cl->boot_failed;
	for (size_t i = 0; i < cl->nnodes; i++)
		if (cl->nodes[i].c == c)
			return cl->nodes[i].failed;
	return true;
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
	if (!c)
		return;
	if (c == cl->bootc) {
		cl->bootc = NULL;
		cl->boot_failed = false;
		bury(cl, c);
		return;
	}
	for (size_t i = 0; i < cl->nnodes; i++)
		if (cl->nodes[i].c == c) {
			cl->nodes[i].c = NULL;
			cl->nodes[i].failed = false;
			bury(cl, c);
			return;
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
		if (old && old->c && !strcmp(old->host, nn[i].host) && old->port == nn[i].port) {
			nn[i].c = old->c;
			nn[i].failed = old->failed;
			old->c = NULL;
		}
	}
	for (size_t i = 0; i < cl->nnodes; i++)
		if (cl->nodes[i].c)
			bury(cl, cl->nodes[i].c);
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
		if (n->c)
			km_cluster_drop(cl, n->c);
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
