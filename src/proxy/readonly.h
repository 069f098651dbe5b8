/* Proxy-internal: read-only mirror topics (writes, record and topic deletion, new partitions refused; the rest forwarded and merged). */
#ifndef KMIRROR_PROXY_READONLY_H
#define KMIRROR_PROXY_READONLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>

#include "kmirror/arena.h"
#include "kmirror/daemon_config.h"
#include "kmirror/error.h"
#include "kmirror/net.h"
#include "kmirror/state.h"
#include "kmirror/wire.h"
#include "proxy/apis.h"
#include "proxy/rewrite.h"

/* What a client asks of a topic. */
typedef enum {
	KM_RO_WRITE = 0,          /* Produce to a partition */
	KM_RO_DELETE_RECORDS,     /* DeleteRecords on a partition */
	KM_RO_DELETE_TOPIC,       /* DeleteTopics (partition -1) */
	KM_RO_CREATE_PARTITIONS,  /* CreatePartitions (partition -1) */
	KM_RO_CREATE_TOPIC,       /* CreateTopics (partition -1): only the state topic is refused */
	KM_RO_ADD_TO_TXN,         /* (logs only) AddPartitionsToTxn: checked as KM_RO_WRITE */
} km_ro_op;

/* A refusal: code KM_OK lets the request through. */
typedef struct km_ro_verdict {
	km_err code;        /* KM_OK, READ_ONLY_TOPIC or TOPIC_AUTHORIZATION_FAILED */
	char message[512];  /* names the topic, the mirror and its source */
	char name[256];     /* the topic's name (for a topic asked by id); "" when not known */
} km_ro_verdict;

/*
 * The read side the hooks need, so that they depend on no store (the proxy fills it from the state
 * store; unit tests from a table). active NULL or false: nothing is refused and Produce stays
 * cut-through. Over the state store it is always true: the state topic is guarded whatever is
 * read-only.
 */
typedef struct km_ro_lookup {
	bool (*active)(void *arg);
	/* The verdict on op: a topic by name (id NULL) or by id; partition -1 for the topic as a whole. */
	void (*check)(void *arg, km_str name, const km_uuid *id, int32_t partition, km_ro_op op, km_ro_verdict *v);
	void *arg;
	/* What a READ_ONLY_TOPIC verdict becomes on the wire (read_only_error); KM_OK: READ_ONLY_TOPIC itself. */
	km_err read_only_code;
} km_ro_lookup;

/* The wire code of read_only_error (km_read_only_error). */
static inline km_err km_ro_code_of(int64_t read_only_error)
{
	return read_only_error == KM_READ_ONLY_TOPIC_AUTHORIZATION_FAILED ? KM_KAFKA_TOPIC_AUTHORIZATION_FAILED :
	       read_only_error == KM_READ_ONLY_KMIRROR                  ? KM_MIRROR_READ_ONLY_TOPIC :
									  KM_KAFKA_POLICY_VIOLATION;
}

/* The lookup over the state store (st NULL: nothing is read-only). */
void km_ro_lookup_from_state(km_state *st, km_ro_lookup *out);

static inline bool km_ro_active(const km_ro_lookup *lk)
{
	return lk && lk->active && lk->check && lk->active(lk->arg);
}

/* ---- Produce: the walk, the split and the merge (pure; the unit tests run them on hand-built frames) ---- */

typedef struct km_ro_part {
	int32_t index;
	size_t start, end;        /* the partition's bytes in the frame (index, records, tags) */
	km_err code;              /* KM_OK: forwarded */
	const char *message;
} km_ro_part;

typedef struct km_ro_topic {
	km_str name;              /* v0-12 */
	km_uuid id;               /* v13 */
	size_t start, head_end;   /* the topic's name or id in the frame */
	size_t parts_end, end;    /* after the last partition; after the topic's tags */
	int32_t nparts, nrefused;
	km_ro_part *parts;
	km_err code;              /* a topic-level refusal (DeleteTopics, CreatePartitions) */
	const char *message;
} km_ro_topic;

typedef struct km_ro_produce {
	int16_t version;
	int16_t acks;
	size_t head_end;          /* after timeout_ms: header, transactional id, acks and timeout are kept as they are */
	size_t topics_end;        /* after the last topic: the top-level tags follow */
	size_t len;
	int32_t ntopics;
	km_ro_topic *topics;
	size_t nparts, nrefused;
	km_arena arena;           /* topics, partitions, messages */
} km_ro_produce;

/*
 * Walk a whole Produce frame where it sits in the client's input: len bytes at offset off of in
 * (after its size prefix; in may be made of any number of chains), h its parsed header. Only the
 * small fields are read (through km_evrd: header, topic names or ids, partition indexes, record-set
 * lengths); record sets are skipped by their length, never looked into or copied. lk is asked
 * about every partition. On KM_OK, *out is NULL when nothing is refused (found without allocating
 * anything), else the plan (free with km_ro_produce_free; its offsets are from the frame's start).
 */
