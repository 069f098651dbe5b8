/* Internals of a mirror's pipeline (docs/mirror.md, "The pipeline"): the partition, the files that move it. */
#ifndef KMIRROR_MIRROR_PIPELINE_H
#define KMIRROR_MIRROR_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "kmirror/offmap.h"
#include "kmirror/rpc.h"
#include "kmirror/state.h"
#include "mirror/mirror_int.h"
#include "mirror/pipeline/plan.h"

#define COMP KM_MIRROR_COMP

/*
 * A destination broker's write lanes: connections (km_cluster_lane 0 .. WRITE_LANES - 1) the
 * partitions take in turn; Produce requests in flight per lane (a partition keeps its lane, so its
 * batches stay in order: idempotence keeps 5).
 */
#define WRITE_LANES 4
#define KM_MIRROR_PRODUCE_INFLIGHT 5
/* Bytes of batches one Produce request carries at most (its partitions' batches add up to this). */
#define PRODUCE_REQUEST_BYTES (8 << 20)
#define FETCH_MAX_WAIT_MS 500
/*
 * Fetches in flight per source broker, each on a connection of its own (km_cluster_lane): one per
 * group of the broker's partitions, with the group's fetch session (a broker that leads at most
 * FETCH_SESSION_MAX of them has one group, on lane 0; several groups take lanes 1 to groups);
 * partitions of a group that become ready while its session's Fetch long-polls go at once in a
 * Fetch without a session on an idle lane after those, of FETCH_SIDE_LANES (docs/mirror.md,
 * "Fetch sessions", "Fetch groups", "Side Fetches").
 */
#define FETCH_SIDE_LANES 1
#define FETCH_GROUPS_MAX 12
_Static_assert(FETCH_GROUPS_MAX + 1 + FETCH_SIDE_LANES <= KM_CLUSTER_LANES && WRITE_LANES <= KM_CLUSTER_LANES,
	       "a source broker's fetch lanes and a destination broker's write lanes are clients of km_cluster");
/*
 * After an answer that came at once with nothing for any partition it asked for (fetch.c,
 * quiet_after): QUIET_MIN_MS, doubled while the answers keep coming so, to QUIET_MS.
 */
#define QUIET_MIN_MS 5
#define QUIET_MS 100
/*
 * A fetch session holds this many of the pipeline's partitions at most (docs/mirror.md, "Fetch
 * sessions"): a source broker that leads more is fetched in groups, a session each, up to
 * FETCH_GROUPS_MAX groups (past that, the groups grow).
 */
#define FETCH_SESSION_MAX 1000
/*
 * A tick steps every partition: with many, the ticks an answer asks for "soon" are spaced by a
 * millisecond per TICK_PARTS_PER_MS partitions after the last one began (none below that many),
 * so that 10,000 partitions answered by a dozen Fetch lanes do not spend the loop on whole passes
 * (machine.c, km_pl_schedule_in).
 */
#define TICK_PARTS_PER_MS 1000
/* How long a partition's log start, found with nothing to follow, is not looked at again (logstart.c). */
#define LOG_START_RECHECK_MS 10000
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 10000
#define METADATA_MIN_INTERVAL_MS 500
/* A partition whose destination writes keep failing (retriable errors, reconciles) this long goes FAILED. */
#define KM_MIRROR_FAIL_AFTER_MS 300000
/* A retired pipeline's handover waits this long at most for its store writes (then the next owner goes on). */
#define KM_MIRROR_RELEASE_WAIT_MS 10000
/* A partition fenced by a newer epoch of the writer waits this long before it reconciles (two heartbeats). */
#define FENCED_WAIT_MS 10000
/*
 * How often the tails that moved are persisted as progress (one store write for the pipeline's
 * partitions): what the instances that do not run the mirror show is that old at most, plus their
 * follow round (docs/state.md, "What a reader is shown").
 */
#define KM_MIRROR_PROGRESS_MS 200
/* Partitions reconciling at once, and the pipeline's store writes unanswered before no more begin (machine.c, recon_room). */
#define RECONCILE_WINDOW 500
#define STORE_WINDOW 400
/* How often a paused partition's source end is read (for its lag). */
#define PAUSED_WATCH_MS 2000
/* Metadata answers in a row without a topic that was mirrored before it counts as deleted at the source. */
#define SOURCE_GONE_ROUNDS 3

/* The versions this code speaks: [lo, hi] of each request it builds (Fetch and Produce name topics, v12 at most). */
enum { FETCH_LO = 4, FETCH_HI = 12, PRODUCE_LO = 3, PRODUCE_HI = 12, META_LO = 1, META_HI = 12, LO_LO = 1,
       LO_HI = 10, PID_LO = 0, PID_HI = 5, LT_LO = 0, LT_HI = 1 };
