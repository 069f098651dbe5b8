/*
 * kmirror state store: the mirror registry, every mirrored partition's state machine, and their
 * persistence in the destination's compacted __mirror_state topic (docs/protocol.md, "State").
 *
 * Every change is persisted before it is acted on: a mutating call validates against the state in
 * memory, writes the new records to __mirror_state (acks=all, as kmirrord's own idempotent
 * producer), and only when the broker has acknowledged them changes the state in memory and calls
 * back. Mutations run one at a time, in the order they were asked for, so two racing callers see
 * each other's outcome. Reads (lookups, iteration) are synchronous and see the committed state.
 */
#ifndef KMIRROR_STATE_H
#define KMIRROR_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "kmirror/daemon_config.h"
#include "kmirror/error.h"
#include "kmirror/metrics.h"
#include "kmirror/offmap.h"
#include "kmirror/options.h"
#include "kmirror/wire.h"

/* A mirrored partition's state (the proposal's state machine). The values are persisted: never renumber. */
typedef enum {
	KM_MP_UNKNOWN = 0,
	KM_MP_PREPARING = 1,
	KM_MP_MIRRORING = 2,
	KM_MP_PAUSING = 3,
	KM_MP_PAUSED = 4,
	KM_MP_STOPPING = 5,
	KM_MP_STOPPED = 6,
	KM_MP_FAILED = 7,
	KM_MP__COUNT,
} km_mp_state;

/* "MIRRORING"; "INVALID" for a value outside the enum. */
const char *km_mp_state_name(km_mp_state s);

/* The operator's requests on topics, and the states each is valid from. */
typedef enum {
	KM_TOPIC_START = 0, /* not mirrored, STOPPED or FAILED -> PREPARING */
	KM_TOPIC_STOP,      /* PREPARING, MIRRORING, PAUSED or FAILED -> STOPPING -> STOPPED */
	KM_TOPIC_PAUSE,     /* MIRRORING -> PAUSING -> PAUSED */
	KM_TOPIC_RESUME,    /* PAUSED -> MIRRORING */
	KM_TOPIC__COUNT,
} km_topic_op;

const char *km_topic_op_name(km_topic_op op); /* "start" */

/*
 * Whether op is valid for a partition in state from (a topic not mirrored at all counts as
 * UNKNOWN). On refusal, *code is the wire error (TOPIC_ALREADY_IN_CLUSTER_MIRROR,
 * MIRROR_TOPIC_NOT_PAUSED, INVALID_CLUSTER_MIRROR_STATES, ...). Pure: the unit tests run the table.
 */
bool km_topic_op_allowed(km_topic_op op, km_mp_state from, km_err *code);
/* The state an allowed op moves a partition to: start PREPARING, stop STOPPING, pause PAUSING, resume MIRRORING. */
km_mp_state km_topic_op_target(km_topic_op op);

/*
 * A TLS client context for the destination as the upstream_tls_* options say: its CAs (a CA file, a
 * PKCS12 truststore, or the system store) and, with identity, kmirrord's own certificate (a PEM
 * pair or a PKCS12 keystore). Client sessions get the context without identity: a client through
 * kmirrord must never present kmirrord's certificate (docs/proxy.md, "TLS and SASL"). NULL with
 * the reason in err.
 */
SSL_CTX *km_state_upstream_tls(const km_config *cfg, bool identity, char *err, size_t errlen);

typedef struct km_state km_state;
typedef struct km_state_mirror km_state_mirror;
typedef struct km_state_topic km_state_topic;

