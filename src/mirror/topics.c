/* Destination topics that follow the source: created at StartMirrorTopics with the source's partitions and configs, grown when the source grows (docs/mirror.md, "Destination topics"). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_partitions_request.h"
#include "kmirror/msg/create_partitions_response.h"
#include "kmirror/msg/create_topics_request.h"
#include "kmirror/msg/create_topics_response.h"
#include "kmirror/msg/describe_configs_request.h"
#include "kmirror/msg/describe_configs_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/rpc.h"
#include "prep.h"

/* ---- which source configs a created destination topic gets ---- */

/*
 * Never copied (docs/mirror.md, "Destination topics"): replication throttles name the source's
 * brokers; confluent.* and message.format.version / message.downconversion.enable are a vendor's
 * or an old broker's and a 4.x destination refuses them; the timestamp bounds would make the
 * destination refuse the source's old (or future) records; min.insync.replicas and the tiered
 * storage keys are the destination's own durability and storage policy; compression.type is always
 * "producer" (set below); mirror.name is kmirror's own.
 */
static const char *const never_copied[] = {
	"leader.replication.throttled.replicas",
	"follower.replication.throttled.replicas",
	"message.format.version",
	"message.downconversion.enable",
	"message.timestamp.difference.max.ms",
	"message.timestamp.before.max.ms",
	"message.timestamp.after.max.ms",
	"min.insync.replicas",
	"remote.storage.enable",
	"local.retention.ms",
	"local.retention.bytes",
	"remote.log.copy.disable",
	"remote.log.delete.on.disable",
	"compression.type",
	"mirror.name",
};

bool km_mirror_config_copied(const char *name, int8_t source, const char **value)
{
	if (!name || !*name || !value || !*value || source != K_DYNAMIC_TOPIC_CONFIG)
		return false;
	if (!strncmp(name, "confluent.", 10))
		return false;
	for (size_t i = 0; i < sizeof(never_copied) / sizeof(*never_copied); i++)
		if (!strcmp(name, never_copied[i]))
			return false;
	/*
	 * A LogAppendTime destination refuses the batches the source stamped (INVALID_TIMESTAMP) and
	 * re-stamps the rest: CreateTime keeps the source's timestamps, which is what the mirror shows.
	 */
	if (!strcmp(name, "message.timestamp.type") && !strcmp(*value, "LogAppendTime"))
		*value = "CreateTime";
	return true;
}

/* ---- one StartMirrorTopics' preparation (prep.h) ---- */

void km_prep_set_code(ptopic *t, km_err code, const char *fmt, ...)
{
	char buf[600];
	va_list ap;

	if (t->settled)
		return;
	t->settled = true;
	t->code = code;
	if (code && fmt) {
		va_start(ap, fmt);
		vsnprintf(buf, sizeof(buf), fmt, ap);
		va_end(ap);
		t->msg = strdup(buf);
	}
}

/* The transactional ids the broker being asked listed (the open-transactions check). */
void km_prep_free_tids(struct km_mprep *p)
{
	for (size_t i = 0; i < p->ntids; i++)
		free(p->tids[i]);
	free(p->tids);
	p->tids = NULL;
	p->ntids = 0;
}

void km_prep_free(struct km_mprep *p)
{
	/* The clusters first: their pending requests fail now, while p is still there to see it finished. */
	km_cluster_free(p->src);
	km_cluster_free(p->dst);
	p->src = p->dst = NULL;
	if (p->src_tls)
		SSL_CTX_free(p->src_tls);
	for (size_t i = 0; i < p->n; i++) {
		for (size_t j = 0; j < p->t[i].ncfg; j++) {
			free(p->t[i].cfg[j].name);
			free(p->t[i].cfg[j].value);
		}
		free(p->t[i].cfg);
		free(p->t[i].leader);
		free(p->t[i].lo);
		free(p->t[i].hi);
		free(p->t[i].name);
		free(p->t[i].msg);
	}
	free(p->t);
	free(p->src_mirror);
	km_prep_free_tids(p);
	if (p->ev)
		event_free(p->ev);
	free(p->mirror);
	free(p);
}

