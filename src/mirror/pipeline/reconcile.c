/* Reconcile and the start: ListOffsets on both sides, the hidden range, the fence run, where a partition starts. */
#include <stdlib.h>
#include <string.h>

#include "kmirror/api.h"
#include "kmirror/log.h"
#include "kmirror/msg/fetch_request.h"
#include "kmirror/msg/fetch_response.h"
#include "kmirror/msg/list_offsets_request.h"
#include "kmirror/msg/list_offsets_response.h"
#include "kmirror/rpc.h"
#include "mirror/pipeline/pipeline.h"

static void after_lso(km_pipeline *pl, mpart *p, int64_t end, int64_t lso);
static void fence_from(km_pipeline *pl, mpart *p, int64_t end, int64_t from);
static bool aborted_probe(km_pipeline *pl, mpart *p);
static void after_start(km_pipeline *pl, mpart *p, int64_t off, bool jump);
static void check_tail(km_pipeline *pl, mpart *p, int64_t end);
static int64_t resume_logical(const km_offmap *m, int64_t x);
static bool marker_ask(km_pipeline *pl, mpart *p, int64_t x, bool tail);
static void hidden_from(km_pipeline *pl, mpart *p, int64_t at);

/* ---- ListOffsets: the destination's end (reconcile) and the source's start ---- */

static void on_list_offsets(km_net_client *c, const km_rpc_response *res, void *arg)
{
	km_pipeline *pl;
	lo_ctx lc;
	mpart *p = km_pl_answer_part(arg, &pl, &lc);
	const km_list_offsets_response *r = res->msg;
	km_err err = km_rpc_transport_err(res);
	int16_t perr = -1;
	int64_t off = -1;

	if (pl->closing)
		return;
	if (p && lc.kind == LO_WATCH)
		p->watch.inflight = false;
	if (err == KM_OK) {
		if (r && r->topics.count == 1 && r->topics.items[0].partitions.count == 1) {
			perr = r->topics.items[0].partitions.items[0].error_code;
			off = r->topics.items[0].partitions.items[0].offset;
		}
	} else {
		km_cluster_drop(lc.dest ? pl->dst : pl->src, c);
	}
	if (p && lc.kind == LO_MARKER) {
		km_pl_marker_answer(pl, p, err == KM_OK && perr == 0 && off >= 0, off, lc.tag);
	} else if (p && lc.kind == LO_LSO) {
		if (p->phase == PH_RECON_LSO) {
			if (err != KM_OK || perr != 0 || off < 0) {
				pl->dst_meta_need = true;
				km_pl_set_phase(p, PH_RECONCILE, "ListOffsets READ_COMMITTED on the destination failed");
				km_pl_backoff(p);
			} else {
				after_lso(pl, p, p->recon.end, off);
			}
		}
	} else if (p && lc.kind == LO_WATCH) {
		if (err == KM_OK && perr == 0 && off >= 0) {
			p->stats.source_end = off;
			km_state_partition_progress(km_mirror_store(pl->mi), p->t->name, p->id, off, -1);
			km_pl_update_lag(p, km_wall_ms());
		} else {
			pl->src_meta_need = true;
		}
	} else if (p && p->phase == PH_START_WAIT && err == KM_OK && perr == 0 && off < 0 && lc.ts >= 0) {
		/* No record at or after the start timestamp yet: start at the source's end. */
		p->start.latest = true;
		km_pl_set_phase(p, PH_START, "no record at or after the start timestamp");
	} else if (p && (p->phase == PH_RECON_WAIT || p->phase == PH_START_WAIT)) {
		bool recon = p->phase == PH_RECON_WAIT;
		if (err != KM_OK || perr != 0 || off < 0) {
			char tag[300];
			KM_WARN(COMP, 0, "%s/%s: ListOffsets on the %s failed: %s", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
				lc.dest ? "destination" : "source",
				err != KM_OK ? km_err_name(err) : km_err_name((km_err)perr));
			km_pl_set_phase(p, recon ? PH_RECONCILE : PH_START, "ListOffsets failed");
			if (lc.dest)
				pl->dst_meta_need = true;
			else
				pl->src_meta_need = true;
			km_pl_backoff(p);
		} else if (recon) {
			/* Then the last stable offset: open destination transactions end reconcile's resume point. */
			p->recon.end = off;
			km_pl_set_phase(p, PH_RECON_LSO, "the destination's log end is known");
			if (!km_pl_send_lo(pl, p, true, -1, LO_LSO)) {
				km_pl_set_phase(p, PH_RECONCILE, "ListOffsets READ_COMMITTED could not be sent");
				km_pl_backoff(p);
			}
		} else {
			after_start(pl, p, off, p->start.oor);
		}
	}
	km_pl_tick_soon(pl);
}

bool km_pl_send_list_offsets(km_pipeline *pl, mpart *p, bool dest, int64_t ts)
{
	return km_pl_send_lo(pl, p, dest, ts, LO_POSITION);
}

bool km_pl_send_lo(km_pipeline *pl, mpart *p, bool dest, int64_t ts, lo_kind kind)
{
	km_cluster *cl = dest ? pl->dst : pl->src;
	int32_t leader = dest ? p->lead.dst : p->lead.src;
	km_net_client *c = leader >= 0 ? km_cluster_node(cl, leader) : NULL;
	km_list_offsets_request m;
	km_list_offsets_request_list_offsets_topic t;
	km_list_offsets_request_list_offsets_partition pp;
	int16_t ver;

	if (!c) {
		if (dest)
			pl->dst_meta_need = true;
		else
			pl->src_meta_need = true;
		return false;
	}
	if (!km_cluster_usable(cl, c))
		return false;
	if ((ver = km_net_version_pick(c, KM_API_LIST_OFFSETS, LO_LO, LO_HI)) < 0)
		return false;
	km_list_offsets_request_init(&m);
	km_list_offsets_request_list_offsets_topic_init(&t);
	km_list_offsets_request_list_offsets_partition_init(&pp);
	m.replica_id = -1;
	m.isolation_level = kind == LO_LSO ? 1 : 0;
	if (kind == LO_LSO && ver < 2)
		return false; /* no isolation before v2 (Kafka 0.11): no transactions either */
	pp.partition_index = p->id;
	pp.current_leader_epoch = dest ? -1 : p->lead.src_epoch;
	pp.timestamp = ts;
	t.name = km_str_c(p->t->name);
	t.partitions.items = &pp;
	t.partitions.count = 1;
	m.topics.items = &t;
	m.topics.count = 1;
	return km_pl_send_part(pl, cl, leader, c, KM_API_LIST_OFFSETS, ver, &m, on_list_offsets,
			 &(lo_ctx){p->t, p->id, dest, ts, kind, kind == LO_MARKER && p->plan.head ? p->plan.head->physical : -1});
}

/* The start position asked of the source: mirror.start.offset. */
int64_t km_pl_start_timestamp(const km_pipeline *pl)
{
	if (!strcmp(pl->start_mode, "latest"))
		return -1;
	if (!pl->start_mode[0] || !strcmp(pl->start_mode, "earliest"))
		return -2;
	return strtoll(pl->start_mode, NULL, 10);
}

/* The source leader epoch before logical, as persisted: known when the partition's record was written at that tail. */
static int32_t persisted_epoch_at(km_pipeline *pl, const mpart *p, int64_t logical)
{
	const km_state_topic *t = km_state_topic_find(km_mirror_store(pl->mi), p->t->name, strlen(p->t->name));
	km_mp_state state;
	int64_t last;
	int32_t epoch;

	if (!km_state_partition_record(t, p->id, &state, &last, &epoch) || last != logical)
		return -1;
	return epoch;
}

