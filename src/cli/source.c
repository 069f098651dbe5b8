/* A mirror's source cluster, asked by the dry runs (the end offsets of partitions, from their leaders, now) and by start's --topics-regex (its topics). */
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/metadata_response.h"

/* The source is given this long at most (a dry run must answer while a source hangs). */
#define SOURCE_TIMEOUT_MS 5000

static int64_t source_timeout(const km_cli_args *a)
{
	return a->timeout_ms > 0 && a->timeout_ms < SOURCE_TIMEOUT_MS ? a->timeout_ms : SOURCE_TIMEOUT_MS;
}

/* Metadata of the parts' topics (on y's connection): each part's leader, -1 when it has none. */
static bool leaders_of(ctx *y, km_cmd_src_part *parts, size_t n, km_metadata_response *mr, char *why, size_t whylen)
{
	km_metadata_request m;
	km_metadata_request_topic *ts = km_arena_calloc(&y->arena, (n + 1) * sizeof(*ts));
	int16_t v = km_cli_conn_version(y->cc, KM_API_METADATA);
	int32_t k = 0;

	if (!ts)
		return false;
	if (v < 1) {
		snprintf(why, whylen, "the source does not answer Metadata v1+");
		return false;
	}
	km_metadata_request_init(&m);
	for (size_t i = 0; i < n; i++) {
		bool seen = false;
		for (int32_t j = 0; j < k && !seen; j++)
			seen = km_str_eq_c(ts[j].name, parts[i].topic);
		if (!seen) {
			km_metadata_request_topic_init(&ts[k]);
			ts[k++].name = km_str_c(parts[i].topic);
		}
	}
	m.topics.items = ts;
	m.topics.count = k;
	m.allow_auto_topic_creation = false;
	if (!km_cmd_rpc(y, KM_API_METADATA, v > 12 ? 12 : v, &m, mr)) {
		snprintf(why, whylen, "Metadata on the source failed");
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		parts[i].leader = -1;
		for (int32_t t = 0; t < mr->topics.count; t++)
			if (km_str_eq_c(mr->topics.items[t].name, parts[i].topic) && !mr->topics.items[t].error_code)
				for (int32_t p = 0; p < mr->topics.items[t].partitions.count; p++)
					if (mr->topics.items[t].partitions.items[p].partition_index == parts[i].partition)
						parts[i].leader = mr->topics.items[t].partitions.items[p].leader_id;
	}
	return true;
}

/* ListOffsets latest at isolation (0: the end, 1: the last stable offset) of the parts led by leader, on z's connection. */
static bool ends_at(ctx *z, km_cmd_src_part *parts, size_t n, int32_t leader, int8_t isolation)
{
	km_list_offsets_request m;
	km_list_offsets_response r;
	km_list_offsets_request_list_offsets_topic *lt = km_arena_calloc(&z->arena, (n + 1) * sizeof(*lt));
	km_list_offsets_request_list_offsets_partition *lp = km_arena_calloc(&z->arena, (n + 1) * sizeof(*lp));
	int16_t v = km_cli_conn_version(z->cc, KM_API_LIST_OFFSETS);
	int32_t nt = 0;

	if (!lt || !lp || v < 2)
		return false;
	/* One topic entry per part (a topic may repeat: the broker answers each). */
	km_list_offsets_request_init(&m);
	m.replica_id = -1;
	m.isolation_level = isolation;
	for (size_t i = 0; i < n; i++) {
		if (parts[i].leader != leader)
			continue;
		km_list_offsets_request_list_offsets_partition_init(&lp[i]);
		lp[i].partition_index = parts[i].partition;
		lp[i].current_leader_epoch = -1;
		lp[i].timestamp = -1;
		km_list_offsets_request_list_offsets_topic_init(&lt[nt]);
		lt[nt].name = km_str_c(parts[i].topic);
		lt[nt].partitions.items = &lp[i];
		lt[nt++].partitions.count = 1;
	}
	m.topics.items = lt;
	m.topics.count = nt;
	if (!km_cmd_rpc(z, KM_API_LIST_OFFSETS, v > 9 ? 9 : v, &m, &r))
		return false;
	for (int32_t t = 0; t < r.topics.count; t++)
		for (int32_t q = 0; q < r.topics.items[t].partitions.count; q++) {
			const km_list_offsets_response_list_offsets_partition_response *pr = &r.topics.items[t].partitions.items[q];
			for (size_t i = 0; i < n; i++)
				if (parts[i].leader == leader && parts[i].partition == pr->partition_index &&
				    km_str_eq_c(r.topics.items[t].name, parts[i].topic) && !pr->error_code) {
					if (isolation)
						parts[i].lso = pr->offset;
					else
						parts[i].end = pr->offset;
				}
		}
	return true;
}

