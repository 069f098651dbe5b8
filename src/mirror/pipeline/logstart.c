/* The destination's log start follows the source's (retention, DeleteRecords). */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/delete_records_request.h"
#include "kmirror/msg/delete_records_response.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

typedef struct ls_ctx {
	mtopic *t;
	int32_t part;
	int64_t logical;
} ls_ctx;

static void on_delete_records(km_net_client *c, const km_rpc_response *res, void *arg)
{
	req_ctx *x = arg;
	km_pipeline *pl = x->pl;
	ls_ctx *lc = x->extra;
	const km_delete_records_response *r = res->msg;
	km_err err = km_rpc_transport_err(res);
	int16_t code = -1;
	mpart *p;

	free(x);
	if (pl->closing) {
		free(lc);
		return;
	}
	p = km_pl_part_get(pl, lc->t, lc->part, false);
	if (err == KM_OK) {
		if (r && r->topics.count == 1 && r->topics.items[0].partitions.count == 1)
			code = r->topics.items[0].partitions.items[0].error_code;
	} else {
		km_cluster_drop(pl->dst, c);
	}
	if (p) {
		char tag[300];
		p->ls.inflight = false;
		if (code == 0) {
			p->ls.dst = lc->logical;
			KM_DEBUG(COMP, 0, "%s/%s: the destination's log start follows the source's to %lld", pl->name,
				 km_pl_ptag(p, tag, sizeof(tag)), (long long)lc->logical);
		} else if (code == 44 || code == 29 || code == 17) {
			/* POLICY_VIOLATION (a compacted topic), not authorized, internal: the destination keeps its start. */
			p->ls.unsupported = true;
			KM_WARN(COMP, 0, "%s/%s: the destination's log start cannot follow the source's (DeleteRecords: %s)",
				pl->name, km_pl_ptag(p, tag, sizeof(tag)), km_err_name((km_err)code));
		} else {
			KM_WARN(COMP, 0, "%s/%s: DeleteRecords on the destination to follow the source's log start: %s",
				pl->name, km_pl_ptag(p, tag, sizeof(tag)),
				err != KM_OK ? km_err_name(err) : code < 0 ? "undecodable answer" : km_err_name((km_err)code));
		}
	}
	free(lc);
}

/*
 * The source's log start moved past what the destination starts with: move the destination's,
 * to the physical offset of the same logical one (or of the tail, when the source's passed it).
 */
void km_pl_follow_log_start(km_pipeline *pl, mpart *p, int64_t now)
{
	const km_state_topic *t;
	const km_offmap *m;
	int64_t target, phys;
	km_net_client *c;
	km_delete_records_request rq;
	km_delete_records_request_delete_records_topic dt;
	km_delete_records_request_delete_records_partition dp;
	ls_ctx *lc;
	req_ctx *x;
	int16_t ver;
	char tag[300];

	/*
	 * Only over what the destination acknowledged, with nothing of the partition in flight: the
	 * tail then maps exactly (before the first batch lands it is where the fetch starts, which
	 * can be past the batch's first record).
	 */
	if (p->ls.inflight || p->ls.unsupported || p->ls.src < 0 || p->out.acked_logical < 0 || p->lead.dst < 0 ||
	    p->plan.head || p->out.inflight || p->out.acked_phys <= 0)
		return;
	target = p->ls.src < p->out.acked_logical ? p->ls.src : p->out.acked_logical;
	if (target <= p->ls.dst || (target == p->ls.idle_target && now < p->ls.idle_until))
		return;
	t = km_state_topic_find(km_mirror_store(pl->mi), p->t->name, strlen(p->t->name));
	m = t ? km_state_topic_offmap(t, p->id) : NULL;
	/*
	 * At or below where mirroring began nothing mirrored goes: what lies below the first run is
	 * not the mirror's (records a start adopted, an earlier life's), and stays hidden, not deleted.
	 */
	if (m && m->n && target <= m->runs[0].logical) {
		/*
		 * The usual answer, a source that keeps all it was mirrored from: asked again once the
		 * source's start moves, or after a while (the runs may change). A store lookup a partition
		 * a tick was a third of kmirrord's CPU at 10,000 partitions.
		 */
		p->ls.idle_target = target;
		p->ls.idle_until = now + LOG_START_RECHECK_MS;
		return;
	}
	if (!m || !m->n || (phys = km_offmap_to_physical(m, target)) < 0)
		return;
	c = km_cluster_node(pl->dst, p->lead.dst);
	if (!km_cluster_usable(pl->dst, c) || (ver = km_net_version_pick(c, KM_API_DELETE_RECORDS, 0, 2)) < 0)
		return;
	km_delete_records_request_init(&rq);
	km_delete_records_request_delete_records_topic_init(&dt);
	km_delete_records_request_delete_records_partition_init(&dp);
	dp.partition_index = p->id;
	dp.offset = phys;
	dt.name = km_str_c(p->t->name);
	dt.partitions.items = &dp;
	dt.partitions.count = 1;
	rq.topics.items = &dt;
	rq.topics.count = 1;
	rq.timeout_ms = 30000;
	lc = calloc(1, sizeof(*lc));
	x = km_pl_ctx_new(pl, pl->dst, p->lead.dst, ver);
	if (!lc || !x) {
		free(lc);
		free(x);
		return;
	}
	*lc = (ls_ctx){p->t, p->id, target};
	KM_DEBUG(COMP, 0, "%s/%s: the source's log start is %lld: DeleteRecords on the destination to %lld", pl->name,
		 km_pl_ptag(p, tag, sizeof(tag)), (long long)target, (long long)phys);
	x->extra = lc;
	if (km_pl_call(c, KM_API_DELETE_RECORDS, ver, &rq, on_delete_records, x) != KM_OK) {
		free(lc);
		return;
	}
	p->ls.inflight = true;
}