/* A transactional batch goes with Produce v11 at most: transaction version 1 (txn.c). */
#define PRODUCE_TXN_HI 11
/*
 * A partition's transactional producers: a free one is leased again once its last transaction
 * has had this long to complete at the coordinator, or when the pool has this many (carry.c).
 */
#define TXN_COMPLETE_MS 100
#define TXN_POOL_WARM (PLAN_MARKERS_AHEAD + 2)
/* How soon a marker's landing is looked at again while the coordinator has not written it yet. */
#define MARKER_POLL_MS 5
/*
 * How long a partition's head marker may stand without its transaction ending (EndTxn not sent:
 * its producer never open) or, once EndTxn is sent, without landing: then its state is logged and
 * the partition reconciles (carry.c, km_pl_drive_marker).
 */
#define MARKER_STUCK_MS 30000
/* How long reconcile waits for the answer and the marker of a transaction this life ended (carry.c). */
#define ENDED_WAIT_MS 30000
#define MARKER_WAIT_POLL_MS 20
/* A transaction still open after the fence: the log asked again once after this long before it is closed. */
#define HANG_RECHECK_MS 500
/* How long partitions wait for ListTransactions to reach every destination broker before going on without it. */
#define TXL_PATIENCE_MS 10000

typedef enum {
	PH_IDLE,       /* not run (paused, stopped, failed, or waiting for its committed state) */
	/* PH_RECONCILE to PH_FENCE: reconcile, which a pausing or stopping partition finishes before it settles */
	PH_RECONCILE,  /* waiting for a producer id and the destination leader, then ListOffsets on it */
	PH_RECON_WAIT, /* ListOffsets on the destination sent */
	PH_RECON_LSO,  /* then ListOffsets READ_COMMITTED: the last stable offset */
	PH_RECON_ABORTED, /* a READ_COMMITTED Fetch at the hide point: aborted transactions spanning it */
	PH_RECON_TAIL, /* one-batch Fetches on the destination: is the tail past the writer's start the mirror's? */
	PH_RECON_MARKER, /* the source asked what is at the offset a marker at the hide point or the tail stands for */
	PH_FENCE,      /* its transactional ids being initialised again (what they held open is aborted) */
	PH_START,      /* no run yet: ListOffsets on the source for the start position */
	PH_START_WAIT,
	PH_READY,      /* may be fetched */
	PH_FETCHING,   /* in a Fetch in flight */
	PH_RUNS,       /* new runs being persisted before its batches go out */
	PH_WRITING,    /* batches being produced */
} mphase;

/* A destination transactional producer of the partition and the source transaction it carries. */
typedef struct mtx {
	km_txp *txp;
	int64_t src_pid; /* -1: free */
	bool begun;      /* km_txp_begin called for the current source transaction */
	bool marked;     /* its marker is planned: the source transaction is over (a later batch of src_pid is another's) */
	int64_t first_logical; /* where that transaction's first batch is (-1: none planned yet) */
	/* EndTxn sent for it (the coordinator decides it, whatever the partition does): where its marker was planned; -1: not */
	int64_t marker_phys;
	int64_t released; /* when its last source transaction was released (ms; 0: never leased) */
	uint8_t hang;     /* closing a transaction left open on the partition (km_pl_fence_done): 1 begun, 2 ended */
} mtx;

typedef struct mtopic mtopic;

/*
 * A partition of the pipeline. Its committed state (state) says what the driver asked; its phase
 * says where its machine is (km_pl_set_phase, the only writer); each part below belongs to the
 * file that moves it.
 */
