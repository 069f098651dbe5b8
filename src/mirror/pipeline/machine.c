/* A pipeline's partitions as state machines: the tick that moves them, reconcile and failure, the pipeline's life. */
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "kmirror/log.h"
#include "mirror/pipeline/pipeline.h"

static void reread_options(km_pipeline *pl, int64_t now);

void km_pl_tick_soon(km_pipeline *pl)
{
	km_pl_schedule_in(pl, 0);
}

const char *km_pl_ptag(const mpart *p, char *buf, size_t len)
{
	snprintf(buf, len, "%s-%d", p->t->name, (int)p->id);
	return buf;
}

const char *const km_pl_phase_names[] = {
	[PH_IDLE] = "IDLE", [PH_RECONCILE] = "RECONCILE", [PH_RECON_WAIT] = "RECON_WAIT",
	[PH_RECON_LSO] = "RECON_LSO", [PH_RECON_ABORTED] = "RECON_ABORTED",
	[PH_RECON_TAIL] = "RECON_TAIL", [PH_RECON_MARKER] = "RECON_MARKER", [PH_FENCE] = "FENCE",
	[PH_START] = "START", [PH_START_WAIT] = "START_WAIT", [PH_READY] = "READY", [PH_FETCHING] = "FETCHING",
	[PH_RUNS] = "RUNS", [PH_WRITING] = "WRITING",
};

#define B(ph) (1u << (ph))
/*
 * The machine's edges: from each phase, the phases it may go to (docs/mirror.md, "The partition
 * machine"). IDLE (stopped, paused, failed) and RECONCILE (start over) are reachable from anywhere.
 */
static const unsigned km_pl_edges[PH_WRITING + 1] = {
	[PH_IDLE] = B(PH_RUNS),
	[PH_RECONCILE] = B(PH_RECON_WAIT) | B(PH_RUNS),
	[PH_RECON_WAIT] = B(PH_RECON_LSO),
	[PH_RECON_LSO] = B(PH_RECON_ABORTED) | B(PH_FENCE) | B(PH_RUNS) | B(PH_READY) | B(PH_START) |
			 B(PH_RECON_TAIL),
	[PH_RECON_ABORTED] = B(PH_FENCE) | B(PH_RUNS) | B(PH_READY) | B(PH_START) | B(PH_RECON_MARKER),
	[PH_RECON_TAIL] = B(PH_RUNS) | B(PH_READY) | B(PH_START) | B(PH_RECON_MARKER),
	[PH_RECON_MARKER] = B(PH_RECON_ABORTED) | B(PH_FENCE) | B(PH_RUNS) | B(PH_READY) | B(PH_START),
	[PH_FENCE] = 0,
	[PH_START] = B(PH_START_WAIT) | B(PH_RUNS) | B(PH_READY),
	[PH_START_WAIT] = B(PH_START) | B(PH_READY) | B(PH_RUNS),
	[PH_READY] = B(PH_FETCHING) | B(PH_RUNS),
	[PH_FETCHING] = B(PH_READY) | B(PH_RUNS) | B(PH_WRITING) | B(PH_START),
	[PH_RUNS] = B(PH_READY) | B(PH_WRITING) | B(PH_START) | B(PH_FENCE),
	[PH_WRITING] = B(PH_READY) | B(PH_RUNS) | B(PH_FETCHING),
};

bool km_pl_phase_edge(mphase from, mphase to)
{
	return from == to || to == PH_IDLE || to == PH_RECONCILE || (km_pl_edges[from] & B(to)) != 0;
}
#undef B

void km_pl_set_phase(mpart *p, mphase to, const char *why)
{
	char tag[300];
	if (p->phase == to)
		return;
	if (!km_pl_phase_edge(p->phase, to))
		KM_WARN(COMP, 0, "%s/%s: unexpected phase transition %s -> %s (%s)", p->t->pl->name,
			km_pl_ptag(p, tag, sizeof(tag)), km_pl_phase_names[p->phase], km_pl_phase_names[to], why);
	else
		KM_DEBUG(COMP, 0, "%s/%s: %s -> %s (%s)", p->t->pl->name, km_pl_ptag(p, tag, sizeof(tag)),
			 km_pl_phase_names[p->phase], km_pl_phase_names[to], why);
	p->phase = to;
	if (to != PH_WRITING)
		p->fetch.ahead = false; /* its part of the Fetch sent ahead, if one comes, is dropped */
	/*
	 * From here the pipeline holds the tail. Until reconcile knows where it stands, readers here are
	 * shown what they were shown before, the persisted progress (docs/state.md, "What a reader is
	 * shown"): the open run unbounded, they would be shown what reconcile may hide (a transaction
	 * left open, a marker that stands for no source offset) and find the offsets gone after it
	 * (docs/reliability.md, finding 7). Reconcile itself reads the map unbounded (km_pl_map_of).
	 */
	if (to == PH_RECONCILE && !p->out.tail) {
		km_offmap *m = km_state_offmap_mut(km_mirror_store(p->t->pl->mi), p->t->name, p->id);
		if (m)
			m->tail_held = true;
	}
}

bool km_pl_reconciling(const mpart *p)
{
	return p->phase >= PH_RECONCILE && p->phase <= PH_FENCE;
}

mnode_io *km_pl_node_io_find(mnode_io *arr, size_t n, int32_t id, unsigned lane)
{
	for (size_t i = 0; i < n; i++)
		if (arr[i].id == id && arr[i].lane == lane)
			return &arr[i];
	return NULL;
}

mnode_io *km_pl_node_io(mnode_io **arr, size_t *n, int32_t id, unsigned lane)
{
	mnode_io *a = km_pl_node_io_find(*arr, *n, id, lane);
	if (a)
		return a;
	a = realloc(*arr, (*n + 1) * sizeof(*a));
	if (!a)
		return NULL;
	*arr = a;
	a[*n] = (mnode_io){.id = id, .lane = lane};
	return &a[(*n)++];
}

