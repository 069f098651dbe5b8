/* The state store's internals shared by its files and its unit tests: the model, record codec, secrets, persistence. */
#ifndef KMIRROR_STATE_INT_H
#define KMIRROR_STATE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/time.h>

#include "kmirror/clock.h"
#include "kmirror/state.h"

/* ---- __mirror_state records (docs/state.md) ---- */

enum {
	KM_STATE_REC_MIRROR = 0,    /* key: MirrorStateMirrorKey v0 */
	KM_STATE_REC_PARTITION = 1, /* key: MirrorStatePartitionKey v0 */
	KM_STATE_REC_RUN = 2,       /* key: MirrorStateRunKey v0 (an offset map run) */
	KM_STATE_REC_INSTANCE = 3,  /* key: MirrorStateInstanceKey v0 (a kmirrord's own report) */
	KM_STATE_REC_PROGRESS = 4,  /* key: MirrorStateProgressKey v0 (a pipeline's progress on a partition) */
	KM_STATE_REC_WRITER = 5,    /* key: as MirrorStateProgressKey v0 (a partition's writer) */
	KM_STATE_REC_SYNC_GROUP = 6, /* key: MirrorStateSyncGroupKey v0 (the group the kmirrords share mirrors through) */
};

#define KM_STATE_MAX_NAME 249         /* a Kafka topic name's limit; mirror names share it */
#define KM_STATE_MAX_CONFIGS 256      /* entries of one mirror */
#define KM_STATE_MAX_VALUE 65536      /* bytes of one configuration value */
#define KM_STATE_MAX_PARTITIONS 100000 /* of one mirrored topic */
#define KM_STATE_MAX_RUNS_WRITE 10000  /* run records of one km_state_runs_write (one Produce round) */
#define KM_STATE_DELETE_CHUNK 4096     /* run tombstones per write when a mirror is deleted */
#define KM_STATE_DELETE_BYTES (256 << 10) /* and their key bytes: under a broker's 1 MB batch limit */

/* One decoded record key. Strings borrow from the key bytes. */
typedef struct km_state_key {
	int16_t type;
	km_str mirror;
	km_str topic;       /* partition and run records */
	int32_t partition;  /* partition and run records */
	int64_t logical;    /* run records: the run's logical start */
	km_str instance;    /* instance records: the kmirrord's id */
	km_str group;       /* sync group records: the configured group (mirror_sync_group) */
} km_state_key;

/* Encode a key (type + the v0 key struct) into w. */
void km_state_key_encode(km_wr *w, const km_state_key *k);
/* Decode a key; KM_ERR_DECODE on bytes left over, an unknown type or bad names. */
km_err km_state_key_decode(const uint8_t *p, size_t len, km_state_key *k) __attribute__((warn_unused_result));
/* The partition of the state topic a key goes to: murmur2 of its bytes (as Kafka's default partitioner) mod n. */
int32_t km_state_key_partition(const uint8_t *key, size_t len, int32_t n);
uint32_t km_state_murmur2(const uint8_t *p, size_t len);

/*
 * Whether the data plane may move a partition from -> to (km_state_partitions_set): PREPARING ->
 * MIRRORING, PAUSING -> PAUSED, MIRRORING -> STOPPING (the source topic deleted), STOPPING ->
 * STOPPED, anything mirrored but STOPPED -> FAILED, or the same state again. Checked against the committed state when the write runs, not when it was
 * asked: an operator's stop queued ahead of a driver's PREPARING -> MIRRORING must win.
 */
bool km_state_settle_allowed(km_mp_state from, km_mp_state to);

/* ---- the in-memory model ---- */

typedef struct km_state_cfg_entry {
	char *name;
	char *value;        /* plain values; NULL for a secret */
	uint8_t *sealed;    /* secrets: sealed (km_state_seal), either format */
	size_t sealed_len;
} km_state_cfg_entry;