typedef struct km_state_opts {
	struct event_base *base;
	struct evdns_base *dns;
	/*
	 * The destination: cfg->upstream (bootstrap), upstream TLS (tls below) and SASL, and the
	 * mirror_state_* and mirror_secret_key_file options. Read during km_state_new only (copied).
	 */
	const km_config *cfg;
	SSL_CTX *tls;          /* for the destination; NULL: plaintext */
	km_metrics *metrics;   /* NULL: none */
	/* Called once when the state has been read back fully (err KM_OK), or could not be (retrying). */
	void (*on_ready)(void *arg);
	/*
	 * Called each time a reread (after a failed write) has read the state back: the store is
	 * ready again (km_state_ready went false for the reread). on_partition has been told what the
	 * reread changed by then. Whatever waits for the store to be ready must go on here: on_ready
	 * is not called again.
	 */
	void (*on_reread)(void *arg);
	/*
	 * Called once when the state topic cannot be used at all, with a message for the operator (it
	 * exists but is not compacted: docs/state.md, "The state topic's policy"). The store has stopped
	 * for good then: it is not ready, reads nothing more, and refuses every mutation with that
	 * message. Called from the loop, not from inside a store call; the store may be freed from it.
	 * NULL: only logged.
	 */
	void (*on_fatal)(void *arg, const char *message);
	/* Called after every committed change of a partition's state (the mirror's pipelines listen here). */
	void (*on_partition)(void *arg, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
			     km_mp_state to);
	void *arg;
} km_state_opts;

/*
 * Start: connect to the destination, read __mirror_state back to its end (if it exists) and then
 * call on_ready. Until then km_state_ready is false and mutations fail with
 * COORDINATOR_LOAD_IN_PROGRESS. NULL with err set when the options are unusable (for example an
 * unreadable secret key file).
 */
km_state *km_state_new(const km_state_opts *opts, char *err, size_t errlen);
void km_state_free(km_state *st);
/* mirror_secret_key_file as km_state_new reads it (its mode unless !mode_check, a key in it): KM_ERR_CONFIG with err. */
km_err km_state_key_check(const char *path, bool mode_check, char *err, size_t errlen);
bool km_state_ready(const km_state *st);
/* Why the store stopped for good (the message on_fatal got), or NULL while it runs. */
const char *km_state_fatal_message(const km_state *st);

/* ---- the result of a mutation ---- */

/* One topic's outcome in a topic operation. */
typedef struct km_state_topic_result {
	const char *topic;
	km_err code;           /* KM_OK or a wire code */
	const char *message;   /* NULL when ok */
} km_state_topic_result;

typedef struct km_state_result {
	km_err code;           /* top-level: KM_OK or a wire code (UNKNOWN_CLUSTER_MIRROR, MIRROR_STATE_UNAVAILABLE, ...) */
	const char *message;   /* NULL when ok */
	const km_state_topic_result *topics; /* topic operations: one per topic asked, in order */
	size_t ntopics;
} km_state_result;

/* Called once per mutation with its outcome; the result and its strings live only during the call. */
typedef void (*km_state_done_cb)(void *arg, const km_state_result *res);

/* ---- mirrors ---- */

/* One configuration entry of a mirror, as given by the operator (value in clear). */
typedef struct km_state_kv {
	const char *name;
	const char *value;     /* NULL: remove (alter only) */
} km_state_kv;

/*
 * Whether a configuration key holds a secret (sasl.jaas.config, *.password, ...): encrypted at
 * rest, never described, never logged.
 */
bool km_state_config_is_secret(const char *name);
/*
 * A mirror's TLS trust and identity each come from PEM files or from a store, not both: false with
 * why when ssl.ca.location and ssl.truststore.location, or ssl.certificate.location and
 * ssl.keystore.location, are both set (any may be NULL).
 */
bool km_state_config_tls_sources_ok(const char *ca, const char *cert, const char *truststore, const char *keystore,
				    char *why, size_t len);
/*
 * Check a whole mirror configuration (create: the full set; alter: the changes): known keys only
 * (source connection properties and mirror.* options), values of the right type, bootstrap.servers
 * present on create. KM_OK, or INVALID_CLUSTER_MIRROR_CONFIG with err naming the key and why.
 */
km_err km_state_config_check(const km_state_kv *kv, size_t n, bool create, char *err, size_t errlen);

