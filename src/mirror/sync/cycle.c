/* A metadata sync cycle: its requests, its phases one after the other, each step's status. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/rpc.h"
#include "mirror/sync/sync.h"

static void advance(sync_cycle *cy);

const char *km_sy_adup(km_arena *a, km_str s)
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
void *km_sy_agrow(km_arena *a, void *arr, size_t n, size_t *cap, size_t size)
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

void km_sy_list_free(char **l, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(l[i]);
	free(l);
}

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

void km_sy_step_error(sync_cycle *cy, const char *fmt, ...)
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
	st->last_error_ms = km_wall_ms();
}

/* The step is over (ok or not): its figures, and the next step's start. */
static void step_end(sync_cycle *cy, km_sync_kind next)
{
	sstat *st = &cy->m->st[cy->step];

	st->changes_last = cy->changes;
	st->changes_total += cy->changes;
	m_inc(st->m_changes, (uint64_t)cy->changes);
	if (!cy->step_failed) {
		st->last_sync_ms = km_wall_ms();
		st->compared = cy->compared;
		m_inc(st->m_runs_ok, 1);
		m_set(st->m_last, st->last_sync_ms / 1000);
		if (st->m_last)
			km_metric_series_show(st->m_last, true);
	}
	cy->step = next;
	cy->step_failed = false;
	cy->changes = cy->compared = 0;
	cy->deadline = km_wall_ms() + STEP_TIMEOUT_MS;
}

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

static sreq *add_req(sync_cycle *cy, km_cluster *cl, int32_t node, int16_t key, int16_t lo, int16_t hi, size_t arg)
{
	sreq *n = km_sy_agrow(&cy->a, cy->rq, cy->nrq, &cy->caprq, sizeof(*n));
	if (!n)
		return NULL;
	cy->rq = n;
	n[cy->nrq] = (sreq){cl, node, key, lo, hi, arg, false, false, false};
	return &n[cy->nrq++];
}

/* A request's way back: its cycle and its place in the phase's requests. */
typedef struct rctx {
	sync_cycle *cy;
	size_t i;
} rctx;

const char *km_sy_api_name(int16_t key)
{
	const km_api_info *a = km_api_lookup(key);
	return a ? a->name : "?";
}

const char *km_sy_side(const sync_cycle *cy, const km_cluster *cl)
{
	return cl == cy->src ? "source" : "destination";
}

static void on_response(km_net_client *c, const km_rpc_response *r, void *arg)
{
	rctx *x = arg;
	sync_cycle *cy = x->cy;
	size_t i = x->i;
	sreq *rq;

	free(x);
	if (cy->finished || i >= cy->nrq)
		return;
	rq = &cy->rq[i];
	rq->done = true;
	if (km_rpc_undecoded(r)) {
		km_sy_step_error(cy, "the %s's %s answer could not be decoded", km_sy_side(cy, rq->cl),
				 km_sy_api_name(rq->key));
	} else if (r->err != KM_OK) {
		km_sy_step_error(cy, "a request to the %s failed: %s", km_sy_side(cy, rq->cl), km_err_name(r->err));
		km_cluster_drop(rq->cl, c);
	} else {
		km_sy_take(cy, rq, r->msg);
	}
	later(cy, 0);
}

void km_sy_follow_done(sync_cycle *cy)
{
	later(cy, 0);
}

/* Send every request of the phase that can go now; true when all are answered (and a start of step 0 has answered). */
static bool pump(sync_cycle *cy)
{
	bool all = !cy->follow;

	for (size_t i = 0; i < cy->nrq; i++) {
		sreq *rq = &cy->rq[i];
		km_net_client *c;
		const void *req;
		int16_t ver;
		km_err rc;
		rctx *x;

		if (rq->done)
			continue;
		all = false;
		if (rq->sent)
			continue;
		c = rq->node < 0 ? km_cluster_any(rq->cl) : km_cluster_node(rq->cl, rq->node);
		if (!km_cluster_usable(rq->cl, c)) {
			const char *r = km_cluster_last_error(rq->cl);
			snprintf(cy->why, sizeof(cy->why), "the %s%s%s%s cannot be reached%s%s", km_sy_side(cy, rq->cl),
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
			km_sy_step_error(cy, "the %s does not support %s v%d or later (it has v%d)", km_sy_side(cy, rq->cl),
				   km_sy_api_name(rq->key), rq->lo, ver);
			continue;
		}
		if (ver > rq->hi)
			ver = rq->hi;
		if (!(req = km_sy_request(cy, rq)) || !(x = malloc(sizeof(*x)))) {
			rq->done = true;
			km_sy_step_error(cy, "out of memory");
			continue;
		}
		*x = (rctx){cy, i};
		rc = km_rpc_call(c, rq->key, ver, req, NULL, on_response, x);
		if (rc == KM_ERR_ENCODE || rc == KM_ERR_NOMEM) {
			/* Not encoded (no memory, or a value its version cannot carry): the step fails, as it would again. */
			free(x);
			rq->done = true;
			km_sy_step_error(cy, "out of memory");
			continue;
		}
		if (rc != KM_OK) {
			free(x);
			km_cluster_drop(rq->cl, c);
			continue;
		}
		rq->sent = true;
	}
	return all;
}

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
	km_sy_list_free(m->skipping, m->nskipping);
	m->skipping = now;
	m->nskipping = nnow;
	m->st[KM_SYNC_GROUPS].skipped = skipped;
	m_set(m->m_skipped, skipped);
}