typedef struct km_state_part {
	km_mp_state state;
	int64_t state_change_ms;
	int64_t last_mirrored_offset;
	int32_t last_mirrored_epoch;
	/* With the progress: where its earliest open destination transaction starts (has_open_txn). */
	bool has_open_txn;
	int64_t open_txn_offset;
	int64_t source_log_end;
	int64_t source_log_end_ms; /* when source_log_end was learned (wall clock), 0: never */
	const char *last_error; /* rec's or prog's error below (part_resolve), not owned */
	int64_t last_error_ms;
	bool present;       /* a record exists for this index */
	/*
	 * The offset map (NULL until a run record or km_state_offmap_mut makes one). Allocated on its
	 * own so that it stays where it is when parts grows and across a reload: the mirror module
	 * holds it.
	 */
	km_offmap *map;
	int64_t skipped_records; /* in memory only, like source_log_end */
	/* The pipeline's writer (docs/mirror.md, "Reconcile"): persisted before its first write. */
	bool has_writer;
	int16_t writer_epoch;
	int64_t writer_pid, writer_start;
	km_uuid source_id; /* the source topic's id as the mirror first saw it (zero: not yet) */
	bool by_pattern;   /* started by the mirror's topic patterns, not an operator */
	int64_t started_ms; /* when the partition was last started (-1: a record of an older kmirrord) */
	/*
	 * Progress apart (docs/state.md, "The runner's record"): last_mirrored_* and the open
	 * transaction above are the figures that stand, the progress record's while it matches the
	 * partition record (progress_apart, the same topic id and state change time), else the
	 * partition record's own (rec).
	 */
	bool progress_apart;
	/*
	 * The runner's record (prog) also holds what the runner settles (the state it moves the
	 * partition to under the partition record, its error) and the source topic's id, and the writer
	 * record (wrec) its writer: state, state_change_ms, last_error, has_writer and source_id above
	 * are resolved from the three (part_resolve), so that no write of the runner rewrites the
	 * operator's record (docs/state.md, "The runner's record").
	 */
	struct {
		km_mp_state state;
		int64_t state_change_ms;
		char *error; /* owned */
		int64_t error_ms;
		km_uuid source_id;
		int64_t offset, open_txn;
		int32_t epoch;
		int64_t run_logical, run_prev_end; /* as prog's below */
		int64_t writer_pid, writer_start; /* the record's writer (writer_start -1: none) */
		int16_t writer_epoch;
	} rec;
	struct {
		bool has;
		km_uuid topic_id;
		int64_t state_change_ms, offset, open_txn;
		int32_t epoch;
		/* The last run its writer had at or before offset (its logical start, its previous end), -1: none said. */
		int64_t run_logical, run_prev_end;
		/* What the runner settled under the partition record of state_change_ms (UNKNOWN: nothing). */
		km_mp_state state;
		int64_t settled_ms;
		char *error; /* owned */
		int64_t error_ms;
		km_uuid source_id; /* zero: not said */
	} prog;
	/* The writer record (type 5): it stands whatever the partition record says, while of the topic. */
	struct {
		bool has;
		km_uuid topic_id;
		int64_t started_ms; /* the partition record's started_ms it was taken under */
		int64_t pid, start;
		int16_t epoch;
	} wrec;
	/* The run the figures that stand need (part_resolve: prog's or rec's); need_run false: none said. */
	bool need_run;
	int64_t need_run_logical, need_run_prev_end;
} km_state_part;

struct km_state_topic {
	char *name;
	km_state_mirror *mirror;
	km_uuid id;
	km_state_part *parts; /* dense by index; entries without a record are !present */
	size_t nparts;
	km_state_topic *name_next, *id_next; /* hash chains */
	uint32_t name_hash;
};

struct km_state_mirror {
	char *name;
	int64_t created_ms, modified_ms;
	km_state_cfg_entry *cfg; /* sorted by name */
	size_t ncfg;
	km_state_topic **topics; /* sorted by name */
	size_t ntopics;
};

/* The registry: mirrors by name, topics hashed by name and by id. */
typedef struct km_state_model {
	km_state_mirror **mirrors; /* sorted by name */
	size_t nmirrors;
	km_state_instance *instances; /* as each kmirrord last reported itself, in record order */
	size_t ninstances;
	km_state_sync_group *sync_groups; /* one per configured group that moved, in record order */
	size_t nsync_groups;
	km_state_topic **by_name, **by_id;
	size_t nbuckets;
} km_state_model;

void km_state_model_init(km_state_model *m);
void km_state_model_free(km_state_model *m);
km_state_mirror *km_state_model_mirror(km_state_model *m, const char *name);
km_state_topic *km_state_model_topic(const km_state_model *m, const char *name, size_t len);
/*
 * Apply one record (value NULL: tombstone) as load and commit both do. A partition record of an
 * unknown mirror is ignored (its mirror was deleted). *changed reports a partition state change
 * (from/to) for on_partition. KM_ERR_DECODE on a record that does not parse, KM_ERR_NOMEM.
 */