static void unlink_prep(struct km_mprep *p)
{
	struct km_mprep **pp = km_mirror_prep_list(p->mi);
	for (; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

/* Answer (every topic not settled is OK: it exists on the destination, the store takes it from there). */
static void answer(struct km_mprep *p)
{
	km_state_topic_result *res = calloc(p->n ? p->n : 1, sizeof(*res));

	unlink_prep(p);
	p->finished = true;
	for (size_t i = 0; res && i < p->n; i++) {
		res[i].topic = p->t[i].name;
		res[i].code = p->t[i].settled ? p->t[i].code : KM_OK;
		res[i].message = res[i].code ? (p->t[i].msg ? p->t[i].msg : km_err_message(res[i].code)) : NULL;
	}
	if (p->lq) {
		for (size_t i = 0; i < p->nlq; i++)
			if (p->lq[i].code == LQ_PENDING)
				p->lq[i].code = p->n && p->t[0].settled && p->t[0].code ? p->t[0].code : K_REQUEST_TIMED_OUT;
		p->lcb(p->arg, p->lq, p->nlq);
	} else if (p->grow) {
		if (p->n && p->t[0].settled && p->t[0].code)
			KM_WARN(COMP, 0, "%s: growing topic %s to %d partitions: %s", p->mirror, p->t[0].name,
				(int)p->t[0].partitions, p->t[0].msg ? p->t[0].msg : km_err_name(p->t[0].code));
	} else if (res) {
		p->cb(p->arg, KM_OK, NULL, res, p->n);
	} else {
		p->cb(p->arg, KM_MIRROR_STATE_UNAVAILABLE, "out of memory", NULL, 0);
	}
	free(res);
	km_prep_free(p);
}

static void advance(struct km_mprep *p);

void km_prep_on_ev(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	advance(arg);
}

void km_prep_later(struct km_mprep *p, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	if (!p->finished)
		event_add(p->ev, &tv);
}

void km_prep_on_cluster(void *arg)
{
	struct km_mprep *p = arg;
	if (!p->finished && !p->inflight)
		km_prep_later(p, 0);
}

/* A ready client of cl, or NULL (why noted; the cluster's on_change or the retry timer calls again). */
km_net_client *km_prep_ready_client(struct km_mprep *p, km_cluster *cl)
{
	km_net_client *c = km_cluster_any(cl);
	const char *r = km_cluster_last_error(cl);
	if (km_cluster_usable(cl, c))
		return c;
	/* The cluster replaces a failed client itself: its last failure says why we still wait. */
	if (*r && cl == p->src)
		snprintf(p->why, sizeof(p->why), "the source cluster (%s) cannot be reached: %s", p->src_boot, r);
	else if (*r)
		snprintf(p->why, sizeof(p->why), "the destination cannot be reached: %s", r);
	else if (!c)
		snprintf(p->why, sizeof(p->why), "cannot connect to the %s cluster", km_cluster_side(cl));
	km_prep_later(p, RETRY_MS);
	return NULL;
}


static void took_grow(struct km_mprep *p, const km_create_partitions_response *r)
{
	const km_create_partitions_response_create_partitions_topic_result *res =
		r->results.count > 0 ? &r->results.items[0] : NULL;
	/* INVALID_PARTITIONS: it has that many already (a racing call, or an operator did it). */
	if (res && (res->error_code == 0 || res->error_code == K_INVALID_PARTITIONS)) {
		if (!res->error_code)
			KM_INFO(COMP, 0, "%s: destination topic %s grown from %d to %d partitions", p->mirror, p->t[0].name,
				(int)p->dst_partitions, (int)p->t[0].partitions);
		p->ph = P_GROW_STATE;
		return;
	}
	km_prep_set_code(&p->t[0], res ? res->error_code : KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
		 "CreatePartitions on the destination failed: %s%s%.*s", km_err_name(res ? res->error_code : 3),
		 res && res->error_message.len > 0 ? ": " : "",
		 res && res->error_message.len > 0 ? (int)res->error_message.len : 0, res ? res->error_message.p : "");
	p->ph = P_DONE;
}

static void on_response(km_net_client *c, const km_rpc_response *r, void *arg);

/* req: the km_<name>_request of key, encoded by the API table. */
void km_prep_send_req(struct km_mprep *p, km_cluster *cl, km_net_client *c, int16_t key, int16_t ver, const void *req)
{
	rctx *x = calloc(1, sizeof(*x));
	km_err rc;

	if (!x) {
		rc = KM_ERR_NOMEM;
	} else {
		*x = (rctx){p, cl, p->ph};
		rc = km_rpc_call(c, key, ver, req, NULL, on_response, x);
	}
	if (rc == KM_OK) {
		p->inflight = true;
		return;
	}
	free(x);
	snprintf(p->why, sizeof(p->why), "sending to the %s failed: %s", km_cluster_side(cl), km_err_name(rc));
	km_cluster_drop(cl, c);
	km_prep_later(p, RETRY_MS);
}

/* Metadata of the topics that match want (missing ones for the source; the created ones for the leaders). */
void km_prep_send_metadata(struct km_mprep *p, km_cluster *cl, bool only_missing)
{
	km_net_client *c = km_prep_ready_client(p, cl);
	km_metadata_request m;
	km_metadata_request_topic *ts;
	int16_t ver;
	int32_t k = 0;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_METADATA, META_LO, META_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (!only_missing || p->t[i].missing)
				km_prep_set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION, "the %s cluster does not support Metadata v%d+",
					 km_cluster_side(cl), META_LO);
		p->ph = P_DONE;
		km_prep_later(p, 0);
		return;
	}
	if (!(ts = calloc(p->n, sizeof(*ts))))
		return km_prep_later(p, RETRY_MS);
	km_metadata_request_init(&m);
	for (size_t i = 0; i < p->n; i++) {
		if ((only_missing && !p->t[i].missing) || (only_missing && p->t[i].settled))
			continue;
		km_metadata_request_topic_init(&ts[k]);
		ts[k++].name = km_str_c(p->t[i].name);
	}
	m.topics.items = ts;
	m.topics.count = k;
	m.allow_auto_topic_creation = false;
	km_prep_send_req(p, cl, c, KM_API_METADATA, ver, &m);
	free(ts); /* encoded in the call */
}