typedef struct mpart {
	mtopic *t;
	int32_t id;
	km_mp_state state;      /* committed */
	mphase phase;           /* km_pl_set_phase */
	bool settling;          /* a transition asked of the driver, not yet committed */
	bool taken;             /* handed a running state in this life (km_pipeline_partition) */
	struct {
		int64_t at;             /* not before (a backoff) */
		int backoff_ms;
	} retry;
	struct {                /* meta.c: the leaders, as the last metadata named them */
		int32_t src, src_epoch, dst;
	} lead;
	mplan plan;             /* plan.c: the batch plan and its queue */
	struct {                /* produce.c: what the destination acknowledged */
		int64_t acked_phys;     /* the physical tail: after the last acknowledged batch */
		int64_t acked_logical;  /* the logical tail matching acked_phys (holes after it included once planned) */
		int32_t acked_epoch;    /* the source leader epoch of the last batch acknowledged (-1: not known) */
		size_t inflight;        /* batches sent, not answered */
		unsigned lane;          /* the destination connection (km_cluster_lane) its Produce requests take */
		bool probe;             /* the first write after reconcile goes alone and checks where it landed */
		int64_t newest_ts;      /* max timestamp of the last batch written */
		int64_t failing_since;  /* the first of a run of destination errors with nothing written since (0: none) */
		bool tail;              /* the tail is this pipeline's (km_pl_set_tail): readers here see up to it */
		int64_t progress;       /* the tail last persisted as progress (-1: none in this life) */
		int32_t progress_epoch; /* and its epoch */
		int64_t progress_open;  /* and the open transaction's start persisted with it (km_pl_open_txn_logical) */
		bool progress_due;      /* km_pl_progress: in the write it is building */
	} out;
	struct {                /* reconcile.c, carry.c */
		bool need_pid;          /* waits for a fresh producer id */
		int64_t hide_logical;   /* a batch landed where it was not planned: hide from its logical start (-1: none) */
		bool drill;             /* hide_logical is where a stop left the partition: what is past it was written here since */
		int64_t stop_at;        /* a stop's point: where the earliest transaction it aborted began (-1: none) */
		int64_t end;            /* the destination's log end, while its last stable offset is asked */
		int64_t hide;           /* the physical offset the hidden range starts at, being settled */
		bool tx_fenced;         /* its transactional ids of earlier lives were initialised again */
		bool relisted;          /* an open transaction none of its own: the mirror's ids were listed again for it */
		int64_t ended_wait;     /* since when reconcile waits for transactions this life ended (0: not) */
		bool fence_started;
		bool hang_closing;      /* fenced, and the log still holds a transaction open: each id aborts an empty one there */
		bool hang_closed;       /* done in this reconcile (not again until it ends) */
		bool hang_asked;        /* the log asked again once at hang_lso first (a marker not yet replicated holds the LSO too) */
		int64_t hang_lso;
		bool seal_out;          /* a stop's seal planned since the last reconcile, not known to have landed */
		bool writer_pending;    /* its writer (producer id, where it starts) not persisted yet: no fetch */
		uint32_t writer_gen;    /* drops the answer of a writer write an later reconcile replaced */
		int64_t tail_wpid, tail_wstart; /* RECON_TAIL: the writer the tail is judged against, read once */
		int16_t tail_wepoch;    /* (a writer record landing meanwhile changes nothing: finding 37) */
		int64_t tail_good;      /* RECON_TAIL: [writer start, tail_good) is the writer's, dense */
		int64_t tail_bad;       /* RECON_TAIL: a foreign batch starts here (-1: none seen yet) */
		int64_t tail_pid;       /* the producer id of the first batch seen that is not the writer's */
		bool tail_foreign;      /* RECON_TAIL: a batch seen is foreign (not an earlier writer's) */
		int64_t marker_logical; /* RECON_MARKER: the source offset asked (the marker at hide - 1, end - 1) */
		bool marker_tail;       /* RECON_MARKER: asked for the tail's check, not the hide point's */
		bool marker_source;     /* RECON_MARKER: the source is asked (else the destination's batches before the marker) */
		int64_t marker_from;    /* RECON_MARKER: where the destination's batches before the marker are read from */
		km_offmap view;         /* km_pl_map_of: the map as reconcile reads it (the open run unbounded) */
	} recon;
	struct {                /* reconcile.c: how PH_START asks the source */
		bool oor;               /* the source answered OFFSET_OUT_OF_RANGE: look up its log start */
		bool latest;            /* no record at or after the start timestamp: start at the end */
	} start;
	struct {                /* logstart.c */
		int64_t src;            /* the source's log start offset, as last fetched (-1: not known) */
		int64_t dst;            /* the logical log start the destination was moved to (-1: never) */
		int64_t idle_target;    /* nothing to move up to this target at or below the first run: */
		int64_t idle_until;     /* not looked up again before then (LOG_START_RECHECK_MS) */
		bool inflight, unsupported; /* a DeleteRecords in flight; the destination refuses them (compacted) */
	} ls;
	struct {                /* machine.c: paused, the source's end is read for the lag */
		bool inflight;
		int64_t at;
	} watch;
	struct {                /* fetch.c */
		uint64_t seq;           /* the Fetch it is in (fetch_ctx.seq) */
		bool taken;             /* its data in the current answer was taken (a partition listed twice is not) */
		bool ahead;             /* in a Fetch while its last batches are written: the phase stays WRITING (km_pl_fetch_ahead) */
		int32_t sess_node;      /* the source broker whose fetch session holds it, -1: none */
		unsigned sess_lane;     /* the lane of that session (its group) */
		unsigned group;         /* its fetch group at its leader, as of the last Fetch sent to it */
		int64_t sess_offset;    /* what that session holds for it: fetch offset, size, leader epoch */
		int32_t sess_max, sess_lepoch;
		bool overlap_seen;      /* a source batch overlapped what was mirrored: the topic's id is checked first */
		uint64_t overlap_at;    /* src_meta_answers then: fetched again after the next answer */
	} fetch;
	struct {                /* diverge.c: is the source's log still the one mirrored? */
		bool need;              /* asked before the next Fetch (a leader change, a restart, past the source's end) */
		bool inflight;          /* OffsetForLeaderEpoch sent */
		bool diverged;          /* reconcile hides recon.hide_logical on: the source's log diverged there */
		int32_t checked;        /* the source leader epoch whose log was found to be the one mirrored (-1: none) */
		uint64_t meta_at;       /* the source Metadata answers when it was asked: sent after the next one (its topic id checked first) */
	} div;
	struct {                /* carry.c: its transactional producers (docs/mirror.md, "Transactions") */
		mtx *tx;
		size_t n;
		bool orphan;    /* a source producer's transaction left open in one producer while another carries its next (km_pl_txn_slot) */
	} txn;
	struct {                /* failback.c */
		int64_t peer_offset;    /* the source's kmirrord mirrored it from here up to this (-1: no) */
		int32_t peer_epoch;     /* this cluster's leader epoch of the batch before it, as that kmirrord recorded it (-1: not known) */
		int32_t here_epoch;     /* that batch's leader epoch in this cluster's log (the compare reads it; -1: not read) */
		int32_t src_epoch;      /* the source's own leader epoch of its copy (-1: not read) */
		char peer_state[16];    /* and its state there */
		int check;              /* FB_* */
		int pending;            /* its probes not answered yet */
		uint64_t hash[2];       /* the record before the failback point: here [0], at the source [1] (0: none) */
	} fb;
	struct {                /* metrics: series point at these */
		uint64_t records, bytes, batches, skipped, errors;
		uint64_t lag, lag_ms;   /* gauges, set on every fetch answer */
		int64_t source_end;     /* the source's high watermark as last fetched; -1: not known */
		bool metrics;           /* its series are registered */
	} stats;
} mpart;