km_err km_ro_produce_walk(struct evbuffer *in, size_t off, size_t len, const km_req_header *h, const km_ro_lookup *lk,
			  km_ro_produce **out) __attribute__((warn_unused_result));
void km_ro_produce_free(void *pl);

/*
 * Holds the chains of a client's input buffer for the rewritten request that references their
 * bytes (the input is drained right after the hook). NULL when they cannot be held: the rewrite
 * then copies.
 */
typedef struct km_ro_keeper km_ro_keeper;
/* Pieces of kept partitions smaller than this are copied into the rewritten request; larger ones referenced. */
#define KM_RO_REF_MIN 256
km_ro_keeper *km_ro_keeper_new(struct evbuffer *in);
void km_ro_keeper_release(km_ro_keeper *k);

/*
 * The request without its refused partitions (and topics left with none), from the frame at off
 * in in: header, transactional id, acks and timeout as they came; each kept partition's bytes
 * referenced in in's chains through k (copied when k is NULL, and for the pieces of a chain smaller
 * than KM_RO_REF_MIN); only the array lengths are new.
 */
km_err km_ro_produce_rewrite(const km_ro_produce *pl, struct evbuffer *in, size_t off, struct evbuffer *out,
			     km_ro_keeper *k) __attribute__((warn_unused_result));

/*
 * The client's response body: every topic and partition in request order, refused ones answered
 * here, the others taken from the broker's response body (NULL when nothing was forwarded). tail
 * (tlen bytes): the broker's top-level tagged fields (v9+; NodeEndpoints rewritten through rw).
 */
km_err km_ro_produce_merge(const km_ro_produce *pl, const uint8_t *body, size_t len, const uint8_t *tail,
			   size_t tlen, km_rewrite_ctx *rw, km_wr *out) __attribute__((warn_unused_result));

/* ---- DeleteRecords, DeleteTopics, CreatePartitions: decoded whole (they are small) ---- */

typedef struct km_ro_admin km_ro_admin;

/*
 * Split an admin request (key: DeleteRecords, DeleteTopics or CreatePartitions; body: the request
 * body after its header). *out is NULL when nothing is refused. Otherwise *forward is the request
 * body to forward (NULL when everything is refused: answer with km_ro_admin_merge(NULL)).
 */
km_err km_ro_admin_split(int16_t key, int16_t version, const uint8_t *body, size_t len, const km_ro_lookup *lk,
			 km_ro_admin **out, km_wr *forward) __attribute__((warn_unused_result));
/* The client's response body: the broker's response body (NULL: none) merged with the refusals. */
km_err km_ro_admin_merge(const km_ro_admin *ad, const uint8_t *body, size_t len, km_wr *out)
	__attribute__((warn_unused_result));
void km_ro_admin_free(void *ad);

/* ---- the operator's log of refusals ---- */

/* At most one log line per topic and operation in this many milliseconds. */
#define KM_RO_LOG_INTERVAL_MS 10000

/*
 * Whether a refusal of op on topic may be logged now (now_ms: a monotonic clock). true: log it,
 * and *suppressed is how many refusals of the same topic and operation were not logged since the
 * last line. A small fixed table: when it is full the oldest entry goes (that topic may then log
 * again sooner). The proxy's loop is single-threaded; so is this.
 */
bool km_ro_log_allow(km_str topic, km_ro_op op, uint64_t now_ms, uint32_t *suppressed);
/* The refusal's line (readonly_log.c): the client, the request's version, the partitions, the code and the message. */
void km_ro_log_refusal(const km_req *rq, km_ro_op op, km_str topic, const km_uuid *id, const km_ro_part *parts,
		       int32_t nparts, km_err code, const char *message, const char *extra);
/* Every refused partition of a Produce (one line per topic). */
void km_ro_log_produce(const km_req *rq, const km_ro_produce *pl);

/*
 * The proxy's stages (km_ro_feature, apis.h): Produce held while a topic is read-only (and read in
 * place), DeleteRecords, DeleteTopics and CreatePartitions checked. The hooks find the lookup in
 * the host's features (km_proxy_features.read_only, features.h).
 */

/*
 * AddPartitionsToTxn v0-3 (body after the request header): when some partition is read-only, the
 * whole answer (the refused partitions with their code, the others OPERATION_NOT_ATTEMPTED) is
 * written to answer and first holds the first refusal; first->code KM_OK: nothing refused.
 */
km_err km_ro_add_partitions_check(int16_t version, const uint8_t *body, size_t len, const km_ro_lookup *lk,
				  km_wr *answer, km_ro_verdict *first);

#endif