mtopic *km_pl_topic_get(km_pipeline *pl, const char *name, bool create)
{
	mtopic *t, **nt;
	for (size_t i = 0; i < pl->ntopics; i++)
		if (!strcmp(pl->topics[i]->name, name))
			return pl->topics[i];
	if (!create)
		return NULL;
	t = calloc(1, sizeof(*t));
	nt = realloc(pl->topics, (pl->ntopics + 1) * sizeof(*nt));
	if (!t || !nt || !(t->name = strdup(name))) {
		free(t);
		if (nt)
			pl->topics = nt;
		return NULL;
	}
	pl->topics = nt;
	t->pl = pl;
	pl->topics[pl->ntopics++] = t;
	return t;
}

static void register_series(km_pipeline *pl, mpart *p)
{
	const km_mirror_families *f = km_mirror_metric_families(pl->mi);
	char part[16];
	const char *v[] = {pl->name, p->t->name, part};
	struct {
		km_metric_family *f;
		const uint64_t *value;
	} s[] = {{f->records, &p->stats.records}, {f->bytes, &p->stats.bytes},   {f->batches, &p->stats.batches},
		 {f->lag, &p->stats.lag},         {f->lag_ms, &p->stats.lag_ms}, {f->skipped, &p->stats.skipped},
		 {f->errors, &p->stats.errors}};

	snprintf(part, sizeof(part), "%d", (int)p->id);
	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
		if (s[i].f && !km_metric_series_ptr(s[i].f, v, s[i].value))
			KM_DEBUG(COMP, 0, "%s/%s-%s: a metric series was not kept (the family is full)", pl->name,
				 p->t->name, part);
}

/* The lag gauges, from the source's end and what is mirrored. */
void km_pl_update_lag(mpart *p, int64_t now)
{
	int64_t mirrored = p->out.acked_logical;
	p->stats.lag = p->stats.source_end > mirrored && mirrored >= 0 ? (uint64_t)(p->stats.source_end - mirrored) : 0;
	p->stats.lag_ms =
		p->stats.lag && p->out.newest_ts > 0 && now > p->out.newest_ts ? (uint64_t)(now - p->out.newest_ts) : 0;
}

/* Its source gauges leave the exposition: no contact yet, or the pipeline does not run here now. */
static void source_series_hide(km_pipeline *pl)
{
	if (pl->source.s_reachable)
		km_metric_series_show(pl->source.s_reachable, false);
	if (pl->source.s_fetched)
		km_metric_series_show(pl->source.s_fetched, false);
}

void km_pl_source_contact(km_pipeline *pl, km_err err, bool fetch)
{
	int64_t now = km_wall_ms();
	uint64_t ok = err == KM_OK;

	if (!pl->source.since_ms || pl->source.reachable != ok)
		pl->source.since_ms = now;
	pl->source.reachable = ok;
	if (ok && fetch)
		pl->source.fetched_ms = (uint64_t)now;
	if (ok)
		pl->source.error[0] = '\0';
	else
		snprintf(pl->source.error, sizeof(pl->source.error), "%s",
			 pl->src && *km_cluster_last_error(pl->src) ? km_cluster_last_error(pl->src) : km_err_name(err));
	if (pl->source.s_reachable)
		km_metric_series_show(pl->source.s_reachable, true);
	if (pl->source.s_fetched)
		km_metric_series_show(pl->source.s_fetched, pl->source.fetched_ms != 0);
}

bool km_pipeline_source(const km_pipeline *pl, km_mirror_source *out)
{
	if (pl->retired_at || !pl->source.since_ms)
		return false;
	*out = (km_mirror_source){pl->name, pl->source.reachable, pl->source.since_ms,
				  (int64_t)pl->source.fetched_ms, pl->source.error};
	return true;
}

/* A partition as it starts: nothing known of its leaders, its plan or its tail (stats are kept by the caller). */
static void part_init(mpart *p, mtopic *t, int32_t id)
{
	p->t = t;
	p->id = id;
	p->lead.src = p->lead.dst = -1;
	p->lead.src_epoch = -1;
	p->plan.fetch_logical = p->plan.cont_logical = -1;
	p->plan.fetch_epoch = -1;
	p->recon.hide_logical = -1;
	p->recon.drill = false;
	p->recon.stop_at = -1;
	p->plan.first_logical = -1;
	p->plan.topic = t->name;
	p->plan.partition = id;
	p->ls.src = p->ls.dst = p->ls.idle_target = -1;
	p->plan.pid = -1;
	p->fb.peer_offset = -1;
	p->fb.peer_epoch = p->fb.here_epoch = p->fb.src_epoch = -1;
	p->stats.source_end = -1;
	p->fetch.sess_node = -1;
	p->out.progress = -1;
	p->out.acked_epoch = p->out.progress_epoch = -1;
	p->out.progress_open = -1;
	p->div.checked = -1;
}