ptopic *km_prep_topic_of(struct km_mprep *p, km_str name)
{
	for (size_t i = 0; i < p->n; i++)
		if (name.len >= 0 && strlen(p->t[i].name) == (size_t)name.len && !memcmp(p->t[i].name, name.p, (size_t)name.len))
			return &p->t[i];
	return NULL;
}

/* Topics still to create: missing on the destination and not answered yet. */
size_t km_prep_to_create(const struct km_mprep *p)
{
	size_t n = 0;
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].missing && !p->t[i].settled)
			n++;
	return n;
}

static void took_dst_meta(struct km_mprep *p, const km_metadata_response *r)
{
	if (p->grow) {
		const km_metadata_response_topic *mt = r->topics.count > 0 ? &r->topics.items[0] : NULL;
		if (!mt || mt->error_code) {
			km_prep_set_code(&p->t[0], mt ? mt->error_code : KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
				 "Metadata of topic %s on the destination failed: %s", p->t[0].name,
				 km_err_name(mt ? mt->error_code : KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION));
			p->ph = P_DONE;
			return;
		}
		p->dst_partitions = mt->partitions.count;
		p->ph = p->dst_partitions < p->t[0].partitions ? P_GROW_PARTS : P_GROW_STATE;
		return;
	}
	bool any = false;
	for (int32_t i = 0; i < r->topics.count; i++) {
		ptopic *t = km_prep_topic_of(p, r->topics.items[i].name);
		if (t && r->topics.items[i].error_code == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION)
			t->missing = true;
		else if (t && !r->topics.items[i].error_code && !t->settled)
			any |= km_prep_check_existing(p, t, &r->topics.items[i]);
		/* Any other outcome (an error of its own): the store's own check answers it. */
	}
	if (any) {
		if (km_cluster_brokers(p->dst, r) == KM_OK)
			p->nnodes = km_cluster_node_ids(p->dst, p->nodes, TXN_NODES_MAX);
		p->node_next = 0;
		p->node_since = km_wall_ms();
		p->ph = P_TXN_LIST;
		return;
	}
	p->ph = km_prep_to_create(p) ? P_SRC_META : P_DONE;
}

/* The source cluster's connections (made once, for the peer question and a creation's reads); false when the mirror's source is unusable (the topics named settled). */
bool km_prep_src_cluster(struct km_mprep *p, bool (*which)(const ptopic *))
{
	const km_state_mirror *m;
	char why[300] = "";

	if (p->src)
		return true;
	m = km_state_mirror_find(km_mirror_store(p->mi), p->mirror);
	if (m)
		p->src = km_mirror_source_cluster(p->mi, m, "topics", 16 << 20, &p->src_tls, km_prep_on_cluster, p, why, sizeof(why));
	if (p->src)
		return true;
	for (size_t i = 0; i < p->n; i++)
		if (which(&p->t[i]))
			km_prep_set_code(&p->t[i], m ? KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG : KM_MIRROR_UNKNOWN_CLUSTER_MIRROR,
				 m ? "The source of mirror '%s' is unusable: %s" : "Cluster mirror '%s' does not exist%s",
				 p->mirror, why);
	p->ph = P_DONE;
	km_prep_later(p, 0);
	return false;
}

static bool missing_one(const ptopic *t)
{
	return t->missing;
}