/* ---- the writer: who writes the partition from where, persisted before it writes ---- */

typedef struct writer_ctx {
	km_pipeline *pl;
	uint32_t life;
	mtopic *t;
	int32_t part;
	uint32_t gen;
} writer_ctx;

static void on_writer(void *arg, const km_state_result *res)
{
	writer_ctx *x = arg;
	km_pipeline *pl = x->pl;
	mpart *p = km_pl_current(pl, x->life) ? km_pl_part_get(pl, x->t, x->part, false) : NULL;

	pl->store_pending--;
	if (p && p->recon.writer_gen == x->gen && p->recon.writer_pending) {
		if (res->code != KM_OK) {
			char tag[300];
			KM_WARN(COMP, 0, "%s/%s: its writer could not be persisted: %s", pl->name,
				km_pl_ptag(p, tag, sizeof(tag)), res->message ? res->message : km_err_name(res->code));
			km_pl_set_phase(p, PH_RECONCILE, "its writer could not be persisted");
			km_pl_backoff(p);
		} else {
			p->recon.writer_pending = false;
		}
		km_pl_tick_soon(pl);
	}
	free(x);
}

/*
 * The partition writes with plan.pid from physical offset start on, its sequences from 0: persisted
 * before its first write (it is not fetched until then), so that a later reconcile can tell its
 * batches from anyone else's (check_tail).
 */
static bool persist_writer(km_pipeline *pl, mpart *p, int64_t start)
{
	writer_ctx *x;

	p->recon.writer_gen++;
	p->recon.writer_pending = false;
	if (p->plan.pid < 0)
		return true; /* no producer id: nothing is written with it */
	if (!(x = calloc(1, sizeof(*x))))
		return false;
	p->recon.writer_pending = true;
	*x = (writer_ctx){pl, pl->life, p->t, p->id, p->recon.writer_gen};
	pl->store_pending++;
	km_state_partition_writer(km_mirror_store(pl->mi), pl->name, p->t->name, p->id, p->plan.pid, p->plan.epoch,
				  start, on_writer, x);
	return true;
}

/*
 * The destination's log ends at physical end: the runs say which logical offset that is (every
 * batch that landed is covered by a run, persisted before it was produced). Runs at or past end
 * were written for batches that never landed: they are removed before anything else is written.
 * After a batch landed where it was not planned (p->recon.hide_logical set), everything from there to
 * end is hidden: the runs from hide_logical on go, and a run at (hide_logical, end) closes the run
 * before it at hide_logical, so the mirror resumes at hide_logical, written after what is hidden.
 */
/*
 * Run i starts at the log's end and hides what lies before it: the run before it ends (logically,
 * where run i says) below that physical offset. It was written by a reconcile that hid a range
 * and resumed there, and no batch landed after it yet (a pause, then a resume): it is no run of a
 * batch that never landed, and without it the range it hides would be shown again (docs/mirror.md,
 * "Reconcile"; docs/reliability.md, finding 15).
 */
static bool resume_run(const km_offmap *m, size_t i, int64_t end)
{
	const km_offrun *r = &m->runs[i], *prev = i > 0 ? &m->runs[i - 1] : NULL;
	return r->physical == end && prev && r->prev_logical_end >= prev->logical &&
	       prev->physical + (r->prev_logical_end - prev->logical) < r->physical;
}

static void after_reconcile(km_pipeline *pl, mpart *p, int64_t end)
{
	const km_offrun *fence;
	const km_offmap *m = km_pl_map_of(pl, p, &fence);
	size_t keep = m ? m->n : 0, nw = 0;
	int64_t hide = p->recon.hide_logical;
	km_state_run *w = NULL;
	char tag[300];

	p->recon.relisted = false; /* reconciled: a later open transaction has the ids listed again */
	p->recon.hang_closed = false;
	p->recon.hang_asked = false;
	while (keep > 0 && ((m->runs[keep - 1].physical >= end && !resume_run(m, keep - 1, end)) ||
			    (hide >= 0 && m->runs[keep - 1].logical >= hide)))
		keep--;
	if (hide < 0 && keep > 0 && km_offmap_hides_before(m, keep, end)) {
		/*
		 * The first run that never landed also hid what lies between the run before it and the
		 * log's end (a stop's seal written over the run that hid earlier seals, then lost):
		 * mapping the end through the run before would show that range and resume past it. It
		 * stays hidden, and the mirror resumes at that run's logical offset (finding 34).
		 */
		hide = p->recon.hide_logical = m->runs[keep].logical; /* the runs before it start below it */
	}
	p->out.acked_phys = p->plan.phys = end;
	p->out.probe = true;
	p->recon.seal_out = false; /* the log said where the tail is: a seal of before is in it or not */
	if (!persist_writer(pl, p, end)) {
		km_pl_set_phase(p, PH_RECONCILE, "out of memory");
		km_pl_backoff(p);
		return;
	}
	p->retry.backoff_ms = 0;
	if (m && (keep < m->n || hide >= 0)) {
		w = calloc(m->n - keep + 1, sizeof(*w));
		if (!w) {
			km_pl_set_phase(p, PH_RECONCILE, "out of memory");
			km_pl_backoff(p);
			return;
		}
		for (size_t i = keep; i < m->n; i++)
			if (m->runs[i].logical != hide) /* that key is rewritten below */
				w[nw++] = (km_state_run){p->t->name, p->id, m->runs[i].logical, -1, -1};
		if (nw)
			KM_INFO(COMP, 0, "%s/%s: %zu run(s) past the destination's end %lld %s: removed", pl->name,
				km_pl_ptag(p, tag, sizeof(tag)), nw, (long long)end,
				hide >= 0 ? "or past a misplaced batch" : "never landed");
	}
	if (hide >= 0 && p->recon.drill) {
		int64_t from = km_offmap_to_physical(m, hide);
		KM_WARN(COMP, 0, "%s/%s: %lld record(s) written here while the topic was stopped (destination offsets "
			"%lld to %lld) are hidden; mirroring on from source offset %lld", pl->name,
			km_pl_ptag(p, tag, sizeof(tag)), (long long)(end - from), (long long)from, (long long)end - 1,
			(long long)hide);
	} else if (hide >= 0 && !p->div.diverged) {
		KM_WARN(COMP, 0, "%s/%s: destination offsets from the misplaced batch to %lld hidden; resuming at %lld",
			pl->name, km_pl_ptag(p, tag, sizeof(tag)), (long long)end, (long long)hide);
	}
	if (hide >= 0) {
		/* Resume at hide, physically after everything now hidden. */
		w[nw++] = (km_state_run){p->t->name, p->id, hide, end, km_offmap_prev_end_at(m, hide), 0};
		p->plan.cont_logical = p->plan.fetch_logical = p->out.acked_logical = hide;
		p->out.acked_epoch = persisted_epoch_at(pl, p, hide);
		p->plan.cont_lat = false;
	} else if (keep > 0) {
		const km_offrun *r = &m->runs[keep - 1];
		p->plan.cont_logical = r->logical + (end - r->physical);
		p->plan.cont_lat = (r->flags & KM_OFFRUN_LOG_APPEND_TIME) != 0;
		p->plan.fetch_logical = p->out.acked_logical = p->plan.cont_logical;
		p->out.acked_epoch = persisted_epoch_at(pl, p, p->out.acked_logical);
	} else {
		/* Nothing mirrored yet: the start position comes from the source; what the destination holds is hidden. */
		p->plan.cont_logical = -1;
	}
	if (keep > 0 || hide >= 0) {
		KM_INFO(COMP, 0, "%s/%s: resumes at offset %lld (destination offset %lld)", pl->name,
			km_pl_ptag(p, tag, sizeof(tag)), (long long)p->plan.fetch_logical, (long long)end);
		km_pl_set_tail(pl, p, true);
	}
	if (nw) {
		km_pl_run_then(pl, p, w, nw, keep > 0 || hide >= 0 ? PH_READY : PH_START); /* hide_logical stays until it is in */
	} else {
		p->recon.hide_logical = -1;
		p->recon.drill = false;
		p->div.diverged = false;
		km_pl_set_phase(p, keep > 0 ? PH_READY : PH_START, "reconciled");
	}
	free(w);
}