typedef struct km_state_change {
	const char *mirror, *topic; /* valid until the next apply */
	int32_t partition;
	km_mp_state from, to;
	bool changed;
} km_state_change;
km_err km_state_model_apply(km_state_model *m, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
			    bool tombstone, km_state_change *chg) __attribute__((warn_unused_result));
/*
 * Whether a runner's record (type 4) read for a partition, nv, is not to replace the one kept for
 * its key, cv: written under an earlier partition record than cv (its change time lower: every
 * partition record's is later than the one it replaces), of the same topic. A former owner's write
 * held in a cut link and delivered late is such a record; it would take the current runner's
 * settle away (docs/state.md, "Writes of a former owner"). Values as stored (NULL: a tombstone).
 */
bool km_state_progress_stale(const uint8_t *cv, size_t clen, const uint8_t *nv, size_t nlen);
/*
 * A stale runner's record of key arrived after the one kept (val), for a partition that is settled
 * (STOPPED, PAUSED, FAILED: no runner writes its record again): the kmirrord that runs the key's
 * mirror writes the kept record again, as it is, so that it is the last of its key in the log and
 * the topic's compaction keeps it, not the stale one (docs/state.md, "Writes of a former owner").
 * Nothing while the store is not ready (the load).
 */
void km_state_rewrite_kept(km_state *st, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen);
/* The present partition k names (its mirror's topic, in range), its topic in *t; NULL: none. */
km_state_part *km_state_model_keyed_part(km_state_model *m, const km_state_key *k, km_state_topic **t);
const km_state_topic *km_state_model_topic_id(const km_state_model *m, const km_uuid *id);
/*
 * Every partition whose state differs between old and now (UNKNOWN where a model holds no record
 * for it), names copied; *out is freed with km_state_changes_free. KM_ERR_NOMEM leaves those found.
 */
km_err km_state_model_diff(const km_state_model *now, const km_state_model *old, km_state_change **out, size_t *n);
void km_state_changes_free(km_state_change *c, size_t n);
/* Rebuild the topic hashes (after applies). */
km_err km_state_model_index(km_state_model *m) __attribute__((warn_unused_result));
/* Entry partition of t, growing parts (entries without a record) as needed; NULL when out of range or memory. */
km_state_part *km_state_model_part(km_state_topic *t, int32_t partition);
/*
 * After a reload: what lives in memory only moves from the old model to the new one, for every
 * partition both hold (same mirror, topic, index): the offset map objects (the new runs put into
 * the old object, so the pointers the mirror module holds and its tails stay), source_log_end and
 * skipped_records. to must be indexed. Maps of partitions the new model lacks stay in from.
 */
void km_state_model_carry(km_state_model *to, km_state_model *from);
/*
 * The tail of a partition no local pipeline holds: the persisted progress (last mirrored offset)
 * through its runs, so that nothing past what the pipeline reported is shown; none (-1) while the
 * partition is STOPPED (local writes after a stop continue its offsets) or has no progress or run.
 */
void km_state_part_bound(km_state_part *p);
/* The same for every partition of a mirror, of the model. */
void km_state_mirror_bound(km_state_mirror *mi);
void km_state_model_bound(km_state_model *m);
/* Runs of a mirror's partitions held in memory (what its delete must tombstone). */
size_t km_state_model_mirror_runs(const km_state_mirror *mi);

/* A NUL-terminated copy of s (NULL for a null string or no memory). */
char *km_state_dup_str(km_str s);
/* Instance records (instances.c): apply one, encode one's value, free the model's. */
km_err km_state_instance_apply(km_state_model *m, km_str id, const uint8_t *val, size_t vlen, bool tomb);
km_err km_state_instance_value_encode(km_wr *w, const km_state_instance *in);
void km_state_instances_free(km_state_model *m);
/* Sync group records (instances.c): apply one, encode one's value. km_state_instances_free frees them too. */
km_err km_state_sync_group_apply(km_state_model *m, km_str base, const uint8_t *val, size_t vlen, bool tomb);
km_err km_state_sync_group_value_encode(km_wr *w, const km_state_sync_group *g);
const km_state_sync_group *km_state_model_sync_group(const km_state_model *m, const char *base);

/* Values: int16 version (0) + the value struct. */
km_err km_state_mirror_value_encode(km_wr *w, const km_state_mirror *mi);
km_err km_state_partition_value_encode(km_wr *w, const km_state_topic *t, const km_state_part *p);
km_err km_state_run_value_encode(km_wr *w, int64_t physical, int64_t prev_logical_end, uint8_t flags);
/* A pipeline's progress on partition p of t, under p's record as it stands (its topic id and state change time). */
km_err km_state_progress_value_encode(km_wr *w, const km_state_topic *t, const km_state_part *p, int64_t offset,
				      int32_t epoch, int64_t open_txn);
