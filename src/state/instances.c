/*
 * The kmirrords' own records of __mirror_state: each one's report (docs/state.md, "Instances") and
 * the group they share their mirrors through (docs/state.md, "The sync group").
 */
#include <stdlib.h>
#include <string.h>

#include "kmirror/arena.h"
#include "kmirror/msg/mirror_state_instance_value.h"
#include "kmirror/msg/mirror_state_sync_group_value.h"
#include "state/state_int.h"

static void instance_clear(km_state_instance *in)
{
	free(in->id);
	free(in->pipelines);
	free(in->version);
	for (size_t i = 0; i < in->nowned; i++)
		free(in->owned[i]);
	free(in->owned);
	memset(in, 0, sizeof(*in));
}

static void sync_group_clear(km_state_sync_group *g)
{
	free(g->base);
	free(g->group);
	free(g->moved_by);
	free(g->reason);
	memset(g, 0, sizeof(*g));
}

void km_state_instances_free(km_state_model *m)
{
	for (size_t i = 0; i < m->ninstances; i++)
		instance_clear(&m->instances[i]);
	free(m->instances);
	m->instances = NULL;
	m->ninstances = 0;
	for (size_t i = 0; i < m->nsync_groups; i++)
		sync_group_clear(&m->sync_groups[i]);
	free(m->sync_groups);
	m->sync_groups = NULL;
	m->nsync_groups = 0;
}

static size_t instance_find(const km_state_model *m, km_str id)
{
	for (size_t i = 0; i < m->ninstances; i++)
		if (strlen(m->instances[i].id) == (size_t)id.len && !memcmp(m->instances[i].id, id.p, (size_t)id.len))
			return i;
	return m->ninstances;
}

km_err km_state_instance_apply(km_state_model *m, km_str id, const uint8_t *val, size_t vlen, bool tomb)
{
	size_t at = instance_find(m, id);
	km_mirror_state_instance_value v;
	km_state_instance in;
	km_arena a;
	km_rd r;
	int16_t ver;
	km_err rc;

	if (tomb) {
		if (at < m->ninstances) {
			instance_clear(&m->instances[at]);
			memmove(&m->instances[at], &m->instances[at + 1], (m->ninstances - at - 1) * sizeof(in));
			m->ninstances--;
		}
		return KM_OK;
	}
	km_rd_init(&r, val, vlen);
	if (!km_rd_i16(&r, "Version", &ver) || ver != 0)
		return KM_ERR_DECODE;
	km_arena_init(&a, 4096);
	km_mirror_state_instance_value_init(&v);
	rc = km_mirror_state_instance_value_decode(&r, 0, &v, &a);
	memset(&in, 0, sizeof(in));
	if (rc == KM_OK && (v.owned_mirrors.count < 0 || v.owned_mirrors.count > 100000))
		rc = KM_ERR_DECODE;
	if (rc == KM_OK) {
		in.id = km_state_dup_str(id);
		in.report_ms = v.report_time_ms;
		in.start_ms = v.start_time_ms;
		in.state_delay_ms = v.state_delay_ms;
		in.pipelines = km_state_dup_str(v.pipelines);
		in.version = km_state_dup_str(v.software_version);
		if (v.owned_mirrors.count && !(in.owned = calloc((size_t)v.owned_mirrors.count, sizeof(*in.owned))))
			rc = KM_ERR_NOMEM;
		for (int32_t i = 0; rc == KM_OK && i < v.owned_mirrors.count; i++)
			if (!(in.owned[in.nowned++] = km_state_dup_str(v.owned_mirrors.items[i])))
				rc = KM_ERR_NOMEM;
		if (rc == KM_OK && (!in.id || !in.pipelines || !in.version))
			rc = KM_ERR_NOMEM;
	}
	km_arena_free(&a);
	if (rc != KM_OK) {
		instance_clear(&in);
		return rc;
	}
	if (at == m->ninstances) {
		km_state_instance *n = realloc(m->instances, (m->ninstances + 1) * sizeof(*n));
		if (!n) {
			instance_clear(&in);
			return KM_ERR_NOMEM;
		}
		m->instances = n;
		m->ninstances++;
	} else {
		instance_clear(&m->instances[at]);
	}
	m->instances[at] = in;
	return KM_OK;
}

km_err km_state_instance_value_encode(km_wr *w, const km_state_instance *in)
{
	km_mirror_state_instance_value v;
	km_str *owned = in->nowned ? calloc(in->nowned, sizeof(*owned)) : NULL;

	if (in->nowned && !owned)
		return KM_ERR_NOMEM;
	km_mirror_state_instance_value_init(&v);
	v.report_time_ms = in->report_ms;
	v.start_time_ms = in->start_ms;
	v.state_delay_ms = in->state_delay_ms;
	v.pipelines = km_str_c(in->pipelines ? in->pipelines : "");
	v.software_version = km_str_c(in->version ? in->version : "");
	for (size_t i = 0; i < in->nowned; i++)
		owned[i] = km_str_c(in->owned[i]);
	v.owned_mirrors.count = (int32_t)in->nowned;
	v.owned_mirrors.items = owned;
	km_wr_i16(w, 0);
	km_mirror_state_instance_value_encode(w, 0, &v);
	free(owned);
	return km_wr_ok(w) ? KM_OK : KM_ERR_NOMEM;
}

