/*
 * The batch plan (docs/mirror.md, "The batch plan"): where each fetched batch of a partition lands
 * on the destination, the offset-map runs it starts, and its re-stamped header. Pure code over
 * bytes: no sockets, no pipeline; unit tests drive it with batches they build.
 */
#ifndef KMIRROR_MIRROR_PLAN_H
#define KMIRROR_MIRROR_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>

#include "kmirror/batch.h"
#include "kmirror/error.h"
#include "kmirror/state.h"

/* The largest batch decompressed or re-encoded here. */
#define MAX_BATCH_BYTES (64 << 20)

/*
 * The bytes of fetched responses a mirror holds: shared by the pipeline and its responses, since
 * a response's last reference may go after the pipeline (the client releases pieces late).
 */
typedef struct mheld {
	size_t bytes;
	int refs;
} mheld;

/* A fetched response, held while batches that reference its bytes are written. */
typedef struct mresp {
	struct evbuffer *buf;
	int refs;
	size_t size;
	mheld *held;
} mresp;

typedef struct mbatch {
	struct mbatch *next;
	mresp *resp;      /* the record bytes live in resp->buf's chains (vec below) */
	size_t size;      /* the whole batch, 12 + batchLength */
	uint8_t *own;     /* or in own (a re-encoded piece), own_len bytes */
	size_t own_len;
	struct evbuffer_iovec *vec; /* the record bytes (from 61 on) in resp->buf's chains, found once */
	int nvec;
	uint8_t hdr[KM_BATCH_HEADER_SIZE]; /* re-stamped header */
	/* As the source sent it: the CRC and the header bytes it covers, for crc_refs to patch (src_known). */
	uint8_t src_hdr[KM_BATCH_HEADER_SIZE - KM_BATCH_OFF_ATTRIBUTES];
	uint32_t src_crc;
	bool src_known;
	int64_t logical;  /* first logical offset */
	int32_t count;    /* lastOffsetDelta + 1 */
	int64_t physical; /* where it must land */
	int64_t max_ts;
	int32_t epoch;    /* the source batch's partition leader epoch (LastMirroredEpoch once it landed) */
	bool lat;         /* LogAppendTime at the source: hdr made CreateTime (its run says so) */
	bool sent;
	uint8_t kind;     /* BK_* */
	bool commit;      /* BK_MARKER: the source's marker commits (else aborts) */
	int txi;          /* BK_TXN, BK_MARKER: the partition's transactional producer (mpart.tx) */
	uint8_t mk;       /* BK_MARKER: MK_* */
	int64_t mk_at;    /* BK_MARKER: when the landing is asked again */
	int64_t mk_since; /* BK_MARKER: when it was first driven at the head, or its EndTxn sent (0: not yet) */
} mbatch;


/* What a planned batch is (mbatch.kind). */
enum {
	BK_DATA,   /* written by the mirror's idempotent producer */
	BK_TXN,    /* a source transaction's data: written inside a destination transaction (mpart.txn) */
	BK_MARKER, /* a source COMMIT/ABORT marker: the destination transaction ends, its marker lands here */
	BK_SEAL,   /* a stop's seal: one record of the writer's epoch, hidden by its run (km_pl_seal) */
};

/* A marker's progress (BK_MARKER): its destination transaction ending, then its landing. */
enum {
	MK_WAITING,  /* everything before it is not in yet */
	MK_ENDING,   /* EndTxn sent (km_txp_end) */
	MK_ASKED,    /* the destination's log end asked: has the coordinator's marker landed? */
};

/* The runs a plan starts, collected over one fetched answer (persisted before its batches go). */
typedef struct runs_acc {
	km_state_run *runs;
	size_t n, cap;
} runs_acc;

/* One partition's plan: the logical tail fetched, the run open at the physical tail planned, the queue. */
typedef struct mplan {
	const char *topic;      /* named by its runs (the pipeline's own string: runs are matched by pointer) */
	int32_t partition;
	int64_t fetch_logical;  /* the logical tail: the next offset to fetch */
	int32_t fetch_epoch;    /* the source leader epoch of the last batch taken, a hole too (-1: none) */
	int64_t cont_logical;   /* the logical offset that continues the open run at phys; -1: a run must start */
	bool cont_lat;          /* the open run is a LogAppendTime one (a batch of the other kind starts a run) */
	int64_t phys;           /* where the next planned batch lands */
	int64_t first_logical;  /* where a fresh start began (the source's answer), -1: resumed from runs */
	int64_t pid;            /* the mirror's idempotent producer: data batches are stamped with it */
	int16_t epoch;
	int32_t seq;
	bool stop_answer;       /* it holds PLAN_MARKERS_AHEAD markers: the rest of this answer is not taken */
	mbatch *head, *tail;    /* planned, unsent or in flight, in order */
} mplan;

/*
 * Markers a partition's plan holds at most: the transactions behind a marker are planned (their
 * destination transactions begin) while it ends, up to the second marker.
 */
#define PLAN_MARKERS_AHEAD 2

/* What a transaction's slot is asked for (mplan_env.txn). */
typedef enum mtx_use {
	MTX_BATCH,  /* a data batch: the slot of the producer's open transaction, a new lease when none */
	MTX_MARKER, /* its marker: the slot of that transaction, which is over (a later batch is another's) */
} mtx_use;

/* What the plan asks of its owner. */
typedef struct mplan_env {
	/*
	 * The slot of the destination transactional producer carrying source producer src_pid's open
	 * transaction (for MTX_BATCH a new lease when none is open, its first batch at logical); -1:
	 * none (or no memory).
	 */
	int (*txn)(void *arg, int64_t src_pid, int64_t logical, mtx_use use);
	void *arg;
	bool no_txn; /* the destination cannot carry transactions (it has no ListTransactions) */
} mplan_env;

/* The markers q holds (at most PLAN_MARKERS_AHEAD). */
static inline int km_plan_markers(const mplan *q)
{
	int n = 0;
	for (const mbatch *b = q->head; b; b = b->next)
		n += b->kind == BK_MARKER;
	return n;
}

void km_plan_held_unref(mheld *h);
/* A release of a piece referencing a response (arg: the mresp). */
void km_plan_resp_unref(void *arg);
void km_plan_batch_free(mbatch *b);
/*
 * Take one fetched batch of the plan's partition: its 61-byte header in h, the whole batch (size
 * bytes) at at in resp. It is planned (queued, re-stamped, CRC done; a run pushed to ra when it
 * does not continue the open one), split when compaction left gaps in it, planned as a marker when
 * it ends a carried transaction, or passed over as a hole. Not KM_OK: the partition cannot go on
 * (*fail says why when the source's data is to blame).
 */
km_err km_plan_take(mplan *q, const mplan_env *env, mresp *resp, const struct evbuffer_ptr *at, size_t size,
		    const uint8_t *h, runs_acc *ra, const char **fail) __attribute__((warn_unused_result));
/* A transaction's batch stamped with its destination producer (id, epoch, the partition's next sequence). */
km_err km_plan_stamp_txn(mbatch *b, int64_t pid, int16_t epoch, int32_t seq) __attribute__((warn_unused_result));
/* Drop the batches not sent yet (what is in flight stays, in order). */
void km_plan_drop_unsent(mplan *q);

#endif
