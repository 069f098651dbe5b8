/* A pipeline's requests: their context, metadata of both clusters, the mirror's producer id. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/init_producer_id_request.h"
#include "kmirror/msg/init_producer_id_response.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

/* ---- metadata (both sides) ---- */

req_ctx *km_pl_ctx_new(km_pipeline *pl, km_cluster *cl, int32_t node, int16_t ver)
{
	req_ctx *x = calloc(1, sizeof(*x));
	if (x)
		*x = (req_ctx){pl, cl, node, ver, NULL};
	return x;
}

/* km_rpc_call with the request's context: freed here when the send fails. */
km_err km_pl_call(km_net_client *c, int16_t key, int16_t ver, const void *req, km_rpc_cb cb, req_ctx *x)
{
	km_err rc;

	if (!x)
		return KM_ERR_NOMEM;
	if ((rc = km_rpc_call(c, key, ver, req, NULL, cb, x)) != KM_OK)
		free(x);
	return rc;
}

/* ---- the source topic's identity (docs/mirror.md, "Epochs and identity") ---- */

typedef struct sid_ctx {
	km_pipeline *pl;
	uint32_t life;
	mtopic *t;
} sid_ctx;

static void on_source_id(void *arg, const km_state_result *res)
{
	sid_ctx *x = arg;

	x->pl->store_pending--;
	if (km_pl_current(x->pl, x->life)) {
		x->t->sid_pending = false;
		if (res->code != KM_OK)
			KM_DEBUG(COMP, 0, "%s/%s: the source topic's id not persisted (asked again): %s", x->pl->name,
				 x->t->name, res->message ? res->message : km_err_name(res->code));
	}
	free(x);
}

/* Whether a partition of st has mirrored anything (a run). */
static bool has_runs(const km_state_topic *st)
{
	for (size_t i = 0; i < km_state_topic_partition_count(st); i++) {
		const km_offmap *m = km_state_topic_offmap(st, (int32_t)i);
		if (m && m->n)
			return true;
	}
	return false;
}

/*
 * The source topic's id (Metadata v10+) is persisted the first time the mirror sees it. Another id
 * once records were mirrored is a topic deleted and created again at the source: its offsets start
 * over where the mirror holds the old topic's records, so its partitions go FAILED rather than take
 * them. Before anything was mirrored (a fresh start) the id is the new one's.
 */
static void check_source_id(km_pipeline *pl, mtopic *t, const km_uuid *id)
{
	const km_state_topic *st = km_state_topic_find(km_mirror_store(pl->mi), t->name, strlen(t->name));
	sid_ctx *x;

	if (!st || km_uuid_is_zero(id))
		return;
	if (km_state_topic_source_id_differs(st, id) && has_runs(st)) {
		km_uuid was = km_state_topic_source_id(st);
		char a[23], b[23], why[500];
		km_uuid_str(&was, a);
		km_uuid_str(id, b);
		snprintf(why, sizeof(why), "the source topic was deleted and created again since it was mirrored (topic id "
			 "%s then, %s now): its offsets start over where this topic holds the old one's records. Stop the "
			 "topic (what was mirrored stays readable); the new source topic cannot be mirrored into it", a, b);
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			if (p && p->phase != PH_IDLE && !p->settling &&
			    (p->state == KM_MP_MIRRORING || p->state == KM_MP_PREPARING))
				km_pl_fail_part(pl, p, why);
		}
		return;
	}
	if (t->sid_pending || (!km_state_topic_source_id_missing(st) && !km_state_topic_source_id_differs(st, id)))
		return;
	if (!(x = calloc(1, sizeof(*x))))
		return;
	*x = (sid_ctx){pl, pl->life, t};
	t->sid_pending = true;
	pl->store_pending++;
	km_state_topic_source_id_set(km_mirror_store(pl->mi), pl->name, t->name, id, on_source_id, x);
}

