/* A diverged source: the source's log validated as a follower validates its own (OffsetForLeaderEpoch with the last mirrored epoch). */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/offset_for_leader_epoch_request.h"
#include "kmirror/msg/offset_for_leader_epoch_response.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

/* OffsetForLeaderEpoch v3+ carries ReplicaId: -1 asks as a consumer (DESCRIBE on the topic). */
enum { OFL_LO = 3, OFL_HI = 4 };

/*
 * The source answered where its leader epoch `asked` (the last mirrored batch's) ends: `epoch` is
 * the largest epoch it has at or below it, `end` where that epoch ends. The mirrored log up to
 * `at` is the source's when the source has that very epoch up to at least `at`. Otherwise the
 * records mirrored from `end` to `at` are not in the source's log any more: hidden
 * (mirror.support.unclean.leader.election) or the partition fails, saying how many.
 */
static void decide(km_pipeline *pl, mpart *p, int32_t asked, int64_t at, int32_t epoch, int64_t end)
{
	char tag[300], why[700];

	p->div.need = false;
	if (epoch == asked && end >= at) {
		p->div.checked = p->lead.src_epoch;
		KM_DEBUG(COMP, 0, "%s/%s: the source's leader epoch %d ends at %lld, at or past the %lld mirrored: its log is "
			 "the one mirrored", pl->name, km_pl_ptag(p, tag, sizeof(tag)), (int)epoch, (long long)end,
			 (long long)at);
		return;
	}
	if (epoch < 0 || end < 0 || end >= at) {
		/* No end below the tail to hide from: the source lacks the epoch, and its own history says nothing of where. */
		snprintf(why, sizeof(why), "the source's log diverged from what was mirrored: it has no leader epoch %d (the "
			 "epoch of the last batch mirrored, up to offset %lld; its latest epoch before it is %d, ending at "
			 "%lld), so where it diverged is not known and nothing can be hidden. Stop the topic to keep what "
			 "was mirrored (it stays readable)", (int)asked, (long long)at, (int)epoch, (long long)end);
		km_pl_fail_part(pl, p, why);
		return;
	}
	if (pl->unclean_hide) {
		KM_WARN(COMP, 0, "%s/%s: the source's log diverged from what was mirrored: its leader epoch %d ends at offset "
			"%lld, below the %lld mirrored (epoch %d): %lld record(s) at source offsets %lld to %lld are hidden "
			"(mirror.support.unclean.leader.election); mirroring on from %lld, the source's new log",
			pl->name, km_pl_ptag(p, tag, sizeof(tag)), (int)epoch, (long long)end, (long long)at, (int)asked,
			(long long)(at - end), (long long)end, (long long)at - 1, (long long)end);
		p->div.diverged = true;
		p->recon.hide_logical = end;
		km_pl_reconcile(pl, p, "the source's log diverged: its tail is hidden");
		return;
	}
	snprintf(why, sizeof(why), "the source's log diverged from what was mirrored: %lld record(s) mirrored at source "
		 "offsets %lld to %lld are not in its log any more (its leader epoch %d ends at %lld there: an unclean "
		 "leader election, or a truncation). Set mirror.support.unclean.leader.election=true on the mirror to "
		 "hide them and mirror on from the source's new log, or stop the topic to keep them (they stay readable)",
		 (long long)(at - end), (long long)end, (long long)at - 1, (int)epoch, (long long)end);
	km_pl_fail_part(pl, p, why);
}