mpart *km_pl_part_get(km_pipeline *pl, mtopic *t, int32_t id, bool create)
{
	mpart *p;
	if (id < 0 || id > 1000000)
		return NULL;
	if (id < t->nparts && t->parts[id])
		return t->parts[id];
	if (!create)
		return NULL;
	if (id >= t->nparts) {
		mpart **np = realloc(t->parts, (size_t)(id + 1) * sizeof(*np));
		if (!np)
			return NULL;
		memset(np + t->nparts, 0, (size_t)(id + 1 - t->nparts) * sizeof(*np));
		t->parts = np;
		t->nparts = id + 1;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	part_init(p, t, id);
	p->out.lane = pl->lane_next++ % WRITE_LANES;
	t->parts[id] = p;
	register_series(pl, p);
	return p;
}

void km_pl_set_tail(km_pipeline *pl, mpart *p, bool set)
{
	km_state *st = km_mirror_store(pl->mi);
	km_offmap *m;

	p->out.tail = set;
	if (!set) {
		/* Readers here now see what the progress persisted says, as on any other instance. */
		km_state_offmap_release(st, p->t->name, p->id);
		return;
	}
	if (!(m = km_state_offmap_mut(st, p->t->name, p->id)))
		return;
	m->tail_held = true;
	m->tail_physical = p->out.acked_phys;
	m->tail_logical = p->out.acked_logical;
	m->tail_epoch = p->out.acked_epoch;
	m->tail_ts = p->out.newest_ts;
	km_pl_update_lag(p, km_wall_ms());
	km_state_tail_moved(st, m); /* a reader's Fetch waiting at this tail goes now */
}

void km_pl_tail_cap(km_pipeline *pl, mpart *p, int64_t logical, int64_t physical)
{
	km_offmap *m = km_state_offmap_mut(km_mirror_store(pl->mi), p->t->name, p->id);

	if (!m || !m->tail_held || (m->tail_logical >= 0 && m->tail_logical <= logical))
		return;
	if (p->out.tail) {
		/* Where the mirror stands now: what lies past it is hidden and mirrored again. */
		p->out.acked_logical = logical;
		p->out.acked_phys = physical;
		p->out.acked_epoch = -1;
		km_pl_set_tail(pl, p, true);
		return;
	}
	m->tail_logical = logical;
	m->tail_physical = physical;
	m->tail_epoch = -1;
}

void km_pl_backoff(mpart *p)
{
	int ms = p->retry.backoff_ms ? p->retry.backoff_ms : BACKOFF_MIN_MS;
	p->retry.backoff_ms = ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ms * 2;
	/* Jitter: 75-125 % of the step, so partitions that failed together do not retry together. */
	ms = ms * 3 / 4 + (int)(random() % (ms / 2 + 1));
	p->retry.at = km_wall_ms() + ms;
}

void km_pl_reconcile(km_pipeline *pl, mpart *p, const char *why)
{
	char tag[300];
	if (p->phase == PH_IDLE)
		return;
	int64_t now = km_wall_ms();
	if (!p->out.failing_since)
		p->out.failing_since = now;
	else if (now - p->out.failing_since > KM_MIRROR_FAIL_AFTER_MS) {
		/* Retrying has not written anything for this long: an operator has to look. */
		char msg[600];
		snprintf(msg, sizeof(msg), "%s (retried for %lld s without writing anything)", why,
			 (long long)(now - p->out.failing_since) / 1000);
		p->out.failing_since = 0;
		km_pl_fail_part(pl, p, msg);
		return;
	}
	KM_INFO(COMP, 0, "%s/%s: %s: reconciling", pl->name, km_pl_ptag(p, tag, sizeof(tag)), why);
	p->stats.errors++;
	km_plan_drop_unsent(&p->plan);
	km_pl_set_phase(p, PH_RECONCILE, why);
	p->recon.ended_wait = 0;
	p->recon.need_pid = true;
	pl->pid_want = true;
	km_pl_backoff(p);
	km_pl_tick_soon(pl);
}

void km_pl_fail_part(km_pipeline *pl, mpart *p, const char *why)
{
	char tag[300];
	KM_ERROR(COMP, 0, "%s/%s: %s: the partition is FAILED (stop, then start, to recover)", pl->name,
		 km_pl_ptag(p, tag, sizeof(tag)), why);
	km_plan_drop_unsent(&p->plan);
	km_pl_set_phase(p, PH_IDLE, "failed"); /* the tail stays until FAILED is in: its record keeps where the mirror stood */
	if (!p->settling) {
		p->settling = true;
		km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, p->state, KM_MP_FAILED, why);
	}
}

/* One run written on its own; the partition waits in PH_RUNS and then goes to phase `then`. */
typedef struct run_then_ctx {
	km_pipeline *pl;
	uint32_t life;
	mtopic *t;
	int32_t part;
	mphase then;
} run_then_ctx;

static void on_run_then(void *arg, const km_state_result *res)
{
	run_then_ctx *x = arg;
	km_pipeline *pl = x->pl;
	mpart *p = km_pl_current(pl, x->life) ? km_pl_part_get(pl, x->t, x->part, false) : NULL;

	pl->store_pending--;
	if (p && p->phase == PH_RUNS) {
		char tag[300];
		if (res->code != KM_OK) {
			KM_WARN(COMP, 0, "%s/%s: the offset map could not be persisted: %s", pl->name,
				km_pl_ptag(p, tag, sizeof(tag)), res->message ? res->message : km_err_name(res->code));
			km_pl_set_phase(p, PH_RECONCILE, "a run could not be persisted");
			km_pl_backoff(p);
		} else {
			km_pl_set_phase(p, x->then, "its run is persisted");
			p->recon.hide_logical = -1;
			p->recon.drill = false;
			p->div.diverged = false;
		}
		if (p->phase == PH_IDLE && (p->state == KM_MP_STOPPING || p->state == KM_MP_PAUSING)) {
			p->settling = true;
			km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, p->state,
					 p->state == KM_MP_PAUSING ? KM_MP_PAUSED : KM_MP_STOPPED, NULL);
		}
		km_pl_tick_soon(pl);
	}
	free(x);
}

void km_pl_run_then(km_pipeline *pl, mpart *p, const km_state_run *r, size_t n, mphase then)
{
	run_then_ctx *x = calloc(1, sizeof(*x));
	if (!x) {
		km_pl_set_phase(p, PH_RECONCILE, "out of memory");
		km_pl_backoff(p);
		return;
	}
	*x = (run_then_ctx){pl, pl->life, p->t, p->id, then};
	km_pl_set_phase(p, PH_RUNS, "a run being persisted");
	pl->store_pending++;
	km_state_runs_write(km_mirror_store(pl->mi), pl->name, r, n, on_run_then, x);
}

/*
 * The tail passed holes (markers of transactions with nothing mirrored, emptied batches) and
 * nothing is planned after them: the run that maps it (its logical offset at its physical one) is
 * written now, not with the next batch, and the partition waits in PH_RUNS until it is in, then
 * goes to then. Its progress past the holes is persisted only once the run is (progress_moved):
 * another instance reading that progress with the runs it had showed the next batch one offset
 * early (docs/reliability.md, finding 25). False: no such run to write.
 */
bool km_pl_run_past_holes(km_pipeline *pl, mpart *p, mphase then)
{
	km_state_run r;

	if (p->plan.head || p->out.inflight || p->out.acked_phys < 0 || p->plan.cont_logical < 0 ||
	    p->out.acked_logical <= p->plan.cont_logical)
		return false;
	r = (km_state_run){p->t->name, p->id, p->out.acked_logical, p->out.acked_phys, p->plan.cont_logical,
			   p->plan.cont_lat ? KM_OFFRUN_LOG_APPEND_TIME : 0};
	p->plan.cont_logical = p->out.acked_logical;
	km_pl_run_then(pl, p, &r, 1, then);
	return true;
}

/* ---- the tick: what can move, moves ---- */