/* Failback's check that the topic was mirrored from here (mpart.fb.check). */
enum {
	FB_UNDECIDABLE = -1, /* the record is not on both sides: the source's kmirrord is trusted */
	FB_UNCHECKED = 0,
	FB_PROBING,          /* its two record probes are out */
	FB_SAME,             /* the record before the failback point is the same on both sides */
};

/* The destination's transactional ids of the mirror (km_pipeline.txl): ListTransactions on every broker. */
enum {
	TXL_UNASKED,
	TXL_ASKED,
	TXL_KNOWN,
	TXL_UNSUPPORTED, /* the destination cannot list them (before Kafka 3.0): no transactions carried */
};

struct mtopic {
	km_pipeline *pl;
	char *name;
	mpart **parts; /* by partition id */
	int32_t nparts;
	bool src_missing, dst_missing;
	int src_missing_rounds;  /* Metadata answers in a row without the source topic */
	int32_t src_partitions;  /* the source's partition count, as last read */
	/* Failback: what the source's kmirrord says it mirrored of the topic (LastMirroredOffsets). */
	int peer;                /* PEER_* */
	km_uuid peer_source_id;  /* the topic id its mirror copied (zero: not said) */
	km_uuid dst_id;          /* the destination topic's id (Metadata v10+; zero: not known) */
	bool sid_pending;        /* the source topic's id being persisted */
};

enum {
	PEER_UNKNOWN, /* not asked yet */
	PEER_ASKED,
	PEER_KNOWN,   /* the source's kmirrord answered: partitions' peer_offset are set */
	PEER_NONE,    /* a plain Kafka source, or the topic is not mirrored there: a fresh start */
};

typedef struct mnode_io {
	int32_t id;
	unsigned lane; /* the connection (km_cluster_lane): a destination's write lane, a source's fetch lane */
	bool fetching;
	int produce_inflight;
	int32_t sess_id, sess_epoch; /* the source broker's fetch session on this lane (KIP-227); id 0: none */
	unsigned groups;      /* lane 0: the broker's fetch groups the sessions were opened for (0: none yet) */
	int64_t quiet_until;  /* no Fetch before this unless more partitions are ready than quiet_ready (fetch.c) */
	size_t quiet_ready;
	int64_t quiet_ms;     /* the last quiet period; 0 after an answer that was not empty at once */
} mnode_io;

