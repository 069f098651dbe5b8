/* The state in memory and the __mirror_state record codec: keys, values, and applying a record (offset map runs too) to the model. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/arena.h"
#include "kmirror/msg/mirror_state_instance_key.h"
#include "kmirror/msg/mirror_state_sync_group_key.h"
#include "kmirror/msg/mirror_state_mirror_key.h"
#include "kmirror/msg/mirror_state_mirror_value.h"
#include "kmirror/msg/mirror_state_partition_key.h"
#include "kmirror/msg/mirror_state_partition_value.h"
#include "kmirror/msg/mirror_state_progress_key.h"
#include "kmirror/msg/mirror_state_progress_value.h"
#include "kmirror/msg/mirror_state_writer_value.h"
#include "kmirror/msg/mirror_state_run_key.h"
#include "kmirror/msg/mirror_state_run_value.h"
#include "state/state_int.h"

/* ---- keys ---- */

void km_state_key_encode(km_wr *w, const km_state_key *k)
{
	km_wr_i16(w, k->type);
	if (k->type == KM_STATE_REC_MIRROR) {
		km_mirror_state_mirror_key mk;
		km_mirror_state_mirror_key_init(&mk);
		mk.mirror_name = k->mirror;
		km_mirror_state_mirror_key_encode(w, 0, &mk);
	} else if (k->type == KM_STATE_REC_RUN) {
		km_mirror_state_run_key rk;
		km_mirror_state_run_key_init(&rk);
		rk.mirror_name = k->mirror;
		rk.topic_name = k->topic;
		rk.partition_index = k->partition;
		rk.logical_start = k->logical;
		km_mirror_state_run_key_encode(w, 0, &rk);
	} else if (k->type == KM_STATE_REC_INSTANCE) {
		km_mirror_state_instance_key ik;
		km_mirror_state_instance_key_init(&ik);
		ik.instance_id = k->instance;
		km_mirror_state_instance_key_encode(w, 0, &ik);
	} else if (k->type == KM_STATE_REC_SYNC_GROUP) {
		km_mirror_state_sync_group_key sk;
		km_mirror_state_sync_group_key_init(&sk);
		sk.group_base = k->group;
		km_mirror_state_sync_group_key_encode(w, 0, &sk);
	} else if (k->type == KM_STATE_REC_PROGRESS || k->type == KM_STATE_REC_WRITER) {
		km_mirror_state_progress_key gk;
		km_mirror_state_progress_key_init(&gk);
		gk.mirror_name = k->mirror;
		gk.topic_name = k->topic;
		gk.partition_index = k->partition;
		km_mirror_state_progress_key_encode(w, 0, &gk);
	} else {
		km_mirror_state_partition_key pk;
		km_mirror_state_partition_key_init(&pk);
		pk.mirror_name = k->mirror;
		pk.topic_name = k->topic;
		pk.partition_index = k->partition;
		km_mirror_state_partition_key_encode(w, 0, &pk);
	}
}

/* A key's string: not empty, at most max bytes, no NUL. */
static bool text_ok(km_str s, int32_t max)
{
	return s.len > 0 && s.len <= max && !memchr(s.p, 0, (size_t)s.len);
}

static bool name_ok(km_str s)
{
	return text_ok(s, KM_STATE_MAX_NAME);
}

km_err km_state_key_decode(const uint8_t *p, size_t len, km_state_key *k)
{
	km_rd r;
	km_arena a;
	km_err rc = KM_ERR_DECODE;

	memset(k, 0, sizeof(*k));
	km_rd_init(&r, p, len);
	if (!km_rd_i16(&r, "RecordType", &k->type))
		return KM_ERR_DECODE;
	/* Non-flexible keys allocate nothing; the arena is only there for the decoder's signature. */
	km_arena_init(&a, 4096);
	if (k->type == KM_STATE_REC_MIRROR) {
		km_mirror_state_mirror_key mk;
		km_mirror_state_mirror_key_init(&mk);
		if (km_mirror_state_mirror_key_decode(&r, 0, &mk, &a) == KM_OK && km_rd_left(&r) == 0 &&
		    name_ok(mk.mirror_name)) {
			k->mirror = mk.mirror_name;
			rc = KM_OK;
		}
	} else if (k->type == KM_STATE_REC_PARTITION) {
		km_mirror_state_partition_key pk;
		km_mirror_state_partition_key_init(&pk);
		if (km_mirror_state_partition_key_decode(&r, 0, &pk, &a) == KM_OK && km_rd_left(&r) == 0 &&
		    name_ok(pk.mirror_name) && name_ok(pk.topic_name) && pk.partition_index >= 0 &&
		    pk.partition_index < KM_STATE_MAX_PARTITIONS) {
			k->mirror = pk.mirror_name;
			k->topic = pk.topic_name;
			k->partition = pk.partition_index;
			rc = KM_OK;
		}
	} else if (k->type == KM_STATE_REC_RUN) {
		km_mirror_state_run_key rk;
		km_mirror_state_run_key_init(&rk);
		if (km_mirror_state_run_key_decode(&r, 0, &rk, &a) == KM_OK && km_rd_left(&r) == 0 &&
		    name_ok(rk.mirror_name) && name_ok(rk.topic_name) && rk.partition_index >= 0 &&
		    rk.partition_index < KM_STATE_MAX_PARTITIONS && rk.logical_start >= 0) {
			k->mirror = rk.mirror_name;
			k->topic = rk.topic_name;
			k->partition = rk.partition_index;
			k->logical = rk.logical_start;
			rc = KM_OK;
		}
	} else if (k->type == KM_STATE_REC_PROGRESS || k->type == KM_STATE_REC_WRITER) {
		km_mirror_state_progress_key gk;
		km_mirror_state_progress_key_init(&gk);
		if (km_mirror_state_progress_key_decode(&r, 0, &gk, &a) == KM_OK && km_rd_left(&r) == 0 &&
		    name_ok(gk.mirror_name) && name_ok(gk.topic_name) && gk.partition_index >= 0 &&
		    gk.partition_index < KM_STATE_MAX_PARTITIONS) {
			k->mirror = gk.mirror_name;
			k->topic = gk.topic_name;
			k->partition = gk.partition_index;
			rc = KM_OK;
		}
	} else if (k->type == KM_STATE_REC_INSTANCE) {
		km_mirror_state_instance_key ik;
		km_mirror_state_instance_key_init(&ik);
		if (km_mirror_state_instance_key_decode(&r, 0, &ik, &a) == KM_OK && km_rd_left(&r) == 0 &&
		    text_ok(ik.instance_id, 1024)) {
			k->instance = ik.instance_id;
			rc = KM_OK;
		}
	} else if (k->type == KM_STATE_REC_SYNC_GROUP) {
		km_mirror_state_sync_group_key sk;
		km_mirror_state_sync_group_key_init(&sk);
		if (km_mirror_state_sync_group_key_decode(&r, 0, &sk, &a) == KM_OK && km_rd_left(&r) == 0 &&
		    text_ok(sk.group_base, 1024)) {
			k->group = sk.group_base;
			rc = KM_OK;
		}
	}
	km_arena_free(&a);
	return rc;
}