/*
 * A pausing or stopping partition that has not reconciled yet settles at once, unless there may be
 * destination transactions left open on it: its own, an earlier life's (its transactional ids
 * listed, not fenced yet, or the listing not in yet), or a fence cut short by a crash.
 */
static bool reconcile_before_settle(km_pipeline *pl, mpart *p)
{
	const km_offrun *fence;
	const km_offmap *m;
	bool listed = false;

	if (km_pl_tx_open(p) || pl->txl < TXL_KNOWN)
		return true;
	/* A batch landed where it was not planned, or a seal that may be in the log: the log decides. */
	if (p->recon.hide_logical >= 0 || p->recon.seal_out)
		return true;
	m = km_pl_map_of(pl, p, &fence);
	if (fence)
		return true;
	/*
	 * Found pausing or stopping (a takeover, a restart) with something mirrored: the tail here is the
	 * persisted progress, which lags the former owner's last writes. The record settled keeps where
	 * the mirror stands, so the destination's end is asked first (docs/reliability.md, finding 17).
	 */
	if (!p->out.tail && m && m->n > 0)
		return true;
	for (size_t i = 0; i < pl->nlisted && !p->recon.tx_fenced && !listed; i++)
		listed = km_pl_tid_is_of(pl, p, pl->listed[i]);
	return !p->recon.tx_fenced && (p->txn.n > 0 || listed);
}

static void settle_drained(km_pipeline *pl, mpart *p)
{
	km_mp_state to = p->state == KM_MP_PAUSING ? KM_MP_PAUSED : KM_MP_STOPPED;
	/*
	 * A Fetch in flight with nothing of this partition taken yet is not waited for: a source that
	 * went away answers it only at the request timeout (31 s), and a failover must not wait that long.
	 * Its part of the answer, if one comes, is dropped (the partition is no longer FETCHING).
	 */
	if (p->phase == PH_FETCHING && !p->fetch.taken)
		km_pl_set_phase(p, PH_READY, "draining: the Fetch in flight is not waited for");
	if (p->fetch.ahead && !p->fetch.taken)
		p->fetch.ahead = false; /* the same for a Fetch sent ahead */
	if (p->settling || p->out.inflight || p->phase == PH_FETCHING || p->phase == PH_RUNS || p->fetch.ahead)
		return;
	if (p->plan.head && p->plan.head->kind == BK_MARKER)
		return; /* everything before it is in: the source decided, drive_marker ends the transaction */
	if (p->plan.head && p->plan.head->kind == BK_SEAL && p->phase == PH_WRITING)
		return; /* the stop's seal, its run in: it is being sent */
	km_plan_drop_unsent(&p->plan);
	if (p->plan.head)
		return;
	if (km_pl_tx_open(p)) {
		/*
		 * Destination transactions the source has not decided (as far as mirrored): reconcile
		 * aborts them, so none hangs. A pause hides what they hold (mirrored again on resume);
		 * a stop keeps it, aborted, with what other producers committed after it began, and the
		 * topic continues at the mirrored end.
		 */
		char tag[300];
		KM_INFO(COMP, 0, "%s/%s: %s with transactions open: they are aborted", pl->name, km_pl_ptag(p, tag, sizeof(tag)),
			to == KM_MP_PAUSED ? "pausing" : "stopping");
		km_pl_set_phase(p, PH_RECONCILE, "draining with transactions open: they are aborted");
		p->recon.need_pid = true; /* the batches dropped left a gap in the idempotent sequence */
		pl->pid_want = true;
		p->retry.at = 0;
		return;
	}
	if (to == KM_MP_STOPPED && km_pl_seal_due(pl, p)) {
		/* Its seal first, with the writer this reconcile took (docs/mirror.md, "The stop's seal"). */
		if (!p->recon.need_pid && !p->recon.writer_pending && p->plan.pid >= 0 && pl->store_pending < STORE_WINDOW &&
		    !km_pl_seal(pl, p)) {
			km_pl_set_phase(p, PH_RECONCILE, "out of memory");
			km_pl_backoff(p);
		}
		return;
	}
	/* The partition ends in a hole: its run first, so writes after the stop continue after it. */
	if (to == KM_MP_STOPPED && km_pl_run_past_holes(pl, p, PH_IDLE))
		return;
	km_pl_set_phase(p, PH_IDLE, "drained");
	if (to == KM_MP_STOPPED && p->recon.stop_at >= 0 && p->recon.stop_at < p->out.acked_logical) {
		/* The STOPPED record keeps the stop point (stop_aborts): readers here are bounded there until it is in. */
		km_offmap *m = km_state_offmap_mut(km_mirror_store(pl->mi), p->t->name, p->id);
		if (m) {
			int64_t ph = km_offmap_to_physical(m, p->recon.stop_at);
			m->tail_logical = p->recon.stop_at;
			m->tail_physical = ph;
			m->tail_epoch = -1; /* the batch before the stop point is not the last one acknowledged */
		}
	}
	p->recon.stop_at = -1;
	p->settling = true;
	km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, p->state, to, NULL);
}

mstep km_pl_step(const mpart *p, const mstep_view *v, int64_t now)
{
	if ((p->state == KM_MP_PAUSING || p->state == KM_MP_STOPPING) &&
	    (!km_pl_reconciling(p) ||
	     (p->phase == PH_RECONCILE && !p->out.inflight && !v->settle_needs_reconcile)))
		return STEP_SETTLE;
	if (p->phase == PH_IDLE)
		return STEP_IDLE;
	if (p->retry.at > now)
		return STEP_WAIT;
	if (p->phase == PH_FENCE)
		/* Its fence takes the listed ids of earlier lives: not while they are listed again. */
		return p->recon.fence_started || v->txl_known ? STEP_FENCE : STEP_NONE;
	if (p->phase == PH_RECONCILE && !p->out.inflight && !p->recon.need_pid && p->lead.dst >= 0 && v->txl_known)
		return STEP_RECONCILE;
	if (p->phase == PH_START && p->lead.src >= 0)
		return STEP_START;
	return STEP_NONE;
}

/* What the tick's partitions need of the pipeline: metadata of either side, a producer id. */
typedef struct tick_needs {
	bool src_meta, dst_meta, pid;
	int recon_room; /* partitions that may still begin reconciling in this tick (recon_room) */
} tick_needs;