static void took_src_meta(struct km_mprep *p, const km_metadata_response *r)
{
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_metadata_response_topic *mt = &r->topics.items[i];
		ptopic *t = km_prep_topic_of(p, mt->name);
		if (!t || !t->missing || t->settled)
			continue;
		if (mt->error_code == KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION)
			km_prep_set_code(t, KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
				 "Topic %s exists neither on the destination cluster nor on the source cluster (%s) of "
				 "mirror '%s'",
				 t->name, p->src_boot, p->mirror);
		else if (mt->error_code)
			km_prep_set_code(t, mt->error_code, "Metadata of topic %s on the source cluster (%s) failed: %s", t->name,
				 p->src_boot, km_err_name(mt->error_code));
		else if (mt->partitions.count <= 0 || mt->partitions.count > 100000)
			km_prep_set_code(t, KM_KAFKA_INVALID_REQUEST, "Topic %s has %d partitions on the source", t->name,
				 (int)mt->partitions.count);
		else
			t->partitions = mt->partitions.count;
	}
	/* A topic the answer did not name is not known there either. */
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].missing && !p->t[i].settled && p->t[i].partitions <= 0)
			km_prep_set_code(&p->t[i], KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION,
				 "Topic %s exists neither on the destination cluster nor on the source cluster (%s) of "
				 "mirror '%s'",
				 p->t[i].name, p->src_boot, p->mirror);
	p->ph = km_prep_to_create(p) ? P_SRC_CFG : P_DONE;
}

static bool add_cfg(ptopic *t, const char *name, const char *value)
{
	pcfg *c;
	if (t->ncfg >= MAX_CONFIGS)
		return false;
	c = realloc(t->cfg, (t->ncfg + 1) * sizeof(*c));
	if (!c)
		return false;
	t->cfg = c;
	c[t->ncfg].name = strdup(name);
	c[t->ncfg].value = strdup(value);
	if (!c[t->ncfg].name || !c[t->ncfg].value) {
		free(c[t->ncfg].name);
		free(c[t->ncfg].value);
		return false;
	}
	t->ncfg++;
	return true;
}

static void took_src_cfg(struct km_mprep *p, const km_describe_configs_response *r)
{
	for (int32_t i = 0; i < r->results.count; i++) {
		const km_describe_configs_response_describe_configs_result *res = &r->results.items[i];
		ptopic *t = km_prep_topic_of(p, res->resource_name);
		if (!t || !t->missing || t->settled)
			continue;
		if (res->error_code) {
			km_prep_set_code(t, res->error_code, "DescribeConfigs of topic %s on the source cluster failed: %.*s", t->name,
				 res->error_message.len > 0 ? (int)res->error_message.len : 0, res->error_message.p);
			continue;
		}
		for (int32_t j = 0; j < res->configs.count; j++) {
			const km_describe_configs_response_describe_configs_resource_result *c = &res->configs.items[j];
			char name[256], value[4096];
			const char *v = value;
			if (c->name.len <= 0 || (size_t)c->name.len >= sizeof(name) || c->value.len < 0 ||
			    (size_t)c->value.len >= sizeof(value) || c->is_sensitive)
				continue;
			memcpy(name, c->name.p, (size_t)c->name.len);
			name[c->name.len] = 0;
			memcpy(value, c->value.p, (size_t)c->value.len);
			value[c->value.len] = 0;
			if (km_mirror_config_copied(name, c->config_source, &v) && !add_cfg(t, name, v))
				KM_WARN(COMP, 0, "%s: topic %s: config %s not copied (too many or out of memory)", p->mirror,
					t->name, name);
		}
	}
	p->ph = P_CREATE;
}

/* Drop the config the destination named in its refusal ("Unknown topic config name: x"); false if none is named. */
static bool drop_refused(struct km_mprep *p, ptopic *t, km_str msg)
{
	for (size_t j = 0; j < t->ncfg; j++) {
		size_t l = strlen(t->cfg[j].name);
		for (int32_t k = 0; msg.len > 0 && (size_t)msg.len >= l && k + (int32_t)l <= msg.len; k++) {
			char after = k + (int32_t)l < msg.len ? msg.p[k + l] : 0;
			char before = k ? msg.p[k - 1] : ' ';
			if (memcmp(msg.p + k, t->cfg[j].name, l) || (after && (after == '.' || after == '_' ||
									   (after >= 'a' && after <= 'z'))) ||
			    before == '.')
				continue;
			KM_WARN(COMP, 0, "%s: topic %s: the destination refuses config %s=%s (%.*s): created without it",
				p->mirror, t->name, t->cfg[j].name, t->cfg[j].value, (int)msg.len, msg.p);
			free(t->cfg[j].name);
			free(t->cfg[j].value);
			t->cfg[j] = t->cfg[--t->ncfg];
			return true;
		}
	}
	return false;
}