static void take_metadata(km_pipeline *pl, km_cluster *cl, const km_metadata_response *r)
{
	bool src = cl == pl->src;
	char tag[300];

	if (km_cluster_brokers(cl, r) != KM_OK)
		return;
	if (src)
		pl->src_meta_answers++;
	for (int32_t i = 0; i < r->topics.count; i++) {
		const km_metadata_response_topic *mt = &r->topics.items[i];
		char name[256];
		mtopic *t;
		snprintf(name, sizeof(name), "%.*s", mt->name.len > 0 ? (int)mt->name.len : 0, mt->name.p);
		if (!(t = km_pl_topic_get(pl, name, false)))
			continue;
		if (src) {
			t->src_missing = mt->error_code == 3;
			t->src_missing_rounds = t->src_missing ? t->src_missing_rounds + 1 : 0;
			if (!mt->error_code) {
				check_source_id(pl, t, &mt->topic_id);
				t->src_partitions = mt->partitions.count;
				/* The source grew: the destination and the store follow (a no-op when they have as many). */
				km_mirror_grow(pl->mi, pl->name, name, mt->partitions.count);
			}
		} else {
			t->dst_missing = mt->error_code == 3;
			if (!mt->error_code)
				t->dst_id = mt->topic_id;
		}
		if (mt->error_code)
			continue;
		for (int32_t j = 0; j < mt->partitions.count; j++) {
			const km_metadata_response_partition *mp = &mt->partitions.items[j];
			mpart *p = km_pl_part_get(pl, t, mp->partition_index, false);
			if (!p)
				continue;
			if (src) {
				p->lead.src = mp->error_code ? -1 : mp->leader_id;
				p->lead.src_epoch = mp->leader_epoch;
			} else {
				if (p->lead.dst >= 0 && p->lead.dst != mp->leader_id && p->phase >= PH_READY &&
				    (p->plan.head || p->out.inflight))
					/* Leadership moved under our writes: what landed is decided by the log. */
					km_pl_reconcile(pl, p, "the destination leader moved");
				p->lead.dst = mp->error_code ? -1 : mp->leader_id;
			}
		}
	}
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			if (!p || p->phase == PH_IDLE)
				continue;
			if (!src && t->dst_missing)
				km_pl_fail_part(pl, p, "the destination topic does not exist (create it with the source's partition count)");
			else if (src && t->src_missing && p->plan.cont_logical >= 0 && p->state == KM_MP_MIRRORING &&
				 t->src_missing_rounds >= SOURCE_GONE_ROUNDS && !p->settling) {
				/* It was mirrored and is gone: the source topic was deleted. The mirror stops. */
				KM_WARN(COMP, 0, "%s/%s: the source topic was deleted: stopping the partition", pl->name,
					km_pl_ptag(p, tag, sizeof(tag)));
				p->settling = true;
				km_mirror_settle(pl->mi, pl->name, t->name, p->id, KM_MP_MIRRORING, KM_MP_STOPPING, NULL);
			} else if (src && t->src_missing && t->src_missing_rounds == 1) {
				KM_WARN(COMP, 0, "%s/%s: the source has no such topic (yet): waiting for it", pl->name,
					km_pl_ptag(p, tag, sizeof(tag)));
			}
		}
	}
}

static void on_metadata(km_net_client *c, const km_rpc_response *res, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	km_cluster *cl = x->cl;
	km_err err = km_rpc_transport_err(res);

	free(x);
	if (pl->closing)
		return;
	if (cl == pl->src) {
		pl->src_meta_inflight = false;
		km_pl_source_contact(pl, err, false);
	} else {
		pl->dst_meta_inflight = false;
	}
	if (err != KM_OK) {
		KM_WARN(COMP, 0, "%s: %s Metadata failed: %s", pl->name, km_cluster_side(cl), km_err_name(err));
		km_cluster_drop(cl, c);
		km_pl_schedule_in(pl, BACKOFF_MIN_MS * 5);
		return;
	}
	if (res->msg)
		take_metadata(pl, cl, res->msg);
	km_pl_tick_soon(pl);
}

