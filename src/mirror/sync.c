/* Metadata sync: topic configs, partitions, consumer group offsets and ACLs follow the source (docs/mirror.md, "Metadata sync"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/api.h"
#include "kmirror/arena.h"
#include "kmirror/log.h"
#include "kmirror/msg/alter_share_group_offsets_request.h"
#include "kmirror/msg/alter_share_group_offsets_response.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/create_acls_request.h"
#include "kmirror/msg/create_acls_response.h"
#include "kmirror/msg/delete_acls_request.h"
#include "kmirror/msg/delete_acls_response.h"
#include "kmirror/msg/describe_acls_request.h"
#include "kmirror/msg/describe_acls_response.h"
#include "kmirror/msg/describe_configs_request.h"
#include "kmirror/msg/describe_configs_response.h"
#include "kmirror/msg/describe_share_group_offsets_request.h"
#include "kmirror/msg/describe_share_group_offsets_response.h"
#include "kmirror/msg/find_coordinator_request.h"
#include "kmirror/msg/find_coordinator_response.h"
#include "kmirror/msg/incremental_alter_configs_request.h"
#include "kmirror/msg/incremental_alter_configs_response.h"
#include "kmirror/msg/list_groups_request.h"
#include "kmirror/msg/list_groups_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"
#include "kmirror/msg/offset_commit_request.h"
#include "kmirror/msg/offset_commit_response.h"
#include "kmirror/msg/offset_fetch_request.h"
#include "kmirror/msg/offset_fetch_response.h"
#include "mirror_int.h"

#define COMP KM_MIRROR_COMP

/* The module looks at its mirrors this often (a cycle starts when one is due). */
#define TICK_MS 1000
/* A step waits this long at most for the brokers it needs (connections, answers). */
#define STEP_TIMEOUT_MS 20000
/* Wire values (Kafka's): resource TOPIC for configs, ANY for ACL filters, pattern/operation/permission ANY. */
enum { K_RES_TOPIC = 2, K_ANY = 1, K_PATTERN_ANY = 1, K_DYNAMIC_TOPIC_CONFIG = 1 };
enum { K_OP_SET = 0, K_OP_DELETE = 1 };
enum { K_SECURITY_DISABLED = 54, K_GROUP_ID_NOT_FOUND = 69, K_GROUP_COORDINATOR_KEY = 0 };
/*
 * Versions: Metadata v1+ (topic errors by name), DescribeConfigs v1+ (config source),
 * IncrementalAlterConfigs v0+, ListGroups v4+ (group states; v5 adds types), FindCoordinator v4+ (many
 * keys, Kafka 3.0), OffsetFetch v8-9 (many groups, topics by name), OffsetCommit v2-9 (topics by name),
 * DescribeAcls / CreateAcls / DeleteAcls v1+ (pattern types).
 */
enum {
	META_LO = 1, META_HI = 12, DC_LO = 1, DC_HI = 4, IAC_LO = 0, IAC_HI = 1, LG_LO = 4, LG_HI = 5, FC_LO = 4,
	FC_HI = 6, OF_LO = 8, OF_HI = 9, OC_LO = 2, OC_HI = 9, ACL_LO = 1, ACL_HI = 3, DSO_LO = 0, DSO_HI = 1,
	ASO_LO = 0, ASO_HI = 0,
};

/* One step's status, owned here (km_sync_status is its read view). */
typedef struct sstat {
	int64_t last_sync_ms, compared, changes_last, changes_total, skipped, errors_total, last_error_ms;
	char *last_error;
	km_metric_series *m_runs_ok, *m_runs_err, *m_changes, *m_last;
} sstat;

typedef struct sync_cycle sync_cycle;

/* One mirror's sync. */
typedef struct msync {
	struct msync *next;
	struct km_sync *s;
	char *mirror;
	sstat st[KM_SYNC__COUNT];
	bool owner;
	int64_t next_ms;      /* when the next cycle is due */
	sync_cycle *cy;       /* the cycle in progress, NULL: none */
	char **warned;        /* topics warned about unclean.leader.election.enable */
	size_t nwarned;
	char **skipping;      /* groups skipped in the last cycle (one log line when that changes) */
	size_t nskipping;
	km_metric_series *m_skipped;
	bool seen;            /* still in the store (a tick's sweep) */
} msync;

struct km_sync {
	km_mirror *mi;
	msync *head;
	struct event *tick;
	km_lease *lease;
	km_metric_family *f_runs, *f_changes, *f_last, *f_skipped;
	bool freeing;
};

/* ---- a cycle's data (in its arena) ---- */

typedef struct kv {
	const char *name, *value;
} kv;

typedef struct stopic {
	const char *name;
	int32_t store_parts, src_parts;
	bool cfg_src, cfg_dst; /* DescribeConfigs answered for it on that side */
	kv *want;              /* the source's values to have */
	size_t nwant;
	kv *have;              /* set on the destination topic */
	size_t nhave;
	bool unclean;
	km_incremental_alter_configs_request_alterable_config *chg; /* what its IncrementalAlterConfigs changes */
	int32_t nchange;
} stopic;

typedef struct soff {
	int32_t topic, partition;
	int64_t offset;
	const char *meta;
} soff;

typedef struct sgroup {
	const char *name;
	bool share; /* a share group (KIP-932): start offsets, physical on the destination */
	bool skip, src_ok, dst_ok, commit_failed;
	int32_t src_coord, dst_coord;
	soff *src, *dst;
	size_t nsrc, ndst;
	size_t ncommit; /* offsets in its commit */
} sgroup;

typedef struct sacl {
	int8_t rtype, pattern, op, perm;
	const char *rname, *principal, *host;
} sacl;

typedef enum {
	PH_META, PH_CFG, PH_ALTER, PH_GROUPS, PH_COORD, PH_OFFSETS, PH_COMMIT, PH_ACLS, PH_ACLS_CHANGE, PH_END
} sphase;

/* A request of the phase: to a broker of a cluster (node -1: any), for item arg. */
typedef struct sreq {
	km_mcluster *cl;
	int32_t node;
	int16_t key, lo, hi;
	size_t arg;
	bool sent, done;
	bool optional; /* a broker without the API: skipped, not an error (share groups) */
} sreq;

struct sync_cycle {
	msync *m;
	km_arena a;
	km_mcluster *src, *dst;
	SSL_CTX *src_tls;
	char src_boot[256];
	km_name_filter *groups;
	km_acl_scope *acls;
	sphase ph;
	km_sync_kind step;     /* the step the phase belongs to */
	bool step_failed;
	int64_t deadline;
	struct event *ev;
	bool finished;
	sreq *rq;             /* the phase's requests */
	size_t nrq, caprq;
	char why[400];
	stopic *t;
	size_t nt;
	int32_t *src_nodes, *dst_nodes;
	size_t nsrc_nodes, ndst_nodes;
	sgroup *g;
	size_t ng, capg;
	char **dst_active; /* groups with members on the destination */
	size_t nactive, capactive;
	sacl *sa, *da;     /* in-scope bindings: source, destination */
	size_t nsa, nda, capsa, capda;
	sacl **create, **delete;
	size_t ncreate, ndelete;
	int64_t changes, compared;
};

static int64_t now_ms(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

const char *km_sync_kind_name(km_sync_kind k)
{
	static const char *const names[KM_SYNC__COUNT] = {"configs", "partitions", "groups", "acls"};
	return (unsigned)k < KM_SYNC__COUNT ? names[k] : "?";
}

static const char *adup(km_arena *a, km_str s)
{
	char *p;
	if (s.len < 0)
		return NULL;
	if ((p = km_arena_alloc(a, (size_t)s.len + 1))) {
		memcpy(p, s.p, (size_t)s.len);
		p[s.len] = 0;
	}
	return p;
}

/* Room for one more element in an arena array (grown by doubling; the old copy stays in the arena). */
static void *agrow(km_arena *a, void *arr, size_t n, size_t *cap, size_t size)
{
	void *na;
	if (n < *cap)
		return arr;
	*cap = *cap ? *cap * 2 : 16;
	if (!(na = km_arena_alloc(a, *cap * size)))
		return NULL;
	if (n)
		memcpy(na, arr, n * size);
	return na;
}

static bool in_list(char **l, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(l[i], s))
			return true;
	return false;
}

static bool list_add(char ***l, size_t *n, const char *s)
{
	char **nl = realloc(*l, (*n + 1) * sizeof(**l));
	if (!nl)
		return false;
	*l = nl;
	if (!(nl[*n] = strdup(s)))
		return false;
	(*n)++;
	return true;
}

static void list_free(char **l, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(l[i]);
	free(l);
}

/* ---- status ---- */

/* Metric series are NULL without a registry. */
static void m_inc(km_metric_series *s, uint64_t n)
{
	if (s)
		km_metric_inc(s, n);
}

static void m_set(km_metric_series *s, int64_t v)
{
	if (s)
		km_metric_set(s, v);
}


