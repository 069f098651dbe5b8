/* __mirror_state read back at start: metadata, each partition's offsets, fetched to its end, compacted into the map (kept: following goes on from it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmirror/batch.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "state/persist_int.h"

static void start_load(km_state_persist *io);
static void load_partition(km_state_persist *io);

/* ---- load ---- */

void km_ps_map_clear(km_state_persist *io)
{
	for (size_t i = 0; i < io->mapn; i++) {
		load_entry *e = io->map ? io->map[i] : NULL;
		while (e) {
			load_entry *n = e->next;
			free(e->key);
			free(e->val);
			free(e);
			e = n;
		}
	}
	free(io->map);
	io->map = NULL;
	io->mapn = io->mapcount = 0;
}

static load_entry *map_find(const km_state_persist *io, const uint8_t *key, size_t klen, uint32_t h)
{
	if (!io->mapn)
		return NULL;
	for (load_entry *e = io->map[h % io->mapn]; e; e = e->next)
		if (e->hash == h && e->klen == klen && !memcmp(e->key, key, klen))
			return e;
	return NULL;
}

/* A runner's record that must not replace the one the map keeps for its key (km_state_progress_stale). */
static bool stale_progress(km_bytes key, km_bytes val, const load_entry *cur)
{
	return cur && !cur->tomb && val.len >= 0 && key.len >= 2 && km_be16(key.p) == KM_STATE_REC_PROGRESS &&
	       km_state_progress_stale(cur->val, cur->vlen, val.p, (size_t)val.len);
}

static km_err map_put(km_state_persist *io, km_bytes key, km_bytes val)
{
	uint32_t h = km_state_murmur2(key.p, (size_t)key.len);
	load_entry *e;

	if (io->mapcount >= io->mapn) {
		size_t nn = io->mapn ? io->mapn * 2 : 1024;
		load_entry **nm = calloc(nn, sizeof(*nm));
		if (!nm)
			return KM_ERR_NOMEM;
		for (size_t i = 0; i < io->mapn; i++)
			for (load_entry *x = io->map[i], *nx; x; x = nx) {
				nx = x->next;
				x->next = nm[x->hash % nn];
				nm[x->hash % nn] = x;
			}
		free(io->map);
		io->map = nm;
		io->mapn = nn;
	}
	e = map_find(io, key.p, (size_t)key.len, h);
	if (stale_progress(key, val, e)) {
		/* A former owner's late write: the current runner's record stays. */
		io->stale_kept++;
		KM_INFO(COMP, 0, "%s: a runner's record written under an earlier state change arrived late (a former "
			"owner's write); the current one stays (%zu so far)", io->st->cfg.mirror_state_topic, io->stale_kept);
		km_state_rewrite_kept(io->st, e->key, e->klen, e->val, e->vlen);
		return KM_OK;
	}
	if (!e) {
		if (!(e = calloc(1, sizeof(*e))) || !(e->key = malloc((size_t)key.len + 1))) {
			free(e);
			return KM_ERR_NOMEM;
		}
		memcpy(e->key, key.p, (size_t)key.len);
		e->klen = (size_t)key.len;
		e->hash = h;
		e->next = io->map[h % io->mapn];
		io->map[h % io->mapn] = e;
		io->mapcount++;
	}
	free(e->val);
	e->val = NULL;
	e->vlen = 0;
	e->tomb = val.len < 0;
	if (!e->tomb) {
		if (!(e->val = malloc((size_t)val.len + 1)))
			return KM_ERR_NOMEM;
		memcpy(e->val, val.p, (size_t)val.len);
		e->vlen = (size_t)val.len;
	}
	return KM_OK;
}

static void load_retry(km_state_persist *io, const char *why)
{
	int ms = km_ps_next_backoff(&io->backoff_ms);
	KM_WARN(COMP, 0, "reading %s from the destination failed (%s); retrying in %d ms", io->st->cfg.mirror_state_topic,
		why, ms);
	io->gen++;
	km_ps_after(io, ms, start_load);
}

/*
 * The model of every key's latest value in the map: mirrors first, then partitions, then runs, progress and writers (a
 * partition record names a mirror, and a run a topic, whose records may sit in other partitions of
 * the state topic, read in any order). *bad counts records that do not apply.
 */