void km_pl_send_metadata(km_pipeline *pl, km_cluster *cl)
{
	km_net_client *c = NULL;
	km_metadata_request m;
	km_metadata_request_topic *ts;
	km_err rc;
	int16_t ver;
	bool *inflight = cl == pl->src ? &pl->src_meta_inflight : &pl->dst_meta_inflight;

	if (cl == pl->src && pl->src_meta_to_node) {
		c = km_cluster_node(cl, pl->src_meta_node);
		if (!km_cluster_usable(cl, c))
			c = NULL;
		pl->src_meta_to_node = false;
	}
	if (!c)
		c = km_cluster_any(cl);
	if (!km_cluster_usable(cl, c))
		return; /* the cluster's on_change ticks again once it is ready */
	if ((ver = km_net_version_pick(c, KM_API_METADATA, META_LO, META_HI)) < 0) {
		KM_ERROR(COMP, 0, "%s: the %s cluster does not support Metadata v%d+", pl->name, km_cluster_side(cl),
			 META_LO);
		return;
	}
	ts = calloc(pl->ntopics ? pl->ntopics : 1, sizeof(*ts));
	if (!ts)
		return;
	km_metadata_request_init(&m);
	for (size_t i = 0; i < pl->ntopics; i++) {
		km_metadata_request_topic_init(&ts[i]);
		ts[i].name = km_str_c(pl->topics[i]->name);
	}
	m.topics.items = ts;
	m.topics.count = (int32_t)pl->ntopics;
	m.allow_auto_topic_creation = false;
	rc = km_pl_call(c, KM_API_METADATA, ver, &m, on_metadata, km_pl_ctx_new(pl, cl, -1, ver));
	free(ts);
	if (rc == KM_OK) {
		*inflight = true;
		if (cl == pl->src) {
			pl->src_meta_need = false;
			pl->src_meta_at = km_wall_ms();
		} else {
			pl->dst_meta_need = false;
			pl->dst_meta_at = km_wall_ms();
		}
	} else {
		km_cluster_drop(cl, c);
	}
}

/* ---- the mirror's producer id on the destination ---- */

/* Partitions waiting for a fresh id (a new producer, or the writer's next epoch) take this one: sequences from 0. */
static void take_pid(km_pipeline *pl, int64_t pid, int16_t epoch)
{
	pl->pid = pid;
	pl->epoch = epoch;
	pl->pid_gen++;
	KM_DEBUG(COMP, 0, "%s: writing as producer id %lld epoch %d", pl->name, (long long)pl->pid, pl->epoch);
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			if (p && p->recon.need_pid && !p->out.inflight) {
				p->recon.need_pid = false;
				p->plan.pid = pl->pid;
				p->plan.epoch = pl->epoch;
				p->plan.seq = 0;
			}
		}
	km_pl_tick_soon(pl);
}

/*
 * The mirror writes its data batches as one producer of the destination's transaction coordinator,
 * transactional id kmirror/<mirror>/writer, whichever kmirrord runs it (it never opens a
 * transaction with it). Every fresh producer id a reconcile asks for is that producer's next epoch
 * (InitProducerId again), so once a partition took a batch of the new epoch the broker refuses
 * the older one's (INVALID_PRODUCER_EPOCH): a kmirrord that ran the mirror before, paused or cut
 * off, cannot write behind the one that runs it now. A writer that cannot be initialised (no
 * WRITE on the transactional id) falls back to producer ids of its own, saying so.
 */