static void step_error(sync_cycle *cy, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void step_error(sync_cycle *cy, const char *fmt, ...)
{
	sstat *st = &cy->m->st[cy->step];
	char buf[600];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (!cy->step_failed) {
		st->errors_total++;
		m_inc(st->m_runs_err, 1);
	}
	cy->step_failed = true;
	/* The same error cycle after cycle is logged once (describe and the metrics count every one). */
	if (st->last_error && !strcmp(st->last_error, buf))
		KM_DEBUG(COMP, 0, "%s: metadata sync (%s): %s", cy->m->mirror, km_sync_kind_name(cy->step), buf);
	else
		KM_WARN(COMP, 0, "%s: metadata sync (%s): %s", cy->m->mirror, km_sync_kind_name(cy->step), buf);
	free(st->last_error);
	st->last_error = strdup(buf);
	st->last_error_ms = now_ms();
}

/* The step is over (ok or not): its figures, and the next step's start. */
static void step_end(sync_cycle *cy, km_sync_kind next)
{
	sstat *st = &cy->m->st[cy->step];

	st->changes_last = cy->changes;
	st->changes_total += cy->changes;
	m_inc(st->m_changes, (uint64_t)cy->changes);
	if (!cy->step_failed) {
		st->last_sync_ms = now_ms();
		st->compared = cy->compared;
		m_inc(st->m_runs_ok, 1);
		m_set(st->m_last, st->last_sync_ms / 1000);
	}
	cy->step = next;
	cy->step_failed = false;
	cy->changes = cy->compared = 0;
	cy->deadline = now_ms() + STEP_TIMEOUT_MS;
}

/* ---- requests ---- */

static void advance(sync_cycle *cy);

static void on_ev(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	advance(arg);
}

static void later(sync_cycle *cy, int ms)
{
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	if (!cy->finished)
		event_add(cy->ev, &tv);
}

static void on_cluster(void *arg)
{
	later(arg, 0);
}

static sreq *add_req(sync_cycle *cy, km_mcluster *cl, int32_t node, int16_t key, int16_t lo, int16_t hi, size_t arg)
{
	sreq *n = agrow(&cy->a, cy->rq, cy->nrq, &cy->caprq, sizeof(*n));
	if (!n)
		return NULL;
	cy->rq = n;
	n[cy->nrq] = (sreq){cl, node, key, lo, hi, arg, false, false, false};
	return &n[cy->nrq++];
}

typedef struct rctx {
	sync_cycle *cy;
	size_t i;
	int16_t ver;
} rctx;

static void take(sync_cycle *cy, sreq *rq, int16_t ver, km_rd *rd, km_arena *a);
static bool encode(sync_cycle *cy, sreq *rq, int16_t ver, km_wr *w);

static const char *api_name(int16_t key)
{
	const km_api_info *a = km_api_lookup(key);
	return a ? a->name : "?";
}

static const char *side(const sync_cycle *cy, const km_mcluster *cl)
{
	return cl == cy->src ? "source" : "destination";
}

static void on_response(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	rctx *x = arg;
	sync_cycle *cy = x->cy;
	sreq *rq;
	km_arena a;
	km_rd rd;

	if (cy->finished || x->i >= cy->nrq) {
		free(x);
		return;
	}
	rq = &cy->rq[x->i];
	rq->done = true;
	if (err != KM_OK) {
		step_error(cy, "a request to the %s failed: %s", side(cy, rq->cl), km_err_name(err));
		km_mcluster_drop(rq->cl, c);
	} else {
		km_arena_init(&a, 0);
		km_rd_init(&rd, body, len);
		take(cy, rq, x->ver, &rd, &a);
		km_arena_free(&a);
	}
	free(x);
	later(cy, 0);
}

/* Send every request of the phase that can go now; true when all are answered. */
static bool pump(sync_cycle *cy)
{
	bool all = true;

	for (size_t i = 0; i < cy->nrq; i++) {
		sreq *rq = &cy->rq[i];
		km_net_client *c;
		int16_t ver;
		km_wr w;
		rctx *x;

		if (rq->done)
			continue;
		all = false;
		if (rq->sent)
			continue;
		c = rq->node < 0 ? km_mcluster_any(rq->cl) : km_mcluster_node(rq->cl, rq->node);
		if (!km_mcluster_usable(rq->cl, c)) {
			const char *r = km_mcluster_last_error(rq->cl);
			snprintf(cy->why, sizeof(cy->why), "the %s%s%s%s cannot be reached%s%s", side(cy, rq->cl),
				 rq->cl == cy->src ? " (" : "", rq->cl == cy->src ? cy->src_boot : "",
				 rq->cl == cy->src ? ")" : "", *r ? ": " : "", r);
			continue;
		}
		ver = km_net_client_version(c, rq->key);
		if (ver < rq->lo && rq->optional) {
			rq->done = true;
			continue;
		}
		if (ver < rq->lo) {
			rq->done = true;
			step_error(cy, "the %s does not support %s v%d or later (it has v%d)", side(cy, rq->cl),
				   api_name(rq->key), rq->lo, ver);
			continue;
		}
		if (ver > rq->hi)
			ver = rq->hi;
		km_wr_init(&w);
		if (!encode(cy, rq, ver, &w) || !km_wr_ok(&w) || !(x = malloc(sizeof(*x)))) {
			km_wr_free(&w);
			rq->done = true;
			step_error(cy, "out of memory");
			continue;
		}
		*x = (rctx){cy, i, ver};
		if (km_mcluster_send(c, rq->key, ver, &w, on_response, x) != KM_OK) {
			free(x);
			km_mcluster_drop(rq->cl, c);
			continue;
		}
		rq->sent = true;
	}
	return all;
}

/* ---- encoders ---- */

static bool enc_metadata(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_metadata_request m;
	km_metadata_request_topic *ts = km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*ts));

	if (!ts)
		return false;
	km_metadata_request_init(&m);
	for (size_t i = 0; i < cy->nt; i++) {
		km_metadata_request_topic_init(&ts[i]);
		ts[i].name = km_str_c(cy->t[i].name);
	}
	m.topics.items = ts;
	m.topics.count = (int32_t)cy->nt;
	m.allow_auto_topic_creation = false;
	km_metadata_request_encode(w, ver, &m);
	return true;
}

static bool enc_describe_configs(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_describe_configs_request m;
	km_describe_configs_request_describe_configs_resource *rs =
		km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*rs));

	if (!rs)
		return false;
	km_describe_configs_request_init(&m);
	for (size_t i = 0; i < cy->nt; i++) {
		km_describe_configs_request_describe_configs_resource_init(&rs[i]);
		rs[i].resource_type = K_RES_TOPIC;
		rs[i].resource_name = km_str_c(cy->t[i].name);
		rs[i].configuration_keys.count = -1;
	}
	m.resources.items = rs;
	m.resources.count = (int32_t)cy->nt;
	km_describe_configs_request_encode(w, ver, &m);
	return true;
}

static const char *kv_get(const kv *l, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(l[i].name, name))
			return l[i].value ? l[i].value : "";
	return NULL;
}

/* Whether a destination topic config is the sync's to remove when the source does not set it. */
static bool ours_to_delete(const char *name)
{
	const char *v = "x";
	return km_mirror_config_copied(name, K_DYNAMIC_TOPIC_CONFIG, &v);
}

/*
 * What the destination topic must change: SET every wanted value it does not have, DELETE every value
 * set on it that the source does not set and that is the sync's (not on the never-copied list).
 * Logged here, one line per change; false: no memory.
 */
static bool plan_configs(sync_cycle *cy, stopic *t)
{
	km_incremental_alter_configs_request_alterable_config *cs;
	int32_t nc = 0;

	if (!t->cfg_src || !t->cfg_dst)
		return true;
	if (!(cs = km_arena_calloc(&cy->a, (t->nwant + t->nhave + 1) * sizeof(*cs))))
		return false;
	for (size_t j = 0; j < t->nwant; j++) {
		const char *have = kv_get(t->have, t->nhave, t->want[j].name);
		if (have && !strcmp(have, t->want[j].value))
			continue;
		km_incremental_alter_configs_request_alterable_config_init(&cs[nc]);
		cs[nc].name = km_str_c(t->want[j].name);
		cs[nc].config_operation = K_OP_SET;
		cs[nc++].value = km_str_c(t->want[j].value);
		KM_INFO(COMP, 0, "%s: topic %s: %s=%s on the destination (was %s)", cy->m->mirror, t->name,
			t->want[j].name, t->want[j].value, have ? have : "its default");
	}
	for (size_t j = 0; j < t->nhave; j++) {
		if (kv_get(t->want, t->nwant, t->have[j].name) || !ours_to_delete(t->have[j].name))
			continue;
		km_incremental_alter_configs_request_alterable_config_init(&cs[nc]);
		cs[nc].name = km_str_c(t->have[j].name);
		cs[nc].config_operation = K_OP_DELETE;
		cs[nc++].value = KM_STR_NULL;
		KM_INFO(COMP, 0, "%s: topic %s: %s removed on the destination (was %s; the source does not set it)",
			cy->m->mirror, t->name, t->have[j].name, t->have[j].value ? t->have[j].value : "");
	}
	t->chg = cs;
	t->nchange = nc;
	return true;
}