/*
 * How many more partitions may begin reconciling now. Each one's reconcile is a few requests and
 * one or two store writes (its writer, its runs); begun all at once on 10,000 partitions they
 * overflowed the store's queue, and the refused ones started over, again and again. So reconciles
 * run RECONCILE_WINDOW at a time, and none begins while the pipeline has STORE_WINDOW store writes
 * unanswered; the others wait their turn in PH_RECONCILE (docs/mirror.md, "Reconcile").
 */
static int recon_room(const km_pipeline *pl)
{
	int busy = 0, room;

	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			const mpart *p = pl->topics[i]->parts[j];
			if (p && ((p->phase > PH_RECONCILE && p->phase <= PH_START_WAIT) || p->phase == PH_RUNS))
				busy++;
		}
	room = RECONCILE_WINDOW - busy;
	if (STORE_WINDOW - pl->store_pending < room)
		room = STORE_WINDOW - pl->store_pending;
	return room;
}

/* Paused: the source's end is still read now and then, so the lag shows. */
static void watch_paused(km_pipeline *pl, mpart *p, int64_t now, tick_needs *need)
{
	if (p->state != KM_MP_PAUSED)
		return;
	if (!p->watch.inflight && now - p->watch.at >= PAUSED_WATCH_MS && p->lead.src >= 0 &&
	    km_pl_send_lo(pl, p, false, -1, LO_WATCH)) {
		p->watch.inflight = true;
		p->watch.at = now;
	}
	if (p->lead.src < 0)
		need->src_meta = true;
}

/* PH_START: a fresh start asks first whether the source's kmirrord mirrored the topic from here. */
static void start_part(km_pipeline *pl, mpart *p)
{
	bool fresh = !p->start.oor && !p->start.latest && p->plan.cont_logical < 0;
	if (fresh && p->t->peer == PEER_UNKNOWN)
		km_pl_ask_peer(pl, p->t);
	if (fresh && p->t->peer == PEER_ASKED)
		return;
	if (fresh && p->t->peer == PEER_KNOWN && km_pl_failback_start(pl, p))
		return;
	if (km_pl_send_list_offsets(pl, p, false, p->start.oor ? -2 : p->start.latest ? -1 : km_pl_start_timestamp(pl)))
		km_pl_set_phase(p, PH_START_WAIT, "the source asked for the start position");
}

/* One partition's step of the tick: its transactions, then what km_pl_step decides. */
static void step_part(km_pipeline *pl, mpart *p, int64_t now, int64_t *next, tick_needs *need)
{
	mstep_view v = {.txl_known = pl->txl >= TXL_KNOWN};
	mstep step;

	km_pl_drive_txps(pl, p, now, next);
	if (p->txn.orphan && p->phase == PH_WRITING && !p->out.inflight) {
		/* Reconcile fences it and mirrors again from where it began (km_pl_txn_slot). */
		p->txn.orphan = false;
		km_pl_reconcile(pl, p, "a destination transaction of a source producer was left open while the next one began");
		return;
	}
	if (p->plan.head && p->plan.head->kind == BK_MARKER && !p->out.inflight && p->phase == PH_WRITING &&
	    !km_pl_taking_ahead(p))
		km_pl_drive_marker(pl, p, now, next);
	if ((p->state == KM_MP_PAUSING || p->state == KM_MP_STOPPING) && p->phase == PH_RECONCILE && !p->out.inflight)
		v.settle_needs_reconcile = reconcile_before_settle(pl, p);
	step = km_pl_step(p, &v, now);
	if (step == STEP_SETTLE) {
		settle_drained(pl, p);
		return;
	}
	if (step == STEP_IDLE) {
		watch_paused(pl, p, now, need);
		return;
	}
	if (p->state == KM_MP_MIRRORING && p->phase >= PH_READY)
		km_pl_follow_log_start(pl, p, now);
	km_pl_check_divergence(pl, p, now);
	if (p->state == KM_MP_PREPARING && !p->settling &&
	    (p->phase == PH_READY || (p->phase == PH_START && p->t->src_missing))) {
		/*
		 * Reconciled and positioned: the partition mirrors from here. A source topic that
		 * does not exist (yet) is waited for while MIRRORING.
		 */
		p->settling = true;
		km_mirror_settle(pl->mi, pl->name, p->t->name, p->id, KM_MP_PREPARING, KM_MP_MIRRORING, NULL);
	}
	need->src_meta |= p->lead.src < 0;
	need->dst_meta |= p->lead.dst < 0;
	need->pid |= p->recon.need_pid && !p->out.inflight;
	switch (step) {
	case STEP_WAIT:
		if (p->retry.at < *next)
			*next = p->retry.at;
		break;
	case STEP_FENCE:
		if (km_pl_fence_done(pl, p)) {
			km_pl_set_phase(p, PH_RECONCILE, "fenced: the second pass, over the settled log");
			km_pl_tick_soon(pl);
		}
		break;
	case STEP_RECONCILE:
		km_plan_drop_unsent(&p->plan);
		if (need->recon_room <= 0)
			break; /* its turn comes as others finish (their answers tick the pipeline) */
		if (!p->plan.head && km_pl_send_list_offsets(pl, p, true, -1)) {
			km_pl_set_phase(p, PH_RECON_WAIT, "the destination's log end asked");
			need->recon_room--;
		}
		break;
	case STEP_START:
		start_part(pl, p);
		break;
	default:
		break;
	}
}

/* Refill the throttle's tokens; a burst of one second's worth at most. */
static void refill(km_pipeline *pl, int64_t now)
{
	if (pl->rate > 0) {
		pl->tokens += (now - pl->tokens_at) * pl->rate / 1000;
		if (pl->tokens > pl->rate)
			pl->tokens = pl->rate;
	} else {
		pl->tokens = 0;
	}
	pl->tokens_at = now;
}

/*
 * A Fetch to each source broker leading a partition ready to fetch (src), or Produce requests to
 * each destination broker's lane that has a partition with a batch to send.
 */