km_err km_ps_build_model(km_state_persist *io, km_state_model *m, size_t *bad)
{
	km_state_model_init(m);
	*bad = 0;
	for (int pass = 0; pass < 3; pass++)
		for (size_t i = 0; i < io->mapn; i++)
			for (load_entry *e = io->map[i]; e; e = e->next) {
				km_state_change chg;
				int16_t type = e->klen >= 2 ? (int16_t)km_be16(e->key) : -1;
				int want = type == KM_STATE_REC_MIRROR                                  ? 0
					   : type == KM_STATE_REC_RUN || type == KM_STATE_REC_PROGRESS ||
							   type == KM_STATE_REC_WRITER
						   ? 2
												       : 1;
				if (want != pass)
					continue;
				if (km_state_model_apply(m, e->key, e->klen, e->val, e->vlen, e->tomb, &chg) != KM_OK)
					(*bad)++;
			}
	if (km_state_model_index(m) != KM_OK) {
		km_state_model_free(m);
		return KM_ERR_NOMEM;
	}
	return KM_OK;
}

static void load_finish(km_state_persist *io)
{
	km_state_model m;
	int64_t took;
	size_t bad = 0;

	if (km_ps_build_model(io, &m, &bad) != KM_OK) {
		load_retry(io, "out of memory");
		return;
	}
	took = km_mono_ms() - io->load_start_ms;
	KM_INFO(COMP, 0, "read %s: %d partitions, %zu records, %zu keys, %zu unreadable, in %lld ms (Metadata v%d, "
		"ListOffsets v%d, Fetch v%d)",
		io->st->cfg.mirror_state_topic, io->exists ? io->nparts : 0, io->nrecords, io->mapcount, bad,
		(long long)took, io->used[0], io->used[4], io->used[5]);
	io->st->ctr.loads++;
	io->st->ctr.records_loaded += io->nrecords;
	io->st->ctr.load_ms = (uint64_t)took;
	/* The map stays: following goes on from it (persist_follow.c). */
	free(io->scratch);
	io->scratch = NULL;
	io->ph = PH_IDLE;
	io->backoff_ms = 0;
	io->fdirty = false;
	io->foldest_ms = -1;
	km_state_loaded(io->st, &m);
	km_ps_follow_kick(io, 0);
}

/*
 * The records of one Fetch answer's partition from *next (below hi) into the map, *next moved past
 * them; NULL, or why they cannot be read. *foreign (when not NULL) is set by a record another
 * producer than kmirrord's own wrote, *oldest_ms lowered to its batch's timestamp.
 */
const char *km_ps_take_records(km_state_persist *io, const km_fetch_response_partition_data *pd, int64_t *next,
			       int64_t hi, bool *foreign, int64_t *oldest_ms)
{
	km_batch_iter it;
	km_batch b;

	km_batch_iter_init(&it, pd->records.p, pd->records.len > 0 ? (size_t)pd->records.len : 0);
	while (km_batch_next(&it, &b)) {
		km_record_iter ri;
		km_record rec;
		int64_t last = b.base_offset + b.last_offset_delta;
		if (last < *next)
			continue;
		if (!b.control) {
			if (b.codec != KM_CODEC_NONE && !io->scratch && !(io->scratch = malloc(SCRATCH_BYTES)))
				return "out of memory";
			if (km_batch_records(&b, io->scratch, SCRATCH_BYTES, &ri) != KM_OK)
				return "undecodable batch";
			while (km_record_next(&ri, &rec)) {
				if (rec.offset < *next || rec.offset >= hi || rec.key.len < 2)
					continue;
				io->nrecords++;
				if (map_put(io, rec.key, rec.value) != KM_OK)
					return "out of memory";
				if (foreign && (b.producer_id < 0 || b.producer_id != io->pid)) {
					*foreign = true;
					if (b.max_timestamp > 0 && (*oldest_ms < 0 || b.max_timestamp < *oldest_ms))
						*oldest_ms = b.max_timestamp;
				}
			}
			if (ri.err != KM_OK)
				return "undecodable records";
		}
		*next = last + 1;
	}
	return NULL;
}