static void on_epoch_end(km_net_client *c, const km_rpc_response *res, void *arg)
{
	km_pipeline *pl;
	lo_ctx lc;
	mpart *p = km_pl_answer_part(arg, &pl, &lc);
	const km_offset_for_leader_epoch_response *r = res->msg;
	const km_offset_for_leader_epoch_response_epoch_end_offset *pr = NULL;
	km_err err = km_rpc_transport_err(res);
	int32_t asked = (int32_t)lc.ts;
	int64_t at = lc.tag;
	char tag[300];

	if (!p)
		return;
	p->div.inflight = false;
	if (err != KM_OK) {
		km_cluster_drop(pl->src, c);
		km_pl_backoff(p);
		km_pl_tick_soon(pl);
		return;
	}
	if (r && r->topics.count == 1 && r->topics.items[0].partitions.count == 1)
		pr = &r->topics.items[0].partitions.items[0];
	if (!pr || pr->error_code) {
		int16_t code = pr ? pr->error_code : KM_KAFKA_UNKNOWN_SERVER_ERROR;
		if (km_pl_source_meta_stale(code)) {
			pl->src_meta_need = true; /* asked again of the leader the metadata names */
		} else {
			/* Refused (authorization, a broker that cannot say): the fetch goes on as before. */
			KM_WARN(COMP, 0, "%s/%s: the source cannot say where leader epoch %d ends (%s): its log is not "
				"checked against what was mirrored", pl->name, km_pl_ptag(p, tag, sizeof(tag)), (int)asked,
				km_err_name(code));
			p->div.need = false;
			p->div.checked = p->lead.src_epoch;
		}
		km_pl_backoff(p);
		km_pl_tick_soon(pl);
		return;
	}
	if (p->out.acked_logical == at && p->out.acked_epoch == asked && p->phase == PH_READY &&
	    p->state == KM_MP_MIRRORING && !p->settling)
		decide(pl, p, asked, at, pr->leader_epoch, pr->end_offset);
	km_pl_tick_soon(pl);
}

void km_pl_want_divergence_check(km_pipeline *pl, mpart *p)
{
	p->div.need = true;
	p->div.meta_at = pl->src_meta_answers;
	pl->src_meta_need = true;
	if (p->lead.src >= 0) {
		pl->src_meta_to_node = true; /* the leader knows its topic's id first */
		pl->src_meta_node = p->lead.src;
	}
}

void km_pl_check_divergence(km_pipeline *pl, mpart *p, int64_t now)
{
	km_offset_for_leader_epoch_request m;
	km_offset_for_leader_epoch_request_offset_for_leader_topic t;
	km_offset_for_leader_epoch_request_offset_for_leader_partition pp;
	km_net_client *c;
	int16_t ver;
	lo_ctx lc;

	/* The source's leader changed since the last batch mirrored, and that leader's log was not checked yet. */
	if (!p->div.need && p->out.acked_epoch >= 0 && p->lead.src_epoch >= 0 && p->lead.src_epoch != p->out.acked_epoch &&
	    p->lead.src_epoch != p->div.checked)
		km_pl_want_divergence_check(pl, p);
	if (!p->div.need || p->div.inflight || p->phase != PH_READY || p->state != KM_MP_MIRRORING || p->settling ||
	    p->retry.at > now || p->plan.head || p->out.inflight || p->lead.src < 0)
		return;
	if (pl->src_meta_answers <= p->div.meta_at) {
		/* A source topic deleted and created again is told by its id (meta.c), not taken for a divergence. */
		pl->src_meta_need = true;
		return;
	}
	if (p->out.acked_epoch < 0 || p->out.acked_logical <= 0) {
		p->div.need = false; /* no epoch to check with: nothing mirrored since this life's start */
		return;
	}
	c = km_cluster_node(pl->src, p->lead.src);
	if (!km_cluster_usable(pl->src, c))
		return;
	if ((ver = km_net_version_pick(c, KM_API_OFFSET_FOR_LEADER_EPOCH, OFL_LO, OFL_HI)) < 0) {
		p->div.need = false; /* before Kafka 2.3: not checked */
		p->div.checked = p->lead.src_epoch;
		return;
	}
	km_offset_for_leader_epoch_request_init(&m);
	km_offset_for_leader_epoch_request_offset_for_leader_topic_init(&t);
	km_offset_for_leader_epoch_request_offset_for_leader_partition_init(&pp);
	m.replica_id = -1;
	pp.partition = p->id;
	pp.current_leader_epoch = p->lead.src_epoch;
	pp.leader_epoch = p->out.acked_epoch;
	t.topic = km_str_c(p->t->name);
	t.partitions.items = &pp;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	lc = (lo_ctx){.t = p->t, .part = p->id, .ts = p->out.acked_epoch, .tag = p->out.acked_logical};
	if (km_pl_send_part(pl, pl->src, p->lead.src, c, KM_API_OFFSET_FOR_LEADER_EPOCH, ver, &m, on_epoch_end, &lc))
		p->div.inflight = true;
}