/* One IncrementalAlterConfigs for every topic with changes. */
static bool enc_alter(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_incremental_alter_configs_request m;
	km_incremental_alter_configs_request_alter_configs_resource *rs =
		km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*rs));
	int32_t k = 0;

	if (!rs)
		return false;
	km_incremental_alter_configs_request_init(&m);
	for (size_t i = 0; i < cy->nt; i++) {
		stopic *t = &cy->t[i];
		if (!t->nchange)
			continue;
		km_incremental_alter_configs_request_alter_configs_resource_init(&rs[k]);
		rs[k].resource_type = K_RES_TOPIC;
		rs[k].resource_name = km_str_c(t->name);
		rs[k].configs.items = t->chg;
		rs[k++].configs.count = t->nchange;
	}
	m.resources.items = rs;
	m.resources.count = k;
	km_incremental_alter_configs_request_encode(w, ver, &m);
	return true;
}

static bool enc_list_groups(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_list_groups_request m;
	(void)cy;
	(void)ver;
	km_list_groups_request_init(&m);
	km_list_groups_request_encode(w, ver, &m);
	return true;
}

/* FindCoordinator of every group to sync (rq->arg 0: all of them). */
static bool enc_find_coordinator(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_find_coordinator_request m;
	km_str *keys = km_arena_calloc(&cy->a, (cy->ng ? cy->ng : 1) * sizeof(*keys));
	int32_t k = 0;

	if (!keys)
		return false;
	km_find_coordinator_request_init(&m);
	for (size_t i = 0; i < cy->ng; i++)
		keys[k++] = km_str_c(cy->g[i].name);
	m.key_type = K_GROUP_COORDINATOR_KEY;
	m.coordinator_keys.items = keys;
	m.coordinator_keys.count = k;
	km_find_coordinator_request_encode(w, ver, &m);
	return true;
}

/* OffsetFetch (every topic) of the groups whose coordinator on that side is the request's broker. */
static bool enc_offset_fetch(sync_cycle *cy, sreq *rq, int16_t ver, km_wr *w)
{
	km_offset_fetch_request m;
	km_offset_fetch_request_group *gs = km_arena_calloc(&cy->a, (cy->ng ? cy->ng : 1) * sizeof(*gs));
	bool src = rq->cl == cy->src;
	int32_t k = 0;

	if (!gs)
		return false;
	km_offset_fetch_request_init(&m);
	for (size_t i = 0; i < cy->ng; i++) {
		sgroup *g = &cy->g[i];
		/* A skipped group's source offsets are read too: they say whether it concerns this mirror. */
		if (g->share || (!src && g->skip) || (src ? g->src_coord : g->dst_coord) != rq->node)
			continue;
		km_offset_fetch_request_group_init(&gs[k]);
		gs[k].group_id = km_str_c(g->name);
		gs[k].member_id = KM_STR_NULL;
		gs[k].member_epoch = -1;
		gs[k++].topics.count = -1; /* all */
	}
	m.groups.items = gs;
	m.groups.count = k;
	m.require_stable = false;
	km_offset_fetch_request_encode(w, ver, &m);
	return true;
}

/* DescribeShareGroupOffsets (every topic) of the share groups coordinated by the request's broker. */
static bool enc_share_describe(sync_cycle *cy, sreq *rq, int16_t ver, km_wr *w)
{
	km_describe_share_group_offsets_request m;
	km_describe_share_group_offsets_request_group *gs = km_arena_calloc(&cy->a, (cy->ng ? cy->ng : 1) * sizeof(*gs));
	bool src = rq->cl == cy->src;
	int32_t k = 0;

	(void)ver;
	if (!gs)
		return false;
	km_describe_share_group_offsets_request_init(&m);
	for (size_t i = 0; i < cy->ng; i++) {
		sgroup *g = &cy->g[i];
		if (!g->share || (!src && g->skip) || (src ? g->src_coord : g->dst_coord) != rq->node)
			continue;
		km_describe_share_group_offsets_request_group_init(&gs[k]);
		gs[k].group_id = km_str_c(g->name);
		gs[k++].topics.count = -1;
	}
	m.groups.items = gs;
	m.groups.count = k;
	km_describe_share_group_offsets_request_encode(w, ver, &m);
	return true;
}

/* Whether the group's offset for (topic, partition) on the destination is already o's. */
static bool dst_has(const sgroup *g, const soff *o)
{
	for (size_t d = 0; d < g->ndst; d++)
		if (g->dst[d].topic == o->topic && g->dst[d].partition == o->partition && g->dst[d].offset == o->offset)
			return true;
	return false;
}

/* The share group's start offsets (physical already) that differ, as one AlterShareGroupOffsets. */
static bool enc_share_alter(sync_cycle *cy, sreq *rq, int16_t ver, km_wr *w)
{
	sgroup *g = &cy->g[rq->arg];
	km_alter_share_group_offsets_request m;
	km_alter_share_group_offsets_request_topic *ts = km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*ts));
	int32_t nt = 0;

	if (!ts)
		return false;
	g->ncommit = 0; /* encoded again when a send failed */
	km_alter_share_group_offsets_request_init(&m);
	m.group_id = km_str_c(g->name);
	for (size_t ti = 0; ti < cy->nt; ti++) {
		km_alter_share_group_offsets_request_partition *ps = NULL;
		int32_t np = 0;
		for (size_t j = 0; j < g->nsrc; j++) {
			const soff *o = &g->src[j];
			if (o->topic != (int32_t)ti || dst_has(g, o))
				continue;
			if (!ps && !(ps = km_arena_calloc(&cy->a, g->nsrc * sizeof(*ps))))
				return false;
			km_alter_share_group_offsets_request_partition_init(&ps[np]);
			ps[np].partition_index = o->partition;
			ps[np++].start_offset = o->offset;
		}
		if (!np)
			continue;
		km_alter_share_group_offsets_request_topic_init(&ts[nt]);
		ts[nt].topic_name = km_str_c(cy->t[ti].name);
		ts[nt].partitions.items = ps;
		ts[nt++].partitions.count = np;
		g->ncommit += (size_t)np;
	}
	m.topics.items = ts;
	m.topics.count = nt;
	km_alter_share_group_offsets_request_encode(w, ver, &m);
	return true;
}

/* The group's source offsets that differ from the destination's, as one OffsetCommit. */
static bool enc_commit(sync_cycle *cy, sreq *rq, int16_t ver, km_wr *w)
{
	sgroup *g = &cy->g[rq->arg];
	km_offset_commit_request m;
	km_offset_commit_request_topic *ts = km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*ts));
	int32_t nt = 0;

	if (!ts)
		return false;
	g->ncommit = 0; /* encoded again when a send failed */
	km_offset_commit_request_init(&m);
	m.group_id = km_str_c(g->name);
	m.generation_id_or_member_epoch = -1;
	m.member_id = km_str_c("");
	m.group_instance_id = KM_STR_NULL;
	m.retention_time_ms = -1;
	for (size_t ti = 0; ti < cy->nt; ti++) {
		km_offset_commit_request_partition *ps = NULL;
		int32_t np = 0;
		for (size_t j = 0; j < g->nsrc; j++) {
			soff *o = &g->src[j];
			if (o->topic != (int32_t)ti || dst_has(g, o))
				continue;
			if (!ps && !(ps = km_arena_calloc(&cy->a, g->nsrc * sizeof(*ps))))
				return false;
			km_offset_commit_request_partition_init(&ps[np]);
			ps[np].partition_index = o->partition;
			ps[np].committed_offset = o->offset;
			ps[np].committed_leader_epoch = -1;
			ps[np++].committed_metadata = km_str_c(o->meta ? o->meta : "");
		}
		if (!np)
			continue;
		km_offset_commit_request_topic_init(&ts[nt]);
		ts[nt].name = km_str_c(cy->t[ti].name);
		ts[nt].partitions.items = ps;
		ts[nt++].partitions.count = np;
		g->ncommit += (size_t)np;
	}
	m.topics.items = ts;
	m.topics.count = nt;
	km_offset_commit_request_encode(w, ver, &m);
	return true;
}

static bool enc_describe_acls(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_describe_acls_request m;
	(void)cy;
	km_describe_acls_request_init(&m);
	m.resource_type_filter = K_ANY;
	m.resource_name_filter = KM_STR_NULL;
	m.pattern_type_filter = K_PATTERN_ANY;
	m.principal_filter = KM_STR_NULL;
	m.host_filter = KM_STR_NULL;
	m.operation = K_ANY;
	m.permission_type = K_ANY;
	km_describe_acls_request_encode(w, ver, &m);
	return true;
}