/* A mirror's mirror.* options, parsed (defaults for keys not set). */
typedef struct km_mirror_options {
	int64_t metadata_refresh_interval_ms; /* mirror.metadata.refresh.interval.ms */
	char *groups_include;                 /* mirror.groups.include (comma-separated regexes) */
	char *groups_exclude;                 /* mirror.groups.exclude (comma-separated regexes, "": none) */
	char *acl_include;                    /* mirror.acl.include (rules, see km_acl_scope_parse) */
	int64_t fetch_max_bytes;              /* mirror.fetch.max.bytes */
	int64_t fetch_partition_max_bytes;    /* mirror.fetch.partition.max.bytes */
	bool fetch_sessions;                  /* mirror.fetch.sessions */
	int64_t throttle_bytes_per_sec;       /* mirror.replication.throttled.rate, 0: unlimited */
	char *start_offset;                   /* mirror.start.offset: earliest, latest or a timestamp (ms) */
	char *topics_include;                 /* mirror.topics.include (regex list), NULL: none */
	char *topics_exclude;                 /* mirror.topics.exclude (regex list), NULL: none */
	bool unclean_hide;                    /* mirror.support.unclean.leader.election */
} km_mirror_options;

/* The mirror.* options as a table for the option engine (kmirror/options.h); docs/configuration.md shows it. */
const km_opt_table *km_state_mirror_option_table(void);
/* The options of m (free with km_opt_free(km_state_mirror_option_table(), out)). */
km_err km_state_mirror_options(const km_state_mirror *m, km_mirror_options *out) __attribute__((warn_unused_result));

/* ---- the metadata sync's filters (docs/mirror.md, "Metadata sync"); pure, the unit tests run them ---- */

/*
 * Group names a mirror syncs: include and exclude are comma-separated POSIX extended regexes, each
 * matching the whole name ("" or NULL: none; an empty include matches no name). NULL with err
 * naming the bad pattern when one does not compile.
 */
typedef struct km_name_filter km_name_filter;
km_name_filter *km_name_filter_parse(const char *include, const char *exclude, char *err, size_t errlen);
/* Whether name is matched by some include pattern and by no exclude pattern. */
bool km_name_filter_match(const km_name_filter *f, const char *name);
void km_name_filter_free(km_name_filter *f);

/*
 * The ACL bindings a mirror syncs (mirror.acl.include): rules separated by commas, each
 * `resourceType;resourceName;operation;permissionType;principal`; `*` is any value of a field and
 * trailing fields may be omitted (`TOPIC;orders.*` = `TOPIC;orders.*;*;*;*`). resourceType,
 * operation and permissionType are Kafka's names, case-insensitive (TOPIC, GROUP, CLUSTER,
 * TRANSACTIONAL_ID, DELEGATION_TOKEN, USER; ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE,
 * CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, CREATE_TOKENS, DESCRIBE_TOKENS,
 * TWO_PHASE_COMMIT; ALLOW, DENY); resourceName and principal are POSIX extended regexes matching
 * the whole value. An empty spec (or NULL) holds no binding. NULL with err saying which rule and
 * field is wrong (an unknown name, a bad regex, more than 5 fields, an empty rule among others).
 */
typedef struct km_acl_scope km_acl_scope;
km_acl_scope *km_acl_scope_parse(const char *spec, char *err, size_t errlen);
/*
 * Whether a binding (Kafka's wire codes: resource type 2 TOPIC ... 7 USER, operation 2 ALL ...,
 * permission 2 DENY, 3 ALLOW) is matched by some rule of s.
 */
bool km_acl_scope_match(const km_acl_scope *s, int8_t resource_type, const char *resource_name, int8_t operation,
			int8_t permission, const char *principal);
void km_acl_scope_free(km_acl_scope *s);