/* A partition's writer record (type 5) for topic t. */
km_err km_state_writer_value_encode(km_wr *w, const km_state_topic *t, int64_t started_ms, int64_t pid, int16_t epoch,
				    int64_t start);

/*
 * ---- secrets: AES-256-GCM, 12-byte nonce, 16-byte tag (docs/state.md, "Secrets") ----
 *
 * Format 1 (written now): version byte 1, nonce, ciphertext, tag; the associated data is the version
 * and the mirror's and the key's names (a value opens only in the mirror and under the key it was
 * sealed for). Format 0 (read only; kmirrord before formats): nonce, ciphertext, tag; the associated
 * data is the key's name alone.
 */

#define KM_STATE_KEY_BYTES 32
#define KM_STATE_NONCE_BYTES 12
#define KM_STATE_TAG_BYTES 16
#define KM_STATE_SEAL_V1 1
#define KM_STATE_SEAL_OVERHEAD (1 + KM_STATE_NONCE_BYTES + KM_STATE_TAG_BYTES) /* of format 1 */

/*
 * Read a key file: 32 raw bytes, or 64 hex digits with an optional trailing newline. A file group or
 * others may read is refused when mode_check (secret_file_mode_check); otherwise *loose_mode is set
 * and err holds the warning to log.
 */
km_err km_state_key_load(const char *path, bool mode_check, uint8_t key[KM_STATE_KEY_BYTES], bool *loose_mode,
			 char *err, size_t errlen) __attribute__((warn_unused_result));
/* Seal clear text for mirror's key name in format 1; *out (malloc'd) = version + nonce + ciphertext + tag. */
km_err km_state_seal(const uint8_t key[KM_STATE_KEY_BYTES], const char *mirror, const char *name, const char *clear,
		     uint8_t **out, size_t *outlen) __attribute__((warn_unused_result));
/*
 * Open a value of mirror's key name, of either format (*legacy, if not NULL, set for format 0: seal
 * it again). KM_ERR_DECODE when no tag verifies (another mirror, another key name, another key
 * file, altered bytes) or the input is short; KM_ERR_TOO_LARGE when buf cannot hold the text.
 */
km_err km_state_open(const uint8_t key[KM_STATE_KEY_BYTES], const char *mirror, const char *name,
		     const uint8_t *sealed, size_t len, char *buf, size_t buflen, bool *legacy)
	__attribute__((warn_unused_result));
/*
 * A value of format 0 sealed again in format 1 for mirror: *out (malloc'd) set then, NULL when the
 * value already is of format 1. Not KM_OK when it does not open (the caller keeps it as it is).
 */
km_err km_state_reseal(const uint8_t key[KM_STATE_KEY_BYTES], const char *mirror, const char *name,
		       const uint8_t *sealed, size_t len, uint8_t **out, size_t *outlen)
	__attribute__((warn_unused_result));

/* ---- the store (store.c) and its persistence (persist.c) ---- */

#include "kmirror/log.h"

/* One record to write: key bytes and value bytes (NULL for a tombstone), owned. */
typedef struct km_state_rec {
	uint8_t *key, *val;
	size_t klen, vlen;
} km_state_rec;

/* A destination topic as Metadata describes it, for start. */
typedef struct km_state_topic_meta {
	int16_t error;       /* Kafka code: UNKNOWN_TOPIC_OR_PARTITION, ... */
	km_uuid id;
	int32_t partitions;
} km_state_topic_meta;

typedef struct km_state_persist km_state_persist;
typedef struct km_state_mut km_state_mut;

/* ---- metrics (counters.c): plain fields, read by the registry at render time ---- */

#define KM_STATE_WRITE_BUCKETS 12
extern const double km_state_write_bounds[KM_STATE_WRITE_BUCKETS];

typedef struct km_state_counters {
	uint64_t writes, write_failures;
	uint64_t write_bucket[KM_STATE_WRITE_BUCKETS], write_count;
	double write_sum;
	uint64_t loads, records_loaded, load_ms, ready;
	uint64_t follows, follow_bucket[KM_STATE_WRITE_BUCKETS], follow_count;
	double follow_sum;
	int64_t follow_last_ms; /* the last followed change's delay (-1: none yet) */
	uint64_t mirrors, topics, partitions[KM_MP__COUNT]; /* gauges, recounted on every change */
} km_state_counters;

