/*
 * kmirror mirror module: the data plane (docs/mirror.md). Per mirror a pipeline fetches record
 * batches from the source and writes the same batches into the destination as the mirror's own
 * producer, keeping each partition's offset map in the state store; the driver completes the
 * transitions an operator starts once the pipeline has done their work: PREPARING -> MIRRORING
 * after reconcile, PAUSING -> PAUSED and STOPPING -> STOPPED once the partition's writes drained,
 * each persisted by the state store like every change.
 */
#ifndef KMIRROR_MIRROR_H
#define KMIRROR_MIRROR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "kmirror/daemon_config.h"
#include "kmirror/metrics.h"
#include "kmirror/state.h"

typedef struct km_mirror km_mirror;

typedef struct km_mirror_opts {
	struct event_base *base;
	/* The destination: cfg->upstream (bootstrap), its SASL settings, and tls (NULL: plaintext). */
	const km_config *cfg;
	SSL_CTX *tls;
	km_metrics *metrics; /* NULL: none */
	const char *instance; /* names this kmirrord in client ids and producer ids; NULL: the host name */
} km_mirror_opts;

/* opts and what it points to must outlive the module. */
km_mirror *km_mirror_new(const km_mirror_opts *opts);
/*
 * The store whose partitions this module drives (set once, right after km_state_new). NULL
 * detaches the module from a store that outlives it (the store's owner check is unregistered).
 */
void km_mirror_attach(km_mirror *mi, km_state *st);
/* After the store is freed (the store may still call back while it is freed). */
void km_mirror_free(km_mirror *mi);

/*
 * The state store's callbacks (km_state_opts.on_ready and .on_partition, with arg the km_mirror):
 * on_ready picks up partitions left in a transient state by a previous run; on_partition reacts
 * to each committed change. Both only queue work: it runs on a later loop iteration.
 */
void km_mirror_state_ready(void *arg);
void km_mirror_partition_changed(void *arg, const char *mirror, const char *topic, int32_t partition,
				 km_mp_state from, km_mp_state to);

/* ---- destination topics (docs/mirror.md, "Destination topics") ---- */

/*
 * The outcome of a StartMirrorTopics' preparation: code is KM_OK with one result per topic asked,
 * in order (KM_OK: the topic is on the destination now, or was already; else the wire code and a
 * message), or a code for the whole request (then res is NULL). Results live during the call.
 */
typedef void (*km_mirror_prepare_cb)(void *arg, km_err code, const char *message, const km_state_topic_result *res,
				     size_t n);

/*
 * Before the store's start: for each topic missing on the destination, read the source (Metadata
 * for the partition count, DescribeConfigs for the configs set on the topic) and create it on the
 * destination (the source's partitions, the destination's default replication factor, the configs
 * km_mirror_config_copied keeps, compression.type=producer), then wait for its leaders. A topic on
 * the destination already is left as it is, unless it holds records and is in no mirror here: then
 * (not a failback, which the source's kmirrord tells: LastMirroredOffsets) it is refused with
 * TOPIC_ALREADY_EXISTS unless adopt (the start hides those records). A writable topic a client's
 * transaction holds is refused with CONCURRENT_TRANSACTIONS. UNKNOWN_TOPIC_OR_PARTITION when neither side has it;
 * the CreateTopics error otherwise; REQUEST_TIMED_OUT (saying which cluster could not be reached)
 * after 15 s. cb is called once, never from inside this call; at km_mirror_free with
 * MIRROR_STATE_UNAVAILABLE. A mirror that does not exist answers OK: the store refuses it.
 */
void km_mirror_prepare_start(km_mirror *mi, const char *mirror, const char *const *topics, size_t n, bool adopt,
			     km_mirror_prepare_cb cb, void *arg);

/*
 * One question of km_mirror_batches_at: in a destination partition, from offset (the broker's own
 * answer to a ListOffsets by timestamp) on, the first record of a data batch whose timestamp
 * reaches timestamp, below the high watermark (the last stable offset when committed). Control
 * batches are passed over: in a mirror topic they are the mirror's own transaction markers, stamped
 * with the destination's clock. With lat (offset is in a LogAppendTime run) every record of a batch
 * has its MaxTimestamp: the batch's first record (or the log start, when that is inside it)
 * answers. The answer fills code (KM_OK, else a wire code: UNKNOWN_TOPIC_OR_PARTITION,
 * NOT_LEADER_OR_FOLLOWER, OFFSET_OUT_OF_RANGE, REQUEST_TIMED_OUT when the record is further than the
 * search reads), found_offset and found_timestamp (-1 and -1 when no record reaches it), and marker:
 * the first control batch passed over (-1: none). A marker's own time on the source is the source's
 * to tell: then the mirror's source is asked the same question (ListOffsets by timestamp, with the
 * mirror's settings, 1.5 s at most) and source_known, source_offset and source_timestamp hold its
 * answer (a source offset). leader, next and reads are the module's own.
 */