/*
 * Create a mirror. Refused with CLUSTER_MIRROR_ALREADY_EXISTS, INVALID_CLUSTER_MIRROR_CONFIG,
 * CLUSTER_MIRROR_SECRET_KEY_MISSING (a secret given and no key configured). The first create
 * creates __mirror_state itself. validate_only: check and answer, persist nothing.
 */
void km_state_create_mirror(km_state *st, const char *name, const km_state_kv *kv, size_t n, bool validate_only,
			    km_state_done_cb done, void *arg);
/* Change options (value NULL removes the key). UNKNOWN_CLUSTER_MIRROR, INVALID_CLUSTER_MIRROR_CONFIG. */
void km_state_alter_mirror(km_state *st, const char *name, const km_state_kv *kv, size_t n, bool validate_only,
			   km_state_done_cb done, void *arg);
/* Delete a mirror with no topic left in any state but STOPPED (CLUSTER_MIRROR_IN_USE otherwise); forgets its partitions. */
void km_state_delete_mirror(km_state *st, const char *name, km_state_done_cb done, void *arg);

/* ---- topics ---- */

/*
 * Apply op to topics of mirror. Each topic is validated on its own (a refused topic does not stop
 * the others): the mirror must exist (else the top-level code is UNKNOWN_CLUSTER_MIRROR), the topic
 * must be in a state op is valid from (per partition: every partition must allow it), and for
 * start the topic must exist on the destination (UNKNOWN_TOPIC_OR_PARTITION otherwise; its
 * partitions and topic id are read from the destination's metadata; the proxy has the mirror
 * module create a missing one first, km_mirror_prepare_start). A topic of another mirror is
 * refused with TOPIC_ALREADY_IN_CLUSTER_MIRROR; stop/pause/resume of a topic this mirror does not
 * hold with TOPIC_NOT_IN_CLUSTER_MIRROR. Messages name the topic, the mirror and the current state.
 */
void km_state_topics(km_state *st, km_topic_op op, const char *mirror, const char *const *topics, size_t n,
		     km_state_done_cb done, void *arg);
/* A start of topics by the mirror's topic patterns (the metadata sync): as KM_TOPIC_START, marked so. */
void km_state_topics_follow(km_state *st, const char *mirror, const char *const *topics, size_t n,
			    km_state_done_cb done, void *arg);

/*
 * Move one partition's state, as the data plane does (PREPARING -> MIRRORING, PAUSING -> PAUSED,
 * MIRRORING -> STOPPING, STOPPING -> STOPPED, anything -> FAILED with error text). Persisted first, like every change.
 */
void km_state_partition_set(km_state *st, const char *mirror, const char *topic, int32_t partition, km_mp_state to,
			    const char *error, km_state_done_cb done, void *arg);
/*
 * The same for n partitions of one topic moving to one state, in one write and one answer (all
 * of them or none): what the data plane uses when many partitions settle at once (a start of a
 * topic with many partitions). on_partition is called for each after the whole write is applied.
 */
void km_state_partitions_set(km_state *st, const char *mirror, const char *topic, const int32_t *partitions,
			     size_t n, km_mp_state to, const char *error, km_state_done_cb done, void *arg);

/*
 * The source topic grew to new_count partitions: partitions the store does not hold yet, below
 * new_count, are added in PREPARING (persisted first, then on_partition for each, from UNKNOWN),
 * which makes the pipeline run them. Idempotent: nothing is written when the store holds them all
 * already. Only for a topic in PREPARING or MIRRORING (INVALID_CLUSTER_MIRROR_STATES otherwise);
 * UNKNOWN_CLUSTER_MIRROR, TOPIC_NOT_IN_CLUSTER_MIRROR, INVALID_REQUEST (a count outside 1..100,000).
 * The destination topic must have the partitions already (km_mirror_grow adds them first).
 */
void km_state_topic_add_partitions(km_state *st, const char *mirror, const char *topic, int32_t new_count,
				   km_state_done_cb done, void *arg);