bool km_cmd_source_ends(ctx *x, const char *source, km_cmd_src_part *parts, size_t n, char *why, size_t whylen)
{
	km_metadata_response mr;
	ctx y = *x;
	char err[1024] = "";
	int rc;
	bool all = true;

	for (size_t i = 0; i < n; i++)
		parts[i].end = parts[i].lso = parts[i].leader = -1;
	y.resp = NULL;
	y.resp_len = 0;
	if (!(y.cc = km_cmd_connect(x->a, source, false, source_timeout(x->a), x->err, err, sizeof(err), &rc))) {
		snprintf(why, whylen, "%s", err[0] ? err : "its connection settings (--command-config) are not usable");
		return false;
	}
	/* The sub-contexts allocate in the command's arena: its state is taken back after each. */
	if (!leaders_of(&y, parts, n, &mr, why, whylen)) {
		x->arena = y.arena;
		free(y.resp);
		km_cli_conn_free(y.cc);
		return false;
	}
	x->arena = y.arena;
	/* Each leader in turn, on a connection of its own (the broker list named it). */
	for (int32_t b = 0; b < mr.brokers.count; b++) {
		const km_metadata_response_broker *br = &mr.brokers.items[b];
		char addr[300];
		bool leads = false;
		ctx z;
		for (size_t i = 0; i < n && !leads; i++)
			leads = parts[i].leader == br->node_id;
		if (!leads)
			continue;
		snprintf(addr, sizeof(addr), br->host.len > 0 && memchr(br->host.p, ':', (size_t)br->host.len) ? "[%.*s]:%d" : "%.*s:%d",
			 br->host.len > 0 ? (int)br->host.len : 0, br->host.p, (int)br->port);
		z = *x;
		z.resp = NULL;
		z.resp_len = 0;
		if (!(z.cc = km_cmd_connect(x->a, addr, false, source_timeout(x->a), x->err, err, sizeof(err), &rc))) {
			snprintf(why, whylen, "broker %d of the source: %s", (int)br->node_id, err);
			continue;
		}
		if (!ends_at(&z, parts, n, br->node_id, 0) || !ends_at(&z, parts, n, br->node_id, 1))
			snprintf(why, whylen, "ListOffsets on broker %d of the source failed", (int)br->node_id);
		x->arena = z.arena;
		free(z.resp);
		km_cli_conn_free(z.cc);
	}
	free(y.resp);
	km_cli_conn_free(y.cc);
	for (size_t i = 0; i < n; i++)
		if (parts[i].end < 0) {
			if (!why[0])
				snprintf(why, whylen, "the source did not answer for %s-%d%s", parts[i].topic, (int)parts[i].partition,
					 parts[i].leader < 0 ? " (no leader)" : "");
			all = false;
		}
	return all;
}

bool km_cmd_source_topics(ctx *x, const char *source, km_str **names, size_t *n, char *why, size_t whylen)
{
	ctx y = *x;
	char err[1024] = "";
	int rc;
	bool ok;

	*names = NULL;
	*n = 0;
	y.resp = NULL;
	y.resp_len = 0;
	if (!(y.cc = km_cmd_connect(x->a, source, false, source_timeout(x->a), x->err, err, sizeof(err), &rc))) {
		snprintf(why, whylen, "%s", err[0] ? err : "its connection settings (--command-config) are not usable");
		return false;
	}
	why[0] = '\0';
	if (!(ok = km_cmd_topic_names(&y, names, n, why, whylen)) && !why[0])
		snprintf(why, whylen, "Metadata on the source failed");
	x->arena = y.arena;
	free(y.resp);
	km_cli_conn_free(y.cc);
	return ok;
}