typedef struct km_mirror_batch_q {
	const char *topic;
	int32_t partition;
	int64_t offset;
	int64_t timestamp;
	bool lat, committed;
	km_err code;
	int64_t found_offset, found_timestamp, marker;
	bool source_known;
	int64_t source_offset, source_timestamp;
	int32_t leader;
	int64_t next;
	int reads;
} km_mirror_batch_q;

typedef void (*km_mirror_batches_cb)(void *arg, km_mirror_batch_q *q, size_t n);
/*
 * Search each question's destination partition with kmirrord's own client (client.id
 * kmirrord/<instance>/proxy/lookup; Metadata, then Fetches of up to 1 MiB from the offset on,
 * 16 at most per question): the proxy answers ListOffsets by timestamp on mirror topics with it
 * (docs/mirror.md, "ListOffsets by timestamp"). q stays the caller's and must live until cb, which
 * is called once, never from inside this call, within 5 s; at km_mirror_free with
 * MIRROR_STATE_UNAVAILABLE.
 */
void km_mirror_batches_at(km_mirror *mi, km_mirror_batch_q *q, size_t n, km_mirror_batches_cb cb, void *arg);

/*
 * Whether a source topic config (as DescribeConfigs reports it: name, value, config source) is
 * given to the destination topic the mirror creates. Only values set on the topic itself
 * (DYNAMIC_TOPIC_CONFIG) and not on the never-copied list; *value may be replaced
 * (message.timestamp.type LogAppendTime becomes CreateTime). Pure: the unit tests run it.
 */
bool km_mirror_config_copied(const char *name, int8_t source, const char **value);

/*
 * The source's metadata shows source_partitions for a topic of mirror, more than the store holds:
 * CreatePartitions on the destination up to that count (when it has fewer), then
 * km_state_topic_add_partitions, whose on_partition calls hand the new partitions to the pipeline
 * in PREPARING. Asynchronous and idempotent: a call while one for the same topic and count runs,
 * or for a count the store holds already, does nothing; failures are logged (the next call retries).
 */
void km_mirror_grow(km_mirror *mi, const char *mirror, const char *topic, int32_t source_partitions);

/* ---- metadata sync (docs/mirror.md, "Metadata sync") ---- */

typedef enum {
	KM_SYNC_TOPICS = 0, /* the source's new topics matching mirror.topics.include, started */
	KM_SYNC_CONFIGS,
	KM_SYNC_PARTITIONS,
	KM_SYNC_GROUPS,
	KM_SYNC_ACLS,
	KM_SYNC__COUNT,
} km_sync_kind;

/* "topics", "configs", "partitions", "groups", "acls". */
const char *km_sync_kind_name(km_sync_kind k);

/* One step's status for one mirror, as this kmirrord saw it (in memory only). */
typedef struct km_sync_status {
	int64_t last_sync_ms;   /* when the step last completed (ms since the epoch), -1: never */
	int64_t compared;       /* topics, groups or bindings the last completed step looked at */
	int64_t changes_last;   /* changes it made in the last cycle */
	int64_t changes_total;  /* since kmirrord started */
	int64_t skipped;        /* groups: active on the destination in the last cycle, not synced */
	int64_t errors_total;
	const char *last_error; /* NULL: none; valid until the next call into the module */
	int64_t last_error_ms;  /* -1: none */
} km_sync_status;

/*
 * The status of one step of a mirror's sync. false when this kmirrord has no sync for the mirror
 * (another kmirrord owns it, or it has no synced topic yet): *out then holds the "never" values.
 * *owner (may be NULL) says whether this kmirrord syncs the mirror.
 */
bool km_mirror_sync_status(km_mirror *mi, const char *mirror, km_sync_kind kind, km_sync_status *out, bool *owner);
/*
 * Who runs mirror's pipelines, as <host>@<HTTP listener>: this kmirrord (mirror_pipelines = all),
 * the owner the group __kmirror-sync gives it to (owned; NULL until the group was described), or
 * NULL (none: this kmirrord does not take part). The string lives until the next lease change.
 */
const char *km_mirror_owner(km_mirror *mi, const char *mirror);
/* This kmirrord's name among the others: <host>@<HTTP listener> (its instance record's id). */
const char *km_mirror_self(km_mirror *mi);

/* A mirror's source as the pipeline this kmirrord runs for it last saw it (/healthz). */
typedef struct km_mirror_source {
	const char *mirror;
	bool reachable;        /* the last contact succeeded */
	int64_t since_ms;      /* since when it is reachable, or not (ms since the epoch) */
	int64_t fetched_ms;    /* the source's last Fetch answer (ms since the epoch); 0: none yet */
	const char *error;     /* why the last contact failed ("": it did not) */
} km_mirror_source;
/*
 * The source of the next mirror from *cursor (0 to start) whose pipeline runs here and has
 * contacted its source; false after the last. The strings live until the pipelines change.
 */
bool km_mirror_source_next(km_mirror *mi, size_t *cursor, km_mirror_source *out);

#endif