static void each_leader(km_pipeline *pl, bool src, int64_t now, int64_t *next)
{
	struct seen_lane {
		int32_t leader;
		unsigned lane;
	} seen[256]; /* (leader, lane) pairs served this tick */
	size_t ns = 0;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			mpart *p = pl->topics[i]->parts[j];
			int32_t leader;
			unsigned lane = src ? 0 : p ? p->out.lane : 0;
			bool dup = false;
			if (!p || (src ? !km_pl_fetchable(p, now) : p->lead.dst < 0 || !km_pl_next_unsent(p)))
				continue;
			leader = src ? p->lead.src : p->lead.dst;
			for (size_t k = 0; k < ns; k++)
				dup |= seen[k].leader == leader && seen[k].lane == lane;
			if (dup)
				continue;
			if (ns < sizeof(seen) / sizeof(seen[0]))
				seen[ns++] = (struct seen_lane){leader, lane};
			if (src)
				km_pl_send_fetch(pl, leader, now, next);
			else
				while (km_pl_send_produce(pl, leader, lane))
					;
		}
}

static void tick(evutil_socket_t fd, short what, void *arg)
{
	km_pipeline *pl = arg;
	int64_t now = km_wall_ms(), next = now + 1000;
	tick_needs need = {false, false, false, 0};

	(void)fd;
	(void)what;
	pl->tick_armed = false;
	pl->tick_ran_at = km_mono_ms();
	if (pl->closing || pl->config_error)
		return;
	if (!km_mirror_owns(pl->mi, pl->name, true)) {
		/* The lease went stale (no heartbeat answered for a while, a pause): nothing moves until it is sorted out. */
		km_mirror_rebalance_soon(pl->mi);
		return;
	}
	if (pl->src && km_cluster_unreachable(pl->src))
		km_pl_source_contact(pl, KM_ERR_IO, false); /* its requests wait for a connection: none fails */
	reread_options(pl, now);
	refill(pl, now);
	need.recon_room = recon_room(pl);
	pl->tick_parts = 0;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++)
			if (pl->topics[i]->parts[j]) {
				pl->tick_parts++;
				step_part(pl, pl->topics[i]->parts[j], now, &next, &need);
			}
	if (need.pid)
		pl->pid_want = true;
	if (pl->txl == TXL_UNASKED)
		km_pl_list_txns(pl, now);
	if ((need.src_meta || pl->src_meta_need) && !pl->src_meta_inflight &&
	    now - pl->src_meta_at >= METADATA_MIN_INTERVAL_MS)
		km_pl_send_metadata(pl, pl->src);
	if ((need.dst_meta || pl->dst_meta_need) && !pl->dst_meta_inflight &&
	    now - pl->dst_meta_at >= METADATA_MIN_INTERVAL_MS)
		km_pl_send_metadata(pl, pl->dst);
	km_pl_drive_writer(pl, now, &next);
	km_pl_progress(pl, now, &next);
	/*
	 * Produce to every destination broker while there is something to send and room; then Fetch from
	 * every source broker with a lane free (and tokens, when throttled), which takes the partitions
	 * whose last batches just went out (fetched ahead).
	 */
	each_leader(pl, false, now, &next);
	if (pl->rate > 0 && pl->tokens < 0) {
		int64_t wait = -pl->tokens * 1000 / pl->rate + 1;
		if (now + wait < next)
			next = now + wait;
	} else {
		each_leader(pl, true, now, &next);
	}
	/* Periodic metadata refresh (partition moves, leader changes without errors). */
	if (now - pl->src_meta_at > pl->meta_interval)
		pl->src_meta_need = true;
	if (now - pl->dst_meta_at > pl->meta_interval)
		pl->dst_meta_need = true;
	km_pl_schedule_in(pl, next - now > 0 ? next - now : 1);
}

void km_pl_schedule_in(km_pipeline *pl, int64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
	int64_t gap = (int64_t)(pl->tick_parts / TICK_PARTS_PER_MS), wait;

	if (pl->closing)
		return;
	if (ms == 0 && gap > 0 && (wait = pl->tick_ran_at + gap - km_mono_ms()) > 0) {
		/* Soon, but not before the spacing after the last tick: at most that much later than asked. */
		if (pl->tick_armed && !event_pending(pl->tick_ev, EV_TIMEOUT, NULL))
			return; /* already active: it runs in this loop's turn */
		tv = (struct timeval){0, (suseconds_t)(wait * 1000)};
		event_del(pl->tick_ev);
		event_add(pl->tick_ev, &tv);
		pl->tick_armed = true;
		return;
	}
	if (ms == 0) {
		event_del(pl->tick_ev);
		event_active(pl->tick_ev, 0, 0);
		pl->tick_armed = true;
		return;
	}
	if (pl->tick_armed && ms > 0 && event_pending(pl->tick_ev, EV_TIMEOUT, NULL))
		return; /* an earlier tick runs first and re-arms */
	event_add(pl->tick_ev, &tv);
	pl->tick_armed = true;
}

void km_pl_on_cluster_change(void *arg)
{
	km_pl_tick_soon(arg);
}

/* ---- set-up from the mirror's configuration ---- */

static bool setup_source(km_pipeline *pl, const km_state_mirror *m, const km_mirror_options *mo)
{
	pl->src = km_mirror_source_cluster(pl->mi, m, "fetch", mo->fetch_max_bytes + (4 << 20), &pl->src_tls,
					   km_pl_on_cluster_change, pl, pl->config_msg, sizeof(pl->config_msg));
	return pl->src != NULL;
}

static bool setup_dest(km_pipeline *pl)
{
	char tid[600];

	pl->dst = km_mirror_dest_cluster(pl->mi, pl->name, "produce", km_pl_on_cluster_change, pl);
	if (!pl->dst)
		return false;
	/* The mirror's writer (meta.c, km_pl_drive_writer): without one, producer ids of its own. */
	snprintf(tid, sizeof(tid), "kmirror/%s/writer", pl->name);
	pl->writer = km_txp_new(pl->dst, tid, "", -1, km_pl_on_cluster_change, pl);
	return true;
}

static void take_options(km_pipeline *pl, const km_mirror_options *mo)
{
	pl->fetch_max_bytes = mo->fetch_max_bytes;
	/* What a mirror holds at most: two responses' worth (one being written, one arriving). */
	pl->held_cap = (size_t)mo->fetch_max_bytes * 2;
	pl->part_max_bytes = mo->fetch_partition_max_bytes;
	pl->sessions = mo->fetch_sessions;
	pl->rate = mo->throttle_bytes_per_sec;
	pl->meta_interval = mo->metadata_refresh_interval_ms;
	snprintf(pl->start_mode, sizeof(pl->start_mode), "%s", mo->start_offset ? mo->start_offset : "earliest");
	pl->unclean_hide = mo->unclean_hide;
}