static bool enc_create_acls(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_create_acls_request m;
	km_create_acls_request_acl_creation *cs = km_arena_calloc(&cy->a, (cy->ncreate + 1) * sizeof(*cs));

	if (!cs)
		return false;
	km_create_acls_request_init(&m);
	for (size_t i = 0; i < cy->ncreate; i++) {
		const sacl *b = cy->create[i];
		km_create_acls_request_acl_creation_init(&cs[i]);
		cs[i] = (km_create_acls_request_acl_creation){.resource_type = b->rtype, .resource_name = km_str_c(b->rname),
							       .resource_pattern_type = b->pattern,
							       .principal = km_str_c(b->principal),
							       .host = km_str_c(b->host), .operation = b->op,
							       .permission_type = b->perm};
	}
	m.creations.items = cs;
	m.creations.count = (int32_t)cy->ncreate;
	km_create_acls_request_encode(w, ver, &m);
	return true;
}

static bool enc_delete_acls(sync_cycle *cy, int16_t ver, km_wr *w)
{
	km_delete_acls_request m;
	km_delete_acls_request_delete_acls_filter *fs = km_arena_calloc(&cy->a, (cy->ndelete + 1) * sizeof(*fs));

	if (!fs)
		return false;
	km_delete_acls_request_init(&m);
	for (size_t i = 0; i < cy->ndelete; i++) {
		const sacl *b = cy->delete[i];
		km_delete_acls_request_delete_acls_filter_init(&fs[i]);
		/* Every field named exactly: the filter matches this one binding and nothing else. */
		fs[i] = (km_delete_acls_request_delete_acls_filter){.resource_type_filter = b->rtype,
								    .resource_name_filter = km_str_c(b->rname),
								    .pattern_type_filter = b->pattern,
								    .principal_filter = km_str_c(b->principal),
								    .host_filter = km_str_c(b->host), .operation = b->op,
								    .permission_type = b->perm};
	}
	m.filters.items = fs;
	m.filters.count = (int32_t)cy->ndelete;
	km_delete_acls_request_encode(w, ver, &m);
	return true;
}

static bool encode(sync_cycle *cy, sreq *rq, int16_t ver, km_wr *w)
{
	switch (rq->key) {
	case KM_API_METADATA:
		return enc_metadata(cy, ver, w);
	case KM_API_DESCRIBE_CONFIGS:
		return enc_describe_configs(cy, ver, w);
	case KM_API_INCREMENTAL_ALTER_CONFIGS:
		return enc_alter(cy, ver, w);
	case KM_API_LIST_GROUPS:
		return enc_list_groups(cy, ver, w);
	case KM_API_FIND_COORDINATOR:
		return enc_find_coordinator(cy, ver, w);
	case KM_API_OFFSET_FETCH:
		return enc_offset_fetch(cy, rq, ver, w);
	case KM_API_OFFSET_COMMIT:
		return enc_commit(cy, rq, ver, w);
	case KM_API_DESCRIBE_SHARE_GROUP_OFFSETS:
		return enc_share_describe(cy, rq, ver, w);
	case KM_API_ALTER_SHARE_GROUP_OFFSETS:
		return enc_share_alter(cy, rq, ver, w);
	case KM_API_DESCRIBE_ACLS:
		return enc_describe_acls(cy, ver, w);
	case KM_API_CREATE_ACLS:
		return enc_create_acls(cy, ver, w);
	case KM_API_DELETE_ACLS:
		return enc_delete_acls(cy, ver, w);
	default:
		return false;
	}
}

/* ---- answers ---- */

static stopic *topic_of(sync_cycle *cy, km_str name, int32_t *idx)
{
	for (size_t i = 0; i < cy->nt; i++)
		if (km_str_eq_c(name, cy->t[i].name)) {
			if (idx)
				*idx = (int32_t)i;
			return &cy->t[i];
		}
	return NULL;
}

static void took_metadata(sync_cycle *cy, sreq *rq, const km_metadata_response *r)
{
	bool src = rq->cl == cy->src;
	int32_t **nodes = src ? &cy->src_nodes : &cy->dst_nodes;
	size_t *nn = src ? &cy->nsrc_nodes : &cy->ndst_nodes;

	if (km_mcluster_brokers(rq->cl, r) != KM_OK)
		return step_error(cy, "the %s's metadata could not be taken", side(cy, rq->cl));
	if (r->brokers.count > 0 && (*nodes = km_arena_alloc(&cy->a, (size_t)r->brokers.count * sizeof(**nodes)))) {
		for (int32_t i = 0; i < r->brokers.count; i++)
			(*nodes)[i] = r->brokers.items[i].node_id;
		*nn = (size_t)r->brokers.count;
	}
	if (!src)
		return;
	for (int32_t i = 0; i < r->topics.count; i++) {
		stopic *t = topic_of(cy, r->topics.items[i].name, NULL);
		if (t && !r->topics.items[i].error_code)
			t->src_parts = r->topics.items[i].partitions.count;
	}
}

static void took_configs(sync_cycle *cy, sreq *rq, const km_describe_configs_response *r)
{
	bool src = rq->cl == cy->src;

	for (int32_t i = 0; i < r->results.count; i++) {
		const km_describe_configs_response_describe_configs_result *res = &r->results.items[i];
		stopic *t = topic_of(cy, res->resource_name, NULL);
		kv *l;
		size_t n = 0;
		if (!t)
			continue;
		if (res->error_code) {
			step_error(cy, "DescribeConfigs of topic %s on the %s: %s%s%.*s", t->name, side(cy, rq->cl),
				   km_err_name(res->error_code), res->error_message.len > 0 ? ": " : "",
				   res->error_message.len > 0 ? (int)res->error_message.len : 0, res->error_message.p);
			continue;
		}
		if (!(l = km_arena_calloc(&cy->a, ((size_t)(res->configs.count > 0 ? res->configs.count : 0) + 1) *
							  sizeof(*l))))
			return step_error(cy, "out of memory");
		for (int32_t j = 0; j < res->configs.count; j++) {
			const km_describe_configs_response_describe_configs_resource_result *c = &res->configs.items[j];
			const char *name = adup(&cy->a, c->name), *value = adup(&cy->a, c->value);
			if (!name || c->config_source != K_DYNAMIC_TOPIC_CONFIG)
				continue;
			if (src) {
				if (!strcmp(name, "unclean.leader.election.enable") && value && !strcmp(value, "true"))
					t->unclean = true;
				if (!value || !km_mirror_config_copied(name, c->config_source, &value))
					continue;
			}
			l[n++] = (kv){name, value};
		}
		if (src) {
			l[n++] = (kv){"compression.type", "producer"};
			t->want = l, t->nwant = n, t->cfg_src = true;
		} else {
			t->have = l, t->nhave = n, t->cfg_dst = true;
		}
	}
}

static void took_alter(sync_cycle *cy, const km_incremental_alter_configs_response *r)
{
	for (int32_t i = 0; i < r->responses.count; i++) {
		const km_incremental_alter_configs_response_alter_configs_resource_response *x = &r->responses.items[i];
		stopic *t = topic_of(cy, x->resource_name, NULL);
		if (!x->error_code && t)
			cy->changes += t->nchange;
		if (x->error_code)
			step_error(cy, "IncrementalAlterConfigs of topic %.*s on the destination: %s%s%.*s",
				   x->resource_name.len > 0 ? (int)x->resource_name.len : 0, x->resource_name.p,
				   km_err_name(x->error_code), x->error_message.len > 0 ? ": " : "",
				   x->error_message.len > 0 ? (int)x->error_message.len : 0, x->error_message.p);
	}
}

static sgroup *group_of(sync_cycle *cy, km_str name)
{
	for (size_t i = 0; i < cy->ng; i++)
		if (km_str_eq_c(name, cy->g[i].name))
			return &cy->g[i];
	return NULL;
}

