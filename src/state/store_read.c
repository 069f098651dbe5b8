/* The state store's read views: topics, mirrors, partitions and configs as the committed model holds them (docs/state.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/secret.h"
#include "state/state_int.h"

#define COMP "state"

const km_state_topic *km_state_topic_find(const km_state *st, const char *topic, size_t len)
{
	return km_state_model_topic(&st->model, topic, len);
}

const km_state_topic *km_state_topic_find_id(const km_state *st, const km_uuid *id)
{
	return km_state_model_topic_id(&st->model, id);
}

bool km_state_topic_read_only(const km_state_topic *t, int32_t partition)
{
	if (partition >= 0 && (size_t)partition < t->nparts && t->parts[partition].present)
		return t->parts[partition].state != KM_MP_STOPPED;
	return km_state_topic_state(t) != KM_MP_STOPPED;
}

const char *km_state_topic_name(const km_state_topic *t) { return t->name; }
const km_state_mirror *km_state_topic_mirror(const km_state_topic *t) { return t->mirror; }
const km_uuid *km_state_topic_id(const km_state_topic *t) { return &t->id; }

km_mp_state km_state_topic_state(const km_state_topic *t)
{
	static const km_mp_state order[] = {KM_MP_PREPARING, KM_MP_FAILED, KM_MP_PAUSING, KM_MP_STOPPING};
	km_mp_state common = KM_MP__COUNT;
	bool mixed = false;

	for (size_t i = 0; i < t->nparts; i++) {
		if (!t->parts[i].present)
			continue;
		if (common == KM_MP__COUNT)
			common = t->parts[i].state;
		else if (common != t->parts[i].state)
			mixed = true;
	}
	if (common == KM_MP__COUNT)
		return KM_MP_UNKNOWN;
	if (!mixed)
		return common;
	for (size_t o = 0; o < sizeof(order) / sizeof(order[0]); o++)
		for (size_t i = 0; i < t->nparts; i++)
			if (t->parts[i].present && t->parts[i].state == order[o])
				return order[o];
	return common;
}

size_t km_state_topic_partition_count(const km_state_topic *t)
{
	size_t n = 0;
	for (size_t i = 0; i < t->nparts; i++)
		n += t->parts[i].present;
	return n;
}

void km_state_topic_partition(const km_state_topic *t, size_t i, km_state_partition_info *out)
{
	size_t k = 0;
	memset(out, 0, sizeof(*out));
	out->partition = -1;
	for (size_t j = 0; j < t->nparts; j++) {
		const km_state_part *p = &t->parts[j];
		if (!p->present || k++ != i)
			continue;
		out->partition = (int32_t)j;
		out->state = p->state;
		out->state_change_ms = p->state_change_ms;
		out->last_mirrored_offset = p->last_mirrored_offset;
		out->last_mirrored_epoch = p->last_mirrored_epoch;
		out->source_log_end = p->source_log_end;
		out->source_log_end_ms = p->source_log_end >= 0 ? p->source_log_end_ms : -1;
		out->skipped_records = p->skipped_records;
		out->open_txn_offset = p->map && p->map->tail_held && p->map->tail_logical >= 0 ? p->map->open_txn_logical : -1;
		/* While a pipeline runs the partition its tail is ahead of what was last persisted. */
		if (p->map && p->map->tail_logical >= 0 && p->map->tail_physical >= 0) {
			out->last_mirrored_offset = p->map->tail_logical;
			out->last_mirrored_epoch = p->map->tail_epoch;
			out->newest_mirrored_ts = p->map->tail_held ? p->map->tail_ts : 0;
		}
		out->last_error = p->last_error;
		out->last_error_ms = p->last_error_ms;
		out->writer_pid = p->has_writer ? p->writer_pid : -1;
		out->writer_epoch = p->has_writer ? p->writer_epoch : -1;
		out->writer_start = p->has_writer ? p->writer_start : -1;
		out->records_hidden = p->map ? km_offmap_hidden(p->map) : 0;
		return;
	}
}

bool km_state_partition_writer_get(const km_state_topic *t, int32_t partition, int64_t *pid, int16_t *epoch,
				   int64_t *start)
{
	const km_state_part *p;
	if (!t || partition < 0 || (size_t)partition >= t->nparts)
		return false;
	p = &t->parts[partition];
	if (!p->present || !p->has_writer)
		return false;
	*pid = p->writer_pid;
	*epoch = p->writer_epoch;
	*start = p->writer_start;
	return true;
}

km_uuid km_state_topic_source_id(const km_state_topic *t)
{
	km_uuid zero = {{0}};
	for (size_t i = 0; t && i < t->nparts; i++)
		if (t->parts[i].present && !km_uuid_is_zero(&t->parts[i].source_id))
			return t->parts[i].source_id;
	return zero;
}

bool km_state_topic_source_id_differs(const km_state_topic *t, const km_uuid *id)
{
	for (size_t i = 0; t && i < t->nparts; i++)
		if (t->parts[i].present && !km_uuid_is_zero(&t->parts[i].source_id) && !km_uuid_eq(&t->parts[i].source_id, id))
			return true;
	return false;
}