/*
 * The idempotent producer (pid, epoch) the pipeline writes a partition with from destination
 * offset start on (docs/mirror.md, "Reconcile"): persisted in the partition's record, its state
 * unchanged, before the first write with it, so a later reconcile can tell the mirror's batches
 * from anyone else's. UNKNOWN_CLUSTER_MIRROR, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST.
 */
void km_state_partition_writer(km_state *st, const char *mirror, const char *topic, int32_t partition, int64_t pid,
				int16_t epoch, int64_t start, km_state_done_cb done, void *arg);
/*
 * The source topic's id, first seen by the mirror's pipeline: persisted in every partition's record
 * of the topic (one write; a partition that holds it already is not written again). A source topic
 * with another id later is one deleted and created again (the pipeline fails the partitions).
 */
void km_state_topic_source_id_set(km_state *st, const char *mirror, const char *topic, const km_uuid *id,
				   km_state_done_cb done, void *arg);
/* The source topic's id the topic's partitions hold: the first non-zero one (zero: none seen yet). */
km_uuid km_state_topic_source_id(const km_state_topic *t);
/* Whether a present partition of t holds a source topic id other than id (zero ones aside). */
bool km_state_topic_source_id_differs(const km_state_topic *t, const km_uuid *id);
/* Whether the mirror's topic patterns started t (its partition records' StartedBy), not an operator. */
bool km_state_topic_by_pattern(const km_state_topic *t);
/* Whether a present partition of t holds no source topic id yet. */
bool km_state_topic_source_id_missing(const km_state_topic *t);

/* The persisted writer of partition of t: false when its record names none. */
bool km_state_partition_writer_get(const km_state_topic *t, int32_t partition, int64_t *pid, int16_t *epoch,
				   int64_t *start);

/* ---- offset maps (docs/mirror.md, "The offset map") ---- */

/* One run record to write: a new run, or (physical -1) a tombstone removing the run at logical. */
typedef struct km_state_run {
	const char *topic;
	int32_t partition;
	int64_t logical;          /* the run's first logical offset: the record's key */
	int64_t physical;         /* its first physical offset; -1 removes the run */
	int64_t prev_logical_end; /* closes the run before it; -1 for the first run */
	uint8_t flags;            /* KM_OFFRUN_* */
	int32_t epoch;            /* (progress writes only) the source leader epoch at the tail, -1: not known */
	int64_t open_txn;         /* (progress writes only) km_state_progress.open_txn */
} km_state_run;

/*
 * Persist run records of partitions of one mirror's topics in one write (the write-ahead rule: the
 * run a batch starts is in before the batch is produced), then apply them to the maps in memory,
 * in order, and answer. UNKNOWN_CLUSTER_MIRROR, UNKNOWN_TOPIC_OR_PARTITION (topic not in the
 * mirror, partition out of range), INVALID_REQUEST (a negative logical offset, physical below -1,
 * prev_logical_end outside [-1, logical], more than 10,000 runs), MIRROR_STATE_UNAVAILABLE. All
 * runs are checked before anything is written. DeleteMirror removes a partition's runs with it.
 */
void km_state_runs_write(km_state *st, const char *mirror, const km_state_run *runs, size_t n, km_state_done_cb done,
			 void *arg);
/*
 * A kmirrord as it last reported itself in __mirror_state (record type 3, written by itself every
 * KM_STATE_INSTANCE_REPORT_MS: docs/state.md, "Instances").
 */