static void on_fetch(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	const km_fetch_response *r = rr->msg;
	const km_fetch_response_partition_data *pd = NULL;
	int64_t before;
	const char *bad;
	char why[160];

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		load_retry(io, km_err_name(rr->err));
		return;
	}
	if (rr->err != KM_OK || r->responses.count != 1 || r->responses.items[0].partitions.count != 1) {
		load_retry(io, "undecodable Fetch response");
		return;
	}
	pd = &r->responses.items[0].partitions.items[0];
	if (r->error_code || pd->error_code) {
		snprintf(why, sizeof(why), "Fetch partition %d: %s", io->lpart,
			 km_err_name(r->error_code ? r->error_code : pd->error_code));
		load_retry(io, why);
		return;
	}
	before = io->next;
	/* The records are a range of the answer, valid during this callback: read them now. */
	if ((bad = km_ps_take_records(io, pd, &io->next, io->hi, NULL, NULL))) {
		load_retry(io, bad);
		return;
	}
	if (io->next == before) {
		/* Nothing below the end: compaction may leave the end past the last record. */
		if (++io->empty_fetches > 3)
			io->next = io->hi;
	} else {
		io->empty_fetches = 0;
	}
	load_partition(io);
}

static void fetch_next(km_state_persist *io)
{
	km_fetch_request m;
	km_fetch_request_fetch_topic t;
	km_fetch_request_fetch_partition p;
	km_err rc;
	int32_t leader = io->leaders[io->lpart];
	km_net_client *c = km_ps_node(io, leader);
	int16_t ver = 0;
	char why[200];

	if (!km_ps_client_wait(io, c, leader, fetch_next))
		return;
	if (c && km_net_client_ready(c) && (ver = km_ps_version_for(c, KM_API_FETCH, why, sizeof(why))) < 0) {
		load_retry(io, why);
		return;
	}
	km_fetch_request_init(&m);
	km_fetch_request_fetch_topic_init(&t);
	km_fetch_request_fetch_partition_init(&p);
	m.max_wait_ms = 100;
	m.min_bytes = 1;
	m.max_bytes = FETCH_BYTES;
	m.isolation_level = 0;
	p.partition = io->lpart;
	p.fetch_offset = io->next;
	p.partition_max_bytes = FETCH_BYTES;
	t.topic = km_str_c(io->st->cfg.mirror_state_topic);
	t.partitions.items = &p;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	rc = km_ps_send_req(io, c, KM_API_FETCH, ver, &m, on_fetch, leader, io->lpart);
	if (rc != KM_OK)
		load_retry(io, km_err_name(rc));
}

static void list_offsets(km_state_persist *io, int64_t ts);
static void list_offsets_again(km_state_persist *io)
{
	list_offsets(io, io->lts);
}

static void on_list_offsets(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	const km_list_offsets_response *r = rr->msg;
	char why[160];

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		load_retry(io, km_err_name(rr->err));
		return;
	}
	if (rr->err != KM_OK || r->topics.count != 1 || r->topics.items[0].partitions.count != 1) {
		load_retry(io, "undecodable ListOffsets response");
		return;
	}
	const km_list_offsets_response_list_offsets_partition_response *p = &r->topics.items[0].partitions.items[0];
	if (p->error_code) {
		snprintf(why, sizeof(why), "ListOffsets partition %d: %s", io->lpart, km_err_name(p->error_code));
		load_retry(io, why);
		return;
	}
	if (x.partition == -2) { /* earliest */
		io->lo = p->offset;
		list_offsets(io, -1);
		return;
	}
	io->hi = p->offset;
	io->next = io->lo;
	io->empty_fetches = 0;
	load_partition(io);
}

static void list_offsets(km_state_persist *io, int64_t ts)
{
	km_list_offsets_request m;
	km_list_offsets_request_list_offsets_topic t;
	km_list_offsets_request_list_offsets_partition p;
	km_err rc;
	int32_t leader = io->leaders[io->lpart];
	km_net_client *c = km_ps_node(io, leader);
	int16_t ver = 0;
	char why[200];

	io->lts = ts;
	if (!km_ps_client_wait(io, c, leader, list_offsets_again))
		return;
	if (c && km_net_client_ready(c) && (ver = km_ps_version_for(c, KM_API_LIST_OFFSETS, why, sizeof(why))) < 0) {
		load_retry(io, why);
		return;
	}
	km_list_offsets_request_init(&m);
	km_list_offsets_request_list_offsets_topic_init(&t);
	km_list_offsets_request_list_offsets_partition_init(&p);
	m.replica_id = -1;
	m.isolation_level = 0;
	m.timeout_ms = 30000; /* v10+: remote (tiered) offsets */
	p.partition_index = io->lpart;
	p.timestamp = ts;
	t.name = km_str_c(io->st->cfg.mirror_state_topic);
	t.partitions.items = &p;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	/* The partition field of the context says which of the two answers this is. */
	rc = km_ps_send_req(io, c, KM_API_LIST_OFFSETS, ver, &m, on_list_offsets, leader, ts == -2 ? -2 : -1);
	if (rc != KM_OK)
		load_retry(io, km_err_name(rc));
}