/* One write's outcome: ok with its latency, or a failure for good. */
void km_state_counters_write(km_state_counters *c, bool ok, double seconds);
/* A change another kmirrord wrote, applied delay_s after it was written (-1: not known). */
void km_state_counters_follow(km_state_counters *c, double delay_s);
/* The gauges from the committed model. */
void km_state_counters_count(km_state_counters *c, const km_state_model *m);
/* Add the families to reg (once per registry; the counters must outlive its rendering). */
km_err km_state_counters_register(km_state_counters *c, km_metrics *reg) __attribute__((warn_unused_result));

struct km_state {
	struct event_base *base;
	struct evdns_base *dns;
	km_config cfg;
	SSL_CTX *tls;
	km_metrics *metrics;
	km_state_counters ctr;
	uint64_t model_epoch;                /* km_state_model_epoch */
	struct timeval write_start;          /* of the head mutation's write */
	void (*on_ready)(void *arg);
	void (*on_reread)(void *arg);
	uint64_t (*owner_term)(void *arg, const char *mirror); /* km_state_owner_check */
	void *owner_term_arg;
	uint64_t submitted, finished;        /* mutations queued and answered since the start (km_state_write_ticket) */
	void (*on_partition)(void *arg, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
			     km_mp_state to);
	void (*on_fatal)(void *arg, const char *message);
	void *arg;
	km_state_tail_cb on_tail;            /* km_state_on_tail */
	void *tail_arg;
	char fatal[1024];                    /* why the store stopped for good (km_state_fatal); "" while it runs */
	bool fatal_told;                     /* on_fatal has been called */
	bool have_key;
	uint8_t key[KM_STATE_KEY_BYTES];
	km_state_model model;
	bool ready, ready_fired;
	bool closing;                        /* km_state_free runs: new mutations are answered at once */
	km_uuid store_topic_id;              /* the state topic's id once Metadata showed it; zero before */
	size_t read_only_topics;             /* topics with a partition not STOPPED (recounted on every change) */
	km_state_mut *head, *tail, *refusals; /* work FIFO; answers to give at once */
	size_t queued;
	bool running;                        /* the head is being worked on */
	struct event *kick;
	km_state_persist *io;
};

#define KM_STATE_QUEUE_MAX 1000

/* persist.c */
km_state_persist *km_state_persist_new(km_state *st);
void km_state_persist_free(km_state_persist *io);
/* Read the state topic back (again): calls km_state_loaded with the model read. */
void km_state_persist_load(km_state_persist *io);
/* Write recs (one Produce, all acknowledged or failure); cb with KM_OK or a message. On failure a reload follows. */
typedef void (*km_state_write_cb)(km_state *st, km_err err, const char *message);
void km_state_persist_write(km_state_persist *io, const km_state_rec *recs, size_t n, km_state_write_cb cb);
/* persist_follow.c: a ticket for the first follow round that starts from now on; reached once such a round ended caught up. */
uint64_t km_state_persist_follow_ticket(const km_state_persist *io);
bool km_state_persist_follow_reached(const km_state_persist *io, uint64_t ticket);
/* Metadata of destination topics: metas[i] for names[i], or err set (destination unreachable) with message. */
typedef void (*km_state_meta_cb)(km_state *st, km_err err, const char *message, const km_state_topic_meta *metas);
void km_state_persist_topics(km_state_persist *io, char *const *names, size_t n, km_state_meta_cb cb);

/*
 * store.c: the write in progress is a pipeline's, and this kmirrord no longer runs its mirror: a
 * retry must not make it (it would land after the new owner's writes); why says so.
 */
bool km_state_write_owner_gone(km_state *st, char *why, size_t len);
/* store.c: the load finished; model is taken over (moved). */
void km_state_loaded(km_state *st, km_state_model *model);
/* A model built from the followed topic (persist_follow.c); delay_s: the oldest new record's age, -1 unknown. */
void km_state_followed(km_state *st, km_state_model *model, double delay_s);
/*
 * store.c: the state topic cannot be used (message says why and what to do). The store stops for
 * good: not ready, no more loads, every mutation refused with message; on_fatal is told on the next
 * loop iteration.
 */
void km_state_fatal(km_state *st, const char *message);

/* persist_policy.c: whether a cleanup.policy list is compact alone (compact,delete and delete are not). */
bool km_state_policy_compacted(const char *policy);
/* The fatal message for the state topic with that policy: what is wrong, why, and the command that fixes it. */
void km_state_policy_message(const char *topic, const char *policy, char *buf, size_t len);

#endif