static void took_groups(sync_cycle *cy, sreq *rq, const km_list_groups_response *r)
{
	bool src = rq->cl == cy->src;

	if (r->error_code) {
		step_error(cy, "ListGroups on %s broker %d: %s", side(cy, rq->cl), (int)rq->node,
			   km_err_name(r->error_code));
		return;
	}
	for (int32_t i = 0; i < r->groups.count; i++) {
		const km_list_groups_response_listed_group *lg = &r->groups.items[i];
		const char *name = adup(&cy->a, lg->group_id);
		if (!name)
			return step_error(cy, "out of memory");
		if (!src) {
			/* Members own a group's offsets: any state but Empty or Dead has them. */
			if (lg->group_state.len > 0 && !km_str_eq_c(lg->group_state, "Empty") &&
			    !km_str_eq_c(lg->group_state, "Dead")) {
				if (!(cy->dst_active = agrow(&cy->a, cy->dst_active, cy->nactive, &cy->capactive,
							     sizeof(*cy->dst_active))))
					return step_error(cy, "out of memory");
				cy->dst_active[cy->nactive++] = (char *)name;
			}
			continue;
		}
		/* Classic consumer groups (protocol "consumer", or none: offsets only), KIP-848 ones and share groups. */
		bool share = lg->group_type.len > 0 ? km_str_eq_c(lg->group_type, "share") : km_str_eq_c(lg->protocol_type, "share");
		if (!share && (lg->group_type.len > 0 ? !km_str_eq_c(lg->group_type, "classic") &&
								!km_str_eq_c(lg->group_type, "consumer")
						      : lg->protocol_type.len > 0 && !km_str_eq_c(lg->protocol_type, "consumer")))
			continue;
		if (!strcmp(name, KM_SYNC_GROUP) || group_of(cy, lg->group_id) || !km_name_filter_match(cy->groups, name))
			continue;
		if (!(cy->g = agrow(&cy->a, cy->g, cy->ng, &cy->capg, sizeof(*cy->g))))
			return step_error(cy, "out of memory");
		cy->g[cy->ng++] = (sgroup){.name = name, .share = share, .src_coord = -1, .dst_coord = -1};
	}
}

static void took_coordinators(sync_cycle *cy, sreq *rq, const km_find_coordinator_response *r)
{
	bool src = rq->cl == cy->src;

	for (int32_t i = 0; i < r->coordinators.count; i++) {
		const km_find_coordinator_response_coordinator *c = &r->coordinators.items[i];
		sgroup *g = group_of(cy, c->key);
		if (!g)
			continue;
		if (c->error_code) {
			step_error(cy, "FindCoordinator of group %s on the %s: %s", g->name, side(cy, rq->cl),
				   km_err_name(c->error_code));
			continue;
		}
		*(src ? &g->src_coord : &g->dst_coord) = c->node_id;
	}
}

static void took_offsets(sync_cycle *cy, sreq *rq, const km_offset_fetch_response *r)
{
	bool src = rq->cl == cy->src;

	for (int32_t i = 0; i < r->groups.count; i++) {
		const km_offset_fetch_response_group *rg = &r->groups.items[i];
		sgroup *g = group_of(cy, rg->group_id);
		soff *l;
		size_t n = 0, cap = 0;
		if (!g)
			continue;
		if (rg->error_code) {
			step_error(cy, "OffsetFetch of group %s on the %s: %s", g->name, side(cy, rq->cl),
				   km_err_name(rg->error_code));
			continue;
		}
		for (int32_t j = 0; j < rg->topics.count; j++) {
			const km_offset_fetch_response_topics *rt = &rg->topics.items[j];
			int32_t ti;
			if (!topic_of(cy, rt->name, &ti))
				continue;
			cap += (size_t)(rt->partitions.count > 0 ? rt->partitions.count : 0);
		}
		if (!(l = km_arena_calloc(&cy->a, (cap + 1) * sizeof(*l))))
			return step_error(cy, "out of memory");
		for (int32_t j = 0; j < rg->topics.count; j++) {
			const km_offset_fetch_response_topics *rt = &rg->topics.items[j];
			int32_t ti;
			stopic *t = topic_of(cy, rt->name, &ti);
			if (!t)
				continue;
			for (int32_t k = 0; k < rt->partitions.count; k++) {
				const km_offset_fetch_response_partitions *p = &rt->partitions.items[k];
				/* Partitions of the mirror topic only; -1: nothing committed. */
				if (p->error_code || p->committed_offset < 0 || p->partition_index < 0 ||
				    (src && p->partition_index >= t->store_parts))
					continue;
				l[n++] = (soff){ti, p->partition_index, p->committed_offset, adup(&cy->a, p->metadata)};
			}
		}
		if (src)
			g->src = l, g->nsrc = n, g->src_ok = true;
		else
			g->dst = l, g->ndst = n, g->dst_ok = true;
	}
}

/*
 * A share group's start offsets. The source's are logical and are kept as the destination's
 * physical offsets they map to (the share coordinator there knows only those); partitions with
 * nothing mirrored yet are left out.
 */
static void took_share_offsets(sync_cycle *cy, sreq *rq, const km_describe_share_group_offsets_response *r)
{
	bool src = rq->cl == cy->src;
	km_state *st = km_mirror_store(cy->m->s->mi);

	for (int32_t i = 0; i < r->groups.count; i++) {
		const km_describe_share_group_offsets_response_group *rg = &r->groups.items[i];
		sgroup *g = group_of(cy, rg->group_id);
		soff *l;
		size_t n = 0, cap = 0;
		if (!g || !g->share)
			continue;
		if (rg->error_code == K_GROUP_ID_NOT_FOUND) {
			/* Not on the destination yet (or gone from the source since ListGroups): nothing committed. */
			g->dst_ok = g->dst_ok || !src;
			continue;
		}
		if (rg->error_code) {
			step_error(cy, "DescribeShareGroupOffsets of group %s on the %s: %s", g->name, side(cy, rq->cl),
				   km_err_name(rg->error_code));
			continue;
		}
		for (int32_t j = 0; j < rg->topics.count; j++)
			cap += (size_t)(rg->topics.items[j].partitions.count > 0 ? rg->topics.items[j].partitions.count : 0);
		if (!(l = km_arena_calloc(&cy->a, (cap + 1) * sizeof(*l))))
			return step_error(cy, "out of memory");
		for (int32_t j = 0; j < rg->topics.count; j++) {
			const km_describe_share_group_offsets_response_topic *rt = &rg->topics.items[j];
			int32_t ti;
			stopic *t = topic_of(cy, rt->topic_name, &ti);
			const km_state_topic *mt = t && st ? km_state_topic_find(st, t->name, strlen(t->name)) : NULL;
			if (!t)
				continue;
			for (int32_t k = 0; k < rt->partitions.count; k++) {
				const km_describe_share_group_offsets_response_partition *p = &rt->partitions.items[k];
				int64_t off = p->start_offset;
				if (p->error_code || off < 0 || p->partition_index < 0)
					continue;
				if (src) {
					const km_offmap *map;
					if (p->partition_index >= t->store_parts || !mt ||
					    !(map = km_state_topic_offmap(mt, p->partition_index)))
						continue;
					off = km_offmap_to_physical(map, off);
				}
				l[n++] = (soff){ti, p->partition_index, off, NULL};
			}
		}
		if (src)
			g->src = l, g->nsrc = n, g->src_ok = true;
		else
			g->dst = l, g->ndst = n, g->dst_ok = true;
	}
}

static void took_share_alter(sync_cycle *cy, sreq *rq, const km_alter_share_group_offsets_response *r)
{
	sgroup *g = &cy->g[rq->arg];

	if (r->error_code) {
		step_error(cy, "AlterShareGroupOffsets of group %s on the destination: %s", g->name,
			   km_err_name(r->error_code));
		return;
	}
	for (int32_t i = 0; i < r->responses.count; i++)
		for (int32_t j = 0; j < r->responses.items[i].partitions.count; j++) {
			int16_t e = r->responses.items[i].partitions.items[j].error_code;
			if (!e || g->commit_failed)
				continue;
			g->commit_failed = true;
			step_error(cy, "AlterShareGroupOffsets of group %s on the destination: %s", g->name, km_err_name(e));
		}
	if (!g->commit_failed) {
		cy->changes += (int64_t)g->ncommit;
		KM_INFO(COMP, 0, "%s: share group %s: %zu start offset(s) copied to the destination", cy->m->mirror,
			g->name, g->ncommit);
	}
}

static void took_commit(sync_cycle *cy, sreq *rq, const km_offset_commit_response *r)
{
	sgroup *g = &cy->g[rq->arg];

	for (int32_t i = 0; i < r->topics.count; i++)
		for (int32_t j = 0; j < r->topics.items[i].partitions.count; j++) {
			int16_t e = r->topics.items[i].partitions.items[j].error_code;
			if (!e)
				continue;
			if (!g->commit_failed)
				step_error(cy, "OffsetCommit of group %s on the destination (%.*s-%d): %s", g->name,
					   r->topics.items[i].name.len > 0 ? (int)r->topics.items[i].name.len : 0,
					   r->topics.items[i].name.p, (int)r->topics.items[i].partitions.items[j].partition_index,
					   km_err_name(e));
			g->commit_failed = true;
		}
	if (!g->commit_failed) {
		cy->changes += (int64_t)g->ncommit;
		KM_INFO(COMP, 0, "%s: group %s: %zu committed offset(s) copied to the destination", cy->m->mirror, g->name,
			g->ncommit);
	}
}