bool km_state_topic_by_pattern(const km_state_topic *t)
{
	for (size_t i = 0; i < t->nparts; i++)
		if (t->parts[i].present)
			return t->parts[i].by_pattern;
	return false;
}

bool km_state_topic_source_id_missing(const km_state_topic *t)
{
	for (size_t i = 0; t && i < t->nparts; i++)
		if (t->parts[i].present && km_uuid_is_zero(&t->parts[i].source_id))
			return true;
	return false;
}

bool km_state_partition_record(const km_state_topic *t, int32_t partition, km_mp_state *state, int64_t *last_mirrored,
			       int32_t *epoch)
{
	if (!t || partition < 0 || (size_t)partition >= t->nparts || !t->parts[partition].present)
		return false;
	*state = t->parts[partition].state;
	*last_mirrored = t->parts[partition].last_mirrored_offset;
	if (epoch)
		*epoch = t->parts[partition].last_mirrored_epoch;
	return true;
}

const km_offmap *km_state_topic_offmap(const km_state_topic *t, int32_t partition)
{
	if (!t || partition < 0 || (size_t)partition >= t->nparts)
		return NULL;
	return t->parts[partition].map;
}

km_offmap *km_state_offmap_mut(km_state *st, const char *topic, int32_t partition)
{
	km_state_topic *t = topic ? km_state_model_topic(&st->model, topic, strlen(topic)) : NULL;
	km_state_part *p = t ? km_state_model_part(t, partition) : NULL;

	if (!p)
		return NULL;
	if (!p->map) {
		if (!(p->map = malloc(sizeof(*p->map))))
			return NULL;
		km_offmap_init(p->map);
	}
	return p->map;
}

void km_state_partition_progress(km_state *st, const char *topic, int32_t partition, int64_t source_log_end,
				 int64_t skipped_records)
{
	km_state_topic *t = topic ? km_state_model_topic(&st->model, topic, strlen(topic)) : NULL;
	km_state_part *p = t ? km_state_model_part(t, partition) : NULL;

	if (!p)
		return;
	if (source_log_end != -1) {
		p->source_log_end = source_log_end;
		p->source_log_end_ms = km_wall_ms();
	}
	if (skipped_records != -1)
		p->skipped_records = skipped_records;
}

const km_state_mirror *km_state_mirror_find(const km_state *st, const char *name)
{
	return km_state_model_mirror((km_state_model *)&st->model, name);
}

size_t km_state_mirror_count(const km_state *st) { return st->model.nmirrors; }
const km_state_mirror *km_state_mirror_at(const km_state *st, size_t i)
{
	return i < st->model.nmirrors ? st->model.mirrors[i] : NULL;
}
const char *km_state_mirror_name(const km_state_mirror *m) { return m->name; }
int64_t km_state_mirror_created_ms(const km_state_mirror *m) { return m->created_ms; }
size_t km_state_mirror_config_count(const km_state_mirror *m) { return m->ncfg; }

const char *km_state_mirror_source(const km_state_mirror *m)
{
	for (size_t i = 0; i < m->ncfg; i++)
		if (!strcmp(m->cfg[i].name, "bootstrap.servers"))
			return m->cfg[i].value;
	return NULL;
}

void km_state_mirror_config_at(const km_state_mirror *m, size_t i, const char **name, const char **value,
			       bool *secret)
{
	*name = m->cfg[i].name;
	*secret = m->cfg[i].sealed != NULL;
	*value = *secret ? NULL : m->cfg[i].value;
}

km_err km_state_mirror_secret(const km_state *st, const km_state_mirror *m, const char *name, char *buf, size_t len)
{
	km_err rc;

	for (size_t i = 0; i < m->ncfg; i++)
		if (!strcmp(m->cfg[i].name, name) && m->cfg[i].sealed) {
			if (!st->have_key) {
				KM_ERROR(COMP, 0, "mirror '%s': %s is sealed and kmirrord has no mirror_secret_key_file "
					 "to open it with", m->name, name);
				return KM_ERR_CONFIG;
			}
			rc = km_state_open(st->key, m->name, name, m->cfg[i].sealed, m->cfg[i].sealed_len, buf, len,
					   NULL);
			if (rc == KM_ERR_DECODE)
				KM_ERROR(COMP, 0, "mirror '%s': %s does not open: it was sealed for another mirror or "
					 "key, under another mirror_secret_key_file, or changed in %s; set it again "
					 "with kmirror alter", m->name, name, st->cfg.mirror_state_topic);
			return rc;
		}
	return KM_ERR_INVAL;
}

size_t km_state_mirror_topic_count(const km_state_mirror *m) { return m->ntopics; }
const km_state_topic *km_state_mirror_topic_at(const km_state_mirror *m, size_t i)
{
	return i < m->ntopics ? m->topics[i] : NULL;
}

const char *km_state_topic_name_of_store(const km_state *st) { return st->cfg.mirror_state_topic; }

uint64_t km_state_model_epoch(const km_state *st)
{
	return st->model_epoch;
}

bool km_state_topic_internal(const km_state *st, const char *name)
{
	return !strncmp(name, "__", 2) || !strcmp(name, st->cfg.mirror_state_topic);
}