/*
 * Reconcile with transactions (docs/mirror.md, "Transactions"): the destination's log ends at
 * end, its last stable offset is lso. Data past the LSO sits in destination transactions nobody
 * will end now (an earlier life's, or this partition's own after an uncertain write): the mirror
 * resumes at the LSO's logical offset, what lies past it hidden. Order matters for a crash at any
 * point: a fence run (hide, end) is persisted first, then the partition's transactional ids are
 * fenced (their transactions aborted, the abort markers written), and a second pass over the
 * then settled log writes the run again at the log's new end.
 */
/*
 * The logical offset of physical offset x as reconcile resumes there: the last run starting at or
 * before x, as far into it as x is (its end, then the next run's start, when it is closed before
 * x). -1 without such a run.
 */
/* How many of m's runs start at or before physical offset x: the last of them is the one x is in or after. */
static size_t runs_from(const km_offmap *m, int64_t x)
{
	size_t i = m ? m->n : 0;
	while (i > 0 && m->runs[i - 1].physical > x)
		i--;
	return i;
}

static int64_t resume_logical(const km_offmap *m, int64_t x)
{
	size_t i = runs_from(m, x);
	int64_t len;
	if (!i)
		return -1;
	len = km_offmap_run_length(m, i - 1);
	if (len >= 0 && x - m->runs[i - 1].physical > len)
		return i < m->n ? m->runs[i].logical : m->runs[i - 1].logical + len;
	return m->runs[i - 1].logical + (x - m->runs[i - 1].physical);
}

/*
 * The partition's map as reconcile reads it, and its fence run if one is persisted (the runs after
 * it were written before the fence). Reconcile reads the open run unbounded, as the pipeline always
 * has, whatever tail the map shows readers meanwhile (the persisted progress it had when the
 * pipeline took the partition, km_pl_set_phase): a view with the tail unset, sharing the runs,
 * valid until the map changes.
 */
const km_offmap *km_pl_map_of(km_pipeline *pl, const mpart *p, const km_offrun **fence)
{
	const km_state_topic *t = km_state_topic_find(km_mirror_store(pl->mi), p->t->name, strlen(p->t->name));
	const km_offmap *m = t ? km_state_topic_offmap(t, p->id) : NULL;
	km_offmap *view = (km_offmap *)&p->recon.view;
	*fence = NULL;
	for (size_t i = 0; m && i < m->n && !*fence; i++)
		if (m->runs[i].flags & KM_OFFRUN_FENCE)
			*fence = &m->runs[i];
	if (!m)
		return NULL;
	*view = *m;
	view->tail_physical = view->tail_logical = -1;
	return view;
}

/*
 * The destination partition holds a transaction open from lso that is none of the mirror's: a
 * client's, begun through kmirrord while the topic was still writable (or written to the
 * destination directly). Its producer (or its timeout) ends it later, and the coordinator then
 * writes its marker at the log's end: between two mirrored batches, where the map expects the
 * mirror's next batch. The mirror writes nothing until it has ended; reconcile asks again, with
 * backoff, and a transaction that stays open past KM_MIRROR_FAIL_AFTER_MS fails the partition
 * with this message.
 */
static void foreign_txn(km_pipeline *pl, mpart *p, int64_t lso)
{
	char why[1024];
	snprintf(why, sizeof(why),
		 "a transaction that is not the mirror's is open on the destination partition from offset %lld "
		 "(begun before the topic became a mirror, or written to the destination directly): the mirror "
		 "writes nothing until it ends, since its marker would land between mirrored batches; its "
		 "producer commits or aborts it, or the destination aborts it at its timeout, or an operator "
		 "aborts it (kafka-transactions.sh --bootstrap-server <destination> find-hanging --topic %s, "
		 "then abort)",
		 (long long)lso, p->t->name);
	km_pl_reconcile(pl, p, why);
}

/*
 * A stop with destination transactions open (docs/mirror.md, "A stop with transactions open"):
 * nothing mirrored is hidden. Fencing the partition's transactional ids aborts what is open, and
 * the coordinator appends an ABORT marker per open transaction, which the open run covers: a
 * read_committed reader skips the aborted records at their markers, and every record other
 * producers committed after them stays at its source offset. The stop point, which the STOPPED
 * record keeps as the last mirrored offset (where a later start goes back to, what a failback
 * trusts), is where the earliest open transaction began: past it the destination is no longer the
 * source's copy (the source may still commit what was aborted here).
 */
static void stop_aborts(km_pipeline *pl, mpart *p, const km_offmap *m, int64_t lso)
{
	int64_t at = resume_logical(m, lso);
	char tag[300];

	for (size_t i = 0; i < p->txn.n; i++)
		if (p->txn.tx[i].src_pid >= 0 && p->txn.tx[i].first_logical >= 0 &&
		    (at < 0 || p->txn.tx[i].first_logical < at))
			at = p->txn.tx[i].first_logical;
	if (at >= 0 && (p->recon.stop_at < 0 || at < p->recon.stop_at))
		p->recon.stop_at = at;
	KM_INFO(COMP, 0, "%s/%s: stopping: the open destination transactions are aborted (their markers follow the "
		"mirrored records, nothing is hidden); the stop point is offset %lld", pl->name,
		km_pl_ptag(p, tag, sizeof(tag)), (long long)p->recon.stop_at);
	km_pl_set_phase(p, PH_FENCE, "stop: the open transactions are aborted, nothing hidden");
}