static void took_acls(sync_cycle *cy, sreq *rq, const km_describe_acls_response *r)
{
	bool src = rq->cl == cy->src;
	sacl **l = src ? &cy->sa : &cy->da;
	size_t *n = src ? &cy->nsa : &cy->nda, *cap = src ? &cy->capsa : &cy->capda;

	if (r->error_code) {
		if (r->error_code == K_SECURITY_DISABLED)
			return step_error(cy, "the %s has no authorizer (SECURITY_DISABLED): ACLs are not synced",
					  side(cy, rq->cl));
		return step_error(cy, "DescribeAcls on the %s: %s%s%.*s", side(cy, rq->cl), km_err_name(r->error_code),
				  r->error_message.len > 0 ? ": " : "",
				  r->error_message.len > 0 ? (int)r->error_message.len : 0, r->error_message.p);
	}
	for (int32_t i = 0; i < r->resources.count; i++) {
		const km_describe_acls_response_describe_acls_resource *res = &r->resources.items[i];
		const char *rname = adup(&cy->a, res->resource_name);
		for (int32_t j = 0; j < res->acls.count; j++) {
			const km_describe_acls_response_acl_description *d = &res->acls.items[j];
			sacl b = {res->resource_type, res->pattern_type, d->operation, d->permission_type, rname,
				  adup(&cy->a, d->principal), adup(&cy->a, d->host)};
			if (!b.rname || !b.principal || !b.host)
				return step_error(cy, "out of memory");
			if (!km_acl_scope_match(cy->acls, b.rtype, b.rname, b.op, b.perm, b.principal))
				continue;
			if (!(*l = agrow(&cy->a, *l, *n, cap, sizeof(**l))))
				return step_error(cy, "out of memory");
			(*l)[(*n)++] = b;
		}
	}
}

static void acl_line(const sacl *b, char *buf, size_t len)
{
	snprintf(buf, len, "resource type %d name \"%s\" pattern %d principal %s host %s operation %d permission %d",
		 (int)b->rtype, b->rname, (int)b->pattern, b->principal, b->host, (int)b->op, (int)b->perm);
}

static void took_acl_change(sync_cycle *cy, sreq *rq, int16_t ver, km_rd *rd, km_arena *a)
{
	char line[800];

	if (rq->key == KM_API_CREATE_ACLS) {
		km_create_acls_response r;
		if (km_create_acls_response_decode(rd, ver, &r, a) != KM_OK)
			return step_error(cy, "the destination's CreateAcls answer could not be decoded");
		for (int32_t i = 0; i < r.results.count && (size_t)i < cy->ncreate; i++) {
			acl_line(cy->create[i], line, sizeof(line));
			if (r.results.items[i].error_code) {
				step_error(cy, "CreateAcls on the destination (%s): %s", line,
					   km_err_name(r.results.items[i].error_code));
				continue;
			}
			cy->changes++;
			KM_INFO(COMP, 0, "%s: ACL created on the destination: %s", cy->m->mirror, line);
		}
		return;
	}
	km_delete_acls_response r;
	if (km_delete_acls_response_decode(rd, ver, &r, a) != KM_OK)
		return step_error(cy, "the destination's DeleteAcls answer could not be decoded");
	for (int32_t i = 0; i < r.filter_results.count && (size_t)i < cy->ndelete; i++) {
		acl_line(cy->delete[i], line, sizeof(line));
		if (r.filter_results.items[i].error_code) {
			step_error(cy, "DeleteAcls on the destination (%s): %s", line,
				   km_err_name(r.filter_results.items[i].error_code));
			continue;
		}
		cy->changes += r.filter_results.items[i].matching_acls.count;
		KM_INFO(COMP, 0, "%s: ACL deleted on the destination (the source does not have it): %s", cy->m->mirror,
			line);
	}
}