uint32_t km_state_murmur2(const uint8_t *p, size_t len)
{
	const uint32_t m = 0x5bd1e995u;
	uint32_t h = 0x9747b28cu ^ (uint32_t)len;
	size_t i = 0;

	for (; i + 4 <= len; i += 4) {
		uint32_t k = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16 | (uint32_t)p[i + 3] << 24;
		k *= m;
		k ^= k >> 24;
		k *= m;
		h *= m;
		h ^= k;
	}
	switch (len - i) {
	case 3: h ^= (uint32_t)p[i + 2] << 16; /* fall through */
	case 2: h ^= (uint32_t)p[i + 1] << 8;  /* fall through */
	case 1: h ^= p[i]; h *= m;             /* fall through */
	default: break;
	}
	h ^= h >> 13;
	h *= m;
	h ^= h >> 15;
	return h;
}

int32_t km_state_key_partition(const uint8_t *key, size_t len, int32_t n)
{
	return n > 0 ? (int32_t)((km_state_murmur2(key, len) & 0x7fffffffu) % (uint32_t)n) : 0;
}

/* ---- values ---- */

km_err km_state_mirror_value_encode(km_wr *w, const km_state_mirror *mi)
{
	km_mirror_state_mirror_value v;
	km_mirror_state_mirror_value_stored_config *items = NULL;

	km_mirror_state_mirror_value_init(&v);
	if (mi->ncfg && !(items = calloc(mi->ncfg, sizeof(*items))))
		return KM_ERR_NOMEM;
	v.mirror_name = km_str_c(mi->name);
	v.created_time_ms = mi->created_ms;
	v.modified_time_ms = mi->modified_ms;
	for (size_t i = 0; i < mi->ncfg; i++) {
		km_mirror_state_mirror_value_stored_config_init(&items[i]);
		items[i].name = km_str_c(mi->cfg[i].name);
		items[i].value = mi->cfg[i].value ? km_str_c(mi->cfg[i].value) : KM_STR_NULL;
		items[i].sealed = mi->cfg[i].sealed ? (km_bytes){mi->cfg[i].sealed, (int32_t)mi->cfg[i].sealed_len}
						    : KM_BYTES_NULL;
	}
	v.configs.count = (int32_t)mi->ncfg;
	v.configs.items = items;
	km_wr_i16(w, 0);
	km_mirror_state_mirror_value_encode(w, 0, &v);
	free(items);
	return w->err;
}

/* The last run of p's map at or before offset: its logical start and previous end (-1, -1: none). */
static void last_run_at(const km_state_part *p, int64_t offset, int64_t *logical, int64_t *prev_end)
{
	*logical = *prev_end = -1;
	for (size_t i = p->map ? p->map->n : 0; i-- > 0;) {
		if (p->map->runs[i].logical <= offset) {
			*logical = p->map->runs[i].logical;
			*prev_end = p->map->runs[i].prev_logical_end;
			return;
		}
	}
}

km_err km_state_partition_value_encode(km_wr *w, const km_state_topic *t, const km_state_part *p)
{
	km_mirror_state_partition_value v;

	km_mirror_state_partition_value_init(&v);
	v.state = (int8_t)p->state;
	v.topic_id = t->id;
	v.state_change_time_ms = p->state_change_ms;
	v.last_mirrored_offset = p->last_mirrored_offset;
	v.last_mirrored_epoch = p->last_mirrored_epoch;
	v.open_transaction_offset = p->has_open_txn ? p->open_txn_offset : -1;
	v.last_error = p->last_error ? km_str_c(p->last_error) : KM_STR_NULL;
	v.last_error_time_ms = p->last_error_ms;
	v.source_topic_id = p->source_id;
	v.started_by = p->by_pattern ? 1 : 0;
	v.started_time_ms = p->started_ms;
	v.progress_apart = true; /* this kmirrord writes the pipeline's progress in its own record */
	last_run_at(p, p->last_mirrored_offset, &v.last_run_logical, &v.last_run_prev_end);
	if (p->has_writer) {
		v.writer_producer_id = p->writer_pid;
		v.writer_producer_epoch = p->writer_epoch;
		v.writer_start_offset = p->writer_start;
	}
	km_wr_i16(w, 0);
	km_mirror_state_partition_value_encode(w, 0, &v);
	return w->err;
}