static void after_lso(km_pipeline *pl, mpart *p, int64_t end, int64_t lso)
{
	const km_offrun *fence;
	const km_offmap *m = km_pl_map_of(pl, p, &fence);
	char tag[300];

	/* An earlier life's write that landed between the two answers: the LSO is never past the end. */
	if (lso > end)
		lso = end;
	if (km_pl_tx_wait_ended(pl, p, end)) {
		/* Asked again shortly: EndTxn's answer, or the marker, is on its way. */
		km_pl_set_phase(p, PH_RECONCILE, "a transaction this kmirrord ended: its answer and marker awaited");
		p->retry.at = km_wall_ms() + MARKER_WAIT_POLL_MS;
		return;
	}
	if (!p->recon.tx_fenced) {
		/*
		 * Nothing of an earlier life listed for it and nothing of its own: nothing to fence. Listed
		 * again (relisted), only an id that none of its producers holds (its fence took every id
		 * listed before) is new: a client's transaction is still waited for (foreign_txn).
		 */
		bool any = p->txn.n > 0 && !p->recon.relisted;
		for (size_t i = 0; i < pl->nlisted && !any; i++)
			any = km_pl_tid_is_of(pl, p, pl->listed[i]) &&
			      !(p->recon.relisted && km_pl_tid_held(p, pl->listed[i]));
		if (!any)
			p->recon.tx_fenced = true;
	}
	if (p->recon.tx_fenced && !km_pl_tx_open(p) && lso < end && p->txn.n > 0 && !p->recon.hang_closed) {
		/*
		 * Fenced, none of its own transactions open, and the log still holds one open from
		 * lso: a marker the coordinator skipped (close_hanging, carry.c), or a client's. Its ids
		 * close theirs first; the log is read again after. A marker the fence wrote that its
		 * followers have not fetched yet holds the LSO too, for milliseconds: the log is asked
		 * again once first.
		 */
		if (!p->recon.hang_asked || p->recon.hang_lso != lso) {
			p->recon.hang_asked = true;
			p->recon.hang_lso = lso;
			km_pl_set_phase(p, PH_RECONCILE, "a transaction still open after the fence: the log asked again");
			p->retry.at = km_wall_ms() + HANG_RECHECK_MS;
			return;
		}
		KM_INFO(COMP, 0, "%s/%s: a transaction is still open from destination offset %lld after the fence "
			"(its marker skipped while the partition had no leader?): each of the partition's %zu "
			"transactional id(s) aborts an empty transaction there to close it", pl->name,
			km_pl_ptag(p, tag, sizeof(tag)), (long long)lso, p->txn.n);
		p->recon.hang_closing = true;
		km_pl_set_phase(p, PH_FENCE, "a transaction still open after the fence: its ids close theirs");
		return;
	}
	if (p->recon.tx_fenced && !km_pl_tx_open(p) && lso < end && !fence) {
		if (!p->recon.relisted) {
			/*
			 * The ids were listed when the pipeline began, and an id of the mirror's may have
			 * begun a transaction since: another kmirrord's that ran the mirror before, whose
			 * InitProducerId, AddPartitionsToTxn and Produce were held in a cut link or a paused
			 * process. Listed again, such an id is fenced (its transaction aborted) and what it
			 * holds hidden, as for any earlier life's; a client's is waited for (foreign_txn).
			 */
			p->recon.relisted = true;
			p->recon.tx_fenced = false;
			km_pl_relist_txns(pl);
			km_pl_set_phase(p, PH_RECONCILE, "an open transaction not of this life: the mirror's ids are listed again");
			p->retry.at = 0;
			return;
		}
		foreign_txn(pl, p, lso);
		return;
	}
	if (!p->recon.tx_fenced || km_pl_tx_open(p)) {
		/*
		 * The hidden range starts at the LSO, or earlier: at a batch that landed where it was not
		 * planned (hide_logical), or at the first batch of a transaction this life holds open
		 * (one the destination aborted on its own, by its timeout, is past the LSO already). A
		 * stop hides nothing (stop_aborts), unless a batch landed where it was not planned.
		 */
		int64_t from = lso;
		if (p->state == KM_MP_STOPPING && p->recon.hide_logical < 0 && !fence) {
			stop_aborts(pl, p, m, lso);
			return;
		}
		for (size_t i = 0; m && m->n && i < p->txn.n; i++)
			if (p->txn.tx[i].src_pid >= 0 && p->txn.tx[i].first_logical >= 0) {
				int64_t ph = km_offmap_to_physical(m, p->txn.tx[i].first_logical);
				if (ph >= 0 && ph < from)
					from = ph;
			}
		if (p->recon.hide_logical >= 0 && m && m->n) {
			int64_t ph = km_offmap_to_physical(m, p->recon.hide_logical);
			if (ph >= 0 && ph < from)
				from = ph;
		}
		if (from <= end && from > 0) {
			/*
			 * Where the hidden range starts is settled first (aborted_probe), even at the log's
			 * end: an ABORT marker there may stand for no source offset.
			 */
			p->recon.hide = from;
			km_pl_set_phase(p, PH_RECON_ABORTED, "the hidden range is settled first");
			if (!aborted_probe(pl, p)) {
				km_pl_set_phase(p, PH_RECONCILE, "the aborted-transactions probe could not be sent");
				km_pl_backoff(p);
			}
			return;
		}
		fence_from(pl, p, end, from);
		return;
	}
	if (fence)
		p->recon.hide_logical = p->recon.hide_logical >= 0 && p->recon.hide_logical < fence->logical
						? p->recon.hide_logical
						: fence->logical;
	check_tail(pl, p, end);
}

/*
 * The partition's transactions are fenced, and what the destination holds from physical offset
 * from on is hidden. Fencing aborts what is open, and an aborted transaction leaves a marker even
 * on a partition it wrote nothing to yet: the resume point is fixed before, by a fence run.
 */
static void fence_from(km_pipeline *pl, mpart *p, int64_t end, int64_t from)
{
	const km_offrun *fence;
	const km_offmap *m = km_pl_map_of(pl, p, &fence);
	int64_t hide = resume_logical(m, from);
	char tag[300];

	if (hide < 0) {
		/* Nothing mapped (yet): what the destination holds is hidden by the start anyway. */
		if (p->recon.tx_fenced && !km_pl_tx_open(p))
			after_reconcile(pl, p, end);
		else
			km_pl_set_phase(p, PH_FENCE, "fence: nothing mapped to hide");
		return;
	}
	if (fence && fence->logical < hide)
		hide = fence->logical;
	/* A misplaced batch's hide point and the first batch of every transaction held open come back too. */
	if (p->recon.hide_logical >= 0 && p->recon.hide_logical < hide)
		hide = p->recon.hide_logical;
	for (size_t i = 0; i < p->txn.n; i++)
		if (p->txn.tx[i].src_pid >= 0 && p->txn.tx[i].first_logical >= 0 && p->txn.tx[i].first_logical < hide)
			hide = p->txn.tx[i].first_logical;
	if (from < end)
		KM_INFO(COMP, 0, "%s/%s: destination offsets %lld to %lld are in transactions left open: hidden from "
			"offset %lld on, which is mirrored again", pl->name, km_pl_ptag(p, tag, sizeof(tag)), (long long)from,
			(long long)end, (long long)hide);
	/*
	 * Readers here stop at hide from now on: the fence run maps what follows to the log's end, and
	 * a reader shown more (the tail it held covered the open transactions) would ask past that end
	 * and be sent back to the start (docs/reliability.md, finding 12). They wait at hide until it
	 * is mirrored again.
	 */
	km_pl_tail_cap(pl, p, hide, end);
	if (!fence || fence->logical != hide) {
		km_state_run r = {p->t->name, p->id, hide, end, km_offmap_prev_end_at(m, hide), KM_OFFRUN_FENCE};
		km_pl_run_then(pl, p, &r, 1, PH_FENCE);
	} else {
		km_pl_set_phase(p, PH_FENCE, "fence: its run is persisted already");
	}
}

/*
 * A transaction the mirror ended (its marker in place) may have begun before the hide point H and
 * ended after it: hiding its marker would leave its aborted records without the marker that
 * closes them for a read_committed reader. A READ_COMMITTED Fetch at H - 1 (one at H, the LSO,
 * returns nothing) names the aborted transactions overlapping H - 1 and later: those beginning
 * before H, less one whose abort marker is the batch at H - 1 (it ends there), span H. H moves to
 * the earliest one's first offset and is asked again there, until none begins before it.
 */