static void take(sync_cycle *cy, sreq *rq, int16_t ver, km_rd *rd, km_arena *a)
{
	km_err rc = KM_OK;

#define TAKE(type, fn, ...)                                                                                            \
	do {                                                                                                           \
		type r;                                                                                                \
		if ((rc = type##_decode(rd, ver, &r, a)) == KM_OK)                                                     \
			fn(cy, __VA_ARGS__);                                                                           \
	} while (0)
	switch (rq->key) {
	case KM_API_METADATA:
		TAKE(km_metadata_response, took_metadata, rq, &r);
		break;
	case KM_API_DESCRIBE_CONFIGS:
		TAKE(km_describe_configs_response, took_configs, rq, &r);
		break;
	case KM_API_INCREMENTAL_ALTER_CONFIGS:
		TAKE(km_incremental_alter_configs_response, took_alter, &r);
		break;
	case KM_API_LIST_GROUPS:
		TAKE(km_list_groups_response, took_groups, rq, &r);
		break;
	case KM_API_FIND_COORDINATOR:
		TAKE(km_find_coordinator_response, took_coordinators, rq, &r);
		break;
	case KM_API_OFFSET_FETCH:
		TAKE(km_offset_fetch_response, took_offsets, rq, &r);
		break;
	case KM_API_OFFSET_COMMIT:
		TAKE(km_offset_commit_response, took_commit, rq, &r);
		break;
	case KM_API_DESCRIBE_SHARE_GROUP_OFFSETS:
		TAKE(km_describe_share_group_offsets_response, took_share_offsets, rq, &r);
		break;
	case KM_API_ALTER_SHARE_GROUP_OFFSETS:
		TAKE(km_alter_share_group_offsets_response, took_share_alter, rq, &r);
		break;
	case KM_API_DESCRIBE_ACLS:
		TAKE(km_describe_acls_response, took_acls, rq, &r);
		break;
	case KM_API_CREATE_ACLS:
	case KM_API_DELETE_ACLS:
		took_acl_change(cy, rq, ver, rd, a);
		break;
	default:
		break;
	}
#undef TAKE
	if (rc != KM_OK)
		step_error(cy, "the %s's %s answer could not be decoded", side(cy, rq->cl), api_name(rq->key));
}

/* ---- the phases ---- */

static bool same_acl(const sacl *x, const sacl *y)
{
	return x->rtype == y->rtype && x->pattern == y->pattern && x->op == y->op && x->perm == y->perm &&
	       !strcmp(x->rname, y->rname) && !strcmp(x->principal, y->principal) && !strcmp(x->host, y->host);
}

static bool has_acl(const sacl *l, size_t n, const sacl *b)
{
	for (size_t i = 0; i < n; i++)
		if (same_acl(&l[i], b))
			return true;
	return false;
}

/* Log a group's skip when it starts or ends (not every cycle). */
static void note_skips(sync_cycle *cy)
{
	msync *m = cy->m;
	char **now = NULL;
	size_t nnow = 0;
	int64_t skipped = 0;

	for (size_t i = 0; i < cy->ng; i++) {
		/* Skipped and counted only where it matters: a group with offsets on this mirror's topics. */
		if (!cy->g[i].skip || !cy->g[i].nsrc)
			continue;
		skipped++;
		if (!in_list(m->skipping, m->nskipping, cy->g[i].name))
			KM_WARN(COMP, 0, "%s: group %s has members on the destination: its offsets are not synced while it "
				"does", m->mirror, cy->g[i].name);
		list_add(&now, &nnow, cy->g[i].name);
	}
	for (size_t i = 0; i < m->nskipping; i++)
		if (!in_list(now, nnow, m->skipping[i]))
			KM_INFO(COMP, 0, "%s: group %s is no longer active on the destination: its offsets are synced again",
				m->mirror, m->skipping[i]);
	list_free(m->skipping, m->nskipping);
	m->skipping = now;
	m->nskipping = nnow;
	m->st[KM_SYNC_GROUPS].skipped = skipped;
	m_set(m->m_skipped, skipped);
}

/* The phase's requests are all answered: what they say, and the next phase's requests. */
static void next_phase(sync_cycle *cy)
{
	cy->nrq = cy->caprq = 0;
	cy->rq = NULL;
	switch (cy->ph) {
	case PH_META:
		cy->ph = PH_CFG;
		add_req(cy, cy->src, -1, KM_API_DESCRIBE_CONFIGS, DC_LO, DC_HI, 0);
		add_req(cy, cy->dst, -1, KM_API_DESCRIBE_CONFIGS, DC_LO, DC_HI, 0);
		return;
	case PH_CFG: {
		bool any = false;
		for (size_t i = 0; i < cy->nt; i++) {
			stopic *t = &cy->t[i];
			if (t->cfg_src && t->cfg_dst)
				cy->compared++;
			if (!plan_configs(cy, t))
				step_error(cy, "out of memory");
			any |= t->nchange > 0;
			if (t->unclean && !in_list(cy->m->warned, cy->m->nwarned, t->name)) {
				KM_WARN(COMP, 0, "%s: source topic %s has unclean.leader.election.enable=true: an unclean "
					"election on the source can rewrite offsets the mirror has already copied",
					cy->m->mirror, t->name);
				list_add(&cy->m->warned, &cy->m->nwarned, t->name);
			}
		}
		cy->ph = PH_ALTER;
		if (any) {
			add_req(cy, cy->dst, -1, KM_API_INCREMENTAL_ALTER_CONFIGS, IAC_LO, IAC_HI, 0);
			return;
		}
	}
		__attribute__((fallthrough)); /* nothing to change */
	case PH_ALTER:
		step_end(cy, KM_SYNC_PARTITIONS);
		/* Partitions: the grow is the topics module's (asynchronous, idempotent). */
		for (size_t i = 0; i < cy->nt; i++) {
			stopic *t = &cy->t[i];
			if (t->src_parts < 0)
				continue;
			cy->compared++;
			if (t->src_parts > t->store_parts) {
				KM_INFO(COMP, 0, "%s: source topic %s has %d partitions, the mirror %d: growing", cy->m->mirror,
					t->name, (int)t->src_parts, (int)t->store_parts);
				km_mirror_grow(cy->m->s->mi, cy->m->mirror, t->name, t->src_parts);
				cy->changes += t->src_parts - t->store_parts;
			}
		}
		if (!cy->nsrc_nodes)
			step_error(cy, "the source's Metadata failed: its partition counts are not known");
		step_end(cy, KM_SYNC_GROUPS);
		cy->ph = PH_GROUPS;
		if (!cy->nsrc_nodes || !cy->ndst_nodes)
			step_error(cy, "the %s's Metadata failed: its brokers are not known", !cy->nsrc_nodes ? "source" : "destination");
		for (size_t i = 0; i < cy->nsrc_nodes; i++)
			add_req(cy, cy->src, cy->src_nodes[i], KM_API_LIST_GROUPS, LG_LO, LG_HI, 0);
		for (size_t i = 0; i < cy->ndst_nodes; i++)
			add_req(cy, cy->dst, cy->dst_nodes[i], KM_API_LIST_GROUPS, LG_LO, LG_HI, 0);
		return;
	case PH_GROUPS:
		for (size_t i = 0; i < cy->ng; i++)
			cy->g[i].skip = in_list(cy->dst_active, cy->nactive, cy->g[i].name);
		cy->ph = PH_COORD;
		if (cy->ng) {
			add_req(cy, cy->src, -1, KM_API_FIND_COORDINATOR, FC_LO, FC_HI, 0);
			add_req(cy, cy->dst, -1, KM_API_FIND_COORDINATOR, FC_LO, FC_HI, 0);
			return;
		}
		__attribute__((fallthrough)); /* nothing to look up */
	case PH_COORD: {
		cy->ph = PH_OFFSETS;
		for (int side_i = 0; side_i < 2; side_i++) {
			km_mcluster *cl = side_i ? cy->dst : cy->src;
			for (size_t i = 0; i < cy->ng; i++) {
				int32_t node = side_i ? cy->g[i].dst_coord : cy->g[i].src_coord;
				int16_t key = cy->g[i].share ? KM_API_DESCRIBE_SHARE_GROUP_OFFSETS : KM_API_OFFSET_FETCH;
				bool dup = false;
				sreq *rq;
				if ((side_i && cy->g[i].skip) || node < 0)
					continue;
				for (size_t r = 0; r < cy->nrq && !dup; r++)
					dup = cy->rq[r].cl == cl && cy->rq[r].node == node && cy->rq[r].key == key;
				if (dup)
					continue;
				rq = cy->g[i].share ? add_req(cy, cl, node, key, DSO_LO, DSO_HI, 0)
						    : add_req(cy, cl, node, key, OF_LO, OF_HI, 0);
				if (rq)
					rq->optional = cy->g[i].share; /* where both sides have share groups */
			}
		}
		if (cy->nrq)
			return;
	}
		__attribute__((fallthrough));
	case PH_OFFSETS:
		note_skips(cy);
		cy->ph = PH_COMMIT;
		for (size_t i = 0; i < cy->ng; i++) {
			sgroup *g = &cy->g[i];
			bool differs = false;
			if (g->skip || !g->src_ok || !g->dst_ok || g->dst_coord < 0)
				continue;
			cy->compared++;
			for (size_t j = 0; j < g->nsrc && !differs; j++)
				differs = !dst_has(g, &g->src[j]);
			if (differs && g->share)
				add_req(cy, cy->dst, g->dst_coord, KM_API_ALTER_SHARE_GROUP_OFFSETS, ASO_LO, ASO_HI, i);
			else if (differs)
				add_req(cy, cy->dst, g->dst_coord, KM_API_OFFSET_COMMIT, OC_LO, OC_HI, i);
		}
		if (cy->nrq)
			return;
		__attribute__((fallthrough));
	case PH_COMMIT:
		step_end(cy, KM_SYNC_ACLS);
		cy->ph = PH_ACLS;
		add_req(cy, cy->src, -1, KM_API_DESCRIBE_ACLS, ACL_LO, ACL_HI, 0);
		add_req(cy, cy->dst, -1, KM_API_DESCRIBE_ACLS, ACL_LO, ACL_HI, 0);
		return;
	case PH_ACLS:
		cy->ph = PH_ACLS_CHANGE;
		if (cy->step_failed) /* one side unknown: changing the other would be a guess */
			break;
		cy->compared = (int64_t)(cy->nsa + cy->nda);
		cy->create = km_arena_alloc(&cy->a, (cy->nsa + 1) * sizeof(*cy->create));
		cy->delete = km_arena_alloc(&cy->a, (cy->nda + 1) * sizeof(*cy->delete));
		if (!cy->create || !cy->delete) {
			step_error(cy, "out of memory");
			break;
		}
		for (size_t i = 0; i < cy->nsa; i++)
			if (!has_acl(cy->da, cy->nda, &cy->sa[i]))
				cy->create[cy->ncreate++] = &cy->sa[i];
		for (size_t i = 0; i < cy->nda; i++)
			if (!has_acl(cy->sa, cy->nsa, &cy->da[i]))
				cy->delete[cy->ndelete++] = &cy->da[i];
		if (cy->ncreate)
			add_req(cy, cy->dst, -1, KM_API_CREATE_ACLS, ACL_LO, ACL_HI, 0);
		if (cy->ndelete)
			add_req(cy, cy->dst, -1, KM_API_DELETE_ACLS, ACL_LO, ACL_HI, 0);
		if (cy->nrq)
			return;
		break;
	case PH_ACLS_CHANGE:
	case PH_END:
		break;
	}
	step_end(cy, KM_SYNC_ACLS);
	cy->ph = PH_END;
}

static void cycle_free(sync_cycle *cy);

/* This step and the rest of the cycle fail with why (a cluster not reached in time, a mirror that cannot be synced). */
static void fail_rest(sync_cycle *cy, const char *why)
{
	for (km_sync_kind k = cy->step; k < KM_SYNC__COUNT; k++) {
		cy->step = k;
		step_error(cy, "%s", why);
		step_end(cy, k);
	}
	cy->ph = PH_END;
}

static void advance(sync_cycle *cy)
{
	if (cy->finished)
		return;
	for (;;) {
		if (cy->ph == PH_END) {
			msync *m = cy->m;
			m->cy = NULL;
			cycle_free(cy);
			return;
		}
		if (!pump(cy))
			break;
		next_phase(cy);
	}
	if (now_ms() >= cy->deadline) {
		char why[480];
		snprintf(why, sizeof(why), "gave up after %d s: %s", STEP_TIMEOUT_MS / 1000, cy->why[0] ? cy->why : "no answer");
		fail_rest(cy, why);
		later(cy, 0);
		return;
	}
	/* The clusters call on_cluster when a connection changes; the timer covers the deadline. */
	later(cy, 250);
}

static void cycle_free(sync_cycle *cy)
{
	cy->finished = true;
	/* The clusters first: their pending requests fail now, while cy is there to see it finished. */
	km_mcluster_free(cy->src);
	km_mcluster_free(cy->dst);
	if (cy->src_tls)
		SSL_CTX_free(cy->src_tls);
	km_name_filter_free(cy->groups);
	km_acl_scope_free(cy->acls);
	if (cy->ev)
		event_free(cy->ev);
	km_arena_free(&cy->a);
	free(cy);
}

/* Whether a topic in this state is synced. */
static bool synced_state(km_mp_state s)
{
	return s == KM_MP_PREPARING || s == KM_MP_MIRRORING || s == KM_MP_FAILED;
}

/* Start a cycle of m; false when there is nothing to sync (no synced topic) or it cannot start. */
static bool cycle_start(msync *m, const km_state_mirror *sm, const km_mirror_options *mo)
{
	km_mirror *mi = m->s->mi;
	sync_cycle *cy = calloc(1, sizeof(*cy));
	char err[300];
	size_t nt = 0;

	if (!cy)
		return false;
	cy->m = m;
	km_arena_init(&cy->a, 0);
	cy->step = KM_SYNC_CONFIGS;
	cy->deadline = now_ms() + STEP_TIMEOUT_MS;
	cy->t = km_arena_calloc(&cy->a, (km_state_mirror_topic_count(sm) + 1) * sizeof(*cy->t));
	for (size_t i = 0; cy->t && i < km_state_mirror_topic_count(sm); i++) {
		const km_state_topic *t = km_state_mirror_topic_at(sm, i);
		if (!synced_state(km_state_topic_state(t)))
			continue;
		cy->t[nt++] = (stopic){.name = km_state_topic_name(t),
				       .store_parts = (int32_t)km_state_topic_partition_count(t), .src_parts = -1};
	}
	cy->nt = nt;
	if (!cy->t || !nt) {
		km_arena_free(&cy->a);
		free(cy);
		return false;
	}
	/* The topic names point into the store: copy them (a cycle outlives store changes). */
	for (size_t i = 0; i < nt; i++)
		cy->t[i].name = adup(&cy->a, km_str_c(cy->t[i].name));
	snprintf(cy->src_boot, sizeof(cy->src_boot), "%s", km_state_mirror_source(sm));
	cy->ev = event_new(km_mirror_base(mi), -1, 0, on_ev, cy);
	/* A value stored before its check existed can still be bad: the cycle says so, each time. */
	if (!(cy->groups = km_name_filter_parse(mo->groups_include, mo->groups_exclude, err, sizeof(err))))
		snprintf(cy->why, sizeof(cy->why), "mirror.groups.include / mirror.groups.exclude: %s (kmirror alter fixes it)", err);
	else if (!(cy->acls = km_acl_scope_parse(mo->acl_include, err, sizeof(err))))
		snprintf(cy->why, sizeof(cy->why), "mirror.acl.include: %s (kmirror alter fixes it)", err);
	else if (!(cy->src = km_mirror_source_cluster(mi, sm, "sync", 64 << 20, &cy->src_tls, on_cluster, cy, err,
						    sizeof(err))))
		snprintf(cy->why, sizeof(cy->why), "the source cluster: %s", err);
	else if (!(cy->dst = km_mirror_dest_cluster(mi, m->mirror, "sync", on_cluster, cy)) || !cy->ev)
		snprintf(cy->why, sizeof(cy->why), "out of memory");
	if (cy->why[0]) {
		fail_rest(cy, cy->why);
		cycle_free(cy);
		return true;
	}
	m->cy = cy;
	cy->ph = PH_META;
	add_req(cy, cy->src, -1, KM_API_METADATA, META_LO, META_HI, 0);
	add_req(cy, cy->dst, -1, KM_API_METADATA, META_LO, META_HI, 0);
	later(cy, 0);
	return true;
}

/* ---- the module: one msync per mirror, a tick that starts the cycles due ---- */

static void stat_series(km_sync *s, msync *m)
{
	for (int k = 0; k < KM_SYNC__COUNT; k++) {
		const char *ok[] = {m->mirror, km_sync_kind_name(k), "ok"}, *bad[] = {m->mirror, km_sync_kind_name(k), "error"};
		const char *two[] = {m->mirror, km_sync_kind_name(k)};
		m->st[k] = (sstat){.last_sync_ms = -1, .last_error_ms = -1};
		if (s->f_runs) {
			m->st[k].m_runs_ok = km_metric_series_get(s->f_runs, ok);
			m->st[k].m_runs_err = km_metric_series_get(s->f_runs, bad);
			m->st[k].m_changes = km_metric_series_get(s->f_changes, two);
			m->st[k].m_last = km_metric_series_get(s->f_last, two);
		}
	}
	if (s->f_skipped) {
		const char *one[] = {m->mirror};
		m->m_skipped = km_metric_series_get(s->f_skipped, one);
	}
}

static msync *find(km_sync *s, const char *mirror)
{
	for (msync *m = s ? s->head : NULL; m; m = m->next)
		if (!strcmp(m->mirror, mirror))
			return m;
	return NULL;
}

static void msync_free(msync *m)
{
	if (m->cy)
		cycle_free(m->cy);
	for (int k = 0; k < KM_SYNC__COUNT; k++)
		free(m->st[k].last_error);
	list_free(m->warned, m->nwarned);
	list_free(m->skipping, m->nskipping);
	free(m->mirror);
	free(m);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	km_sync *s = arg;
	km_state *st = km_mirror_store(s->mi);
	int64_t now = now_ms();
	struct timeval tv = {TICK_MS / 1000, (TICK_MS % 1000) * 1000};

	(void)fd;
	(void)what;
	if (s->freeing)
		return;
	if (st && km_state_ready(st)) {
		km_lease_start(s->lease);
		for (msync *m = s->head; m; m = m->next)
			m->seen = false;
		for (size_t i = 0; i < km_state_mirror_count(st); i++) {
			const km_state_mirror *sm = km_state_mirror_at(st, i);
			msync *m = find(s, km_state_mirror_name(sm));
			km_mirror_options mo;
			if (!m) {
				if (!(m = calloc(1, sizeof(*m))) || !(m->mirror = strdup(km_state_mirror_name(sm)))) {
					free(m);
					continue;
				}
				m->s = s;
				stat_series(s, m);
				m->next = s->head;
				s->head = m;
			}
			m->seen = true;
			if (m->owner != km_lease_owns(s->lease, m->mirror)) {
				m->owner = !m->owner;
				KM_INFO(COMP, 0, "%s: metadata sync %s", m->mirror,
					m->owner ? "runs in this kmirrord now" : "moved to another kmirrord");
				if (m->cy && !m->owner) {
					cycle_free(m->cy);
					m->cy = NULL;
				}
				m->next_ms = 0;
			}
			if (m->cy || now < m->next_ms || !m->owner)
				continue;
			if (km_state_mirror_options(sm, &mo) != KM_OK)
				continue;
			if (cycle_start(m, sm, &mo))
				m->next_ms = now + mo.metadata_refresh_interval_ms;
			km_opt_free(km_state_mirror_option_table(), &mo);
		}
		/* Mirrors deleted: their sync goes (a cycle in progress ends). */
		for (msync **pp = &s->head; *pp;) {
			msync *m = *pp;
			if (m->seen) {
				pp = &m->next;
				continue;
			}
			*pp = m->next;
			msync_free(m);
		}
	}
	event_add(s->tick, &tv);
}

km_sync *km_sync_new(km_mirror *mi)
{
	km_sync *s = calloc(1, sizeof(*s));
	const km_mirror_opts *o = km_mirror_get_opts(mi);
	struct timeval tv = {0, 0};

	if (!s)
		return NULL;
	s->mi = mi;
	if (o->metrics) {
		const km_metric_desc d[] = {
			{.name = "kmirror_mirror_sync_runs_total",
			 .help = "Metadata sync steps run, per mirror and kind (configs, partitions, groups, acls), by result.",
			 .type = KM_METRIC_COUNTER, .labels = {"mirror", "kind", "result", NULL}},
			{.name = "kmirror_mirror_sync_changes_total",
			 .help = "Changes the metadata sync made on the destination: configs set or removed, partitions "
				 "added, committed offsets copied, ACLs created or deleted.",
			 .type = KM_METRIC_COUNTER, .labels = {"mirror", "kind", NULL}},
			{.name = "kmirror_mirror_sync_last_success_timestamp_seconds",
			 .help = "When the metadata sync step last completed without an error (seconds since the epoch).",
			 .type = KM_METRIC_GAUGE, .labels = {"mirror", "kind", NULL}},
			{.name = "kmirror_mirror_sync_groups_skipped",
			 .help = "Consumer groups the last sync skipped: they have members on the destination.",
			 .type = KM_METRIC_GAUGE, .labels = {"mirror", NULL}},
		};
		km_metric_family **f[] = {&s->f_runs, &s->f_changes, &s->f_last, &s->f_skipped};
		for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
			*f[i] = km_metrics_family(o->metrics, &d[i]);
	}
	s->tick = event_new(km_mirror_base(mi), -1, 0, on_tick, s);
	s->lease = km_lease_new(mi);
	if (!s->tick || !s->lease) {
		if (s->tick)
			event_free(s->tick);
		km_lease_free(s->lease);
		free(s);
		return NULL;
	}
	event_add(s->tick, &tv);
	return s;
}

void km_sync_free(km_sync *s)
{
	if (!s)
		return;
	s->freeing = true;
	while (s->head) {
		msync *m = s->head;
		s->head = m->next;
		msync_free(m);
	}
	event_free(s->tick);
	km_lease_free(s->lease);
	free(s);
}

bool km_mirror_sync_status(km_mirror *mi, const char *mirror, km_sync_kind kind, km_sync_status *out, bool *owner)
{
	msync *m = mirror && (unsigned)kind < KM_SYNC__COUNT ? find(km_mirror_sync(mi), mirror) : NULL;

	*out = (km_sync_status){.last_sync_ms = -1, .last_error_ms = -1};
	if (owner)
		*owner = m && m->owner;
	if (!m)
		return false;
	const sstat *st = &m->st[kind];
	*out = (km_sync_status){st->last_sync_ms, st->compared, st->changes_last, st->changes_total, st->skipped,
				st->errors_total, st->last_error, st->last_error_ms};
	return true;
}