/* The options may change at run time (kmirror alter): read again now and then. */
static void reread_options(km_pipeline *pl, int64_t now)
{
	const km_state_mirror *m;
	km_mirror_options mo;

	if (now - pl->options_at < 1000)
		return;
	pl->options_at = now;
	m = km_state_mirror_find(km_mirror_store(pl->mi), pl->name);
	memset(&mo, 0, sizeof(mo));
	if (m && km_state_mirror_options(m, &mo) == KM_OK)
		take_options(pl, &mo);
	km_opt_free(km_state_mirror_option_table(), &mo);
}

km_pipeline *km_pipeline_new(km_mirror *mi, const char *mirror)
{
	km_pipeline *pl = calloc(1, sizeof(*pl));
	const km_state_mirror *m = km_state_mirror_find(km_mirror_store(mi), mirror);
	km_mirror_options mo;

	if (!pl || !m || !(pl->name = strdup(mirror)))
		goto fail;
	pl->mi = mi;
	pl->pid = -1;
	if (!(pl->held = calloc(1, sizeof(*pl->held))))
		goto fail;
	pl->held->refs = 1;
	pl->tick_ev = event_new(km_mirror_base(mi), -1, 0, tick, pl);
	if (!pl->tick_ev)
		goto fail;
	memset(&mo, 0, sizeof(mo));
	if (km_state_mirror_options(m, &mo) != KM_OK)
		goto fail;
	take_options(pl, &mo);
	if (!setup_source(pl, m, &mo) || !setup_dest(pl)) {
		pl->config_error = true;
		KM_ERROR(COMP, 0, "mirror %s: cannot reach its source: %s", mirror, pl->config_msg);
	}
	km_opt_free(km_state_mirror_option_table(), &mo);
	pl->pid_want = true;
	{
		/* Pipelines live as long as the module (the series point into them). */
		km_metric_family *f = km_mirror_metric_families(mi)->fetches, *g = km_mirror_metric_families(mi)->fenced,
				 *a = km_mirror_metric_families(mi)->ahead;
		const char *full[] = {pl->name, "full"}, *incr[] = {pl->name, "incremental"}, *side[] = {pl->name, "side"},
			   *name[] = {pl->name};
		km_metric_family *r = km_mirror_metric_families(mi)->reachable,
				 *t = km_mirror_metric_families(mi)->fetched_at;
		if ((f && (!km_metric_series_ptr(f, full, &pl->fetch_full) ||
			   !km_metric_series_ptr(f, incr, &pl->fetch_incremental) ||
			   !km_metric_series_ptr(f, side, &pl->fetch_side))) ||
		    (g && !km_metric_series_ptr(g, name, &pl->fenced)) ||
		    (a && !km_metric_series_ptr(a, name, &pl->fetch_ahead)) ||
		    (r && !(pl->source.s_reachable = km_metric_series_ptr(r, name, &pl->source.reachable))) ||
		    (t && !(pl->source.s_fetched = km_metric_series_ptr(t, name, &pl->source.fetched_ms))))
			KM_DEBUG(COMP, 0, "mirror %s: a metric series was not kept (the family is full)", mirror);
		for (unsigned l = 0; l < WRITE_LANES; l++) {
			char lane[8];
			const char *labels[] = {pl->name, lane};
			km_metric_family *p = km_mirror_metric_families(mi)->produces;
			snprintf(lane, sizeof(lane), "%u", l);
			if (p && !km_metric_series_ptr(p, labels, &pl->produces[l]))
				KM_DEBUG(COMP, 0, "mirror %s: a metric series was not kept (the family is full)", mirror);
		}
		source_series_hide(pl); /* until the source is contacted */
	}
	return pl;
fail:
	km_pipeline_free(pl);
	return NULL;
}

/* What the pipeline holds toward the clusters and the destination's log: connections, batches, producers. */
static void drop_work(km_pipeline *pl)
{
	km_txp_free(pl->writer);
	pl->writer = NULL;
	km_cluster_free(pl->src);
	km_cluster_free(pl->dst);
	pl->src = pl->dst = NULL;
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			if (!p)
				continue;
			while (p->plan.head) {
				mbatch *b = p->plan.head;
				p->plan.head = b->next;
				km_plan_batch_free(b);
			}
			p->plan.tail = NULL;
			km_pl_tx_free_all(p);
		}
	}
	for (size_t i = 0; i < pl->nlisted; i++)
		free(pl->listed[i]);
	free(pl->listed);
	pl->listed = NULL;
	pl->nlisted = 0;
	if (pl->held)
		km_plan_held_unref(pl->held);
	pl->held = NULL;
	free(pl->sio);
	free(pl->dio);
	pl->sio = pl->dio = NULL;
	pl->nsio = pl->ndio = 0;
	if (pl->src_tls)
		SSL_CTX_free(pl->src_tls);
	pl->src_tls = NULL;
}

void km_pipeline_free(km_pipeline *pl)
{
	if (!pl)
		return;
	pl->closing = true;
	/* The store is freed first (kmirrord.c): its maps are gone, no tail to clear. */
	drop_work(pl);
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		for (int32_t j = 0; j < t->nparts; j++)
			free(t->parts[j]);
		free(t->parts);
		free(t->name);
		free(t);
	}
	free(pl->topics);
	if (pl->tick_ev)
		event_free(pl->tick_ev);
	free(pl->name);
	free(pl);
}