static void on_aborted(km_net_client *c, const km_rpc_response *res, void *arg)
{
	km_pipeline *pl;
	lo_ctx lc;
	mpart *p = km_pl_answer_part(arg, &pl, &lc);
	const km_fetch_response *r = res->msg;
	km_err err = km_rpc_transport_err(res);
	int64_t at = -1;
	bool ok = false;

	if (!p || p->phase != PH_RECON_ABORTED)
		return;
	if (err == KM_OK) {
		bool one = r && r->responses.count == 1 && r->responses.items[0].partitions.count == 1;
		if (one && r->responses.items[0].partitions.items[0].error_code == 1) {
			/* OFFSET_OUT_OF_RANGE: below the destination's log start, nothing earlier to look at. */
			ok = true;
			at = p->recon.hide;
		} else if (one && !r->responses.items[0].partitions.items[0].error_code) {
			const km_fetch_response_partition_data *pd = &r->responses.items[0].partitions.items[0];
			int64_t ended = -1; /* the producer whose marker is the batch at H - 1 */
			bool abort = false, commit = false, listed = false;
			km_batch_iter it;
			km_batch b;
			km_control ctl;
			km_batch_iter_init(&it, pd->records.p, pd->records.len > 0 ? (size_t)pd->records.len : 0);
			while (km_batch_next(&it, &b))
				if (b.base_offset <= p->recon.hide - 1 && p->recon.hide - 1 <= b.base_offset + b.last_offset_delta &&
				    b.control) {
					bool known = km_batch_control(&b, NULL, 0, &ctl) == KM_OK;
					ended = b.producer_id;
					abort = known && ctl.type == KM_CONTROL_ABORT;
					commit = known && ctl.type == KM_CONTROL_COMMIT;
				}
			ok = true;
			at = p->recon.hide;
			for (int32_t i = 0; i < pd->aborted_transactions.count; i++) {
				const km_fetch_response_aborted_transaction *ab = &pd->aborted_transactions.items[i];
				listed |= ab->producer_id == ended;
				if (ab->first_offset >= 0 && ab->first_offset < at && ab->producer_id != ended)
					at = ab->first_offset;
			}
			/*
			 * An ABORT marker at H - 1 that no aborted transaction names ended a transaction that
			 * wrote nothing here (the broker indexes only those with records): one of the mirror's,
			 * fenced or timed out after it added the partition and before its first batch landed.
			 * The mirror planned no marker there (it plans one only after its transaction's
			 * records), so it stands for no source offset: hidden with what follows, or the resume
			 * point would be one past the logical tail.
			 */
			if (abort && !listed && p->recon.hide - 1 < at)
				at = p->recon.hide - 1;
			/*
			 * A COMMIT marker at H - 1 is the mirror's own when the source has a marker at the
			 * offset the runs give it; one that stands for no source offset (a coordinator that
			 * wrote a transaction's markers again after a failover) is hidden with what follows.
			 * Only the source can tell (marker_ask): an ABORT marker the index above decides.
			 */
			if (commit && at >= p->recon.hide && marker_ask(pl, p, p->recon.hide - 1, false)) {
				km_pl_tick_soon(pl);
				return;
			}
		}
	} else {
		km_cluster_drop(pl->dst, c);
	}
	if (!ok) {
		pl->dst_meta_need = true;
		km_pl_set_phase(p, PH_RECONCILE, "the aborted-transactions probe failed");
		km_pl_backoff(p);
	} else {
		hidden_from(pl, p, at);
	}
	km_pl_tick_soon(pl);
}

/*
 * The hidden range may start at physical at: earlier than the hide point being settled, it is
 * settled again there (aborted_probe); otherwise it starts there, and the fence follows.
 */
static void hidden_from(km_pipeline *pl, mpart *p, int64_t at)
{
	if (at < p->recon.hide && at > 0) {
		p->recon.hide = at;
		km_pl_set_phase(p, PH_RECON_ABORTED, "the hidden range is settled again, earlier");
		if (!aborted_probe(pl, p)) {
			km_pl_set_phase(p, PH_RECONCILE, "the aborted-transactions probe could not be sent");
			km_pl_backoff(p);
		}
	} else {
		fence_from(pl, p, p->recon.end, at);
	}
}

/*
 * The logical offset the runs give physical offset x when x is in a run (the open one without an
 * end), -1 when x is hidden between runs or before the first.
 */
static int64_t mapped_logical(const km_offmap *m, int64_t x)
{
	size_t i = runs_from(m, x);
	int64_t len;
	if (!i)
		return -1;
	len = km_offmap_run_length(m, i - 1);
	if (len >= 0 && x - m->runs[i - 1].physical >= len)
		return -1;
	return m->runs[i - 1].logical + (x - m->runs[i - 1].physical);
}

static void on_marker(km_net_client *c, const km_rpc_response *res, void *arg);
static void on_marker_window(km_net_client *c, const km_rpc_response *res, void *arg);
static void marker_unknown(km_pipeline *pl, mpart *p, const char *why);

/* How far before a marker the destination's batches are read to tell whether it ended anything. */
#define MARKER_WINDOW 1000
#define MARKER_WINDOW_BYTES (1 << 20)

/*
 * A transaction marker at physical x (the batch at the hide point less one, or at the log's end
 * less one) that the runs count as a source offset, L. The mirror writes a marker only where the
 * source has one (docs/mirror.md, "Markers where the source has them"), and only after a batch of
 * its transaction: one that ends nothing written here (a transaction's markers written again by a
 * coordinator that took over after a failover, once or more) stands for no source offset. First
 * the destination's batches before x are read (on_marker_window): a marker of a producer whose
 * batch before it is a marker too ended nothing, and the hidden range starts at the earliest such
 * one of the markers that end the log. Otherwise the batch holding L is fetched from the source
 * (on_marker): a record there, or nothing yet, and the marker stands for no source offset. False
 * when there is nothing to ask (x is hidden anyway: between runs, or under a fence run) or the
 * partition stops (a failover does not wait for a source that may be gone: the marker counts, as
 * it did before the source was asked), and the caller goes on; true when asked, or when the
 * request could not be sent (marker_unknown).
 */
static bool marker_ask(km_pipeline *pl, mpart *p, int64_t x, bool tail)
{
	const km_offrun *fence;
	const km_offmap *m = km_pl_map_of(pl, p, &fence);
	int64_t l = mapped_logical(m, x);

	if (l < 0 || (fence && fence->physical <= x) || p->state == KM_MP_STOPPING)
		return false;
	p->recon.marker_logical = l;
	p->recon.marker_tail = tail;
	p->recon.marker_source = false;
	p->recon.marker_from = x > MARKER_WINDOW ? x - MARKER_WINDOW : 0;
	if (p->recon.marker_from < m->runs[0].physical)
		p->recon.marker_from = m->runs[0].physical;
	km_pl_set_phase(p, PH_RECON_MARKER, "the destination's batches before a marker are read");
	if (!km_pl_fetch_from(pl, p, true, p->recon.marker_from, 0, MARKER_WINDOW_BYTES, on_marker_window))
		marker_unknown(pl, p, "the destination could not be asked what lies before a marker");
	return true;
}

/* The marker's destination offset: the batch at the hide point less one, or at the log's end less one. */
static int64_t marker_at(const mpart *p)
{
	return p->recon.marker_tail ? p->recon.end - 1 : p->recon.hide - 1;
}

/* The destination's batches could not tell: the source is asked what L holds. */
static void marker_ask_source(km_pipeline *pl, mpart *p)
{
	p->recon.marker_source = true;
	km_pl_set_phase(p, PH_RECON_MARKER, "the source is asked what the marker's offset holds");
	if (!km_pl_one_fetch(pl, p, false, p->recon.marker_logical, 0, on_marker))
		marker_unknown(pl, p, "the source could not be asked what a marker's offset holds");
}

/*
 * The marker at physical x stands for source offset L (own), or for none: then the hidden range
 * starts at physical from (x, or an earlier marker that ended nothing either).
 */
static void marker_decided(km_pipeline *pl, mpart *p, bool own, int64_t from)
{
	int64_t x = marker_at(p);
	char tag[300];

	if (!own)
		KM_WARN(COMP, 0, "%s/%s: the transaction marker at destination offset %lld stands for no source offset "
			"(it ends nothing the mirror wrote, or source offset %lld holds a record, or nothing yet): hidden "
			"from destination offset %lld, with what follows", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
			(long long)x, (long long)p->recon.marker_logical, (long long)from);
	if (p->recon.marker_tail) {
		/* The tail's check (no transaction left open, no fence run): resume at L, after what is hidden. */
		if (!own) {
			const km_offrun *fence;
			int64_t l = resume_logical(km_pl_map_of(pl, p, &fence), from);
			p->recon.hide_logical = l >= 0 && l < p->recon.marker_logical ? l : p->recon.marker_logical;
		}
		after_reconcile(pl, p, p->recon.end);
	} else {
		hidden_from(pl, p, own ? p->recon.hide : from);
	}
}