#define KM_STATE_INSTANCE_REPORT_MS 10000
typedef struct km_state_instance {
	char *id;             /* <host>@<HTTP listener> */
	int64_t report_ms;    /* when it wrote the record (its clock) */
	int64_t start_ms;
	int64_t state_delay_ms; /* how far behind the state topic its last followed change was applied; -1: none yet */
	char *pipelines;      /* all, owned, none */
	char *version;
	char **owned;         /* mirrors whose pipelines it runs */
	size_t nowned;
} km_state_instance;
/* Write this kmirrord's record (strings copied); done may be NULL. */
void km_state_instance_write(km_state *st, const km_state_instance *in, km_state_done_cb done, void *arg);
/* The instances the store holds (valid until the next change of the model), and how many. */
const km_state_instance *km_state_instances(const km_state *st, size_t *n);
/*
 * The destination consumer group the kmirrords of this state topic share their mirrors through
 * (record type 6, keyed by the configured group: docs/mirror.md, "The sync group moves"). With no
 * record the configured group itself is joined; a kmirrord that could not join it for long writes
 * its next generation here, and every kmirrord follows.
 */
typedef struct km_state_sync_group {
	char *base;         /* the configured group (mirror_sync_group) */
	int32_t generation; /* 0: base itself; N: base.N */
	char *group;        /* the group to join */
	int64_t moved_ms;   /* when it moved there (the writer's clock) */
	char *moved_by;     /* the kmirrord that moved it */
	char *reason;       /* the earlier group's error, for the operator */
} km_state_sync_group;
/*
 * The name of generation gen of sync group base into out: base itself for 0, base.N for N. Its
 * length, or -1 when it does not fit in len.
 */
int km_state_sync_group_name(km_str base, int32_t gen, char *out, size_t len);
/* Whether name is base or one of its generations (base.N). */
bool km_state_is_sync_group(const char *base, const char *name);
/* Write a sync group record (strings copied); done may be NULL. */
void km_state_sync_group_write(km_state *st, const km_state_sync_group *g, km_state_done_cb done, void *arg);
/* The record of configured group base, or NULL when none was written (valid until the model's next change). */
const km_state_sync_group *km_state_sync_group_of(const km_state *st, const char *base);
/* How far behind the state topic the last followed change was applied (ms); -1 when none was. */
int64_t km_state_follow_delay_ms(const km_state *st);

/* The store as /healthz reports it (docs/operations.md, "Health"). */
typedef struct km_state_health {
	bool loaded;            /* __mirror_state was read back */
	const char *fatal;      /* why the store stopped for good; NULL while it runs */
	uint64_t writes, write_failures; /* since the start */
	uint64_t follows;       /* changes of other kmirrords applied by following the topic */
	int64_t follow_delay_ms; /* how far behind the last one was applied; -1: none yet */
} km_state_health;
void km_state_health_get(const km_state *st, km_state_health *out);

/*
 * Writes of a mirror's pipeline (runs, its writer, progress, partition transitions) are made only
 * in the ownership term they were asked in. owner_term says it: 0 while this kmirrord does not run
 * the mirror, otherwise a number that changes each time it loses the mirror and runs it again. It
 * is taken when the write is asked for and checked when the write is about to be sent: one queued
 * before a pause (SIGSTOP, a stalled host) or a loss is dropped, answered
 * MIRROR_STATE_UNAVAILABLE, once the mirror has moved on, even back to this kmirrord, instead of
 * landing after the new owner's, or a later life's, reads (docs/state.md, "Writes of a former
 * owner"). NULL: every write is made.
 */
void km_state_owner_check(km_state *st, uint64_t (*owner_term)(void *arg, const char *mirror), void *arg);

/*
 * A ticket for every write asked for so far; reached once each of them is answered (made,
 * refused or dropped). A mirror gained again waits for it, so that no write of its former life
 * lands after the new life has read the state.
 */
uint64_t km_state_write_ticket(const km_state *st);
bool km_state_write_reached(const km_state *st, uint64_t ticket);

/*
 * The pipeline's progress: for each partition, the logical offset after the last batch the
 * destination acknowledged (the tail), and that batch's source leader epoch. Written as the
 * partition's record with only its last mirrored offset and epoch changed; partitions not in the mirror, not present, or STOPPING / STOPPED are
 * skipped (a stop persists its own). An instance that does not run the partition shows nothing past
 * it (docs/state.md, "What a reader is shown").
 */
