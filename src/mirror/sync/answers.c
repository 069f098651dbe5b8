/* A metadata sync cycle's answers: what the source and the destination said, taken into the cycle's data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/alter_share_group_offsets_response.h"
#include "kmirror/msg/create_acls_response.h"
#include "kmirror/msg/delete_acls_response.h"
#include "kmirror/msg/describe_acls_response.h"
#include "kmirror/msg/describe_configs_response.h"
#include "kmirror/msg/describe_share_group_offsets_response.h"
#include "kmirror/msg/find_coordinator_response.h"
#include "kmirror/msg/incremental_alter_configs_response.h"
#include "kmirror/msg/list_groups_response.h"
#include "kmirror/msg/offset_commit_response.h"
#include "kmirror/msg/offset_fetch_response.h"
#include "mirror/sync/sync.h"

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

	if (km_cluster_brokers(rq->cl, r) != KM_OK)
		return km_sy_step_error(cy, "the %s's metadata could not be taken", km_sy_side(cy, rq->cl));
	if (r->brokers.count > 0 && (*nodes = km_arena_alloc(&cy->a, (size_t)r->brokers.count * sizeof(**nodes)))) {
		for (int32_t i = 0; i < r->brokers.count; i++)
			(*nodes)[i] = r->brokers.items[i].node_id;
		*nn = (size_t)r->brokers.count;
	}
	if (!src)
		return;
	if (cy->topics)
		km_sy_follow_take(cy, r);
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
			km_sy_step_error(cy, "DescribeConfigs of topic %s on the %s: %s%s%.*s", t->name, km_sy_side(cy, rq->cl),
				   km_err_name(res->error_code), res->error_message.len > 0 ? ": " : "",
				   res->error_message.len > 0 ? (int)res->error_message.len : 0, res->error_message.p);
			continue;
		}
		if (!(l = km_arena_calloc(&cy->a, ((size_t)(res->configs.count > 0 ? res->configs.count : 0) + 1) *
							  sizeof(*l))))
			return km_sy_step_error(cy, "out of memory");
		for (int32_t j = 0; j < res->configs.count; j++) {
			const km_describe_configs_response_describe_configs_resource_result *c = &res->configs.items[j];
			const char *name = km_sy_adup(&cy->a, c->name), *value = km_sy_adup(&cy->a, c->value);
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
			km_sy_step_error(cy, "IncrementalAlterConfigs of topic %.*s on the destination: %s%s%.*s",
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
		km_sy_step_error(cy, "ListGroups on %s broker %d: %s", km_sy_side(cy, rq->cl), (int)rq->node,
			   km_err_name(r->error_code));
		return;
	}
	for (int32_t i = 0; i < r->groups.count; i++) {
		const km_list_groups_response_listed_group *lg = &r->groups.items[i];
		const char *name = km_sy_adup(&cy->a, lg->group_id);
		if (!name)
			return km_sy_step_error(cy, "out of memory");
		if (!src) {
			/* Members own a group's offsets: any state but Empty or Dead has them. */
			if (lg->group_state.len > 0 && !km_str_eq_c(lg->group_state, "Empty") &&
			    !km_str_eq_c(lg->group_state, "Dead")) {
				if (!(cy->dst_active = km_sy_agrow(&cy->a, cy->dst_active, cy->nactive, &cy->capactive,
							     sizeof(*cy->dst_active))))
					return km_sy_step_error(cy, "out of memory");
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
		if (km_mirror_is_sync_group(cy->m->s->mi, name) || group_of(cy, lg->group_id) || !km_name_filter_match(cy->groups, name))
			continue;
		if (!(cy->g = km_sy_agrow(&cy->a, cy->g, cy->ng, &cy->capg, sizeof(*cy->g))))
			return km_sy_step_error(cy, "out of memory");
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
			km_sy_step_error(cy, "FindCoordinator of group %s on the %s: %s", g->name, km_sy_side(cy, rq->cl),
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
			km_sy_step_error(cy, "OffsetFetch of group %s on the %s: %s", g->name, km_sy_side(cy, rq->cl),
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
			return km_sy_step_error(cy, "out of memory");
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
				l[n++] = (soff){ti, p->partition_index, p->committed_offset, km_sy_adup(&cy->a, p->metadata)};
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
			km_sy_step_error(cy, "DescribeShareGroupOffsets of group %s on the %s: %s", g->name, km_sy_side(cy, rq->cl),
				   km_err_name(rg->error_code));
			continue;
		}
		for (int32_t j = 0; j < rg->topics.count; j++)
			cap += (size_t)(rg->topics.items[j].partitions.count > 0 ? rg->topics.items[j].partitions.count : 0);
		if (!(l = km_arena_calloc(&cy->a, (cap + 1) * sizeof(*l))))
			return km_sy_step_error(cy, "out of memory");
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
		km_sy_step_error(cy, "AlterShareGroupOffsets of group %s on the destination: %s", g->name,
			   km_err_name(r->error_code));
		return;
	}
	for (int32_t i = 0; i < r->responses.count; i++)
		for (int32_t j = 0; j < r->responses.items[i].partitions.count; j++) {
			int16_t e = r->responses.items[i].partitions.items[j].error_code;
			if (!e || g->commit_failed)
				continue;
			g->commit_failed = true;
			km_sy_step_error(cy, "AlterShareGroupOffsets of group %s on the destination: %s", g->name, km_err_name(e));
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
				km_sy_step_error(cy, "OffsetCommit of group %s on the destination (%.*s-%d): %s", g->name,
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
			return km_sy_step_error(cy, "the %s has no authorizer (SECURITY_DISABLED): ACLs are not synced",
					  km_sy_side(cy, rq->cl));
		return km_sy_step_error(cy, "DescribeAcls on the %s: %s%s%.*s", km_sy_side(cy, rq->cl), km_err_name(r->error_code),
				  r->error_message.len > 0 ? ": " : "",
				  r->error_message.len > 0 ? (int)r->error_message.len : 0, r->error_message.p);
	}
	for (int32_t i = 0; i < r->resources.count; i++) {
		const km_describe_acls_response_describe_acls_resource *res = &r->resources.items[i];
		const char *rname = km_sy_adup(&cy->a, res->resource_name);
		for (int32_t j = 0; j < res->acls.count; j++) {
			const km_describe_acls_response_acl_description *d = &res->acls.items[j];
			sacl b = {res->resource_type, res->pattern_type, d->operation, d->permission_type, rname,
				  km_sy_adup(&cy->a, d->principal), km_sy_adup(&cy->a, d->host)};
			if (!b.rname || !b.principal || !b.host)
				return km_sy_step_error(cy, "out of memory");
			if (!km_acl_scope_match(cy->acls, b.rtype, b.rname, b.op, b.perm, b.principal))
				continue;
			if (!(*l = km_sy_agrow(&cy->a, *l, *n, cap, sizeof(**l))))
				return km_sy_step_error(cy, "out of memory");
			(*l)[(*n)++] = b;
		}
	}
}

static void acl_line(const sacl *b, char *buf, size_t len)
{
	snprintf(buf, len, "resource type %d name \"%s\" pattern %d principal %s host %s operation %d permission %d",
		 (int)b->rtype, b->rname, (int)b->pattern, b->principal, b->host, (int)b->op, (int)b->perm);
}

static void took_create_acls(sync_cycle *cy, const km_create_acls_response *r)
{
	char line[800];

	for (int32_t i = 0; i < r->results.count && (size_t)i < cy->ncreate; i++) {
		acl_line(cy->create[i], line, sizeof(line));
		if (r->results.items[i].error_code) {
			km_sy_step_error(cy, "CreateAcls on the destination (%s): %s", line,
				   km_err_name(r->results.items[i].error_code));
			continue;
		}
		cy->changes++;
		KM_INFO(COMP, 0, "%s: ACL created on the destination: %s", cy->m->mirror, line);
	}
}

static void took_delete_acls(sync_cycle *cy, const km_delete_acls_response *r)
{
	char line[800];

	for (int32_t i = 0; i < r->filter_results.count && (size_t)i < cy->ndelete; i++) {
		acl_line(cy->delete[i], line, sizeof(line));
		if (r->filter_results.items[i].error_code) {
			km_sy_step_error(cy, "DeleteAcls on the destination (%s): %s", line,
				   km_err_name(r->filter_results.items[i].error_code));
			continue;
		}
		cy->changes += r->filter_results.items[i].matching_acls.count;
		KM_INFO(COMP, 0, "%s: ACL deleted on the destination (the source does not have it): %s", cy->m->mirror,
			line);
	}
}

void km_sy_take(sync_cycle *cy, sreq *rq, const void *msg)
{
	switch (rq->key) {
	case KM_API_METADATA:
		return took_metadata(cy, rq, msg);
	case KM_API_DESCRIBE_CONFIGS:
		return took_configs(cy, rq, msg);
	case KM_API_INCREMENTAL_ALTER_CONFIGS:
		return took_alter(cy, msg);
	case KM_API_LIST_GROUPS:
		return took_groups(cy, rq, msg);
	case KM_API_FIND_COORDINATOR:
		return took_coordinators(cy, rq, msg);
	case KM_API_OFFSET_FETCH:
		return took_offsets(cy, rq, msg);
	case KM_API_OFFSET_COMMIT:
		return took_commit(cy, rq, msg);
	case KM_API_DESCRIBE_SHARE_GROUP_OFFSETS:
		return took_share_offsets(cy, rq, msg);
	case KM_API_ALTER_SHARE_GROUP_OFFSETS:
		return took_share_alter(cy, rq, msg);
	case KM_API_DESCRIBE_ACLS:
		return took_acls(cy, rq, msg);
	case KM_API_CREATE_ACLS:
		return took_create_acls(cy, msg);
	case KM_API_DELETE_ACLS:
		return took_delete_acls(cy, msg);
	default:
		break;
	}
}