/* A producer's last batch seen before a marker: a marker too, or a record batch. */
typedef struct {
	int64_t pid;
	bool marker;
} last_of_pid;

/*
 * The destination's batches from marker_from to the marker at x. Of the markers that end the log
 * there (no record batch after them up to x), the earliest whose producer's batch before it is a
 * marker too ended nothing the mirror wrote: the hidden range starts there. None such, or the
 * batches did not reach x (or named too many producers to follow): the source is asked.
 */
static void on_marker_window(km_net_client *c, const km_rpc_response *res, void *arg)
{
	km_pipeline *pl;
	lo_ctx lc;
	mpart *p = km_pl_answer_part(arg, &pl, &lc);
	const km_fetch_response *r = res->msg;
	int64_t x, empty = -1;
	bool reached = false;
	last_of_pid last[64];
	size_t nlast = 0;

	if (!p || p->phase != PH_RECON_MARKER || p->recon.marker_source || lc.tag != p->recon.marker_from)
		return;
	x = marker_at(p);
	if (km_rpc_transport_err(res) != KM_OK) {
		km_cluster_drop(pl->dst, c);
	} else if (r && r->responses.count == 1 && r->responses.items[0].partitions.count == 1 &&
		   !r->responses.items[0].partitions.items[0].error_code) {
		const km_fetch_response_partition_data *pd = &r->responses.items[0].partitions.items[0];
		km_batch_iter it;
		km_batch b;
		km_batch_iter_init(&it, pd->records.p, pd->records.len > 0 ? (size_t)pd->records.len : 0);
		while (!reached && km_batch_next(&it, &b)) {
			km_control ctl;
			bool marker = b.control && km_batch_control(&b, NULL, 0, &ctl) == KM_OK &&
				      (ctl.type == KM_CONTROL_COMMIT || ctl.type == KM_CONTROL_ABORT);
			size_t i = 0;
			if (b.base_offset > x)
				break;
			reached = b.base_offset + b.last_offset_delta >= x;
			while (i < nlast && last[i].pid != b.producer_id)
				i++;
			if (!marker)
				empty = -1; /* a record batch: the markers that end the log come after it */
			else if (i < nlast && last[i].marker && empty < 0)
				empty = b.base_offset;
			if (i == nlast) {
				if (nlast == sizeof(last) / sizeof(last[0])) {
					reached = false; /* too many producers to follow: the source decides */
					break;
				}
				last[nlast++].pid = b.producer_id;
			}
			last[i].marker = marker;
		}
	}
	if (reached && empty >= 0)
		marker_decided(pl, p, false, empty);
	else
		marker_ask_source(pl, p);
	km_pl_tick_soon(pl);
}

/*
 * The source could not say what L holds. A partition that pauses goes on without it (the marker
 * counts as a source offset, as it did before the source was asked): a pause does not wait for a
 * source that is down. Any other one reconciles again after a backoff: it cannot mirror without
 * the source anyway.
 */
static void marker_unknown(km_pipeline *pl, mpart *p, const char *why)
{
	if (p->state == KM_MP_PAUSING || p->state == KM_MP_STOPPING) {
		marker_decided(pl, p, true, -1);
		return;
	}
	pl->src_meta_need = true;
	km_pl_set_phase(p, PH_RECONCILE, why);
	km_pl_backoff(p);
}

static void on_marker(km_net_client *c, const km_rpc_response *res, void *arg)
{
	km_pipeline *pl;
	lo_ctx lc;
	mpart *p = km_pl_answer_part(arg, &pl, &lc);
	const km_fetch_response *r = res->msg;
	int64_t at = lc.tag;
	int verdict = -1; /* -1: not known; 1: the mirror's own marker (or past telling); 0: no source offset */

	if (!p || p->phase != PH_RECON_MARKER || !p->recon.marker_source || at != p->recon.marker_logical)
		return;
	if (km_rpc_transport_err(res) != KM_OK) {
		km_cluster_drop(pl->src, c);
	} else if (r && r->responses.count == 1 && r->responses.items[0].partitions.count == 1) {
		const km_fetch_response_partition_data *pd = &r->responses.items[0].partitions.items[0];
		km_batch_iter it;
		km_batch b;
		bool found = false;
		if (pd->error_code == 1) {
			/* OFFSET_OUT_OF_RANGE: below the source's log start, or past its end: no telling. */
			verdict = 1;
		} else if (!pd->error_code) {
			km_batch_iter_init(&it, pd->records.p, pd->records.len > 0 ? (size_t)pd->records.len : 0);
			while (!found && km_batch_next(&it, &b))
				found = b.base_offset + b.last_offset_delta >= at;
			/* A batch past L: L was compacted away, no telling; a control batch at L: the marker's. */
			if (found)
				verdict = (b.base_offset > at || b.control) ? 1 : 0;
			else if (pd->high_watermark >= 0 && pd->high_watermark <= at)
				verdict = 0; /* the source's log ends at or before L */
		}
	}
	if (verdict < 0)
		marker_unknown(pl, p, "the source did not say what a marker's offset holds");
	else
		marker_decided(pl, p, verdict == 1, marker_at(p));
	km_pl_tick_soon(pl);
}

/*
 * A Fetch of the one batch holding offset of p (physical on the destination, logical at the
 * source), with isolation (1: READ_COMMITTED, its aborted transactions named), answered to cb.
 */
bool km_pl_one_fetch(km_pipeline *pl, mpart *p, bool dest, int64_t offset, int8_t isolation, km_rpc_cb cb)
{
	return km_pl_fetch_from(pl, p, dest, offset, isolation, 1, cb);
}

bool km_pl_fetch_from(km_pipeline *pl, mpart *p, bool dest, int64_t offset, int8_t isolation, int32_t max_bytes,
		      km_rpc_cb cb)
{
	km_cluster *cl = dest ? pl->dst : pl->src;
	int32_t leader = dest ? p->lead.dst : p->lead.src;
	km_net_client *c = leader >= 0 ? km_cluster_node(cl, leader) : NULL;
	km_fetch_request m;
	km_fetch_request_fetch_topic ft;
	km_fetch_request_fetch_partition fp;
	int16_t ver;

	if (!km_cluster_usable(cl, c) || (ver = km_net_version_pick(c, KM_API_FETCH, FETCH_LO, FETCH_HI)) < 0)
		return false;
	km_fetch_request_init(&m);
	km_fetch_request_fetch_topic_init(&ft);
	km_fetch_request_fetch_partition_init(&fp);
	m.replica_id = -1;
	m.max_wait_ms = 0;
	m.min_bytes = 0;
	m.max_bytes = max_bytes; /* the first batch comes whole anyway */
	m.isolation_level = isolation;
	m.session_id = 0;
	m.session_epoch = -1;
	fp.partition = p->id;
	fp.current_leader_epoch = dest ? -1 : p->lead.src_epoch;
	fp.fetch_offset = offset;
	fp.log_start_offset = -1;
	fp.last_fetched_epoch = -1;
	fp.partition_max_bytes = max_bytes;
	ft.topic = km_str_c(p->t->name);
	ft.partitions.items = &fp;
	ft.partitions.count = 1;
	m.topics.items = &ft;
	m.topics.count = 1;
	return km_pl_send_part(pl, cl, leader, c, KM_API_FETCH, ver, &m, cb,
			 &(lo_ctx){p->t, p->id, dest, -1, LO_POSITION, offset});
}