typedef struct km_state_progress {
	const char *topic;
	int32_t partition;
	int64_t logical;
	int32_t epoch; /* the source leader epoch of the batch before it (LastMirroredEpoch), -1: not known */
	/*
	 * Where the earliest destination transaction the pipeline holds open starts (logical), -1: none.
	 * Other instances show nothing past it (OpenTransactionOffset: a fence may still abort it).
	 */
	int64_t open_txn;
} km_state_progress;
void km_state_progress_write(km_state *st, const char *mirror, const km_state_progress *items, size_t n,
			     km_state_done_cb done, void *arg);
/*
 * The local pipeline stops holding the partition's tail (it retires, or the partition stops running
 * here): the tail becomes the persisted progress, as on an instance that never ran it.
 */
void km_state_offmap_release(km_state *st, const char *topic, int32_t partition);
/*
 * The local pipeline moved map's tail (km_state_offmap_mut): cb, if one is set, hears it at once.
 * The proxy's Fetch waiting at that tail goes upstream then rather than after its wait
 * (docs/proxy.md, "A Fetch at the tail"). One listener; NULL removes it. map is only compared, never
 * read, by the listener.
 */
typedef void (*km_state_tail_cb)(void *arg, const km_offmap *map);
void km_state_on_tail(km_state *st, km_state_tail_cb cb, void *arg);
void km_state_tail_moved(km_state *st, const km_offmap *map);

/*
 * The offset map of a partition of a mirror topic, NULL when it has none yet (never mirrored).
 * The mutable form is for the mirror module only: it sets the tail (in memory, never persisted);
 * NULL for a topic the store does not hold. The object stays the same while the partition is in
 * the store (a reread after a failed write puts the runs read back into it, the tail kept); a
 * DeleteMirror frees it.
 */
const km_offmap *km_state_topic_offmap(const km_state_topic *t, int32_t partition);
km_offmap *km_state_offmap_mut(km_state *st, const char *topic, int32_t partition);

/*
 * In-memory figures the mirror reports for a partition (describe, /metrics): the source's log end
 * and the records skipped because the source's retention passed the mirror (-1 leaves a figure as
 * it is). Never persisted. The mirrored offset describe shows is the offset map's logical tail
 * while a pipeline runs the partition, else the persisted last mirrored offset.
 */
void km_state_partition_progress(km_state *st, const char *topic, int32_t partition, int64_t source_log_end,
				 int64_t skipped_records);

/* ---- reads (the committed state) ---- */

/* Topics with a partition in any state but STOPPED (0 for NULL): the proxy's cheap "is anything read-only" test. */
size_t km_state_read_only_topics(const km_state *st);
/* The mirror topic named topic (len bytes), or NULL when the topic is not in any mirror. */
const km_state_topic *km_state_topic_find(const km_state *st, const char *topic, size_t len);
/* The same by destination topic id (Produce v13 names topics by id). */
const km_state_topic *km_state_topic_find_id(const km_state *st, const km_uuid *id);

/*
 * Whether a write to this partition of a mirror topic must be refused: any state but STOPPED. A
 * partition the store does not know (added since the start) follows the topic's state.
 */
bool km_state_topic_read_only(const km_state_topic *t, int32_t partition);
const char *km_state_topic_name(const km_state_topic *t);
const km_state_mirror *km_state_topic_mirror(const km_state_topic *t);
/* The topic's state: its partitions' common state, or the first in PREPARING, FAILED, PAUSING, STOPPING order. */
km_mp_state km_state_topic_state(const km_state_topic *t);
size_t km_state_topic_partition_count(const km_state_topic *t);
const km_uuid *km_state_topic_id(const km_state_topic *t);