/* The configs answered on both sides: what to change on the destination; true when there is something. */
static bool plan_alters(sync_cycle *cy)
{
	bool any = false;
	for (size_t i = 0; i < cy->nt; i++) {
		stopic *t = &cy->t[i];
		if (t->cfg_src && t->cfg_dst)
			cy->compared++;
		if (!km_sy_plan_configs(cy, t))
			km_sy_step_error(cy, "out of memory");
		any |= t->nchange > 0;
		if (t->unclean && !in_list(cy->m->warned, cy->m->nwarned, t->name)) {
			KM_WARN(COMP, 0, "%s: source topic %s has unclean.leader.election.enable=true: an unclean "
				"election on the source can rewrite offsets the mirror has already copied",
				cy->m->mirror, t->name);
			list_add(&cy->m->warned, &cy->m->nwarned, t->name);
		}
	}
	if (any)
		add_req(cy, cy->dst, -1, KM_API_INCREMENTAL_ALTER_CONFIGS, IAC_LO, IAC_HI, 0);
	return any;
}

/* Partitions (the grow is the topics module's: asynchronous, idempotent), then the groups of both sides' brokers. */
static void grow_then_list_groups(sync_cycle *cy)
{
	step_end(cy, KM_SYNC_PARTITIONS);
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
		km_sy_step_error(cy, "the source's Metadata failed: its partition counts are not known");
	step_end(cy, KM_SYNC_GROUPS);
	cy->ph = PH_GROUPS;
	if (!cy->nsrc_nodes || !cy->ndst_nodes)
		km_sy_step_error(cy, "the %s's Metadata failed: its brokers are not known",
				 !cy->nsrc_nodes ? "source" : "destination");
	for (size_t i = 0; i < cy->nsrc_nodes; i++)
		add_req(cy, cy->src, cy->src_nodes[i], KM_API_LIST_GROUPS, LG_LO, LG_HI, 0);
	for (size_t i = 0; i < cy->ndst_nodes; i++)
		add_req(cy, cy->dst, cy->dst_nodes[i], KM_API_LIST_GROUPS, LG_LO, LG_HI, 0);
}