void km_pl_drive_writer(km_pipeline *pl, int64_t now, int64_t *next)
{
	int64_t at;

	if (!pl->writer || pl->writer_plain) {
		if (pl->pid_want && !pl->pid_inflight)
			km_pl_send_pid(pl);
		return;
	}
	if (pl->pid_want && !pl->pid_inflight) {
		km_txp_fence(pl->writer); /* InitProducerId again: the next epoch */
		pl->pid_want = false;
		pl->pid_inflight = true;
	}
	at = km_txp_poll(pl->writer, now);
	if (at < *next)
		*next = at;
	if (!pl->pid_inflight)
		return;
	switch (km_txp_state_of(pl->writer)) {
	case KM_TXP_FREE:
		pl->pid_inflight = false;
		take_pid(pl, km_txp_pid(pl->writer), km_txp_epoch(pl->writer));
		break;
	case KM_TXP_FAILED:
		KM_WARN(COMP, 0, "%s: its writer %s cannot be initialised (%s): it writes as producers of its own, which "
			"do not fence a kmirrord that ran the mirror before (grant kmirrord WRITE on the transactional "
			"ids with prefix kmirror/)", pl->name, km_txp_id(pl->writer), km_txp_error(pl->writer));
		pl->writer_plain = true;
		pl->pid_inflight = false;
		pl->pid_want = true;
		break;
	default:
		break;
	}
}

static void on_pid(km_net_client *c, const km_rpc_response *res, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	const km_init_producer_id_response *r = res->msg;
	km_err err = km_rpc_transport_err(res), rc = res->err;

	free(x);
	if (pl->closing)
		return;
	pl->pid_inflight = false;
	if (err != KM_OK) {
		km_cluster_drop(pl->dst, c);
		km_pl_schedule_in(pl, BACKOFF_MIN_MS * 5);
		return;
	}
	if (rc != KM_OK || r->error_code) {
		KM_WARN(COMP, 0, "%s: InitProducerId on the destination failed: %s", pl->name,
			km_err_name(rc != KM_OK ? rc : (km_err)r->error_code));
		km_pl_schedule_in(pl, BACKOFF_MAX_MS / 4);
		return;
	}
	take_pid(pl, r->producer_id, r->producer_epoch);
}

void km_pl_send_pid(km_pipeline *pl)
{
	km_net_client *c = km_cluster_any(pl->dst);
	km_init_producer_id_request m;
	int16_t ver;

	if (!km_cluster_usable(pl->dst, c))
		return;
	if ((ver = km_net_version_pick(c, KM_API_INIT_PRODUCER_ID, PID_LO, PID_HI)) < 0)
		return;
	km_init_producer_id_request_init(&m);
	m.transactional_id = KM_STR_NULL;
	m.transaction_timeout_ms = 60000;
	m.producer_id = -1;
	m.producer_epoch = -1;
	if (km_pl_call(c, KM_API_INIT_PRODUCER_ID, ver, &m, on_pid, km_pl_ctx_new(pl, pl->dst, -1, ver)) == KM_OK) {
		pl->pid_inflight = true;
		pl->pid_want = false;
	} else {
		km_cluster_drop(pl->dst, c);
	}
}

/*
 * The partition a km_pl_send_part answer is about (NULL: the pipeline closes, or the partition is
 * gone), its pipeline in *pl and the request's context in *lc; the request's allocations freed.
 */
mpart *km_pl_answer_part(void *arg, km_pipeline **pl, lo_ctx *lc)
{
	req_ctx *x = arg;
	lo_ctx *ctx = x->extra;

	*pl = x->pl;
	*lc = *ctx;
	free(x);
	free(ctx);
	return (*pl)->closing ? NULL : km_pl_part_get(*pl, lc->t, lc->part, false);
}

/* Send a request about one partition to cl's broker leader, answered to cb with an lo_ctx (*lc copied). */
bool km_pl_send_part(km_pipeline *pl, km_cluster *cl, int32_t leader, km_net_client *c, int16_t key,
		      int16_t ver, const void *req, km_rpc_cb cb, const lo_ctx *lc)
{
	lo_ctx *l = calloc(1, sizeof(*l));
	req_ctx *x = km_pl_ctx_new(pl, cl, leader, ver);

	if (!l || !x) {
		free(l);
		free(x);
		return false;
	}
	*l = *lc;
	x->extra = l;
	if (km_pl_call(c, key, ver, req, cb, x) != KM_OK) {
		free(l);
		km_cluster_drop(cl, c);
		return false;
	}
	return true;
}