typedef struct km_state_partition_info {
	int32_t partition;
	km_mp_state state;
	int64_t state_change_ms;
	int64_t last_mirrored_offset;  /* -1: none */
	int32_t last_mirrored_epoch;   /* -1: none */
	int64_t source_log_end;        /* -1: not known (kept in memory only) */
	int64_t source_log_end_ms;     /* when this kmirrord learned it (wall clock ms), -1: not known */
	int64_t skipped_records;       /* lost to the source's retention (kept in memory only) */
	int64_t open_txn_offset;       /* where the earliest open destination transaction starts, -1: none (memory only) */
	const char *last_error;        /* NULL: none */
	int64_t last_error_ms;
	int64_t writer_pid;            /* the pipeline's writer (km_state_partition_writer), -1: none */
	int16_t writer_epoch;
	int64_t writer_start;          /* where its first batch goes, -1: no writer */
	int64_t records_hidden;        /* destination records the offset map hides (km_offmap_hidden) */
	int64_t newest_mirrored_ts;    /* the newest record timestamp mirrored (ms), while this kmirrord runs it; 0: not known */
} km_state_partition_info;

/*
 * The partition's persisted record: its state, last mirrored offset and epoch as written (not the
 * running pipeline's tail). False when the topic has no such partition. epoch may be NULL.
 */
bool km_state_partition_record(const km_state_topic *t, int32_t partition, km_mp_state *state, int64_t *last_mirrored,
			       int32_t *epoch);

/* Partition i (i < km_state_topic_partition_count), in partition order. */
void km_state_topic_partition(const km_state_topic *t, size_t i, km_state_partition_info *out);

const km_state_mirror *km_state_mirror_find(const km_state *st, const char *name);
size_t km_state_mirror_count(const km_state *st);
/* Mirrors in name order. */
const km_state_mirror *km_state_mirror_at(const km_state *st, size_t i);
const char *km_state_mirror_name(const km_state_mirror *m);
/* The source's bootstrap.servers. */
const char *km_state_mirror_source(const km_state_mirror *m);
int64_t km_state_mirror_created_ms(const km_state_mirror *m);
/* Configuration entries in name order; *value is NULL and *secret true for a secret (never returned). */
size_t km_state_mirror_config_count(const km_state_mirror *m);
void km_state_mirror_config_at(const km_state_mirror *m, size_t i, const char **name, const char **value,
			       bool *secret);
/*
 * A secret's clear value, for the mirror's own source connection only (never for describe or
 * logs): decrypted into buf. KM_ERR_INVAL when name is not a stored secret; KM_ERR_DECODE when it
 * does not open for this mirror and KM_ERR_CONFIG without a key, both logged naming the mirror and
 * the key.
 */
km_err km_state_mirror_secret(const km_state *st, const km_state_mirror *m, const char *name, char *buf,
			      size_t len) __attribute__((warn_unused_result));
/* Topics of the mirror in name order. */
size_t km_state_mirror_topic_count(const km_state_mirror *m);
const km_state_topic *km_state_mirror_topic_at(const km_state_mirror *m, size_t i);

/* Whether id is the state topic's id (known once kmirrord has seen the topic in the destination's metadata). */
bool km_state_is_store_topic_id(const km_state *st, const km_uuid *id);
/* The state topic's name (cfg mirror_state_topic): clients never write, delete or reconfigure it through the proxy. */
const char *km_state_topic_name_of_store(const km_state *st);
/*
 * A ticket for the first follow round that starts from now on (docs/state.md, "Following"), and
 * whether such a round has ended with every state partition read to its high watermark: the view
 * then holds every write acknowledged before the ticket was taken, whoever made it.
 */
uint64_t km_state_follow_ticket(const km_state *st);
bool km_state_follow_reached(const km_state *st, uint64_t ticket);
/*
 * Bumped each time the store replaces its model (a load, a reread, a followed change): a topic or
 * mirror handle kept across events is stale once this moved (offset maps stay: they are carried).
 */
uint64_t km_state_model_epoch(const km_state *st);
/* Whether a topic of this name can never be a mirror topic: Kafka's internal ones (__*) and the state topic. */
bool km_state_topic_internal(const km_state *st, const char *name);

#endif