static bool aborted_probe(km_pipeline *pl, mpart *p)
{
	return km_pl_one_fetch(pl, p, true, p->recon.hide - 1, 1, on_aborted);
}

/* ---- the tail: the mirror's own, or a foreign writer's (docs/mirror.md, "Reconcile") ---- */

enum { TAIL_OWN, TAIL_TRUSTED, TAIL_EARLIER, TAIL_FOREIGN };

/* Whether producer id pid is one of the partition's carried transactions' (this life's, or an earlier life's listed and fenced). */
static bool carried_pid(const mpart *p, int64_t pid)
{
	for (size_t i = 0; i < p->txn.n; i++)
		if (km_txp_pid(p->txn.tx[i].txp) == pid)
			return true;
	return false;
}

/*
 * Batch b on the destination, against the writer (pid, epoch) that writes from start with
 * sequences from 0: its own where the sequences put it (every offset it took is one sequence
 * number, so B - start = base sequence), trusted (a batch or marker of one of the partition's
 * carried transactions, whose producers reconcile has fenced and so knows, or the writer's batch
 * elsewhere: what the probe logic handles), an earlier writer's (the mirror's producer id at an
 * older epoch: a write of a former owner that the broker appended after this writer's start was
 * persisted, docs/reliability.md, finding 32; no other producer can hold the mirror's producer
 * id), or foreign (a client's transaction included).
 */
static int tail_kind(const mpart *p, const km_batch *b, int64_t pid, int16_t epoch, int64_t start)
{
	if (b->producer_id == pid && b->producer_epoch == epoch && !b->control && !b->transactional)
		return ((b->base_offset - start) & 0x7fffffff) == b->base_sequence ? TAIL_OWN : TAIL_TRUSTED;
	if (b->producer_id == pid && b->producer_epoch < epoch && !b->control && !b->transactional)
		return TAIL_EARLIER;
	return (b->control || b->transactional) && carried_pid(p, b->producer_id) ? TAIL_TRUSTED : TAIL_FOREIGN;
}

/*
 * [from, end) holds an earlier writer's late batches: the mirror's records, but placed by a run
 * this writer's reconcile may have removed. Hidden like a misplaced batch: the mirror resumes at
 * from's logical offset, written after them.
 */
static void earlier_tail(km_pipeline *pl, mpart *p, int64_t from)
{
	const km_offrun *fence;
	const km_offmap *m = km_pl_map_of(pl, p, &fence);
	int64_t hide = resume_logical(m, from);
	char tag[300];

	if (hide < 0) {
		km_pl_set_phase(p, PH_RECONCILE, "an earlier writer's batches before every run");
		km_pl_backoff(p);
		return;
	}
	KM_WARN(COMP, 0, "%s/%s: destination offsets %lld to %lld hold late batches of an earlier writer of the mirror "
		"(producer id %lld at an older epoch, appended after this writer's start): hidden, and mirrored again",
		pl->name, km_pl_ptag(p, tag, sizeof(tag)), (long long)from, (long long)p->recon.end - 1,
		(long long)p->recon.tail_pid);
	p->recon.hide_logical = hide;
	after_reconcile(pl, p, p->recon.end);
}

static bool writer_of(km_pipeline *pl, const mpart *p, int64_t *pid, int16_t *epoch, int64_t *start)
{
	const km_state_topic *t = km_state_topic_find(km_mirror_store(pl->mi), p->t->name, strlen(p->t->name));
	return km_state_partition_writer_get(t, p->id, pid, epoch, start);
}

static void on_tail(km_net_client *c, const km_rpc_response *res, void *arg);

static bool tail_fetch(km_pipeline *pl, mpart *p, int64_t at)
{
	return km_pl_one_fetch(pl, p, true, at, 0, on_tail);
}

/*
 * A start after a stop (docs/mirror.md, "A start after a stop"): the partition is PREPARING, no
 * writer of this start has written yet, and the destination's end lies past the last mirrored
 * offset L the stop persisted: what is past L was written here while the topic was STOPPED (a
 * failover drill). The proposal truncates the topic to L; here it is hidden, and the mirror goes
 * on from L. -1 when that is not the case.
 */
static int64_t drill_point(km_pipeline *pl, const mpart *p, const km_offmap *m, int64_t end)
{
	const km_state_topic *t = km_state_topic_find(km_mirror_store(pl->mi), p->t->name, strlen(p->t->name));
	km_mp_state state;
	int64_t last, pid, start;
	int16_t epoch;

	if (!m || !m->n || !km_state_partition_record(t, p->id, &state, &last, NULL) || state != KM_MP_PREPARING || last < 0)
		return -1;
	if (km_state_partition_writer_get(t, p->id, &pid, &epoch, &start) && start < end)
		return -1; /* this start's writer has written: what is past L is the mirror's own */
	return resume_logical(m, end) > last ? last : -1;
}

/*
 * Reconcile resumes at the end of the open run (no hide point, no fence run): everything from the
 * writer's start to end counts as the mirror's. The batch holding end - 1 is looked at first.
 */
static void check_tail(km_pipeline *pl, mpart *p, int64_t end)
{
	const km_offrun *fence;
	const km_offmap *m = km_pl_map_of(pl, p, &fence);
	int64_t pid, start, drill = drill_point(pl, p, m, end);
	int16_t epoch;

	if (drill >= 0 && (p->recon.hide_logical < 0 || drill < p->recon.hide_logical)) {
		p->recon.hide_logical = drill;
		p->recon.drill = true;
	}
	if (p->recon.hide_logical >= 0 || fence || !m || !m->n || !writer_of(pl, p, &pid, &epoch, &start) ||
	    start >= end) {
		after_reconcile(pl, p, end);
		return;
	}
	p->recon.end = end;
	p->recon.tail_wpid = pid;
	p->recon.tail_wepoch = epoch;
	p->recon.tail_wstart = start;
	p->recon.tail_good = start;
	p->recon.tail_bad = -1;
	p->recon.tail_foreign = false;
	km_pl_set_phase(p, PH_RECON_TAIL, "the tail past the writer's start is looked at");
	if (!tail_fetch(pl, p, end - 1)) {
		km_pl_set_phase(p, PH_RECONCILE, "the tail's Fetch could not be sent");
		km_pl_backoff(p);
	}
}

typedef struct foreign_ctx {
	km_pipeline *pl;
	uint32_t life;
	mtopic *t;
	int32_t part;
	int64_t from, hide; /* where the foreign records start, and the logical offset they hide from */
	char why[600];
} foreign_ctx;

static void on_foreign_run(void *arg, const km_state_result *res)
{
	foreign_ctx *x = arg;
	km_pipeline *pl = x->pl;
	mpart *p = km_pl_current(pl, x->life) ? km_pl_part_get(pl, x->t, x->part, false) : NULL;

	pl->store_pending--;
	if (p && p->phase == PH_RECON_TAIL) {
		if (res->code != KM_OK) {
			km_pl_set_phase(p, PH_RECONCILE, "the run hiding a foreign tail could not be persisted");
			km_pl_backoff(p);
		} else {
			/*
			 * The mirror's own records end where the foreign ones start: that is the tail the FAILED
			 * record keeps, which every reader here and elsewhere is then shown up to (a progress
			 * written before a crash may be behind it).
			 */
			p->out.acked_phys = x->from;
			p->out.acked_logical = x->hide;
			p->out.acked_epoch = -1;
			km_pl_set_tail(pl, p, true);
			km_pl_fail_part(pl, p, x->why);
		}
		km_pl_tick_soon(pl);
	}
	free(x);
}