struct km_pipeline {
	km_mirror *mi;
	char *name;
	km_cluster *src, *dst;
	SSL_CTX *src_tls;
	mtopic **topics;
	size_t ntopics;
	mnode_io *sio, *dio;
	size_t nsio, ndio;
	struct event *tick_ev;
	bool tick_armed;
	int64_t tick_ran_at;  /* km_mono_ms when the last tick began */
	size_t tick_parts;    /* the partitions that tick stepped: a tick soon waits tick_parts / TICK_PARTS_PER_MS ms after it */
	bool src_meta_inflight, dst_meta_inflight, src_meta_need, dst_meta_need;
	int64_t src_meta_at, dst_meta_at;
	bool pid_inflight, pid_want;
	km_txp *writer;    /* transactional id kmirror/<mirror>/writer: each producer id is its next epoch */
	bool writer_plain; /* the writer could not be initialised: producer ids without a transactional id */
	int64_t pid;
	int16_t epoch;
	uint64_t pid_gen; /* bumps with every producer id obtained */
	uint64_t fetch_seq;
	unsigned lane_next; /* the lane of the next partition made (they take the lanes in turn) */
	int64_t fetch_max_bytes, part_max_bytes;
	bool sessions;                      /* mirror.fetch.sessions */
	uint64_t fetch_full, fetch_incremental, fetch_side; /* Fetch requests sent, by kind (kmirror_mirror_fetch_requests_total) */
	uint64_t fetch_ahead; /* partitions fetched while writing (kmirror_mirror_fetches_ahead_total) */
	uint64_t produces[WRITE_LANES];    /* Produce requests sent, by lane (kmirror_mirror_produce_requests_total) */
	uint64_t fenced; /* batches refused for an older epoch of the writer (kmirror_mirror_fenced_writes_total) */
	char start_mode[32];
	bool unclean_hide;  /* mirror.support.unclean.leader.election: a diverged source's tail is hidden, not FAILED */
	uint64_t src_meta_answers; /* source Metadata answers taken (diverge.c and an overlap wait for one after their trigger) */
	bool src_meta_to_node;     /* the next source Metadata goes to src_meta_node (the broker that served what is checked) */
	int32_t src_meta_node;
	int64_t options_at;
	int64_t meta_interval; /* mirror.metadata.refresh.interval.ms: leaders, partition counts */
	/* mirror.replication.throttled.rate: a token bucket over fetched bytes (0: no limit). */
	int64_t rate, tokens, tokens_at;
	mheld *held; /* fetched bytes held: no new fetch while above held_cap */
	size_t held_cap;
	bool closing;   /* freed or retired: answers that come now are dropped */
	uint32_t life;  /* bumps at each retire: a store answer of an earlier life is dropped */
	int store_pending; /* store writes not answered yet (a retired pipeline's count ends its handover) */
	bool progress_inflight; /* a progress write is out (km_pl_progress) */
	int64_t progress_at;    /* when the last one was sent */
	int64_t retired_at; /* when it was retired (0: running) */
	bool config_error;
	char config_msg[256];
	/* The destination's transactional ids of this mirror, from ListTransactions on every broker. */
	int txl;        /* TXL_* */
	int txl_pending;
	uintptr_t txl_gen; /* answers of an earlier round are dropped */
	int64_t txl_at, txl_since; /* the last round; the first (0: none yet) */
	char **listed;
	size_t nlisted;
	struct {           /* the source as last contacted (kmirror_mirror_source_reachable, /healthz) */
		uint64_t reachable;  /* 1: the last contact succeeded */
		uint64_t fetched_ms; /* the last Fetch answer (ms since the epoch); 0: none yet */
		int64_t since_ms;    /* when reachable last changed; 0: no contact yet */
		char error[256];     /* why the last contact failed ("": it did not) */
		km_metric_series *s_reachable, *s_fetched;
	} source;
};

/* A store write's answer is for this pipeline as it runs now (not freed, not retired since it was asked). */
static inline bool km_pl_current(const km_pipeline *pl, uint32_t life)
{
	return !pl->closing && pl->life == life;
}

typedef struct req_ctx {
	km_pipeline *pl;
	km_cluster *cl;
	int32_t node;
	int16_t ver;  /* what the answers read without the API table need (a streamed Fetch, a Produce) */
	void *extra;
} req_ctx;

typedef enum {
	LO_POSITION, /* reconcile's log end (destination), the start position (source) */
	LO_WATCH,    /* a paused partition's source end, for its lag */
	LO_LSO,      /* reconcile's last stable offset (destination, READ_COMMITTED) */
	LO_MARKER,   /* whether a transaction's marker landed (destination) */
} lo_kind;

typedef struct lo_ctx {
	mtopic *t;
	int32_t part;
	bool dest;
	int64_t ts;
	lo_kind kind;
	int64_t tag; /* LO_MARKER: the physical offset of the marker it asks about */
} lo_ctx;


