/* A metadata sync cycle's requests, built from what the cycle knows (configs to change, offsets to commit, ACLs). */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/alter_share_group_offsets_request.h"
#include "kmirror/msg/create_acls_request.h"
#include "kmirror/msg/delete_acls_request.h"
#include "kmirror/msg/describe_acls_request.h"
#include "kmirror/msg/describe_configs_request.h"
#include "kmirror/msg/describe_share_group_offsets_request.h"
#include "kmirror/msg/find_coordinator_request.h"
#include "kmirror/msg/list_groups_request.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/offset_commit_request.h"
#include "kmirror/msg/offset_fetch_request.h"
#include "mirror/sync/sync.h"

/* The synced topics; from the source, every topic when the mirror follows its topics (step 0). */
static const void *req_metadata(sync_cycle *cy, const sreq *rq)
{
	km_metadata_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_metadata_request_topic *ts = km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*ts));

	if (!m || !ts)
		return NULL;
	km_metadata_request_init(m);
	if (rq->cl == cy->src && cy->topics) {
		m->topics.count = -1;
		m->allow_auto_topic_creation = false;
		return m;
	}
	for (size_t i = 0; i < cy->nt; i++) {
		km_metadata_request_topic_init(&ts[i]);
		ts[i].name = km_str_c(cy->t[i].name);
	}
	m->topics.items = ts;
	m->topics.count = (int32_t)cy->nt;
	m->allow_auto_topic_creation = false;
	return m;
}

static const void *req_describe_configs(sync_cycle *cy)
{
	km_describe_configs_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_describe_configs_request_describe_configs_resource *rs =
		km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*rs));

	if (!m || !rs)
		return NULL;
	km_describe_configs_request_init(m);
	for (size_t i = 0; i < cy->nt; i++) {
		km_describe_configs_request_describe_configs_resource_init(&rs[i]);
		rs[i].resource_type = K_RES_TOPIC;
		rs[i].resource_name = km_str_c(cy->t[i].name);
		rs[i].configuration_keys.count = -1;
	}
	m->resources.items = rs;
	m->resources.count = (int32_t)cy->nt;
	return m;
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
bool km_sy_plan_configs(sync_cycle *cy, stopic *t)
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
static const void *req_alter(sync_cycle *cy)
{
	km_incremental_alter_configs_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_incremental_alter_configs_request_alter_configs_resource *rs =
		km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*rs));
	int32_t k = 0;

	if (!m || !rs)
		return NULL;
	km_incremental_alter_configs_request_init(m);
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
	m->resources.items = rs;
	m->resources.count = k;
	return m;
}

static const void *req_list_groups(sync_cycle *cy)
{
	km_list_groups_request *m = km_arena_alloc(&cy->a, sizeof(*m));

	if (m)
		km_list_groups_request_init(m);
	return m;
}

/* FindCoordinator of every group to sync (rq->arg 0: all of them). */
static const void *req_find_coordinator(sync_cycle *cy)
{
	km_find_coordinator_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_str *keys = km_arena_calloc(&cy->a, (cy->ng ? cy->ng : 1) * sizeof(*keys));
	int32_t k = 0;

	if (!m || !keys)
		return NULL;
	km_find_coordinator_request_init(m);
	for (size_t i = 0; i < cy->ng; i++)
		keys[k++] = km_str_c(cy->g[i].name);
	m->key_type = K_GROUP_COORDINATOR_KEY;
	m->coordinator_keys.items = keys;
	m->coordinator_keys.count = k;
	return m;
}

/* OffsetFetch (every topic) of the groups whose coordinator on that side is the request's broker. */
static const void *req_offset_fetch(sync_cycle *cy, sreq *rq)
{
	km_offset_fetch_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_offset_fetch_request_group *gs = km_arena_calloc(&cy->a, (cy->ng ? cy->ng : 1) * sizeof(*gs));
	bool src = rq->cl == cy->src;
	int32_t k = 0;

	if (!m || !gs)
		return NULL;
	km_offset_fetch_request_init(m);
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
	m->groups.items = gs;
	m->groups.count = k;
	m->require_stable = false;
	return m;
}

/* DescribeShareGroupOffsets (every topic) of the share groups coordinated by the request's broker. */
static const void *req_share_describe(sync_cycle *cy, sreq *rq)
{
	km_describe_share_group_offsets_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_describe_share_group_offsets_request_group *gs = km_arena_calloc(&cy->a, (cy->ng ? cy->ng : 1) * sizeof(*gs));
	bool src = rq->cl == cy->src;
	int32_t k = 0;

	if (!m || !gs)
		return NULL;
	km_describe_share_group_offsets_request_init(m);
	for (size_t i = 0; i < cy->ng; i++) {
		sgroup *g = &cy->g[i];
		if (!g->share || (!src && g->skip) || (src ? g->src_coord : g->dst_coord) != rq->node)
			continue;
		km_describe_share_group_offsets_request_group_init(&gs[k]);
		gs[k].group_id = km_str_c(g->name);
		gs[k++].topics.count = -1;
	}
	m->groups.items = gs;
	m->groups.count = k;
	return m;
}

/* Whether the group's offset for (topic, partition) on the destination is already o's. */
bool km_sy_dst_has(const sgroup *g, const soff *o)
{
	for (size_t d = 0; d < g->ndst; d++)
		if (g->dst[d].topic == o->topic && g->dst[d].partition == o->partition && g->dst[d].offset == o->offset)
			return true;
	return false;
}