km_err km_state_progress_value_encode(km_wr *w, const km_state_topic *t, const km_state_part *p, int64_t offset,
				      int32_t epoch, int64_t open_txn)
{
	km_mirror_state_progress_value v;

	km_mirror_state_progress_value_init(&v);
	v.topic_id = t->id;
	v.state_change_time_ms = p->rec.state_change_ms; /* the partition record it is written under */
	v.last_mirrored_offset = offset;
	v.last_mirrored_epoch = epoch;
	v.open_transaction_offset = open_txn >= 0 ? open_txn : -1;
	/* The run a reader needs to have to show the progress (docs/state.md, "What a reader is shown"). */
	last_run_at(p, offset, &v.last_run_logical, &v.last_run_prev_end);
	/* The state as the runner has it under that record: the record's own, or what it settled. */
	v.state = (int8_t)p->state;
	v.settled_time_ms = p->state_change_ms;
	v.last_error = p->last_error ? km_str_c(p->last_error) : KM_STR_NULL;
	v.last_error_time_ms = p->last_error ? p->last_error_ms : -1;
	v.source_topic_id = p->source_id;
	km_wr_i16(w, 0);
	km_mirror_state_progress_value_encode(w, 0, &v);
	return w->err;
}

km_err km_state_run_value_encode(km_wr *w, int64_t physical, int64_t prev_logical_end, uint8_t flags)
{
	km_mirror_state_run_value v;

	km_mirror_state_run_value_init(&v);
	v.physical_start = physical;
	v.prev_logical_end = prev_logical_end;
	v.log_append_time = (flags & KM_OFFRUN_LOG_APPEND_TIME) != 0;
	v.fence = (flags & KM_OFFRUN_FENCE) != 0;
	km_wr_i16(w, 0);
	km_mirror_state_run_value_encode(w, 0, &v);
	return w->err;
}

/* ---- the model ---- */

char *km_state_dup_str(km_str s)
{
	char *p;
	if (s.len < 0)
		return NULL;
	p = malloc((size_t)s.len + 1);
	if (p) {
		memcpy(p, s.p, (size_t)s.len);
		p[s.len] = 0;
	}
	return p;
}

static void cfg_free(km_state_cfg_entry *c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(c[i].name);
		if (c[i].value)
			free(c[i].value);
		free(c[i].sealed);
	}
	free(c);
}

static void map_free(km_offmap *map)
{
	if (map) {
		km_offmap_free(map);
		free(map);
	}
}

static void topic_free(km_state_topic *t)
{
	for (size_t i = 0; i < t->nparts; i++) {
		free(t->parts[i].rec.error);
		free(t->parts[i].prog.error);
		map_free(t->parts[i].map);
	}
	free(t->parts);
	free(t->name);
	free(t);
}

static void mirror_free(km_state_mirror *m)
{
	for (size_t i = 0; i < m->ntopics; i++)
		topic_free(m->topics[i]);
	free(m->topics);
	cfg_free(m->cfg, m->ncfg);
	free(m->name);
	free(m);
}

void km_state_model_init(km_state_model *m)
{
	memset(m, 0, sizeof(*m));
}

void km_state_model_free(km_state_model *m)
{
	for (size_t i = 0; i < m->nmirrors; i++)
		mirror_free(m->mirrors[i]);
	free(m->mirrors);
	free(m->by_name);
	free(m->by_id);
	km_state_instances_free(m);
	memset(m, 0, sizeof(*m));
}