/* machine.c: the partition machine */
extern const char *const km_pl_phase_names[];
/* The only writer of p->phase: checks the edge (km_pl_phase_edge), logs the transition at debug level with why. */
void km_pl_set_phase(mpart *p, mphase to, const char *why);
/* Whether from -> to is an edge of the machine. */
bool km_pl_phase_edge(mphase from, mphase to);
/* In reconcile (PH_RECONCILE to PH_FENCE): what the destination's log holds decides, answers in flight are dropped. */
bool km_pl_reconciling(const mpart *p);
/* What the tick does next for a partition (km_pl_step): the machine's decision, pure. */
typedef enum {
	STEP_NONE,      /* nothing now: an answer or a leader is awaited */
	STEP_SETTLE,    /* pausing or stopping: drain what is in flight, then settle */
	STEP_IDLE,      /* not running: a paused one's source end is read now and then */
	STEP_WAIT,      /* backing off until retry.at */
	STEP_FENCE,     /* fence its transactional ids */
	STEP_RECONCILE, /* ask the destination's log end */
	STEP_START,     /* position it at the source (the failback peer first, for a fresh start) */
} mstep;

/* What km_pl_step needs to know of the pipeline. */
typedef struct mstep_view {
	bool txl_known;              /* the mirror's transactional ids on the destination are listed */
	bool settle_needs_reconcile; /* pausing or stopping in RECONCILE: transactions may be left open */
} mstep_view;

mstep km_pl_step(const mpart *p, const mstep_view *v, int64_t now);

/* ---- meta.c: requests, metadata, the producer id ---- */

/* A request's context (freed by its answer's callback). */
req_ctx *km_pl_ctx_new(km_pipeline *pl, km_cluster *cl, int32_t node, int16_t ver);
/* km_rpc_call of req (a km_<name>_request) with the request's context: freed here when the send fails. */
km_err km_pl_call(km_net_client *c, int16_t key, int16_t ver, const void *req, km_rpc_cb cb, req_ctx *x);
/* A request about one partition to cl's broker leader, answered to cb with an lo_ctx (*lc copied). */
bool km_pl_send_part(km_pipeline *pl, km_cluster *cl, int32_t leader, km_net_client *c, int16_t key, int16_t ver,
		     const void *req, km_rpc_cb cb, const lo_ctx *lc);
/*
 * In a km_pl_send_part answer's callback: the partition it is about (NULL: the pipeline closes,
 * or the partition is gone), its pipeline in *pl and the request's lo_ctx in *lc; the request's
 * allocations freed.
 */
mpart *km_pl_answer_part(void *arg, km_pipeline **pl, lo_ctx *lc);
void km_pl_send_metadata(km_pipeline *pl, km_cluster *cl);
/* InitProducerId on the destination: partitions waiting for a fresh id take the answer's. */
void km_pl_send_pid(km_pipeline *pl);
/* A fresh producer id (epoch) when partitions want one: from the mirror's writer (meta.c). */
void km_pl_drive_writer(km_pipeline *pl, int64_t now, int64_t *next);

/* ---- carry.c: carried transactions ---- */

/* The batch plan's transactions (mplan_env.txn): arg is the partition. */
int km_pl_txn_slot(void *arg, int64_t src_pid, int64_t logical, mtx_use use);
/* Whether one of p's producers has transactional id tid. */
bool km_pl_tid_held(const mpart *p, const char *tid);
/* Whether tid is one of p's transactional ids, of any kmirrord instance. */
bool km_pl_tid_is_of(const km_pipeline *pl, const mpart *p, const char *tid);
/* Whether p carries an open source transaction. */
bool km_pl_tx_open(const mpart *p);
bool km_pl_tx_wait_ended(km_pipeline *pl, mpart *p, int64_t end);
/* Where the earliest destination transaction p holds open starts (logical), -1: none. */
int64_t km_pl_open_txn_logical(const mpart *p);
void km_pl_tx_free_all(mpart *p);
/* Fence p's transactional ids (its own and an earlier life's): true once all are free again. */
bool km_pl_fence_done(km_pipeline *pl, mpart *p);
/* ListTransactions on every destination broker: the ids earlier lives of the mirror left. */
void km_pl_list_txns(km_pipeline *pl, int64_t now);
/* The mirror's transactional ids on the destination are listed again (km_pl_list_txns, on the next tick). */
void km_pl_relist_txns(km_pipeline *pl);
/* p's head is a marker with everything before it in: end the destination transaction, then wait for its marker. */
void km_pl_drive_marker(km_pipeline *pl, mpart *p, int64_t now, int64_t *next);
/* The destination's log end, asked about the marker planned at physical offset at. */
void km_pl_marker_answer(km_pipeline *pl, mpart *p, bool ok, int64_t end, int64_t at);
/* p's producers: transactions to begin, requests to send (next: when to poll again). */
void km_pl_drive_txps(km_pipeline *pl, mpart *p, int64_t now, int64_t *next);