/* The share group's start offsets (physical already) that differ, as one AlterShareGroupOffsets. */
static const void *req_share_alter(sync_cycle *cy, sreq *rq)
{
	sgroup *g = &cy->g[rq->arg];
	km_alter_share_group_offsets_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_alter_share_group_offsets_request_topic *ts = km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*ts));
	int32_t nt = 0;

	if (!m || !ts)
		return NULL;
	g->ncommit = 0; /* built again when a send failed */
	km_alter_share_group_offsets_request_init(m);
	m->group_id = km_str_c(g->name);
	for (size_t ti = 0; ti < cy->nt; ti++) {
		km_alter_share_group_offsets_request_partition *ps = NULL;
		int32_t np = 0;
		for (size_t j = 0; j < g->nsrc; j++) {
			const soff *o = &g->src[j];
			if (o->topic != (int32_t)ti || km_sy_dst_has(g, o))
				continue;
			if (!ps && !(ps = km_arena_calloc(&cy->a, g->nsrc * sizeof(*ps))))
				return NULL;
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
	m->topics.items = ts;
	m->topics.count = nt;
	return m;
}

/* The group's source offsets that differ from the destination's, as one OffsetCommit. */
static const void *req_commit(sync_cycle *cy, sreq *rq)
{
	sgroup *g = &cy->g[rq->arg];
	km_offset_commit_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_offset_commit_request_topic *ts = km_arena_calloc(&cy->a, (cy->nt ? cy->nt : 1) * sizeof(*ts));
	int32_t nt = 0;

	if (!m || !ts)
		return NULL;
	g->ncommit = 0; /* built again when a send failed */
	km_offset_commit_request_init(m);
	m->group_id = km_str_c(g->name);
	m->generation_id_or_member_epoch = -1;
	m->member_id = km_str_c("");
	m->group_instance_id = KM_STR_NULL;
	m->retention_time_ms = -1;
	for (size_t ti = 0; ti < cy->nt; ti++) {
		km_offset_commit_request_partition *ps = NULL;
		int32_t np = 0;
		for (size_t j = 0; j < g->nsrc; j++) {
			soff *o = &g->src[j];
			if (o->topic != (int32_t)ti || km_sy_dst_has(g, o))
				continue;
			if (!ps && !(ps = km_arena_calloc(&cy->a, g->nsrc * sizeof(*ps))))
				return NULL;
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
	m->topics.items = ts;
	m->topics.count = nt;
	return m;
}

static const void *req_describe_acls(sync_cycle *cy)
{
	km_describe_acls_request *m = km_arena_alloc(&cy->a, sizeof(*m));

	if (!m)
		return NULL;
	km_describe_acls_request_init(m);
	m->resource_type_filter = K_ANY;
	m->resource_name_filter = KM_STR_NULL;
	m->pattern_type_filter = K_PATTERN_ANY;
	m->principal_filter = KM_STR_NULL;
	m->host_filter = KM_STR_NULL;
	m->operation = K_ANY;
	m->permission_type = K_ANY;
	return m;
}

static const void *req_create_acls(sync_cycle *cy)
{
	km_create_acls_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_create_acls_request_acl_creation *cs = km_arena_calloc(&cy->a, (cy->ncreate + 1) * sizeof(*cs));

	if (!m || !cs)
		return NULL;
	km_create_acls_request_init(m);
	for (size_t i = 0; i < cy->ncreate; i++) {
		const sacl *b = cy->create[i];
		km_create_acls_request_acl_creation_init(&cs[i]);
		cs[i] = (km_create_acls_request_acl_creation){.resource_type = b->rtype, .resource_name = km_str_c(b->rname),
							       .resource_pattern_type = b->pattern,
							       .principal = km_str_c(b->principal),
							       .host = km_str_c(b->host), .operation = b->op,
							       .permission_type = b->perm};
	}
	m->creations.items = cs;
	m->creations.count = (int32_t)cy->ncreate;
	return m;
}

static const void *req_delete_acls(sync_cycle *cy)
{
	km_delete_acls_request *m = km_arena_alloc(&cy->a, sizeof(*m));
	km_delete_acls_request_delete_acls_filter *fs = km_arena_calloc(&cy->a, (cy->ndelete + 1) * sizeof(*fs));

	if (!m || !fs)
		return NULL;
	km_delete_acls_request_init(m);
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
	m->filters.items = fs;
	m->filters.count = (int32_t)cy->ndelete;
	return m;
}

const void *km_sy_request(sync_cycle *cy, sreq *rq)
{
	switch (rq->key) {
	case KM_API_METADATA:
		return req_metadata(cy, rq);
	case KM_API_DESCRIBE_CONFIGS:
		return req_describe_configs(cy);
	case KM_API_INCREMENTAL_ALTER_CONFIGS:
		return req_alter(cy);
	case KM_API_LIST_GROUPS:
		return req_list_groups(cy);
	case KM_API_FIND_COORDINATOR:
		return req_find_coordinator(cy);
	case KM_API_OFFSET_FETCH:
		return req_offset_fetch(cy, rq);
	case KM_API_OFFSET_COMMIT:
		return req_commit(cy, rq);
	case KM_API_DESCRIBE_SHARE_GROUP_OFFSETS:
		return req_share_describe(cy, rq);
	case KM_API_ALTER_SHARE_GROUP_OFFSETS:
		return req_share_alter(cy, rq);
	case KM_API_DESCRIBE_ACLS:
		return req_describe_acls(cy);
	case KM_API_CREATE_ACLS:
		return req_create_acls(cy);
	case KM_API_DELETE_ACLS:
		return req_delete_acls(cy);
	default:
		return NULL;
	}
}