static void took_create(struct km_mprep *p, const km_create_topics_response *r)
{
	bool retry = false;
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_create_topics_response_creatable_topic_result *res = &r->topics.items[i];
		ptopic *t = km_prep_topic_of(p, res->name);
		if (!t || !t->missing || t->settled || !t->asked)
			continue;
		t->asked = false;
		if (res->error_code == 0 || res->error_code == K_TOPIC_ALREADY_EXISTS) {
			if (!res->error_code)
				KM_INFO(COMP, 0, "%s: created destination topic %s: %d partitions, %zu configs from the source",
					p->mirror, t->name, (int)t->partitions, t->ncfg);
			t->missing = false; /* now there: wait for its leaders */
			continue;
		}
		if (res->error_code == K_INVALID_CONFIG && p->create_tries < MAX_CREATE_TRIES &&
		    drop_refused(p, t, res->error_message)) {
			retry = true;
			continue;
		}
		km_prep_set_code(t, res->error_code, "Creating topic %s on the destination failed: %s%s%.*s", t->name,
			 km_err_name(res->error_code), res->error_message.len > 0 ? ": " : "",
			 res->error_message.len > 0 ? (int)res->error_message.len : 0, res->error_message.p);
	}
	if (retry)
		p->create_tries++;
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].asked) {
			p->t[i].asked = false;
			km_prep_set_code(&p->t[i], KM_MIRROR_STATE_UNAVAILABLE, "Creating topic %s: no answer for it", p->t[i].name);
		}
	if (km_prep_to_create(p))
		return; /* P_CREATE again: the next topics, or these without the refused config */
	p->ph = P_LEADERS;
}

/*
 * Whether every created topic has all its partitions led. A topic is settled (OK: the store takes
 * it) as soon as it is led, so that a start of thousands of topics that runs out of time refuses
 * only those still without leaders, not all. One pass over the answer: each topic looked up in
 * the whole answer would be quadratic in the topics per poll (topic_of is linear).
 */
static bool took_leaders(struct km_mprep *p, const km_metadata_response *r)
{
	bool all = true;
	for (int32_t k = 0; k < r->topics.count; k++) {
		const km_metadata_response_topic *mt = &r->topics.items[k];
		ptopic *t = km_prep_topic_of(p, mt->name);
		bool ok;
		if (!t || t->settled || t->partitions <= 0 || mt->error_code)
			continue;
		ok = mt->partitions.count >= t->partitions;
		for (int32_t j = 0; ok && j < mt->partitions.count; j++)
			if (mt->partitions.items[j].error_code || mt->partitions.items[j].leader_id < 0)
				ok = false;
		if (ok)
			km_prep_set_code(t, KM_OK, NULL);
	}
	for (size_t i = 0; i < p->n; i++)
		if (!p->t[i].settled && p->t[i].partitions > 0)
			all = false;
	return all;
}


/* r->msg is the response of the phase's request (ph): Metadata, DescribeConfigs, CreateTopics, Fetch or CreatePartitions. */
static void took_answer(struct km_mprep *p, phase ph, const km_rpc_response *r)
{
	switch (ph) {
	case P_DST_META:
		took_dst_meta(p, r->msg);
		break;
	case P_SRC_META:
		took_src_meta(p, r->msg);
		break;
	case P_LEADERS:
		if (!took_leaders(p, r->msg)) {
			km_prep_later(p, RETRY_MS); /* leaders not elected yet: ask again */
			return;
		}
		p->ph = P_DONE;
		break;
	case P_SRC_CFG:
		took_src_cfg(p, r->msg);
		break;
	case P_CREATE:
		took_create(p, r->msg);
		break;
	case P_LOOKUP_META:
	case P_LOOKUP_FETCH:
	case P_LOOKUP_SRC_META:
	case P_LOOKUP_SRC_LO:
		km_prep_lookup_took(p, ph, r);
		break;
	case P_GROW_PARTS:
		took_grow(p, r->msg);
		break;
	case P_TXN_LIST:
	case P_TXN_DESC:
	case P_DATA_META:
	case P_DATA_ENDS:
	case P_SRC_PEER:
		km_prep_later(p, km_prep_checks_took(p, ph, r));
		return;
	default:
		break;
	}
	km_prep_later(p, 0);
}

static void on_response(km_net_client *c, const km_rpc_response *r, void *arg)
{
	rctx *x = arg;
	struct km_mprep *p = x->p;
	phase ph = x->ph;
	km_cluster *cl = x->cl;

	free(x);
	if (p->finished)
		return;
	p->inflight = false;
	if (km_rpc_undecoded(r)) {
		snprintf(p->why, sizeof(p->why), "the %s cluster's answer could not be decoded", km_cluster_side(cl));
		km_prep_later(p, RETRY_MS);
		return;
	}
	if (r->err != KM_OK) {
		snprintf(p->why, sizeof(p->why), "a request to the %s cluster failed: %s", km_cluster_side(cl),
			 km_err_name(r->err));
		km_cluster_drop(cl, c);
		km_prep_later(p, RETRY_MS);
		return;
	}
	took_answer(p, ph, r);
}