/* ---- failback.c ---- */

/* Ask the source whether it is a kmirrord that mirrored t from here (LastMirroredOffsets). */
void km_pl_ask_peer(km_pipeline *pl, mtopic *t);
/* A fresh start from a kmirrord that mirrored p from here: true when it took p's start. */
bool km_pl_failback_start(km_pipeline *pl, mpart *p);

/* ---- logstart.c ---- */

void km_pl_follow_log_start(km_pipeline *pl, mpart *p, int64_t now);

/* ---- produce.c ---- */

/* b, taken off the head, is in the destination's log where it was planned: the tail moves after it. */
void km_pl_landed(km_pipeline *pl, mpart *p, mbatch *b);
/* The tail past the holes planned after the last landed batch, in their source leader epoch. */
void km_pl_past_holes(mpart *p);
bool km_pl_run_past_holes(km_pipeline *pl, mpart *p, mphase then);
/*
 * A stop settles p with no batch of its writer's current epoch on the destination partition yet:
 * a write of an earlier writer (a former owner's Produce held in a cut link) could still land
 * after the stop point. Its seal goes first (km_pl_seal; docs/mirror.md, "The stop's seal").
 */
bool km_pl_seal_due(km_pipeline *pl, mpart *p);
/* Plan the seal: its run persisted first, then the record sent alone as a probe (false: no memory). */
bool km_pl_seal(km_pipeline *pl, mpart *p);
/* Every KM_MIRROR_PROGRESS_MS: the tails that moved since, persisted in one store write (the tick calls it). */
void km_pl_progress(km_pipeline *pl, int64_t now, int64_t *next);
/*
 * p's part of a Fetch sent ahead (km_pl_fetch_ahead) is being taken: what it plans waits for the
 * part's end, as a FETCHING partition's does (the runs its batches start are persisted first).
 */
static inline bool km_pl_taking_ahead(const mpart *p)
{
	return p->fetch.ahead && p->fetch.taken;
}
/*
 * The next unsent batch of p, or NULL. A probe goes alone: nothing else of p until it is answered.
 * A transaction's batch waits until its destination transaction is open; a marker is not produced
 * (drive_marker ends the transaction once everything before it is in). Inline: the tick asks it of
 * every partition.
 */
static inline mbatch *km_pl_next_unsent(mpart *p)
{
	if (p->phase != PH_WRITING || (p->out.probe && p->out.inflight) || km_pl_taking_ahead(p))
		return NULL;
	for (mbatch *b = p->plan.head; b; b = b->next)
		if (!b->sent) {
			if (b->kind == BK_MARKER ||
			    (b->kind == BK_TXN && km_txp_state_of(p->txn.tx[b->txi].txp) != KM_TXP_OPEN))
				return NULL;
			return b;
		}
	return NULL;
}
/* One Produce request to node on lane; false when there was nothing to send or no room. */
bool km_pl_send_produce(km_pipeline *pl, int32_t node, unsigned lane);

/* ---- fetch.c ---- */

/* Whether p can be fetched now. Inline: the tick and every Fetch ask it of every partition. */
/*
 * A source partition's error that says our metadata is old (the leader moved, is not elected, or
 * the broker is behind): asked again of the leader the next Metadata names.
 */
static inline bool km_pl_source_meta_stale(int16_t code)
{
	return code == 3 /* UNKNOWN_TOPIC_OR_PARTITION */ || code == 5 /* LEADER_NOT_AVAILABLE */ ||
	       code == 6 /* NOT_LEADER_OR_FOLLOWER */ || code == 74 /* FENCED_LEADER_EPOCH */ ||
	       code == 75 /* UNKNOWN_LEADER_EPOCH */ || code == 100 /* UNKNOWN_TOPIC_ID */;
}

/*
 * p writes its last fetched batches, all of them sent (or its plan ends in a marker, with room for
 * another), none of a probe, and is in no Fetch: its next Fetch may go now, at the logical offset
 * after them, while they are written (docs/mirror.md, "Fetching ahead"). Its phase stays WRITING.
 */
static inline bool km_pl_fetch_ahead(const mpart *p)
{
	const mbatch *t = p->plan.tail;
	return p->phase == PH_WRITING && !p->fetch.ahead && !p->out.probe && t &&
	       (t->sent || (t->kind == BK_MARKER && km_plan_markers(&p->plan) < PLAN_MARKERS_AHEAD));
}