/* Continue with the current partition, or the next one, or finish. */
static void load_partition(km_state_persist *io)
{
	if (io->lpart >= 0 && io->next < io->hi) {
		fetch_next(io);
		return;
	}
	if (io->lpart >= 0)
		io->fpos[io->lpart] = io->hi; /* following goes on from here */
	io->lpart++;
	if (io->lpart >= io->nparts) {
		load_finish(io);
		return;
	}
	io->lo = io->hi = io->next = 0;
	list_offsets(io, -2);
}

/* The topic is compacted: read it. */
static void load_checked(km_state_persist *io)
{
	io->fchecked = true;
	if (!km_ps_follow_positions(io)) {
		load_retry(io, "out of memory");
		return;
	}
	io->lpart = -1;
	load_partition(io);
}

/* Not compacted: nothing is read, and the store stops (no retry would make it right). */
void km_ps_refused(km_state_persist *io, const char *message)
{
	io->ph = PH_IDLE;
	io->gen++;
	km_ps_map_clear(io);
	km_state_fatal(io->st, message);
}

static void on_load_metadata(km_net_client *c, const km_rpc_response *rr, void *arg)
{
	req_ctx x;
	km_state_persist *io = km_ps_ctx_take(arg, &x);
	int16_t terr;
	km_err rc = rr->err;

	if (!io)
		return;
	if (km_rpc_transport_err(rr) != KM_OK) {
		km_ps_drop(io, c);
		load_retry(io, km_err_name(rc));
		return;
	}
	if (rc == KM_OK)
		rc = km_ps_take_metadata(io, rr->msg, &terr);
	if (rc != KM_OK) {
		load_retry(io, rc == KM_ERR_UNSUPPORTED ? "a partition has no leader" : km_err_name(rc));
		return;
	}
	if (!io->exists) {
		if (terr != K_ERR_UNKNOWN_TOPIC) {
			load_retry(io, km_err_name(terr));
			return;
		}
		KM_INFO(COMP, 0, "%s does not exist on the destination yet: no mirrors", io->st->cfg.mirror_state_topic);
		load_finish(io);
		return;
	}
	/* Before a record is read: state from a topic that expires it must not be served. */
	km_ps_check_policy(io, load_checked, load_retry, km_ps_refused);
}

static void load_metadata(km_state_persist *io)
{
	km_err rc;
	char *name = io->st->cfg.mirror_state_topic;
	km_net_client *c = km_ps_any(io);
	int16_t ver = 0;
	char why[200];

	if (!km_ps_client_wait(io, c, KM_PS_ANY, load_metadata))
		return;
	if (c && km_net_client_ready(c) && (ver = km_ps_version_for(c, KM_API_METADATA, why, sizeof(why))) < 0) {
		load_retry(io, why);
		return;
	}
	rc = km_ps_send_metadata(io, c, ver, &name, 1, on_load_metadata);
	if (rc != KM_OK) {
		km_ps_drop(io, c);
		load_retry(io, km_err_name(rc));
	}
}

static void start_load(km_state_persist *io)
{
	if (io->st->fatal[0]) {
		io->ph = PH_IDLE; /* a retry timer set before the store stopped */
		return;
	}
	io->ph = PH_LOAD;
	io->gen++;
	km_ps_follow_drop(io);
	io->wait_c = NULL;
	io->nrecords = 0;
	km_ps_map_clear(io);
	io->load_start_ms = km_mono_ms();
	load_metadata(io);
}

void km_state_persist_load(km_state_persist *io)
{
	if (io->st->fatal[0])
		return; /* stopped for good: a reload would only refuse the topic again */
	io->st->ready = false;
	io->st->ctr.ready = 0;
	start_load(io);
}