/* Index of name in a sorted array of n pointers whose first member is a char * name; *found set when equal. */
static size_t find_sorted(void *const *arr, size_t n, km_str name, bool *found)
{
	size_t lo = 0, hi = n;
	*found = false;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const char *s = *(char *const *)arr[mid];
		size_t sl = strlen(s), nl = (size_t)name.len;
		int c = memcmp(s, name.p, sl < nl ? sl : nl);
		if (c == 0)
			c = sl < nl ? -1 : sl > nl ? 1 : 0;
		if (c == 0) {
			*found = true;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool insert_at(void ***arr, size_t *n, size_t at, void *item)
{
	void **na = realloc(*arr, (*n + 1) * sizeof(void *));
	if (!na)
		return false;
	memmove(na + at + 1, na + at, (*n - at) * sizeof(void *));
	na[at] = item;
	*arr = na;
	(*n)++;
	return true;
}

static void remove_at(void **arr, size_t *n, size_t at)
{
	memmove(arr + at, arr + at + 1, (*n - at - 1) * sizeof(void *));
	(*n)--;
}

static km_state_mirror *mirror_lookup(km_state_model *m, km_str name, size_t *at)
{
	bool found;
	size_t i = find_sorted((void *const *)m->mirrors, m->nmirrors, name, &found);
	if (at)
		*at = i;
	return found ? m->mirrors[i] : NULL;
}

km_state_mirror *km_state_model_mirror(km_state_model *m, const char *name)
{
	return mirror_lookup(m, km_str_c(name), NULL);
}

static uint32_t name_hash(const char *p, size_t len)
{
	return km_state_murmur2((const uint8_t *)p, len);
}

static uint32_t id_hash(const km_uuid *id)
{
	return km_state_murmur2(id->b, sizeof(id->b));
}

km_state_topic *km_state_model_topic(const km_state_model *m, const char *name, size_t len)
{
	uint32_t h;
	if (!m->nbuckets)
		return NULL;
	h = name_hash(name, len);
	for (km_state_topic *t = m->by_name[h % m->nbuckets]; t; t = t->name_next)
		if (t->name_hash == h && strlen(t->name) == len && !memcmp(t->name, name, len))
			return t;
	return NULL;
}

km_err km_state_model_index(km_state_model *m)
{
	size_t n = 0, nb;
	km_state_topic **bn, **bi;

	for (size_t i = 0; i < m->nmirrors; i++)
		n += m->mirrors[i]->ntopics;
	nb = n < 16 ? 16 : n * 2;
	bn = calloc(nb, sizeof(*bn));
	bi = calloc(nb, sizeof(*bi));
	if (!bn || !bi) {
		free(bn);
		free(bi);
		return KM_ERR_NOMEM;
	}
	for (size_t i = 0; i < m->nmirrors; i++)
		for (size_t j = 0; j < m->mirrors[i]->ntopics; j++) {
			km_state_topic *t = m->mirrors[i]->topics[j];
			t->name_hash = name_hash(t->name, strlen(t->name));
			t->name_next = bn[t->name_hash % nb];
			bn[t->name_hash % nb] = t;
			t->id_next = NULL;
			if (!km_uuid_is_zero(&t->id)) {
				t->id_next = bi[id_hash(&t->id) % nb];
				bi[id_hash(&t->id) % nb] = t;
			}
		}
	free(m->by_name);
	free(m->by_id);
	m->by_name = bn;
	m->by_id = bi;
	m->nbuckets = nb;
	return KM_OK;
}

const km_state_topic *km_state_model_topic_id(const km_state_model *m, const km_uuid *id)
{
	if (!m->nbuckets)
		return NULL;
	for (km_state_topic *t = m->by_id[id_hash(id) % m->nbuckets]; t; t = t->id_next)
		if (km_uuid_eq(&t->id, id))
			return t;
	return NULL;
}

static km_err apply_mirror(km_state_model *m, const km_state_key *k, const uint8_t *val, size_t vlen, bool tomb)
{
	size_t at;
	km_state_mirror *mi = mirror_lookup(m, k->mirror, &at);
	km_mirror_state_mirror_value v;
	km_state_cfg_entry *cfg = NULL;
	size_t ncfg = 0; /* the entries of cfg: none until it is allocated, whatever the value's count says */
	km_arena a;
	km_rd r;
	int16_t ver;
	km_err rc;

	if (tomb) {
		if (mi) {
			remove_at((void **)m->mirrors, &m->nmirrors, at);
			mirror_free(mi);
		}
		return KM_OK;
	}
	km_rd_init(&r, val, vlen);
	if (!km_rd_i16(&r, "Version", &ver) || ver != 0)
		return KM_ERR_DECODE;
	km_arena_init(&a, 4u << 20);
	km_mirror_state_mirror_value_init(&v);
	rc = km_mirror_state_mirror_value_decode(&r, 0, &v, &a);
	if (rc == KM_OK && (v.configs.count < 0 || v.configs.count > KM_STATE_MAX_CONFIGS))
		rc = KM_ERR_DECODE;
	if (rc == KM_OK && v.configs.count && !(cfg = calloc((size_t)v.configs.count, sizeof(*cfg))))
		rc = KM_ERR_NOMEM;
	if (cfg)
		ncfg = (size_t)v.configs.count;
	for (size_t i = 0; rc == KM_OK && i < ncfg; i++) {
		const km_mirror_state_mirror_value_stored_config *c = &v.configs.items[i];
		if (c->name.len <= 0 || (c->value.len < 0) == (c->sealed.len < 0)) {
			rc = KM_ERR_DECODE;
			break;
		}
		cfg[i].name = km_state_dup_str(c->name);
		cfg[i].value = km_state_dup_str(c->value);
		if (c->sealed.len >= 0 && (cfg[i].sealed = malloc((size_t)c->sealed.len + 1)))
			memcpy(cfg[i].sealed, c->sealed.p, (size_t)c->sealed.len);
		cfg[i].sealed_len = c->sealed.len >= 0 ? (size_t)c->sealed.len : 0;
		if (!cfg[i].name || (c->value.len >= 0 && !cfg[i].value) || (c->sealed.len >= 0 && !cfg[i].sealed))
			rc = KM_ERR_NOMEM;
	}
	if (rc == KM_OK && !mi) {
		if (!(mi = calloc(1, sizeof(*mi))) || !(mi->name = km_state_dup_str(k->mirror)) ||
		    !insert_at((void ***)&m->mirrors, &m->nmirrors, at, mi)) {
			if (mi)
				free(mi->name);
			free(mi);
			rc = KM_ERR_NOMEM;
		}
	}
	if (rc != KM_OK) {
		cfg_free(cfg, ncfg);
		km_arena_free(&a);
		return rc;
	}
	cfg_free(mi->cfg, mi->ncfg);
	mi->cfg = cfg;
	mi->ncfg = ncfg;
	mi->created_ms = v.created_time_ms;
	mi->modified_ms = v.modified_time_ms;
	km_arena_free(&a);
	return KM_OK;
}

/*
 * What stands of a partition, from its two records (docs/state.md, "The runner's record"): the
 * partition record is the control plane's, the progress record the runner's. The runner's figures
 * and what it settled (its state, its error) stand while they were written under the partition
 * record that stands (the same topic id and state change time): an operator's change through any
 * kmirrord writes a new partition record, which a runner's write on an older view cannot undo. Its
 * writer and the source topic's id stand whatever the partition record (a start writes a progress
 * record without them). A pure function of the last record of each key, so a compacted state topic
 * read after the cleaner ran gives what every instance that applied each record got.
 */
static void part_resolve(const km_state_topic *t, km_state_part *p)
{
	bool ours = p->prog.has && km_uuid_eq(&p->prog.topic_id, &t->id);
	bool prog = p->progress_apart && ours && p->prog.state_change_ms == p->rec.state_change_ms;
	bool settled = prog && p->prog.state != KM_MP_UNKNOWN;

	p->last_mirrored_offset = prog ? p->prog.offset : p->rec.offset;
	p->last_mirrored_epoch = prog ? p->prog.epoch : p->rec.epoch;
	p->open_txn_offset = prog ? p->prog.open_txn : p->rec.open_txn;
	p->has_open_txn = p->open_txn_offset >= 0;
	p->need_run_logical = prog ? p->prog.run_logical : p->rec.run_logical;
	p->need_run_prev_end = prog ? p->prog.run_prev_end : p->rec.run_prev_end;
	p->need_run = p->need_run_logical >= 0;
	p->state = settled ? p->prog.state : p->rec.state;
	p->state_change_ms = settled ? p->prog.settled_ms : p->rec.state_change_ms;
	p->last_error = settled ? p->prog.error : p->rec.error;
	p->last_error_ms = settled ? p->prog.error_ms : p->rec.error_ms;
	p->source_id = ours && !km_uuid_is_zero(&p->prog.source_id) ? p->prog.source_id : p->rec.source_id;
	if (p->wrec.has && km_uuid_eq(&p->wrec.topic_id, &t->id) && p->wrec.started_ms == p->started_ms) {
		p->has_writer = true;
		p->writer_pid = p->wrec.pid;
		p->writer_epoch = p->wrec.epoch;
		p->writer_start = p->wrec.start;
	} else {
		p->has_writer = p->rec.writer_start >= 0;
		p->writer_pid = p->rec.writer_pid;
		p->writer_epoch = p->rec.writer_epoch;
		p->writer_start = p->rec.writer_start;
	}
}

/*
 * The topic a partition or progress key names, NULL when its mirror or the topic is not in the
 * model; *mi its mirror (NULL: none), *at where the topic is or would go in the mirror's list. By
 * the mirror's sorted list, not the model's name index: that is built after a rebuild's passes.
 */
static km_state_topic *key_topic(km_state_model *m, const km_state_key *k, km_state_mirror **mi, size_t *at)
{
	bool found;
	*mi = mirror_lookup(m, k->mirror, NULL);
	*at = 0;
	if (!*mi)
		return NULL;
	*at = find_sorted((void *const *)(*mi)->topics, (*mi)->ntopics, k->topic, &found);
	return found ? (*mi)->topics[*at] : NULL;
}

static km_err apply_partition(km_state_model *m, const km_state_key *k, const uint8_t *val, size_t vlen, bool tomb,
			      km_state_change *chg)
{
	km_state_mirror *mi;
	size_t at;
	km_state_topic *t = key_topic(m, k, &mi, &at);
	km_mirror_state_partition_value v;
	km_state_part *p;
	km_arena a;
	km_rd r;
	int16_t ver;
	km_err rc;

	if (!mi)
		return KM_OK; /* a partition left over from a deleted mirror (the tombstones may be in another partition) */
	if (tomb) {
		if (!t || (size_t)k->partition >= t->nparts || !t->parts[k->partition].present)
			return KM_OK;
		p = &t->parts[k->partition];
		chg->from = p->state;
		chg->to = KM_MP_UNKNOWN;
		chg->changed = true;
		free(p->rec.error);
		free(p->prog.error);
		map_free(p->map);
		memset(p, 0, sizeof(*p));
		bool any = false;
		for (size_t i = 0; i < t->nparts; i++)
			any |= t->parts[i].present;
		if (!any) {
			remove_at((void **)mi->topics, &mi->ntopics, at);
			topic_free(t);
		}
		return KM_OK;
	}
	km_rd_init(&r, val, vlen);
	if (!km_rd_i16(&r, "Version", &ver) || ver != 0)
		return KM_ERR_DECODE;
	km_arena_init(&a, 1u << 20);
	km_mirror_state_partition_value_init(&v);
	rc = km_mirror_state_partition_value_decode(&r, 0, &v, &a);
	if (rc == KM_OK && (v.state < 0 || v.state >= KM_MP__COUNT))
		rc = KM_ERR_DECODE;
	if (rc == KM_OK && !t) {
		if (!(t = calloc(1, sizeof(*t))) || !(t->name = km_state_dup_str(k->topic)) ||
		    !insert_at((void ***)&mi->topics, &mi->ntopics, at, t)) {
			if (t)
				free(t->name);
			free(t);
			t = NULL;
			rc = KM_ERR_NOMEM;
		}
		if (t)
			t->mirror = mi;
	}
	if (rc == KM_OK && !km_state_model_part(t, k->partition))
		rc = KM_ERR_NOMEM;
	if (rc == KM_OK) {
		char *err = km_state_dup_str(v.last_error);
		p = &t->parts[k->partition];
		if (v.last_error.len >= 0 && !err) {
			rc = KM_ERR_NOMEM;
		} else {
			chg->from = p->present ? p->state : KM_MP_UNKNOWN;
			if (!p->present)
				p->source_log_end = -1;
			p->present = true;
			p->rec.state = (km_mp_state)v.state;
			p->rec.state_change_ms = v.state_change_time_ms;
			p->rec.offset = v.last_mirrored_offset;
			p->rec.epoch = v.last_mirrored_epoch;
			p->rec.open_txn = v.open_transaction_offset;
			p->rec.run_logical = v.last_run_logical;
			p->rec.run_prev_end = v.last_run_prev_end;
			p->progress_apart = v.progress_apart;
			free(p->rec.error);
			p->rec.error = err;
			p->rec.error_ms = v.last_error_time_ms;
			p->rec.writer_pid = v.writer_producer_id;
			p->rec.writer_epoch = v.writer_producer_epoch;
			p->rec.writer_start = v.writer_start_offset;
			p->rec.source_id = v.source_topic_id;
			p->by_pattern = v.started_by == 1;
			p->started_ms = v.started_time_ms;
			t->id = v.topic_id;
			part_resolve(t, p);
			chg->to = p->state;
			chg->changed = chg->from != chg->to;
		}
	}
	km_arena_free(&a);
	return rc;
}

/*
 * The partition a progress or writer record is about, *t its topic; NULL when it has no partition
 * record (yet, or any more): the record then stands for nothing.
 */
km_state_part *km_state_model_keyed_part(km_state_model *m, const km_state_key *k, km_state_topic **t)
{
	km_state_mirror *mi;
	size_t at;

	*t = key_topic(m, k, &mi, &at);
	if (!*t || (size_t)k->partition >= (*t)->nparts || !(*t)->parts[k->partition].present)
		return NULL;
	return &(*t)->parts[k->partition];
}

/* The topic id and change time at the head of a runner's record value. */
static bool progress_head(const uint8_t *v, size_t len, km_uuid *id, int64_t *scm)
{
	km_rd r;
	int16_t ver;

	if (!v)
		return false;
	km_rd_init(&r, v, len);
	return km_rd_i16(&r, "Version", &ver) && ver == 0 && km_rd_uuid(&r, "TopicId", id) &&
	       km_rd_i64(&r, "StateChangeTimeMs", scm);
}

bool km_state_progress_stale(const uint8_t *cv, size_t clen, const uint8_t *nv, size_t nlen)
{
	km_uuid cid, nid;
	int64_t cscm, nscm;

	return progress_head(cv, clen, &cid, &cscm) && progress_head(nv, nlen, &nid, &nscm) && km_uuid_eq(&cid, &nid) &&
	       nscm < cscm;
}

/*
 * The runner's record of a partition (type 4, "progress"): what stands of it is part_resolve's. A
 * settle in it is a state change like a partition record's. The partition record and the progress
 * record sit in different partitions of the state topic, so either may be read first.
 */
static km_err apply_progress(km_state_model *m, const km_state_key *k, const uint8_t *val, size_t vlen, bool tomb,
			     km_state_change *chg)
{
	km_state_topic *t;
	km_state_part *p = km_state_model_keyed_part(m, k, &t);
	km_mirror_state_progress_value v;
	km_arena a;
	km_rd r;
	int16_t ver;
	km_err rc;

	if (!p)
		return KM_OK;
	chg->from = p->state;
	if (tomb) {
		p->prog.has = false;
		free(p->prog.error);
		p->prog.error = NULL;
		part_resolve(t, p);
		chg->to = p->state;
		chg->changed = chg->from != chg->to;
		return KM_OK;
	}
	km_rd_init(&r, val, vlen);
	if (!km_rd_i16(&r, "Version", &ver) || ver != 0)
		return KM_ERR_DECODE;
	km_arena_init(&a, 4096);
	km_mirror_state_progress_value_init(&v);
	rc = km_mirror_state_progress_value_decode(&r, 0, &v, &a);
	if (rc == KM_OK && (v.state < 0 || v.state >= KM_MP__COUNT))
		rc = KM_ERR_DECODE;
	if (rc == KM_OK) {
		char *err = km_state_dup_str(v.last_error);
		if (v.last_error.len >= 0 && !err) {
			km_arena_free(&a);
			return KM_ERR_NOMEM;
		}
		free(p->prog.error);
		p->prog.error = err;
		p->prog.error_ms = v.last_error_time_ms;
		p->prog.state = (km_mp_state)v.state;
		p->prog.settled_ms = v.settled_time_ms;
		p->prog.source_id = v.source_topic_id;
		p->prog.has = true;
		p->prog.topic_id = v.topic_id;
		p->prog.state_change_ms = v.state_change_time_ms;
		p->prog.offset = v.last_mirrored_offset;
		p->prog.epoch = v.last_mirrored_epoch;
		p->prog.open_txn = v.open_transaction_offset;
		p->prog.run_logical = v.last_run_logical;
		p->prog.run_prev_end = v.last_run_prev_end;
		part_resolve(t, p);
		chg->to = p->state;
		chg->changed = chg->from != chg->to;
	}
	km_arena_free(&a);
	return rc;
}

/* A partition's writer record: part_resolve's writer while it names the topic's id. */
static km_err apply_writer(km_state_model *m, const km_state_key *k, const uint8_t *val, size_t vlen, bool tomb)
{
	km_state_topic *t;
	km_state_part *p = km_state_model_keyed_part(m, k, &t);
	km_mirror_state_writer_value v;
	km_arena a;
	km_rd r;
	int16_t ver;
	km_err rc;

	if (!p)
		return KM_OK;
	if (tomb) {
		p->wrec.has = false;
		part_resolve(t, p);
		return KM_OK;
	}
	km_rd_init(&r, val, vlen);
	if (!km_rd_i16(&r, "Version", &ver) || ver != 0)
		return KM_ERR_DECODE;
	km_arena_init(&a, 1024);
	km_mirror_state_writer_value_init(&v);
	rc = km_mirror_state_writer_value_decode(&r, 0, &v, &a);
	if (rc == KM_OK && (v.producer_id < 0 || v.start_offset < 0))
		rc = KM_ERR_DECODE;
	if (rc == KM_OK) {
		p->wrec.has = true;
		p->wrec.topic_id = v.topic_id;
		p->wrec.started_ms = v.started_time_ms;
		p->wrec.pid = v.producer_id;
		p->wrec.epoch = v.producer_epoch;
		p->wrec.start = v.start_offset;
		part_resolve(t, p);
	}
	km_arena_free(&a);
	return rc;
}

km_err km_state_writer_value_encode(km_wr *w, const km_state_topic *t, int64_t started_ms, int64_t pid, int16_t epoch,
				    int64_t start)
{
	km_mirror_state_writer_value v;

	km_mirror_state_writer_value_init(&v);
	v.topic_id = t->id;
	v.started_time_ms = started_ms;
	v.producer_id = pid;
	v.producer_epoch = epoch;
	v.start_offset = start;
	km_wr_i16(w, 0);
	km_mirror_state_writer_value_encode(w, 0, &v);
	return w->err;
}

km_state_part *km_state_model_part(km_state_topic *t, int32_t partition)
{
	if (partition < 0 || partition >= KM_STATE_MAX_PARTITIONS)
		return NULL;
	if ((size_t)partition >= t->nparts) {
		km_state_part *np = realloc(t->parts, ((size_t)partition + 1) * sizeof(*np));
		if (!np)
			return NULL;
		memset(np + t->nparts, 0, ((size_t)partition + 1 - t->nparts) * sizeof(*np));
		for (size_t i = t->nparts; i <= (size_t)partition; i++)
			np[i].source_log_end = -1;
		t->parts = np;
		t->nparts = (size_t)partition + 1;
	}
	return &t->parts[partition];
}

/*
 * A run record. Runs belong to a topic the mirror holds (a partition record made it): those of a
 * deleted mirror or forgotten topic are dropped, as partition records of an unknown mirror are.
 * The partition's own record may be absent (runs of a partition the store learnt of later).
 */
static km_err apply_run(km_state_model *m, const km_state_key *k, const uint8_t *val, size_t vlen, bool tomb)
{
	km_state_mirror *mi = mirror_lookup(m, k->mirror, NULL);
	km_mirror_state_run_value v;
	km_state_topic *t;
	km_state_part *p;
	bool found;
	size_t at;
	km_arena a;
	km_rd r;
	int16_t ver;
	km_err rc;

	if (!mi)
		return KM_OK;
	at = find_sorted((void *const *)mi->topics, mi->ntopics, k->topic, &found);
	if (!found)
		return KM_OK;
	t = mi->topics[at];
	if (tomb) {
		if ((size_t)k->partition < t->nparts && t->parts[k->partition].map)
			km_offmap_remove(t->parts[k->partition].map, k->logical);
		return KM_OK;
	}
	km_rd_init(&r, val, vlen);
	if (!km_rd_i16(&r, "Version", &ver) || ver != 0)
		return KM_ERR_DECODE;
	km_arena_init(&a, 4096);
	km_mirror_state_run_value_init(&v);
	rc = km_mirror_state_run_value_decode(&r, 0, &v, &a);
	km_arena_free(&a);
	if (rc != KM_OK || v.physical_start < 0 || v.prev_logical_end < -1 || v.prev_logical_end > k->logical)
		return KM_ERR_DECODE;
	if (!(p = km_state_model_part(t, k->partition)))
		return KM_ERR_NOMEM;
	if (!p->map) {
		if (!(p->map = malloc(sizeof(*p->map))))
			return KM_ERR_NOMEM;
		km_offmap_init(p->map);
	}
	return km_offmap_add(p->map, k->logical, v.physical_start, v.prev_logical_end,
			     (v.log_append_time ? KM_OFFRUN_LOG_APPEND_TIME : 0) | (v.fence ? KM_OFFRUN_FENCE : 0));
}

size_t km_state_model_mirror_runs(const km_state_mirror *mi)
{
	size_t n = 0;
	for (size_t i = 0; i < mi->ntopics; i++)
		for (size_t j = 0; j < mi->topics[i]->nparts; j++)
			if (mi->topics[i]->parts[j].map)
				n += mi->topics[i]->parts[j].map->n;
	return n;
}

void km_state_part_bound(km_state_part *p)
{
	km_offmap *m = p->map;
	int64_t phys, logical;
	ssize_t run;

	if (!m || m->tail_held)
		return;
	m->tail_physical = m->tail_logical = -1;
	m->tail_epoch = -1;
	m->tail_ts = 0;
	if (!p->present || p->state == KM_MP_STOPPED || p->last_mirrored_offset < 0 || !m->n)
		return;
	/*
	 * What may still be taken back is not shown (docs/state.md, "What a reader is shown"): the tail
	 * stops where the runner's earliest open destination transaction starts (a fence may abort it,
	 * and it is mirrored again), and where a fence run hides what follows (written before the abort:
	 * the progress persisted earlier may lie past it, and mapped through it, past the log's end).
	 */
	logical = p->last_mirrored_offset;
	if (p->has_open_txn && p->open_txn_offset >= 0 && p->open_txn_offset < logical)
		logical = p->open_txn_offset;
	/* Only the last run: a fence run with runs after it is closed by them (its hidden range ended). */
	if ((m->runs[m->n - 1].flags & KM_OFFRUN_FENCE) && m->runs[m->n - 1].logical < logical)
		logical = m->runs[m->n - 1].logical;
	/*
	 * Runs are persisted before the batches that start them, progress after they landed. But a
	 * progress and the run it needs sit in different partitions of the state topic, and a follow
	 * round may read the progress first: without that run, the run before it would reach on past
	 * its end and show the records after it at the wrong offsets (docs/reliability.md, finding 19).
	 * Until the run is in, nothing past the end of the run before it is shown.
	 */
	if (p->need_run && ((run = km_offmap_find_logical(m, p->need_run_logical)) < 0 ||
			    m->runs[run].logical != p->need_run_logical)) {
		int64_t end = p->need_run_prev_end >= 0 ? p->need_run_prev_end : p->need_run_logical;
		if (end < logical)
			logical = end;
	}
	if ((phys = km_offmap_to_physical(m, logical)) < 0)
		return;
	m->tail_physical = phys;
	m->tail_logical = logical;
	/* The source leader epoch of the batch before the tail is known only at the progress itself. */
	m->tail_epoch = logical == p->last_mirrored_offset ? p->last_mirrored_epoch : -1;
}

void km_state_mirror_bound(km_state_mirror *mi)
{
	for (size_t k = 0; k < mi->ntopics; k++)
		for (size_t j = 0; j < mi->topics[k]->nparts; j++)
			km_state_part_bound(&mi->topics[k]->parts[j]);
}

void km_state_model_bound(km_state_model *m)
{
	for (size_t i = 0; i < m->nmirrors; i++)
		km_state_mirror_bound(m->mirrors[i]);
}

void km_state_model_carry(km_state_model *to, km_state_model *from)
{
	for (size_t i = 0; i < from->nmirrors; i++) {
		km_state_mirror *mi = from->mirrors[i];
		for (size_t k = 0; k < mi->ntopics; k++) {
			km_state_topic *ot = mi->topics[k];
			km_state_topic *nt = km_state_model_topic(to, ot->name, strlen(ot->name));
			if (!nt || strcmp(nt->mirror->name, mi->name))
				continue;
			for (size_t j = 0; j < ot->nparts; j++) {
				km_state_part *op = &ot->parts[j], *np;
				if (!op->map && op->source_log_end < 0 && !op->skipped_records)
					continue;
				if (!(np = km_state_model_part(nt, (int32_t)j)))
					continue; /* out of memory: the new model's own figures stand */
				np->source_log_end = op->source_log_end;
				np->source_log_end_ms = op->source_log_end_ms;
				np->skipped_records = op->skipped_records;
				if (!op->map)
					continue;
				/* The old object (the mirror module's pointer, its tail) takes the runs read back. */
				km_offmap *keep = op->map;
				free(keep->runs);
				keep->runs = NULL;
				keep->n = keep->cap = 0;
				if (np->map) {
					keep->runs = np->map->runs;
					keep->n = np->map->n;
					keep->cap = np->map->cap;
					free(np->map);
				}
				np->map = keep;
				op->map = NULL;
			}
		}
	}
}

km_err km_state_model_apply(km_state_model *m, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
			    bool tombstone, km_state_change *chg)
{
	km_state_key k;
	km_err rc = km_state_key_decode(key, klen, &k);

	memset(chg, 0, sizeof(*chg));
	if (rc != KM_OK)
		return rc;
	if (k.type == KM_STATE_REC_MIRROR)
		return apply_mirror(m, &k, val, vlen, tombstone);
	if (k.type == KM_STATE_REC_RUN)
		return apply_run(m, &k, val, vlen, tombstone);
	if (k.type == KM_STATE_REC_INSTANCE)
		return km_state_instance_apply(m, k.instance, val, vlen, tombstone);
	if (k.type == KM_STATE_REC_SYNC_GROUP)
		return km_state_sync_group_apply(m, k.group, val, vlen, tombstone);
	if (k.type == KM_STATE_REC_WRITER)
		return apply_writer(m, &k, val, vlen, tombstone);
	if (k.type == KM_STATE_REC_PROGRESS)
		rc = apply_progress(m, &k, val, vlen, tombstone, chg);
	else
		rc = apply_partition(m, &k, val, vlen, tombstone, chg);
	if (chg->changed) {
		/* The names outlive a tombstone's topic: copy them into static-lifetime scratch of the change. */
		static char mname[KM_STATE_MAX_NAME + 1], tname[KM_STATE_MAX_NAME + 1];
		memcpy(mname, k.mirror.p, (size_t)k.mirror.len);
		mname[k.mirror.len] = 0;
		memcpy(tname, k.topic.p, (size_t)k.topic.len);
		tname[k.topic.len] = 0;
		chg->mirror = mname;
		chg->topic = tname;
		chg->partition = k.partition;
	}
	return rc;
}

/* One partition's state in a model, UNKNOWN when it holds no record for it. */
static km_mp_state model_state(const km_state_model *m, const km_state_topic *like, size_t j)
{
	const km_state_topic *t = km_state_model_topic(m, like->name, strlen(like->name));
	if (!t || strcmp(t->mirror->name, like->mirror->name) || j >= t->nparts || !t->parts[j].present)
		return KM_MP_UNKNOWN;
	return t->parts[j].state;
}

static km_err change_add(km_state_change **d, size_t *n, size_t *cap, const km_state_topic *t, size_t j,
			 km_mp_state from, km_mp_state to)
{
	km_state_change *c;

	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		km_state_change *nd = realloc(*d, nc * sizeof(*nd));
		if (!nd)
			return KM_ERR_NOMEM;
		*d = nd;
		*cap = nc;
	}
	c = &(*d)[*n];
	*c = (km_state_change){.mirror = strdup(t->mirror->name), .topic = strdup(t->name), .partition = (int32_t)j,
			       .from = from, .to = to, .changed = true};
	if (!c->mirror || !c->topic) {
		free((char *)c->mirror);
		free((char *)c->topic);
		return KM_ERR_NOMEM;
	}
	(*n)++;
	return KM_OK;
}

km_err km_state_model_diff(const km_state_model *now, const km_state_model *old, km_state_change **out, size_t *n)
{
	const km_state_model *sides[2] = {now, old};
	size_t cap = 0;

	*out = NULL;
	*n = 0;
	/* Every partition present in either model, once: from the new side, then those only the old one has. */
	for (int side = 0; side < 2; side++)
		for (size_t i = 0; i < sides[side]->nmirrors; i++)
			for (size_t k = 0; k < sides[side]->mirrors[i]->ntopics; k++) {
				const km_state_topic *t = sides[side]->mirrors[i]->topics[k];
				for (size_t j = 0; j < t->nparts; j++) {
					km_mp_state was, is;
					if (!t->parts[j].present)
						continue;
					if (side == 1 && model_state(now, t, j) != KM_MP_UNKNOWN)
						continue; /* seen from the new side */
					was = side == 0 ? model_state(old, t, j) : t->parts[j].state;
					is = side == 0 ? t->parts[j].state : KM_MP_UNKNOWN;
					if (was != is && change_add(out, n, &cap, t, j, was, is) != KM_OK)
						return KM_ERR_NOMEM;
				}
			}
	return KM_OK;
}

void km_state_changes_free(km_state_change *c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free((char *)c[i].mirror);
		free((char *)c[i].topic);
	}
	free(c);
}