static size_t sync_group_find(const km_state_model *m, km_str base)
{
	for (size_t i = 0; i < m->nsync_groups; i++)
		if (strlen(m->sync_groups[i].base) == (size_t)base.len && !memcmp(m->sync_groups[i].base, base.p, (size_t)base.len))
			return i;
	return m->nsync_groups;
}

int km_state_sync_group_name(km_str base, int32_t gen, char *out, size_t len)
{
	int n = gen ? snprintf(out, len, "%.*s.%d", (int)base.len, base.p, (int)gen)
		    : snprintf(out, len, "%.*s", (int)base.len, base.p);
	return n >= 0 && (size_t)n < len ? n : -1;
}

bool km_state_is_sync_group(const char *base, const char *name)
{
	size_t n = strlen(base);
	if (strncmp(name, base, n))
		return false;
	if (!name[n])
		return true;
	if (name[n] != '.' || !name[n + 1])
		return false;
	for (const char *p = name + n + 1; *p; p++)
		if (*p < '0' || *p > '9')
			return false;
	return true;
}

/* The group a record names is its base's generation (up to a million moves). */
static bool generation_ok(km_str base, int32_t gen, km_str group)
{
	char want[1100];
	int n;
	if (gen < 0 || gen > 1000000 || base.len <= 0 || base.len > 1024 ||
	    memchr(group.p, 0, (size_t)(group.len > 0 ? group.len : 0)))
		return false;
	n = km_state_sync_group_name(base, gen, want, sizeof(want));
	return n > 0 && group.len == n && !memcmp(group.p, want, (size_t)n);
}

km_err km_state_sync_group_apply(km_state_model *m, km_str base, const uint8_t *val, size_t vlen, bool tomb)
{
	size_t at = sync_group_find(m, base);
	km_mirror_state_sync_group_value v;
	km_state_sync_group g;
	km_arena a;
	km_rd r;
	int16_t ver;
	km_err rc;

	if (tomb) {
		if (at < m->nsync_groups) {
			sync_group_clear(&m->sync_groups[at]);
			memmove(&m->sync_groups[at], &m->sync_groups[at + 1], (m->nsync_groups - at - 1) * sizeof(g));
			m->nsync_groups--;
		}
		return KM_OK;
	}
	km_rd_init(&r, val, vlen);
	if (!km_rd_i16(&r, "Version", &ver) || ver != 0)
		return KM_ERR_DECODE;
	km_arena_init(&a, 1024);
	km_mirror_state_sync_group_value_init(&v);
	rc = km_mirror_state_sync_group_value_decode(&r, 0, &v, &a);
	memset(&g, 0, sizeof(g));
	if (rc == KM_OK && !generation_ok(base, v.generation, v.group_id))
		rc = KM_ERR_DECODE;
	if (rc == KM_OK) {
		g.base = km_state_dup_str(base);
		g.generation = v.generation;
		g.group = km_state_dup_str(v.group_id);
		g.moved_ms = v.moved_time_ms;
		g.moved_by = km_state_dup_str(v.moved_by);
		g.reason = km_state_dup_str(v.reason);
		if (!g.base || !g.group || !g.moved_by || !g.reason)
			rc = KM_ERR_NOMEM;
	}
	km_arena_free(&a);
	if (rc != KM_OK) {
		sync_group_clear(&g);
		return rc;
	}
	if (at == m->nsync_groups) {
		km_state_sync_group *n = realloc(m->sync_groups, (m->nsync_groups + 1) * sizeof(*n));
		if (!n) {
			sync_group_clear(&g);
			return KM_ERR_NOMEM;
		}
		m->sync_groups = n;
		m->nsync_groups++;
	} else {
		sync_group_clear(&m->sync_groups[at]);
	}
	m->sync_groups[at] = g;
	return KM_OK;
}

km_err km_state_sync_group_value_encode(km_wr *w, const km_state_sync_group *g)
{
	km_mirror_state_sync_group_value v;

	km_mirror_state_sync_group_value_init(&v);
	v.generation = g->generation;
	v.group_id = km_str_c(g->group ? g->group : "");
	v.moved_time_ms = g->moved_ms;
	v.moved_by = km_str_c(g->moved_by ? g->moved_by : "");
	v.reason = km_str_c(g->reason ? g->reason : "");
	km_wr_i16(w, 0);
	km_mirror_state_sync_group_value_encode(w, 0, &v);
	return km_wr_ok(w) ? KM_OK : KM_ERR_NOMEM;
}

const km_state_sync_group *km_state_model_sync_group(const km_state_model *m, const char *base)
{
	size_t at = sync_group_find(m, km_str_c(base));
	return at < m->nsync_groups ? &m->sync_groups[at] : NULL;
}