/*
 * [from, end) on the destination was written by someone else. A fence run at from's logical offset
 * hides it from readers and makes the next reconcile resume there, after it (runs past it go:
 * they were for batches that landed behind the foreign ones); then the partition is FAILED.
 */
static void foreign_tail(km_pipeline *pl, mpart *p, int64_t from)
{
	const km_offrun *fence;
	const km_offmap *m = km_pl_map_of(pl, p, &fence);
	int64_t hide = resume_logical(m, from), end = p->recon.end;
	foreign_ctx *x = calloc(1, sizeof(*x));
	km_state_run *w = m ? calloc(m->n + 1, sizeof(*w)) : NULL;
	size_t nw = 0;

	if (!x || !w || hide < 0) {
		free(x);
		free(w);
		km_pl_set_phase(p, PH_RECONCILE, hide < 0 ? "a foreign tail before every run" : "out of memory");
		km_pl_backoff(p);
		return;
	}
	*x = (foreign_ctx){pl, pl->life, p->t, p->id, from, hide, {0}};
	snprintf(x->why, sizeof(x->why),
		 "records at destination offsets %lld-%lld were not written by the mirror (producer id %lld): something "
		 "writes to the mirror topic directly on the destination. They are hidden from readers; stop that "
		 "writer, then stop and start the topic: it mirrors again from source offset %lld (docs/operations.md, "
		 "\"A foreign write on the destination\")",
		 (long long)from, (long long)end - 1, (long long)p->recon.tail_pid, (long long)hide);
	for (size_t i = 0; i < m->n; i++)
		if (m->runs[i].logical > hide)
			w[nw++] = (km_state_run){p->t->name, p->id, m->runs[i].logical, -1, -1, 0};
	w[nw++] = (km_state_run){p->t->name, p->id, hide, end, km_offmap_prev_end_at(m, hide), KM_OFFRUN_FENCE};
	pl->store_pending++;
	km_state_runs_write(km_mirror_store(pl->mi), pl->name, w, nw, on_foreign_run, x);
	free(w);
}

/*
 * The batch holding the offset asked. First (end - 1): the writer's own or trusted, reconcile goes
 * on; foreign, a binary search of one-batch Fetches between the writer's start and it finds where
 * the writer's dense batches end (tail_good) and the foreign ones begin (tail_bad).
 */
static void on_tail(km_net_client *c, const km_rpc_response *res, void *arg)
{
	km_pipeline *pl;
	lo_ctx lc;
	mpart *p = km_pl_answer_part(arg, &pl, &lc);
	const km_fetch_response *r = res->msg;
	int64_t at = lc.tag, start;
	km_batch b;
	bool found = false, ok = false;
	int kind;

	if (!p || p->phase != PH_RECON_TAIL)
		return;
	if (km_rpc_transport_err(res) != KM_OK) {
		km_cluster_drop(pl->dst, c);
	} else if (r && r->responses.count == 1 && r->responses.items[0].partitions.count == 1) {
		const km_fetch_response_partition_data *pd = &r->responses.items[0].partitions.items[0];
		km_batch_iter it;
		ok = pd->error_code == 0 || pd->error_code == 1; /* OFFSET_OUT_OF_RANGE: below the log start, nothing */
		km_batch_iter_init(&it, pd->records.p, pd->records.len > 0 ? (size_t)pd->records.len : 0);
		while (ok && !found && km_batch_next(&it, &b))
			found = b.base_offset <= at && at <= b.base_offset + b.last_offset_delta;
	}
	if (!ok) {
		pl->dst_meta_need = true;
		km_pl_set_phase(p, PH_RECONCILE, "the tail's Fetch failed");
		km_pl_backoff(p);
		km_pl_tick_soon(pl);
		return;
	}
	start = p->recon.tail_wstart;
	kind = found ? tail_kind(p, &b, p->recon.tail_wpid, p->recon.tail_wepoch, start) : TAIL_TRUSTED;
	p->recon.tail_foreign |= kind == TAIL_FOREIGN;
	if (p->recon.tail_bad < 0) {
		if (kind != TAIL_FOREIGN && kind != TAIL_EARLIER) {
			/*
			 * Nothing there to look at (a log start past it), or ours: a marker of the partition's
			 * carried transactions is the mirror's only where the source has one (marker_ask).
			 */
			km_control ctl;
			if (!found || !b.control || km_batch_control(&b, NULL, 0, &ctl) != KM_OK ||
			    (ctl.type != KM_CONTROL_COMMIT && ctl.type != KM_CONTROL_ABORT) ||
			    !marker_ask(pl, p, p->recon.end - 1, true))
				after_reconcile(pl, p, p->recon.end);
			km_pl_tick_soon(pl);
			return;
		}
		p->recon.tail_bad = b.base_offset > start ? b.base_offset : start;
		p->recon.tail_pid = b.producer_id;
	} else if (kind == TAIL_OWN && b.base_offset >= p->recon.tail_good) {
		p->recon.tail_good = b.base_offset + b.last_offset_delta + 1;
	} else {
		/* Anything else at or before at: the dense prefix ends before it. */
		int64_t bad = found && b.base_offset > p->recon.tail_good ? b.base_offset : p->recon.tail_good;
		if (bad < p->recon.tail_bad)
			p->recon.tail_bad = bad;
	}
	if (p->recon.tail_good < p->recon.tail_bad) {
		if (!tail_fetch(pl, p, p->recon.tail_good + (p->recon.tail_bad - p->recon.tail_good) / 2)) {
			km_pl_set_phase(p, PH_RECONCILE, "the tail's Fetch could not be sent");
			km_pl_backoff(p);
		}
	} else if (p->recon.tail_foreign) {
		foreign_tail(pl, p, p->recon.tail_bad);
	} else {
		earlier_tail(pl, p, p->recon.tail_bad);
	}
	km_pl_tick_soon(pl);
}

static void after_start(km_pipeline *pl, mpart *p, int64_t off, bool jump)
{
	char tag[300];
	if (jump) {
		p->start.oor = false;
		/* The source's retention passed the mirror: a hole, counted. */
		if (off <= p->plan.fetch_logical) {
			/* Past the source's end: its log was truncated below what was mirrored (an unclean election?). */
			KM_WARN(COMP, 0, "%s/%s: offset %lld is past the source's log end: is the source's log the one "
				"mirrored? (asked before the next fetch)", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
				(long long)p->plan.fetch_logical);
			km_pl_want_divergence_check(pl, p);
			km_pl_backoff(p);
		} else {
			uint64_t n = (uint64_t)(off - p->plan.fetch_logical);
			p->stats.skipped += n;
			km_state_partition_progress(km_mirror_store(pl->mi), p->t->name, p->id, -1, (int64_t)p->stats.skipped);
			KM_WARN(COMP, 0, "%s/%s: the source's log starts at %lld, past the mirror's %lld: %llu record(s) "
				"skipped (a hole)", pl->name, km_pl_ptag(p, tag, sizeof(tag)), (long long)off,
				(long long)p->plan.fetch_logical, (unsigned long long)n);
			p->plan.fetch_logical = off;
		}
		km_pl_set_phase(p, PH_READY, "a hole after the source's retention");
		return;
	}
	p->plan.fetch_logical = off;
	p->out.acked_logical = off;
	p->out.acked_epoch = -1;
	p->plan.first_logical = off;
	KM_INFO(COMP, 0, "%s/%s: starts at source offset %lld (destination offset %lld)", pl->name,
		km_pl_ptag(p, tag, sizeof(tag)), (long long)off, (long long)p->out.acked_phys);
	km_pl_set_tail(pl, p, true);
	km_pl_set_phase(p, PH_READY, "positioned at the source");
}
