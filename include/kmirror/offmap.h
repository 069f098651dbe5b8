/*
 * The offset map of one mirrored partition: runs of logical (the source's) offsets stored at
 * physical (the destination's) offsets, and the pipeline's tail (docs/mirror.md, "The offset map").
 * Pure data: the state store keeps and persists one per partition, the proxy translates with it.
 */
#ifndef KMIRROR_OFFMAP_H
#define KMIRROR_OFFMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kmirror/error.h"

/*
 * One run as persisted: logical offsets from logical on are stored at physical offsets from
 * physical on. prev_logical_end closes the run before it (the logical offset after its last
 * record). The first run has none to close: its prev_logical_end is where mirroring began when
 * that is before its first record (the source's log start, followed by a hole: records compacted
 * away), else -1. A run's length is the next run's prev_logical_end - logical; the
 * last run is open.
 */
typedef struct km_offrun {
	int64_t logical;
	int64_t physical;
	int64_t prev_logical_end;
	uint8_t flags; /* KM_OFFRUN_* */
} km_offrun;

enum {
	/*
	 * The run's batches were LogAppendTime on the source and are stored as CreateTime with the
	 * append time as their MaxTimestamp: readers through the proxy get the attribute back.
	 */
	KM_OFFRUN_LOG_APPEND_TIME = 0x01,
	/*
	 * Written before the partition's destination transactions are aborted (reconcile, stop): from
	 * its logical start on, what the destination held is hidden; its physical start is a lower
	 * bound until the abort markers are in, then the run is written again without the flag.
	 */
	KM_OFFRUN_FENCE = 0x02,
};

typedef struct km_offmap {
	km_offrun *runs; /* sorted by logical (and then by physical: both increase) */
	size_t n, cap;
	/*
	 * The tail, in memory only: the local pipeline's while it runs the partition (tail_held), else
	 * the persisted progress of whoever runs it (the store sets it: docs/state.md, "What a reader
	 * is shown"); -1 when neither is known (nothing mirrored yet, or the topic is STOPPED).
	 */
	int64_t tail_physical, tail_logical;
	int32_t tail_epoch; /* the source leader epoch of the batch before the tail; -1: not known */
	int64_t tail_ts;    /* the newest record timestamp mirrored (ms), local pipeline only; 0: not known */
	/* Where the earliest destination transaction the pipeline holds open starts (logical); -1: none. */
	int64_t open_txn_logical;
	bool tail_held; /* the local pipeline holds the tail: the store leaves it alone */
} km_offmap;

void km_offmap_init(km_offmap *m);
void km_offmap_free(km_offmap *m);

/*
 * Add a run (keeps the runs sorted; loading from the store adds them in any order). A run with
 * the same logical start replaces the one there. KM_ERR_INVAL for negative offsets;
 * KM_ERR_NOMEM.
 */
km_err km_offmap_add(km_offmap *m, int64_t logical, int64_t physical, int64_t prev_logical_end, uint8_t flags)
	__attribute__((warn_unused_result));
/* Remove the run starting at logical; false when there is none. */
bool km_offmap_remove(km_offmap *m, int64_t logical);
/*
 * The run index holding logical offset L, or -1 (a hole, or no run). While the tail is set the
 * open run ends at it: offsets past it (a trailing hole, or not mirrored yet) are in no run.
 */
ssize_t km_offmap_find_logical(const km_offmap *m, int64_t logical);

/* The length of run i: -1 for the open (last) run. */
int64_t km_offmap_run_length(const km_offmap *m, size_t i);
/*
 * Destination records the map hides between its runs (a drill's local tail, a foreign writer's,
 * what reconcile left behind): the physical offsets after a run's end and before the next run.
 */
int64_t km_offmap_hidden(const km_offmap *m);
/*
 * Run i (i >= 1) starts past physical end, a run of batches that never landed, and by its
 * prev_logical_end the run before it ends below end: the range between is hidden by run i alone,
 * so removing run i would show it (a stop's seal written over the run that hid earlier seals,
 * then lost: docs/reliability.md, finding 34).
 */
bool km_offmap_hides_before(const km_offmap *m, size_t i, int64_t end);
/*
 * The prev_logical_end for a run written at logical `at` over what m holds from there on: where the
 * run before ends. A run of m starting at `at` already says it, which may be below `at` (a source
 * offset passed as a hole just before it, a marker of a transaction with no record here): that
 * is kept, or the run before would take the hole and show the next record one offset early
 * (docs/reliability.md, finding 39). Otherwise `at` (the run before goes on to it).
 */
int64_t km_offmap_prev_end_at(const km_offmap *m, int64_t at);

/*
 * Logical fetch offset -> the physical offset to fetch from: in a run, the same distance into it;
 * in a hole, the next run's start; below every run, the first run's start; at or past the logical
 * tail (when set), the physical tail. With no run: the physical tail, or (no tail either: nothing
 * was mirrored, no pipeline) the offset itself. Negative input: -1 (as for the two below).
 */
int64_t km_offmap_to_physical(const km_offmap *m, int64_t logical);
/*
 * Physical record offset (a batch's baseOffset, a ListOffsets answer) -> logical: in a run, the
 * same distance into it; hidden (between runs, before the first), the next run's logical start;
 * past the open run's end (the tail set), the logical tail; with no run, the logical tail up to
 * the physical tail (what is there is hidden), past it -1, or (no tail either: nothing mirrored,
 * no pipeline) the offset itself.
 */
int64_t km_offmap_to_logical(const km_offmap *m, int64_t physical);
/*
 * Whether the runs put a tail (the physical offset after the last batch landed, the logical one
 * the mirror goes on from) where it is: a run starts there at that logical offset, or the run below
 * it reaches it (a run that starts there at another offset is one persisted ahead of its batch).
 * False when the tail passed holes whose run is not in the map: every other instance would map a
 * progress there elsewhere. With no run below it: true.
 */
bool km_offmap_maps_tail(const km_offmap *m, int64_t physical, int64_t logical);
/*
 * Physical "next offset" (high watermark, last stable offset, log start offset) -> logical: the
 * physical tail gives the logical tail; at or before the first run, where mirroring began (the
 * first run's prev_logical_end, when set); otherwise as km_offmap_to_logical.
 */
int64_t km_offmap_next_to_logical(const km_offmap *m, int64_t physical);
/*
 * Physical end offset of a leader epoch (OffsetForLeaderEpoch's EndOffset, a Fetch's
 * DivergingEpoch.EndOffset) -> logical: a bound a client compares its position with, taking a
 * position past it for a truncated log. At or before the physical tail (or with no tail), as
 * km_offmap_next_to_logical. Past the tail the records are there all the same, and a client may
 * have read them (through the kmirrord that runs the partition, whose tail is ahead of the
 * persisted progress here, or through this one before a restart): translated by a run that
 * starts at or past the tail (persisted ahead of its batch), else as the mirror's next records
 * from the logical tail on; never below the logical tail. Negative input: -1.
 */
int64_t km_offmap_end_to_logical(const km_offmap *m, int64_t physical);

#endif