/* Each group's offsets asked of its coordinator on both sides (one request per coordinator and API). */
static void ask_offsets(sync_cycle *cy)
{
	for (int side_i = 0; side_i < 2; side_i++) {
		km_cluster *cl = side_i ? cy->dst : cy->src;
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
}

/* A commit of the source's offsets for each group whose destination offsets differ. */
static void plan_commits(sync_cycle *cy)
{
	for (size_t i = 0; i < cy->ng; i++) {
		sgroup *g = &cy->g[i];
		bool differs = false;
		if (g->skip || !g->src_ok || !g->dst_ok || g->dst_coord < 0)
			continue;
		cy->compared++;
		for (size_t j = 0; j < g->nsrc && !differs; j++)
			differs = !km_sy_dst_has(g, &g->src[j]);
		if (differs && g->share)
			add_req(cy, cy->dst, g->dst_coord, KM_API_ALTER_SHARE_GROUP_OFFSETS, ASO_LO, ASO_HI, i);
		else if (differs)
			add_req(cy, cy->dst, g->dst_coord, KM_API_OFFSET_COMMIT, OC_LO, OC_HI, i);
	}
}

/* The bindings in scope on one side and not the other: created or deleted on the destination. */
static void plan_acl_changes(sync_cycle *cy)
{
	if (cy->step_failed) /* one side unknown: changing the other would be a guess */
		return;
	cy->compared = (int64_t)(cy->nsa + cy->nda);
	cy->create = km_arena_alloc(&cy->a, (cy->nsa + 1) * sizeof(*cy->create));
	cy->delete = km_arena_alloc(&cy->a, (cy->nda + 1) * sizeof(*cy->delete));
	if (!cy->create || !cy->delete) {
		km_sy_step_error(cy, "out of memory");
		return;
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
}

/*
 * The phase's requests are all answered: what they say, and the next phase's requests. A phase
 * with nothing to ask goes on to the next at once.
 */
static void next_phase(sync_cycle *cy)
{
	cy->nrq = cy->caprq = 0;
	cy->rq = NULL;
	switch (cy->ph) {
	case PH_META:
		cy->ph = PH_FOLLOW;
		if (km_sy_follow_start(cy))
			return;
		__attribute__((fallthrough)); /* nothing to start */
	case PH_FOLLOW:
		if (cy->step == KM_SYNC_TOPICS)
			step_end(cy, KM_SYNC_CONFIGS);
		if (!cy->nt) {
			/* Only following: no topic of the mirror is synced yet, the other steps have nothing to do. */
			cy->ph = PH_END;
			return;
		}
		cy->ph = PH_CFG;
		add_req(cy, cy->src, -1, KM_API_DESCRIBE_CONFIGS, DC_LO, DC_HI, 0);
		add_req(cy, cy->dst, -1, KM_API_DESCRIBE_CONFIGS, DC_LO, DC_HI, 0);
		return;
	case PH_CFG:
		cy->ph = PH_ALTER;
		if (plan_alters(cy))
			return;
		__attribute__((fallthrough)); /* nothing to change */
	case PH_ALTER:
		grow_then_list_groups(cy);
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
	case PH_COORD:
		cy->ph = PH_OFFSETS;
		ask_offsets(cy);
		if (cy->nrq)
			return;
		__attribute__((fallthrough));
	case PH_OFFSETS:
		note_skips(cy);
		cy->ph = PH_COMMIT;
		plan_commits(cy);
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
		plan_acl_changes(cy);
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

/* This step and the rest of the cycle fail with why (a cluster not reached in time, a mirror that cannot be synced). */
static void fail_rest(sync_cycle *cy, const char *why)
{
	for (km_sync_kind k = cy->step; k < KM_SYNC__COUNT; k++) {
		cy->step = k;
		km_sy_step_error(cy, "%s", why);
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
			km_sy_cycle_free(cy);
			return;
		}
		if (!pump(cy))
			break;
		next_phase(cy);
	}
	if (km_wall_ms() >= cy->deadline) {
		char why[480];
		snprintf(why, sizeof(why), "gave up after %d s: %s", STEP_TIMEOUT_MS / 1000, cy->why[0] ? cy->why : "no answer");
		fail_rest(cy, why);
		later(cy, 0);
		return;
	}
	/* The clusters call on_cluster when a connection changes; the timer covers the deadline. */
	later(cy, 250);
}

void km_sy_cycle_free(sync_cycle *cy)
{
	cy->finished = true;
	km_sy_follow_detach(cy);
	/* The clusters first: their pending requests fail now, while cy is there to see it finished. */
	km_cluster_free(cy->src);
	km_cluster_free(cy->dst);
	if (cy->src_tls)
		SSL_CTX_free(cy->src_tls);
	km_name_filter_free(cy->groups);
	km_name_filter_free(cy->topics);
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

/* Start a cycle of m; false when there is nothing to sync (no synced topic, no topic pattern) or it cannot start. */
bool km_sy_cycle_start(msync *m, const km_state_mirror *sm, const km_mirror_options *mo)
{
	km_mirror *mi = m->s->mi;
	sync_cycle *cy = calloc(1, sizeof(*cy));
	char err[300];
	size_t nt = 0;

	if (!cy)
		return false;
	cy->m = m;
	km_arena_init(&cy->a, 0);
	/* The topics step only for a mirror that follows its source's topics: else the cycle starts at configs. */
	cy->step = mo->topics_include && *mo->topics_include ? KM_SYNC_TOPICS : KM_SYNC_CONFIGS;
	cy->deadline = km_wall_ms() + STEP_TIMEOUT_MS;
	cy->t = km_arena_calloc(&cy->a, (km_state_mirror_topic_count(sm) + 1) * sizeof(*cy->t));
	for (size_t i = 0; cy->t && i < km_state_mirror_topic_count(sm); i++) {
		const km_state_topic *t = km_state_mirror_topic_at(sm, i);
		if (!synced_state(km_state_topic_state(t)))
			continue;
		cy->t[nt++] = (stopic){.name = km_state_topic_name(t),
				       .store_parts = (int32_t)km_state_topic_partition_count(t), .src_parts = -1};
	}
	cy->nt = nt;
	if (!cy->t || (!nt && !(mo->topics_include && *mo->topics_include))) {
		km_arena_free(&cy->a);
		free(cy);
		return false;
	}
	/* The topic names point into the store: copy them (a cycle outlives store changes). */
	for (size_t i = 0; i < nt; i++)
		cy->t[i].name = km_sy_adup(&cy->a, km_str_c(cy->t[i].name));
	snprintf(cy->src_boot, sizeof(cy->src_boot), "%s", km_state_mirror_source(sm));
	cy->ev = event_new(km_mirror_base(mi), -1, 0, on_ev, cy);
	/* A value stored before its check existed can still be bad: the cycle says so, each time. */
	if (mo->topics_include && *mo->topics_include &&
	    !(cy->topics = km_name_filter_parse(mo->topics_include, mo->topics_exclude, err, sizeof(err))))
		snprintf(cy->why, sizeof(cy->why), "mirror.topics.include / mirror.topics.exclude: %s (kmirror alter fixes it)",
			 err);
	else if (!(cy->groups = km_name_filter_parse(mo->groups_include, mo->groups_exclude, err, sizeof(err))))
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
		km_sy_cycle_free(cy);
		return true;
	}
	m->cy = cy;
	cy->ph = PH_META;
	add_req(cy, cy->src, -1, KM_API_METADATA, META_LO, META_HI, 0);
	add_req(cy, cy->dst, -1, KM_API_METADATA, META_LO, META_HI, 0);
	later(cy, 0);
	return true;
}