static void send_describe(struct km_mprep *p)
{
	km_net_client *c = km_prep_ready_client(p, p->src);
	km_describe_configs_request m;
	km_describe_configs_request_describe_configs_resource *rs;
	int16_t ver;
	int32_t k = 0;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_DESCRIBE_CONFIGS, DC_LO, DC_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (p->t[i].missing)
				km_prep_set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION,
					 "the source cluster does not support DescribeConfigs v%d+", DC_LO);
		p->ph = P_DONE;
		return km_prep_later(p, 0);
	}
	if (!(rs = calloc(p->n, sizeof(*rs))))
		return km_prep_later(p, RETRY_MS);
	km_describe_configs_request_init(&m);
	for (size_t i = 0; i < p->n; i++) {
		if (!p->t[i].missing || p->t[i].settled)
			continue;
		km_describe_configs_request_describe_configs_resource_init(&rs[k]);
		rs[k].resource_type = K_RESOURCE_TOPIC;
		rs[k].resource_name = km_str_c(p->t[i].name);
		rs[k++].configuration_keys.count = -1; /* all */
	}
	m.resources.items = rs;
	m.resources.count = k;
	m.include_synonyms = false;
	m.include_documentation = false;
	km_prep_send_req(p, p->src, c, KM_API_DESCRIBE_CONFIGS, ver, &m);
	free(rs); /* encoded in the call */
}

static void send_create(struct km_mprep *p)
{
	km_net_client *c = km_prep_ready_client(p, p->dst);
	km_create_topics_request m;
	km_create_topics_request_creatable_topic *ts;
	km_create_topics_request_creatable_topic_config *cs = NULL;
	size_t ncs = 0;
	int16_t ver;
	int32_t k = 0;
	int64_t left = p->deadline - km_wall_ms(), records = 0;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_CREATE_TOPICS, CT_LO, CT_HI)) < 0) {
		for (size_t i = 0; i < p->n; i++)
			if (p->t[i].missing)
				km_prep_set_code(&p->t[i], KM_KAFKA_UNSUPPORTED_VERSION,
					 "the destination does not support CreateTopics v%d+ (Kafka 2.4)", CT_LO);
		p->ph = P_DONE;
		return km_prep_later(p, 0);
	}
	for (size_t i = 0; i < p->n; i++)
		if (p->t[i].missing && !p->t[i].settled)
			ncs += p->t[i].ncfg + 1;
	ts = calloc(p->n, sizeof(*ts));
	cs = calloc(ncs ? ncs : 1, sizeof(*cs));
	if (!ts || !cs) {
		free(ts);
		free(cs);
		return km_prep_later(p, RETRY_MS);
	}
	km_create_topics_request_init(&m);
	ncs = 0;
	for (size_t i = 0; i < p->n; i++) {
		ptopic *t = &p->t[i];
		size_t first = ncs;
		int64_t cost = 2 + (int64_t)t->partitions + (int64_t)t->ncfg;
		if (!t->missing || t->settled)
			continue;
		if (k > 0 && records + cost > CREATE_RECORDS_MAX)
			break; /* the next request takes it */
		records += cost;
		t->asked = true;
		km_create_topics_request_creatable_topic_init(&ts[k]);
		ts[k].name = km_str_c(t->name);
		ts[k].num_partitions = t->partitions;
		ts[k].replication_factor = -1; /* the destination's default.replication.factor */
		ts[k].assignments.count = 0;
		for (size_t j = 0; j < t->ncfg; j++) {
			km_create_topics_request_creatable_topic_config_init(&cs[ncs]);
			cs[ncs].name = km_str_c(t->cfg[j].name);
			cs[ncs++].value = km_str_c(t->cfg[j].value);
		}
		/* The broker stores the source's compressed batches as they are only with "producer". */
		km_create_topics_request_creatable_topic_config_init(&cs[ncs]);
		cs[ncs].name = km_str_c("compression.type");
		cs[ncs++].value = km_str_c("producer");
		ts[k].configs.items = &cs[first];
		ts[k].configs.count = (int32_t)(ncs - first);
		k++;
	}
	m.topics.items = ts;
	m.topics.count = k;
	m.timeout_ms = left > 1000 ? (int32_t)(left - 500) : 500;
	m.validate_only = false;
	km_prep_send_req(p, p->dst, c, KM_API_CREATE_TOPICS, ver, &m);
	free(ts); /* encoded in the call */
	free(cs);
}

static void send_grow(struct km_mprep *p)
{
	km_net_client *c = km_prep_ready_client(p, p->dst);
	km_create_partitions_request m;
	km_create_partitions_request_create_partitions_topic t;
	int64_t left = p->deadline - km_wall_ms();
	int16_t ver;

	if (!c)
		return;
	if ((ver = km_net_version_pick(c, KM_API_CREATE_PARTITIONS, CP_LO, CP_HI)) < 0) {
		km_prep_set_code(&p->t[0], KM_KAFKA_UNSUPPORTED_VERSION, "the destination does not support CreatePartitions");
		p->ph = P_DONE;
		return km_prep_later(p, 0);
	}
	km_create_partitions_request_init(&m);
	km_create_partitions_request_create_partitions_topic_init(&t);
	t.name = km_str_c(p->t[0].name);
	t.count = p->t[0].partitions;
	t.assignments.count = -1; /* the destination places them */
	m.topics.items = &t;
	m.topics.count = 1;
	m.timeout_ms = left > 1000 ? (int32_t)(left - 500) : 500;
	km_prep_send_req(p, p->dst, c, KM_API_CREATE_PARTITIONS, ver, &m);
}