void km_pipeline_retire(km_pipeline *pl, const char *why)
{
	km_pipeline keep;

	if (!pl || pl->closing)
		return;
	pl->closing = true; /* what the connections answer as they close is dropped */
	event_del(pl->tick_ev);
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++)
			if (pl->topics[i]->parts[j])
				km_pl_set_tail(pl, pl->topics[i]->parts[j], false); /* read as a follower reads it now */
	drop_work(pl);
	/* Its partitions and the pipeline start over, as new ones would; names, series and counters stay. */
	for (size_t i = 0; i < pl->ntopics; i++) {
		mtopic *t = pl->topics[i];
		for (int32_t j = 0; j < t->nparts; j++) {
			mpart *p = t->parts[j];
			if (p) {
				__typeof__(p->stats) stats = p->stats;
				memset(p, 0, sizeof(*p));
				part_init(p, t, j);
				p->stats = stats;
				p->stats.lag = p->stats.lag_ms = 0; /* gauges: this kmirrord does not know them now */
				p->stats.source_end = -1;
			}
		}
		t->src_missing = t->dst_missing = false;
		t->src_missing_rounds = 0;
		t->peer = PEER_UNKNOWN;
	}
	keep = *pl;
	memset(pl, 0, sizeof(*pl));
	pl->mi = keep.mi;
	pl->name = keep.name;
	pl->topics = keep.topics;
	pl->ntopics = keep.ntopics;
	pl->tick_ev = keep.tick_ev;
	pl->fetch_full = keep.fetch_full;
	pl->fetch_incremental = keep.fetch_incremental;
	pl->fetch_side = keep.fetch_side;
	pl->fetch_ahead = keep.fetch_ahead;
	memcpy(pl->produces, keep.produces, sizeof(pl->produces));
	pl->fenced = keep.fenced;
	pl->source.s_reachable = keep.source.s_reachable;
	pl->source.s_fetched = keep.source.s_fetched;
	source_series_hide(pl); /* gauges: another kmirrord reports them now */
	pl->store_pending = keep.store_pending;
	pl->life = keep.life + 1;
	pl->retired_at = km_wall_ms();
	pl->closing = true;
	pl->pid = -1;
	KM_INFO(COMP, 0, "mirror %s: its pipeline stops here (%s)", pl->name, why);
}

bool km_pipeline_resume(km_pipeline *pl)
{
	const km_state_mirror *m;
	km_mirror_options mo;

	if (!pl || !pl->closing || !pl->retired_at)
		return pl != NULL;
	if (!(m = km_state_mirror_find(km_mirror_store(pl->mi), pl->name)) || !(pl->held = calloc(1, sizeof(*pl->held))))
		return false;
	pl->held->refs = 1;
	memset(&mo, 0, sizeof(mo));
	if (km_state_mirror_options(m, &mo) != KM_OK)
		return false;
	take_options(pl, &mo);
	pl->closing = false;
	pl->retired_at = 0;
	if (!setup_source(pl, m, &mo) || !setup_dest(pl)) {
		pl->config_error = true;
		KM_ERROR(COMP, 0, "mirror %s: cannot reach its source: %s", pl->name, pl->config_msg);
	}
	km_opt_free(km_state_mirror_option_table(), &mo);
	pl->pid_want = true;
	return true;
}

bool km_pipeline_releasing(const km_pipeline *pl)
{
	return pl->retired_at && pl->store_pending > 0 && km_wall_ms() - pl->retired_at < KM_MIRROR_RELEASE_WAIT_MS;
}

int64_t km_pipeline_retired_at(const km_pipeline *pl)
{
	return pl->retired_at;
}

uint32_t km_pipeline_life(const km_pipeline *pl)
{
	return pl->life;
}

const char *km_pipeline_name(const km_pipeline *pl)
{
	return pl->name;
}

size_t km_pipeline_count(const km_pipeline *pl)
{
	size_t n = 0;
	for (size_t i = 0; i < pl->ntopics; i++)
		for (int32_t j = 0; j < pl->topics[i]->nparts; j++) {
			const mpart *p = pl->topics[i]->parts[j];
			if (p && (p->phase != PH_IDLE || p->settling || p->out.inflight))
				n++;
		}
	return n;
}

void km_pipeline_partition(km_pipeline *pl, const char *topic, int32_t partition, km_mp_state state)
{
	bool run = state == KM_MP_PREPARING || state == KM_MP_MIRRORING || state == KM_MP_PAUSING ||
		   state == KM_MP_STOPPING;
	mtopic *t = pl->closing ? NULL : km_pl_topic_get(pl, topic, run);
	mpart *p = t ? km_pl_part_get(pl, t, partition, false) : NULL;

	if ((!p || !p->taken) && run) {
		/*
		 * New here, or new to this life of the pipeline (one retired and resumed keeps its
		 * partitions, reset). A restart or a takeover that finds it pausing or stopping reconciles
		 * it before it settles: an earlier life may have left destination transactions open on
		 * it, and the tail known here is the persisted progress, which lags the last writes
		 * (docs/reliability.md, findings 17 and 21).
		 */
		if (!p && !(p = km_pl_part_get(pl, t, partition, true)))
			return;
		p->taken = true;
		if (state == KM_MP_PAUSING || state == KM_MP_STOPPING) {
			km_pl_set_phase(p, PH_RECONCILE, "a restart finds it pausing or stopping");
			p->recon.need_pid = true;
			pl->pid_want = true;
			pl->dst_meta_need = pl->src_meta_need = true;
		}
	}
	if (!p)
		return;
	p->state = state;
	p->settling = false;
	switch (state) {
	case KM_MP_PREPARING:
	case KM_MP_MIRRORING:
		if (p->phase == PH_IDLE) {
			/* A start, a resume or a restart: reconcile first (a start asks the source's kmirrord again). */
			if (state == KM_MP_PREPARING) {
				p->t->peer = PEER_UNKNOWN;
				p->fb.check = FB_UNCHECKED;
			}
			km_pl_set_phase(p, PH_RECONCILE, "a start, a resume or a restart");
			p->recon.need_pid = true;
			p->retry.at = 0;
			p->retry.backoff_ms = 0;
			pl->pid_want = true;
			pl->dst_meta_need = pl->src_meta_need = true;
		}
		break;
	case KM_MP_PAUSING:
	case KM_MP_STOPPING:
		break; /* the tick drains it */
	default:
		km_pl_set_phase(p, PH_IDLE, "not running");
		km_plan_drop_unsent(&p->plan);
		/* Paused, the tail stays: it is where the mirror stands and resumes (describe shows it). */
		if (state != KM_MP_PAUSED)
			km_pl_set_tail(pl, p, false);
		break;
	}
	if (pl->config_error && (state == KM_MP_PREPARING || state == KM_MP_MIRRORING)) {
		km_pl_fail_part(pl, p, pl->config_msg);
		return;
	}
	km_pl_tick_soon(pl);
}