static inline bool km_pl_fetchable(const mpart *p, int64_t now)
{
	return ((p->phase == PH_READY && !p->plan.head && !p->out.inflight) || km_pl_fetch_ahead(p)) &&
	       p->state == KM_MP_MIRRORING && !p->settling && p->retry.at <= now && p->lead.src >= 0 &&
	       p->plan.pid >= 0 && !p->recon.writer_pending && !p->div.need &&
	       !(p->fetch.overlap_seen && p->t->pl->src_meta_answers <= p->fetch.overlap_at);
}
void km_pl_send_fetch(km_pipeline *pl, int32_t node, int64_t now, int64_t *next);

/* ---- diverge.c: a diverged source (docs/mirror.md, "A diverged source") ---- */

/*
 * A partition whose div.need is set and that is otherwise ready to fetch: OffsetForLeaderEpoch on
 * the source leader with the epoch of the last batch mirrored. The answer clears div.need (the log
 * is the one mirrored), or hides the divergent tail (mirror.support.unclean.leader.election) or
 * fails the partition.
 */
void km_pl_check_divergence(km_pipeline *pl, mpart *p, int64_t now);
/* Ask for that check (after the next source Metadata, whose topic id check comes first). */
void km_pl_want_divergence_check(km_pipeline *pl, mpart *p);

/* ---- machine.c ---- */

void km_pl_tick_soon(km_pipeline *pl);
void km_pl_schedule_in(km_pipeline *pl, int64_t ms);
void km_pl_on_cluster_change(void *arg);
/* "topic-partition", for messages. */
const char *km_pl_ptag(const mpart *p, char *buf, size_t len);
mnode_io *km_pl_node_io(mnode_io **arr, size_t *n, int32_t id, unsigned lane);
/* The same without making one: NULL for a lane never used. */
mnode_io *km_pl_node_io_find(mnode_io *arr, size_t n, int32_t id, unsigned lane);
mtopic *km_pl_topic_get(km_pipeline *pl, const char *name, bool create);
mpart *km_pl_part_get(km_pipeline *pl, mtopic *t, int32_t id, bool create);
void km_pl_update_lag(mpart *p, int64_t now);
/* A source answer (fetch: a Fetch one) came (err KM_OK), or the source could not be reached (err). */
void km_pl_source_contact(km_pipeline *pl, km_err err, bool fetch);
/* The offset map's tail (what describe shows): the acknowledged tail, or none. */
void km_pl_set_tail(km_pipeline *pl, mpart *p, bool set);
/*
 * Readers here are shown nothing from logical on (stored from physical on): the tail the pipeline
 * holds comes down to it when it is past it (reconcile's fence run hides from there:
 * docs/reliability.md, finding 12). A tail at or below it stays.
 */
void km_pl_tail_cap(km_pipeline *pl, mpart *p, int64_t logical, int64_t physical);
void km_pl_backoff(mpart *p);
/* Start over for p: once nothing of it is in flight, reconcile with a fresh producer id. */
void km_pl_reconcile(km_pipeline *pl, mpart *p, const char *why);
/* p goes FAILED: an operator has to look. */
void km_pl_fail_part(km_pipeline *pl, mpart *p, const char *why);
/* Persist runs of p on their own; p waits in RUNS, then goes to phase then. */
void km_pl_run_then(km_pipeline *pl, mpart *p, const km_state_run *r, size_t n, mphase then);

/* ---- reconcile.c ---- */

bool km_pl_send_list_offsets(km_pipeline *pl, mpart *p, bool dest, int64_t ts);
bool km_pl_send_lo(km_pipeline *pl, mpart *p, bool dest, int64_t ts, lo_kind kind);
/* The start position asked of the source: mirror.start.offset (-2 earliest, -1 latest, or a timestamp). */
int64_t km_pl_start_timestamp(const km_pipeline *pl);
/* p's offset map, and its fence run if one is persisted. */
const km_offmap *km_pl_map_of(km_pipeline *pl, const mpart *p, const km_offrun **fence);
/* A Fetch of the one batch holding offset (isolation 1: READ_COMMITTED), answered to cb. */
bool km_pl_one_fetch(km_pipeline *pl, mpart *p, bool dest, int64_t offset, int8_t isolation, km_rpc_cb cb);
/* The same, up to max_bytes of batches from offset on (the first batch comes whole anyway). */
bool km_pl_fetch_from(km_pipeline *pl, mpart *p, bool dest, int64_t offset, int8_t isolation, int32_t max_bytes,
		      km_rpc_cb cb);

#endif