static void grow_done(void *arg, const km_state_result *res)
{
	struct km_mprep *p = arg;
	if (p->finished) {
		km_prep_free(p); /* shut down while the store held it (km_mirror_topics_shutdown) */
		return;
	}
	p->inflight = false;
	if (res->code)
		km_prep_set_code(&p->t[0], res->code, "%s", res->message ? res->message : km_err_message(res->code));
	p->ph = P_DONE;
	km_prep_later(p, 0);
}

static void timed_out(struct km_mprep *p)
{
	static const char *const doing[P_DONE + 1] = {
		[P_DST_META] = "reading the destination's metadata",
		[P_SRC_META] = "reading the source's metadata",
		[P_SRC_CFG] = "reading the source topic's configs",
		[P_CREATE] = "creating the destination topic",
		[P_LEADERS] = "waiting for the new topic's leaders",
		[P_GROW_PARTS] = "adding partitions on the destination",
		[P_GROW_STATE] = "adding the partitions to the state store",
		[P_LOOKUP_META] = "reading the destination's metadata",
		[P_LOOKUP_FETCH] = "searching the destination partition",
		[P_LOOKUP_SRC_META] = "reading the source's metadata",
		[P_LOOKUP_SRC_LO] = "asking the source",
		[P_TXN_LIST] = "listing the destination's open transactions",
		[P_TXN_DESC] = "describing the destination's open transactions",
		[P_DATA_META] = "reading the destination's metadata",
		[P_DATA_ENDS] = "reading the destination topic's offsets",
		[P_SRC_PEER] = "asking the source's kmirrord whether the start is a failback",
		[P_DONE] = "",
	};
	for (size_t i = 0; i < p->n; i++)
		if (!p->t[i].settled &&
		    (p->ph != P_DST_META ? p->t[i].partitions > 0 || p->t[i].missing || p->t[i].txn_check : true))
			km_prep_set_code(&p->t[i], K_REQUEST_TIMED_OUT, "Preparing topic %s timed out after %d ms while %s%s%s",
				 p->t[i].name, p->lq ? LOOKUP_TIMEOUT_MS : PREP_TIMEOUT_MS, doing[p->ph], p->why[0] ? ": " : "",
				 p->why);
}

static void advance(struct km_mprep *p)
{
	if (p->finished || (p->ph == P_GROW_STATE && p->inflight))
		return; /* the store holds p until it answers (it answers even while it is freed) */
	if (p->ph != P_DONE && km_wall_ms() >= p->deadline) {
		timed_out(p);
		p->ph = P_DONE;
	}
	if (p->inflight && p->ph != P_DONE) {
		km_prep_later(p, RETRY_MS); /* the deadline still counts while a request is out */
		return;
	}
	switch (p->ph) {
	case P_DST_META:
		km_prep_send_metadata(p, p->dst, false);
		return;
	case P_SRC_META:
		if (km_prep_src_cluster(p, missing_one))
			km_prep_send_metadata(p, p->src, true);
		return;
	case P_SRC_CFG:
		send_describe(p);
		return;
	case P_CREATE:
		send_create(p);
		return;
	case P_LEADERS: {
		bool any = false;
		for (size_t i = 0; i < p->n; i++)
			any = any || (!p->t[i].settled && p->t[i].partitions > 0);
		if (!any) {
			p->ph = P_DONE;
			km_prep_later(p, 0);
			return;
		}
		km_prep_send_metadata(p, p->dst, false);
		return;
	}
	case P_GROW_PARTS:
		send_grow(p);
		return;
	case P_LOOKUP_META:
	case P_LOOKUP_FETCH:
	case P_LOOKUP_SRC_META:
	case P_LOOKUP_SRC_LO:
		km_prep_lookup_send(p);
		return;
	case P_TXN_LIST:
	case P_TXN_DESC:
	case P_DATA_META:
	case P_DATA_ENDS:
	case P_SRC_PEER:
		km_prep_checks_send(p);
		return;
	case P_GROW_STATE:
		/* The store answers once the records are in; it holds p until then (p->inflight). */
		p->inflight = true;
		km_state_topic_add_partitions(km_mirror_store(p->mi), p->mirror, p->t[0].name, p->t[0].partitions,
					      grow_done, p);
		return;
	case P_DONE:
		answer(p);
		return;
	}
}

void km_mirror_prepare_start(km_mirror *mi, const char *mirror, const char *const *topics, size_t n, bool adopt,
			     km_mirror_prepare_cb cb, void *arg)
{
	struct km_mprep *p = calloc(1, sizeof(*p));
	const km_state_mirror *m;

	if (!p || n > MAX_TOPICS || !(p->t = calloc(n ? n : 1, sizeof(*p->t))) || !(p->mirror = strdup(mirror)))
		goto nomem;
	p->mi = mi;
	p->cb = cb;
	p->arg = arg;
	p->adopt = adopt;
	p->deadline = km_wall_ms() + PREP_TIMEOUT_MS;
	for (size_t i = 0; i < n; i++) {
		if (!(p->t[i].name = strdup(topics[i])))
			goto nomem;
		/* Never created, whatever the clusters hold: the store refuses the name itself. */
		p->t[i].settled = km_mirror_store(mi) && km_state_topic_internal(km_mirror_store(mi), topics[i]);
		p->n++;
	}
	if (!(p->ev = event_new(km_mirror_base(mi), -1, 0, km_prep_on_ev, p)))
		goto nomem;
	p->next = *km_mirror_prep_list(mi);
	*km_mirror_prep_list(mi) = p;
	m = km_mirror_store(mi) ? km_state_mirror_find(km_mirror_store(mi), mirror) : NULL;
	if (!m) {
		/* Nothing to create for a mirror that does not exist: the store answers UNKNOWN_CLUSTER_MIRROR. */
		p->ph = P_DONE;
	} else {
		snprintf(p->src_boot, sizeof(p->src_boot), "%s", km_state_mirror_source(m));
		p->dst = km_mirror_dest_cluster(mi, mirror, "topics", km_prep_on_cluster, p);
		if (!p->dst)
			p->ph = P_DONE;
	}
	km_prep_later(p, 0); /* never answer from inside the call */
	return;
nomem:
	if (p)
		km_prep_free(p);
	cb(arg, KM_MIRROR_STATE_UNAVAILABLE, "out of memory", NULL, 0);
}

void km_mirror_grow(km_mirror *mi, const char *mirror, const char *topic, int32_t source_partitions)
{
	km_state *st = km_mirror_store(mi);
	const km_state_topic *t = st ? km_state_topic_find(st, topic, strlen(topic)) : NULL;
	struct km_mprep *p;

	if (!t || strcmp(km_state_mirror_name(km_state_topic_mirror(t)), mirror) || source_partitions <= 0 ||
	    source_partitions > 100000 || km_state_topic_partition_count(t) >= (size_t)source_partitions)
		return; /* not ours, or the store holds them all: nothing to do */
	for (p = *km_mirror_prep_list(mi); p; p = p->next)
		if (p->grow && !strcmp(p->mirror, mirror) && !strcmp(p->t[0].name, topic) &&
		    p->t[0].partitions >= source_partitions)
			return; /* one is on its way */
	if (!(p = calloc(1, sizeof(*p))) || !(p->t = calloc(1, sizeof(*p->t))) || !(p->mirror = strdup(mirror)) ||
	    !(p->t[0].name = strdup(topic)) || !(p->ev = event_new(km_mirror_base(mi), -1, 0, km_prep_on_ev, p)) ||
	    !(p->dst = km_mirror_dest_cluster(mi, mirror, "topics", km_prep_on_cluster, p))) {
		if (p) {
			p->n = p->t && p->t[0].name ? 1 : 0;
			km_prep_free(p);
		}
		KM_ERROR(COMP, 0, "%s: out of memory growing topic %s", mirror, topic);
		return;
	}
	p->n = 1;
	p->mi = mi;
	p->grow = true;
	p->t[0].partitions = source_partitions;
	p->t[0].missing = true;
	p->deadline = km_wall_ms() + PREP_TIMEOUT_MS;
	p->next = *km_mirror_prep_list(mi);
	*km_mirror_prep_list(mi) = p;
	KM_INFO(COMP, 0, "%s: the source topic %s has %d partitions, the mirror %zu: adding the new ones", mirror, topic,
		(int)source_partitions, km_state_topic_partition_count(t));
	km_prep_later(p, 0);
}

void km_mirror_topics_shutdown(km_mirror *mi)
{
	struct km_mprep **head = km_mirror_prep_list(mi);
	while (*head) {
		struct km_mprep *p = *head;
		for (size_t i = 0; i < p->n; i++)
			km_prep_set_code(&p->t[i], KM_MIRROR_STATE_UNAVAILABLE, "kmirrord is shutting down");
		if (p->ph == P_GROW_STATE && p->inflight) {
			/*
			 * The store holds p until it answers, which it does even while it is freed: grow_done
			 * frees p then. Freed here, that answer would land on freed memory.
			 */
			unlink_prep(p);
			p->finished = true;
			continue;
		}
		answer(p); /* unlinks p */
	}
}
